"""An ELF object read by link-time virtual address: a file on disk, or its loaded image in a core.

One code path serves both places: :class:`ElfImage` takes a function that
reads ``size`` bytes at a link-time address, parses the ELF header and program
headers, and answers the two questions forensics asks of an object: its GNU
build-id (PT_NOTE) and the value of a dynamic symbol (PT_DYNAMIC ->
DT_GNU_HASH / DT_HASH, DT_SYMTAB, DT_STRTAB).  This is direct :mod:`struct`
parsing: a hash-table lookup touches a handful of small reads, where walking
``.dynsym`` with pyelftools would parse thousands of symbols.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Callable

from forensics.core import elf
from forensics.core.memory import CoreMemory, MemoryNotInCore

__all__ = ["ElfImage", "gnu_hash", "sysv_hash"]

_MAX_NOTE = 1 << 16
_MAX_PHNUM = 512
_MAX_CHAIN = 1 << 16

DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_GNU_HASH = 4, 5, 6, 10, 11, 0x6FFFFEF5
DT_SONAME = 14
_SYM = struct.Struct("<IBBHQQ")


class _Unreadable(Exception):
    pass


def gnu_hash(name: bytes) -> int:
    """The DT_GNU_HASH hash of a symbol name.

    >>> hex(gnu_hash(b"printf"))
    '0x156b2bb8'
    """
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def sysv_hash(name: bytes) -> int:
    """The SysV DT_HASH hash of a symbol name."""
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


class ElfImage:
    """An ELF64 little-endian object seen through ``read(link_vaddr, size)``.

    Build one with :meth:`from_memory` (the object as loaded in a core) or
    :meth:`from_file`.  ``bias`` is what the loader added to link-time
    addresses (the load base of a shared library; 0 for a non-PIE program and
    for files).
    """

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        header: elf.ElfHeader,
        phdrs: tuple[elf.ProgramHeader, ...],
        bias: int,
        *,
        in_memory: bool,
        read_at_offset: Callable[[int, int], bytes] | None = None,
    ) -> None:
        self._read = read  # raises _Unreadable
        self._read_at_offset = read_at_offset  # files only: notes need not lie in a PT_LOAD
        self.header = header
        self.phdrs = phdrs
        self.bias = bias
        self._in_memory = in_memory

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_memory(cls, mem: CoreMemory, base: int, page_size: int = 4096) -> ElfImage | None:
        """The object whose first page is mapped at ``base`` in the core, or None.

        None when the ELF header or program headers are not in the core or are not
        ELF64 little-endian.
        """
        try:
            head = mem.read(base, elf.EHDR64_SIZE)
            header = _header(head)
            if header is None:
                return None
            phdrs = elf.parse_program_headers(
                mem.read(base + header.phoff, header.phnum * elf.PHDR64_SIZE), header.phnum
            )
        except (MemoryNotInCore, ValueError):
            return None
        loads = [p for p in phdrs if p.type == elf.PT_LOAD]
        first = loads[0].vaddr if loads else 0
        bias = base - (first & ~(page_size - 1))

        def read(vaddr: int, size: int) -> bytes:
            try:
                return mem.read(bias + vaddr, size)
            except MemoryNotInCore as e:
                raise _Unreadable from e

        return cls(read, header, phdrs, bias, in_memory=True)

    @classmethod
    def from_file(cls, path: str) -> ElfImage | None:
        """The ELF file at ``path`` (read lazily through its PT_LOAD segments), or None.

        The file stays open only for the duration of each read.
        None when the file cannot be read or is not ELF64 little-endian.
        """

        def pread(offset: int, size: int) -> bytes:
            with open(path, "rb") as f:
                return os.pread(f.fileno(), size, offset)

        return cls._from_pread(pread)

    @classmethod
    def from_fd(cls, fd: int) -> ElfImage | None:
        """The ELF file open on ``fd`` (read with ``pread``; the caller keeps it open while the image is used).

        The way to read a file found by walking descriptors (:mod:`forensics.rootpath`):
        the bytes read are those of the file the walk found, whatever its name means now.
        """
        return cls._from_pread(lambda offset, size: os.pread(fd, size, offset))

    @classmethod
    def _from_pread(cls, pread: Callable[[int, int], bytes]) -> ElfImage | None:
        try:
            header = _header(pread(0, elf.EHDR64_SIZE))
            if header is None:
                return None
            phdrs = elf.parse_program_headers(pread(header.phoff, header.phnum * elf.PHDR64_SIZE), header.phnum)
        except (OSError, ValueError):
            return None
        loads = [p for p in phdrs if p.type == elf.PT_LOAD]

        def read_at_offset(offset: int, size: int) -> bytes:
            try:
                data = pread(offset, size)
            except OSError as e:
                raise _Unreadable from e
            if len(data) != size:
                raise _Unreadable
            return data

        def read(vaddr: int, size: int) -> bytes:
            for p in loads:
                if p.vaddr <= vaddr and vaddr + size <= p.vaddr + p.filesz:
                    return read_at_offset(p.offset + vaddr - p.vaddr, size)
            raise _Unreadable

        return cls(read, header, phdrs, 0, in_memory=False, read_at_offset=read_at_offset)

    # -- queries -----------------------------------------------------------------------------

    def build_id(self) -> str | None:
        """The GNU build-id (hex) from the PT_NOTE segments, or None."""
        for p in self.phdrs:
            if p.type != elf.PT_NOTE or not 0 < p.filesz <= _MAX_NOTE:
                continue
            data = self._note_bytes(p)
            if data is None:
                continue
            found = elf.parse_build_id(data)
            if found:
                return found
        return None

    def _note_bytes(self, p: elf.ProgramHeader) -> bytes | None:
        try:
            if self._read_at_offset is not None:  # a file's PT_NOTE need not lie inside a PT_LOAD
                return self._read_at_offset(p.offset, p.filesz)
            return self._read(p.vaddr, p.filesz)
        except _Unreadable:
            return None

    def dynamic(self) -> dict[int, int] | None:
        """The PT_DYNAMIC entries as ``{tag: value}``, or None when unreadable."""
        for p in self.phdrs:
            if p.type == elf.PT_DYNAMIC and 0 < p.filesz <= _MAX_NOTE:
                try:
                    return elf.parse_dynamic(self._read(p.vaddr, p.filesz))
                except _Unreadable:
                    return None
        return None

    def soname(self) -> str | None:
        """DT_SONAME (e.g. ``libnvidia-ml.so.1`` for ``libnvidia-ml.so.580.126.09``), or None."""
        dyn = self.dynamic()
        if not dyn or DT_SONAME not in dyn or DT_STRTAB not in dyn:
            return None
        try:
            raw = self._read(self._link_addr(dyn[DT_STRTAB]) + dyn[DT_SONAME], 256)
        except _Unreadable:
            return None
        name = raw.split(b"\0", 1)[0]
        return name.decode("utf-8", "replace") if name else None

    def _link_addr(self, value: int) -> int:
        # In memory, ld.so may have relocated DT_* pointers in place (glibc does on x86-64).
        if self._in_memory and self.bias and value >= self.bias:
            return value - self.bias
        return value

    def read(self, vaddr: int, size: int) -> bytes | None:
        """``size`` bytes at link-time address ``vaddr`` (a file's PT_LOAD contents), or None."""
        try:
            return self._read(vaddr, size)
        except _Unreadable:
            return None

    def find_dynamic_symbol(self, name: str) -> int | None:
        """The link-time value (``st_value``) of a defined dynamic symbol, or None.

        Add :attr:`bias` for its address in the process.
        """
        found = self.dynamic_symbol(name)
        return found[0] if found is not None else None

    def dynamic_symbol(self, name: str) -> tuple[int, int] | None:
        """``(st_value, st_size)`` of a defined dynamic symbol, or None."""
        dyn = self.dynamic()
        if not dyn or DT_SYMTAB not in dyn or DT_STRTAB not in dyn:
            return None
        symtab = self._link_addr(dyn[DT_SYMTAB])
        strtab = self._link_addr(dyn[DT_STRTAB])
        strsz = dyn.get(DT_STRSZ, 1 << 20)
        syment = dyn.get(DT_SYMENT, _SYM.size) or _SYM.size
        key = name.encode()
        try:
            if DT_GNU_HASH in dyn:
                candidates = self._gnu_candidates(self._link_addr(dyn[DT_GNU_HASH]), key)
            elif DT_HASH in dyn:
                candidates = self._sysv_candidates(self._link_addr(dyn[DT_HASH]), key)
            else:
                return None
            for index in candidates:
                raw = self._read(symtab + index * syment, _SYM.size)
                st_name, _info, _other, shndx, value, _size = _SYM.unpack(raw)
                if shndx == 0 or st_name >= strsz:
                    continue
                if self._read(strtab + st_name, len(key) + 1) == key + b"\x00":
                    return value, _size
        except _Unreadable:
            return None
        return None

    def _gnu_candidates(self, table: int, key: bytes):
        nbuckets, symoffset, bloom_size, _shift = struct.unpack("<4I", self._read(table, 16))
        if nbuckets == 0:
            return
        h = gnu_hash(key)
        buckets = table + 16 + bloom_size * 8
        index = struct.unpack("<I", self._read(buckets + (h % nbuckets) * 4, 4))[0]
        if index < symoffset:
            return
        chain = buckets + nbuckets * 4
        for _ in range(_MAX_CHAIN):
            ch = struct.unpack("<I", self._read(chain + (index - symoffset) * 4, 4))[0]
            if (ch | 1) == (h | 1):
                yield index
            if ch & 1:
                return
            index += 1

    def _sysv_candidates(self, table: int, key: bytes):
        nbucket, nchain = struct.unpack("<II", self._read(table, 8))
        if nbucket == 0:
            return
        index = struct.unpack("<I", self._read(table + 8 + (sysv_hash(key) % nbucket) * 4, 4))[0]
        chains = table + 8 + nbucket * 4
        for _ in range(min(nchain, _MAX_CHAIN)):
            if index == 0 or index >= nchain:
                return
            yield index
            index = struct.unpack("<I", self._read(chains + index * 4, 4))[0]


def _header(head: bytes) -> elf.ElfHeader | None:
    try:
        header = elf.parse_elf_header(head)
    except ValueError:
        return None
    if header.elf_class != 2 or header.data != 1 or header.phentsize != elf.PHDR64_SIZE:
        return None
    if not 0 < header.phnum <= _MAX_PHNUM:
        return None
    return header
