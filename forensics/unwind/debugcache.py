"""Debug files with their DWARF sections decompressed, kept in the forensics cache.

Distributions ship separate debug files with compressed sections (``SHF_COMPRESSED``:
Debian's ``libc6-dbg`` is zlib).  libdw inflates every DWARF section of such a file
each time it opens it (``dwarf_begin_elf``), which is half the cost of naming the
frames of a glibc abort.  :func:`decompressed_debug_file` does it once per file and
keeps the result: the same ELF file with each compressed section stored plain, so
later analyses (a batch, a crash loop, the next core on the node) map it directly.

The cache entry is keyed by the source file's identity (real path, device, inode,
size, modification and change times) and its build-id, never by the build-id alone:
a file claiming some build-id inside a bundle cannot stand in for another file with
that id.  Entries are written under an exclusive lock to a temporary name and
renamed into place, so concurrent analyses read a whole file or none.  Every size is
bounded; anything unexpected leaves the original file in use.
"""
from __future__ import annotations

import contextlib
import io
import os
import struct
import zlib

from ..cache import cache_path
from ..digest import sha256

__all__ = ["decompressed_debug_file", "has_compressed_sections", "write_decompressed"]

FORMAT = 1  # bump when the written layout changes
SHF_COMPRESSED = 0x800
SHT_NOBITS = 8
ELFCOMPRESS_ZLIB, ELFCOMPRESS_ZSTD = 1, 2
MAX_SECTIONS = 1 << 16
MAX_SECTION = 1 << 30  # bytes of one decompressed section
MAX_OUTPUT = 4 << 30  # bytes of the whole file
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_CHDR = struct.Struct("<IIQQ")
_CHUNK = 1 << 20


class _Unsuitable(Exception):
    """Not an ELF64 little-endian file this module rewrites (the original is used as it is)."""


def _read_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise _Unsuitable("short read")
    return data


def _headers(fd: int) -> tuple[tuple, list[tuple], list[tuple]]:
    """(ELF header fields, program headers, section headers) of the ELF file open at ``fd``."""
    eh = _EHDR.unpack(_read_exact(fd, _EHDR.size, 0))
    ident, e_phoff, e_shoff = eh[0], eh[5], eh[6]
    e_phentsize, e_phnum, e_shentsize, e_shnum = eh[9], eh[10], eh[11], eh[12]
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise _Unsuitable("not ELF64 little-endian")
    if e_shentsize != _SHDR.size or not 0 < e_shnum <= MAX_SECTIONS or (e_phnum and e_phentsize != _PHDR.size):
        raise _Unsuitable("unusual header sizes")
    shdrs = [_SHDR.unpack_from(raw, i * _SHDR.size) for raw in [_read_exact(fd, e_shnum * _SHDR.size, e_shoff)]
             for i in range(e_shnum)]
    phdrs = ([_PHDR.unpack_from(raw, i * _PHDR.size) for raw in [_read_exact(fd, e_phnum * _PHDR.size, e_phoff)]
              for i in range(e_phnum)] if e_phnum else [])
    return eh, phdrs, shdrs


def _compressed(sh: tuple) -> bool:
    return bool(sh[2] & SHF_COMPRESSED) and sh[1] != SHT_NOBITS


def has_compressed_sections(path: str) -> bool:
    """Whether the ELF file at ``path`` has a section stored compressed (``SHF_COMPRESSED``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return any(_compressed(sh) for sh in _headers(fd)[2])
    except (_Unsuitable, OSError, struct.error):
        return False
    finally:
        os.close(fd)


def _align(n: int, a: int) -> int:
    return n if a <= 1 else (n + a - 1) // a * a


class _Section(io.RawIOBase):
    """``size`` bytes at ``offset`` of the file open at ``fd``, as a stream."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd, self._pos, self._end = fd, offset, offset + size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self._end - self._pos)
        data = os.pread(self._fd, n, self._pos) if n > 0 else b""
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _inflate(src: int, offset: int, size: int, out, expected: int, kind: int) -> None:
    """Decompress ``size`` bytes at ``offset`` of ``src`` into ``out``; exactly ``expected`` bytes must come out.

    Output is produced at most a chunk at a time, so a section that inflates past its declared size
    stops there instead of filling memory.
    """
    section = _Section(src, offset, size)
    if kind == ELFCOMPRESS_ZLIB:
        chunks = _zlib_chunks(section)
    elif kind == ELFCOMPRESS_ZSTD:
        from typing import BinaryIO, cast  # here: typing is an import no other analysis needs

        import zstandard

        # the reader only calls read(size), which a raw stream has; typeshed's IO[bytes] asks for more
        reader = zstandard.ZstdDecompressor().stream_reader(cast(BinaryIO, section), read_across_frames=True)
        chunks = iter(lambda: reader.read(_CHUNK), b"")
    else:
        raise _Unsuitable(f"compression type {kind}")
    written = 0
    for data in chunks:
        written += len(data)
        if written > expected:
            raise _Unsuitable("section larger than its header says")
        out.write(data)
    if written != expected:
        raise _Unsuitable("section smaller than its header says")


def _zlib_chunks(section: _Section):
    d = zlib.decompressobj()
    while not d.eof:
        if d.unconsumed_tail:
            data = d.decompress(d.unconsumed_tail, _CHUNK)
        else:
            raw = section.read(_CHUNK)
            if not raw:
                return
            data = d.decompress(raw, _CHUNK)
        if data:
            yield data


def write_decompressed(src_path: str, dest_path: str) -> None:
    """Write ``src_path`` to ``dest_path`` with every compressed section stored plain.

    Layout of the copy: ELF header, program headers, each section's data in section order
    (aligned as its header says), section headers.  Section indices, names, links and
    symbols are unchanged; program headers that pointed into a section's data point into
    its new place.

    :raises ValueError: when the file is not one this rewrites (it is then used as it is)
    :raises OSError: when reading or writing fails
    """
    src = os.open(src_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        try:
            eh, phdrs, shdrs = _headers(src)
        except (_Unsuitable, struct.error) as e:
            raise ValueError(str(e)) from e
        with open(dest_path, "wb") as out:
            out.write(b"\0" * _EHDR.size)
            phoff = out.tell() if phdrs else 0
            out.write(b"\0" * (_PHDR.size * len(phdrs)))
            new_shdrs, moved = [], []  # moved: (old offset, old size, new offset) of stored sections
            for i, sh in enumerate(shdrs):
                name, typ, flags, addr, off, size, link, info, align, entsize = sh
                if i == 0 or typ == SHT_NOBITS or size == 0:
                    new_shdrs.append(sh)
                    continue
                if _compressed(sh):
                    ctype, _, csize, calign = _CHDR.unpack(_read_exact(src, _CHDR.size, off))
                    if csize > MAX_SECTION or size < _CHDR.size:
                        raise ValueError(f"section {i}: {csize} bytes decompressed")
                    start = _align(out.tell(), calign)
                    out.write(b"\0" * (start - out.tell()))
                    try:
                        _inflate(src, off + _CHDR.size, size - _CHDR.size, out, csize, ctype)
                    except (_Unsuitable, zlib.error) as e:
                        raise ValueError(f"section {i}: {e}") from e
                    new_shdrs.append((name, typ, flags & ~SHF_COMPRESSED, addr, start, csize, link, info, calign,
                                      entsize))
                else:
                    start = _align(out.tell(), align)
                    out.write(b"\0" * (start - out.tell()))
                    pos = 0
                    while pos < size:
                        chunk = _read_exact(src, min(_CHUNK, size - pos), off + pos)
                        out.write(chunk)
                        pos += len(chunk)
                    new_shdrs.append((name, typ, flags, addr, start, size, link, info, align, entsize))
                    moved.append((off, size, start))
                if out.tell() > MAX_OUTPUT:
                    raise ValueError(f"more than {MAX_OUTPUT} bytes decompressed")
            shoff = _align(out.tell(), 8)
            out.write(b"\0" * (shoff - out.tell()))
            for sh in new_shdrs:
                out.write(_SHDR.pack(*sh))
            out.seek(phoff)
            for ph in phdrs:
                p_type, p_flags, p_offset, *rest = ph
                for old, size, new in moved:  # a note segment points into a section's data
                    if old <= p_offset < old + size:
                        p_offset = new + (p_offset - old)
                        break
                out.write(_PHDR.pack(p_type, p_flags, p_offset, *rest))
            out.seek(0)
            fields = list(eh)
            fields[5], fields[6] = phoff, shoff
            out.write(_EHDR.pack(*fields))
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(src)


def _entry_name(path: str, build_id: str) -> str | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    identity = f"{FORMAT}\0{real}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return f"{build_id}-{sha256(identity.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}.debug"


def decompressed_debug_file(path: str, build_id: str) -> str:
    """``path``, or its decompressed copy in the cache (written on first use) when it has compressed sections.

    :param path: a separate debug file whose build-id note is ``build_id`` (checked by the caller)
    :param build_id: its build-id (hex), part of the cache entry's name
    :return: the file to hand to libdw; ``path`` itself whenever no copy can be used
    """
    if not has_compressed_sections(path):
        return path
    name = _entry_name(path, build_id)
    if name is None:
        return path
    # os.path, not pathlib: pathlib (with urllib.parse and ipaddress) is an import no analysis needs otherwise
    directory = cache_path("debug-plain", build_id[:2])
    final = os.path.join(directory, name)
    if os.path.isfile(final):
        return final
    import fcntl

    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        lock_fd = os.open(os.path.join(directory, f".{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return path
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if os.path.isfile(final):  # another analysis wrote it while we waited
            return final
        tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}")
        try:
            write_decompressed(path, tmp)
            os.rename(tmp, final)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return path
        return final
    finally:
        os.close(lock_fd)
