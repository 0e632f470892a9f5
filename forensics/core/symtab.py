"""``.symtab`` symbols of an ELF file (a separate debug file, an unstripped object), read with :mod:`struct`.

The dynamic symbol table (``.dynsym``, :class:`~forensics.core.image.ElfImage`) holds only
what an object exports; the full symbol table lives in its separate debug file
(:mod:`forensics.core.debugfiles`) or in an unstripped file.  :func:`read_symbols` finds a
few names in it without pyelftools (which walks every symbol as an object, ~50 times
slower on libc's ~10,000).  Bounded: the section header table, the symbol and string tables
are checked against the file's size and capped.  Used by the heap reader (libc's
``main_arena``) and the Python walker (``_PyRuntime`` of an interpreter that does not export it).
"""
from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable

from forensics.core import elf
from forensics.records import record

__all__ = ["SymtabError", "DebugSymbol", "read_symbols", "has_symtab", "section_headers", "SHT_SYMTAB",
           "SHT_NOBITS", "STT_OBJECT", "STT_FUNC", "STT_TLS"]

_MAX_SECTION = 64 << 20  # a symbol or string table larger than this is not one we read
_MAX_SHNUM = 4096
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
SHT_SYMTAB = 2
SHT_NOBITS = 8
STT_OBJECT, STT_FUNC, STT_TLS = 1, 2, 6


class SymtabError(Exception):
    """A file that cannot be read as an ELF64 object with a symbol table."""


@record
class DebugSymbol:
    """A ``.symtab`` entry: link-time value (a TLS offset for ``STT_TLS``), size and type."""

    name: str
    value: int
    size: int
    type: int  # STT_*


def section_headers(f) -> list[tuple[int, int, int, int, int, int]]:
    """(name, type, offset, size, link, entsize) of every section of an open ELF64 file.

    The ELF header is read by :func:`forensics.core.elf.parse_elf_header`.

    :raises SymtabError: when it is not ELF64 little-endian or has no usable section header table
    """
    head = f.read(elf.EHDR64_SIZE)
    try:
        header = elf.parse_elf_header(head)
    except ValueError:
        raise SymtabError("not an ELF64 little-endian file") from None
    if header.elf_class != elf.ELFCLASS64 or header.data != elf.ELFDATA2LSB or len(head) < elf.EHDR64_SIZE:
        raise SymtabError("not an ELF64 little-endian file")
    if header.shentsize != _SHDR.size or not 0 < header.shnum <= _MAX_SHNUM:
        raise SymtabError("no usable section header table")
    f.seek(header.shoff)
    raw = f.read(header.shnum * _SHDR.size)
    if len(raw) != header.shnum * _SHDR.size:
        raise SymtabError("section header table cut short")
    out = []
    for i in range(header.shnum):
        name, typ, _flags, _addr, offset, size, link, _info, _align, entsize = _SHDR.unpack_from(raw, i * _SHDR.size)
        out.append((name, typ, offset, size, link, entsize))
    return out


_MAX_HEADER_CACHE = 64  # files whose section headers are kept
_header_cache: OrderedDict[tuple[int, ...], list[tuple[int, int, int, int, int, int]]] = OrderedDict()
_cache_lock = threading.Lock()


def _identity(f) -> tuple[int, ...]:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _sections_of(f) -> list[tuple[int, int, int, int, int, int]]:
    """:func:`section_headers` of the open file, parsed once per file (by its identity: device, inode, size,
    modification and change times of what is open), so that asking whether it has a ``.symtab`` and then reading
    it parses its headers once."""
    key = _identity(f)
    with _cache_lock:
        hit = _header_cache.get(key)
        if hit is not None:
            _header_cache.move_to_end(key)
            return hit
    sections = section_headers(f)
    with _cache_lock:
        _header_cache[key] = sections
        while len(_header_cache) > _MAX_HEADER_CACHE:
            _header_cache.popitem(last=False)
    return sections


def has_symtab(path: str) -> bool:
    """Whether the file has a ``.symtab`` (an unstripped object, or a debug file)."""
    try:
        with open(path, "rb") as f:
            return any(s[1] == SHT_SYMTAB for s in _sections_of(f))
    except (OSError, SymtabError):
        return False


def _read_at(f, offset: int, size: int, file_size: int) -> bytes:
    if size > _MAX_SECTION or offset + size > file_size:
        raise SymtabError(f"section of {size} bytes at {offset} lies outside the file or is too large")
    f.seek(offset)
    return f.read(size)


def read_symbols(path: str, names: Iterable[str]) -> dict[str, DebugSymbol]:
    """The defined ``.symtab`` symbols of ``path`` among ``names`` (the first definition of each).

    :raises SymtabError: when the file is not ELF64 or its symbol table is unreadable
    :raises OSError: when the file cannot be read
    """
    wanted = {n.encode(): n for n in names}
    out: dict[str, DebugSymbol] = {}
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        sections = _sections_of(f)
        for _name, typ, offset, size, link, entsize in sections:
            if typ != SHT_SYMTAB or entsize != _SYM.size or link >= len(sections):
                continue
            table = _read_at(f, offset, size, file_size)
            s_off, s_size = sections[link][2], sections[link][3]
            strtab = _read_at(f, s_off, s_size, file_size)
            table = table[: len(table) // _SYM.size * _SYM.size]
            for key, name in wanted.items():
                found = _first_definition(table, strtab, key)
                if found is not None:
                    _st_name, info, _other, _shndx, value, sym_size = found
                    out[name] = DebugSymbol(name=name, value=value, size=sym_size, type=info & 0xF)
            break
    return out


_MAX_NAME_COPIES = 64  # strings equal to one name in one string table (suffix sharing makes a few)


def _first_definition(table: bytes, strtab: bytes, key: bytes) -> tuple | None:
    """The first defined symbol of ``table`` (a ``.symtab``) named ``key``, as its unpacked entry.

    Without a Python loop over every symbol (glibc's debug file has ~10,000): the string table is
    searched for ``key``'s copies (a name may also be the tail of a longer string), then the
    symbol table for entries whose name offset is one of them.
    """
    offsets: list[int] = []
    i = strtab.find(key + b"\0")
    while i >= 0 and len(offsets) < _MAX_NAME_COPIES:
        offsets.append(i)
        i = strtab.find(key + b"\0", i + 1)
    best = None
    for off in offsets:
        needle = struct.pack("<I", off)
        j = table.find(needle)
        while j >= 0 and (best is None or j < best[0]):
            if j % _SYM.size == 0:
                entry = _SYM.unpack_from(table, j)
                if entry[3] != 0:  # defined (st_shndx != SHN_UNDEF)
                    best = (j, entry)
                    break
            j = table.find(needle, j + 1)
    return best[1] if best else None
