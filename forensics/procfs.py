"""The one reader of ``/proc/PID``'s files: bounded reads, and their parsers into records.

One decoding rule for every file: bytes as UTF-8 with ``surrogateescape`` (:func:`decode`).  What a process
controls (its mappings' names, argv, environment) need not be UTF-8; surrogateescape keeps every byte, so a
path read here opens the same file again (``os.fsencode``) and nothing is lost before a caller decides how to
show it (:func:`for_people`: a byte that was not UTF-8 as U+FFFD, what the capture bundle records).
Below every command that reads a live process (``capture``, ``verify-imports --pid``): it imports nothing from
forensics but the error tree and the one resolver of paths inside a root.  Parsers (``parse_*``) take text or bytes
and return records; readers (``read_*``) do the I/O.

The mounts' lookups (:func:`find_mount`, :class:`MountIndex`, :func:`host_path_of_mount`) and the root's resolver:
paths inside a container are opened by :func:`open_in_root`, through :mod:`forensics.rootpath`: one component at a
time from a descriptor of ``/proc/PID/root``, symlinks re-rooted, as ``openat2(RESOLVE_IN_ROOT)`` does, so a
symlink planted (or swapped in) by the container can never lead the reader to a file of the host.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Literal, overload

from . import rootpath
from .errors import ProcessGone, UnsafeContainerPath

__all__ = [
    "open_in_root", "find_mount", "MountIndex", "host_path_of_mount",
    "MapEntry",
    "MountEntry",
    "decode",
    "for_people",
    "parse_maps",
    "parse_limits",
    "parse_mountinfo",
    "parse_status",
    "parse_environ",
    "parse_cmdline",
    "read_proc_text",
    "PROC_LIMITS",
    "PROC_DEFAULT_LIMIT",
    "proc_dir",
]


def decode(data: bytes) -> str:
    r"""The one decoding rule for /proc: UTF-8, each byte that is not UTF-8 as a lone surrogate (lossless).

    >>> decode(b"/lib/\xff.so"), os.fsencode(decode(b"/lib/\xff.so"))
    ('/lib/\udcff.so', b'/lib/\xff.so')
    """
    return data.decode("utf-8", errors="surrogateescape")


def for_people(text: str) -> str:
    r"""``text`` (from :func:`decode`) with each byte that was not UTF-8 as U+FFFD: for a record whose readers write
    UTF-8 strictly (the capture bundle's argv and environment).

    >>> for_people(decode(b"a\xffb")) == "a\ufffdb"
    True
    """
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True, kw_only=True)
class MapEntry:
    """One line of ``/proc/PID/maps``."""

    start: int
    end: int
    perms: str
    offset: int
    dev: str  # "fd:01" (major:minor, hex)
    inode: int
    path: str | None  # None for anonymous memory; "[heap]" style names kept

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path is not None and self.path.startswith("/")

    @property
    def deleted(self) -> bool:
        return bool(self.path and self.path.endswith(" (deleted)"))

    @property
    def range(self) -> str:
        """The name of this mapping under ``/proc/PID/map_files``."""
        return f"{self.start:x}-{self.end:x}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MountEntry:
    """One line of ``/proc/PID/mountinfo`` (proc(5))."""

    mount_id: int
    parent_id: int
    dev: str  # "major:minor" (decimal)
    root: str  # the path inside the filesystem that is mounted here (a bind source)
    mount_point: str
    fstype: str
    source: str
    options: str

    @property
    def is_bind_of_subtree(self) -> bool:
        return self.root != "/"


def proc_dir(pid: int) -> str:
    return f"/proc/{int(pid)}"


#: the most read of each /proc/PID file: what a process controls (its mappings' names, its mounts, its environment)
#: can make these large (65,530 mappings with 4 KiB names are 270 MB of maps); the kernel's own small files get
#: :data:`PROC_DEFAULT_LIMIT`
PROC_LIMITS = {"maps": 64 << 20, "mountinfo": 16 << 20, "cmdline": 1 << 20, "environ": 4 << 20}
PROC_DEFAULT_LIMIT = 1 << 20


@overload
def read_proc_text(pid: int, name: str, *, binary: Literal[False] = False, cut: list[str] | None = None) -> str: ...


@overload
def read_proc_text(pid: int, name: str, *, binary: Literal[True], cut: list[str] | None = None) -> bytes: ...


def read_proc_text(pid: int, name: str, *, binary: bool = False, cut: list[str] | None = None) -> str | bytes:
    """``/proc/PID/NAME``, at most :data:`PROC_LIMITS` bytes; :class:`ProcessGone` when the process no longer exists.

    :param cut: told (``"NAME cut at N bytes"``) when the file was longer than its bound
    :raises ProcessGone: when /proc/PID is gone
    :raises OSError: for other failures (permission, a file the kernel does not offer)
    """
    path = f"{proc_dir(pid)}/{name}"
    limit = PROC_LIMITS.get(name, PROC_DEFAULT_LIMIT)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError as e:
        if not os.path.exists(proc_dir(pid)):
            raise ProcessGone(pid) from e
        raise
    except ProcessLookupError as e:  # ESRCH: the process exited while we read
        raise ProcessGone(pid, "exited while being read") from e
    if len(data) > limit:
        data = data[:limit]
        if cut is not None:
            cut.append(f"/proc/{pid}/{name} cut at {limit} bytes")
    return data if binary else decode(data)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1 : i + 4]) == 3 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_maps(text: str) -> tuple[MapEntry, ...]:
    """Parse ``/proc/PID/maps``.

    >>> parse_maps("7f00-7f10 r-xp 00001000 fd:01 42 /usr/lib/libc.so.6\\n")[0].path
    '/usr/lib/libc.so.6'
    """
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, hi = parts[0].split("-")
        path = parts[5] if len(parts) > 5 else None
        out.append(
            MapEntry(
                start=int(lo, 16), end=int(hi, 16), perms=parts[1], offset=int(parts[2], 16),
                dev=parts[3], inode=int(parts[4]), path=path,
            )
        )
    return tuple(out)


def parse_limits(text: str) -> dict[str, tuple[str, str]]:
    """``/proc/PID/limits`` as ``{name: (soft, hard)}``, values as the kernel prints them.

    >>> head = f"{'Limit':26}{'Soft Limit':21}{'Hard Limit':21}Units\\n"
    >>> parse_limits(head + f"{'Max core file size':26}{'0':21}{'unlimited':21}bytes\\n")
    {'Max core file size': ('0', 'unlimited')}
    """
    out = {}
    for line in text.splitlines()[1:]:
        # columns are fixed width: name (26), soft (21), hard (21), units
        name = line[:26].strip()
        rest = line[26:].split()
        if name and len(rest) >= 2:
            out[name] = (rest[0], rest[1])
    return out


def parse_mountinfo(text: str) -> tuple[MountEntry, ...]:
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        out.append(
            MountEntry(
                mount_id=int(f[0]), parent_id=int(f[1]), dev=f[2], root=_unescape(f[3]),
                mount_point=_unescape(f[4]), options=f[5], fstype=r[0], source=_unescape(r[1]),
            )
        )
    return tuple(out)


def parse_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def parse_environ(data: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` as ``{name: value}`` (an item without ``=`` is a name with an empty value).

    >>> parse_environ(b"A=1\\0B=x=y\\0")
    {'A': '1', 'B': 'x=y'}
    """
    out = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        k, _, v = item.partition(b"=")
        out[decode(k)] = decode(v)
    return out


def parse_cmdline(data: bytes) -> tuple[str, ...]:
    """``/proc/PID/cmdline`` as argv (empty items dropped).

    >>> parse_cmdline(b"python3\\0-c\\0\\0")
    ('python3', '-c')
    """
    return tuple(decode(a) for a in data.split(b"\0") if a)


def find_mount(mounts: tuple[MountEntry, ...], path: str) -> MountEntry | None:
    """The mount that covers ``path`` (the last mounted on the longest matching prefix)."""
    best: MountEntry | None = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        covers = path == mp or mp == "/" or path.startswith(mp + "/")
        if covers and (best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best


def host_path_of_mount(mount: MountEntry, path: str, host_mounts: tuple[MountEntry, ...]) -> str | None:
    """Where ``path`` (inside the mount namespace of ``mount``) lives in the host's namespace.

    A bind mount's ``root`` is the path inside its filesystem; the host mount of the same
    device whose root is a prefix of it gives the host path.  None when the filesystem is
    not mounted on the host (an overlay of the container image, a tmpfs of its own).
    """
    mp = mount.mount_point.rstrip("/") or "/"
    rel = path[len(mp):] if mp != "/" else path
    inner = (mount.root.rstrip("/") + rel) if rel else mount.root
    inner = inner or "/"
    best = None
    for h in host_mounts:
        if h.dev != mount.dev:
            continue
        hroot = h.root.rstrip("/")
        holds = inner == h.root or inner.startswith(hroot + "/") or h.root == "/"
        if holds and (best is None or len(h.root) > len(best.root)):
            best = h
    if best is None:
        return None
    tail = inner[len(best.root.rstrip("/")):] if best.root != "/" else inner
    base = best.mount_point.rstrip("/")
    return (base + tail) or "/"


class MountIndex:
    """:func:`find_mount` and :func:`host_path_of_mount` for many paths: the mounts indexed once (by mount point,
    the host's by device), each lookup a walk up the path's components, not a pass over every mount (a process's
    mountinfo is its own to fill: 100,000 mounts, once per mapped object, while the kernel waits on a core)."""

    def __init__(self, mounts: tuple[MountEntry, ...], host_mounts: tuple[MountEntry, ...] = ()) -> None:
        self.by_point: dict[str, MountEntry] = {}
        for m in mounts:  # in mount order: the last mounted on a point is what the path reaches
            self.by_point[m.mount_point.rstrip("/") or "/"] = m
        self.host_by_dev: dict[str, list[MountEntry]] = {}
        for h in host_mounts:
            self.host_by_dev.setdefault(h.dev, []).append(h)

    def find(self, path: str) -> MountEntry | None:
        """:func:`find_mount` of ``path``."""
        p = path.rstrip("/") or "/"
        while True:
            m = self.by_point.get(p)
            if m is not None or p == "/":
                return m
            p = p.rsplit("/", 1)[0] or "/"

    def host_path(self, mount: MountEntry, path: str) -> str | None:
        """:func:`host_path_of_mount` of ``path`` in ``mount``."""
        return host_path_of_mount(mount, path, tuple(self.host_by_dev.get(mount.dev, ())))


def open_in_root(root: str, path: str, flags: int = os.O_RDONLY) -> int:
    """Open ``path`` as the process whose root is ``root`` would, never leaving ``root``.

    ``root`` is usually ``/proc/PID/root``; the walk is :func:`forensics.rootpath.open_in_root`'s
    (one component at a time on descriptors, symlinks re-rooted, ``..`` stopping at the root).
    Returns a descriptor the caller closes.

    :raises UnsafeContainerPath: on too many symlinks, or a non-directory in the middle
    :raises FileNotFoundError: when a component does not exist inside the root
    """
    try:
        return rootpath.open_in_root(root, path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeContainerPath(root, path, "too many levels of symbolic links") from None
        if e.errno == errno.ENOTDIR:
            raise UnsafeContainerPath(root, path, "a component is not a directory") from None
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, f"{path}: no such file inside {root}") from None
        raise
