"""AArch64 signal frames: the arm64 kernel's ``rt_sigframe``, read from a core's memory.

To run a handler the arm64 kernel (and qemu-user, which lays the frame out the same way) pushes, on a
16-byte boundary below the interrupted stack pointer (or on the alternate signal stack)::

    +0     struct siginfo     the signal (written for an SA_SIGINFO handler only)
    +128   struct ucontext    uc_flags, uc_link, uc_stack, uc_sigmask, 120 bytes unused, then
    +304     uc_mcontext      fault_address, regs[31] (x0-x30), sp, pc, pstate, then
    +592     __reserved[4096] records {magic, size}: fpsimd_context (FPSIMD_MAGIC 0x46508001, 528
                              bytes, always first), esr_context (ESR_MAGIC 0x45535201: the fault's
                              syndrome, for a fault the CPU raised), sve/za/tpidr2 ... then a 0 record
    +4688  struct frame_record  {fp, lr}: the interrupted x29 and x30; the handler starts with x29
                              pointing here, sp at +0 and x30 at the sigreturn trampoline

The trampoline is the vDSO's ``__kernel_rt_sigreturn`` (``mov x8, #139; svc #0``: rt_sigreturn), which
glibc uses instead of an ``SA_RESTORER`` of its own; under qemu-user it is the same two instructions on a
page qemu maps for the guest (its "sigtramp" page, anonymous, dumped in the guest core).  The return
address is in x30, not on the stack: a leaf handler never stores it.  So a frame is found by its own
shape -- the fpsimd record's magic and size at +592 of a 16-byte aligned address, a plausible
ucontext, an interrupted pc in executable memory, EL0 in pstate -- not by a return address.

Pure over records plus bounded reads of the core; :mod:`forensics.analyze.sigframe` calls it for a
core whose ``e_machine`` is EM_AARCH64.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

from ..core import elf
from ..core.memory import CoreMemory, MemoryNotInCore
from ..core.rtsigframe import FPSIMD_MAGIC, FPSIMD_SIZE, FRAME_SIZE, MCONTEXT as _MCONTEXT, REGS as _REGS
from ..core.rtsigframe import RESERVED as _RESERVED, SIGRETURN_TRAMPOLINE, UC as _UC
from ..model import CoreFile, CoreThread, SignalFrame, SigInfo

__all__ = [
    "EM_AARCH64",
    "ESR_MAGIC",
    "parse_signal_frame",
    "parse_siginfo_slot",
    "signal_from_registers",
    "find_trampolines",
    "scan_signal_frames",
    "describe_esr",
]

EM_AARCH64 = 183
TRAMPOLINE_SYMBOLS = frozenset({"__kernel_rt_sigreturn"})
ESR_MAGIC = 0x45535201
EXTRA_MAGIC = 0x45585401

# the frame's layout: forensics.core.rtsigframe (the unwinder resumes from the registers it saved)
_UC_STACK = _UC + 16  # stack_t: ss_sp, ss_flags (+ padding), ss_size
_RECORD_SIZE = 16  # the frame record {fp, lr} after it
_NEEDLE = struct.pack("<II", FPSIMD_MAGIC, FPSIMD_SIZE)
_SS_ONSTACK, _SS_DISABLE = 1, 2
_MAX_UC_FLAGS = 0x100
_SVC0 = bytes.fromhex("010000d4")
#: AArch64 syscall numbers of the calls that send a signal: kill(pid, sig), tkill(tid, sig), tgkill(tgid, tid, sig)
_KILL, _TKILL, _TGKILL = 129, 130, 131
_SIGILL, _SIGTRAP, _SIGBUS, _SIGFPE, _SIGSEGV = 4, 5, 7, 8, 11
_SI_CODES = frozenset({0, 0x80, -1, -2, -3, -4, -5, -6, -7})  # SI_USER, SI_KERNEL, SI_QUEUE ... SI_DETHREAD
_MAX_PID = 1 << 22  # PID_MAX_LIMIT on 64-bit
#: the signals whose codes 1-16 are a fault's (or SIGCHLD's, SIGPOLL's, SIGSYS's), not a sender's
_FAULT_CODES_FOR = frozenset({_SIGILL, _SIGTRAP, _SIGBUS, _SIGFPE, _SIGSEGV, 17, 29, 31})
_MAX_RECORDS = 32
_TAG_MASK = (1 << 56) - 1  # the fault address register keeps a pointer's top-byte tag; si_addr does not
MAX_TEXT = 64 << 10  # bytes of one executable mapping searched for the trampoline (the vDSO is a few pages)
MAX_TRAMPOLINES = 16


def find_trampolines(core: CoreFile, mem: CoreMemory, names: dict[int, str] | None = None) -> tuple[int, ...]:
    """The sigreturn trampolines: the unwound frames named ``__kernel_rt_sigreturn`` (``names``: pc ->
    symbol), and the trampoline's bytes in the executable mappings the core holds (the vDSO, qemu-user's
    sigtramp page; a library's text is not dumped, and arm64's glibc has no trampoline of its own)."""
    found = {pc for pc, name in (names or {}).items() if name in TRAMPOLINE_SYMBOLS}
    for m in core.mappings:
        if "x" not in m.perms or len(found) >= MAX_TRAMPOLINES:
            continue
        data = mem.read_prefix(m.start, min(m.size, MAX_TEXT))
        i = data.find(SIGRETURN_TRAMPOLINE)
        while i >= 0 and len(found) < MAX_TRAMPOLINES:
            if i % 4 == 0:
                found.add(m.start + i)
            i = data.find(SIGRETURN_TRAMPOLINE, i + 1)
    return tuple(sorted(found))


def parse_signal_frame(core: CoreFile, raw: bytes, address: int, trampoline: int = 0,
                       text: Callable[[int, int], bytes] | None = None) -> SignalFrame | None:
    """The signal frame whose bytes (:data:`FRAME_SIZE`, from its siginfo at ``address``) are ``raw``, or
    None when they do not read as one the kernel pushed.

    :param trampoline: the sigreturn trampoline the handler returns to (0: not known)
    :param text: reads code bytes at an address (to see whether the interrupted instruction follows an
        ``svc``); None: not known

    >>> frame = bytearray(FRAME_SIZE)
    >>> struct.pack_into("<iii4xi", frame, 0, 6, 0, -6, 1)              # SIGABRT, SI_TKILL, from pid 1
    >>> struct.pack_into("<QQ", frame, _REGS + 31 * 8, 0x7ffd2000, 0x401000)  # sp, pc
    >>> struct.pack_into("<II", frame, _RESERVED, FPSIMD_MAGIC, FPSIMD_SIZE)
    >>> from forensics.model import Mapping
    >>> core = CoreFile(path="core", size=0, pid=1, command="", args="", executable=None, build_id=None,
    ...     signal=None, threads=(), libraries=(), nvml=None, abort_message=None, truncated=False,
    ...     expected_size=0, mappings=(Mapping(start=0x400000, end=0x402000, offset=0, perms="r-xp", path="/a"),))
    >>> f = parse_signal_frame(core, bytes(frame), 0x7ffd1000)
    >>> f.signal.name, f.signal_source, hex(f.pc), hex(f.sp), f.esr
    ('SIGABRT', 'siginfo', '0x401000', '0x7ffd2000', None)
    """
    if len(raw) < FRAME_SIZE or address % 16 or raw[_RESERVED:_RESERVED + 8] != _NEEDLE:
        return None
    uc_flags, uc_link = struct.unpack_from("<QQ", raw, _UC)
    ss_sp, ss_flags, ss_size = struct.unpack_from("<QixxxxQ", raw, _UC_STACK)
    fault_address = struct.unpack_from("<Q", raw, _MCONTEXT)[0]
    regs = struct.unpack_from("<34Q", raw, _REGS)  # x0-x30, sp, pc, pstate
    sp, pc, pstate = regs[31], regs[32], regs[33]
    if uc_flags >= _MAX_UC_FLAGS or uc_link != 0 or ss_flags & ~(_SS_ONSTACK | _SS_DISABLE | 0x80000000):
        return None
    if pstate & 0x1F or pstate >> 32:  # M[4:0] = 0: AArch64 at EL0 (EL0t), no bits above 31
        return None
    if not sp or not pc or pc & 3:
        return None
    where = core.find_mapping(pc)
    if where is None or "x" not in where.perms:
        return None
    esr = _esr(raw)
    sent = _self_signal(core, regs, text)
    info, source = _siginfo(raw[:128], fault_address)
    if sent is not None and (info is None or info.signo != sent.signo):
        info, source = sent, "registers"
    elif info is None:
        info, source = signal_from_registers(core, regs, fault_address, esr, text)
    on_alt = bool(ss_size) and not ss_flags & _SS_DISABLE and ss_sp <= address < ss_sp + ss_size
    code = text(pc - 4, 4) if text is not None else b""
    return SignalFrame(address=address, trampoline=trampoline, signal=info, signal_source=source, pc=pc, sp=sp,
                       alternate_stack=on_alt, fault_address=fault_address or None, esr=esr,
                       in_syscall=code == _SVC0 if len(code) == 4 else None)


def _esr(raw: bytes) -> int | None:
    """The esr_context record's syndrome, walking ``__reserved``'s records (bounded), or None."""
    off = _RESERVED
    for _ in range(_MAX_RECORDS):
        if off + 8 > FRAME_SIZE:
            return None
        magic, size = struct.unpack_from("<II", raw, off)
        if magic == 0 or size < 8 or size % 16:
            return None
        if magic == ESR_MAGIC and size >= 16 and off + 16 <= FRAME_SIZE:
            return struct.unpack_from("<Q", raw, off + 8)[0]
        off += size
    return None


def parse_siginfo_slot(raw: bytes, fault_agrees: Callable[[SigInfo], bool]) -> tuple[SigInfo | None, str]:
    """A signal frame's siginfo slot, x86-64's or AArch64's (the same ``siginfo_t``; :mod:`.sigframe` uses
    this one, below it), when it reads as one the kernel wrote: a plausible signal, code and sender, and for a
    fault's code one that ``fault_agrees`` with the frame's own record of the fault (x86-64: the CPU's trap
    number; AArch64: fault_address).  The kernel writes the slot only for an ``SA_SIGINFO`` handler; for any
    other it holds stale stack bytes, which read as a plausible siginfo often enough.

    :param raw: the slot's bytes (128: ``sizeof(siginfo_t)``)
    :param fault_agrees: whether a fault's siginfo (code 1-16 of SIGILL, SIGTRAP, SIGBUS, SIGFPE, SIGSEGV,
        SIGCHLD, SIGPOLL or SIGSYS) is the fault the frame's registers describe
    :return: (the siginfo, ``"siginfo"``), or (None, ``"unknown"``) when the slot is not one

    >>> slot = struct.pack("<iiiiQ", 11, 0, 1, 0, 0x10).ljust(128, b"\\0")  # SIGSEGV, SEGV_MAPERR at 0x10
    >>> parse_siginfo_slot(slot, lambda info: True)[1], parse_siginfo_slot(slot, lambda info: False)[1]
    ('siginfo', 'unknown')
    """
    try:
        info = elf.parse_siginfo(raw)
    except ValueError:
        return None, "unknown"
    if not 1 <= info.signo <= 64 or info.errno:
        return None, "unknown"
    if info.code in _SI_CODES:
        if info.sender_pid is not None and not 0 < info.sender_pid < _MAX_PID:
            return None, "unknown"
        return info, "siginfo"
    if 1 <= info.code <= 16 and info.signo in _FAULT_CODES_FOR and fault_agrees(info):
        return info, "siginfo"
    return None, "unknown"


def _siginfo(raw: bytes, fault_address: int) -> tuple[SigInfo | None, str]:
    """The frame's siginfo slot (:func:`parse_siginfo_slot`).  A fault's si_addr must be the frame's
    fault_address (the kernel writes both from the same fault): stale stack bytes rarely agree."""
    def agrees(info: SigInfo) -> bool:
        return not (info.signo in (_SIGSEGV, _SIGBUS) and info.addr is not None and fault_address
                    and fault_address & _TAG_MASK != info.addr & _TAG_MASK)

    return parse_siginfo_slot(raw, agrees)


def signal_from_registers(core: CoreFile, regs: tuple[int, ...], fault_address: int, esr: int | None,
                          text: Callable[[int, int], bytes] | None) -> tuple[SigInfo, str]:
    """The signal a non-``SA_SIGINFO`` handler got, read from the interrupted registers: a signal the thread
    sent itself (:func:`_self_signal`), else the fault the ESR record describes, else -- no ESR, as qemu-user
    writes none -- a fault at the frame's fault address: SIGSEGV (SIGBUS where the address is a file mapping)."""
    sent = _self_signal(core, regs, text)
    if sent is not None:
        return sent, "registers"
    if esr is not None:
        ec = esr >> 26
        if ec in (0x24, 0x25, 0x20, 0x21):  # data / instruction abort
            return _fault_at(core, fault_address, esr), "registers"
        if ec == 0x00:
            return _info(_SIGILL, 1, addr=regs[32]), "registers"  # unknown instruction: ILL_ILLOPC
        if ec == 0x22 or ec == 0x26:  # pc / sp alignment
            return _info(_SIGBUS, 1, addr=fault_address or regs[32]), "registers"
        if ec in (0x3C, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35):  # brk, breakpoints, watchpoints, step
            return _info(_SIGTRAP, 1, addr=regs[32]), "registers"
    elif fault_address:
        after_svc = text is not None and text(regs[32] - 4, 4) == _SVC0
        if not after_svc:
            return _fault_at(core, fault_address, None), "registers"
    return _info(0, 0), "unknown"


def _fault_at(core: CoreFile, address: int, esr: int | None) -> SigInfo:
    address &= _TAG_MASK
    m = core.find_mapping(address)
    writing = esr is not None and bool(esr & (1 << 6))  # WnR
    if m is not None and m.path and (("w" in m.perms) if writing else ("r" in m.perms)):
        return _info(_SIGBUS, 2, addr=address)  # BUS_ADRERR: a file mapping past its end
    permission = esr is not None and (esr & 0x3C) == 0x0C  # DFSC/IFSC 0b0011xx: a permission fault
    return _info(_SIGSEGV, 2 if permission or (esr is None and m is not None) else 1, addr=address)


def _self_signal(core: CoreFile, regs: tuple[int, ...], text: Callable[[int, int], bytes] | None
                 ) -> SigInfo | None:
    """The signal the thread sent itself, when it was interrupted right after a ``tgkill(tgid, tid, sig)``,
    ``tkill(tid, sig)`` or ``kill(pid, sig)`` system call (x8 the call's number, ``svc #0`` just before the
    pc).  x0 then holds the call's result, not its first argument; x1 and x2 are still the others."""
    x1, x2, x8, pc = regs[1], regs[2], regs[8], regs[32]
    code = text(pc - 4, 4) if text is not None else b""
    if code != _SVC0 and (code or text is None):
        return None
    tids = {t.tid for t in core.threads} | {core.pid}
    if x8 == _TGKILL and x1 in tids and 1 <= x2 <= 64:
        return _info(x2, -6, sender=core.pid)
    if code and x8 in (_TKILL, _KILL) and 1 <= x1 <= 64:
        return _info(x1, -6 if x8 == _TKILL else 0, sender=core.pid)
    return None


def _info(signo: int, code: int, *, addr: int | None = None, sender: int | None = None) -> SigInfo:
    return SigInfo(signo=signo, code=code, errno=0, name=elf.signal_name(signo) if signo else "unknown signal",
                   addr=addr, sender_pid=sender)


def scan_signal_frames(core: CoreFile, mem: CoreMemory, regs: CoreThread, trampolines: tuple[int, ...],
                       limit: int, stack_top: Callable, text: Callable[[int, int], bytes],
                       step: int) -> list[SignalFrame]:
    """Signal frames from the thread's stack pointer up, innermost first: the lowest frame above it, then the
    lowest above the stack pointer it interrupted, and so on; at most ``limit``.  Each search ends at
    ``stack_top(mapping, pos, regs, others)`` and reads ``step`` bytes at a time.

    The trampoline of a frame is not in it (the kernel puts it in x30): the one the process has (of
    several: the lowest; none found: 0)."""
    out: list[SignalFrame] = []
    pos = regs.sp & ~15
    others = sorted(t.sp for t in core.threads if t.tid != regs.tid)
    default = trampolines[0] if trampolines else 0
    while len(out) < limit:
        m = core.find_mapping(pos)
        if m is None:
            break
        best = _lowest_frame(core, mem, pos, stack_top(m, pos, regs, others), default, text, step)
        if best is None:
            break
        out.append(best)
        if best.sp <= best.address and core.find_mapping(best.sp) is m:
            break
        pos = best.sp & ~15
    return out


def _lowest_frame(core: CoreFile, mem: CoreMemory, pos: int, top: int, trampoline: int,
                  text: Callable[[int, int], bytes], step: int) -> SignalFrame | None:
    """The lowest frame whose fpsimd record lies in [``pos`` + 592, ``top``), read ``step`` bytes at a time
    (a step overlaps the next by the needle's length, so no record spans two unseen)."""
    start = pos
    while pos < top:
        data = mem.read_prefix(pos, min(top - pos, step))
        i = data.find(_NEEDLE)
        while i >= 0:
            address = pos + i - _RESERVED
            if address % 16 == 0 and address >= start:
                try:
                    raw = mem.read(address, FRAME_SIZE)
                except MemoryNotInCore:
                    raw = b""
                frame = parse_signal_frame(core, raw, address, trampoline, text)
                if frame is not None:
                    return frame
            i = data.find(_NEEDLE, i + 1)
        if len(data) < min(top - pos, step):
            return None
        pos += max(len(data) - len(_NEEDLE), 16)
    return None


_EC = {0x24: "data abort", 0x25: "data abort (kernel)", 0x20: "instruction abort",
       0x21: "instruction abort (kernel)", 0x00: "unknown instruction", 0x22: "pc alignment",
       0x26: "sp alignment", 0x3C: "brk", 0x15: "svc", 0x07: "SIMD/FP access", 0x2C: "floating-point exception"}


def describe_esr(esr: int) -> str:
    """The exception class (and for an abort: read or write, and the fault status) of an ESR value.

    >>> describe_esr(0x92000046)
    'data abort, write, translation fault (level 2)'
    >>> describe_esr(0x9200004f)
    'data abort, write, permission fault (level 3)'
    """
    ec = esr >> 26
    what = _EC.get(ec, f"exception class 0x{ec:02x}")
    if ec not in (0x20, 0x21, 0x24, 0x25):
        return what
    fsc = esr & 0x3F
    kind = {0x04: "translation fault", 0x08: "access flag fault", 0x0C: "permission fault",
            0x00: "address size fault"}.get(fsc & 0x3C)
    other = "alignment fault" if fsc == 0x21 else f"fault status 0x{fsc:02x}"
    status = f"{kind} (level {fsc & 3})" if kind else other
    if ec in (0x24, 0x25):
        return f"{what}, {'write' if esr & (1 << 6) else 'read'}, {status}"
    return f"{what}, {status}"
