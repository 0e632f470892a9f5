"""A live process seen through /proc/PID: its root, cwd, environment, command line and loaded extensions.

``/proc/PID/root`` becomes a :class:`~forensics.imports.rootfs.DirFS`, so every
path inside the process is resolved against the process's own root and no link
leads out of it.  :func:`parse_maps_extensions` is pure.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import NotRoot, ProcessGone

__all__ = ["ProcessView", "read_process", "parse_maps_extensions", "parse_status_ids"]

_EXT_RE = re.compile(r"\.(cpython-\d+[a-z]*-[\w-]+|abi3)\.so$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessView:
    pid: int
    root: str  # host path of the process's root (/proc/PID/root)
    cwd: str  # in-root path
    exe: str  # in-root path of the running executable
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    uid: int
    gid: int
    extensions: tuple[str, ...]  # in-root paths of loaded Python extension modules


def parse_maps_extensions(maps_text: str) -> tuple[str, ...]:
    """Paths of Python extension modules in /proc/PID/maps text, in load order, once each.

    >>> parse_maps_extensions("7f-7f r-xp 0 08:01 5 /usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so\\n")
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


def read_process(pid: int) -> ProcessView:
    """Read /proc/PID.

    :raises ProcessGone: no such process
    :raises NotRoot: its root, environment or maps are not readable by us
    """
    base = f"/proc/{pid}"
    if not os.path.isdir(base):
        raise ProcessGone(pid)
    try:
        cmdline = open(f"{base}/cmdline", "rb").read()
        environ = open(f"{base}/environ", "rb").read()
        cwd = os.readlink(f"{base}/cwd")
        exe = os.readlink(f"{base}/exe")
        maps = open(f"{base}/maps", encoding="utf-8", errors="replace").read()
        status = open(f"{base}/status", encoding="utf-8").read()
        os.listdir(f"{base}/root/")
    except FileNotFoundError as e:
        raise ProcessGone(pid, "exited while being read") from e
    except PermissionError as e:
        raise NotRoot(f"reading /proc/{pid} of another user's process") from e
    argv = tuple(a.decode("utf-8", "surrogateescape") for a in cmdline.split(b"\0") if a)
    env = []
    for item in environ.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode("utf-8", "surrogateescape").partition("=")
            env.append((k, v))
    uid, gid = parse_status_ids(status)
    strip = lambda p: p[: -len(" (deleted)")] if p.endswith(" (deleted)") else p  # noqa: E731
    return ProcessView(pid=pid, root=f"{base}/root", cwd=strip(cwd), exe=strip(exe), argv=argv, env=tuple(env),
                       uid=uid, gid=gid, extensions=parse_maps_extensions(maps))
