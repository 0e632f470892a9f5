"""``analyze --sandbox``: the analysis in bubblewrap's namespaces, then in the sandbox's wrapper.

For a user analyzing someone else's core as root. bubblewrap gives the analysis a user namespace of its own (uid
65534 inside, mapped onto the caller: it reads the inputs the caller may read and holds no capability outside), a
mount namespace that shows only the system's programs and libraries (``/usr``, the loader's files of ``/etc``),
this installation of forensics, the inputs read-only and a scratch directory of its own, and no network, PID, IPC
or UTS namespace of the host's; inside, the sandbox's wrapper adds no_new_privs, Landlock (no write but into the
scratch directory) and the seccomp filter (:data:`forensics.sandbox.DENIED`, sockets AF_UNIX only). The analysis
prints its result to a pipe; this process writes it where ``-o`` says, so the sandbox writes nothing outside.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from ..errors import SandboxUnavailable
from . import Policy, wrapper_argv

__all__ = ["contained_argv", "run_contained", "MAX_OUTPUT"]

MAX_OUTPUT = 1 << 30  # what the contained analysis may print (its JSON, its text) before it is stopped
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf", "gdb")
_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHOME", "PYTHONPATH", "PYTHONNOUSERSITE", "TERM")


def _system_binds() -> tuple[list[str], list[str]]:
    """bubblewrap's arguments for the system's programs and libraries, and the paths they cover."""
    out, covered = [], ["/usr", "/proc", "/dev"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            out += ["--symlink", os.readlink(top), top]
            covered.append(top)
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
            covered.append(top)
    out += ["--ro-bind", "/usr", "/usr"]
    for name in _ETC:
        if os.path.exists(f"/etc/{name}"):
            out += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
            covered.append(f"/etc/{name}")
    return out, covered


def _installation(covered: list[str]) -> list[str]:
    """This installation (:func:`forensics.sandbox.installation.read_installation`: the interpreter, its prefixes,
    every directory it imports from), read-only at its own paths, and each link on the way to it made again where
    nothing bound holds it already (a venv's link to pyenv's interpreter, a link to a directory outside the
    system's); what ``covered`` holds is in the view already. Given after /tmp's tmpfs, so that an installation
    under /tmp is not hidden by it."""
    from .installation import read_installation

    def inside(p: str, tops: list[str]) -> bool:
        return any(p == t or p.startswith(t.rstrip("/") + "/") for t in tops)

    inst = read_installation()
    binds = [p for p in inst.paths if not inside(p, covered)]
    out = []
    for p in binds:
        out += ["--ro-bind", p, p]
    for link, target in inst.links:
        if not inside(link, [*covered, *binds]):
            out += ["--symlink", target, link]
    return out


def contained_argv(analysis: list[str], *, read: list[str], scratch: str) -> list[str]:
    """bubblewrap's command line around ``analysis`` (an argv of this interpreter): ``read`` bound read-only at
    their paths, ``scratch`` writable, the sandbox's wrapper inside."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not on PATH")
    system, covered = _system_binds()
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(65534), "--gid", str(65534), "--die-with-parent",
           "--new-session", "--cap-drop", "ALL", *system, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
           *_installation(covered)]
    for p in sorted({os.path.realpath(p) for p in read if p and os.path.exists(p)}):
        cmd += ["--ro-bind", p, p]
    cmd += ["--bind", scratch, scratch, "--chdir", "/", "--clearenv"]
    env = {k: v for k, v in os.environ.items() if k in _ENV or (k.startswith(("LC_", "FORENSICS_"))
                                                                   and k != "FORENSICS_CACHE")}
    env.update(HOME=scratch, TMPDIR=scratch, XDG_CACHE_HOME=os.path.join(scratch, ".cache"),
               PYTHONDONTWRITEBYTECODE="1")
    for k, v in sorted(env.items()):
        cmd += ["--setenv", k, v]
    return [*cmd, "--", *wrapper_argv(Policy(writable=(scratch,)), analysis)]


def run_contained(analysis: list[str], *, read: list[str], timeout: float | None = None) -> tuple[int, bytes]:
    """Run ``analysis`` contained; its exit status and what it printed (its standard error passes through).

    :raises SandboxUnavailable: bubblewrap is missing, or could not make the sandbox
    """
    scratch = tempfile.mkdtemp(prefix="forensics-sandbox-")
    try:
        cmd = contained_argv(analysis, read=read, scratch=scratch)
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = bytearray()
        assert p.stdout is not None and p.stderr is not None
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ, "out")
            sel.register(p.stderr, selectors.EVENT_READ, "err")
            open_ = 2
            while open_:
                for key, _ in sel.select(timeout):
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_ -= 1
                    elif key.data == "out":
                        out += chunk
                        if len(out) > MAX_OUTPUT:
                            p.kill()
                            raise SandboxUnavailable(f"the analysis printed more than {MAX_OUTPUT >> 20} MiB")
                    else:
                        if chunk.startswith(b"bwrap: ") and not out:
                            line = _rest_of_line(p.stderr.fileno(), chunk)
                            p.wait()
                            raise SandboxUnavailable(line)
                        sys.stderr.buffer.write(chunk)
                        sys.stderr.flush()
        status = p.wait()
        if status == 126:  # the wrapper could not confine it: it said why on stderr
            raise SandboxUnavailable("the sandbox could not be set up (see above)")
        return status, bytes(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rest_of_line(fd: int, chunk: bytes, limit: int = 4096) -> str:
    """bubblewrap's error line, ``chunk`` its start: it writes "bwrap: " and its message apart, so the message is
    read up to its newline (or the end, or ``limit`` bytes)."""
    line = bytearray(chunk)
    while b"\n" not in line and len(line) < limit:
        more = os.read(fd, limit)
        if not more:
            break
        line += more
    return line.decode(errors="replace").strip().splitlines()[0]
