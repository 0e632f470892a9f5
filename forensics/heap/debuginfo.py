"""glibc's own description of its heap: symbols and struct layouts from libc's debug file.

Debian's ``libc6-dbg`` (and every distribution's equivalent) ships libc's full
symbol table and DWARF under ``/usr/lib/debug/.build-id/XX/YYYY.debug``, keyed by
libc's GNU build-id.  :func:`find_libc_debug_file` looks there (the one lookup of
:mod:`forensics.core.debugfiles`) and in the libc file itself when it was not stripped.

* :func:`read_symbols` reads ``main_arena``, ``mp_``, ``tcache`` (a TLS offset) and
  the like from ``.symtab`` with :mod:`struct` (pyelftools walks every symbol as an
  object, ~50 times slower on libc's ~10,000);
* :func:`read_struct_layouts` reads the members of ``struct malloc_state``,
  ``malloc_par``, ``_heap_info``, ``tcache_perthread_struct`` and
  ``tcache_entry`` from the DWARF of the one compilation unit that defines them
  (``malloc.c``, found through ``.debug_aranges`` from ``_int_free``'s address),
  with pyelftools.

Everything is bounded: section sizes are checked against the file, symbol and
string tables are capped, and only one compilation unit is parsed.
"""
from __future__ import annotations

import json
import os
import struct

from forensics.core.debugfiles import find_debug_file
from forensics.core.symtab import SymtabError, has_symtab
from forensics.digest import sha256

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    _T = TypeVar("_T")

__all__ = ["STRUCTS", "FREE_POINTERS", "find_libc_debug_file", "read_struct_layouts",
           "cached_struct_layouts", "read_free_pointer_locations", "cached_free_pointer_locations", "DebugInfoError"]

#: the structs (DWARF names) the heap reader takes from libc's debug information
STRUCTS = ("malloc_state", "malloc_par", "_heap_info", "tcache_perthread_struct", "tcache_entry", "malloc_chunk")

#: the variables of glibc's free and realloc paths that hold the pointer being freed, by (function, variable):
#: "chunk" (a ``mchunkptr``) or "user" (the pointer malloc returned); 2.31-2.43 (``_int_free_merge_chunk`` from
#: 2.39, ``_int_free_chunk`` and ``tcache_double_free_verify`` from 2.42)
FREE_POINTERS = {
    ("__libc_free", "mem"): "user",
    ("__libc_free", "p"): "chunk",
    ("_int_free", "p"): "chunk",
    ("_int_free_chunk", "p"): "chunk",
    ("_int_free_merge_chunk", "p"): "chunk",
    ("munmap_chunk", "p"): "chunk",
    ("tcache_double_free_verify", "e"): "user",
    ("__libc_realloc", "oldmem"): "user",
    ("_int_realloc", "oldp"): "chunk",
}
_MAX_LOCATIONS = 4096  # location-list entries kept of one variable

#: a debug file that cannot be read as what it should be (internal to forensics.heap); the symbol
#: table reader's own error, so that one ``except`` catches both
DebugInfoError = SymtabError


def find_libc_debug_file(build_id: str | None, *, sysroot: str | None = None,
                         library_file: str | None = None) -> str | None:
    """The file holding libc's symbol table for this build, or None.

    libc's separate debug file by build-id (:func:`forensics.core.debugfiles.find_debug_file`:
    the sysroot first, then this machine), else ``library_file`` itself when it was not stripped.

    :param build_id: libc's GNU build-id (hex) as read from the core
    :param sysroot: the crashed machine's files, unpacked here
    :param library_file: the libc file that matched the core's build-id
    """
    found = find_debug_file(build_id, sysroot)
    if found is not None:
        return found
    if library_file and os.path.isfile(library_file) and has_symtab(library_file):
        return library_file
    return None


def _with_malloc_cu(path: str, anchor: int, read: Callable[[Any, Any], _T]) -> _T:
    """``read(dwarf, cu)`` on the DWARF compilation unit of ``path`` covering ``anchor``; any unreadable DWARF
    (pyelftools' errors on a malformed file) is :class:`DebugInfoError`."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf_file = ELFFile(f)
            if not elf_file.has_dwarf_info():
                raise DebugInfoError("no DWARF")
            dwarf = elf_file.get_dwarf_info()
            offset = _cu_offset(elf_file, anchor)
            if offset is None:
                raise DebugInfoError(f"no compilation unit covers 0x{anchor:x}")
            return read(dwarf, dwarf.get_CU_at(offset))
    except (ELFError, ValueError, KeyError, IndexError, AttributeError, TypeError, struct.error) as e:
        raise DebugInfoError(f"unreadable DWARF: {e}") from e


def read_struct_layouts(path: str, anchor: int) -> dict[str, dict]:
    """Member offsets and sizes of :data:`STRUCTS` from the DWARF compilation unit covering ``anchor``.

    :param path: libc's debug file
    :param anchor: a link-time code address inside ``malloc.c`` (``_int_free``'s value)
    :return: ``{struct: {"size": n, "members": {name: {"offset": o, "size": s, "count": c}}}}``;
        ``count`` is an array's element count (1 for a scalar); structs the unit lacks are absent
    :raises DebugInfoError: when the file has no DWARF for that address
    """
    return _with_malloc_cu(path, anchor, lambda _dwarf, cu: _structs_of(cu))


#: a change here (what read_struct_layouts returns) is a change of every cache entry's name
_CACHE_FORMAT = "heap-structs v1"
#: likewise for read_free_pointer_locations
_POINTERS_FORMAT = "heap-free-pointers v1"


def _cached(kind: str, fmt: str, path: str, build_id: str, anchor: int, key: str, compute) -> object:
    """``compute()``'s JSON value, kept in ``<cache>/heap-layouts/`` per debug file and format (see
    :func:`cached_struct_layouts`)."""
    from forensics.cache import cache_path

    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError as e:
        raise DebugInfoError(f"{path}: {e}") from e
    identity = f"{fmt}\0{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{anchor}"
    name = f"{build_id[:40]}-{kind}{sha256(identity.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}.json"
    directory = cache_path("heap-layouts")
    final = os.path.join(directory, name)
    try:
        with open(final, "rb") as f:
            return json.loads(f.read())[key]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    import fcntl

    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f".{name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.isfile(final):
                tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}")
                with open(tmp, "w") as out:
                    out.write(json.dumps({"format": fmt, "debug_file": real, key: value}))
                os.replace(tmp, final)
    except OSError:
        pass
    return value


def cached_struct_layouts(path: str, build_id: str, anchor: int) -> dict[str, dict]:
    """:func:`read_struct_layouts`, kept in the forensics cache per debug file.

    Reading the structs from DWARF costs ~0.5 s (Debian compresses the sections); the result is
    the same for every core of that libc build, so the first analysis writes it to
    ``<cache>/heap-layouts/<build-id>-<hash>.json`` (the hash: the debug file's path, size and
    times, and this format), under a lock, renamed into place; later ones read it.
    An unwritable cache only costs the time.

    :raises DebugInfoError: as :func:`read_struct_layouts`
    """
    value = _cached("", _CACHE_FORMAT, path, build_id, anchor, "structs", lambda: read_struct_layouts(path, anchor))
    assert isinstance(value, dict)
    return value


def cached_free_pointer_locations(path: str, build_id: str, anchor: int) -> list[dict]:
    """:func:`read_free_pointer_locations`, kept in the forensics cache as :func:`cached_struct_layouts` keeps
    the structs (``<build-id>-freeptr<hash>.json``).

    :raises DebugInfoError: as :func:`read_free_pointer_locations`
    """
    value = _cached("freeptr", _POINTERS_FORMAT, path, build_id, anchor, "variables",
                    lambda: read_free_pointer_locations(path, anchor))
    assert isinstance(value, list)
    return value


def read_free_pointer_locations(path: str, anchor: int) -> list[dict]:
    """Where each variable of :data:`FREE_POINTERS` lives, pc range by pc range, from the DWARF of ``malloc.c``:
    its location list (or its single location over its function's range), in link-time addresses.

    :param anchor: a link-time code address inside ``malloc.c`` (``_int_free``'s value)
    :return: ``[{"function", "variable", "points_at" ("chunk" or "user"), "frame_base_cfa" (the function's
        frame base is its CFA), "locations": [[low, high, expression hex], ...]}]``, one per DIE (an inlined copy
        of a function has its own)
    :raises DebugInfoError: when the file has no DWARF for that address
    """
    return _with_malloc_cu(path, anchor, _free_pointers_of)


_FUNCTIONS = {f for f, _v in FREE_POINTERS}
_VARIABLES = {v for _f, v in FREE_POINTERS}


def _name(die) -> str | None:
    """A DIE's name, through its abstract origin (an inlined or out-of-line copy names none itself)."""
    for _ in range(8):
        if die is None:
            return None
        name = _attr(die, "DW_AT_name")
        if name is not None:
            return name.decode("utf-8", "replace")
        nxt = None
        for ref in ("DW_AT_abstract_origin", "DW_AT_specification"):
            if ref in die.attributes:
                nxt = die.get_DIE_from_attribute(ref)
                break
        die = nxt
    return None


def _low_high(die) -> tuple[int, int] | None:
    low = _attr(die, "DW_AT_low_pc")
    attr = die.attributes.get("DW_AT_high_pc")
    if low is None or attr is None:
        return None
    high = attr.value if attr.form == "DW_FORM_addr" else low + attr.value
    return low, high


def _free_pointers_of(dwarf, cu) -> list[dict]:
    from elftools.dwarf.locationlists import BaseAddressEntry, LocationEntry, LocationParser

    parser = LocationParser(dwarf.location_lists())
    base = _attr(cu.get_top_DIE(), "DW_AT_low_pc") or 0
    version = cu["version"]
    out = []
    for die in cu.iter_DIEs():
        if die.tag not in ("DW_TAG_formal_parameter", "DW_TAG_variable") or "DW_AT_location" not in die.attributes:
            continue
        variable = _name(die)
        if variable not in _VARIABLES:
            continue
        scope = die.get_parent()
        while scope is not None and scope.tag not in ("DW_TAG_subprogram", "DW_TAG_inlined_subroutine"):
            scope = scope.get_parent()
        function = _name(scope) if scope is not None else None
        points_at = FREE_POINTERS.get((function or "", variable or ""))
        if points_at is None:
            continue
        attr = die.attributes["DW_AT_location"]
        parsed = parser.parse_from_attribute(attr, version, die=die)
        locations = []
        if isinstance(parsed, list):
            entry_base = base
            for entry in parsed[:_MAX_LOCATIONS]:
                if isinstance(entry, BaseAddressEntry):
                    entry_base = entry.base_address
                elif isinstance(entry, LocationEntry):
                    off = 0 if getattr(entry, "is_absolute", False) else entry_base
                    locations.append([off + entry.begin_offset, off + entry.end_offset, bytes(entry.loc_expr).hex()])
        else:  # one expression for the whole scope
            span = _low_high(scope)
            if span is not None:
                locations.append([span[0], span[1], bytes(parsed.loc_expr).hex()])
        frame_base = None
        outer = scope
        while outer is not None and outer.tag != "DW_TAG_subprogram":
            outer = outer.get_parent()
        if outer is not None and "DW_AT_frame_base" in outer.attributes:
            frame_base = outer.attributes["DW_AT_frame_base"].value
        out.append({"function": function, "variable": variable, "points_at": points_at,
                    "frame_base_cfa": frame_base == [0x9C], "locations": locations})
    return out


def _cu_offset(elf_file, addr: int) -> int | None:
    """The ``.debug_info`` offset of the unit whose ``.debug_aranges`` ranges cover ``addr``."""
    sec = elf_file.get_section_by_name(".debug_aranges")
    if sec is None:
        return None
    data = sec.data()
    pos = 0
    while pos + 12 <= len(data):
        length = struct.unpack_from("<I", data, pos)[0]
        if length == 0xFFFFFFFF or length < 8:
            return None  # 64-bit DWARF or garbage: not what Debian's libc ships
        end = pos + 4 + length
        _version, cu_off, addr_size, _seg = struct.unpack_from("<HIBB", data, pos + 4)
        if addr_size != 8:
            return None
        p = pos + 12
        p += (-p) % 16  # tuples are aligned to twice the address size
        while p + 16 <= end:
            start, size = struct.unpack_from("<QQ", data, p)
            p += 16
            if start == 0 and size == 0:
                break
            if start <= addr < start + size:
                return cu_off
        pos = end
    return None


def _attr(die, name):
    a = die.attributes.get(name)
    return a.value if a is not None else None


def _type_die(die):
    try:
        return die.get_DIE_from_attribute("DW_AT_type")
    except (KeyError, ValueError):
        return None


def _strip(t):
    for _ in range(16):
        if t is None or t.tag not in ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type"):
            return t
        t = _type_die(t)
    return t


def _size_and_count(t) -> tuple[int | None, int]:
    t = _strip(t)
    if t is None:
        return None, 1
    if t.tag == "DW_TAG_array_type":
        count = 1
        for sub in t.iter_children():
            if sub.tag == "DW_TAG_subrange_type":
                n = _attr(sub, "DW_AT_count")
                if n is None and _attr(sub, "DW_AT_upper_bound") is not None:
                    n = _attr(sub, "DW_AT_upper_bound") + 1
                count *= n or 0
        elem, _ = _size_and_count(_type_die(t))
        return elem, count
    return _attr(t, "DW_AT_byte_size"), 1


def _structs_of(cu) -> dict[str, dict]:
    wanted = {s.encode() for s in STRUCTS}
    out: dict[str, dict] = {}
    for die in cu.iter_DIEs():
        if die.tag != "DW_TAG_structure_type" or _attr(die, "DW_AT_declaration"):
            continue
        name = _attr(die, "DW_AT_name")
        if name not in wanted or name.decode() in out:
            continue
        members = {}
        for m in die.iter_children():
            if m.tag != "DW_TAG_member" or _attr(m, "DW_AT_name") is None:
                continue
            loc = _attr(m, "DW_AT_data_member_location")
            if not isinstance(loc, int):
                continue
            size, count = _size_and_count(_type_die(m))
            members[_attr(m, "DW_AT_name").decode()] = {"offset": loc, "size": size, "count": count}
        out[name.decode()] = {"size": _attr(die, "DW_AT_byte_size"), "members": members}
        if len(out) == len(wanted):
            break
    return out
