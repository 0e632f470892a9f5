"""Read-only views of a root file system that never follow a link out of the root.

:class:`RootFS` resolves symlinks itself, component by component, the way the
kernel would inside a chroot: an absolute target restarts at the image root and
``..`` stops at it.  Two implementations: :class:`DirFS` over a real directory
(an unpacked image, ``/proc/PID/root``) and ``LayerFS`` (in ``layers.py``) over
the merged index of an image's layers.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from .. import rootpath

__all__ = ["Node", "RootFS", "DirFS", "norm", "join"]

_MAX_LINKS = 40  # Linux's MAXSYMLINKS


@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # "file", "dir", "symlink", "other"
    size: int = 0
    mode: int = 0
    target: str | None = None  # a symlink's target


def norm(path: str) -> str:
    """Lexically normalise an in-root path as ``os.path.abspath`` does; ``..`` stops at the root.

    >>> norm("usr//local/./bin/"), norm("/s/site-packages/../../../legacy")
    ('/usr/local/bin', '/legacy')
    """
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if parts:
                parts.pop()
            continue
        parts.append(p)
    return "/" + "/".join(parts)


def join(base: str, rel: str) -> str:
    """Join in-root paths; an absolute ``rel`` replaces ``base``."""
    if rel.startswith("/"):
        return norm(rel)
    return norm(base.rstrip("/") + "/" + rel)


class RootFS:
    """The operations the resolver needs; paths are absolute paths inside the root.  A path that is absent,
    unreadable or leads out of the root reads as absent (None, or no entries)."""

    description = "root"

    def lstat(self, path: str) -> Node | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _listdir(self, path: str) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _read(self, path: str, limit: int) -> bytes | None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- symlink resolution confined to the root ------------------------------------------------
    def resolve(self, path: str, *, follow_last: bool = True) -> str | None:
        """The canonical in-root path of ``path``, or None when a component is missing or loops.

        >>> class T(RootFS):
        ...     nodes = {"/": Node("dir"), "/bin": Node("symlink", target="usr/bin"), "/usr": Node("dir"),
        ...              "/usr/bin": Node("dir"), "/usr/bin/py": Node("symlink", target="/../../usr/bin/py3"),
        ...              "/usr/bin/py3": Node("file")}
        ...     def lstat(self, p): return self.nodes.get(p)
        >>> T().resolve("/bin/py")
        '/usr/bin/py3'
        """
        pending = [p for p in path.split("/") if p not in ("", ".")]
        pending.reverse()
        current: list[str] = []
        links = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if current:
                    current.pop()
                continue
            candidate = "/" + "/".join(current + [part])
            node = self.lstat(candidate)
            if node is None:
                return None
            if node.kind == "symlink" and (pending or follow_last):
                links += 1
                if links > _MAX_LINKS or node.target is None:
                    return None
                target = node.target
                if target.startswith("/"):
                    current = []
                new = [p for p in target.split("/") if p not in ("", ".")]
                pending.extend(reversed(new))
                continue
            if pending and node.kind != "dir":
                return None
            current.append(part)
        return "/" + "/".join(current)

    def stat(self, path: str) -> Node | None:
        real = self.resolve(path)
        return None if real is None else self.lstat(real)

    def is_file(self, path: str) -> bool:
        n = self.stat(path)
        return n is not None and n.kind == "file"

    def is_dir(self, path: str) -> bool:
        n = self.stat(path)
        return n is not None and n.kind == "dir"

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def listdir(self, path: str) -> list[str]:
        real = self.resolve(path)
        if real is None:
            return []
        n = self.lstat(real)
        if n is None or n.kind != "dir":
            return []
        return sorted(self._listdir(real))

    def read(self, path: str, limit: int = 4 << 20) -> bytes | None:
        """The bytes of a regular file (symlinks followed inside the root), None if absent or unreadable."""
        real = self.resolve(path)
        if real is None:
            return None
        n = self.lstat(real)
        if n is None or n.kind != "file" or n.size > limit:
            return None
        return self._read(real, limit)

    def read_text(self, path: str, limit: int = 4 << 20) -> str | None:
        data = self.read(path, limit)
        return None if data is None else data.decode("utf-8", "replace")


class DirFS(RootFS):
    """A real directory seen as a root: an unpacked image, or ``/proc/PID/root`` of a live process.

    Every operation walks its path through the one resolver (:mod:`forensics.rootpath`):
    one component at a time on descriptors, symlinks re-rooted, ``..`` stopping at the root,
    and the file read is the one the walk found.  A directory the root's owner swaps for a
    symlink while it is read can only lead to another place inside.
    """

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"
        self.description = root

    def resolve(self, path: str, *, follow_last: bool = True) -> str | None:
        try:
            return rootpath.resolve_in_root(self.root, path, follow_last=follow_last)
        except (OSError, ValueError):  # absent, unreadable or outside the root: None, as RootFS documents
            return None

    def lstat(self, path: str) -> Node | None:
        return self._node(path, follow=False)

    def stat(self, path: str) -> Node | None:
        return self._node(path, follow=True)

    def _node(self, path: str, *, follow: bool) -> Node | None:
        try:
            fd = rootpath.open_in_root(self.root, path, os.O_PATH, follow_last=follow)
        except (OSError, ValueError):  # absent, unreadable or outside the root: None, as RootFS documents
            return None
        try:
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                return Node("symlink", 0, st.st_mode, os.readlink("", dir_fd=fd))
        except OSError:  # gone between the open and the stat: absent
            return None
        finally:
            os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            return Node("dir", 0, st.st_mode)
        if stat.S_ISREG(st.st_mode):
            return Node("file", st.st_size, st.st_mode)
        return Node("other", 0, st.st_mode)

    def listdir(self, path: str) -> list[str]:
        try:
            return rootpath.listdir_in_root(self.root, path)
        except (OSError, ValueError):  # absent or unreadable: no entries, as RootFS documents
            return []

    def _listdir(self, path: str) -> list[str]:
        return self.listdir(path)

    def read(self, path: str, limit: int = 4 << 20) -> bytes | None:
        """The bytes of a regular file (symlinks followed inside the root), None if absent, unreadable or
        over ``limit``."""
        try:
            data = rootpath.read_in_root(self.root, path, limit + 1)
        except (OSError, ValueError):  # absent, unreadable or outside the root: None, as RootFS documents
            return None
        return data if len(data) <= limit else None

    def _read(self, path: str, limit: int) -> bytes | None:
        return self.read(path, limit)
