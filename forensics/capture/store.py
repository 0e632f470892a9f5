"""The object store: one copy of each mapped ELF object, keyed by build-id, shared by every core.

Layout under the core directory: ``objects/<key[:2]>/<key[2:]>`` where the key is the GNU
build-id in hex, or ``sha256-<hex>`` for an object without one.  Two hundred cores of one
crash-looping container keep one copy of libpython, libc and libnvidia-ml.  Objects are
written atomically (temporary name, fsync, rename), so a reader never sees half a file and
two handlers storing the same object at once both succeed.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os

from ..bundle.layout import OBJECTS
from ..bundle.write import replacing
from ..core.buildid import read_build_id_from_fd

__all__ = ["ObjectStore", "key_of_fd", "disk_usage", "data_extents", "data_bytes"]


def key_of_fd(fd: int) -> str:
    """The store key of an open ELF object: its build-id, else ``sha256-`` of its bytes."""
    bid = read_build_id_from_fd(fd)
    if bid:
        return bid
    h = hashlib.sha256()
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    return "sha256-" + h.hexdigest()


class ObjectStore:
    """The ``objects/`` directory of a core directory."""

    def __init__(self, core_dir: str) -> None:
        self.root = os.path.join(core_dir, OBJECTS)

    def path_of(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key[2:])

    def has(self, key: str) -> bool:
        return os.path.exists(self.path_of(key))

    def add_from_fd(self, fd: int, key: str) -> int:
        """Copy the file open at ``fd`` in under ``key`` unless it is there, holes kept; the disk it takes."""
        dest = self.path_of(key)
        if os.path.exists(dest):
            # in use again: the budget's object collection goes by this time (a read-only store keeps the old one)
            with contextlib.suppress(OSError):
                os.utime(dest)
            return 0
        d = os.path.dirname(dest)
        os.makedirs(d, exist_ok=True)
        with replacing(dest, f"{dest}.tmp{os.getpid()}.{id(self):x}", 0o444) as out:
            size = os.fstat(fd).st_size
            for start, end in data_extents(fd, size):  # its holes stay holes: a sparse file costs what it holds
                _copy_range(fd, out, start, end)
            os.ftruncate(out, size)
            total = os.fstat(out).st_blocks * 512
        return total

    def add_file(self, path: str, key: str | None = None) -> tuple[str, int]:
        """Store the file at ``path``; ``(key, bytes written)``."""
        fd = os.open(path, os.O_RDONLY)
        try:
            key = key or key_of_fd(fd)
            return key, self.add_from_fd(fd, key)
        finally:
            os.close(fd)

    def size(self) -> int:
        return disk_usage(self.root)


MAX_EXTENTS = 1 << 16  # data ranges looked for in one file (each is two lseeks)


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` byte ranges of the file open at ``fd`` that hold data (SEEK_DATA / SEEK_HOLE); the whole
    file where the filesystem cannot tell."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        if len(out) >= MAX_EXTENTS:  # a file cut in more pieces than any real one: the rest copied as it reads
            return [*out, (pos, size)]
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as e:
            if e.errno == errno.ENXIO:  # a hole to the end
                break
            return [*out, (pos, size)]  # no SEEK_DATA here: all of it is data
        if start >= size:
            break
        out.append((start, end))
        pos = end
    return out


def data_bytes(fd: int) -> int:
    """Bytes of the file open at ``fd`` that hold data (a sparse file's holes not counted)."""
    return sum(end - start for start, end in data_extents(fd, os.fstat(fd).st_size))


def _copy_range(fd: int, out: int, start: int, end: int) -> None:
    pos = start
    while pos < end:
        try:
            n = os.copy_file_range(fd, out, min(end - pos, 8 << 20), pos, pos)
        except OSError:
            n = 0
        if n == 0:  # copy_file_range across filesystems or from procfs links: fall back
            chunk = os.pread(fd, min(end - pos, 1 << 20), pos)
            if not chunk:
                return
            n = os.pwrite(out, chunk, pos)
        pos += n


def disk_usage(path: str) -> int:
    """Bytes of disk the files under ``path`` take (allocated blocks, links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # removed since the walk listed it
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total
