"""AArch64's ``struct rt_sigframe``: its layout, and the registers it saved, for every reader of one.

The arm64 kernel (and qemu-user, which lays the frame out the same way) pushes it to run a handler:
the siginfo, then the ucontext whose ``uc_mcontext`` holds x0-x30, sp, pc and pstate, then
``__reserved``'s records, ``fpsimd_context`` first.  The handler returns to a sigreturn trampoline
(``mov x8, #139; svc #0``): the vDSO's ``__kernel_rt_sigreturn``, or under qemu-user a page of its own,
anonymous and without unwind information.  :mod:`forensics.analyze.sigframe_aarch64` reads the frames
to say which signal ran which handler; :mod:`forensics.unwind` resumes a native stack below a handler
from the registers a frame saved.  Pure over bytes, plus bounded reads of the core.
"""
from __future__ import annotations

import struct

from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.model import CoreFile

__all__ = ["SIGRETURN_TRAMPOLINE", "FPSIMD_MAGIC", "FPSIMD_SIZE", "FRAME_SIZE", "UC", "MCONTEXT", "REGS",
           "RESERVED", "saved_registers", "read_saved_registers", "is_anonymous_trampoline"]

#: ``mov x8, #139; svc #0``: rt_sigreturn, the body of the vDSO's ``__kernel_rt_sigreturn`` (and of
#: qemu-user's sigtramp page)
SIGRETURN_TRAMPOLINE = bytes.fromhex("681180d2010000d4")
FPSIMD_MAGIC, FPSIMD_SIZE = 0x46508001, 0x210
UC = 128  # struct ucontext, after the siginfo
MCONTEXT = UC + 176  # struct sigcontext, 16-byte aligned after uc_sigmask and 120 unused bytes
REGS = MCONTEXT + 8  # x0-x30, then sp, pc, pstate
RESERVED = MCONTEXT + 288
FRAME_SIZE = RESERVED + 4096  # 4688: sizeof(struct rt_sigframe)
_NEEDLE = struct.pack("<II", FPSIMD_MAGIC, FPSIMD_SIZE)
_NAMES = (*(f"x{i}" for i in range(31)), "sp", "pc", "pstate")


def saved_registers(raw: bytes) -> dict[str, int] | None:
    """The registers the frame whose bytes are ``raw`` saved (x0-x30, sp, pc, pstate, by their names in
    NT_PRSTATUS), or None when ``raw`` does not hold the fpsimd record at its place: not such a frame.

    >>> frame = bytearray(FRAME_SIZE)
    >>> struct.pack_into("<QQ", frame, REGS + 31 * 8, 0x7ffd2000, 0x401000)  # sp, pc
    >>> struct.pack_into("<II", frame, RESERVED, FPSIMD_MAGIC, FPSIMD_SIZE)
    >>> regs = saved_registers(bytes(frame))
    >>> hex(regs["sp"]), hex(regs["pc"])
    ('0x7ffd2000', '0x401000')
    """
    if len(raw) < FRAME_SIZE or raw[RESERVED:RESERVED + 8] != _NEEDLE:
        return None
    return dict(zip(_NAMES, struct.unpack_from("<34Q", raw, REGS), strict=True))


def read_saved_registers(mem: CoreMemory, address: int) -> dict[str, int] | None:
    """:func:`saved_registers` of the frame at ``address`` (16-byte aligned) in the core, None when it is not
    one or not in the core."""
    if address % 16:
        return None
    try:
        return saved_registers(mem.read(address, FRAME_SIZE))
    except (MemoryNotInCore, OverflowError, ValueError):
        return None


def is_anonymous_trampoline(core: CoreFile, mem: CoreMemory, pc: int) -> bool:
    """Whether ``pc`` is a sigreturn trampoline in executable memory no file backs: qemu-user's sigtramp page,
    which has no unwind information and belongs to no object (the vDSO's is a named object with CFI)."""
    m = core.find_mapping(pc)
    if m is None or m.path or "x" not in m.perms or pc % 4 or any(lib.base == m.start for lib in core.libraries):
        return False  # a file's, or the vDSO (an object the core reader found at the mapping's start)
    try:
        return mem.read(pc, len(SIGRETURN_TRAMPOLINE)) == SIGRETURN_TRAMPOLINE
    except (MemoryNotInCore, OverflowError, ValueError):
        return False
