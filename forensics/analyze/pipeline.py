"""core -> snapshot -> analysis: the ``forensics analyze`` pipeline for one core.

:func:`analyze_core` opens the input (a core, a compressed core of systemd-coredump's store, a capture bundle),
runs the unwinders and the Python readers it plans (libdw in the background beside the direct reader, gdb
only when needed), and hands their stacks to :mod:`.choose`, :mod:`.build`, :mod:`.findings` and
:mod:`.enrich`.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading

from ..core import open_core_memory
from ..errors import CapturedBeforeCrash, GdbError, GdbNotFound, NoCoreKept, Terminated, UnwinderUnavailable
from ..model import Analysis, CoreFile, LibraryStatus, PythonStatus
from ..modes import HeapMode, NativeMethod, StackMethod
from .a64fault import with_fault_signal
from .build import build_snapshot
from .choose import choose_native, choose_python, compare_methods, unwind_signal_handler_threads
from .enrich import with_crashed_locals, with_cxx_exception, with_heap, with_named_pc
from .findings import analyze_snapshot
from .native import failed_threads, native_label, plan_native
from .reading import CoreReading

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:  # gdb's plumbing is imported when gdb runs: most analyses never start it
    from ..model import NativeStack, PythonStacks, StoreEntry
    from ..gdb import GdbResult, GdbSession

__all__ = ["analyze_core", "open_input"]


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
        # SIGTERM and SIGINT go to the main thread: one delivered to this thread (in libdw, or in a debuginfod
        # receive) would only set Python's flag, and the main thread, asleep in join(), would never run the
        # handler -- the process then ignored SIGTERM for as long as a server kept this thread receiving
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller in join()
            self.error = e

    def wait(self) -> None:
        """Wait for the function to end, its result and error left unread."""
        self._thread.join()

    def join(self):
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def analyze_core(path: str, *, sysroot: str | None = None, exe: str | None = None, gdb: str = "gdb",
                 timeout: float = 120.0, debuginfod: str | None = None,
                 method: StackMethod | str = StackMethod.AUTO,
                 native_method: NativeMethod | str = NativeMethod.AUTO, session: GdbSession | None = None,
                 heap: HeapMode | str = HeapMode.AUTO) -> Analysis:
    """Analyze one core file.

    :param path: a core file, or a capture bundle directory (its stored objects are the sysroot)
    :param sysroot: a directory holding the crashed process's files at the paths the core names
    :param exe: the executable, when it is not at the path the core names
    :param method: a :class:`~forensics.modes.StackMethod` or its value (so for ``native_method`` and ``heap``):
        where the walker's struct layout comes from — ``direct`` (the core's
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
    :raises ValueError: a mode that is none of its enum's values
    :raises ForensicsError: when the input is not a readable x86-64 core
    :return: the analysis; a missing unwinder or missing symbols leave a partial one whose
        warnings say why
    """
    method, native_method, heap = StackMethod(method), NativeMethod(native_method), HeapMode(heap)
    plan = plan_native(native_method, method, debuginfod)
    path, sysroot, store = open_input(path, sysroot)
    core, mem = open_core_memory(path, sysroot=sysroot, exe=exe)  # opened once: every reader below reads it
    with mem:
        core = with_fault_signal(core, mem)  # an AArch64 core without NT_SIGINFO (qemu-user's): its si_addr
        analysis = _analyze(CoreReading(core, mem, sysroot), exe=exe, gdb=gdb, timeout=timeout,
                            debuginfod=debuginfod, method=method, native_method=native_method, plan=plan,
                            session=session, heap=heap)
    return analysis if store is None else dataclasses.replace(analysis, store=store)


def _read_direct_beside_libdw(reading: CoreReading, method: StackMethod, plan: NativeMethod,
                              problems: list[str]) -> tuple[PythonStacks | None, tuple[NativeStack, ...] | None]:
    """The direct reader's Python stacks and libdw's native stacks, libdw unwinding in the background while
    the direct reader walks the interpreter state."""
    core, sysroot = reading.core, reading.sysroot
    unwinding = None
    if plan in (NativeMethod.LIBDW, NativeMethod.BOTH):
        from ..unwind import unwind_core

        unwinding = _InBackground(lambda: unwind_core(core, sysroot=sysroot))
    direct = None
    try:
        if method is not StackMethod.GDB:
            from ..pyread import read_python_stacks

            direct = read_python_stacks(core, sysroot=sysroot, mem=reading.mem, interpreter=reading.interpreter())
    except (KeyboardInterrupt, Terminated):
        raise  # the process ends (130, 143): the unwinder, a daemon thread maybe inside a debuginfod fetch,
        # is not waited for
    except BaseException:
        if unwinding is not None:
            unwinding.wait()  # it reads the core's memory, which the caller closes next
        raise
    libdw_doc = None
    if unwinding is not None:
        try:
            libdw_doc = unwinding.join()
        except UnwinderUnavailable as e:
            problems.append(f"{e}; {e.help_text}" if plan is NativeMethod.BOTH else f"{e}; native stacks by gdb")
    return direct, libdw_doc


def _analyze(reading: CoreReading, *, exe: str | None, gdb: str, timeout: float, debuginfod: str | None,
             method: StackMethod, native_method: NativeMethod, plan: NativeMethod, session: GdbSession | None,
             heap: HeapMode) -> Analysis:
    core, sysroot = reading.core, reading.sysroot
    exe_lib = core.libraries[0] if core.libraries else None
    usable = (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
    exe_file = exe_lib.file_path if exe_lib is not None and exe_lib.status in usable else None
    problems: list[str] = []

    direct, libdw_doc = _read_direct_beside_libdw(reading, method, plan, problems)

    # gdb: CPython's layout from DWARF when asked (or when the direct reader's stacks are not whole), the
    # native stacks when asked, and for the threads libdw could not unwind
    want_gdb_python = method in (StackMethod.GDB, StackMethod.BOTH) or (
        method is StackMethod.AUTO and direct is not None and not direct.is_whole
        and direct.status is not PythonStatus.NOT_PYTHON)
    want_gdb_native = plan in (NativeMethod.GDB, NativeMethod.BOTH) or (
        plan is NativeMethod.LIBDW and (libdw_doc is None or bool(failed_threads(libdw_doc))))
    result = None
    if want_gdb_python or want_gdb_native:
        try:
            result = _run_gdb(core, exe_file, session, gdb=gdb, timeout=timeout, debuginfod=debuginfod,
                              python=want_gdb_python, native=want_gdb_native, sysroot=sysroot)
        except GdbNotFound as e:
            if want_gdb_python or plan is NativeMethod.GDB or libdw_doc is None:
                problems.append(f"{e}; {'native stacks need' if libdw_doc is None else 'it is needed'} "
                                f"gdb ({e.help_text})")
        except GdbError as e:
            problems.append(str(e))
    gdb_native = result.native if result is not None else None
    if gdb_native is not None and core.pac_mask_missing:
        problems.append("gdb stops after the first frame of this AArch64 core: its process authenticated return "
                        "addresses (HWCAP_PACA) and the core has no NT_ARM_PAC_MASK note (qemu-user writes none), so "
                        "gdb has no mask to strip them with ('Register 69 is not available'); libdw's stacks are "
                        "whole: --native-method libdw")
    dwarf_layout = result.layout if result is not None else None
    gdb_python = None
    if dwarf_layout is not None:
        from ..pyread import read_python_stacks

        gdb_python = read_python_stacks(core, sysroot=sysroot, dwarf=dwarf_layout, mem=reading.mem)

    native, native_notes, native_disagreements = choose_native(plan, libdw_doc, gdb_native)
    problems.extend(native_notes)
    # --method direct; not --native-method none
    if native is None and plan is NativeMethod.NONE and native_method is NativeMethod.AUTO:
        native = unwind_signal_handler_threads(reading, problems, direct)
    disagreements: tuple[str, ...] = ()
    if method is StackMethod.BOTH:
        disagreements = compare_methods(reading, gdb_python, direct, dwarf_layout, problems)
    python, py_method = choose_python(method, gdb_python, direct, problems, truncated=core.truncated)
    snapshot = build_snapshot(
        core, native, python, sysroot=sysroot,
        native_method=native_label(native), python_method=py_method, requested=method,
        problems=tuple(problems), disagreements=disagreements,
        requested_native=native_method, native_disagreements=tuple(native_disagreements), reading=reading,
    )
    snapshot, thread_locals = with_crashed_locals(snapshot, sysroot=sysroot, reading=reading)
    snapshot = with_cxx_exception(with_named_pc(snapshot, reading), reading)
    # the registers libdw recovered in the crashed thread's frames: where glibc's free() kept its pointer
    registers = next((s for s in libdw_doc or () if s.frame_registers), None)
    return with_heap(analyze_snapshot(snapshot), heap, sysroot=sysroot, thread_locals=thread_locals, reading=reading,
                     registers=registers)


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


def open_input(path: str, sysroot: str | None) -> tuple[str, str | None, StoreEntry | None]:
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
    """gdb's native stacks and DWARF layout: in ``session`` (batch mode) or a gdb of its own (also for a core of
    another machine than the session's gdb reads: gdb-multiarch, :func:`forensics.gdb.gdb_for_core`)."""
    from ..gdb import gdb_for_core

    if session is not None and gdb_for_core(core, gdb) == gdb:
        return session.analyze(core, exe_file, python=python, native=native, sysroot=sysroot)
    from ..gdb import run_gdb

    return run_gdb(core, exe_file, gdb=gdb, timeout=timeout, debuginfod=debuginfod, python=python, native=native,
                   sysroot=sysroot)
