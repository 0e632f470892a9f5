"""The core on its way to disk: zstd in constant memory, a reserve for a full disk, room for metadata.

``Compressor`` streams the core handler's stdin into a zstd frame and knows exactly
what reached the disk; on a full disk it releases a reserve made at the start so the
frame can still end.  :func:`with_room` runs a metadata write and, when the disk is
full, shortens the saved core (marking it partial) until the write fits: metadata
is worth more than the last bytes of a core the disk could not hold anyway.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from dataclasses import dataclass

from ..bundle.layout import CORE_PARTIAL
from ..bundle.record import CoreState

__all__ = ["Compressor", "make_reserve", "with_room", "RESERVE", "StreamVerdict", "check_core_stream", "TAIL",
           "headers_end", "expected_core_bytes", "compressed_bound"]

RESERVE = 1 << 20
TAIL = 64  # the last bytes of the stream the handler keeps: a PN_XNUM core's section header is there


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamVerdict:
    """What the kernel's stream was, judged against the ELF core's own headers."""

    kind: str  # "core" (whole), "short" (ended early), "not-a-core", "unchecked"
    size: int  # bytes received
    expected: int | None  # bytes the core's program headers claim
    reason: str | None  # for anything but a whole core


def check_core_stream(head: bytes, size: int, tail: bytes = b"") -> StreamVerdict:
    """Judge a core stream by its first bytes (``head``), its length and its last :data:`TAIL` bytes.

    A core is whole when the stream reaches the end of its last segment (:func:`~forensics.core.elf.core_extent`);
    empty, non-ELF and non-core streams are not cores.

    >>> check_core_stream(b"", 0).reason
    'the stream was empty (0 bytes): no core'
    >>> check_core_stream(b"\\x7fELF" + bytes(60), 64).kind
    'not-a-core'
    """
    from ..core import elf

    def verdict(kind: str, reason: str | None, expected: int | None = None) -> StreamVerdict:
        return StreamVerdict(kind=kind, size=size, expected=expected, reason=reason)

    if size == 0:
        return verdict("not-a-core", "the stream was empty (0 bytes): no core")
    if not head.startswith(elf.ELF_MAGIC[: min(4, len(head))]) or len(head) < 4:
        what, _ = elf.identify_non_elf(head[:4096], "the stream")
        return verdict("not-a-core", f"the stream is not an ELF core: {what} ({size:,} bytes)")
    if len(head) < elf.EHDR64_SIZE:
        return verdict("short", f"the stream ended inside the ELF header ({size} bytes)")
    try:
        hdr = elf.parse_elf_header(head[: elf.EHDR64_SIZE])
    except ValueError as e:
        return verdict("not-a-core", f"the stream's ELF header cannot be read: {e}")
    if hdr.type != elf.ET_CORE:
        return verdict("not-a-core", f"the stream is an ELF file of type {hdr.type}, not a core (type {elf.ET_CORE})")
    if hdr.elf_class != 2 or hdr.phentsize != elf.PHDR64_SIZE:
        return verdict("unchecked", "not a 64-bit little-endian core: its size was not checked")
    phnum = hdr.phnum
    if phnum == elf.PN_XNUM:  # more than 65534 segments: the count is in section header 0, at the end of the file
        if hdr.shoff + elf.SHDR64_SIZE > size:
            return verdict("short", f"the stream ended after {size:,} bytes, before the section header at "
                                    f"{hdr.shoff:,} that holds the segment count", hdr.shoff + elf.SHDR64_SIZE)
        if hdr.shoff + elf.SHDR64_SIZE != size or len(tail) < elf.SHDR64_SIZE:
            return verdict("unchecked", "the segment count (PN_XNUM) is not at the stream's end: size not checked")
        phnum = elf.parse_xnum_phnum(tail[-elf.SHDR64_SIZE:])
    ph_end = hdr.phoff + phnum * elf.PHDR64_SIZE
    if ph_end > size:
        return verdict("short", f"the stream ended after {size:,} bytes, inside the program headers "
                                f"(they end at {ph_end:,})", ph_end)
    if ph_end > len(head):
        return verdict("unchecked", f"the program headers end past the first {len(head):,} bytes: size not checked")
    expected = elf.core_extent(elf.parse_program_headers(head[hdr.phoff: ph_end], phnum), ph_end)
    if hdr.phnum == elf.PN_XNUM:
        expected = max(expected, hdr.shoff + elf.SHDR64_SIZE)
    if size < expected:
        return verdict("short", f"the stream ended after {size:,} bytes; the core's program headers claim "
                                f"{expected:,}: the core is cut short", expected)
    return verdict("core", None, expected)


def headers_end(head: bytes) -> int | None:
    """Where a 64-bit core's program headers end, from its ELF header (None: not such a core, or not known yet)."""
    from ..core import elf

    if len(head) < elf.EHDR64_SIZE or not head.startswith(elf.ELF_MAGIC):
        return None
    try:
        hdr = elf.parse_elf_header(head[: elf.EHDR64_SIZE])
    except ValueError:
        return None
    if hdr.type != elf.ET_CORE or hdr.elf_class != 2 or hdr.phentsize != elf.PHDR64_SIZE or hdr.phnum == elf.PN_XNUM:
        return None
    return hdr.phoff + hdr.phnum * elf.PHDR64_SIZE


def expected_core_bytes(head: bytes) -> int | None:
    """The size of the whole core by its own program headers, read from its first bytes (None: not known).

    >>> expected_core_bytes(b"not a core") is None
    True
    """
    from ..core import elf

    end = headers_end(head)
    if end is None or end > len(head):
        return None
    hdr = elf.parse_elf_header(head[: elf.EHDR64_SIZE])
    return elf.core_extent(elf.parse_program_headers(head[hdr.phoff: end], hdr.phnum), end)


def compressed_bound(n: int) -> int:
    """The most bytes a zstd frame of ``n`` bytes takes (ZSTD_COMPRESSBOUND, plus a frame's header and checksum).

    >>> compressed_bound(1 << 20)
    1052690
    """
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0) + 18


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
            # no room gained when it cannot go: the record says the disk filled up
            with contextlib.suppress(OSError):
                os.unlink(self.reserve_path)
            self.reserve_path = None


def make_reserve(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # no reserve: the handler runs without one (a full disk then cuts the record too)
        return None
    try:
        os.posix_fallocate(fd, 0, RESERVE)
        return path
    except OSError:
        os.close(fd)
        fd = -1
        with contextlib.suppress(OSError):  # our own half-made reserve file; absent is fine
            os.unlink(path)
        return None
    finally:
        if fd >= 0:
            os.close(fd)


_SHRINK = 256 << 10


def _out_of_inodes(path: str) -> bool:
    try:
        return os.statvfs(path).f_favail == 0
    except OSError:  # not known: as for a full disk
        return False


def with_room(fn, result, shortened) -> None:
    """Run ``fn``; on a full disk, shorten the saved core (marking it partial) to make room, and retry.

    :param result: the handler's result (``core_path``, ``core_state`` are updated)
    :param shortened: called after each shortening with the core's compressed size now (the handler
        updates its record, and rewrites it where ``fn`` does not)

    Metadata is worth more than the last bytes of a core that the disk could not hold anyway.
    """
    for _ in range(64):
        try:
            return fn()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not result.core_path:
                raise
            if _out_of_inodes(os.path.dirname(result.core_path)):
                raise  # out of inodes, not of bytes: shortening the core would not make room
        path = result.core_path
        size = os.path.getsize(path)
        if size == 0:
            raise OSError(errno.ENOSPC, "no space left for the crash's metadata")
        os.truncate(path, max(0, size - _SHRINK))
        if os.path.basename(path) != CORE_PARTIAL:
            new = os.path.join(os.path.dirname(path), CORE_PARTIAL)
            os.rename(path, new)
            result.core_path = path = new
        result.core_state = CoreState.PARTIAL
        shortened(os.path.getsize(path))
    return fn()
