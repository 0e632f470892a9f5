"""``.symtab`` symbols of an ELF file (a separate debug file, an unstripped object), read with :mod:`struct`.

The dynamic symbol table (``.dynsym``, :class:`~forensics.core.image.ElfImage`) holds only
what an object exports; the full symbol table lives in its separate debug file
(:mod:`forensics.core.debugfiles`) or in an unstripped file.  :func:`read_symbols` finds a
few names in it without pyelftools (which walks every symbol as an object, ~50 times
slower on libc's ~10,000).  Bounded: the section header table, the symbol and string tables
are checked against the file's size and capped.  Used by the heap reader (libc's
``main_arena``) and the Python walker (``_PyRuntime`` of an interpreter that does not export it).

:func:`symbol_at` names the function a code address of a core lies in (the ctypes call in progress
that a heap verdict names), from the object's ``.dynsym`` and the ``.symtab`` of its debug file or
its own, with one sorted index per object kept for the process.
"""
from __future__ import annotations

import bisect
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable

from forensics.core import elf
from forensics.records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from forensics.model import CoreFile

__all__ = ["SymtabError", "DebugSymbol", "read_symbols", "has_symtab", "section_headers", "symbol_at",
           "clear_symbol_indexes", "file_identity", "SHT_SYMTAB", "SHT_DYNSYM", "SHT_NOBITS", "STT_OBJECT",
           "STT_FUNC", "STT_TLS"]

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


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    """What a file's cache key holds: device, inode, size, modification and change times (one place for
    :func:`_sections_of`'s open files and :func:`file_identity`'s paths)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _sections_of(f) -> list[tuple[int, int, int, int, int, int]]:
    """:func:`section_headers` of the open file, parsed once per file (by its identity: device, inode, size,
    modification and change times of what is open), so that asking whether it has a ``.symtab`` and then reading
    it parses its headers once."""
    key = _stat_key(os.fstat(f.fileno()))
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


# -- the function an address lies in ------------------------------------------------------------------

SHT_DYNSYM = 11
STT_GNU_IFUNC = 10
_STB_RANK = {1: 0, 2: 1, 0: 2}  # of two names of one address: GLOBAL over WEAK over LOCAL (aliases)
_MAX_FUNCTIONS = 1_000_000  # function symbols indexed from one object's tables
_MAX_INDEXES = 32  # objects whose index is kept
_LOOK_BACK = 8  # symbols below the address looked at for one whose range covers it (a small one inside a big one)


@record
class _FunctionIndex:
    """One object's function symbols, sorted by link-time value (one name per value), and the link-time
    address its first PT_LOAD maps at (page-aligned: the object's lowest mapped address)."""

    values: tuple[int, ...]
    entries: tuple[tuple[int, int, str], ...]  # (value, size, name)
    first_load: int

    def lookup(self, target: int) -> str | None:
        i = bisect.bisect_right(self.values, target) - 1
        for j in range(i, max(i - _LOOK_BACK, -1), -1):
            value, size, name = self.entries[j]
            if value <= target < value + max(size, 1):
                return name
        return None


def _functions(f, rank: int, want: int, out: list[tuple[int, int, int, str]]) -> None:
    """Append the defined functions of the file's first section of type ``want`` (SHT_SYMTAB or SHT_DYNSYM)
    to ``out`` as (value, rank, size, name); a NOBITS table (a debug-only file's ``.dynsym``) has none."""
    file_size = os.fstat(f.fileno()).st_size
    sections = _sections_of(f)
    for _name, typ, offset, size, link, entsize in sections:
        if typ != want or entsize != _SYM.size or link >= len(sections) or sections[link][1] == SHT_NOBITS:
            continue
        table = _read_at(f, offset, size, file_size)
        strtab = _read_at(f, sections[link][2], sections[link][3], file_size)
        count = min(len(table) // _SYM.size, _MAX_FUNCTIONS - len(out))
        for st_name, info, _other, shndx, value, sym_size in _SYM.iter_unpack(table[: count * _SYM.size]):
            if info & 0xF not in (STT_FUNC, STT_GNU_IFUNC) or shndx == 0 or value == 0 or st_name >= len(strtab):
                continue
            end = strtab.find(b"\0", st_name)
            name = strtab[st_name: end if end >= 0 else len(strtab)].decode("utf-8", "replace")
            if name:
                out.append((value, rank * 4 + _STB_RANK.get(info >> 4, 3), sym_size, name))
        return


def _first_load(f) -> int | None:
    from forensics.core.image import ElfImage

    image = ElfImage.from_fd(f.fileno())
    if image is None:
        return None
    loads = [p.vaddr for p in image.phdrs if p.type == elf.PT_LOAD]
    return loads[0] & ~0xFFF if loads else 0


def _build_index(object_file: str | None, debug_file: str | None) -> _FunctionIndex | None:
    """The index of the object's ``.dynsym`` and the ``.symtab`` of its debug file (else its own)."""
    found: list[tuple[int, int, int, str]] = []
    first_load = None
    for path, rank, want in ((object_file, 0, SHT_DYNSYM), (debug_file or object_file, 1, SHT_SYMTAB)):
        if path is None:
            continue
        try:
            with open(path, "rb") as f:
                if first_load is None:
                    first_load = _first_load(f)
                _functions(f, rank, want, found)
        except (OSError, SymtabError):
            continue
    if first_load is None:
        return None
    found.sort()
    entries: list[tuple[int, int, str]] = []
    for value, _rank, size, name in found:
        if entries and entries[-1][0] == value:
            continue  # the better-ranked name of this address is already in
        entries.append((value, size, name))
    return _FunctionIndex(values=tuple(e[0] for e in entries), entries=tuple(entries), first_load=first_load)


_indexes: OrderedDict[tuple, _FunctionIndex | None] = OrderedDict()


def file_identity(path: str | None) -> tuple | None:
    """A key for what is at ``path`` now (path, device, inode, size, modification and change times): a cache
    keyed by it is not fooled by a file replaced or rewritten in place.  ``(path,)`` when it cannot be
    stat'ed; None for None."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, *_stat_key(st))


def clear_symbol_indexes() -> None:
    """Forget every object's function index (tests; a long-running process between batches)."""
    with _cache_lock:
        _indexes.clear()


def symbol_at(core: CoreFile, address: int, *, sysroot: str | None = None) -> tuple[str | None, str | None]:
    """(function, library path) of a code address of the core: the function symbol whose range covers it.

    The names come from the library file the core reader found and build-id checked (its ``.dynsym``; an
    exported name is preferred for an address with several) and the ``.symtab`` of its separate debug
    file (:func:`forensics.core.debugfiles.find_debug_file`, by the build-id read from the core; inside
    ``sysroot`` first), else the file's own ``.symtab`` when it was not stripped.  A debug-only file given
    as the library (``objcopy --only-keep-debug``: its ``.dynsym`` is NOBITS) is read for its ``.symtab``.
    Each object's index is built once and kept (by the object's path, build-id, file identity and the
    sysroot), bounded in symbols and objects.

    :return: ``(None, None)`` outside every file mapping; ``(None, path)`` when no symbol covers it
    """
    from forensics.core.debugfiles import find_debug_file
    from forensics.model import LibraryStatus

    m = core.find_mapping(address)
    if m is None or not m.path:
        return None, None
    lib = next((lib for lib in core.libraries if lib.path == m.path), None)
    if lib is None:
        return None, m.path
    usable = lib.file_path if lib.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED) else None
    build_id = lib.build_id or (lib.file_build_id if usable else None)
    key = (sysroot, lib.path, build_id, file_identity(usable))
    with _cache_lock:
        present = key in _indexes
        index = _indexes.get(key)
        if present:
            _indexes.move_to_end(key)
    if not present:
        debug = find_debug_file(build_id, sysroot, lib.path) if build_id else None
        index = _build_index(usable, debug) if usable is not None or debug is not None else None
        with _cache_lock:
            _indexes[key] = index
            while len(_indexes) > _MAX_INDEXES:
                _indexes.popitem(last=False)
    if index is None:
        return None, lib.path
    return index.lookup(address - lib.base + index.first_load), lib.path
