"""Which stacks an analysis shows: the native stacks of the unwinder planned (gdb for the threads libdw could not
unwind; ``both`` compared), the Python stacks of the method asked (or, for auto and both, the best whole one),
the two methods compared, and the handler threads unwound when no unwinder was asked for."""
from __future__ import annotations

import dataclasses

from ..errors import UnwinderUnavailable
from ..model import DwarfLayout, NativeStack, PythonMethod, PythonStacks, PythonStatus
from ..modes import NativeMethod, StackMethod, Unwinder
from .build import registers_only
from .native import compare_native_docs, with_gdb_fallback
from .sigframe import attach_signal_frames
from .stacks import (
    build_threads,
    choose_python_stacks,
    compare_python_stacks,
    python_stacks_problem,
    python_status_line,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from .reading import CoreReading

__all__ = ["choose_native", "choose_python", "compare_methods", "unwind_signal_handler_threads"]


def choose_native(plan: NativeMethod, libdw: tuple[NativeStack, ...] | None, gdb: tuple[NativeStack, ...] | None
                   ) -> tuple[tuple[NativeStack, ...] | None, list[str], list[str]]:
    """The native stacks to show, notes on where they came from, and (``both``) the disagreements."""
    if plan is NativeMethod.NONE:
        return None, [], []
    if plan is NativeMethod.GDB:
        return gdb, [], []
    if plan is NativeMethod.BOTH:
        if libdw is None or gdb is None:
            return libdw if libdw is not None else gdb, [], []
        return libdw, [], compare_native_docs(libdw, gdb)
    if libdw is None:
        return gdb, [], []
    doc, notes = with_gdb_fallback(libdw, gdb)
    return doc, notes, []


def choose_python(method: StackMethod, gdb_python, direct, problems: list[str], *,
                  truncated: bool = False) -> tuple[PythonStacks | None, PythonMethod]:
    """The Python stacks shown and the method that read them: the requested method's, or for auto/both the
    best whole one; for auto, the other method's reason is said once when it was tried and did not give them
    -- except on a truncated core, where what is missing is the memory, which the stacks line says: the
    other method's reason (gdb's "no DWARF ...; install python3.X-dbg") would blame debug symbols."""
    if method is StackMethod.GDB:
        python, py_method = gdb_python, PythonMethod.GDB
    elif method is StackMethod.DIRECT:
        python, py_method = direct, PythonMethod.DIRECT
    else:
        python, py_method = choose_python_stacks(direct, gdb_python)
    other, other_name = (gdb_python, "gdb") if py_method is PythonMethod.DIRECT else (direct, "direct")
    if (method is StackMethod.AUTO and not truncated and python is not None and not python.is_whole
            and other is not None and not other.is_whole and other.status is not PythonStatus.NOT_PYTHON
            and other.detail != python.detail):
        problems.append(f"Python stacks by {other_name}: {python_status_line(other, python_process=True)}")
    return python, py_method


def compare_methods(reading: CoreReading, gdb_python, direct, dwarf_layout: DwarfLayout | None,
                     problems: list[str]) -> tuple[str, ...]:
    """``--method both``: where the two methods' stacks and layouts disagree.

    A method that could not run (no symbols, no gdb) is not a disagreement: it is said, and the
    analysis is partial only if the other method could not read the stacks either."""
    unable = [p for p in (python_stacks_problem(gdb_python, "gdb"), python_stacks_problem(direct, "direct")) if p]
    if unable:
        problems.extend(f"--method both: {p}; nothing to compare" for p in unable)
        return ()
    from ..pyread import layout_differences

    disagreements = tuple(compare_python_stacks(gdb_python, direct))
    if dwarf_layout is not None:  # always, when gdb's stacks were read: they are read with it
        disagreements += tuple(f"layout: {d} (DWARF vs direct)"
                               for d in layout_differences(reading.core, dwarf_layout, sysroot=reading.sysroot,
                                                           mem=reading.mem, interpreter=reading.interpreter()))
    return disagreements


def unwind_signal_handler_threads(reading: CoreReading, problems: list[str],
                                   python: PythonStacks | None = None) -> tuple[NativeStack, ...] | None:
    """Native stacks, by libdw, of the threads running a signal handler -- and of the crashed thread -- when
    no unwinder was asked for.

    ``--method direct`` unwinds nothing, but a thread that was running a handler needs its native stack
    to tell the handler's frames from the ones it interrupted: the first fault's Python frames (and so
    the fingerprint) are those; and the crashed thread's faulting function (an abort's culprit) is part of
    the fingerprint, and a crashed thread without Python frames (a native library's own thread) is told
    apart by its native frames alone.  Only such threads are unwound; the others keep
    their program counter.  None when there is none, or libdw cannot run (said in ``problems``).
    """
    core, sysroot = reading.core, reading.sysroot
    pcs = registers_only(core)
    threads = attach_signal_frames(core, build_threads(core, pcs, None), mem=reading.mem,
                                   text=reading.text_trampolines())
    tids = {t.tid for t in threads if t.signal_frames}
    if core.crashed_tid is not None:  # the faulting function, an abort's culprit: the fingerprint's
        tids.add(core.crashed_tid)
    if not tids:
        return None
    from ..unwind import unwind_core

    try:
        stacks = unwind_core(core, sysroot=sysroot)
    except UnwinderUnavailable as e:
        problems.append(f"{e}: the threads running a signal handler are not split into handler and interrupted "
                        "frames")
        return None
    unwound = {t.tid: t for t in stacks}
    return tuple(unwound.get(t.tid, t) if t.tid in tids else dataclasses.replace(t, method=Unwinder.REGISTERS)
                 for t in pcs)
