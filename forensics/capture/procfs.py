"""Read ``/proc/PID`` of a live (or dying) process, and resolve paths inside its root safely.

The files of ``/proc/PID`` are read and parsed by :mod:`forensics.procfs` (import their names from there);
this module adds the mounts' lookups and the root's resolver.
Paths inside a container are opened by :func:`open_in_root`, through the one resolver
(:mod:`forensics.rootpath`): one component at a time from a descriptor of ``/proc/PID/root``,
symlinks re-rooted, as ``openat2(RESOLVE_IN_ROOT)`` does, so a symlink planted (or swapped
in) by the container can never lead the reader to a file of the host.
"""
from __future__ import annotations

import errno
import os

from .. import rootpath
from ..errors import UnsafeContainerPath
from ..procfs import MountEntry

__all__ = ["open_in_root", "find_mount", "MountIndex", "host_path_of_mount"]


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
