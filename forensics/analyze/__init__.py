"""core -> snapshot -> analysis: the ``forensics analyze`` pipeline.

:func:`analyze_core` is the one entry point for a single core;
:func:`forensics.analyze.batch.analyze_many` folds many cores into fingerprints.
"""
from __future__ import annotations

import dataclasses
import os
import threading

from ..core import open_core_memory
from ..errors import CapturedBeforeCrash, GdbError, GdbNotFound, NoCoreKept, UnwinderUnavailable
from ..model import (
    Analysis,
    CoreFile,
    CrashKind,
    LibraryStatus,
    NativeFrame,
    NativeStack,
    ProcessSnapshot,
    PythonMethod,
    PythonStacks,
    PythonStatus,
    Source,
)
from ..modes import HeapMode, NativeMethod, StackMethod, Unwinder, UnwoundBy, values
from .classify import is_python_process
from .findings import analyze_snapshot, check_nested_faults, check_snapshot, heap_findings
from .native import NATIVE_METHODS, compare_native_docs, failed_threads, native_label, plan_native, with_gdb_fallback
from .sigframe import attach_signal_frames
from .stacks import (
    build_threads,
    choose_python_stacks,
    compare_python_stacks,
    python_stacks_problem,
    python_status_line,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:  # gdb's plumbing is imported when gdb runs: most analyses never start it
    from ..model import StoreEntry
    from ..core.memory import CoreMemory
    from ..gdb import GdbResult, GdbSession
    from ..pyread import Interpreter

__all__ = ["METHODS", "NATIVE_METHODS", "analyze_core", "build_snapshot", "analyze_snapshot", "check_snapshot",
           "check_nested_faults", "is_python_process", "registers_only", "HEAP_MODES",
           "with_heap", "with_crashed_locals", "heap_findings", "CoreReading"]

METHODS = values(StackMethod)


def registers_only(core: CoreFile,
                   reason: str = "native stack not unwound: program counter only") -> tuple[NativeStack, ...]:
    """Each thread's program counter only, as its native stack (no unwinder ran, or none could)."""
    return tuple(NativeStack(num=i + 1, tid=t.tid, error=reason,
                             frames=(NativeFrame(index=0, pc=t.pc or 0, symbol=None, offset=None, library=None),))
                 for i, t in enumerate(core.threads))


def build_snapshot(core: CoreFile, native: tuple[NativeStack, ...] | None, python: PythonStacks | None, *,
                   sysroot: str | None,
                   native_method: UnwoundBy, python_method: str, requested: str = "auto",
                   problems: tuple[str, ...] = (), disagreements: tuple[str, ...] = (),
                   requested_native: str = "auto", native_disagreements: tuple[str, ...] = (),
                   reading: CoreReading | None = None) -> ProcessSnapshot:
    """Join the core reader's facts with the native and Python stacks into one snapshot.

    The Python stacks' status is said once, in ``python_stack_status`` (the ``Stacks:``
    line); ``problems`` are other methods' reasons and unwinders' errors, each one line.

    :param reading: the analysis' open core (None: the core is opened again to find signal frames)
    """
    warnings: list[str] = list(problems)
    threads = build_threads(core, native if native is not None else registers_only(core), python)
    threads = attach_signal_frames(core, threads) if reading is None else \
        attach_signal_frames(core, threads, mem=reading.mem, text=reading.text_trampolines())
    python_process = is_python_process(core) or (python is not None and python.version is not None)
    status = python_status_line(python, python_process=python_process)
    if python is None:
        py_status = PythonStatus.FAILED if python_process else PythonStatus.NOT_PYTHON
    elif not python_process and python.status is not PythonStatus.OK:
        py_status = PythonStatus.NOT_PYTHON
    else:
        py_status = python.status
    if core.truncated and python_process and py_status is not PythonStatus.OK:
        # what is missing is the memory, not the debug symbols: say the cause that applies
        truncated = (f"the core is truncated ({core.size:,} of {core.expected_size:,} bytes were written: core "
                     "size limit or full disk)")
        if py_status is PythonStatus.PARTIAL and python is not None and python.threads:
            status = f"partial: {truncated}; the interpreter's state is read only as far as the core goes"
        else:
            status = f"unavailable: {truncated}; the interpreter's state lies in the part not written"
    for t in threads:
        if t.signal_frames_cut:
            warnings.append(f"thread {t.tid}: {t.signal_frames_cut}")
    for d in disagreements:
        warnings.append(f"methods disagree: {d}")
    for d in native_disagreements:
        warnings.append(f"native unwinders disagree: {d}")
    for p in core.problems:
        warnings.append(f"core: {p}")
    if core.truncated:
        warnings.append(
            f"core is truncated: {core.size} of {core.expected_size} bytes were written "
            "(core size limit or full disk); parts of memory are missing: stacks and glibc's abort message "
            "may lie there (raise the limit: ulimit -c unlimited, or the core handler's --max-core-size)"
        )
    for lib in core.libraries:
        if lib.status is LibraryStatus.MISMATCH:
            warnings.append(
                f"{lib.path}: the file at {lib.file_path} is build {lib.file_build_id}, the core ran build "
                f"{lib.build_id}; it was left out, so its frames are unnamed (pass --sysroot with the original files)"
            )
        elif lib.status is LibraryStatus.MISSING:
            warnings.append(f"{lib.path}: not found{' under the sysroot' if sysroot else ''}; its frames are unnamed")
    return ProcessSnapshot(
        source=Source.CORE,
        core=core,
        threads=threads,
        python_version=python.version if python is not None else None,
        python_status=py_status,
        python_stack_status=status,
        python_layout=python.layout if python is not None else None,
        native_method=native_method,
        python_method=PythonMethod(python_method) if python else PythonMethod.NONE,
        requested_method=StackMethod(requested),
        method_disagreements=tuple(disagreements),
        sysroot=sysroot,
        warnings=tuple(warnings),
        requested_native_method=NativeMethod(requested_native),
        native_disagreements=tuple(native_disagreements),
    )


class _InBackground:
    """Run a function in a thread and keep its result or error (the libdw unwinder spends most of its
    time inside libdw, which runs without the GIL, so it overlaps the direct Python reader)."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self.result = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="forensics-unwind", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller in join()
            self.error = e

    def join(self):
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


HEAP_MODES = values(HeapMode)


class CoreReading:
    """One analysis' open core: its record, its memory (open while the analysis runs) and what more than one
    reader needs from it, computed once on first ask -- the interpreter (:func:`forensics.pyread.find_interpreter`:
    the walker, the crashing thread's locals and the heap's owner search read with it) and the sigreturn
    trampolines in the C library's text (the snapshot and the unwinding of handler threads ask)."""

    def __init__(self, core: CoreFile, mem: CoreMemory, sysroot: str | None) -> None:
        self.core = core
        self.mem = mem
        self.sysroot = sysroot
        self._interpreter: Interpreter | PythonStacks | None = None
        self._text: tuple[int, ...] | None = None

    def interpreter(self) -> Interpreter | PythonStacks:
        if self._interpreter is None:
            from ..pyread import find_interpreter

            self._interpreter = find_interpreter(self.core, self.mem, sysroot=self.sysroot)
        return self._interpreter

    def text_trampolines(self) -> tuple[int, ...]:
        if self._text is None:
            from .sigframe import text_trampolines

            self._text = text_trampolines(self.core, self.mem)
        return self._text


def analyze_core(path: str, *, sysroot: str | None = None, exe: str | None = None, gdb: str = "gdb",
                 timeout: float = 120.0, debuginfod: str | None = None, method: str = "auto",
                 native_method: str = "auto", session: GdbSession | None = None, heap: str = "auto") -> Analysis:
    """Analyze one core file.

    :param path: a core file, or a capture bundle directory (its stored objects are the sysroot)
    :param sysroot: a directory holding the crashed process's files at the paths the core names
    :param exe: the executable, when it is not at the path the core names
    :param method: where the walker's struct layout comes from — ``direct`` (the core's
        debug offsets and the table: no gdb, no debug symbols; native stacks are then program
        counters only unless ``native_method`` names an unwinder), ``gdb`` (CPython's DWARF,
        read by gdb), ``both`` (both layouts and their stacks compared), ``auto`` (direct,
        falling back to gdb's DWARF layout when those stacks are not whole)
    :param native_method: how native stacks are unwound — ``libdw`` (elfutils, in-process;
        gdb only for a thread libdw could not unwind), ``gdb``, ``both`` (both, compared frame
        for frame), ``none`` (program counters only), ``auto`` (libdw; none with
        ``method="direct"``; gdb with ``debuginfod``)
    :param session: a :class:`GdbSession` to reuse (batch mode); gdb starts only if needed
    :param heap: glibc's heap — ``auto`` (the corruption's anatomy, for a heap-corruption crash only:
        other crashes pay nothing), ``full`` (that, plus every arena, heap, bin and tcache:
        ``analyze --heap``), ``off``
    :raises ForensicsError: when the input is not a readable x86-64 core
    :return: the analysis; a missing unwinder or missing symbols leave a partial one whose
        warnings say why
    """
    if method not in METHODS:
        raise ValueError(method)
    if heap not in HEAP_MODES:
        raise ValueError(heap)
    plan = plan_native(native_method, method, debuginfod)
    path, sysroot, store = _open_input(path, sysroot)
    core, mem = open_core_memory(path, sysroot=sysroot, exe=exe)  # opened once: every reader below reads it
    with mem:
        analysis = _analyze(CoreReading(core, mem, sysroot), exe=exe, gdb=gdb, timeout=timeout,
                            debuginfod=debuginfod, method=method, native_method=native_method, plan=plan,
                            session=session, heap=heap)
    return analysis if store is None else dataclasses.replace(analysis, store=store)


def _analyze(reading: CoreReading, *, exe: str | None, gdb: str, timeout: float, debuginfod: str | None,
             method: str, native_method: str, plan: str, session: GdbSession | None, heap: str) -> Analysis:
    core, sysroot = reading.core, reading.sysroot
    exe_lib = core.libraries[0] if core.libraries else None
    usable = (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
    exe_file = exe_lib.file_path if exe_lib is not None and exe_lib.status in usable else None
    problems: list[str] = []

    # libdw unwinds in the background while the direct reader walks the interpreter state
    unwinding = None
    if plan in ("libdw", "both"):
        from ..unwind import unwind_core

        unwinding = _InBackground(lambda: unwind_core(core, sysroot=sysroot))
    direct = None
    try:
        if method in ("direct", "both", "auto"):
            from ..pyread import read_python_stacks

            direct = read_python_stacks(core, sysroot=sysroot, mem=reading.mem, interpreter=reading.interpreter())
    finally:
        libdw_doc = None
        if unwinding is not None:
            try:
                libdw_doc = unwinding.join()
            except UnwinderUnavailable as e:
                problems.append(f"{e}; {e.help_text}" if plan == "both" else f"{e}; native stacks by gdb")

    # gdb: CPython's layout from DWARF when asked (or when the direct reader's stacks are not whole), the
    # native stacks when asked, and for the threads libdw could not unwind
    want_gdb_python = method in ("gdb", "both") or (method == "auto" and direct is not None and not direct.is_whole
                                                    and direct.status is not PythonStatus.NOT_PYTHON)
    want_gdb_native = plan in ("gdb", "both") or (plan == "libdw"
                                                  and (libdw_doc is None or bool(failed_threads(libdw_doc))))
    result = None
    if want_gdb_python or want_gdb_native:
        try:
            result = _run_gdb(core, exe_file, session, gdb=gdb, timeout=timeout, debuginfod=debuginfod,
                              python=want_gdb_python, native=want_gdb_native, sysroot=sysroot)
        except GdbNotFound as e:
            if want_gdb_python or plan == "gdb" or libdw_doc is None:
                problems.append(f"{e}; {'native stacks need' if libdw_doc is None else 'it is needed'} "
                                f"gdb ({e.help_text})")
        except GdbError as e:
            problems.append(str(e))
    gdb_native = result.native if result is not None else None
    dwarf_layout = result.layout if result is not None else None
    gdb_python = None
    if dwarf_layout is not None:
        from ..pyread import read_python_stacks

        gdb_python = read_python_stacks(core, sysroot=sysroot, dwarf=dwarf_layout, mem=reading.mem)

    native, native_notes, native_disagreements = _choose_native(plan, libdw_doc, gdb_native)
    problems.extend(native_notes)
    if native is None and plan == "none" and native_method == "auto":  # --method direct; not --native-method none
        native = _unwind_signal_handler_threads(reading, problems, direct)
    disagreements: tuple[str, ...] = ()
    if method == "both":
        disagreements = _compare_methods(reading, gdb_python, direct, dwarf_layout, problems)
    python, py_method = _choose_python(method, gdb_python, direct, problems, truncated=core.truncated)
    snapshot = build_snapshot(
        core, native, python, sysroot=sysroot,
        native_method=native_label(native), python_method=py_method, requested=method,
        problems=tuple(problems), disagreements=disagreements,
        requested_native=native_method, native_disagreements=tuple(native_disagreements), reading=reading,
    )
    snapshot, thread_locals = with_crashed_locals(snapshot, sysroot=sysroot, reading=reading)
    return with_heap(analyze_snapshot(snapshot), heap, sysroot=sysroot, thread_locals=thread_locals, reading=reading)


def _no_core(path: str, reason: str) -> NoCoreKept:
    """Why a bundle has no core: a capture of a live process has none yet; a crash's bundle kept metadata only."""
    from ..bundle import read_bundle_json
    from ..bundle.layout import IDENTITY
    from ..bundle.read import MAX_RECORD
    from ..bundle.record import Identity

    ident = Identity.from_json(read_bundle_json(path, IDENTITY, MAX_RECORD))
    if ident is not None and ident.kind in ("capture", "capture-waiting"):
        return CapturedBeforeCrash(path, ident.core_dir)
    return NoCoreKept(path, reason)


def _open_input(path: str, sysroot: str | None) -> tuple[str, str | None, StoreEntry | None]:
    """(the core's path, the sysroot, what systemd-coredump's store says of it): a capture bundle is its own
    sysroot, a bundle without a core is an error; a compressed core (systemd-coredump's) is read from its
    decompressed copy in the cache, with its journal metadata."""
    if not os.path.isdir(path):
        from ..coredumpd import find_codec

        codec = find_codec(path)
        if codec is None:
            return path, sysroot, None
        from ..coredumpd import open_store_core, store_entry

        return open_store_core(path, codec), sysroot, store_entry(path, codec)
    # a capture bundle (its reader is loaded only for one: most inputs are cores)
    from ..bundle import bundle_no_core_reason, bundle_sysroot, has_manifest, is_bundle

    if has_manifest(path) and not is_bundle(path):
        raise _no_core(path, bundle_no_core_reason(path) or "the bundle holds no core")
    if not is_bundle(path):
        return path, sysroot, None
    # A capture bundle carries its core and every mapped object, keyed by build-id:
    # the bundle is its own sysroot, so it analyzes on any machine.
    core_path, bundle_root = bundle_sysroot(path)
    return core_path, sysroot or bundle_root, None


def _run_gdb(core: CoreFile, exe_file: str | None, session: GdbSession | None, *, gdb: str, timeout: float,
             debuginfod: str | None, python: bool, native: bool, sysroot: str | None) -> GdbResult:
    """gdb's native stacks and DWARF layout: in ``session`` (batch mode) or a gdb of its own."""
    if session is not None:
        return session.analyze(core, exe_file, python=python, native=native, sysroot=sysroot)
    from ..gdb import run_gdb

    return run_gdb(core, exe_file, gdb=gdb, timeout=timeout, debuginfod=debuginfod, python=python, native=native,
                   sysroot=sysroot)


def _compare_methods(reading: CoreReading, gdb_python, direct, dwarf_layout: dict | None,
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


def _choose_python(method: str, gdb_python, direct, problems: list[str], *, truncated: bool = False):
    """The Python stacks shown and the method that read them: the requested method's, or for auto/both the
    best whole one; for auto, the other method's reason is said once when it was tried and did not give them
    -- except on a truncated core, where what is missing is the memory, which the stacks line says: the
    other method's reason (gdb's "no DWARF ...; install python3.X-dbg") would blame debug symbols."""
    if method == "gdb":
        python, py_method = gdb_python, "gdb"
    elif method == "direct":
        python, py_method = direct, "direct"
    else:
        python, py_method = choose_python_stacks(direct, gdb_python)
    other, other_name = (gdb_python, "gdb") if py_method == "direct" else (direct, "direct")
    if (method == "auto" and not truncated and python is not None and not python.is_whole and other is not None
            and not other.is_whole and other.status is not PythonStatus.NOT_PYTHON and other.detail != python.detail):
        problems.append(f"Python stacks by {other_name}: {python_status_line(other, python_process=True)}")
    return python, py_method


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


def with_heap(analysis: Analysis, mode: str, *, sysroot: str | None = None, thread_locals=None,
              reading: CoreReading | None = None) -> Analysis:
    """``analysis`` with glibc's heap read (:func:`forensics.heap.read_heap`) as ``mode`` asks.

    ``auto`` reads it only for a heap-corruption crash, so any other crash costs nothing here.

    :param thread_locals: the crashing thread's locals (:func:`with_crashed_locals`): its ctypes
        buffers and the native call in progress go to the verdict
    :param reading: the analysis' open core and its interpreter (None: the core is opened where needed)
    """
    corruption = analysis.crash.kind is CrashKind.HEAP_CORRUPTION
    if mode == "off" or (mode == "auto" and not corruption):
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
    report = read_heap(core, sysroot=sysroot, message=analysis.crash.abort_message, tid=analysis.crash.tid,
                       corruption=corruption, summary=mode == "full", owners=owners,
                       is_python=is_python_process(core), locals_problem=locals_problem, owner_lookup=lookup, mem=mem)
    if report.corruption is not None and crashed is not None and is_python_process(core):
        from ..heap.freer import library_verdict

        pointers = None
        if thread_locals is not None and thread_locals.problem is None and crashed.py_frames:
            if thread_locals.unread:
                unread = ", ".join(crashed.py_frames[i].function for i in thread_locals.unread[:3]
                                   if i < len(crashed.py_frames))
                locals_problem = f"the variables of {len(thread_locals.unread)} Python frame(s) ({unread}) " \
                                 "could not be read"
            else:
                from ..pyread.locals import python_pointers

                pointers = python_pointers(core, crashed.py_frames, thread_locals, mem=mem)
        report = dataclasses.replace(report, corruption=library_verdict(
            report.corruption, crashed.native_frames, crashed.py_frames, pointers, locals_problem))
    findings = analysis.findings + heap_findings(report, analysis.crash.tid)
    return dataclasses.replace(analysis, heap=report, findings=findings)


def _unwind_signal_handler_threads(reading: CoreReading, problems: list[str],
                                   python: PythonStacks | None = None) -> tuple[NativeStack, ...] | None:
    """Native stacks, by libdw, of the threads running a signal handler -- and of the crashed thread when
    it ran no Python code -- when no unwinder was asked for.

    ``--method direct`` unwinds nothing, but a thread that was running a handler needs its native stack
    to tell the handler's frames from the ones it interrupted: the first fault's Python frames (and so
    the fingerprint) are those; and a crashed thread without Python frames (a native library's own
    thread) is told apart by its native frames alone.  Only such threads are unwound; the others keep
    their program counter.  None when there is none, or libdw cannot run (said in ``problems``).
    """
    core, sysroot = reading.core, reading.sysroot
    pcs = registers_only(core)
    threads = attach_signal_frames(core, build_threads(core, pcs, None), mem=reading.mem,
                                   text=reading.text_trampolines())
    tids = {t.tid for t in threads if t.signal_frames}
    if python is not None and python.status in (PythonStatus.OK, PythonStatus.NOT_PYTHON) \
            and core.crashed_tid is not None \
            and not any(t.frames for t in python.threads if t.native_thread_id == core.crashed_tid):
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


def _choose_native(plan: str, libdw: tuple[NativeStack, ...] | None, gdb: tuple[NativeStack, ...] | None
                   ) -> tuple[tuple[NativeStack, ...] | None, list[str], list[str]]:
    """The native stacks to show, notes on where they came from, and (``both``) the disagreements."""
    if plan == "none":
        return None, [], []
    if plan == "gdb":
        return gdb, [], []
    if plan == "both":
        if libdw is None or gdb is None:
            return libdw if libdw is not None else gdb, [], []
        return libdw, [], compare_native_docs(libdw, gdb)
    if libdw is None:
        return gdb, [], []
    doc, notes = with_gdb_fallback(libdw, gdb)
    return doc, notes, []
