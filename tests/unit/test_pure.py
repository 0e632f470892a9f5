"""Pure functions on hand-built records: classification, fingerprints, merging, formatting."""
from __future__ import annotations

import json

import pytest

from forensics.analyze import analyze_snapshot
from forensics.analyze.classify import classify_fault_address, is_heap_message, normalize_message
from forensics.analyze.fingerprint import fingerprint, fingerprint_basis
from forensics.views.signature import signature
from forensics.analyze.stacks import build_threads
from forensics.views.frames import merge_frames
from forensics.format import analysis_payload
from forensics.gdb import LAYOUT_MARKER, NATIVE_MARKER, _soname_aliases, parse_layout, parse_marker_json
from forensics.model import (
    CoreFile, CoreThread, CrashKind, FaultKind, FrameKind, Mapping, NativeFrame, NativeStack, ProcessSnapshot, PyFrame,
    PythonMethod, PythonStacks, PythonStatus, PyThreadStack, SigInfo, Source, Thread,
)
from forensics.modes import UnwoundBy
from forensics.output import json_document
from forensics.text.analysis import format_analysis, format_batch

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def make_core(signo=6, code=-6, addr=None, abort=None, mappings=()):
    return CoreFile(
        path="/cores/core.1", size=100, pid=1, command="python3", args="python3 x.py", executable="/usr/bin/python3",
        build_id="aa",
        signal=SigInfo(signo=signo, code=code, errno=0, name={6: "SIGABRT", 11: "SIGSEGV"}[signo], addr=addr),
        threads=(CoreThread(tid=7, signal=signo, pc=0x401000, sp=0x7ff0),), mappings=tuple(mappings), libraries=(),
        nvml=None, abort_message=abort, truncated=False, expected_size=100,
    )


def nf(i, sym, lib=LIBC):
    return NativeFrame(index=i, pc=0x1000 + i, symbol=sym, offset=1, library=lib)


@pytest.mark.parametrize(
    "msg,heap",
    [
        ("double free or corruption (!prev)", True),
        ("free(): invalid next size (normal)", True),
        ("malloc(): unsorted double linked list corrupted", True),
        ("corrupted size vs. prev_size", True),
        ("python3: x.c:1: f: Assertion `0' failed.", False),
        (None, False),
    ],
)
def test_is_heap_message(msg, heap):
    assert is_heap_message(msg) is heap


def test_normalize_message_blanks_addresses():
    assert normalize_message("munmap_chunk(): invalid pointer 0x55d0c0ffee00") == (
        "munmap_chunk(): invalid pointer <hex>")


@pytest.mark.parametrize(
    "addr,code,perms,want",
    [
        (0x10, 1, None, FaultKind.NEAR_NULL),
        (0x7000_0000, 1, None, FaultKind.UNMAPPED),
        (0x5000, 2, "r--p", FaultKind.NEAR_NULL),
        (0x60_0010, 2, "r--p", FaultKind.NOT_WRITABLE),
        (0x60_0010, 2, "rw-p", FaultKind.MAPPED),
        (0, 0x80, None, FaultKind.UNKNOWN),
    ],
)
def test_classify_fault_address(addr, code, perms, want):
    maps = [Mapping(start=0x60_0000, end=0x60_1000, offset=0, perms=perms, path=None)] if perms else []
    core = make_core(signo=11, code=code, addr=addr, mappings=maps)
    assert classify_fault_address(core, addr, code, pc=0x401000) is want


def test_merge_frames_groups_python_frames_by_entry():
    # GIVEN a 3.11-style stack: one eval call running two Python frames, another running one
    t = Thread(
        tid=1, name=None, is_crashed=True, holds_gil=False,
        native_frames=(nf(0, "free"), nf(1, "_PyEval_EvalFrameDefault", "/x/libpython3.11.so"), nf(2, "call"),
                       nf(3, "_PyEval_EvalFrameDefault", "/x/libpython3.11.so"), nf(4, "main", "/usr/bin/python3")),
        py_frames=(PyFrame(function="inner", file="a.py", line=3, is_entry=False),
                   PyFrame(function="outer", file="a.py", line=9, is_entry=True),
                   PyFrame(function="<module>", file="a.py", line=12, is_entry=True)),
    )
    got = [(k, getattr(f, "symbol", None) or f.function) for k, f in merge_frames(t)]
    assert got == [
        (FrameKind.NATIVE, "free"), (FrameKind.PYTHON, "inner"), (FrameKind.PYTHON, "outer"),
        (FrameKind.NATIVE, "call"), (FrameKind.PYTHON, "<module>"), (FrameKind.NATIVE, "main"),
    ]


def test_build_threads_matches_python_threads_by_native_id():
    core = make_core()
    native = (NativeStack(num=2, tid=8, frames=()),
              NativeStack(num=1, tid=7, frames=(NativeFrame(index=0, pc=1, symbol="f", offset=None, library=None),)))
    python = PythonStacks(status=PythonStatus.OK, gil_holder=8, threads=(
        PyThreadStack(native_thread_id=8, thread_id=2, name="worker", holds_gil=False,
                      frames=(PyFrame(function="w", file="w.py", line=1),)),
        PyThreadStack(native_thread_id=7, thread_id=1, name="MainThread", holds_gil=False, frames=()),
    ))
    threads = build_threads(core, native, python)
    assert [t.tid for t in threads] == [7, 8]  # crashed first
    assert threads[0].is_crashed and threads[0].name == "MainThread"
    assert threads[1].holds_gil and threads[1].py_frames[0].function == "w"


def _analysis(abort="double free or corruption (!prev)", py_line=5):
    core = make_core(abort=abort)
    t = Thread(
        tid=7, name="MainThread", is_crashed=True, holds_gil=False,
        native_frames=(nf(0, "raise"), nf(1, "abort"), nf(2, "malloc_printerr"), nf(3, "_int_free"),
                       nf(4, "nvmlDeviceGetFieldValues", "/usr/lib/libnvidia-ml.so.580.126.09")),
        py_frames=(PyFrame(function="nvlink_throughput", file="/app/nvitop/api/device.py", line=py_line),),
    )
    snap = ProcessSnapshot(source=Source.CORE, core=core, threads=(t,), python_version="3.12.1",
                           python_status=PythonStatus.OK, python_stack_status="ok", native_method=UnwoundBy.GDB,
                           python_method=PythonMethod.GDB, sysroot=None)
    return analyze_snapshot(snap)


def test_fingerprint_ignores_lines_and_addresses_but_not_the_bug():
    a, b = _analysis(py_line=5), _analysis(py_line=50)
    assert a.fingerprint == b.fingerprint
    assert a.crash.kind is CrashKind.HEAP_CORRUPTION
    # the class, the message (no heap read here: the anatomy did not say which corruption it was), the first frame
    # outside glibc's abort machinery (the code whose free() glibc rejected: --method direct unwinds the crashed
    # thread), the Python frames
    assert a.fingerprint_basis == ("kind:heap-corruption", "signal:SIGABRT", "abort:double free or corruption (!prev)",
                                   "function:libnvidia-ml.so:nvmlDeviceGetFieldValues",
                                   "python:device.py:nvlink_throughput")
    assert a.fingerprint_partial is None
    c = _analysis(abort="free(): invalid next size (normal)")
    assert c.fingerprint != a.fingerprint
    assert fingerprint(fingerprint_basis(a.snapshot, a.crash)[0]) == a.fingerprint


def test_signature_and_json_document():
    a = _analysis()
    sig = signature(a)
    assert sig == ('SIGABRT "double free or corruption (!prev)" [heap-corruption] in thread "MainThread" tid 7 '
                   "at nvlink_throughput (device.py:5) via nvmlDeviceGetFieldValues (libnvidia-ml.so.580.126.09)")
    assert a.crash.exit_status == 134
    lines = list(format_analysis(a))
    assert lines[0] == sig
    doc = json.loads(json_document("analyze", {"analysis": analysis_payload(a, merged=True)}))
    assert doc["schema_version"] == 1 and doc["analysis"]["crash"]["kind"] == "heap-corruption"
    assert doc["analysis"]["snapshot"]["threads"][0]["merged"][0]["kind"] == "native"


def test_parse_marker_json_and_soname_aliases():
    assert parse_marker_json("x\n" + NATIVE_MARKER + '{"threads": [1]}\n', NATIVE_MARKER) == {"threads": [1]}
    assert parse_marker_json("nothing", NATIVE_MARKER) is None
    assert _soname_aliases("libffi.so.8.1.2") == ["libffi.so.8.1", "libffi.so.8"]
    assert _soname_aliases("libc.so.6") == []


def test_gdbs_layout_document_becomes_a_record_where_it_enters():
    # GIVEN forensics-layout's line as gdb prints it: a layout table, or why there is none, or no line at all
    table = {"ptr_size": 8, "types": {"PyThreadState": {"size": 8, "fields": {}}}, "objfile": "/usr/bin/python3.12"}
    got = parse_layout(parse_marker_json(LAYOUT_MARKER + json.dumps(table) + "\n", LAYOUT_MARKER))
    # THEN the table is the record's, with the file it came from; an error is the record's error, no table
    assert (got.table, got.objfile, got.error) == (table, "/usr/bin/python3.12", None)
    no_dwarf = parse_layout({"error": "no DWARF for _PyRuntime"})
    assert (no_dwarf.table, no_dwarf.error) == (None, "no DWARF for _PyRuntime")
    assert parse_layout(parse_marker_json("gdb said nothing", LAYOUT_MARKER)).error == \
        "forensics-layout printed no result"
    # and an objfile that is not a string is left out, not carried into the description
    assert parse_layout({"types": {}, "objfile": 7}).objfile is None


@pytest.mark.parametrize("order", ["sorted", "unsorted", "overlapping", "empty-one"])
def test_find_mapping_finds_what_a_scan_in_order_finds(order):
    # GIVEN mappings as a core has them (sorted, apart, with gaps), or not: unsorted, overlapping, an empty one
    m = [Mapping(start=0x1000 * i, end=0x1000 * i + 0x800, offset=0, perms="r--p", path=f"/m{i}") for i in range(1, 9)]
    if order == "unsorted":
        m = m[4:] + m[:4]
    elif order == "overlapping":
        m.insert(3, Mapping(start=0x2400, end=0x5400, offset=0, perms="r--p", path="/wide"))
    elif order == "empty-one":
        m.insert(2, Mapping(start=0x3000, end=0x3000, offset=0, perms="r--p", path="/empty"))
    core = make_core(mappings=m)
    other = make_core(mappings=m[::-1])  # another core in between: its own index
    # WHEN every address around every mapping is looked up, in both cores alternately
    for addr in sorted({a for x in m for a in (x.start - 1, x.start, x.end - 1, x.end, x.start + 0x900)}):
        for c in (core, other):
            # THEN each finds the first mapping in its order that holds the address, or none
            assert c.find_mapping(addr) is next((x for x in c.mappings if x.start <= addr < x.end), None), hex(addr)


def test_threads_sharing_frames_give_the_document_and_text_of_frames_apart():
    # GIVEN threads stopped at the same pcs, their native frames one tuple of records (as the unwinder shares
    # them), a secret in a frame's name and in one thread's name; and the same threads with frames of their own
    from dataclasses import replace

    from forensics.output import to_jsonable
    from forensics.redact import redact_lines

    a = _analysis()
    crashed = a.snapshot.threads[0]
    frames = (nf(0, "poll_api_key_s3cr3tvalue9"), nf(1, "_PyEval_EvalFrameDefault", "/x/libpython3.12.so"))
    waiting = [replace(crashed, tid=100 + i, is_crashed=False, name=f"w{i}", native_frames=frames) for i in range(3)]
    waiting[1] = replace(waiting[1], name="token=s3cr3tvalue9")
    shared = replace(a, snapshot=replace(a.snapshot, threads=(crashed, *waiting)))
    apart = replace(a, snapshot=replace(a.snapshot, threads=(crashed, *(
        replace(t, native_frames=tuple(replace(f) for f in t.native_frames)) for t in waiting))))
    assert shared.snapshot.threads[1].native_frames is shared.snapshot.threads[2].native_frames
    assert apart.snapshot.threads[1].native_frames[0] is not apart.snapshot.threads[2].native_frames[0]
    # WHEN each is rendered as the JSON document and as redacted text
    docs = [json_document("analyze", {"analysis": analysis_payload(x, merged=True)}) for x in (shared, apart)]
    texts = [list(redact_lines(format_analysis(x, merged=True), analysis_payload(x, merged=True)))
             for x in (shared, apart)]
    # THEN both are the same, and the same as without sharing JSON values at all
    assert docs[0] == docs[1]
    assert texts[0] == texts[1]
    plain = to_jsonable(shared)
    assert to_jsonable(shared, shared=(NativeFrame,)) == plain
    payload = analysis_payload(shared, merged=True)
    t_json = payload["snapshot"]["threads"]
    assert t_json[1]["native_frames"][0] is t_json[2]["native_frames"][0]
    assert "s3cr3tvalue9" not in docs[0] and not any("s3cr3tvalue9" in line for line in texts[0])
    # and the text learns from the document without its merged view (analyze's text path) what it learns with it
    assert list(redact_lines(format_analysis(shared, merged=True), analysis_payload(shared))) == texts[0]


def test_merge_frames_of_threads_sharing_a_native_stack():
    # GIVEN threads stopped at the same pcs (one tuple of native frames), with Python stacks of their own, merged
    # between many other stacks (more than the places merge_frames remembers)
    frames = (nf(0, "wait"), nf(1, "_PyEval_EvalFrameDefault", "/x/libpython3.12.so"), nf(2, "main"))
    a = Thread(tid=1, name=None, is_crashed=False, holds_gil=False, native_frames=frames,
               py_frames=(PyFrame(function="f", file="a.py", line=1),))
    b = Thread(tid=2, name=None, is_crashed=False, holds_gil=False, native_frames=frames, py_frames=())
    others = [Thread(tid=9, name=None, is_crashed=False, holds_gil=False, native_frames=(nf(0, f"s{i}"),),
                     py_frames=()) for i in range(300)]
    # WHEN each is merged, before and after the others
    first = [[(k, getattr(f, "symbol", None) or f.function) for k, f in merge_frames(t)] for t in (a, b)]
    for t in others:
        list(merge_frames(t))
    again = [[(k, getattr(f, "symbol", None) or f.function) for k, f in merge_frames(t)] for t in (b, a)][::-1]
    # THEN each thread's Python frames stand in its own evaluation loop's place, or the loop is shown
    assert first == again == [
        [(FrameKind.NATIVE, "wait"), (FrameKind.PYTHON, "f"), (FrameKind.NATIVE, "main")],
        [(FrameKind.NATIVE, "wait"), (FrameKind.NATIVE, "_PyEval_EvalFrameDefault"), (FrameKind.NATIVE, "main")],
    ]


def test_a_batch_counts_its_bugs_and_the_previous_definitions_fingerprints():
    # GIVEN three cores of one bug whose previous fingerprints differ (two interpreters' names), one of another
    from dataclasses import replace

    from forensics.analyze.batch import group_entries
    from forensics.model import BatchEntry

    a, other = _analysis(), _analysis(abort="free(): invalid next size (normal)")
    entries = [BatchEntry(path=f"/c/{i}", mtime=float(i), error=None, analysis=replace(a, fingerprint_v3=v3))
               for i, v3 in enumerate(["old-311", "old-310", "old-311"])]
    entries.append(BatchEntry(path="/c/x", mtime=9.0, error=None, analysis=replace(other, fingerprint_v3="old-x")))
    # WHEN they are folded
    result = group_entries(entries)
    # THEN two bugs, which the previous definition split into three fingerprints; each group names its old keys
    assert (result.bugs, result.fingerprints_v3) == (2, 3)
    assert [g.fingerprints_v3 for g in result.groups] == [("old-310", "old-311"), ("old-x",)]
    head = list(format_batch(result))[:2]
    assert head[1] == ("Found 2 bugs (distinct fingerprints); the previous fingerprint definition gives them "
                       "3 fingerprints (fingerprint_v3)")
    # and one of each is said in the singular
    one = group_entries(entries[3:])
    assert list(format_batch(one))[:2] == [
        "1 input: 1 core analyzed (0 partial), 1 distinct crash, 0 unreadable, 0 files skipped (not cores)",
        "Found 1 bug (distinct fingerprints); the previous fingerprint definition gives them 1 fingerprint "
        "(fingerprint_v3)"]
