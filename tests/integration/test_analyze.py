"""`forensics analyze` on real kernel cores of every CPython 3.8-3.13 found here, and of Debian unstable's
3.13, 3.14 and 3.15 (crashed inside the sid root, analyzed from here with it as --sysroot: a foreign
glibc 2.43 too, whose frames are named from the root's debug files)."""
from __future__ import annotations

from pathlib import Path

import pytest

from forensics.analyze import analyze_core
from forensics.model import CrashKind, FaultKind, FrameKind, LibraryStatus
from forensics.views.frames import merge_frames
from tests.conftest import SID_BUILDS, python_params

RELEASE_SID = tuple(b for b in SID_BUILDS if not b.endswith("d"))

EXPORTER = Path(__file__).resolve().parents[1] / "crashers" / "exporter.py"
SOURCE = EXPORTER.read_text().splitlines()


def line_of(text: str) -> int:
    hits = [i + 1 for i, ln in enumerate(SOURCE) if ln.strip() == text]
    assert len(hits) == 1, f"{text!r} found {len(hits)} times in exporter.py"
    return hits[0]


def expected_main_stack(scenario: str) -> list[tuple[str, int]]:
    culprit = (
        "return LIB.forensics_bad_write(0)"
        if scenario == "segv"
        else 'return LIB.forensics_heap_overflow(0 if SCENARIO == "heap-prev" else 1)'
    )
    return [
        ("query_nvlink_throughput_counters", line_of(culprit)),
        ("nvlink_throughput", line_of("return query_nvlink_throughput_counters()")),
        ("device_metrics", line_of("return nvlink_throughput()")),
        ("collect", line_of("return device_metrics()")),
        ("main", line_of("collect()")),
        ("<module>", line_of("main()")),
    ]


def analyzed(cores, key: str, scenario: str):
    """(CPython version, analysis) of one core, with the sid root as sysroot for Debian's builds."""
    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    return interp.version, analyze_core(str(cores.get(key, scenario)), sysroot=sysroot, method="both")


# method="both": the DWARF layout (gdb) and the direct layout both walk the stacks, which must agree frame
# for frame (a disagreement makes the snapshot incomplete, which the first test asserts against).
@pytest.fixture(scope="module", params=python_params(sid=RELEASE_SID))
def heap_analysis(request, cores):
    return analyzed(cores, request.param, "heap-prev")


@pytest.fixture(scope="module", params=python_params(sid=RELEASE_SID))
def segv_analysis(request, cores):
    return analyzed(cores, request.param, "segv")


def test_heap_corruption_is_classified_with_glibc_message(heap_analysis):
    # GIVEN a core of a process that overflowed a heap buffer and freed it
    version, a = heap_analysis
    # THEN the signal, glibc's abort message and the class are right
    assert a.crash.signal_name == "SIGABRT"
    assert a.crash.abort_message == "double free or corruption (!prev)"
    assert a.crash.kind is CrashKind.HEAP_CORRUPTION
    assert a.snapshot.is_complete, a.snapshot.warnings
    assert a.snapshot.method_disagreements == ()
    assert a.snapshot.python_version.startswith(version + ".")


def test_python_stacks_of_both_threads(heap_analysis):
    version, a = heap_analysis
    threads = a.snapshot.threads
    assert len(threads) == 2
    main, server = threads
    # The crashed thread comes first and is the main thread, named by the threading module.
    assert main.is_crashed and not server.is_crashed
    assert main.name == "MainThread"
    assert main.tid == a.snapshot.core.crashed_tid == a.crash.tid
    got = [(f.function, f.line) for f in main.py_frames]
    assert got == expected_main_stack("heap-prev")
    assert all(f.file == str(EXPORTER) for f in main.py_frames)
    # The sleeping thread: its name, its own frame at the sleep line, then threading's frames.
    assert server.name == "metrics-server"
    assert (server.py_frames[0].function, server.py_frames[0].line) == ("serve_forever", line_of("time.sleep(3600)"))
    # CPython 3.11+ code objects carry a qualified name, which is what we show
    prefix = "Thread." if tuple(map(int, version.split("."))) >= (3, 11) else ""
    assert [f.function for f in server.py_frames[1:]] == [prefix + n for n in ("run", "_bootstrap_inner", "_bootstrap")]
    assert all(f.file.endswith("threading.py") for f in server.py_frames[1:])


def test_native_stack_names_libc_and_the_culprit_library(heap_analysis):
    # (Debian's: glibc 2.43's frames named from the root's own debug files, found by build-id)
    _, a = heap_analysis
    crashed = a.snapshot.crashed_thread
    symbols = [f.symbol for f in crashed.native_frames]
    assert "malloc_printerr" in symbols
    culprit = next(f for f in crashed.native_frames if f.symbol == "forensics_heap_overflow")
    assert culprit.library_name == "libcrash.so"
    assert culprit.file.endswith("libcrash.c") and culprit.line
    # malloc_printerr comes before (inside) the culprit frame
    assert symbols.index("malloc_printerr") < symbols.index("forensics_heap_overflow")
    # the sleeping thread's native stack reaches the sleep syscall wrapper
    server = a.snapshot.threads[1]
    assert any("sleep" in (f.symbol or "") for f in server.native_frames[:3])


def test_mapped_libraries_with_build_ids(heap_analysis):
    version, a = heap_analysis
    libs = {lib.name: lib for lib in a.snapshot.core.libraries}
    # Debian links libpython into the executable; pyenv's builds share it
    runtime = f"libpython{version}.so.1.0" if f"libpython{version}.so.1.0" in libs else f"python{version}"
    for name in (runtime, "libc.so.6", "libcrash.so"):
        assert name in libs, sorted(libs)
        assert libs[name].status is LibraryStatus.OK
        assert libs[name].build_id and libs[name].build_id == libs[name].file_build_id


def test_segv_fault_address(segv_analysis):
    version, a = segv_analysis
    assert a.crash.signal_name == "SIGSEGV"
    assert a.crash.kind is CrashKind.SEGV
    assert a.crash.fault_address == 0x10
    assert a.crash.fault_kind is FaultKind.NEAR_NULL
    crashed = a.snapshot.crashed_thread
    assert crashed.native_frames[0].symbol == "forensics_bad_write"
    assert [(f.function, f.line) for f in crashed.py_frames] == expected_main_stack("segv")


def test_merged_view_places_python_frames_at_eval_frames(heap_analysis):
    _, a = heap_analysis
    crashed = a.snapshot.crashed_thread
    merged = list(merge_frames(crashed))
    kinds = [k for k, _ in merged]
    py_in_merged = [f for k, f in merged if k is FrameKind.PYTHON]
    # every Python frame appears once, in order, and after the native culprit frame
    assert py_in_merged == list(crashed.py_frames)
    first_py = kinds.index(FrameKind.PYTHON)
    natives_before = [f.symbol for k, f in merged[:first_py] if k is FrameKind.NATIVE]
    assert "forensics_heap_overflow" in natives_before
    # the eval loop frames that carried Python frames were replaced by them
    n_eval = sum(1 for f in crashed.native_frames if f.is_eval_frame)
    n_eval_left = sum(1 for k, f in merged if k is FrameKind.NATIVE and f.is_eval_frame)
    assert n_eval_left < n_eval


@pytest.mark.parametrize("version", python_params())
def test_fingerprints_fold_same_bug_and_split_different_bugs(cores, version):
    a1 = analyze_core(str(cores.get(version, "heap-prev", 0)))
    a2 = analyze_core(str(cores.get(version, "heap-prev", 1)))
    b = analyze_core(str(cores.get(version, "segv")))
    c = analyze_core(str(cores.get(version, "heap-next-size")))
    assert a1.fingerprint == a2.fingerprint
    assert len({a1.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert c.crash.abort_message == "free(): invalid next size (normal)"
    assert c.crash.kind is CrashKind.HEAP_CORRUPTION


@pytest.mark.parametrize("version", python_params())
def test_abort_from_python_holds_the_gil(cores, version):
    # GIVEN os.abort() called from Python code (the GIL is held, unlike a ctypes call)
    a = analyze_core(str(cores.get(version, "py-abort")))
    # THEN it is an abort, not heap corruption, and the crashed thread is the GIL holder
    assert a.crash.kind is CrashKind.ABORT and a.crash.abort_message is None
    crashed = a.snapshot.crashed_thread
    assert crashed.holds_gil and not any(t.holds_gil for t in a.snapshot.threads if t is not crashed)
    assert crashed.py_frames[0].function == "query_nvlink_throughput_counters"
    assert crashed.py_frames[0].line == line_of(
        "return os.abort()  # from Python, holding the GIL: an abort that is not heap corruption")


@pytest.mark.parametrize(
    "scenario,kind,symbol",
    [("fpe", CrashKind.FPE, "forensics_divide"), ("ill", CrashKind.ILL, "forensics_trap"),
     ("bus", CrashKind.BUS, "forensics_bus")],
    ids=lambda v: getattr(v, "value", v),
)
def test_other_signals_are_classified(cores, newest_python, scenario, kind, symbol):
    a = analyze_core(str(cores.get(newest_python, scenario)))
    assert a.crash.kind is kind
    assert a.snapshot.crashed_thread.native_frames[0].symbol == symbol
    assert a.crash.fault_address is not None
    if kind is CrashKind.BUS:
        # the address is inside the file mapping, past the file's end (BUS_ADRERR read as SIGBUS's own code)
        assert a.crash.fault_kind is FaultKind.PAST_END_OF_FILE
    else:
        # SIGFPE/SIGILL report the faulting instruction, which is in libcrash.so's text
        assert a.crash.fault_address == a.snapshot.core.threads[0].pc


def info_symbol(python: str, core: str, pc: int) -> tuple[str, int]:
    """gdb's own ``info symbol`` for an address of the core (the oracle for a frame's symbol+offset)."""
    import subprocess

    out = subprocess.run(["gdb", "-nx", "-batch", "-q", "-iex", "set debuginfod enabled off", "-ex",
                          f"info symbol {pc:#x}", python, core], capture_output=True, text=True, timeout=120).stdout
    head = out.strip().splitlines()[-1].split(" in section ")[0]
    name, _, offset = head.rpartition(" + ")
    return (name, int(offset)) if name else (head, 0)


@pytest.mark.parametrize("native_method", ["gdb", "libdw"])
def test_inlined_frames_share_the_pc_and_have_no_offset_of_their_own(cores, newest_python, native_method):
    # GIVEN a core where glibc's qsort (its merge sort inlined into it) called back into Python, which aborted
    from tests.conftest import PYTHONS

    path = str(cores.get(newest_python, "qsort-abort"))
    a = analyze_core(path, native_method=native_method)
    frames = a.snapshot.crashed_thread.native_frames
    sort = [f for f in frames if (f.symbol or "").startswith(("msort", "__GI___qsort", "qsort"))]
    assert sort, [f.symbol for f in frames]
    inlined = [f for f in frames if f.inlined]
    assert inlined and all(f.offset is None for f in inlined)
    for f in inlined:
        # THEN an inlined frame stands at the pc of the frame it was inlined into, the next one out
        outer = frames[f.index + 1]
        assert outer.pc == f.pc and outer.library == f.library
    # and each physical frame's offset is the pc's offset into its ELF symbol, as gdb's info symbol says
    physical = [f for f in frames if not f.inlined and not f.tailcall and f.offset is not None]
    called = next(f for f in physical if f.index > 0 and (f.symbol or "").endswith("qsort_r"))
    name, offset = info_symbol(PYTHONS[newest_python], path, called.pc - 1)
    assert name.endswith("qsort_r") and called.offset == offset + 1
    assert frames[called.index - 1].inlined and frames[called.index - 1].symbol.startswith("msort")
