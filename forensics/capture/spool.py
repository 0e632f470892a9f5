"""The core on its way to disk: zstd in constant memory, a reserve for a full disk, room for metadata.

``Compressor`` streams the core handler's stdin into a zstd frame and knows exactly
what reached the disk; on a full disk it releases a reserve made at the start so the
frame can still end.  :func:`with_room` runs a metadata write and, when the disk is
full, shortens the saved core (marking it partial) until the write fits: metadata
is worth more than the last bytes of a core the disk could not hold anyway.
"""
from __future__ import annotations

import errno
import hashlib
import os

__all__ = ["Compressor", "make_reserve", "with_room", "RESERVE"]

RESERVE = 1 << 20


class Compressor:
    """stdin -> zstd -> file, counting bytes; knows exactly what reached the disk."""

    def __init__(self, out_fd: int, level: int, threads: int, reserve_path: str | None) -> None:
        import zstandard

        params = zstandard.ZstdCompressionParameters.from_level(level, threads=threads, write_checksum=1)
        self.cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
        self.fd = out_fd
        self.out = 0
        self.sha = hashlib.sha256()
        self.disk_full = False
        self.reserve_path = reserve_path
        self.pending = b""  # output not yet on disk when the disk filled up

    def _write(self, data) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self.disk_full = True
                self.pending = bytes(view)
                return
            self.sha.update(view[:n])
            self.out += n
            view = view[n:]

    def feed(self, chunk) -> bool:
        """Compress ``chunk``; False once the disk is full (stop feeding)."""
        self._write(self.cobj.compress(chunk))
        return not self.disk_full

    def finish(self) -> bool:
        """End the frame; True when the file is a whole zstd frame."""
        import zstandard

        if self.disk_full:
            self._release_reserve()
            self.disk_full = False
            pending, self.pending = self.pending, b""
            self._write(pending)
            if self.disk_full:
                return False
        self._write(self.cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
        if self.disk_full:
            self._release_reserve()
            return False
        return True

    def _release_reserve(self) -> None:
        if self.reserve_path:
            try:
                os.unlink(self.reserve_path)
            except OSError:
                pass
            self.reserve_path = None


def make_reserve(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, RESERVE)
        return path
    except OSError:
        os.close(fd)
        fd = -1
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    finally:
        if fd >= 0:
            os.close(fd)


_SHRINK = 256 << 10


def with_room(fn, result, record: dict, rewrite=None) -> None:
    """Run ``fn``; on a full disk, shorten the saved core (marking it partial) to make room, and retry.

    :param result: the handler's result (``core_path``, ``core_state`` are updated)
    :param record: the crash record whose ``core`` entry is updated
    :param rewrite: called after each shortening (to rewrite the record)

    Metadata is worth more than the last bytes of a core that the disk could not hold anyway.
    """
    for _ in range(64):
        try:
            return fn()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not result.core_path:
                raise
        path = result.core_path
        size = os.path.getsize(path)
        if size == 0:
            raise OSError(errno.ENOSPC, "no space left for the crash's metadata")
        os.truncate(path, max(0, size - _SHRINK))
        if not path.endswith("core.partial.zst"):
            new = os.path.join(os.path.dirname(path), "core.partial.zst")
            os.rename(path, new)
            result.core_path = path = new
        result.core_state = "partial"
        core = record["core"]
        core.update(state="partial", file="core.partial.zst", bytes_compressed=os.path.getsize(path),
                    sha256_compressed=None)
        if "shortened to make room for the metadata" not in " ".join(core["reasons"]):
            core["reasons"].append("the disk filled up: the saved core was shortened to make room for the metadata")
        if rewrite is not None:
            rewrite()
    return fn()
