"""A core's threads and memory handed to libdwfl by us (``dwfl_attach_state``), not by libdwfl's own core reader.

``dwfl_core_file_attach`` reads each stack word through libelf's ``elf_getdata_rawchunk``, which before
elfutils 0.19x (Debian bookworm's 0.188 included) searches every chunk read before: the unwinding of a
core costs the square of the stack words read -- 1.56 s for 200 threads of Debian unstable's CPython 3.15
(5,629 frames), against 0.12 s with elfutils 0.195.  Here each thread's registers come from its
NT_PRSTATUS note and each word from :class:`forensics.core.memory.CoreMemory` (the core's bounded windows):
the cost is linear in the frames, whatever the elfutils.
"""
from __future__ import annotations

import struct
from ctypes import byref

from ..core import elf
from ..core.memory import CoreMemory, MemoryNotInCore
from ..model import CoreFile
from . import libdw as L

__all__ = ["CoreState", "DWARF_REGISTERS"]

_U64 = struct.Struct("<Q").unpack_from

#: x86-64's DWARF register numbers 0-16, by their names in NT_PRSTATUS
DWARF_REGISTERS = ("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
                   "r14", "r15")


class CoreState:
    """The callbacks ``dwfl_attach_state`` takes, over one open core.  Keep it alive while libdwfl unwinds."""

    def __init__(self, lib: L.Lib, core: CoreFile, mem: CoreMemory) -> None:
        self.lib = lib
        self.mem = mem
        assert mem.layout is not None
        self.threads: list[tuple[int, dict[str, int]]] = []
        for note in mem.layout.notes:
            if note.name == b"CORE" and note.type == elf.NT_PRSTATUS:
                try:
                    self.threads.append(elf.parse_prstatus_registers(note.desc))
                except ValueError:  # the core reader has said so; the thread is left out here too
                    continue
        self.pid = core.pid
        self._window: tuple[int, bytes | memoryview] = (0, b"")  # the last view of the core read: (address, bytes)
        # each ctypes callback is kept here as long as libdwfl may call it
        self.callbacks = L.DwflThreadCallbacks(
            next_thread=L.NEXT_THREAD(self._next_thread), get_thread=None,
            memory_read=L.MEMORY_READ(self._memory_read),
            set_initial_registers=L.SET_INITIAL_REGISTERS(self._set_initial_registers),
            detach=None, thread_detach=None)

    def attach(self, dwfl: int, core_elf: int) -> bool:
        """Attach the threads to ``dwfl`` (the core's ELF says the machine)."""
        return bool(self.lib.dwfl_attach_state(dwfl, core_elf, self.pid, byref(self.callbacks), None))

    # libdwfl's callbacks: they never raise (an exception would be lost inside C)

    def _next_thread(self, dwfl, dwfl_arg, thread_argp) -> int:
        i = thread_argp[0] or 0  # the index of the next thread, plus one (NULL: the first)
        i = i - 1 if i else 0
        if i >= len(self.threads):
            return 0
        thread_argp[0] = i + 2
        return self.threads[i][0]

    def _memory_read(self, dwfl, addr, result, dwfl_arg) -> bool:
        # libdwfl reads a few words near the last ones (a stack, its caller's frames): from the window of the
        # core that held the last word, else through the reader (a word across windows, zeros past the file)
        start, window = self._window
        at = addr - start
        if 0 <= at <= len(window) - 8:
            result[0] = _U64(window, at)[0]
            return True
        try:
            found = self.mem.view(addr)
            if found is not None and addr + 8 <= found[0] + len(found[1]):
                self._window = found
                result[0] = _U64(found[1], addr - found[0])[0]
            else:
                result[0] = int.from_bytes(self.mem.read(addr, 8), "little")
        except (MemoryNotInCore, OverflowError, ValueError):
            return False
        return True

    def _set_initial_registers(self, thread, thread_arg) -> bool:
        try:
            regs = self.threads[(thread_arg or 2) - 2][1]
            words = (L.Dwarf_Word * len(DWARF_REGISTERS))(*(regs[name] for name in DWARF_REGISTERS))
            if not self.lib.dwfl_thread_state_registers(thread, 0, len(DWARF_REGISTERS), words):
                return False
            self.lib.dwfl_thread_state_register_pc(thread, regs["rip"])
            return True
        except Exception:  # noqa: BLE001
            return False

