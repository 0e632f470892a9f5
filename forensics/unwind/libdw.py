"""ctypes bindings to elfutils' libdw (libdwfl, libdw) and libelf: only what the unwinder calls.

libdw is opened by soname (``libdw.so.1``; Debian ``libdw1``), or the file
``$FORENSICS_LIBDW`` names (a newer elfutils built elsewhere), on first use, never
searched for with ``ctypes.util.find_library`` (which runs ``ldconfig`` and
``gcc``); libelf's functions are looked up through libdw's handle, so they are
those of the libelf that libdw itself links.  The
structures declared here are the public ABI of elfutils' headers
(``elfutils/libdwfl.h``, ``elfutils/libdw.h``, ``gelf.h``); elfutils keeps them
stable across releases (``Dwarf_Die`` carries its own padding for that).
"""
from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_int,
    c_size_t,
    c_ssize_t,
    c_uint,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

from ..errors import UnwinderUnavailable

__all__ = [
    "Lib",
    "load",
    "DwarfDie",
    "DwarfAttribute",
    "GElfSym",
    "DwflCallbacks",
    "DwflThreadCallbacks",
    "FIND_ELF",
    "FIND_DEBUGINFO",
    "FRAME_CALLBACK",
    "THREAD_CALLBACK",
    "DWARF_CB_OK",
    "DWARF_CB_ABORT",
    "ELF_C_READ",
    "ELF_C_READ_MMAP",
    "DW_TAG_entry_point",
    "DW_TAG_lexical_block",
    "DW_TAG_inlined_subroutine",
    "DW_TAG_subprogram",
    "DW_AT_name",
    "DW_AT_call_file",
    "DW_AT_call_line",
]

DWARF_CB_OK, DWARF_CB_ABORT = 0, 1
DWARF_REG_RSP = 7  # x86-64's stack pointer in DWARF's numbering: a caller frame's value is its CFA
EV_CURRENT = 1
ELF_C_READ = 1  # read through pread, as asked: nothing of the file mapped
ELF_C_READ_MMAP = 8
DW_TAG_entry_point, DW_TAG_lexical_block, DW_TAG_inlined_subroutine, DW_TAG_subprogram = 0x03, 0x0B, 0x1D, 0x2E
DW_AT_name, DW_AT_call_file, DW_AT_call_line = 0x03, 0x58, 0x59

Dwarf_Addr = c_uint64
Dwarf_Word = c_uint64


class DwarfDie(Structure):
    """``Dwarf_Die``: an opaque handle of four words (libdw.h)."""

    _fields_ = [("addr", c_void_p), ("cu", c_void_p), ("abbrev", c_void_p), ("padding", ctypes.c_long)]


class DwarfAttribute(Structure):
    _fields_ = [("code", c_uint), ("form", c_uint), ("valp", c_void_p), ("cu", c_void_p)]


class GElfSym(Structure):
    """``GElf_Sym`` = ``Elf64_Sym``."""

    _fields_ = [("st_name", c_uint32), ("st_info", c_uint8), ("st_other", c_uint8), ("st_shndx", c_uint16),
                ("st_value", c_uint64), ("st_size", c_uint64)]


# int (*find_elf) (Dwfl_Module *, void **userdata, const char *modname, Dwarf_Addr base,
#                  char **file_name, Elf **elfp)
FIND_ELF = CFUNCTYPE(c_int, c_void_p, c_void_p, c_char_p, Dwarf_Addr, c_void_p, POINTER(c_void_p))
# int (*find_debuginfo) (Dwfl_Module *, void **, const char *modname, Dwarf_Addr base, const char *file_name,
#                        const char *debuglink_file, GElf_Word debuglink_crc, char **debuginfo_file_name)
FIND_DEBUGINFO = CFUNCTYPE(c_int, c_void_p, c_void_p, c_char_p, Dwarf_Addr, c_char_p, c_char_p, c_uint32, c_void_p)
FRAME_CALLBACK = CFUNCTYPE(c_int, c_void_p, c_void_p)  # int (*) (Dwfl_Frame *, void *arg)
THREAD_CALLBACK = CFUNCTYPE(c_int, c_void_p, c_void_p)  # int (*) (Dwfl_Thread *, void *arg)


# pid_t (*next_thread) (Dwfl *, void *dwfl_arg, void **thread_argp)
NEXT_THREAD = CFUNCTYPE(c_int, c_void_p, c_void_p, POINTER(c_void_p))
# bool (*memory_read) (Dwfl *, Dwarf_Addr, Dwarf_Word *result, void *dwfl_arg)
MEMORY_READ = CFUNCTYPE(c_bool, c_void_p, Dwarf_Addr, POINTER(Dwarf_Word), c_void_p)
# bool (*set_initial_registers) (Dwfl_Thread *, void *thread_arg)
SET_INITIAL_REGISTERS = CFUNCTYPE(c_bool, c_void_p, c_void_p)


class DwflThreadCallbacks(Structure):
    """``Dwfl_Thread_Callbacks``: the threads and memory of a process, handed to ``dwfl_attach_state``."""

    _fields_ = [("next_thread", NEXT_THREAD), ("get_thread", c_void_p), ("memory_read", MEMORY_READ),
                ("set_initial_registers", SET_INITIAL_REGISTERS), ("detach", c_void_p), ("thread_detach", c_void_p)]


class DwflCallbacks(Structure):
    _fields_ = [("find_elf", FIND_ELF), ("find_debuginfo", FIND_DEBUGINFO), ("section_address", c_void_p),
                ("debuginfo_path", c_void_p)]


TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from typing import Any

    # A foreign function: ctypes checks and converts its arguments by the argtypes below, so it takes Any.
    _CFunction = Callable[..., Any]

# name: (restype, argtypes); the library each lives in is said by the table it is in
_DW = {
    "dwfl_begin": (c_void_p, [POINTER(DwflCallbacks)]),
    "dwfl_end": (None, [c_void_p]),
    "dwfl_errno": (c_int, []),
    "dwfl_errmsg": (c_char_p, [c_int]),
    "dwfl_report_begin": (None, [c_void_p]),
    "dwfl_report_module": (c_void_p, [c_void_p, c_char_p, Dwarf_Addr, Dwarf_Addr]),
    "dwfl_report_end": (c_int, [c_void_p, c_void_p, c_void_p]),
    "dwfl_core_file_attach": (c_int, [c_void_p, c_void_p]),
    "dwfl_attach_state": (c_bool, [c_void_p, c_void_p, c_int, POINTER(DwflThreadCallbacks), c_void_p]),
    "dwfl_thread_state_registers": (c_bool, [c_void_p, c_int, c_uint, POINTER(Dwarf_Word)]),
    "dwfl_thread_state_register_pc": (None, [c_void_p, Dwarf_Word]),
    "dwfl_getthreads": (c_int, [c_void_p, THREAD_CALLBACK, c_void_p]),
    "dwfl_thread_tid": (c_int, [c_void_p]),
    "dwfl_thread_getframes": (c_int, [c_void_p, FRAME_CALLBACK, c_void_p]),
    "dwfl_frame_pc": (c_bool, [c_void_p, POINTER(Dwarf_Addr), POINTER(c_bool)]),
    "dwfl_addrmodule": (c_void_p, [c_void_p, Dwarf_Addr]),
    "dwfl_module_build_id": (c_int, [c_void_p, POINTER(c_void_p), POINTER(Dwarf_Addr)]),
    "dwfl_module_addrinfo": (c_char_p, [c_void_p, Dwarf_Addr, POINTER(c_uint64), POINTER(GElfSym),
                                        POINTER(c_uint32), POINTER(c_void_p), POINTER(Dwarf_Addr)]),
    "dwfl_module_addrdie": (POINTER(DwarfDie), [c_void_p, Dwarf_Addr, POINTER(Dwarf_Addr)]),
    "dwfl_module_getsrc": (c_void_p, [c_void_p, Dwarf_Addr]),
    "dwfl_lineinfo": (c_char_p, [c_void_p, POINTER(Dwarf_Addr), POINTER(c_int), POINTER(c_int),
                                 POINTER(Dwarf_Word), POINTER(Dwarf_Word)]),
    "dwfl_dwarf_line": (c_void_p, [c_void_p, POINTER(Dwarf_Addr)]),
    "dwfl_linecu": (c_void_p, [c_void_p]),
    "dwfl_getsrclines": (c_int, [c_void_p, POINTER(c_size_t)]),
    "dwfl_onesrcline": (c_void_p, [c_void_p, c_size_t]),
    "dwarf_linebeginstatement": (c_int, [c_void_p, POINTER(c_bool)]),
    "dwarf_getscopes": (c_int, [POINTER(DwarfDie), Dwarf_Addr, POINTER(POINTER(DwarfDie))]),
    "dwarf_getscopes_die": (c_int, [POINTER(DwarfDie), POINTER(POINTER(DwarfDie))]),
    "dwarf_tag": (c_int, [POINTER(DwarfDie)]),
    "dwarf_child": (c_int, [POINTER(DwarfDie), POINTER(DwarfDie)]),
    "dwarf_siblingof": (c_int, [POINTER(DwarfDie), POINTER(DwarfDie)]),
    "dwarf_haspc": (c_int, [POINTER(DwarfDie), Dwarf_Addr]),
    "dwarf_ranges": (c_ssize_t, [POINTER(DwarfDie), c_ssize_t, POINTER(Dwarf_Addr), POINTER(Dwarf_Addr),
                                 POINTER(Dwarf_Addr)]),
    "dwarf_attr": (POINTER(DwarfAttribute), [POINTER(DwarfDie), c_uint, POINTER(DwarfAttribute)]),
    "dwarf_attr_integrate": (POINTER(DwarfAttribute), [POINTER(DwarfDie), c_uint, POINTER(DwarfAttribute)]),
    "dwarf_formstring": (c_char_p, [POINTER(DwarfAttribute)]),
    "dwarf_formudata": (c_int, [POINTER(DwarfAttribute), POINTER(Dwarf_Word)]),
    "dwarf_getsrcfiles": (c_int, [POINTER(DwarfDie), POINTER(c_void_p), POINTER(c_size_t)]),
    "dwarf_filesrc": (c_char_p, [c_void_p, c_size_t, POINTER(Dwarf_Word), POINTER(Dwarf_Word)]),
    "dwelf_elf_gnu_build_id": (c_ssize_t, [c_void_p, POINTER(c_void_p)]),
}
_ELF = {
    "elf_version": (c_uint, [c_uint]),
    "elf_begin": (c_void_p, [c_int, c_int, c_void_p]),
    "elf_end": (c_int, [c_void_p]),
}
# elfutils 0.188 and later; without it a looping stack is cut only by MAX_FRAMES
_OPTIONAL_DW = {
    "dwfl_frame_reg": (c_int, [c_void_p, c_uint, POINTER(Dwarf_Word)]),
}


class Lib:
    """The loaded functions, as attributes (``lib.dwfl_begin(...)``), plus libc's ``free``."""

    # one per name of _DW and _ELF (set by __init__; a typo in a call is then a type error)
    dwfl_begin: _CFunction
    dwfl_end: _CFunction
    dwfl_errno: _CFunction
    dwfl_errmsg: _CFunction
    dwfl_report_begin: _CFunction
    dwfl_report_module: _CFunction
    dwfl_report_end: _CFunction
    dwfl_core_file_attach: _CFunction
    dwfl_attach_state: _CFunction
    dwfl_thread_state_registers: _CFunction
    dwfl_thread_state_register_pc: _CFunction
    dwfl_getthreads: _CFunction
    dwfl_thread_tid: _CFunction
    dwfl_thread_getframes: _CFunction
    dwfl_frame_pc: _CFunction
    dwfl_addrmodule: _CFunction
    dwfl_module_build_id: _CFunction
    dwfl_module_addrinfo: _CFunction
    dwfl_module_addrdie: _CFunction
    dwfl_module_getsrc: _CFunction
    dwfl_lineinfo: _CFunction
    dwfl_dwarf_line: _CFunction
    dwfl_linecu: _CFunction
    dwfl_getsrclines: _CFunction
    dwfl_onesrcline: _CFunction
    dwarf_linebeginstatement: _CFunction
    dwarf_getscopes: _CFunction
    dwarf_getscopes_die: _CFunction
    dwarf_tag: _CFunction
    dwarf_child: _CFunction
    dwarf_siblingof: _CFunction
    dwarf_haspc: _CFunction
    dwarf_ranges: _CFunction
    dwarf_attr: _CFunction
    dwarf_attr_integrate: _CFunction
    dwarf_formstring: _CFunction
    dwarf_formudata: _CFunction
    dwarf_getsrcfiles: _CFunction
    dwarf_filesrc: _CFunction
    dwelf_elf_gnu_build_id: _CFunction
    elf_version: _CFunction
    elf_begin: _CFunction
    elf_end: _CFunction
    free: _CFunction
    dwfl_frame_reg: _CFunction | None  # None: this libdw is older than 0.188

    def __init__(self, dw: ctypes.CDLL, libc: ctypes.CDLL) -> None:
        for table, so in ((_DW, dw), (_ELF, dw)):  # dlsym through libdw's handle finds its libelf's
            for name, (restype, argtypes) in table.items():
                fn = getattr(so, name)
                fn.restype, fn.argtypes = restype, argtypes
                setattr(self, name, fn)
        for name, (restype, argtypes) in _OPTIONAL_DW.items():
            opt = getattr(dw, name, None)
            if opt is not None:
                opt.restype, opt.argtypes = restype, argtypes
            setattr(self, name, opt)
        self.free = libc.free
        self.free.restype, self.free.argtypes = None, [c_void_p]
        self.offline_section_address = ctypes.cast(dw.dwfl_offline_section_address, c_void_p).value
        self.elf_version(EV_CURRENT)

    def errmsg(self) -> str:
        msg = self.dwfl_errmsg(-1)  # -1: the last error of this thread
        return msg.decode("utf-8", "replace") if msg else "unknown libdwfl error"


@functools.lru_cache(maxsize=1)
def load() -> Lib:
    """The libdw, libelf and libc functions, loaded once.

    :raises UnwinderUnavailable: when libdw cannot be loaded or lacks a function used here
    """
    name = os.environ.get("FORENSICS_LIBDW") or "libdw.so.1"
    try:
        return Lib(ctypes.CDLL(name), ctypes.CDLL(None))
    except (OSError, AttributeError) as e:
        raise UnwinderUnavailable(str(e) if name in str(e) else f"{name}: {e}") from e
