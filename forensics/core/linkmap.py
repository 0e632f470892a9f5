"""The mapped objects of a core without NT_FILE, from the dynamic linker's list in the core's memory.

qemu-user's cores (and cores other programs write, or cut short) have no NT_FILE note: nothing
names the files behind the mappings.  The process's dynamic linker keeps that list itself:
the auxiliary vector's ``AT_PHDR`` is the executable's program headers in memory, its
``PT_DYNAMIC`` holds ``DT_DEBUG`` = the address of ``struct r_debug``, whose ``r_map`` starts
the ``struct link_map`` chain (``l_addr`` the load bias, ``l_name`` the path as it was opened,
``l_next``).  :func:`find_link_map` walks it; :func:`link_map_file_mappings` turns each object's
``PT_LOAD`` headers into the :class:`~forensics.core.elf.FileMapping` records NT_FILE would have
given.  Program headers are read from the core's memory where it holds them, else from the
object's file (``file_phdrs``: the caller's lookup under the sysroot) -- qemu-user, as the
kernel by default, leaves read-only code out of the core, ELF headers included.

Everything read is the crashed process's memory and untrusted: each walk is bounded (entries,
names, headers), a list that loops is cut where it comes back, and what could not be read is a
problem said in words, never an exception.
"""
from __future__ import annotations

import struct

from collections.abc import Callable

from forensics.core import elf
from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.records import record

__all__ = ["LinkMapEntry", "LinkMap", "FilePhdrs", "find_link_map", "link_map_file_mappings", "read_file_phdrs",
           "read_file_interp", "MAX_OBJECTS"]

#: path as the core names it -> that object's program headers from its file, or None
FilePhdrs = Callable[[str], "tuple[elf.ProgramHeader, ...] | None"]

AT_PHENT, AT_PHNUM, AT_BASE, AT_SYSINFO_EHDR = 4, 5, 7, 33
PT_INTERP, PT_PHDR = 3, 6
DT_NULL, DT_DEBUG = 0, 21
MAX_OBJECTS = 4096  # entries of the link_map chain followed
MAX_DYNAMIC = 4096  # Elf64_Dyn entries of the executable's PT_DYNAMIC read
MAX_PHNUM = 512  # program headers of one object read
MAX_NAME = 4096
_VDSO = "[vdso]"


@record
class LinkMapEntry:
    """One ``struct link_map`` of the chain."""

    base: int  # l_addr: the load bias
    name: str  # l_name as the process opened it; the executable's is "" (named from AT_EXECFN)
    dynamic: int  # l_ld


@record
class LinkMap:
    """What the walk found, and what stopped it short."""

    entries: tuple[LinkMapEntry, ...]
    problems: tuple[str, ...] = ()


def _phdrs_at(mem: CoreMemory, addr: int, count: int) -> tuple[elf.ProgramHeader, ...]:
    count = min(count, MAX_PHNUM)
    return elf.parse_program_headers(mem.read(addr, count * elf.PHDR64_SIZE), count)


def read_file_phdrs(path: str, machine: int | None = None) -> tuple[elf.ProgramHeader, ...] | None:
    """The program headers of the ELF64 file at ``path`` (at most :data:`MAX_PHNUM`), or None -- also when
    ``machine`` is given and the file is another machine's (this machine's ``/usr/bin/python3.11`` is no
    stand-in for an arm64 core's, whose name it shares)."""
    try:
        with open(path, "rb") as f:
            header = elf.parse_elf_header(f.read(elf.EHDR64_SIZE))
            if header.phentsize != elf.PHDR64_SIZE or not header.phnum:
                return None
            if machine is not None and header.machine != machine:
                return None
            count = min(header.phnum, MAX_PHNUM)
            f.seek(header.phoff)
            return elf.parse_program_headers(f.read(count * elf.PHDR64_SIZE), count)
    except (OSError, ValueError):
        return None


def read_file_interp(path: str, machine: int | None = None) -> str | None:
    """The program interpreter (PT_INTERP) the ELF64 file at ``path`` names: the dynamic linker, whose own
    link_map entry names it by a pointer into the executable's text (not in a core that left code out)."""
    phdrs = read_file_phdrs(path, machine)
    interp = next((p for p in phdrs or () if p.type == PT_INTERP), None)
    if interp is None or not 0 < interp.filesz <= MAX_NAME:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(interp.offset)
            name = f.read(interp.filesz).split(b"\x00", 1)[0]
    except (OSError, ValueError):
        return None
    return name.decode("utf-8", "surrogateescape") or None


def _exe_phdrs(mem: CoreMemory, auxv: dict[int, int], from_file: tuple[elf.ProgramHeader, ...] | None
               ) -> tuple[tuple[elf.ProgramHeader, ...] | None, str | None]:
    """The executable's program headers: at AT_PHDR in the core's memory, else its file's."""
    phdr, phnum = auxv.get(elf.AT_PHDR), auxv.get(AT_PHNUM, 0)
    if not phdr or not phnum:
        return None, "the auxiliary vector names no program headers (AT_PHDR)"
    if auxv.get(AT_PHENT, elf.PHDR64_SIZE) != elf.PHDR64_SIZE:
        return None, f"the executable's program headers are {auxv.get(AT_PHENT)} bytes each, not 56"
    try:
        return _phdrs_at(mem, phdr, phnum), None
    except MemoryNotInCore:
        if from_file is not None:
            return from_file, None
        return None, (f"the executable's program headers (AT_PHDR {phdr:#x}) are neither in the core nor in its "
                      "file (give --sysroot or --exe)")


def _exe_dynamic(mem: CoreMemory, auxv: dict[int, int],
                 from_file: tuple[elf.ProgramHeader, ...] | None) -> tuple[int, str | None]:
    """(the executable's PT_DYNAMIC address in memory, 0 with a problem when it cannot be had)."""
    phdrs, why = _exe_phdrs(mem, auxv, from_file)
    if phdrs is None:
        return 0, why
    phdr = auxv[elf.AT_PHDR]
    self_ = next((p for p in phdrs if p.type == PT_PHDR), None)
    dyn = next((p for p in phdrs if p.type == elf.PT_DYNAMIC), None)
    if dyn is None:
        return 0, "the executable has no PT_DYNAMIC: it is linked statically"
    if self_ is None:
        return 0, "the executable has no PT_PHDR: its load address is unknown"
    return (phdr - self_.vaddr + dyn.vaddr) & 0xFFFF_FFFF_FFFF_FFFF, None


def _r_debug(mem: CoreMemory, dynamic: int) -> tuple[int, str | None]:
    try:
        data = mem.read_prefix(dynamic, MAX_DYNAMIC * 16)
    except MemoryNotInCore:
        data = b""
    for i in range(len(data) // 16):
        tag, val = struct.unpack_from("<qQ", data, i * 16)
        if tag == DT_NULL:
            break
        if tag == DT_DEBUG:
            return (val, None) if val else (0, "DT_DEBUG is 0: the dynamic linker had not started")
    return 0, f"the executable's dynamic section ({dynamic:#x}) holds no DT_DEBUG"


def find_link_map(mem: CoreMemory, auxv: dict[int, int],
                  exe_phdrs: tuple[elf.ProgramHeader, ...] | None = None) -> LinkMap:
    """The dynamic linker's list of loaded objects, as the core's memory holds it.

    :param exe_phdrs: the executable's program headers from its file, for a core without them

    >>> find_link_map(CoreMemory(b"", []), {}).problems
    ('the auxiliary vector names no program headers (AT_PHDR)',)
    """
    dynamic, why = _exe_dynamic(mem, auxv, exe_phdrs)
    if why:
        return LinkMap(entries=(), problems=(why,))
    r_debug, why = _r_debug(mem, dynamic)
    if why:
        return LinkMap(entries=(), problems=(why,))
    try:
        node = mem.read_u64(r_debug + 8)  # r_map, after the int r_version and its padding
    except MemoryNotInCore:
        return LinkMap(entries=(), problems=(f"r_debug ({r_debug:#x}) is not in the core",))
    entries: list[LinkMapEntry] = []
    seen: set[int] = set()
    problems: list[str] = []
    while node:
        if node in seen:
            problems.append(f"the link_map list loops back to {node:#x} after {len(entries)} objects: cut there")
            break
        if len(entries) >= MAX_OBJECTS:
            problems.append(f"the link_map list is longer than {MAX_OBJECTS} objects: cut there")
            break
        seen.add(node)
        try:
            l_addr, l_name, l_ld, l_next = struct.unpack("<4Q", mem.read(node, 32))
        except MemoryNotInCore:
            problems.append(f"link_map entry {len(entries)} ({node:#x}) is not in the core: the list ends there")
            break
        try:
            name = mem.read_cstring(l_name, MAX_NAME) if l_name else b""
        except MemoryNotInCore:
            name = b""
        entries.append(LinkMapEntry(base=l_addr, name=name.decode("utf-8", "surrogateescape"), dynamic=l_ld))
        node = l_next
    return LinkMap(entries=tuple(entries), problems=tuple(problems))


def _object_phdrs(mem: CoreMemory, entry: LinkMapEntry) -> tuple[elf.ProgramHeader, ...] | None:
    """An object's program headers from its ELF header at its load bias (a shared object's first PT_LOAD
    is at address 0 of its own)."""
    try:
        header = elf.parse_elf_header(mem.read(entry.base, elf.EHDR64_SIZE))
        if header.phentsize != elf.PHDR64_SIZE or not header.phnum:
            return None
        return _phdrs_at(mem, entry.base + header.phoff, header.phnum)
    except (MemoryNotInCore, ValueError):
        return None


def _loads(phdrs: tuple[elf.ProgramHeader, ...], bias: int, path: str, page: int) -> list[elf.FileMapping]:
    out = []
    for p in phdrs:
        if p.type != elf.PT_LOAD or not p.filesz:
            continue
        start = (bias + p.vaddr) & ~(page - 1)
        end = (bias + p.vaddr + p.filesz + page - 1) & ~(page - 1)
        if start < end <= 1 << 64:
            out.append(elf.FileMapping(start=start, end=end, offset=p.offset & ~(page - 1), path=path))
    return out


def link_map_file_mappings(mem: CoreMemory, link_map: LinkMap, auxv: dict[int, int], executable: str | None,
                           page: int, file_phdrs: FilePhdrs,
                           interp: str | None = None) -> tuple[tuple[elf.FileMapping, ...], tuple[str, ...]]:
    """The file-backed mappings of each object of ``link_map`` (its PT_LOAD segments at its load bias), in
    address order, and what could not be read.

    The executable is the first entry, named "" (named ``executable``: AT_EXECFN); the vDSO, the entry whose
    base is ``AT_SYSINFO_EHDR``, is named ``[vdso]``; the dynamic linker, the entry at ``AT_BASE``, when its
    name is not in the core, ``interp`` (the executable's PT_INTERP).
    """
    out: list[elf.FileMapping] = []
    problems: list[str] = []
    vdso = auxv.get(AT_SYSINFO_EHDR)
    for i, entry in enumerate(link_map.entries):
        if i == 0 and not entry.name:
            if not executable:
                problems.append("the executable's path is not in the core (AT_EXECFN): its mappings are unnamed")
                continue
            phdr = auxv.get(elf.AT_PHDR, 0)
            phdrs, _why = _exe_phdrs(mem, auxv, file_phdrs(executable))
            self_ = next((p for p in phdrs or () if p.type == PT_PHDR), None)
            if phdrs is None:
                problems.append(f"{executable}: its program headers are neither in the core nor in its file")
                continue
            if self_ is not None:
                out.extend(_loads(phdrs, phdr - self_.vaddr, executable, page))
            continue
        path = _VDSO if vdso and entry.base == vdso else entry.name
        if not path and entry.base and entry.base == auxv.get(AT_BASE):
            path = interp or ""
        if not path:
            continue
        phdrs_or_none = _object_phdrs(mem, entry) or (file_phdrs(path) if path != _VDSO else None)
        if phdrs_or_none is None:
            problems.append(f"{path}: its ELF header is neither in the core (at {entry.base:#x}) nor in its file; "
                            "its mappings are unknown")
            continue
        out.extend(_loads(phdrs_or_none, entry.base, path, page))
    return tuple(sorted(out, key=lambda f: f.start)), tuple(problems)
