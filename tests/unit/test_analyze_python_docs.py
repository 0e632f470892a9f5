"""Python stacks in the analyze stage: the typed records of two methods compared, chosen and said once."""
from __future__ import annotations

import dataclasses

from forensics.analyze import analyze_snapshot, build_snapshot
from forensics.analyze.stacks import choose_python_stacks, compare_python_stacks, python_status_line
from forensics.views.frames import merge_frames
from forensics.format import analysis_payload
from forensics.text.analysis import format_analysis
from forensics.model import (FrameKind, NativeFrame, PyFrame, PythonMethod, PythonStacks, PythonStatus, PyThreadStack,
                             Thread)
from forensics.modes import UnwoundBy
from tests.unit.test_pure import make_core

BROKEN = "frame 0x4141414141414141: 0x4141414141414141 is not in the core"


def frame(function: str, line: int, file: str = "/app/exporter.py") -> PyFrame:
    return PyFrame(function=function, file=file, line=line, is_entry=True)


def stacks(**changes) -> PythonStacks:
    """Two threads' stacks as the walker gives them, whichever layout it walked with."""
    main = PyThreadStack(native_thread_id=7, thread_id=0x7F00, name="MainThread", holds_gil=True,
                         frames=(frame("query_nvlink_throughput_counters", 31), frame("collect", 40),
                                 frame("<module>", 52)))
    server = PyThreadStack(native_thread_id=8, thread_id=0x7F01, name="metrics-server", holds_gil=False,
                           frames=(frame("serve_forever", 12),
                                   frame("Thread.run", 1010, "/usr/lib/python3.13/threading.py")))
    record = PythonStacks(status=PythonStatus.OK, version="3.13.1", gil_holder=7, threads=(main, server),
                          layout="table 3.13 (3.13.0)")
    return dataclasses.replace(record, **changes)


def with_thread(record: PythonStacks, index: int, **changes) -> PythonStacks:
    threads = list(record.threads)
    threads[index] = dataclasses.replace(threads[index], **changes)
    return dataclasses.replace(record, threads=tuple(threads))


# -- compare_python_stacks (--method both) ----------------------------------------------------------


def test_agreeing_stacks_have_no_disagreement():
    assert compare_python_stacks(stacks(), stacks()) == []


def test_each_disagreement_is_reported():
    # GIVEN stacks that differ in a frame's line, a frame's function, a thread name and the GIL holder
    direct = with_thread(stacks(), 0, holds_gil=False,
                         frames=(frame("query_nvlink_throughput_counters", 31), frame("collect", 41),
                                 frame("<module>", 52)))
    direct = with_thread(direct, 1, name="Thread-1", holds_gil=True,
                         frames=(frame("serve", 12), frame("Thread.run", 1010, "/usr/lib/python3.13/threading.py")))
    # WHEN they are compared
    got = compare_python_stacks(stacks(), direct)
    # THEN every difference is named, with which method said what
    assert sorted(got) == sorted([
        "thread 7 frame 1: ('collect', '/app/exporter.py', 40) (gdb) vs ('collect', '/app/exporter.py', 41) "
        "(direct)",
        "thread 7: holds the GIL True (gdb) vs False (direct)",
        "thread 8: name 'metrics-server' (gdb) vs 'Thread-1' (direct)",
        "thread 8 frame 0: ('serve_forever', '/app/exporter.py', 12) (gdb) vs ('serve', '/app/exporter.py', 12) "
        "(direct)",
        "thread 8: holds the GIL False (gdb) vs True (direct)",
    ])


def test_a_differing_status_still_compares_the_threads():
    # GIVEN one method that stopped short in the main thread (and said so) and one that did not
    direct = with_thread(stacks(status=PythonStatus.PARTIAL, detail=f"tid 7: {BROKEN}"), 0, error=BROKEN,
                         frames=stacks().threads[0].frames[:1])
    direct = with_thread(direct, 1, name="Thread-1")
    got = compare_python_stacks(stacks(), direct)
    # THEN the status, the cut-short stack and the other thread's difference are all reported
    assert got[0] == "status ok (gdb) vs partial (direct)"
    assert f"thread 7: stack cut short by direct only ({BROKEN})" in got
    assert "thread 7: 3 frames (gdb) vs 1 (direct)" in got
    assert "thread 8: name 'metrics-server' (gdb) vs 'Thread-1' (direct)" in got


def test_a_method_without_stacks_is_said_once_not_thread_by_thread():
    no_dwarf = PythonStacks(status=PythonStatus.UNSUPPORTED, detail="gdb: no DWARF for _PyRuntime")
    assert compare_python_stacks(no_dwarf, stacks()) == [
        "status unsupported (gdb) vs ok (direct)", "gdb gave no stacks: gdb: no DWARF for _PyRuntime"]


# -- a thread whose Python stack stopped short ---------------------------------------------------------


def broken() -> PythonStacks:
    """The walker on a core whose main thread's frame pointer is garbage: a partial record naming the thread."""
    return with_thread(stacks(status=PythonStatus.PARTIAL, detail=f"tid 7: {BROKEN}"), 0, frames=(), error=BROKEN)


def test_snapshot_with_a_thread_error_is_partial_and_says_which_thread_once():
    # GIVEN native stacks and Python stacks whose main thread's stack could not be read
    from forensics.model import NativeFrame, NativeStack

    native = tuple(NativeStack(num=i, tid=tid, frames=(NativeFrame(index=0, pc=pc, symbol=f, offset=None,
                                                                   library=None),))
                   for i, tid, pc, f in ((1, 7, 1, "f"), (2, 8, 2, "g")))
    snap = build_snapshot(make_core(), native, broken(), sysroot=None, native_method=UnwoundBy.GDB,
                          python_method=PythonMethod.GDB)
    # THEN the Python stage is partial, said once (the Stacks line), and the thread carries the reason
    assert snap.python_status is PythonStatus.PARTIAL
    assert snap.python_stack_status == f"partial: tid 7: {BROKEN}"
    assert not any("tid 7" in w for w in snap.warnings)
    assert not snap.is_complete
    main, server = snap.threads
    assert (main.tid, main.py_frames, main.python_error) == (7, (), BROKEN)
    assert server.python_error is None and server.py_frames
    # and both renderings show it under the thread, the reason once in the header
    analysis = analyze_snapshot(snap)
    lines = list(format_analysis(analysis))
    header = lines[:next(i for i, line in enumerate(lines) if line.startswith("Thread "))]
    assert [line for line in header if BROKEN in line and line.startswith(("Stacks:", "warning:"))] == [
        f"Stacks:      native by gdb; Python by gdb (table 3.13 (3.13.0)): partial: tid 7: {BROKEN}"]
    at = lines.index('Thread "MainThread" tid 7  [crashed, holds the GIL]')
    assert lines[at + 1:at + 3] == ["  Python stack (most recent call first):",
                                    f"    (Python stack incomplete: {BROKEN})"]
    merged = list(format_analysis(analysis, merged=True))
    assert f"    (Python stack incomplete: {BROKEN})" in merged
    payload = analysis_payload(analysis)
    assert [t["python_error"] for t in payload["snapshot"]["threads"]] == [BROKEN, None]
    assert payload["snapshot"]["python_status"] == "partial"


def test_auto_prefers_a_whole_record_then_partial_stacks():
    partial, whole = broken(), stacks()
    no_dwarf = PythonStacks(status=PythonStatus.UNSUPPORTED, detail="no DWARF")
    assert choose_python_stacks(whole, partial) == (whole, PythonMethod.DIRECT)
    assert choose_python_stacks(partial, whole) == (whole, PythonMethod.GDB)
    assert choose_python_stacks(partial, broken()) == (partial, PythonMethod.DIRECT)
    assert choose_python_stacks(partial, no_dwarf) == (partial, PythonMethod.DIRECT)
    assert choose_python_stacks(no_dwarf, partial) == (partial, PythonMethod.GDB)
    assert choose_python_stacks(partial, None) == (partial, PythonMethod.DIRECT)
    assert choose_python_stacks(no_dwarf, no_dwarf) == (no_dwarf, PythonMethod.DIRECT)
    assert choose_python_stacks(None, no_dwarf) == (no_dwarf, PythonMethod.GDB)


def test_status_lines_say_the_reason_in_one_line():
    assert python_status_line(stacks(), python_process=True) == "ok"
    cut = PythonStacks(status=PythonStatus.PARTIAL, detail="cut at the walk's bound of 4096 threads")
    assert python_status_line(cut, python_process=True) == "partial: cut at the walk's bound of 4096 threads"
    unsupported = PythonStacks(status=PythonStatus.UNSUPPORTED, detail="CPython 3.7 is not in the layout table")
    assert python_status_line(unsupported, python_process=True) == (
        "unavailable: CPython 3.7 is not in the layout table")
    not_python = PythonStacks(status=PythonStatus.NOT_PYTHON)
    assert python_status_line(not_python, python_process=False) == "not a Python process"


# -- the merged view ------------------------------------------------------------------------------------


def nf(i: int, symbol: str) -> NativeFrame:
    return NativeFrame(index=i, pc=0x1000 + i, symbol=symbol, offset=1, library="/usr/bin/python3.14")


def test_tail_calling_interpreter_places_python_frames_at_the_opcode_handler():
    # GIVEN a clang build of 3.14 (tail-calling interpreter): each evaluation's innermost native frame is an
    # opcode handler above its _PyEval_EvalFrameDefault
    t = Thread(tid=7, name="MainThread", is_crashed=True, holds_gil=True,
               native_frames=(nf(0, "ffi_call"), nf(1, "_TAIL_CALL_CALL_BUILTIN_FAST"),
                              nf(2, "_PyEval_EvalFrameDefault"),
                              nf(3, "PyObject_Vectorcall"), nf(4, "_TAIL_CALL_CALL_PY_GENERAL"),
                              nf(5, "_PyEval_EvalFrameDefault"), nf(6, "Py_RunMain")),
               py_frames=(PyFrame(function="inner", file="a.py", line=3, is_entry=False),
                          PyFrame(function="outer", file="a.py", line=9, is_entry=True),
                          PyFrame(function="<module>", file="a.py", line=12, is_entry=True)))
    # WHEN merged
    got = [(k, getattr(f, "symbol", None) or f.function) for k, f in merge_frames(t)]
    # THEN each group of Python frames stands at its evaluation's handler, none at the loop under it
    assert got == [
        (FrameKind.NATIVE, "ffi_call"), (FrameKind.PYTHON, "inner"), (FrameKind.PYTHON, "outer"),
        (FrameKind.NATIVE, "_PyEval_EvalFrameDefault"), (FrameKind.NATIVE, "PyObject_Vectorcall"),
        (FrameKind.PYTHON, "<module>"), (FrameKind.NATIVE, "_PyEval_EvalFrameDefault"),
        (FrameKind.NATIVE, "Py_RunMain"),
    ]
