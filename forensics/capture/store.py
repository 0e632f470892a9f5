"""The object store: one copy of each mapped ELF object, keyed by build-id, shared by every core.

Layout under the core directory: ``objects/<key[:2]>/<key[2:]>`` where the key is the GNU
build-id in hex, or ``sha256-<hex>`` for an object without one.  Two hundred cores of one
crash-looping container keep one copy of libpython, libc and libnvidia-ml.  Objects are
written atomically (temporary name, fsync, rename), so a reader never sees half a file and
two handlers storing the same object at once both succeed.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

from ..core.buildid import read_build_id_from_fd

__all__ = ["ObjectStore", "key_of_fd", "write_atomic", "fsync_dir", "disk_usage"]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _replacing(path: str, tmp: str, mode: int):
    """A descriptor on ``tmp``; when the block ends well: fsync, rename onto ``path``; else ``tmp`` is removed."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        yield fd
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):  # our own temporary file; the error being raised is what matters
            os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def write_atomic(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temporary name, fsync, rename, fsync the directory."""
    d = os.path.dirname(path) or "."
    with _replacing(path, os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}"), mode) as fd:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    fsync_dir(d)


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
        self.root = os.path.join(core_dir, "objects")

    def path_of(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key[2:])

    def has(self, key: str) -> bool:
        return os.path.exists(self.path_of(key))

    def add_from_fd(self, fd: int, key: str) -> int:
        """Copy the file open at ``fd`` in under ``key`` unless it is there; bytes written."""
        dest = self.path_of(key)
        if os.path.exists(dest):
            # in use again: the budget's object collection goes by this time (a read-only store keeps the old one)
            with contextlib.suppress(OSError):
                os.utime(dest)
            return 0
        d = os.path.dirname(dest)
        os.makedirs(d, exist_ok=True)
        total = 0
        with _replacing(dest, f"{dest}.tmp{os.getpid()}.{id(self):x}", 0o444) as out:
            size = os.fstat(fd).st_size
            while total < size:
                try:
                    n = os.copy_file_range(fd, out, min(size - total, 8 << 20), total, total)
                except OSError:
                    n = 0
                if n == 0:  # copy_file_range across filesystems or from procfs links: fall back
                    chunk = os.pread(fd, min(size - total, 1 << 20), total)
                    if not chunk:
                        break
                    n = os.pwrite(out, chunk, total)
                total += n
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


def disk_usage(path: str) -> int:
    """Bytes of disk the files under ``path`` take (allocated blocks, links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # removed since the walk listed it
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total
