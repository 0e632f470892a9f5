"""The machines whose cores forensics reads, and what differs between them.

A core's ELF ``e_machine`` chooses one :class:`ArchSpec`: the layout of its NT_PRSTATUS
registers (the kernel's ``user_regs_struct`` on x86-64, ``user_pt_regs`` on AArch64), which of
them are the pc, the stack pointer and the thread pointer, their order in DWARF's numbering
(what libdwfl's unwinder takes), and how many bits of a code address are the address (AArch64's
return addresses may carry a pointer-authentication code above them).  Everything else a
reader needs of the architecture asks :func:`spec_for` rather than testing the machine itself.

>>> spec_for(183).arch.value, spec_for(183).dwarf_registers[31]
('aarch64', 'sp')
>>> spec_for(40) is None
True
"""
from __future__ import annotations

from forensics.model import Arch
from forensics.records import record

__all__ = ["ArchSpec", "X86_64", "AARCH64", "SPECS", "spec_for", "spec_of", "strip_code_address"]

EM_X86_64 = 62
EM_AARCH64 = 183


@record
class ArchSpec:
    """What forensics needs to know of one machine."""

    arch: Arch
    machine: int  # ELF e_machine
    #: NT_PRSTATUS's general registers in order (``pr_reg``), each 8 bytes, from offset 112
    registers: tuple[str, ...]
    prstatus_size: int  # the whole ``struct elf_prstatus``
    pc: str
    sp: str
    #: the register that holds the thread pointer in NT_PRSTATUS ("" when it is in a note of its own)
    thread_pointer: str
    #: registers in DWARF's numbering from 0 (what dwfl_thread_state_registers takes); the pc is set apart
    dwarf_registers: tuple[str, ...]
    dwarf_sp: int  # the stack pointer's DWARF number: a caller frame's value of it is its CFA
    #: the registers a callee preserves (the psABI's callee-saved ones): what a caller frame's CFI restores, and
    #: what keeps its value through a callee whose CFI does not say it saved it
    callee_saved: tuple[str, ...] = ()
    #: the return-address register (AArch64's link register), whose value may carry a PAC
    link_register: str = ""
    #: bits of a user-space code address when the core says nothing else (AArch64: 48-bit VA, the PAC above)
    address_bits: int = 64


X86_64 = ArchSpec(
    arch=Arch.X86_64,
    machine=EM_X86_64,
    registers=("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi",
               "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs"),
    prstatus_size=336,
    pc="rip",
    sp="rsp",
    thread_pointer="fs_base",
    dwarf_registers=("rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12",
                     "r13", "r14", "r15"),
    dwarf_sp=7,
    callee_saved=("rbx", "rbp", "r12", "r13", "r14", "r15"),
)

_X = tuple(f"x{i}" for i in range(31))
AARCH64 = ArchSpec(
    arch=Arch.AARCH64,
    machine=EM_AARCH64,
    # user_pt_regs: x0-x30, sp, pc, pstate; then pr_fpvalid and padding
    registers=(*_X, "sp", "pc", "pstate"),
    prstatus_size=392,
    pc="pc",
    sp="sp",
    thread_pointer="",  # TPIDR_EL0 is NT_ARM_TLS's, a note qemu-user does not write
    dwarf_registers=(*_X, "sp"),
    dwarf_sp=31,
    callee_saved=tuple(f"x{i}" for i in range(19, 31)),  # x19-x28, the frame pointer x29 and the link register
    link_register="x30",
    address_bits=48,
)

SPECS = {s.machine: s for s in (X86_64, AARCH64)}


def spec_for(machine: int) -> ArchSpec | None:
    """The spec of an ELF ``e_machine``, or None for a machine forensics does not read."""
    return SPECS.get(machine)


def spec_of(arch: Arch) -> ArchSpec:
    """The spec of an :class:`~forensics.model.Arch`."""
    return next(s for s in SPECS.values() if s.arch is arch)


def strip_code_address(spec: ArchSpec, value: int, insn_mask: int | None) -> int:
    """A code address without its pointer-authentication code: the bits NT_ARM_PAC_MASK's
    instruction mask names, else every bit above the spec's address width (an x86-64 address is
    returned as it is).

    >>> hex(strip_code_address(AARCH64, 0x003a_0055_0000_1234, None))
    '0x5500001234'
    >>> hex(strip_code_address(AARCH64, 0x007f_0000_0000_1234, 0x007f_0000_0000_0000))
    '0x1234'
    """
    if spec.address_bits >= 64:
        return value
    if insn_mask:
        return value & ~insn_mask & 0xFFFF_FFFF_FFFF_FFFF
    return value & ((1 << spec.address_bits) - 1)
