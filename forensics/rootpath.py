"""Paths inside a root, resolved one component at a time on descriptors: the one resolver.

Every directory forensics reads as somebody else's root goes through here: an image's
unpacked root (``verify-imports dir:``, ``analyze --sysroot``), ``/proc/PID/root`` of a
live container (``capture``, ``verify-imports --pid``), a capture bundle (``analyze
BUNDLE``).  A path is resolved as ``openat2(2)`` with ``RESOLVE_IN_ROOT`` does it:

- each component is opened with ``O_PATH | O_NOFOLLOW`` relative to its parent's
  descriptor and judged by ``fstat`` of that descriptor: what is checked is what is
  used, nothing is looked up twice by name, and a directory swapped for a symlink between
  two steps is met as the symlink it has become;
- a symlink is read from its own descriptor and resolved here: an absolute target starts
  again at the root, a relative one in the directory holding the link;
- ``..`` goes back one directory on the path walked so far and stops at the root; it is
  never opened, so a directory moved out of the root does not lead out of it;
- a lookup follows at most :data:`MAX_SYMLINKS` links (Linux's MAXSYMLINKS), then ELOOP.

The last step opens the file by name once more (``O_NOFOLLOW``) and keeps it only when it
is the very file the walk found (same device and inode).  Errors are the ``OSError`` s
``openat2`` gives (ENOENT, ENOTDIR, ELOOP; EXDEV when the file changed under the walk);
callers say what a missing file means.  Nothing here is specific to forensics: it imports
nothing from it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

__all__ = [
    "MAX_SYMLINKS",
    "open_root",
    "open_in_root",
    "open_in_root_as",
    "resolve_in_root",
    "trace_in_root",
    "lstat_in_root",
    "stat_in_root",
    "readlink_in_root",
    "read_in_root",
    "listdir_in_root",
    "makedirs_in_root",
    "split_in_root",
]

MAX_SYMLINKS = 40  # Linux's MAXSYMLINKS
_MAX_RETRIES = 8  # the last component changed between the walk and the open: walk again, this often
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def open_root(root: str) -> int:
    """An ``O_PATH`` descriptor of the directory ``root`` (the caller's choice, trusted; the caller closes it)."""
    return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def split_in_root(path: str) -> list[str]:
    """The components of ``path`` that name something (``""`` and ``.`` dropped; ``..`` kept).

    >>> split_in_root("/usr//lib/./x/../y")
    ['usr', 'lib', 'x', '..', 'y']
    """
    return [c for c in path.split("/") if c not in ("", ".")]


class _Walk:
    """The descriptors of the directories walked (``fds[0]`` is the root, not owned) and their names."""

    __slots__ = ("fds", "names")

    def __init__(self, root_fd: int) -> None:
        self.fds = [root_fd]
        self.names: list[str] = []

    def push(self, fd: int, name: str) -> None:
        self.fds.append(fd)
        self.names.append(name)

    def pop(self) -> None:
        if len(self.fds) > 1:
            os.close(self.fds.pop())
            self.names.pop()

    def to_root(self) -> None:
        while len(self.fds) > 1:
            self.pop()

    def close(self) -> None:
        self.to_root()

    @property
    def path(self) -> str:
        return "/" + "/".join(self.names)


def _walk(root_fd: int, path: str, *, follow_last: bool, max_links: int,
          met: list[tuple[str, str]] | None = None) -> _Walk:
    """Walk ``path`` from ``root_fd``: the returned walk's last descriptor (``O_PATH``) is what ``path``
    names (the root itself when it names nothing else).  Each symlink followed is added to ``met``, when
    given, as (its canonical path, its target).  The caller closes the walk."""
    walk = _Walk(root_fd)
    pending = split_in_root(path)
    pending.reverse()
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                walk.pop()
                continue
            try:
                fd = os.open(name, _PATH_FLAGS, dir_fd=walk.fds[-1])
            except OSError as e:
                raise OSError(e.errno, e.strerror, path) from None  # name the path asked for, not a component
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode) and (pending or follow_last):
                try:
                    target = os.readlink("", dir_fd=fd)  # the link this descriptor holds, not a name
                finally:
                    os.close(fd)
                links += 1
                if links > max_links:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if not target:
                    raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
                if met is not None:
                    met.append((walk.path.rstrip("/") + "/" + name, target))
                if target.startswith("/"):
                    walk.to_root()
                pending.extend(reversed(split_in_root(target)))
                continue
            if pending and not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            walk.push(fd, name)
        return walk
    except BaseException:
        walk.close()
        raise


def _with_root(root: str | int) -> tuple[int, bool]:
    """(descriptor, whether this call opened it)."""
    return (root, False) if isinstance(root, int) else (open_root(root), True)


@contextlib.contextmanager
def _resolved(root: str | int, path: str, follow_last: bool, max_links: int = MAX_SYMLINKS,
              met: list[tuple[str, str]] | None = None) -> Iterator[_Walk]:
    root_fd, owned = _with_root(root)
    try:
        walk = _walk(root_fd, path, follow_last=follow_last, max_links=max_links, met=met)
        try:
            yield walk
        finally:
            walk.close()
    finally:
        if owned:
            os.close(root_fd)


def open_in_root(root: str | int, path: str, flags: int = os.O_RDONLY, *, follow_last: bool = True,
                 max_links: int = MAX_SYMLINKS) -> int:
    """Open what ``path`` names inside ``root``, never leaving it; the caller closes the descriptor.

    :param root: the root directory, or an ``O_PATH`` descriptor of it (see :func:`open_root`)
    :param path: a path as a process inside the root sees it (absolute or not: both start at the root)
    :param flags: ``os.open`` flags; ``O_NOFOLLOW`` and ``O_CLOEXEC`` are added.  With ``O_PATH``
        the walk's own descriptor is returned (a symlink itself when ``follow_last`` is false)
    :param follow_last: resolve a symlink in the last component (false: ``lstat`` semantics)
    :raises OSError: ENOENT (a component is missing), ENOTDIR (a non-directory in the middle),
        ELOOP (more than ``max_links`` symlinks, or a symlink opened without ``O_PATH``), EINVAL
        (a device, FIFO or socket opened without ``O_PATH``), EXDEV (the file kept changing
        under the walk), or what ``open`` says (EACCES...)

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     os.symlink("/", os.path.join(root, "escape"))
    ...     os.close(os.open(os.path.join(root, "inside"), os.O_CREAT | os.O_WRONLY))
    ...     fd = open_in_root(root, "/escape/escape/../inside")
    ...     os.fstat(fd).st_ino == os.stat(os.path.join(root, "inside")).st_ino
    True
    """
    return open_in_root_as(root, path, flags, follow_last=follow_last, max_links=max_links)[0]


def open_in_root_as(root: str | int, path: str, flags: int = os.O_RDONLY, *, follow_last: bool = True,
                    max_links: int = MAX_SYMLINKS) -> tuple[int, str]:
    """:func:`open_in_root`, and the canonical in-root path of the file it opened (from the same walk).

    :raises OSError: as :func:`open_in_root`
    """
    for _ in range(_MAX_RETRIES):
        with _resolved(root, path, follow_last, max_links) as walk:
            found = walk.fds[-1]
            if flags & os.O_PATH:
                return os.dup(found), walk.path
            st = os.fstat(found)
            if stat.S_ISLNK(st.st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                # a FIFO would block the open, a device act on it: only O_PATH reaches those
                raise OSError(errno.EINVAL, "not a regular file or directory", path)
            if not walk.names:  # the root itself
                return os.open(".", flags | os.O_CLOEXEC, dir_fd=found), "/"
            try:
                fd = os.open(walk.names[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=walk.fds[-2])
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOENT):
                    continue  # the last component changed after the walk met it: walk again
                raise
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd, walk.path
            os.close(fd)  # another file took its name between the walk and the open: walk again
    raise OSError(errno.EXDEV, "the file kept changing while it was resolved", path)


def resolve_in_root(root: str | int, path: str, *, follow_last: bool = True, max_links: int = MAX_SYMLINKS) -> str:
    """The canonical path inside ``root`` of what ``path`` names (no symlink, ``.`` or ``..`` left in it).

    :raises OSError: as :func:`open_in_root`
    """
    with _resolved(root, path, follow_last, max_links) as walk:
        return walk.path


def trace_in_root(root: str | int, path: str) -> tuple[list[tuple[str, str]], str]:
    """The symlinks a lookup of ``path`` inside ``root`` follows, each as (its canonical path, its target) in the
    order met, and the canonical path it ends at: what a view of ``root`` must hold for ``path`` to name the same
    file in it.

    :raises OSError: as :func:`open_in_root`
    """
    met: list[tuple[str, str]] = []
    with _resolved(root, path, True, MAX_SYMLINKS, met) as walk:
        return met, walk.path


def lstat_in_root(root: str | int, path: str) -> os.stat_result:
    """``lstat`` of what ``path`` names inside ``root`` (symlinks followed except in the last component)."""
    with _resolved(root, path, False, MAX_SYMLINKS) as walk:
        return os.fstat(walk.fds[-1])


def stat_in_root(root: str | int, path: str) -> os.stat_result:
    """``stat`` of what ``path`` names inside ``root``."""
    with _resolved(root, path, True, MAX_SYMLINKS) as walk:
        return os.fstat(walk.fds[-1])


def readlink_in_root(root: str | int, path: str) -> str:
    """The target of the symlink ``path`` names inside ``root`` (its directories resolved inside it).

    :raises OSError: EINVAL when it is not a symlink
    """
    with _resolved(root, path, False, MAX_SYMLINKS) as walk:
        return os.readlink("", dir_fd=walk.fds[-1])


def read_in_root(root: str | int, path: str, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of the regular file ``path`` names inside ``root``.

    :raises OSError: as :func:`open_in_root`; EINVAL when it is not a regular file
    """
    fd = open_in_root(root, path)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def listdir_in_root(root: str | int, path: str) -> list[str]:
    """The names in the directory ``path`` names inside ``root``, sorted."""
    fd = open_in_root(root, path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def makedirs_in_root(root: str | int, path: str, mode: int = 0o755) -> int:
    """Create the directories of ``path`` inside ``root`` as needed; an ``O_PATH`` descriptor of the last.

    For writing: no symlink is followed, not even inside the root, and ``..`` is refused, so
    what is made is exactly ``root/path``.

    :raises OSError: ENOTDIR when a component exists and is not a directory (a symlink
        included); EINVAL for a ``..`` component
    """
    root_fd, owned = _with_root(root)
    fd = os.dup(root_fd)
    try:
        for name in split_in_root(path):
            if name == "..":
                raise OSError(errno.EINVAL, "'..' in a path to create", path)
            with contextlib.suppress(FileExistsError):  # opened below, never following a link
                os.mkdir(name, mode, dir_fd=fd)
            nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise
    finally:
        if owned:
            os.close(root_fd)
