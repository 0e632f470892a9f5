"""``agent serve``'s analyses in the sandbox (:mod:`forensics.sandbox`): what the agent prepares around one.

For each crash the agent lets the sandbox's uid read the crash's bundle (:func:`grant_read`: the bundle's group
becomes the sandbox's, group-readable, never group-writable), gives the analysis a scratch directory of its own
(its ``HOME``, ``TMPDIR`` and forensics cache: the core decompresses there) that only it may write, made by the
sandbox itself once it runs as that uid, and removed the same way after (:func:`remove_scratch`), and an
environment of its own (:func:`analysis_env`): none of the agent's credentials (``AWS_*``, the service account's
token path) reach the parser.
"""
from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import time

from ..bundle import layout
from ..sandbox import Policy, wrapper_argv

__all__ = ["MAX_GRANT", "Fetcher", "grant_read", "join_group", "scratch_root", "analysis_argv", "analysis_env",
           "remove_scratch", "unreachable", "unreachable_installation"]

MAX_GRANT = 100_000  # files and directories of one bundle given to the sandbox's group, at most
_DEBUGINFOD_BOUNDS = ("DEBUGINFOD_TIMEOUT", "DEBUGINFOD_MAXTIME", "DEBUGINFOD_MAXSIZE")
#: the fetcher's: the servers, their bounds and cache settings, and how to reach them (a proxy, a private CA)
_FETCHER_ENV = ("DEBUGINFOD_URLS", *_DEBUGINFOD_BOUNDS, "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")
_KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "PYTHONHOME", "PYTHONPATH",
             "PYTHONNOUSERSITE", "LD_LIBRARY_PATH")


def join_group(gid: int) -> None:
    """Add ``gid`` to this process's groups, so that it may give its own files to that group (the owner may chgrp
    to a group it is in: no CAP_CHOWN needed)."""
    groups = os.getgroups()
    if gid not in groups:
        with contextlib.suppress(PermissionError):  # not root: the files are given by their group's owner, or not
            os.setgroups([*groups, gid])


def _give(path: str, gid: int, st: os.stat_result) -> None:
    want = stat.S_IMODE(st.st_mode) | (0o050 if stat.S_ISDIR(st.st_mode) else 0o040)
    if st.st_gid != gid:
        os.chown(path, -1, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != want:
        os.chmod(path, want)  # never a link: the callers skip them


def grant_read(crash_dir: str, core_dir: str, gid: int) -> None:
    """Let group ``gid`` read the crash's bundle and search the way to it and to the object store: group set,
    group read (and search, for directories) added, group write never. Links are neither followed nor changed.

    :raises OSError: a file could not be given (the analysis would not read it)
    """
    for d in (core_dir, os.path.join(core_dir, layout.CRASHES)):
        _give(d, gid, os.lstat(d))
    store = os.path.join(core_dir, layout.OBJECTS)
    with contextlib.suppress(FileNotFoundError):
        _give(store, gid, os.lstat(store))
        with os.scandir(store) as it:  # the store's fan-out directories (its objects are readable by everyone)
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    _give(e.path, gid, e.stat(follow_symlinks=False))
    n = 0
    for root, dirs, files in os.walk(crash_dir):
        for name in [*dirs, *files, None]:
            path = root if name is None else os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or (name is not None and name in dirs):
                continue  # a directory is given when walked (None), a link never
            n += 1
            if n > MAX_GRANT:
                raise OSError(f"more than {MAX_GRANT:,} files")
            _give(path, gid, st)


def unreachable(path: str, gid: int, *, itself: bool = False) -> str | None:
    """The first directory on the way to ``path`` (with ``itself``, ``path`` too: a directory to search) that the
    sandbox's ids (``gid`` as uid and group) may not search, or None: an analysis could not reach ``path``."""
    parts = os.path.abspath(path).split("/")
    for i in range(1, len(parts) + itself):
        d = "/".join(parts[:i]) or "/"
        try:
            st = os.stat(d)
        except FileNotFoundError:  # made later, by the agent, searchable (umask 022)
            return None
        except OSError:
            return d
        if not st.st_mode & 0o001 and not (st.st_gid == gid and st.st_mode & 0o010) and st.st_uid != gid:
            return d
    return None


def unreachable_installation(gid: int) -> tuple[str, str] | None:
    """(the first directory the sandbox's ids may not search, the path of this installation it hides), or None when
    an analysis can reach every path of the installation it runs (:func:`forensics.sandbox.installation.
    read_installation`: the interpreter, each link on the way to it, the directories it imports from)."""
    from ..sandbox.installation import read_installation

    inst = read_installation()
    for path in (*(link for link, _target in inst.links), *inst.paths):
        blocked = unreachable(path, gid, itself=os.path.isdir(path) and not os.path.islink(path))
        if blocked is not None:
            return blocked, path
    return None


def scratch_root(base: str) -> str:
    """The directory the analyses' scratch directories are made in: anyone may make one there, nobody may list it,
    and each removes only its own (mode 1733)."""
    root = os.path.join(base, "sandbox")
    os.makedirs(root, exist_ok=True)
    if stat.S_IMODE(os.stat(root).st_mode) != 0o1733:
        os.chmod(root, 0o1733)
    return root


def analysis_argv(argv: list[str], *, uid: int, scratch: str) -> list[str]:
    """``argv`` run in the sandbox as ``uid``, writing beneath its scratch directory only; the sandbox makes it."""
    return wrapper_argv(Policy(uid=uid, gid=uid, scratch=scratch), argv)


def analysis_env(scratch: str) -> dict[str, str]:
    """The analysis' environment: the agent's locale and interpreter settings, its own home, temporary directory and
    forensics cache inside its scratch directory; nothing else (no credential, no debuginfod server: its fetcher's)."""
    env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV or k.startswith(("LC_", "FORENSICS_"))
           or k in _DEBUGINFOD_BOUNDS}
    env.pop("FORENSICS_CACHE", None)
    return {**env, "HOME": scratch, "TMPDIR": scratch, "XDG_CACHE_HOME": os.path.join(scratch, ".cache"),
            "PYTHONDONTWRITEBYTECODE": "1"}


def remove_scratch(scratch: str, *, uid: int, timeout: float = 120) -> None:
    """Remove an analysis' scratch directory as the sandbox's uid (the files in it are that uid's)."""
    if not os.path.lexists(scratch):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(wrapper_argv(Policy(uid=uid, gid=uid, writable=(os.path.dirname(scratch),)),
                                    ["rm", "-rf", "--one-file-system", "--", scratch], python=sys.executable),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


class Fetcher:
    """The debuginfod fetcher beside one analysis, when the agent is given ``DEBUGINFOD_URLS``: a process of its own
    (:mod:`forensics.core.fetcher`) in a sandbox of its own (the analyses' uid, writing only its scratch, where
    the files it fetches are kept; sockets allowed), and the analysis' end of the socket pair to it (``fd``, named
    in the analysis' environment). The analysis reads the files it names; it never opens a TCP socket itself."""

    def __init__(self, *, uid: int, root: str) -> None:
        from ..core.fetchproxy import ENV

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.scratch = os.path.join(root, f"debuginfod.{time.time_ns()}")
        self.uid, self.ours = uid, ours
        self.env_name = ENV
        env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV or k in _FETCHER_ENV or k.startswith("LC_")}
        env.update(HOME=self.scratch, TMPDIR=self.scratch, DEBUGINFOD_CACHE_PATH=os.path.join(self.scratch, "cache"),
                   PYTHONDONTWRITEBYTECODE="1")
        argv = wrapper_argv(Policy(uid=uid, gid=uid, scratch=self.scratch, network=True),
                            [sys.executable, "-m", "forensics.core.fetcher", str(theirs.fileno())])
        try:
            self.proc = subprocess.Popen(argv, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    @property
    def fd(self) -> int:
        return self.ours.fileno()

    def close(self) -> None:
        """End the fetcher (its socket closed: it leaves; killed past 10 s) and remove what it kept."""
        self.ours.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
        remove_scratch(self.scratch, uid=self.uid)
