"""A core's threads and memory handed to libdwfl by us (``dwfl_attach_state``), not by libdwfl's own core reader.

``dwfl_core_file_attach`` reads each stack word through libelf's ``elf_getdata_rawchunk``, which before
elfutils 0.19x (Debian bookworm's 0.188 included) searches every chunk read before: the unwinding of a
core costs the square of the stack words read -- 1.56 s for 200 threads of Debian unstable's CPython 3.15
(5,629 frames), against 0.12 s with elfutils 0.195.  Here each thread's registers come from its
NT_PRSTATUS note and each word from :class:`forensics.core.memory.CoreMemory` (the core's bounded windows):
the cost is linear in the frames, whatever the elfutils.

The registers are handed over in DWARF's numbering of the core's machine (its
:class:`~forensics.core.arch.ArchSpec`): x86-64's rax..r15 are 0-16, AArch64's x0..x30 are 0-30 and sp
31; libdwfl unwinds with the backend of the machine the core's ELF header names, whatever this
machine is.  On AArch64 a return address may carry a pointer-authentication code (PAC) in its high
bits; libdwfl before 0.191 does not strip it, so a word read from the stack that is a signed address
of code the core maps (or the link register) is handed over stripped (:meth:`CoreFile.code_address`).
"""
from __future__ import annotations

import bisect
import struct
from ctypes import byref

from ..core import elf
from ..core.arch import X86_64
from ..core.memory import CoreMemory, MemoryNotInCore
from ..model import CoreFile
from . import libdw as L

__all__ = ["CoreState", "DWARF_REGISTERS"]

_U64 = struct.Struct("<Q").unpack_from

#: x86-64's DWARF register numbers 0-16, by their names in NT_PRSTATUS
DWARF_REGISTERS = X86_64.dwarf_registers


class CoreState:
    """The callbacks ``dwfl_attach_state`` takes, over one open core.  Keep it alive while libdwfl unwinds."""

    def __init__(self, lib: L.Lib, core: CoreFile, mem: CoreMemory) -> None:
        self.lib = lib
        self.mem = mem
        assert mem.layout is not None
        self.spec = mem.layout.spec
        self.core = core
        self.threads: list[tuple[int, dict[str, int]]] = []
        for note in mem.layout.notes:
            if note.name == b"CORE" and note.type == elf.NT_PRSTATUS:
                try:
                    self.threads.append(elf.parse_prstatus_registers(note.desc, self.spec))
                except ValueError:  # the core reader has said so; the thread is left out here too
                    continue
        self.pid = core.pid
        # tid -> the registers its next unwind starts from instead of NT_PRSTATUS's: those a signal frame saved,
        # to go on below a handler whose trampoline has no CFI (qemu-user's AArch64 sigtramp page)
        self.resume: dict[int, dict[str, int]] = {}
        self._window: tuple[int, bytes | memoryview] = (0, b"")  # the last view of the core read: (address, bytes)
        self.strips = core.code_address_mask != 0xFFFF_FFFF_FFFF_FFFF
        # the executable mappings' (start, end), by start: a stripped word pointing into one is a return address
        code = sorted((m.start, m.end) for m in core.mappings if "x" in m.perms)
        self._code_starts = [s for s, _ in code]
        self._code = code
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
            word = _U64(window, at)[0]
        else:
            try:
                found = self.mem.view(addr)
                if found is not None and addr + 8 <= found[0] + len(found[1]):
                    self._window = found
                    word = _U64(found[1], addr - found[0])[0]
                else:
                    word = int.from_bytes(self.mem.read(addr, 8), "little")
            except (MemoryNotInCore, OverflowError, ValueError):
                return False
        result[0] = self._code_word(word) if self.strips else word
        return True

    def _code_word(self, word: int) -> int:
        """``word`` stripped of a PAC when it is a signed address of mapped code, else as it is."""
        stripped = self.core.code_address(word)
        if stripped == word:
            return word
        i = bisect.bisect_right(self._code_starts, stripped) - 1
        return stripped if i >= 0 and stripped < self._code[i][1] else word

    def _set_initial_registers(self, thread, thread_arg) -> bool:
        try:
            tid, regs = self.threads[(thread_arg or 2) - 2]
            regs = dict(self.resume.get(tid, regs))
            spec = self.spec
            if spec.link_register:
                regs[spec.link_register] = self.core.code_address(regs[spec.link_register])
            names = spec.dwarf_registers
            words = (L.Dwarf_Word * len(names))(*(regs[name] for name in names))
            if not self.lib.dwfl_thread_state_registers(thread, 0, len(names), words):
                return False
            self.lib.dwfl_thread_state_register_pc(thread, regs[spec.pc])
            return True
        except Exception:  # noqa: BLE001
            return False

