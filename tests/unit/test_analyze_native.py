"""Which unwinder's stacks analyze shows (forensics.analyze.native): the plan, gdb for the threads libdw
could not unwind, and the frame-for-frame comparison of the two (pure functions on native-stack documents)."""
from __future__ import annotations

import pytest

from forensics.analyze.native import compare_native_docs, failed_threads, native_label, plan_native, with_gdb_fallback


def frame(pc: int, function: str | None, offset: int | None = 4, *, inlined: bool = False, tailcall: bool = False,
          line: int | None = 10) -> dict:
    return {"pc": pc, "function": function, "offset": offset, "library": "/lib/x.so", "file": "x.c", "line": line,
            "inlined": inlined, "tailcall": tailcall}


def thread(lwp: int, frames: list[dict], error: str | None = None, method: str = "libdw", **extra) -> dict:
    return {"num": 1, "lwp": lwp, "frames": frames, "error": error, "method": method, **extra}


@pytest.mark.parametrize("native,method,debuginfod,plan", [
    ("auto", "auto", None, "libdw"), ("auto", "direct", None, "none"), ("auto", "auto", "http://127.0.0.1:1", "gdb"),
    ("libdw", "direct", None, "libdw"), ("gdb", "auto", None, "gdb"), ("both", "auto", "http://x", "both"),
])
def test_plan(native, method, debuginfod, plan):
    assert plan_native(native, method, debuginfod) == plan


def test_an_unknown_plan_is_refused():
    with pytest.raises(ValueError):
        plan_native("lldb", "auto", None)


def test_gdb_stands_in_for_a_thread_libdw_could_not_unwind():
    # GIVEN libdw stopped short in thread 2 in an object whose file it had, and gdb went on the same stack
    libdw = {"threads": [thread(1, [frame(0x10, "main")]),
                         thread(2, [frame(0x20, "f")], error="unwinding stopped at frame 1 in x.so: no CFI")]}
    gdb = {"threads": [thread(1, [frame(0x10, "main")], method="gdb"),
                       thread(2, [frame(0x20, "f"), frame(0x30, "g"), frame(0x40, "h")], method="gdb")]}
    assert failed_threads(libdw) == {2}
    doc, notes = with_gdb_fallback(libdw, gdb)
    # THEN that thread is gdb's, says so, and a note says why; the other stays libdw's
    assert [t["method"] for t in doc["threads"]] == ["libdw", "gdb"]
    assert [f["function"] for f in doc["threads"][1]["frames"]] == ["f", "g", "h"]
    assert notes == ["tid 2: libdw: unwinding stopped at frame 1 in x.so: no CFI; native stack by gdb"]
    assert native_label(doc) == "libdw+gdb"


def test_gdb_is_not_taken_when_its_stack_is_another_one():
    libdw = {"threads": [thread(2, [frame(0x20, "f")], error="unwinding stopped at frame 1 in x.so: no CFI")]}
    gdb = {"threads": [thread(2, [frame(0x99, "other"), frame(0x30, "g")], method="gdb")]}
    doc, notes = with_gdb_fallback(libdw, gdb)
    assert doc == libdw and notes == []


def test_a_stop_in_a_withheld_library_is_not_a_failure():
    # gdb has no file for that library either: what it shows past it are guesses
    libdw = {"threads": [thread(2, [frame(0x20, "f")], error="stopped in x.so: its file is of another build",
                                stopped_in_withheld=True)]}
    gdb = {"threads": [thread(2, [frame(0x20, "f"), frame(0x7ffc0000, None), frame(0x55550000, None)], method="gdb")]}
    assert failed_threads(libdw) == set()
    assert with_gdb_fallback(libdw, gdb) == (libdw, [])


def test_the_frame_limit_is_not_a_failure():
    libdw = {"threads": [thread(2, [frame(0x20, "f")] * 3, error="stopped after 512 frames")]}
    assert failed_threads(libdw) == set()


def test_labels():
    assert native_label(None) == "registers"
    assert native_label({"threads": [thread(1, [], method="gdb")]}) == "gdb"
    assert native_label({"threads": [thread(1, [])]}) == "libdw"


def test_comparison_leaves_out_gdbs_tail_call_frames_and_accepts_aliases():
    ours = {"threads": [thread(7, [frame(0x10, "__clone3", 44), frame(0x20, "inl", None, inlined=True),
                                   frame(0x20, "outer", 8)])]}
    gdbs = {"threads": [thread(7, [frame(0x10, "clone3", 44), frame(0x18, "tail", None, tailcall=True),
                                   frame(0x20, "inl", None, inlined=True), frame(0x20, "outer", 8)], method="gdb")]}
    assert compare_native_docs(ours, gdbs) == []


@pytest.mark.parametrize("change,said", [
    ({"line": 11}, "frame 0"), ({"inlined": True, "offset": None}, "frame 0"), ({"pc": 0x11}, "frame 0"),
    ({"function": "other", "offset": None}, "frame 0"),
])
def test_comparison_names_the_first_difference(change, said):
    ours = {"threads": [thread(7, [frame(0x10, "main")])]}
    gdbs = {"threads": [thread(7, [{**frame(0x10, "main"), **change}], method="gdb")]}
    out = compare_native_docs(ours, gdbs)
    assert len(out) == 1 and out[0].startswith(f"thread 7 {said}:")


def test_comparison_of_missing_threads_and_lengths_in_one_line():
    ours = {"threads": [thread(7, [frame(0x10, "poll")]), thread(8, [])]}
    gdbs = {"threads": [thread(7, [frame(0x10, "poll"), frame(0x20, "run")], method="gdb")]}
    assert compare_native_docs(ours, gdbs) == [
        "2 of 2 threads differ: thread 7: 1 frames (libdw) vs 2 (gdb, tail-call frames left out); "
        "thread 8 only in libdw"]
    assert compare_native_docs(ours, None) == ["one method gave no result"]
    many = {"threads": [thread(t, [frame(0x10, "poll")]) for t in range(1, 6)]}
    other = {"threads": [thread(t, [frame(0x11, "poll")], method="gdb") for t in range(1, 6)]}
    (line,) = compare_native_docs(many, other)
    assert line.startswith("5 of 5 threads differ: thread 1 frame 0: ") and line.endswith("; and 2 more")


def test_comparison_ignores_frames_past_the_entry_and_how_a_path_is_spelled():
    # gdb stops at main (backtrace past-main off); libdw goes on into glibc's start-up and _start
    ours = {"threads": [thread(7, [{**frame(0x10, "main"), "file": "./prog/main.c"},
                                   frame(0x20, "__libc_start_call_main"), frame(0x30, "__libc_start_main_impl"),
                                   frame(0x40, "_start")]),
                        thread(8, [frame(0x50, "worker"), frame(0x60, "start_thread"), frame(0x70, "__clone3")])]}
    gdbs = {"threads": [thread(7, [{**frame(0x10, "main"), "file": "/build/prog-1.0/prog/main.c"}], method="gdb"),
                        thread(8, [frame(0x50, "worker"), frame(0x60, "start_thread")], method="gdb")]}
    assert compare_native_docs(ours, gdbs) == []
    # but a stack that stops early, short of the entry, is a difference, and so is another file
    early = {"threads": [thread(8, [frame(0x50, "worker")], method="gdb")]}
    assert compare_native_docs({"threads": [thread(8, [frame(0x50, "worker"), frame(0x58, "dispatch")])]}, early) == [
        "thread 8: 2 frames (libdw) vs 1 (gdb, tail-call frames left out)"]
    elsewhere = {"threads": [thread(7, [{**frame(0x10, "main"), "file": "/build/prog/other.c"}], method="gdb")]}
    assert compare_native_docs({"threads": [thread(7, [{**frame(0x10, "main"), "file": "main.c"}])]}, elsewhere)
