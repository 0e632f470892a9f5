"""Which unwinder's stacks analyze shows (forensics.analyze.native): the plan, gdb for the threads libdw
could not unwind, and the frame-for-frame comparison of the two (pure functions on native stacks as records)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from forensics.analyze.native import compare_native_docs, failed_threads, native_label, plan_native, with_gdb_fallback
from forensics.model import NativeFrame, NativeStack
from forensics.modes import NativeMethod, StackMethod, Unwinder, UnwoundBy


def frame(pc: int, function: str | None, offset: int | None = 4, *, inlined: bool = False, tailcall: bool = False,
          line: int | None = 10) -> NativeFrame:
    return NativeFrame(index=0, pc=pc, symbol=function, offset=offset, library="/lib/x.so", file="x.c", line=line,
                       inlined=inlined, tailcall=tailcall)


def thread(lwp: int, frames: list[NativeFrame], error: str | None = None, method: Unwinder = Unwinder.LIBDW,
           **extra) -> NativeStack:
    frames = [replace(f, index=i) for i, f in enumerate(frames)]
    return NativeStack(num=1, tid=lwp, frames=tuple(frames), error=error, method=method, **extra)


@pytest.mark.parametrize("native,method,debuginfod,plan", [
    ("auto", "auto", None, "libdw"), ("auto", "direct", None, "none"), ("auto", "auto", "http://127.0.0.1:1", "gdb"),
    ("libdw", "direct", None, "libdw"), ("gdb", "auto", None, "gdb"), ("both", "auto", "http://x", "both"),
])
def test_plan(native, method, debuginfod, plan):
    assert plan_native(NativeMethod(native), StackMethod(method), debuginfod) is NativeMethod(plan)


def test_gdb_stands_in_for_a_thread_libdw_could_not_unwind():
    # GIVEN libdw stopped short in thread 2 in an object whose file it had, and gdb went on the same stack
    libdw = (thread(1, [frame(0x10, "main")]),
             thread(2, [frame(0x20, "f")], error="unwinding stopped at frame 1 in x.so: no CFI"))
    gdb = (thread(1, [frame(0x10, "main")], method=Unwinder.GDB),
           thread(2, [frame(0x20, "f"), frame(0x30, "g"), frame(0x40, "h")], method=Unwinder.GDB))
    assert failed_threads(libdw) == {2}
    doc, notes = with_gdb_fallback(libdw, gdb)
    # THEN that thread is gdb's, says so, and a note says why; the other stays libdw's
    assert [t.method for t in doc] == [Unwinder.LIBDW, Unwinder.GDB]
    assert [f.symbol for f in doc[1].frames] == ["f", "g", "h"]
    assert notes == ["tid 2: libdw: unwinding stopped at frame 1 in x.so: no CFI; native stack by gdb"]
    assert native_label(doc) is UnwoundBy.LIBDW_GDB


def test_gdb_is_not_taken_when_its_stack_is_another_one():
    libdw = (thread(2, [frame(0x20, "f")], error="unwinding stopped at frame 1 in x.so: no CFI"),)
    gdb = (thread(2, [frame(0x99, "other"), frame(0x30, "g")], method=Unwinder.GDB),)
    doc, notes = with_gdb_fallback(libdw, gdb)
    assert doc == libdw and notes == []


def test_a_stop_in_a_withheld_library_is_not_a_failure():
    # gdb has no file for that library either: what it shows past it are guesses
    libdw = (thread(2, [frame(0x20, "f")], error="stopped in x.so: its file is of another build",
                    stopped_in_withheld=True),)
    gdb = (thread(2, [frame(0x20, "f"), frame(0x7ffc0000, None), frame(0x55550000, None)], method=Unwinder.GDB),)
    assert failed_threads(libdw) == set()
    assert with_gdb_fallback(libdw, gdb) == (libdw, [])


def test_the_frame_limit_is_not_a_failure():
    libdw = (thread(2, [frame(0x20, "f")] * 3, error="stopped after 512 frames"),)
    assert failed_threads(libdw) == set()


def test_labels():
    assert native_label(None) is UnwoundBy.REGISTERS
    assert native_label((thread(1, [], method=Unwinder.GDB),)) is UnwoundBy.GDB
    assert native_label((thread(1, []),)) is UnwoundBy.LIBDW
    assert native_label((thread(1, []), thread(2, [], method=Unwinder.REGISTERS))) is UnwoundBy.LIBDW_REGISTERS


def test_comparison_leaves_out_gdbs_tail_call_frames_and_accepts_aliases():
    ours = (thread(7, [frame(0x10, "__clone3", 44), frame(0x20, "inl", None, inlined=True), frame(0x20, "outer", 8)]),)
    gdbs = (thread(7, [frame(0x10, "clone3", 44), frame(0x18, "tail", None, tailcall=True),
                       frame(0x20, "inl", None, inlined=True), frame(0x20, "outer", 8)], method=Unwinder.GDB),)
    assert compare_native_docs(ours, gdbs) == []


@pytest.mark.parametrize("change,said", [
    ({"line": 11}, "frame 0"), ({"inlined": True, "offset": None}, "frame 0"), ({"pc": 0x11}, "frame 0"),
    ({"symbol": "other", "offset": None}, "frame 0"),
])
def test_comparison_names_the_first_difference(change, said):
    ours = (thread(7, [frame(0x10, "main")]),)
    gdbs = (thread(7, [replace(frame(0x10, "main"), **change)], method=Unwinder.GDB),)
    out = compare_native_docs(ours, gdbs)
    assert len(out) == 1 and out[0].startswith(f"thread 7 {said}:")


def test_comparison_of_missing_threads_and_lengths_in_one_line():
    ours = (thread(7, [frame(0x10, "poll")]), thread(8, []))
    gdbs = (thread(7, [frame(0x10, "poll"), frame(0x20, "run")], method=Unwinder.GDB),)
    assert compare_native_docs(ours, gdbs) == [
        "2 of 2 threads differ: thread 7: 1 frames (libdw) vs 2 (gdb, tail-call frames left out); "
        "thread 8 only in libdw"]
    assert compare_native_docs(ours, None) == ["one method gave no result"]
    many = tuple(thread(t, [frame(0x10, "poll")]) for t in range(1, 6))
    other = tuple(thread(t, [frame(0x11, "poll")], method=Unwinder.GDB) for t in range(1, 6))
    (line,) = compare_native_docs(many, other)
    assert line.startswith("5 of 5 threads differ: thread 1 frame 0: ") and line.endswith("; and 2 more")


def test_comparison_ignores_frames_past_the_entry_and_how_a_path_is_spelled():
    # gdb stops at main (backtrace past-main off); libdw goes on into glibc's start-up and _start
    ours = (thread(7, [replace(frame(0x10, "main"), file="./prog/main.c"),
                       frame(0x20, "__libc_start_call_main"), frame(0x30, "__libc_start_main_impl"),
                       frame(0x40, "_start")]),
            thread(8, [frame(0x50, "worker"), frame(0x60, "start_thread"), frame(0x70, "__clone3")]))
    gdbs = (thread(7, [replace(frame(0x10, "main"), file="/build/prog-1.0/prog/main.c")], method=Unwinder.GDB),
            thread(8, [frame(0x50, "worker"), frame(0x60, "start_thread")], method=Unwinder.GDB))
    assert compare_native_docs(ours, gdbs) == []
    # but a stack that stops early, short of the entry, is a difference, and so is another file
    early = (thread(8, [frame(0x50, "worker")], method=Unwinder.GDB),)
    assert compare_native_docs((thread(8, [frame(0x50, "worker"), frame(0x58, "dispatch")]),), early) == [
        "thread 8: 2 frames (libdw) vs 1 (gdb, tail-call frames left out)"]
    elsewhere = (thread(7, [replace(frame(0x10, "main"), file="/build/prog/other.c")], method=Unwinder.GDB),)
    assert compare_native_docs((thread(7, [replace(frame(0x10, "main"), file="main.c")]),), elsewhere)


def test_libdws_statement_row_is_the_line_gdb_names():
    # an address with several line-table rows: libdw's row is not a statement, gdb names the statement row
    ours = (replace(thread(7, [frame(0x10, "main", line=10)]), statement_rows=((0, "x.c", 12),)),)
    gdbs = (thread(7, [frame(0x10, "main", line=12)], method=Unwinder.GDB),)
    assert compare_native_docs(ours, gdbs) == []
    assert compare_native_docs((thread(7, [frame(0x10, "main", line=10)]),), gdbs)


def test_gdbs_document_becomes_records_where_it_enters():
    from forensics.gdb import parse_native_stacks

    # GIVEN forensics-native's document, with a thread and a frame of the wrong shape among good ones
    doc = {"threads": [{"num": 1, "lwp": 7, "frames": [{"pc": 16, "function": "main", "offset": 4, "library": "/x",
                                                         "file": "x.c", "line": 3, "inlined": False, "tailcall": True},
                                                        "junk", {"pc": "32", "function": ""}],
                        "error": None, "method": "gdb"},
                       {"num": 2, "frames": []}, "junk"]}
    # THEN the good thread and frames are records, the rest is left out or read as absent
    (t,) = parse_native_stacks(doc)
    assert (t.num, t.tid, t.method, t.error) == (1, 7, Unwinder.GDB, None)
    assert t.frames == (NativeFrame(index=0, pc=16, symbol="main", offset=4, library="/x", file="x.c", line=3,
                                    tailcall=True),
                        NativeFrame(index=1, pc=0, symbol=None, offset=None, library=None))
    assert parse_native_stacks(None) == () and parse_native_stacks({"threads": {}}) == ()


@pytest.mark.parametrize("mode", [{"method": "lldb"}, {"native_method": "lldb"}, {"heap": "some"}])
def test_an_unknown_mode_is_refused_before_the_core_is_opened(mode):
    from forensics.analyze import analyze_core

    # GIVEN a mode that is none of its enum's values; THEN analyze_core refuses it before reading any input
    with pytest.raises(ValueError, match="lldb|some"):
        analyze_core("/nonexistent/core", **mode)
