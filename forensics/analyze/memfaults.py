"""Faults a stack or a file mapping made: a stack that overflowed (which thread's, how large, what repeated
on it) and a read or write past the end of a mapped file.

:func:`check_stack_overflow` is the finding of a fault the classifier called
:attr:`~forensics.model.FaultKind.STACK_OVERFLOW` (a fault in the guard below the faulting thread's
stack, its stack pointer beside it); :func:`repeating_frames` finds the run of frames that repeats
on it (a C function calling itself, a Python function recursing through the interpreter), so that
thousands of frames are said in one line.  :func:`check_past_end_of_file` is the finding of a SIGBUS in a
file mapping (:attr:`~forensics.model.FaultKind.PAST_END_OF_FILE`): which file, and how far into it.  Pure
functions over records.
"""
from __future__ import annotations

from ..model import CoreFile, Crash, FaultKind, Finding, Mapping, ProcessSnapshot, Severity, Thread

__all__ = ["MAX_PERIOD", "check_past_end_of_file", "check_stack_overflow", "mapped_file", "repeating_frames"]

#: the longest cycle looked for: a function recursing through up to this many others (a Python function
#: recursing through the interpreter's evaluation loop, its call and vectorcall frames)
MAX_PERIOD = 16
#: where the repetition may start, counted from the innermost frame (the faulting leaf, a probe, memset)
_MAX_LEAD = 16
_MIN_REPEATS = 4


def repeating_frames(names: list[str]) -> tuple[tuple[str, ...], int, int] | None:
    """The run of frames that repeats: ``(cycle, repeats, start)`` -- the cycle's frames innermost first,
    how many times it stands in a row, and the index of its first frame -- or None when nothing repeats
    at least 4 times.  The shortest cycle that covers the most frames wins.

    >>> repeating_frames(["memset", "f", "f", "f", "f", "f", "main"])
    (('f',), 5, 1)
    >>> repeating_frames(["a", "eval", "call", "a", "eval", "call", "a", "eval", "call", "a", "eval", "call"])
    (('a', 'eval', 'call'), 4, 0)
    >>> repeating_frames(["a", "b", "c"]) is None
    True
    """
    best: tuple[int, int, int, int] | None = None  # (frames covered, -period, start, period)
    n = len(names)
    for period in range(1, MAX_PERIOD + 1):
        for start in range(min(_MAX_LEAD, n)):
            run = 0
            while start + run + period < n and names[start + run] == names[start + run + period]:
                run += 1
            covered = run + period
            if covered // period < _MIN_REPEATS:
                continue
            covered -= covered % period
            key = (covered, -period, -start, period)
            if best is None or key > best:
                best = key
            break  # the first start that repeats is this period's
    if best is None:
        return None
    covered, _, neg_start, period = best
    start = -neg_start
    return tuple(names[start:start + period]), covered // period, start


def _native_names(thread: Thread) -> list[str]:
    return [f"{f.symbol or '??'} ({f.library_name or '?'})" for f in thread.native_frames if not f.inlined]


def _python_names(thread: Thread) -> list[str]:
    return [f"{p.function} ({p.file.rsplit('/', 1)[-1]})" for p in thread.py_frames]


def _say(cycle: tuple[str, ...], repeats: int) -> str:
    if len(cycle) == 1:
        return f"{cycle[0]} called itself {repeats:,} times in a row"
    return f"{' -> '.join(cycle)} repeated {repeats:,} times in a row"


def check_stack_overflow(snapshot: ProcessSnapshot, crash: Crash) -> Finding | None:
    """The finding of a stack overflow: the thread, its stack's size, and what repeated on it (native frames,
    and Python frames when the thread ran Python: Python recursion); None for any other fault."""
    if crash.fault_kind is not FaultKind.STACK_OVERFLOW or crash.fault_address is None:
        return None
    thread = next((t for t in snapshot.threads if t.tid == crash.tid), None)
    regs = next((t for t in snapshot.core.threads if t.tid == crash.tid), None)
    above = min((m for m in snapshot.core.mappings if m.start > crash.fault_address and "w" in m.perms),
                key=lambda m: m.start, default=None)
    stack = next((m for m in snapshot.core.mappings if m.contains(crash.fault_address) and "w" in m.perms), above)
    evidence = [f"fault at 0x{crash.fault_address:x}"
                + (f", stack pointer 0x{regs.sp:x} ({regs.sp - crash.fault_address:+#x} from it)" if regs else "")]
    if stack is not None:
        evidence.append(f"the stack: 0x{stack.start:x}-0x{stack.end:x} ({stack.size // 1024:,} KiB)")
    what = []
    if thread is not None:
        for kind, names in (("C", _native_names(thread)), ("Python", _python_names(thread))):
            found = repeating_frames(names)
            if found is not None:
                cycle, repeats, start = found
                what.append(f"{kind} recursion: {_say(cycle, repeats)}")
                evidence.append(f"{kind} frames #{start}-#{start + repeats * len(cycle) - 1} of {len(names):,}: "
                                f"{' -> '.join(cycle)} x {repeats:,}")
        if thread.native_error:
            evidence.append(f"the native stack stops short: {thread.native_error}")
    where = f" of {'the thread ' + str(crash.tid) if thread is None else _thread_name(thread)}"
    size = f" ({stack.size // 1024:,} KiB)" if stack is not None else ""
    summary = (f"the stack{where}{size} overflowed: the fault is in the guard below it, beside its stack pointer"
               + (f"; {'; '.join(what)}" if what else "; no frames repeat (a deep call chain, or large frames)"))
    return Finding(rule="stack-overflow", severity=Severity.ERROR, summary=summary, evidence=tuple(evidence),
                   tid=crash.tid)


def _thread_name(t: Thread) -> str:
    return f'thread "{t.name}" tid {t.tid}' if t.name else f"{'the main thread' if t.is_main else 'thread'} tid {t.tid}"


def mapped_file(core: CoreFile, addr: int) -> tuple[Mapping, int] | None:
    """The file mapping ``addr`` is in and the offset in the file it stands for, or None."""
    m = core.find_mapping(addr)
    if m is None or not m.path:
        return None
    return m, m.offset + addr - m.start


def check_past_end_of_file(snapshot: ProcessSnapshot, crash: Crash) -> Finding | None:
    """The finding of a SIGBUS past the end of a mapped file: the file, the offset the access stood for, and
    why (the file is shorter than its mapping: truncated while mapped, or mapped longer than it was)."""
    if crash.fault_kind is not FaultKind.PAST_END_OF_FILE or crash.fault_address is None:
        return None
    found = mapped_file(snapshot.core, crash.fault_address)
    if found is None:
        return None
    m, offset = found
    return Finding(
        rule="bus-past-end-of-file", severity=Severity.ERROR,
        summary=(f"the access at 0x{crash.fault_address:x} is byte {offset:,} (0x{offset:x}) of {m.path}, which "
                 f"ends before it: the file is shorter than its mapping (truncated or rewritten shorter while "
                 f"mapped -- a numpy.memmap of a file another writer replaced -- or mapped longer than it was)"),
        evidence=(f"mapping 0x{m.start:x}-0x{m.end:x} {m.perms} of {m.path} from file offset 0x{m.offset:x}",
                  "SIGBUS, BUS_ADRERR: no page of the file behind the address"),
        tid=crash.tid)
