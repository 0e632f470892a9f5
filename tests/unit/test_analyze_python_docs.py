"""Python-state documents in the analyze stage: comparing two methods' documents, flagging and choosing them."""
from __future__ import annotations

import copy

from forensics.analyze import (
    analyze_snapshot, build_snapshot, choose_python_doc, compare_python_docs, flag_thread_errors,
)
from forensics.format import analysis_payload, format_analysis
from tests.unit.test_pure import make_core

BROKEN = "frame 0x4141414141414141: 0x4141414141414141 is not in the core"


def frame(function: str, line: int, file: str = "/app/exporter.py") -> dict:
    return {"function": function, "file": file, "line": line, "is_entry": True}


def python_doc() -> dict:
    """A two-thread document as the gdb walker and the direct reader both write it."""
    return {
        "python_version": "3.13.1", "status": "ok", "detail": "", "gil_holder_native_id": 7,
        "threads": [
            {"native_thread_id": 7, "thread_id": 0x7F00, "name": "MainThread", "holds_gil": True, "error": None,
             "frames": [frame("query_nvlink_throughput_counters", 31), frame("collect", 40), frame("<module>", 52)]},
            {"native_thread_id": 8, "thread_id": 0x7F01, "name": "metrics-server", "holds_gil": False, "error": None,
             "frames": [frame("serve_forever", 12), frame("Thread.run", 1010, "/usr/lib/python3.13/threading.py")]},
        ],
    }


# -- compare_python_docs (--method both) --------------------------------------------------------------


def test_agreeing_documents_have_no_disagreement():
    # GIVEN the same stacks from both methods (separate objects, equal content)
    gdb, direct = python_doc(), python_doc()
    # THEN nothing is reported
    assert compare_python_docs(gdb, direct) == []


def test_each_disagreement_is_reported():
    # GIVEN documents that differ in a frame's line, a frame's function, a thread name and the GIL holder
    gdb, direct = python_doc(), python_doc()
    main, server = direct["threads"]
    main["frames"][1]["line"] = 41
    server["frames"][0]["function"] = "serve"
    server["name"] = "Thread-1"
    main["holds_gil"], server["holds_gil"] = False, True
    # WHEN they are compared
    got = compare_python_docs(gdb, direct)
    # THEN every difference is named, with which method said what
    assert sorted(got) == sorted([
        "thread 7 frame 1: ('collect', '/app/exporter.py', 40) (gdb) vs ('collect', '/app/exporter.py', 41) (direct)",
        "thread 7: holds the GIL True (gdb) vs False (direct)",
        "thread 8: name 'metrics-server' (gdb) vs 'Thread-1' (direct)",
        "thread 8 frame 0: ('serve_forever', '/app/exporter.py', 12) (gdb) vs ('serve', '/app/exporter.py', 12) (direct)",
        "thread 8: holds the GIL False (gdb) vs True (direct)",
    ])


def test_gil_holder_alone_is_a_disagreement():
    # GIVEN stacks that are equal frame for frame, but the methods name different GIL holders
    gdb, direct = python_doc(), python_doc()
    direct["threads"][0]["holds_gil"] = False
    direct["threads"][1]["holds_gil"] = True
    # THEN the GIL flag is what is reported, for both threads
    assert compare_python_docs(gdb, direct) == [
        "thread 7: holds the GIL True (gdb) vs False (direct)",
        "thread 8: holds the GIL False (gdb) vs True (direct)",
    ]


def test_a_differing_status_still_compares_the_threads():
    # GIVEN one method that stopped short in the main thread (and said so in its status) and one that did not
    gdb, direct = python_doc(), python_doc()
    direct.update(status="error", detail="partial result: tid 7: " + BROKEN)
    direct["threads"][0].update(error=BROKEN, frames=direct["threads"][0]["frames"][:1])
    direct["threads"][1]["name"] = "Thread-1"
    got = compare_python_docs(gdb, direct)
    # THEN the status, the cut-short stack and the other thread's difference are all reported
    assert got[0] == "status ok (gdb) vs error (direct)"
    assert f"thread 7: stack cut short by direct only ({BROKEN})" in got
    assert "thread 7: 3 frames (gdb) vs 1 (direct)" in got
    assert "thread 8: name 'metrics-server' (gdb) vs 'Thread-1' (direct)" in got


# -- a thread whose Python stack stopped short ---------------------------------------------------------


def broken_doc() -> dict:
    """gdb's walker on a core whose main thread's frame pointer is garbage: a thread error, status still "ok"."""
    doc = python_doc()
    doc["threads"][0].update(frames=[], error=BROKEN)
    return doc


def test_thread_error_makes_the_document_partial():
    doc = broken_doc()
    before = copy.deepcopy(doc)
    flagged = flag_thread_errors(doc)
    assert flagged["status"] == "error"
    assert flagged["detail"] == f"partial result: tid 7: {BROKEN}"
    assert doc == before  # pure
    # the direct reader names the thread already: it is not named twice
    assert flag_thread_errors(flagged) == flagged
    assert flag_thread_errors(python_doc()) == python_doc()


def test_snapshot_with_a_thread_error_is_partial_and_says_which_thread():
    # GIVEN native stacks and a Python document whose main thread's stack could not be read
    native = {"threads": [{"num": 1, "lwp": 7, "frames": [{"pc": 1, "function": "f"}]},
                          {"num": 2, "lwp": 8, "frames": [{"pc": 2, "function": "g"}]}]}
    snap = build_snapshot(make_core(), native, broken_doc(), sysroot=None, native_method="gdb", python_method="gdb")
    # THEN the Python stage is partial, warned about, and the thread carries the reason
    assert snap.python_stack_status == f"partial: tid 7: {BROKEN}"
    assert any("Python stacks are partial" in w and "tid 7" in w for w in snap.warnings)
    assert not snap.is_complete
    main, server = snap.threads
    assert (main.tid, main.py_frames, main.python_error) == (7, (), BROKEN)
    assert server.python_error is None and server.py_frames
    # and both renderings show it under the thread
    analysis = analyze_snapshot(snap)
    lines = list(format_analysis(analysis))
    at = lines.index('Thread "MainThread" tid 7  [crashed, holds the GIL]')
    assert lines[at + 1:at + 3] == ["  Python stack (most recent call first):", f"    (Python stack incomplete: {BROKEN})"]
    merged = list(format_analysis(analysis, merged=True))
    assert f"    (Python stack incomplete: {BROKEN})" in merged
    payload = analysis_payload(analysis)
    assert [t["python_error"] for t in payload["snapshot"]["threads"]] == [BROKEN, None]


def test_auto_prefers_a_whole_document_then_partial_stacks():
    partial = flag_thread_errors(broken_doc())
    whole = python_doc()
    no_symbols = {"status": "no-python-symbols", "detail": "no debug info", "threads": []}
    assert choose_python_doc(whole, partial) == (whole, "direct")
    assert choose_python_doc(partial, whole) == (whole, "gdb")
    assert choose_python_doc(partial, flag_thread_errors(broken_doc())) == (partial, "direct")
    assert choose_python_doc(partial, no_symbols) == (partial, "direct")
    assert choose_python_doc(partial, None) == (partial, "direct")
    assert choose_python_doc(no_symbols, no_symbols) == (no_symbols, "gdb")
