"""What an analysis reads past its snapshot: the crashing thread's fast locals, and glibc's heap as the mode asks
(the corruption's anatomy, the library's verdict, the heap's findings)."""
from __future__ import annotations

import dataclasses

from ..model import Analysis, CrashKind, NativeStack, ProcessSnapshot
from ..modes import HeapMode, Unwinder
from .classify import is_python_process
from .findings import heap_findings, with_fingerprint

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from .reading import CoreReading

__all__ = ["with_crashed_locals", "with_cxx_exception", "with_named_pc", "with_heap"]


def with_named_pc(snapshot: ProcessSnapshot, reading: CoreReading) -> ProcessSnapshot:
    """The snapshot with the crashed thread's program counter named (its function, from the object's ``.dynsym``
    and its debug file's ``.symtab``: :func:`forensics.core.symtab.symbol_at`) where no unwinder ran for that thread
    (``--native-method none``; gdb asked for and missing): a memory fault's faulting function is then the one an
    unwinder names, and so is the fingerprint's ``function:``.  The snapshot as it was otherwise."""
    crashed = snapshot.crashed_thread
    if crashed is None or crashed.native_method not in (None, Unwinder.REGISTERS) or len(crashed.native_frames) != 1:
        return snapshot
    frame = crashed.native_frames[0]
    if frame.symbol is not None or not frame.pc:
        return snapshot
    from ..core.symtab import symbol_at

    name, path = symbol_at(snapshot.core, frame.pc, sysroot=reading.sysroot)
    if name is None:
        return snapshot
    named = dataclasses.replace(crashed, native_frames=(dataclasses.replace(frame, symbol=name,
                                                                            library=frame.library or path),))
    return dataclasses.replace(snapshot, threads=tuple(named if t is crashed else t for t in snapshot.threads))


def with_cxx_exception(snapshot: ProcessSnapshot, reading: CoreReading) -> ProcessSnapshot:
    """The snapshot with the crashed thread's C++ exception in flight (:func:`.cxx.read_cxx_exception`), when it
    runs the C++ runtime's throw or terminate machinery, and the caller found on its stack past the runtimes
    where the unwinder stopped inside them (:func:`.cxx.scan_caller_past_runtime`); the snapshot as it was
    otherwise."""
    crashed = snapshot.crashed_thread
    if crashed is None:
        return snapshot
    from .cxx import read_cxx_exception

    from .cxx import scan_caller_past_runtime

    exc = read_cxx_exception(reading.mem, snapshot.core, crashed)
    caller = scan_caller_past_runtime(reading.mem, snapshot.core, crashed, sysroot=reading.sysroot)
    if exc is None and caller is None:
        return snapshot
    threads = tuple(dataclasses.replace(t, cxx_exception=exc, scanned_caller=caller) if t is crashed else t
                    for t in snapshot.threads)
    return dataclasses.replace(snapshot, threads=threads)


def with_crashed_locals(snapshot: ProcessSnapshot, *, sysroot: str | None = None, reading: CoreReading | None = None):
    """The snapshot with the crashing thread's Python frames carrying their fast locals
    (:func:`forensics.pyread.locals.read_thread_locals`), and what was read; the snapshot as it was
    when the thread has no Python frames (the read then is None).

    :param reading: the analysis' open core and its interpreter (None: the core is opened here)
    """
    crashed = snapshot.crashed_thread
    if crashed is None or not crashed.py_frames:
        return snapshot, None
    from ..pyread.locals import read_thread_locals

    read = read_thread_locals(snapshot.core, crashed.py_frames, sysroot=sysroot) if reading is None else \
        read_thread_locals(snapshot.core, crashed.py_frames, sysroot=sysroot, mem=reading.mem,
                           interpreter=reading.interpreter())
    if not any(read.frames):
        return snapshot, read
    frames = tuple(dataclasses.replace(f, locals=locs) for f, locs in zip(crashed.py_frames, read.frames, strict=False))
    threads = tuple(dataclasses.replace(t, py_frames=frames) if t is crashed else t for t in snapshot.threads)
    return dataclasses.replace(snapshot, threads=threads), read


def with_heap(analysis: Analysis, mode: HeapMode, *, sysroot: str | None = None, thread_locals=None,
              reading: CoreReading | None = None, registers: NativeStack | None = None) -> Analysis:
    """``analysis`` with glibc's heap read (:func:`forensics.heap.read_heap`) as ``mode`` asks.

    ``auto`` reads it only for a heap-corruption crash, so any other crash costs nothing here.

    :param thread_locals: the crashing thread's locals (:func:`with_crashed_locals`): its ctypes
        buffers and the native call in progress go to the verdict
    :param reading: the analysis' open core and its interpreter (None: the core is opened where needed)
    :param registers: libdw's stack of the crashed thread, with the registers of each frame
        (:attr:`~forensics.model.NativeStack.frame_registers`): glibc's free() kept its pointer in one
    """
    corruption = analysis.crash.kind is CrashKind.HEAP_CORRUPTION
    if mode is HeapMode.OFF or (mode is HeapMode.AUTO and not corruption):
        return analysis
    from ..heap import read_heap

    core = analysis.snapshot.core
    mem = reading.mem if reading is not None else None
    owners: list = []
    locals_problem = None
    crashed = analysis.snapshot.crashed_thread
    if corruption and crashed is not None and crashed.py_frames and thread_locals is not None:
        from ..pyread.locals import buffer_owners

        owners = buffer_owners(core, crashed.py_frames, thread_locals, sysroot=sysroot)
        locals_problem = thread_locals.problem
    elif corruption and is_python_process(core):
        locals_problem = "the crashing thread has no Python frames"
    lookup = None
    if corruption and is_python_process(core):
        from ..pyread.locals import find_stack_owner

        def lookup(buffer: int, size: int):
            return find_stack_owner(core, analysis.crash.tid, buffer, size, sysroot=sysroot, mem=mem,
                                    interpreter=reading.interpreter() if reading is not None else None)
    frames = registers.frame_registers if registers is not None and registers.tid == analysis.crash.tid else ()
    pointers, unread = _python_pointers(analysis, thread_locals, mem) if corruption and is_python_process(core) \
        else (None, None)
    report = read_heap(core, sysroot=sysroot, message=analysis.crash.abort_message, tid=analysis.crash.tid,
                       corruption=corruption, summary=mode is HeapMode.FULL, owners=owners,
                       is_python=is_python_process(core), locals_problem=locals_problem, owner_lookup=lookup, mem=mem,
                       frames=frames, hints=[start for _what, start, _end in pointers or ()])
    if report.corruption is not None and crashed is not None and is_python_process(core):
        from ..heap.freer import library_verdict

        report = dataclasses.replace(report, corruption=library_verdict(
            report.corruption, crashed.native_frames, crashed.py_frames, pointers, unread or locals_problem))
    findings = analysis.findings + heap_findings(report, analysis.crash.tid)
    # a heap abort's fingerprint names what the anatomy says it was (a double free), whichever message glibc wrote
    return with_fingerprint(dataclasses.replace(analysis, heap=report, findings=findings))


def _python_pointers(analysis: Analysis, thread_locals, mem) -> tuple[list[tuple[str, int, int]] | None, str | None]:
    """What the crashing thread's Python side points into (:func:`forensics.pyread.locals.python_pointers`), or
    None with why its variables were not all read (None: not read at all)."""
    crashed = analysis.snapshot.crashed_thread
    if crashed is None or thread_locals is None or thread_locals.problem is not None or not crashed.py_frames:
        return None, None
    if thread_locals.unread:
        unread = ", ".join(crashed.py_frames[i].function for i in thread_locals.unread[:3]
                           if i < len(crashed.py_frames))
        return None, f"the variables of {len(thread_locals.unread)} Python frame(s) ({unread}) could not be read"
    from ..pyread.locals import python_pointers

    return python_pointers(analysis.snapshot.core, crashed.py_frames, thread_locals, mem=mem), None
