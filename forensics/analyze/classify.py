"""Judge a crash from the core's facts: its class, and where a faulting address points.

Pure functions over records; no I/O.
"""
from __future__ import annotations

import re
import signal as _signal
from bisect import bisect_right
from dataclasses import replace

from ..model import (
    CoreFile,
    Crash,
    CrashKind,
    FaultKind,
    LaterFault,
    NativeFrame,
    SignalHandler,
    SignalOrigin,
    SignalSender,
    SigInfo,
    Thread,
)

__all__ = ["HEAP_MESSAGES", "CORE_DUMPING_SIGNALS", "FAULT_SIGNALS", "classify_crash", "classify_fault_address",
           "final_signal", "is_heap_message", "is_python_process", "is_reraise", "is_snapshot", "is_stack_overflow",
           "normalize_message", "signal_origin"]

# The texts glibc's malloc passes to malloc_printerr() before it aborts (glibc 2.26-2.40).
HEAP_MESSAGES = (
    "double free or corruption",
    "free(): invalid",
    "free(): double free detected",
    "free(): too many chunks detected in tcache",
    "free(): unaligned chunk detected in tcache",
    "malloc(): ",
    "malloc_consolidate(): ",
    "realloc(): ",
    "corrupted size vs. prev_size",
    "corrupted double-linked list",
    "munmap_chunk(): invalid pointer",
    "tcache_thread_shutdown(): unaligned",
    "_int_malloc(): ",
    "break adjusted to free malloc space",
    "malloc: top chunk is corrupt",
)
_HEAP_FRAMES = ("malloc_printerr", "__malloc_assert")
NEAR_NULL_LIMIT = 0x10000
# si_code of a fault means something only with its signal: SEGV_ACCERR and BUS_ADRERR are both 2
SEGV_MAPERR, SEGV_ACCERR = 1, 2
BUS_ADRALN, BUS_ADRERR, BUS_OBJERR, BUS_MCEERR_AR, BUS_MCEERR_AO = 1, 2, 3, 4, 5
SI_KERNEL = 0x80
#: how far from the faulting thread's stack pointer an access that overflowed its stack lands: a push or call
#: just below it, a stack probe (-fstack-clash-protection) a page below, a large frame's store above it
STACK_SLACK = 0x10000
#: how far below a stack's lowest mapping an unmapped address still is its guard: the kernel keeps
#: stack_guard_gap (256 pages, 1 MiB) free below a growing stack
STACK_GUARD_GAP = 0x100000
_HEX = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{8,}\b")


def is_python_process(core: CoreFile) -> bool:
    """Whether the core is of a CPython process: its executable is ``python*`` or it maps libpython."""
    names = [lib.name for lib in core.libraries]
    exe = (core.executable or "").rsplit("/", 1)[-1]
    return exe.startswith("python") or any(n.startswith("libpython") for n in names)


def is_heap_message(message: str | None) -> bool:
    """True when ``message`` is one of glibc malloc's corruption reports.

    >>> is_heap_message("double free or corruption (!prev)")
    True
    >>> is_heap_message("Fatal Python error: Segmentation fault")
    False
    """
    return message is not None and any(message.startswith(m) for m in HEAP_MESSAGES)


def normalize_message(message: str | None) -> str:
    """The abort message with addresses and pids blanked, for fingerprints."""
    if not message:
        return ""
    return _HEX.sub("<hex>", message.strip())


def classify_fault_address(core: CoreFile, addr: int | None, code: int, pc: int | None,
                           signo: int | None = None, *, sp: int | None = None) -> FaultKind:
    """Where a SIGSEGV/SIGBUS address points, judged against the core's mappings and read with the signal's
    ``si_code`` (whose numbers mean different things for SIGSEGV and SIGBUS: SEGV_ACCERR and BUS_ADRERR are
    both 2).

    :param code: si_code of the signal (SIGSEGV: SEGV_MAPERR 1, SEGV_ACCERR 2; SIGBUS: BUS_ADRALN 1,
        BUS_ADRERR 2, BUS_OBJERR 3, BUS_MCEERR_AR/AO 4/5; SI_KERNEL 0x80)
    :param pc: the crashing thread's instruction pointer (an execute fault has addr == pc)
    :param signo: the signal: SIGILL's and SIGFPE's address is the faulting instruction's
        (:attr:`FaultKind.INSTRUCTION`), and their codes are no SEGV codes (ILL_ILLOPN is 2,
        SEGV_ACCERR's value: no "not-writable" for an illegal instruction); SIGBUS's codes are its own
    :param sp: the faulting thread's stack pointer: an access beside it in the guard below its stack is a
        :attr:`FaultKind.STACK_OVERFLOW` (:func:`is_stack_overflow`)

    A SEGV_ACCERR fault is "not-writable" only in a mapping that can be read (a read there would not
    fault: it was a write); in one that can be neither read nor written (PROT_NONE, a guard page) it is
    "no-access", whichever access it was.
    """
    if signo in (_signal.SIGILL, _signal.SIGFPE) and addr is not None:
        return FaultKind.INSTRUCTION
    if addr is None or code == SI_KERNEL:
        # A general-protection fault (non-canonical address, ...): the kernel reports no address.
        return FaultKind.UNKNOWN
    if signo == _signal.SIGBUS:
        return _bus_kind(core, addr, code)
    if addr < NEAR_NULL_LIMIT:
        return FaultKind.NEAR_NULL
    if sp is not None and is_stack_overflow(core, addr, sp):
        return FaultKind.STACK_OVERFLOW
    mapping = core.find_mapping(addr)
    if mapping is None:
        return FaultKind.UNMAPPED
    if pc is not None and addr == pc and "x" not in mapping.perms:
        return FaultKind.NOT_EXECUTABLE
    if code == SEGV_ACCERR and "r" not in mapping.perms and "w" not in mapping.perms:
        return FaultKind.NO_ACCESS
    if code == SEGV_ACCERR and "w" not in mapping.perms:
        return FaultKind.NOT_WRITABLE
    return FaultKind.MAPPED


def _bus_kind(core: CoreFile, addr: int, code: int) -> FaultKind:
    """A SIGBUS's kind from its own codes: BUS_ADRERR in a file mapping is a page the file does not reach
    (the file was truncated under its mapping, or the mapping was made longer than it)."""
    if code == BUS_ADRALN:
        return FaultKind.MISALIGNED
    if code in (BUS_OBJERR, BUS_MCEERR_AR, BUS_MCEERR_AO):
        return FaultKind.HARDWARE_ERROR
    mapping = core.find_mapping(addr)
    if mapping is None:
        return FaultKind.UNMAPPED
    if code == BUS_ADRERR and mapping.path:
        return FaultKind.PAST_END_OF_FILE
    return FaultKind.MAPPED


def is_stack_overflow(core: CoreFile, addr: int, sp: int) -> bool:
    """Whether a fault at ``addr`` is the faulting thread's stack overflowing: the address is beside its stack
    pointer (within :data:`STACK_SLACK`) and in the guard below a writable mapping -- a mapping with no
    permission right under it (a thread's guard page), the gap under it (a growing stack's guard,
    :data:`STACK_GUARD_GAP`), or its own lowest pages (guard pages made with MADV_GUARD_INSTALL).
    """
    if abs(addr - sp) > STACK_SLACK:
        return False
    maps = sorted(core.mappings, key=lambda m: m.start)  # a hostile core's need not be
    i = bisect_right([m.start for m in maps], addr)  # maps[i] is the first mapping that starts above addr
    inside = maps[i - 1] if i > 0 and maps[i - 1].start <= addr < maps[i - 1].end else None
    if inside is not None and "w" in inside.perms:  # a guard region inside the stack's own mapping
        return addr - inside.start < STACK_SLACK
    above = maps[i] if i < len(maps) else None
    if above is None or "w" not in above.perms:
        return False
    if inside is not None:  # a guard mapping: no permission, and right under the stack
        return "r" not in inside.perms and "w" not in inside.perms and inside.end == above.start
    return above.start - addr <= STACK_GUARD_GAP


_KIND_BY_SIGNAL: dict[int, CrashKind] = {
    _signal.SIGSEGV: CrashKind.SEGV,
    _signal.SIGBUS: CrashKind.BUS,
    _signal.SIGFPE: CrashKind.FPE,
    _signal.SIGILL: CrashKind.ILL,
}
#: the signals whose default action writes a core (the kernel's SIG_KERNEL_COREDUMP_MASK); a core with
#: any other signal (gdb's SIGSTOP) or none was not written by the kernel for a death: a snapshot
CORE_DUMPING_SIGNALS = frozenset({
    _signal.SIGQUIT, _signal.SIGILL, _signal.SIGTRAP, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGFPE,
    _signal.SIGSEGV, _signal.SIGSYS, _signal.SIGXCPU, _signal.SIGXFSZ,
})
#: signals that are a fault of the process itself (a first fault a handler can then crash in)
FAULT_SIGNALS = frozenset({_signal.SIGABRT, *_KIND_BY_SIGNAL})
_ABORT_PATH = frozenset({"abort", "__GI_abort", "__libc_message", "malloc_printerr", "__malloc_assert",
                         "__libc_fatal", "__assert_fail", "__assert_fail_base"})
SI_USER, SI_TKILL = 0, -6


def final_signal(core: CoreFile) -> int:
    """The signal the core was written for (NT_SIGINFO, else the first thread's), 0 when none."""
    if core.signal is not None:
        return core.signal.signo
    return core.threads[0].signal if core.threads else 0


def is_snapshot(core: CoreFile) -> bool:
    """A core of a live process (gdb's ``gcore``/``generate-core-file``): no signal, or one that never
    makes the kernel write a core (SIGSTOP, the stop gdb attaches with).

    >>> from forensics.model import SigInfo
    >>> core = CoreFile(path="c", size=0, pid=1, command="", args="", executable=None, build_id=None,
    ...     signal=SigInfo(signo=19, code=128, errno=0, name="SIGSTOP"), threads=(), mappings=(), libraries=(),
    ...     nvml=None, abort_message=None, truncated=False, expected_size=0)
    >>> is_snapshot(core)
    True
    """
    return final_signal(core) not in CORE_DUMPING_SIGNALS


def _kind_of(core: CoreFile, signo: int, code: int, addr: int | None, pc: int | None,
             frames: tuple[NativeFrame, ...], sp: int | None = None) -> tuple[CrashKind, int | None, FaultKind | None]:
    """(class, fault address, fault kind) of one signal, judged from the core and the stack it hit."""
    if signo == _signal.SIGABRT:
        in_printerr = any(f.symbol in _HEAP_FRAMES for f in frames)
        heap = is_heap_message(core.abort_message) or in_printerr
        return (CrashKind.HEAP_CORRUPTION if heap else CrashKind.ABORT), None, None
    if signo in _KIND_BY_SIGNAL:
        return _KIND_BY_SIGNAL[signo], addr, classify_fault_address(core, addr, code, pc, signo, sp=sp)
    return CrashKind.OTHER_SIGNAL, None, None


SI_QUEUE = -1
#: the codes of a signal a process sent with its pid in the siginfo: kill(2), tkill/tgkill(2), sigqueue(3)
SENT_CODES = frozenset({0, -6, -1})


def signal_origin(info: SigInfo | None, pid: int) -> tuple[SignalOrigin, SignalSender | None]:
    """Who raised a signal: the kernel for the thread's own instruction (si_code > 0), the process itself
    (abort(), raise(), faulthandler's re-raise: its own pid), or another process (kill(2), tgkill(2),
    sigqueue(3) with another pid; si_pid 0 is a process outside the receiver's PID namespace), with the sender.

    >>> signal_origin(SigInfo(signo=11, code=0, errno=0, name="SIGSEGV", sender_pid=77, sender_uid=0), 4242)[0]
    <SignalOrigin.SENT: 'sent'>
    >>> signal_origin(SigInfo(signo=6, code=-6, errno=0, name="SIGABRT", sender_pid=4242, sender_uid=0), 4242)[0]
    <SignalOrigin.SELF: 'self'>
    """
    if info is None:
        return SignalOrigin.UNKNOWN, None
    if info.code > 0:
        return SignalOrigin.FAULT, None
    if info.code in SENT_CODES and info.sender_pid is not None:
        if info.sender_pid == pid:
            return SignalOrigin.SELF, None
        return SignalOrigin.SENT, SignalSender(pid=info.sender_pid, uid=info.sender_uid, code=info.code)
    return SignalOrigin.UNKNOWN, None


def _later(sig: SigInfo | None, signo: int, core: CoreFile, pc: int | None, tid: int | None,
           handler: SignalHandler | None) -> LaterFault:
    addr = sig.addr if sig is not None else None
    kind = classify_fault_address(core, addr, sig.code, pc, signo, sp=_sp(core, tid)) \
        if sig is not None and signo in _KIND_BY_SIGNAL else None
    return LaterFault(signal=signo, signal_name=sig.name if sig is not None else _signame(signo), fault_address=addr,
                      fault_kind=kind, tid=tid, handler=handler)


def _sp(core: CoreFile, tid: int | None) -> int | None:
    regs = next((t for t in core.threads if t.tid == tid), None)
    return regs.sp if regs is not None else None


def _raised_again_from_a_syscall(thread: Thread, final: SigInfo, pid: int) -> bool:
    """Whether the thread's one handler got a signal it was given no siginfo for while the thread was in a
    system call, and raised the fatal signal itself (SI_TKILL, its own pid): a signal from outside, re-raised."""
    if len(thread.signal_frames) != 1:
        return False
    frame = thread.signal_frames[0]
    return (frame.signal.signo == 0 and frame.in_syscall is True and final.code == SI_TKILL
            and final.sender_pid == pid)


def is_reraise(first: SigInfo, final: SigInfo | None, pid: int) -> bool:
    """Whether the fatal signal is the first one raised again by its handler (faulthandler, a reporter
    that restores the default action and calls ``raise``): the same signal, sent by the process itself."""
    return (final is not None and final.signo == first.signo and final.code in (SI_USER, SI_TKILL)
            and final.sender_pid in (None, pid))


def classify_crash(core: CoreFile, threads: tuple[Thread, ...] = (), *, python_process: bool = False) -> Crash:
    """Decide the crash from its first fault: the signal, glibc's abort message and the stacks.

    The kernel's signal (the core's) is the one the process died of.  When the dumping thread was
    running a handler for an earlier fault (a signal frame for SIGABRT/SIGSEGV/... under it), that
    earlier signal is the crash and the fatal one is ``then``, in that handler; a handler that raised
    the same signal again (faulthandler) is no second fault.  When the process died of a memory fault
    while glibc's heap-corruption message was already written (another thread was aborting), the heap
    corruption is the crash and the fault is ``then``, in its own thread.  A core of a live process
    is a :attr:`CrashKind.SNAPSHOT`.
    """
    sig = core.signal
    signo = final_signal(core)
    name = sig.name if sig else (_signame(signo) if signo else None)
    if is_snapshot(core):
        return Crash(kind=CrashKind.SNAPSHOT, signal=signo or None, signal_name=name, abort_message=None,
                     fault_address=None, fault_kind=None, tid=None)
    tid = core.crashed_tid
    crashed = next((t for t in threads if t.tid == tid), None)
    pc = core.threads[0].pc if core.threads else None
    first = next((f for f in reversed(crashed.signal_frames) if f.signal.signo in FAULT_SIGNALS), None) \
        if crashed is not None else None
    if first is not None and crashed is not None:  # a signal frame is found only on the crashed thread
        from .sigframe import name_handler

        handler = name_handler(crashed, first, python_process=python_process)
        below = crashed.native_frames[first.native_index + 1:] if first.native_index is not None else ()
        kind, addr, fkind = _kind_of(core, first.signal.signo, first.signal.code, first.signal.addr, first.pc, below,
                                     first.sp)
        then = None if is_reraise(first.signal, sig, core.pid) else _later(sig, signo, core, pc, tid, handler)
        origin, sender = signal_origin(first.signal, core.pid)
        if origin is SignalOrigin.SENT and then is None:  # another process's signal, handled and raised again
            kind, addr, fkind = CrashKind.SENT_SIGNAL, None, None
        return Crash(kind=kind, signal=first.signal.signo, signal_name=first.signal.name,
                     abort_message=core.abort_message, fault_address=addr, fault_kind=fkind, tid=tid,
                     handler=handler, then=then, origin=origin, sender=sender)
    if signo in _KIND_BY_SIGNAL and is_heap_message(core.abort_message):
        # glibc had written its heap-corruption message, so a thread was aborting when this fault came
        # (the one with a signal frame for SIGABRT -- read from the core alone -- or abort() on its stack)
        aborting, abort_frame = None, None
        for t in threads:
            frame = next((f for f in t.signal_frames if f.signal.signo == _signal.SIGABRT), None)
            if t.tid != tid and frame is not None:
                aborting, abort_frame = t, frame
                break
        if aborting is None:
            aborting = next((t for t in threads if t.tid != tid and any(f.symbol in _ABORT_PATH
                                                                         for f in t.native_frames)), None)
        abort_handler: SignalHandler | None = None
        if abort_frame is not None and aborting is not None:  # set together, above
            from .sigframe import name_handler

            abort_handler = name_handler(aborting, abort_frame, python_process=python_process)
        return Crash(kind=CrashKind.HEAP_CORRUPTION, signal=_signal.SIGABRT, signal_name="SIGABRT",
                     abort_message=core.abort_message, fault_address=None, fault_kind=None,
                     tid=aborting.tid if aborting is not None else None, handler=abort_handler,
                     then=_later(sig, signo, core, pc, tid, None), origin=SignalOrigin.SELF)
    frames = crashed.native_frames if crashed is not None else ()
    if crashed is not None and sig is not None and signo in FAULT_SIGNALS and _raised_again_from_a_syscall(crashed, sig,
                                                                                                        core.pid):
        # a handler that takes no siginfo (faulthandler) got it while its thread was in a system call -- no
        # instruction of its own faulted -- and raised it again: another process sent it (who, the core cannot say)
        from .sigframe import name_handler

        handler = name_handler(crashed, crashed.signal_frames[0], python_process=python_process)
        handler = replace(handler, signal_name=name or handler.signal_name)
        return Crash(kind=CrashKind.SENT_SIGNAL, signal=signo, signal_name=name, abort_message=core.abort_message,
                     fault_address=None, fault_kind=None, tid=tid, handler=handler, origin=SignalOrigin.SENT)
    handling: SignalHandler | None = None
    if crashed is not None and crashed.signal_frames and signo in FAULT_SIGNALS:
        # every signal frame is one of a signal that is no fault (SIGUSR1): the fault came inside that handler
        from .sigframe import name_handler

        handling = name_handler(crashed, crashed.signal_frames[0], python_process=python_process)
    origin, sender = signal_origin(sig, core.pid)
    if not signo:
        kind, addr, fkind = CrashKind.OTHER_SIGNAL, None, None
    elif origin is SignalOrigin.SENT:  # another process's kill(2): no fault of its own, wherever it was
        kind, addr, fkind = CrashKind.SENT_SIGNAL, None, None
    else:
        kind, addr, fkind = _kind_of(core, signo, sig.code if sig else 0, sig.addr if sig else None, pc, frames,
                                     _sp(core, tid))
        if sig is None:
            addr = fkind = None
    return Crash(kind=kind, signal=signo or None, signal_name=name, abort_message=core.abort_message,
                 fault_address=addr, fault_kind=fkind, tid=tid, handling=handling, origin=origin, sender=sender)


def _signame(signo: int) -> str:
    try:
        return _signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"
