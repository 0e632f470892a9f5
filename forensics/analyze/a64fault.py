"""The address an AArch64 load or store faulted at, from the instruction and the registers.

A core qemu-user writes has no NT_SIGINFO, so a SIGSEGV or SIGBUS there comes without ``si_addr``; the
arm64 kernel's own cores have it (:func:`with_fault_signal` fills it in, for the analysis only).  The
faulting instruction and the thread's registers at the fault (NT_PRSTATUS: a fault is taken before the
instruction writes anything back) give it all the same for the loads and stores of A64:
:func:`access_address` decodes the instruction word and computes the address it accessed -- the base
register (SP for register 31) plus its immediate or its extended, shifted index register; the base
alone for post-indexed forms, exclusives and atomics; the pc for a literal load.  The top byte is
dropped (the address the MMU translates, as the kernel reports ``si_addr``).

Pure but for :func:`with_fault_signal`, which reads the four instruction bytes (from the core, else the
object file) and the registers of the core's notes.

>>> regs = {f"x{i}": 0 for i in range(31)} | {"sp": 0x7ff0, "pc": 0x400000, "x1": 0x10}
>>> hex(access_address(0xB9000020, regs))          # str w0, [x1]
'0x10'
>>> hex(access_address(0xF9400BE0, regs))          # ldr x0, [sp, #16]
'0x8000'
>>> access_address(0xD503201F, regs) is None       # nop: no memory access
True
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..core import elf
from ..core.arch import AARCH64
from ..core.memory import CoreMemory
from ..model import Arch, CoreFile, SigInfo
from .sigframe import TextReader

__all__ = ["access_address", "with_fault_signal", "ADDRESS_MASK"]

#: the bits of a data address the MMU translates (top-byte-ignore: the tag above them is dropped)
ADDRESS_MASK = (1 << 56) - 1
_MASK64 = (1 << 64) - 1
_SIGBUS, _SIGSEGV = 7, 11


def _reg(regs: Mapping[str, int], n: int, *, sp: bool) -> int:
    """Register ``n`` as a base (31 is SP) or an index (31 is XZR)."""
    if n == 31:
        return regs.get("sp", 0) if sp else 0
    return regs.get(f"x{n}", 0)


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value & (1 << (bits - 1)) else value


def _extend(value: int, option: int) -> int:
    """An index register extended as ``option`` says (UXTW, LSL/UXTX, SXTW, SXTX)."""
    if option == 0b010:  # UXTW
        return value & 0xFFFF_FFFF
    if option == 0b110:  # SXTW
        return _signed(value & 0xFFFF_FFFF, 32)
    if option == 0b111:  # SXTX
        return _signed(value & _MASK64, 64)
    return value  # 0b011: LSL / UXTX


def access_address(insn: int, regs: Mapping[str, int]) -> int | None:
    """The address the A64 instruction ``insn`` loads from or stores to with these registers (``x0``-``x30``,
    ``sp``, ``pc``), or None when it is not a load or store this decodes.

    :param insn: the instruction word (little-endian bytes read as an int)
    :param regs: the thread's registers at the fault
    """
    base = _reg(regs, (insn >> 5) & 31, sp=True)
    address = _address(insn, regs, base)
    return None if address is None else address & _MASK64 & ADDRESS_MASK


def _address(insn: int, regs: Mapping[str, int], base: int) -> int | None:
    size = insn >> 30
    vector = bool(insn & (1 << 26))
    if insn & 0x3B000000 == 0x39000000:  # load/store register, unsigned immediate
        scale = (4 if (insn >> 23) & 1 else size) if vector else size
        return base + (((insn >> 10) & 0xFFF) << scale)
    if insn & 0x3B200C00 == 0x38200800:  # load/store register, register offset
        option, shift = (insn >> 13) & 7, (insn >> 12) & 1
        scale = (4 if (insn >> 23) & 1 else size) if vector else size
        return base + (_extend(_reg(regs, (insn >> 16) & 31, sp=False), option) << (scale if shift else 0))
    if insn & 0x3B200000 == 0x38000000:  # unscaled, post-indexed, unprivileged, pre-indexed (9-bit offset)
        kind = (insn >> 10) & 3
        return base if kind == 0b01 else base + _signed((insn >> 12) & 0x1FF, 9)
    if insn & 0x3B200C00 == 0x38200000 or insn & 0x3F000000 == 0x08000000:  # LSE atomics; exclusives, CAS
        return base
    if insn & 0x3A000000 == 0x28000000:  # load/store pair: no-allocate, post-indexed, offset, pre-indexed
        mode = (insn >> 23) & 7
        scale = 2 + (size if vector else (size >> 1))
        return base if mode == 0b001 else base + (_signed((insn >> 15) & 0x7F, 7) << scale)
    if insn & 0x3B000000 == 0x18000000:  # load register (literal)
        return regs.get("pc", 0) + (_signed((insn >> 5) & 0x7FFFF, 19) << 2)
    return None


def with_fault_signal(core: CoreFile, mem: CoreMemory) -> CoreFile:
    """``core`` with the signal it died of, when it is an AArch64 core without NT_SIGINFO (qemu-user writes
    none) whose crashed thread took SIGSEGV or SIGBUS: ``si_addr`` from the faulting instruction
    (:func:`access_address`), the code SEGV_MAPERR where nothing is mapped there, else SEGV_ACCERR
    (BUS_ADRERR for SIGBUS).  Any other core, or an instruction that cannot be read or is no load or
    store, is returned as it is: the crash then has no fault address, as before.

    :param mem: the core's memory (the instruction is read from it, else from the object file the core
        reader checked)
    """
    if core.signal is not None or core.arch is not Arch.AARCH64 or not core.threads:
        return core
    crashed = core.threads[0]
    if crashed.signal not in (_SIGSEGV, _SIGBUS):
        return core
    regs = _registers(mem, crashed.tid)
    word = TextReader(core, mem)(crashed.pc, 4)
    if regs is None or len(word) != 4:
        return core
    address = access_address(int.from_bytes(word, "little"), regs)
    if address is None:
        return core
    code = 2 if crashed.signal == _SIGBUS else (1 if core.find_mapping(address) is None else 2)
    info = SigInfo(signo=crashed.signal, code=code, errno=0, name=elf.signal_name(crashed.signal), addr=address)
    return dataclasses.replace(core, signal=info)


def _registers(mem: CoreMemory, tid: int) -> dict[str, int] | None:
    """The thread's NT_PRSTATUS registers by name (x0-x30, sp, pc, pstate)."""
    layout = mem.layout
    for note in layout.notes if layout is not None else ():
        if note.name == b"CORE" and note.type == elf.NT_PRSTATUS:
            try:
                pid, regs = elf.parse_prstatus_registers(note.desc, AARCH64)
            except ValueError:
                continue
            if pid == tid:
                return regs
    return None
