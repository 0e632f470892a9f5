"""Native stacks for ``analyze``: which unwinder runs, gdb for the threads libdw could not unwind,
and the frame-for-frame comparison of the two (``--native-method both``).

Pure functions over native stacks as records (:class:`~forensics.model.NativeStack`), what both
:func:`forensics.unwind.unwind_core` and :func:`forensics.gdb.parse_native_stacks` return.
"""
from __future__ import annotations

from dataclasses import replace

from ..model import NativeFrame, NativeStack
from ..modes import NativeMethod, StackMethod, Unwinder, UnwoundBy

__all__ = ["plan_native", "failed_threads", "with_gdb_fallback", "compare_native_docs", "native_label"]


def plan_native(native_method: NativeMethod, method: StackMethod, debuginfod: str | None) -> NativeMethod:
    """The unwinder to run for ``--native-method``: ``LIBDW`` (gdb only for the threads it cannot
    unwind), ``GDB``, ``BOTH`` or ``NONE`` (never ``AUTO``).

    ``AUTO`` is libdw, except with ``--method direct`` (program counters only: the cheapest
    analysis, no unwinding) and with ``--debuginfod`` (gdb fetches the debug info).

    >>> A, D = NativeMethod.AUTO, StackMethod.DIRECT
    >>> [p.value for p in (plan_native(A, StackMethod.AUTO, None), plan_native(A, D, None),
    ...                    plan_native(A, StackMethod.GDB, "http://x"))]
    ['libdw', 'none', 'gdb']
    """
    if native_method is not NativeMethod.AUTO:
        return native_method
    if method is StackMethod.DIRECT:
        return NativeMethod.NONE
    if debuginfod:
        return NativeMethod.GDB
    return NativeMethod.LIBDW


def failed_threads(stacks: tuple[NativeStack, ...]) -> set[int]:
    """The threads (LWPs) whose stack libdw could not unwind: none at all, or cut short by an error in
    an object whose file it had.  Reaching the frame limit, or an object whose file was withheld
    (missing, another build), is not a failure gdb would mend: it has no more to go on.

    >>> f = NativeFrame(index=0, pc=16, symbol="main", offset=4, library=None)
    >>> failed_threads((NativeStack(num=1, tid=1, frames=(f,)), NativeStack(num=2, tid=2, frames=()),
    ...                 NativeStack(num=3, tid=3, frames=(f,), error="unwinding stopped at frame 1: x"),
    ...                 NativeStack(num=4, tid=4, frames=(f,), error="y", stopped_in_withheld=True)))
    {2, 3}
    """
    out = set()
    for t in stacks:
        error = t.error or ""
        if not t.frames or (error and not error.startswith("stopped after") and not t.stopped_in_withheld):
            out.add(t.tid)
    return out


def _better(gdb: NativeStack, libdw: NativeStack) -> bool:
    """Whether gdb's stack of a thread is the better one: it goes further than libdw's, and agrees with
    libdw's physical frames as far as libdw got (so its extra frames continue the same stack)."""
    mine = [f.pc for f in libdw.frames if not f.inlined]
    theirs = [f.pc for f in gdb.frames if not f.inlined and not f.tailcall]
    if len(theirs) <= len(mine) and (gdb.error or not libdw.error):
        return False
    return theirs[: len(mine)] == mine


def with_gdb_fallback(libdw: tuple[NativeStack, ...],
                      gdb: tuple[NativeStack, ...] | None) -> tuple[tuple[NativeStack, ...], list[str]]:
    """libdw's stacks, with each thread libdw could not unwind taken from gdb when gdb did better.

    :return: the stacks (each thread's ``method`` says who unwound it) and one line per thread taken
        from gdb, saying why
    """
    failed = failed_threads(libdw)
    if not failed or gdb is None:
        return libdw, []
    by_tid = {t.tid: t for t in gdb}
    threads, notes = [], []
    for t in libdw:
        other = by_tid.get(t.tid)
        if t.tid in failed and other is not None and _better(other, t):
            threads.append(replace(other, num=t.num, method=Unwinder.GDB))
            notes.append(f"tid {t.tid}: libdw: {t.error or 'no frames'}; native stack by gdb")
        else:
            threads.append(t)
    return tuple(threads), notes


def native_label(stacks: tuple[NativeStack, ...] | None) -> UnwoundBy:
    """What produced the native stacks, for the snapshot: ``libdw``, ``gdb``, ``libdw+gdb``,
    ``registers``, or ``libdw+registers`` (some threads unwound, the rest at their program counter).

    >>> native_label((NativeStack(num=1, tid=1, frames=(), method=Unwinder.LIBDW),
    ...               NativeStack(num=2, tid=2, frames=(), method=Unwinder.GDB)))
    <UnwoundBy.LIBDW_GDB: 'libdw+gdb'>
    """
    if stacks is None:
        return UnwoundBy.REGISTERS
    methods = {t.method or Unwinder.GDB for t in stacks}
    if not methods:
        return UnwoundBy.GDB
    # REGISTERS: threads left at their program counter beside unwound ones (--method direct unwinds
    # only the threads running a signal handler)
    return UnwoundBy.of(methods)


def _same_frame(a: NativeFrame, b: NativeFrame, statement_row: tuple[str, int] | None = None) -> bool:
    """One frame as two unwinders describe it: same pc, inlined mark and line, the same source file by its base
    name, and the same function (or, for two ELF symbols at one address such as ``clone3`` and ``__clone3``,
    the same offset).  Where an address has several line-table rows (DWARF 5 location views) libdw names the
    last and gdb the last statement: libdw's stack carries that one too (``statement_rows``)."""
    if a.pc != b.pc or a.inlined != b.inlined:
        return False
    theirs = (_base(b.file), b.line)
    if (_base(a.file), a.line) != theirs:
        row = statement_row  # the address' statement row, which gdb names, where libdw's row is not one
        if not row or (_base(row[0]), row[1]) != theirs:
            return False
    if a.symbol == b.symbol:
        return True
    return a.offset is not None and a.offset == b.offset


def _base(path: str | None) -> str | None:
    return path.rsplit("/", 1)[-1] if path else path


def _describe(f: NativeFrame) -> str:
    where = f" {f.file}:{f.line}" if f.file else ""
    return f"{f.symbol or '??'}{' [inlined]' if f.inlined else ''} at {f.pc:#x}{where}"


def compare_native_docs(libdw: tuple[NativeStack, ...] | None, gdb: tuple[NativeStack, ...] | None) -> list[str]:
    """Where libdw's and gdb's native stacks differ, said in one line (an empty list: they agree).

    Threads are matched by LWP, frames one for one; two frames agree on their pc, inlined mark, function
    (or, for two ELF symbols at one address such as ``clone3`` and ``__clone3``, the same offset) and line
    (libdw's row of the address, or its statement row, which gdb prefers),
    the source file compared by its base name (the unwinders spell a build's paths differently:
    ``./nptl/x.c``, ``/build/glibc/nptl/x.c``).  Not differences: gdb's tail-call frames (reconstructed
    from DWARF call-site records; no return address of theirs is on the stack, and libdw, like eu-stack and
    pystack, shows the stack as it is), and the frames one unwinder shows past the program's entry (gdb
    stops at ``main``; libdw goes on to ``__libc_start_main`` and ``_start``).

    >>> f = NativeFrame(index=0, pc=16, symbol="main", offset=4, library=None, file="a.c", line=3)
    >>> start = NativeFrame(index=1, pc=32, symbol="__libc_start_call_main", offset=8, library=None)
    >>> compare_native_docs((NativeStack(num=1, tid=7, frames=(f, start)),),
    ...                     (NativeStack(num=1, tid=7, frames=(replace(f, file="/src/a.c"),
    ...                                                        replace(f, index=1, tailcall=True))),))
    []
    >>> (line,) = compare_native_docs(
    ...     (NativeStack(num=1, tid=7, frames=(f,)), NativeStack(num=2, tid=8, frames=(f,))),
    ...     (NativeStack(num=1, tid=7, frames=(replace(f, line=4),)), NativeStack(num=2, tid=8, frames=())))
    >>> print(*line.split("; "), sep=chr(10))
    2 of 2 threads differ: thread 7 frame 0: main at 0x10 a.c:3 (libdw) vs main at 0x10 a.c:4 (gdb)
    thread 8: 1 frames (libdw) vs 0 (gdb, tail-call frames left out)
    """
    if libdw is None or gdb is None:
        return ["one method gave no result"]
    ta = {t.tid: t for t in libdw}
    tb = {t.tid: t for t in gdb}
    tids = sorted(set(ta) | set(tb))
    out = []
    for tid in tids:
        if tid not in ta or tid not in tb:
            out.append(f"thread {tid} only in {'libdw' if tid in ta else 'gdb'}")
            continue
        diff = _thread_difference(ta[tid], [f for f in tb[tid].frames if not f.tailcall])
        if diff:
            out.append(f"thread {tid}{diff}")
    if not out:
        return []
    shown = "; ".join(out[:_SHOWN]) + (f"; and {len(out) - _SHOWN} more" if len(out) > _SHOWN else "")
    return [f"{len(out)} of {len(tids)} threads differ: {shown}" if len(out) > 1 else shown]


_SHOWN = 3  # threads described in the one line
#: functions at or past a program's (or a thread's) entry: where one unwinder stops and the other goes on
_ENTRY = frozenset({"_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_main_alias_2",
                    "__libc_start_call_main", "start_thread", "clone", "clone3", "__clone", "__clone3",
                    "__clone_internal"})


def _thread_difference(libdw: NativeStack, fb: list[NativeFrame]) -> str | None:
    """Where one thread's two stacks differ (``" frame N: ..."``, ``": N frames ..."``), or None."""
    fa = libdw.frames
    rows = {i: (file, line) for i, file, line in libdw.statement_rows}
    for i, (x, y) in enumerate(zip(fa, fb, strict=False)):  # the common part; a longer stack is said below
        if not _same_frame(x, y, rows.get(i)):
            return f" frame {i}: {_describe(x)} (libdw) vs {_describe(y)} (gdb)"
    if len(fa) == len(fb):
        return None
    shorter, longer = (fa, fb) if len(fa) < len(fb) else (fb, fa)
    if shorter and (shorter[-1].symbol == "main"
                    or all(f.symbol in _ENTRY for f in longer[len(shorter):])):
        return None  # one unwinder went on past the entry: nothing of the program's own differs
    return f": {len(fa)} frames (libdw) vs {len(fb)} (gdb, tail-call frames left out)"
