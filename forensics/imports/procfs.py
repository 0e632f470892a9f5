"""A live process seen through /proc/PID: its root, cwd, environment, command line and loaded extensions.

``/proc/PID/root`` becomes a :class:`~forensics.imports.rootfs.DirFS`, so every
path inside the process is resolved against the process's own root and no link
leads out of it.  :func:`parse_maps_extensions` is pure.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import NotRoot, ProcessExited, ProcessGone
from ..pidstat import check_user_process
from ..procfs import decode, parse_cmdline, read_proc_text

__all__ = ["ProcessView", "read_process", "process_view", "parse_maps_extensions", "parse_status_ids", "in_root"]

_EXT_RE = re.compile(r"\.(cpython-\d+[a-z]*-[\w-]+|abi3)\.so$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessView:
    pid: int
    root: str  # where we read the process's root: /proc/PID/root
    cwd: str  # in-root path
    exe: str  # in-root path of the running executable
    root_seen: str = "/"  # the process's root as we see it (readlink /proc/PID/root): a chroot's directory
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    uid: int
    gid: int
    extensions: tuple[str, ...]  # in-root paths of loaded Python extension modules


def parse_maps_extensions(maps_text: str) -> tuple[str, ...]:
    """Paths of Python extension modules in /proc/PID/maps text, in load order, once each.

    >>> line = "7f-7f r-xp 0 08:01 5 /usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so"
    >>> parse_maps_extensions(line + "\\n")
    ('/usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so',)
    """
    seen: dict[str, None] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if _EXT_RE.search(path) or ("/lib-dynload/" in path and path.endswith(".so")):
                seen.setdefault(path, None)
    return tuple(seen)


def parse_status_ids(status: str) -> tuple[int, int]:
    """Effective uid and gid from /proc/PID/status."""
    uid = gid = 0
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[2])
        elif line.startswith("Gid:"):
            gid = int(line.split()[2])
    return uid, gid


_GONE_HELP = ("Check the PID with ps (verify-imports --pid reads a running process); to check what a process "
              "that has exited would import, verify its image instead (verify-imports IMAGE).")


def _gone(pid: int, detail: str = "") -> ProcessGone:
    e = ProcessGone(pid, detail)
    e.help_text = _GONE_HELP
    return e


def in_root(path: str, root_seen: str) -> str:
    """A path the kernel showed us (readlink of /proc/PID/cwd, /exe) as a path inside the process's root.

    For a process in our mount namespace under chroot, the kernel prints its cwd from *our* root
    (``/srv/chroot/app``); inside its root that is ``/app``.  A process in another mount namespace
    (a container) already gets paths of its own root.

    >>> in_root("/srv/chroot/app", "/srv/chroot"), in_root("/srv/chroot", "/srv/chroot"), in_root("/app", "/")
    ('/app', '/', '/app')
    """
    root = root_seen.rstrip("/")
    if not root:
        return path
    if path == root:
        return "/"
    if path.startswith(root + "/"):
        return path[len(root):]
    return path


def read_process(pid: int) -> ProcessView:
    """Read /proc/PID (its files through :func:`forensics.procfs.read_proc_text`, bounded, decoded by its one rule).

    :raises ProcessGone: no such process
    :raises NotRoot: its root, environment or maps are not readable by us
    """
    base = f"/proc/{pid}"
    if not os.path.isdir(base):
        raise _gone(pid)
    check_user_process(pid)
    try:
        cmdline = read_proc_text(pid, "cmdline", binary=True)
        environ = read_proc_text(pid, "environ", binary=True)
        root_seen = os.readlink(f"{base}/root")
        cwd = os.readlink(f"{base}/cwd")
        exe = os.readlink(f"{base}/exe")
        maps = read_proc_text(pid, "maps")
        status = read_proc_text(pid, "status")
        os.listdir(f"{base}/root/")
    except (FileNotFoundError, ProcessLookupError) as e:  # ProcessGone is a ProcessLookupError
        raise ProcessExited(pid, "its reading") from e
    except PermissionError as e:
        raise NotRoot(f"reading /proc/{pid} of another user's process") from e
    return process_view(pid, f"{base}/root", cmdline=cmdline, environ=environ, root_seen=root_seen, cwd=cwd, exe=exe,
                        maps=maps, status=status)


def process_view(pid: int, root: str, *, cmdline: bytes, environ: bytes, root_seen: str, cwd: str, exe: str,
                 maps: str, status: str) -> ProcessView:
    """A :class:`ProcessView` from what was read of /proc/PID (the texts as the kernel gave them).

    :param root: where the process's root is read: ``/proc/PID/root``, or ``/proc/self/fd/N`` of a descriptor of
        it held after the process is gone (the core handler reads a crashed process's files after its core)
    :param root_seen: ``readlink /proc/PID/root``; ``cwd``, ``exe``: their readlinks
    """
    argv = parse_cmdline(cmdline)
    env = [(k, v) for item in environ.split(b"\0") if b"=" in item for k, _, v in [decode(item).partition("=")]]
    uid, gid = parse_status_ids(status)
    strip = lambda p: p[: -len(" (deleted)")] if p.endswith(" (deleted)") else p  # noqa: E731
    root_seen = strip(root_seen)
    exts = tuple(in_root(p, root_seen) for p in parse_maps_extensions(maps))
    return ProcessView(pid=pid, root=root, cwd=in_root(strip(cwd), root_seen),
                       exe=in_root(strip(exe), root_seen), argv=argv, env=tuple(env), uid=uid, gid=gid,
                       extensions=exts, root_seen=root_seen)
