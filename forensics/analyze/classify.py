"""Judge a crash from the core's facts: its class, and where a faulting address points.

Pure functions over records; no I/O.
"""
from __future__ import annotations

import re
import signal as _signal

from ..model import CoreFile, Crash, CrashKind, FaultKind, Thread

__all__ = ["HEAP_MESSAGES", "classify_crash", "classify_fault_address", "is_heap_message", "normalize_message"]

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
SEGV_ACCERR = 2
SI_KERNEL = 0x80
_HEX = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{8,}\b")


def is_heap_message(message: str | None) -> bool:
    """True when ``message`` is one of glibc malloc's corruption reports.

    >>> is_heap_message("double free or corruption (!prev)")
    True
    >>> is_heap_message("Fatal Python error: Segmentation fault")
    False
    """
    return bool(message) and any(message.startswith(m) for m in HEAP_MESSAGES)


def normalize_message(message: str | None) -> str:
    """The abort message with addresses and pids blanked, for fingerprints."""
    if not message:
        return ""
    return _HEX.sub("<hex>", message.strip())


def classify_fault_address(core: CoreFile, addr: int | None, code: int, pc: int | None) -> FaultKind:
    """Where a SIGSEGV/SIGBUS address points, judged against the core's mappings.

    :param code: si_code of the signal (SEGV_MAPERR=1, SEGV_ACCERR=2, SI_KERNEL=0x80)
    :param pc: the crashing thread's instruction pointer (an execute fault has addr == pc)
    """
    if addr is None or code == SI_KERNEL:
        # A general-protection fault (non-canonical address, ...): the kernel reports no address.
        return FaultKind.UNKNOWN
    if addr < NEAR_NULL_LIMIT:
        return FaultKind.NEAR_NULL
    mapping = core.find_mapping(addr)
    if mapping is None:
        return FaultKind.UNMAPPED
    if pc is not None and addr == pc and "x" not in mapping.perms:
        return FaultKind.NOT_EXECUTABLE
    if code == SEGV_ACCERR and "w" not in mapping.perms:
        return FaultKind.NOT_WRITABLE
    return FaultKind.MAPPED


_KIND_BY_SIGNAL = {
    _signal.SIGSEGV: CrashKind.SEGV,
    _signal.SIGBUS: CrashKind.BUS,
    _signal.SIGFPE: CrashKind.FPE,
    _signal.SIGILL: CrashKind.ILL,
}


def classify_crash(core: CoreFile, crashed: Thread | None) -> Crash:
    """Decide the crash class from the signal, glibc's abort message and the crashing stack."""
    sig = core.signal
    signo = sig.signo if sig else (core.threads[0].signal if core.threads else 0)
    name = sig.name if sig else (_signame(signo) if signo else None)
    tid = core.crashed_tid
    fault_addr = fault_kind = None
    if not signo:
        kind = CrashKind.NO_SIGNAL
    elif signo == _signal.SIGABRT:
        in_printerr = crashed is not None and any(f.symbol in _HEAP_FRAMES for f in crashed.native_frames)
        kind = CrashKind.HEAP_CORRUPTION if is_heap_message(core.abort_message) or in_printerr else CrashKind.ABORT
    elif signo in _KIND_BY_SIGNAL:
        kind = _KIND_BY_SIGNAL[signo]
        if sig is not None:
            fault_addr = sig.addr
            pc = core.threads[0].pc if core.threads else None
            fault_kind = classify_fault_address(core, sig.addr, sig.code, pc)
    else:
        kind = CrashKind.OTHER_SIGNAL
    return Crash(
        kind=kind,
        signal=signo or None,
        signal_name=name,
        abort_message=core.abort_message,
        fault_address=fault_addr,
        fault_kind=fault_kind,
        tid=tid,
    )


def _signame(signo: int) -> str:
    try:
        return _signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"
