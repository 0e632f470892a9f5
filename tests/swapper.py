"""A live "container" that keeps swapping one directory of its root for a symlink to ``/`` and back.

``python tests/swapper.py ROOT NAME [CWD]``: inside ``ROOT`` (chrooted into it when run as root),
``NAME`` is a real directory and ``NAME.swap`` a symlink to ``/``; the two names are exchanged
atomically (``renameat2(RENAME_EXCHANGE)``) in a loop until the process is killed, so ``NAME`` is
at every instant either the directory or the symlink.  With ``CWD`` the process works in that
in-root directory (what ``/proc/PID/cwd`` shows).  It prints ``ready`` once the loop runs.

:class:`Swapper` starts one for a test and always kills it.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["Swapper"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class Swapper:
    """The swapping process for a ``with`` block (``.pid``); at the block's end, it must still be swapping."""

    def __init__(self, root: Path, name: str, cwd: str | None = None, chroot: bool = True) -> None:
        self.argv = [sys.executable, __file__, str(root), name, cwd or "", "chroot" if chroot else ""]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Swapper:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.__exit__()
            raise RuntimeError(f"the swapper did not start: {line!r} {self.proc.stderr.read()}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            assert self.proc.returncode == -9, self.proc.stderr.read()  # it swapped until killed


def _main(root: str, name: str, cwd: str, chroot: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = libc.renameat2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    link = os.path.join(root, name + ".swap")
    if not os.path.lexists(link):
        os.symlink("/", link)
    if chroot and os.geteuid() == 0:
        os.chroot(root)
        root = "/"
    if cwd:
        os.chdir(os.path.join(root, cwd.lstrip("/")))
    a, b = os.path.join(root, name).encode(), os.path.join(root, name + ".swap").encode()
    print("ready", flush=True)
    while True:
        if renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


if __name__ == "__main__":
    _main(*sys.argv[1:5])
