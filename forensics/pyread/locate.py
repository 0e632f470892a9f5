"""Find the CPython runtime in a core, and the interpreter's version, from the binary alone.

``_PyRuntime`` is an exported (dynamic) symbol of libpython, or of the
executable when libpython is linked in statically.  :func:`find_runtime` looks
it up through the ``.dynsym`` hash table of each mapped object: in the file
(from the sysroot, a bundle or the disk, used only when its build-id matches
the core's) or, when the file is missing or another build, in the object's own
ELF headers and dynamic section as the core holds them.  Debug symbols are
never needed, and ``strip --strip-all`` keeps ``.dynsym``.

:func:`detect_version` reads the version from the same object, never from a
file name, best source first:

1. 3.13+: ``_PyRuntime.debug_offsets`` (cookie ``xdebugpy``, ``PY_VERSION_HEX``) in the core;
2. 3.11+: the exported constant ``Py_Version`` (file, else core);
3. the ``sys.version`` text (``"3.10.13 (main, ...) [GCC ...]"``) that ``Py_GetVersion``
   formats at start-up into a static buffer of the object's .bss, in the core (pystack's way);
4. ``PY_VERSION`` (``"3.10.13"``) in the file's read-only data: a weak last resort, since the
   linker may have merged it into the tail of another string.
"""
from __future__ import annotations

import mmap
import os
import re

from forensics.records import record
from forensics.core import elf
from forensics.core.files import resolve_file
from forensics.core.image import ElfImage
from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.model import CoreFile, Library, LibraryStatus

__all__ = ["PythonBinary", "PythonVersion", "find_runtime", "detect_version", "format_hexversion",
           "interpreter_objects", "describe_runtime_file"]

TYPE_SYMBOLS = ("PyCode_Type", "PyUnicode_Type", "PyBytes_Type", "PyLong_Type", "PyDict_Type")

_MAX_SCAN = 16 << 20  # bytes of read-only data scanned for PY_VERSION
_MAX_MEMORY_SCAN = 8 << 20  # bytes of writable data scanned for sys.version
# "3.10.13": starts with a literal, so re scans fast; the character before is checked apart
_VERSION_RE = rb"3\.\d{1,2}\.\d{1,3}(?:(?:a|b|rc)\d{1,2})?\+?"
# the linker may merge "3.10.13" into the tail of a longer string ("/usr/local/.../3.10.13")
_RODATA_VERSION = re.compile(_VERSION_RE + rb"(?=\x00)")
_SYS_VERSION = re.compile(_VERSION_RE + rb"(?= \([^()\x00]{1,200}\) ?\n?\[)")
_WORD = frozenset(b"0123456789.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_VERSION_TEXT = re.compile(r"(\d+)\.(\d+)\.(\d+)")


@record
class PythonVersion:
    major: int
    minor: int
    micro: int
    text: str  # as the gdb method prints it: "3.12.1", "3.13.0rc2"
    source: str  # "debug-offsets", "Py_Version", "rodata", "sys.version"


@record
class PythonBinary:
    """The object that defines ``_PyRuntime``, as found in one core."""

    library: Library
    image: ElfImage
    bias: int  # add to a link-time address for the process address
    file_path: str | None  # the file its symbols were read from; None: from the core's memory
    runtime: int  # address of _PyRuntime in the process
    runtime_size: int | None = None  # st_size of the _PyRuntime symbol
    debug_file: str | None = None  # the separate debug file whose .symtab gave _PyRuntime (not exported)
    symtab: tuple[tuple[str, int], ...] = ()  # link-time values read from that .symtab

    def symbol(self, name: str) -> int | None:
        value = self.image.find_dynamic_symbol(name)
        if value is None:
            value = dict(self.symtab).get(name)
        return None if value is None else value + self.bias


def format_hexversion(hexv: int) -> str:
    """``PY_VERSION_HEX`` as text.

    >>> format_hexversion(0x030D00C2)
    '3.13.0rc2'
    """
    text = f"{hexv >> 24}.{(hexv >> 16) & 0xFF}.{(hexv >> 8) & 0xFF}"
    level, serial = (hexv >> 4) & 0xF, hexv & 0xF
    if level in (0xA, 0xB, 0xC):
        text += {0xA: "a", 0xB: "b", 0xC: "rc"}[level] + str(serial)
    return text


def _from_text(text: str, source: str) -> PythonVersion | None:
    m = _VERSION_TEXT.match(text)
    if not m:
        return None
    major, minor, micro = (int(x) for x in m.groups())
    return PythonVersion(major=major, minor=minor, micro=micro, text=text, source=source)


def interpreter_objects(core: CoreFile) -> list[Library]:
    """The objects that may hold the interpreter, most likely first: the executable, then the libraries
    named like python (libpython3.X.so).  Every reader that looks for the interpreter looks in this order."""
    exe = [lib for lib in core.libraries if lib.path == core.executable]
    return exe + [lib for lib in core.libraries if lib not in exe and "python" in lib.name]


def _search_order(core: CoreFile) -> list[Library]:
    """:func:`interpreter_objects`, then the rest (an order, not a filter)."""
    first = interpreter_objects(core)
    return first + [lib for lib in core.libraries if lib not in first]


def _file_for(lib: Library, sysroot: str | None) -> str | None:
    if lib.file_path is not None and lib.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED):
        return lib.file_path
    if lib.file_path is None and sysroot is not None:
        path, file_id = resolve_file(lib.path, sysroot, lib.build_id)
        if path is not None and (lib.build_id is None or file_id is None or file_id == lib.build_id):
            return path
    return None


def _file_bias(image: ElfImage, base: int, page_size: int) -> int:
    loads = [p for p in image.phdrs if p.type == elf.PT_LOAD]
    first = loads[0].vaddr if loads else 0
    return base - (first & ~(page_size - 1))


def find_runtime(core: CoreFile, mem: CoreMemory, *, sysroot: str | None = None) -> PythonBinary | None:
    """The object defining ``_PyRuntime``, or None (not CPython, or no readable symbol table).

    :param core: the core, as :func:`forensics.core.open_core` read it
    :param mem: its memory
    :param sysroot: where to look for a file the core names (besides ``core.libraries``)
    """
    page = mem.layout.page_size if mem.layout is not None else 4096
    for lib in _search_order(core):
        candidates: list[str | None] = []
        path = _file_for(lib, sysroot)
        if path is not None:
            candidates.append(path)
        candidates.append(None)  # the image in the core's memory
        for path in candidates:
            if path is not None:
                image = ElfImage.from_file(path)
                bias = _file_bias(image, lib.base, page) if image is not None else 0
            else:
                image = ElfImage.from_memory(mem, lib.base, page)
                bias = image.bias if image is not None else 0
            if image is None:
                continue
            found = image.dynamic_symbol("_PyRuntime")
            if found is not None:
                return PythonBinary(library=lib, image=image, bias=bias, file_path=path, runtime=found[0] + bias,
                                    runtime_size=found[1] or None)
            if image.dynamic() is not None:
                break  # the symbol table was readable and has no _PyRuntime: next object
    return _runtime_from_debug_file(core, mem, sysroot, page)


def _runtime_from_debug_file(core: CoreFile, mem: CoreMemory, sysroot: str | None, page: int) -> PythonBinary | None:
    """``_PyRuntime`` from the ``.symtab`` of the separate debug file of the executable or a libpython
    (found by build-id, :mod:`forensics.core.debugfiles`): an interpreter that does not export it."""
    from forensics.core.debugfiles import find_debug_file
    from forensics.core.symtab import SymtabError, read_symbols

    for lib in interpreter_objects(core):
        build_id = lib.build_id or lib.file_build_id
        debug = find_debug_file(build_id, sysroot, lib.path) if build_id else None
        if debug is None:
            continue
        try:
            syms = read_symbols(debug, ("_PyRuntime", "Py_Version", *TYPE_SYMBOLS))
        except (OSError, SymtabError):
            continue
        runtime = syms.get("_PyRuntime")
        if runtime is None:
            continue
        path = _file_for(lib, sysroot)
        image = ElfImage.from_file(path) if path is not None else None
        if image is not None:
            bias = _file_bias(image, lib.base, page)
        else:
            image = ElfImage.from_memory(mem, lib.base, page)
            if image is None:
                continue
            bias = image.bias
        return PythonBinary(library=lib, image=image, bias=bias, file_path=path, runtime=runtime.value + bias,
                            runtime_size=runtime.size or None, debug_file=debug,
                            symtab=tuple((name, sym.value) for name, sym in syms.items()))
    return None


def _read_file_vaddr(binary: PythonBinary, vaddr: int, size: int) -> bytes | None:
    """``size`` bytes at link-time address ``vaddr`` of the binary's file (its PT_LOAD contents)."""
    if binary.file_path is None:
        return None
    for p in binary.image.phdrs:
        if p.type == elf.PT_LOAD and p.vaddr <= vaddr and vaddr + size <= p.vaddr + p.filesz:
            try:
                with open(binary.file_path, "rb") as f:
                    data = os.pread(f.fileno(), size, p.offset + vaddr - p.vaddr)
            except OSError:
                return None
            return data if len(data) == size else None
    return None


def _py_version_symbol(binary: PythonBinary, mem: CoreMemory) -> PythonVersion | None:
    value = binary.image.find_dynamic_symbol("Py_Version")
    if value is None:
        value = dict(binary.symtab).get("Py_Version")
    if value is None:
        return None
    raw = _read_file_vaddr(binary, value, 4)
    if raw is None:
        try:
            raw = mem.read(value + binary.bias, 4)
        except MemoryNotInCore:
            return None
    hexv = int.from_bytes(raw, "little")
    if hexv >> 24 != 3:
        return None
    return _from_text(format_hexversion(hexv), "Py_Version")


def _first_version(pattern: re.Pattern, data, start: int, end: int) -> str | None:
    """The first match of ``pattern`` in ``data[start:end]`` not preceded by a word character or a dot."""
    for m in pattern.finditer(data, start, end):
        if m.start() == 0 or data[m.start() - 1] not in _WORD:
            return m.group(0).decode()
    return None


def _rodata_version(binary: PythonBinary) -> PythonVersion | None:
    if binary.file_path is None:
        return None
    ranges = [(p.offset, p.filesz) for p in binary.image.phdrs
              if p.type == elf.PT_LOAD and not p.flags & (elf.PF_W | elf.PF_X)]
    try:
        with open(binary.file_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            budget = _MAX_SCAN
            for off, size in ranges:
                size = min(size, budget, len(mm) - off)
                if size <= 0:
                    continue
                budget -= size
                found = _first_version(_RODATA_VERSION, mm, off, off + size)
                if found:
                    return _from_text(found, "rodata")
    except (OSError, ValueError):
        return None
    return None


def _memory_version(binary: PythonBinary, mem: CoreMemory) -> PythonVersion | None:
    """The ``Py_GetVersion`` text in the object's writable data (.data and .bss), as the core holds it."""
    budget = _MAX_MEMORY_SCAN
    for p in binary.image.phdrs:
        if p.type != elf.PT_LOAD or not p.flags & elf.PF_W or budget <= 0:
            continue
        size = min(p.memsz, budget)
        budget -= size
        data = mem.read_prefix(binary.bias + p.vaddr, size)
        found = _first_version(_SYS_VERSION, data, 0, len(data))
        if found:
            return _from_text(found, "sys.version")
    return None


def detect_version(binary: PythonBinary, core: CoreFile, mem: CoreMemory,
                   debug_version: int | None = None) -> PythonVersion | None:
    """The interpreter's version, from the binary (see the module docstring), or None.

    :param debug_version: ``PY_VERSION_HEX`` from 3.13's debug offsets, when the core has them
    """
    if debug_version is not None and debug_version >> 24 == 3:
        found = _from_text(format_hexversion(debug_version), "debug-offsets")
        if found is not None:
            return found
    return _py_version_symbol(binary, mem) or _memory_version(binary, mem) or _rodata_version(binary)


_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib", "lib/x86_64-linux-gnu", "lib", "usr/local/lib")


def _file_version(image: ElfImage, path: str) -> PythonVersion | None:
    """The version an object file says it is: ``Py_Version`` (3.11+), else its ``PY_VERSION`` text."""
    value = image.find_dynamic_symbol("Py_Version")
    raw = image.read(value, 4) if value is not None else None
    if raw is not None and int.from_bytes(raw, "little") >> 24 == 3:
        return _from_text(format_hexversion(int.from_bytes(raw, "little")), "Py_Version")
    binary = PythonBinary(library=Library(path=path, base=0, build_id=None, file_path=path, file_build_id=None,
                                          status=LibraryStatus.UNVERIFIED),
                          image=image, bias=0, file_path=path, runtime=0)
    return _rodata_version(binary)


def describe_runtime_file(python: str, sysroot: str) -> tuple[str, str, str] | None:
    """``(version, ABI flags, object path)`` of an interpreter inside ``sysroot``, read from files only.

    The object is the executable when it defines ``_PyRuntime`` (libpython linked in), else
    ``libpythonX.Y[t][d].so.1.0`` named after it in the root's library directories.  ABI
    flags: ``t`` when its ``_Py_DebugOffsets`` say free-threaded, ``d`` when it exports
    ``_Py_NegativeRefcount`` (built with ``Py_DEBUG``).  For ``gen_layouts``; None when
    nothing defines ``_PyRuntime``.
    """
    from forensics.core.files import resolve_in_sysroot

    exe = resolve_in_sysroot(sysroot, python)
    if exe is None:
        return None
    candidates = [exe]
    stem = os.path.basename(python)
    candidates += [os.path.join(sysroot, d, f"lib{stem}.so.1.0") for d in _LIB_DIRS]
    for path in candidates:
        image = ElfImage.from_file(path) if os.path.isfile(path) else None
        found = image.dynamic_symbol("_PyRuntime") if image is not None else None
        if image is None or found is None:
            continue
        version = _file_version(image, path)
        if version is None:
            return None
        head = image.read(found[0], 24) or b""
        free_threaded = head[:8] == b"xdebugpy" and int.from_bytes(head[16:24], "little") == 1
        debug = image.find_dynamic_symbol("_Py_NegativeRefcount") is not None
        return version.text, ("t" if free_threaded else "") + ("d" if debug else ""), os.path.realpath(path)
    return None
