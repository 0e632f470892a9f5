"""The bundle's records read back what the core handler writes, unchanged, and never trust what they read."""
from __future__ import annotations

import copy
import json
import os

from forensics.bundle.record import (SHORTENED, BudgetEvent, CoreState, CrashRecord, IndexEntry, RecordState,
                                     parse_index_line)

# the record as the core handler writes it when it is done (keys and values of a real crash's metadata.json)
DONE = {
    "schema_version": 1, "crash_id": "20261201T120000Z-4242-SIGSEGV", "pid": 4242, "tid": 4243, "signal": 11,
    "signal_name": "SIGSEGV", "time": 1795000000.0, "rlimit_core": None, "node": "node-a", "image_key": "exe:ab12",
    "identity": {"pod_uid": "u-1", "container_id": "c" * 64, "runtime": "containerd", "qos_class": None},
    "state": "done", "crash_loop_key": "0123456789ab",
    "crash_pc": {"signal": 11, "pc": 4198400, "module": "/usr/bin/crasher", "module_offset": 4096},
    "objects": {"/usr/bin/crasher": "ab12", "/lib/libc.so.6": "cd34"}, "debug_files": {},
    "config": {"max_core_size": 34359738368, "budget": 0, "min_free": 1073741824, "loop_limit": 5,
               "loop_window": 3600, "level": 1, "threads": 1, "object_grace": 3600, "smi_timeout": 15},
    "warnings": ["argument: ignored"],
    "core": {"state": "kept", "file": "core.zst", "bytes_in": 1 << 20, "bytes_kept": 1 << 20,
             "bytes_compressed": 12345, "sha256_compressed": "f" * 64, "reasons": [],
             "stream": {"kind": "core", "bytes": 1 << 20, "expected_bytes": 1 << 20, "reason": None}},
}


def test_the_handlers_records_read_back_unchanged():
    # GIVEN the first record (before the core streams in) and the last one
    first = {k: v for k, v in DONE.items() if k not in ("crash_loop_key", "crash_pc", "debug_files")}
    first.update(state="in-progress", core={"state": "pending"}, objects={})
    for doc in (first, DONE):
        # WHEN read into a record THEN it writes the same document back
        rec = CrashRecord.from_json(copy.deepcopy(doc))
        assert rec is not None and rec.to_json() == doc
    rec = CrashRecord.from_json(DONE)
    assert rec.state is RecordState.DONE and rec.core.state is CoreState.KEPT and rec.core.state.has_core
    assert rec.pod_uid == "u-1" and rec.loop_key == "0123456789ab"


def test_a_key_this_version_does_not_know_is_kept():
    doc = {**DONE, "fingerprint": "old-name", "core": {**DONE["core"], "state": "frozen-in-amber", "x": 1}}
    rec = CrashRecord.from_json(doc)
    assert rec.core.state is None and rec.core.state_name == "frozen-in-amber"
    assert rec.to_json() == doc


def test_hostile_values_read_as_absent():
    rec = CrashRecord.from_json({"pid": "1; rm", "time": True, "objects": {"/x": 3, "/y": "k"}, "core": ["kept"],
                                 "warnings": "one", "state": {"a": 1}})
    assert rec is not None and rec.pid is None and rec.time is None and rec.objects == {"/y": "k"}
    assert rec.core.state is None and rec.warnings == () and rec.state is None
    assert CrashRecord.from_json([1, 2]) is None


def test_a_core_shortened_for_the_metadata_is_partial_once():
    core = CrashRecord.from_json(DONE).core.shortened(100).shortened(50)
    assert core.state is CoreState.PARTIAL and core.file == "core.partial.zst" and core.bytes_compressed == 50
    assert core.sha256_compressed is None and core.reasons == (SHORTENED,)


def test_index_lines_read_as_their_records():
    entry = {"id": "c1", "time": 1.0, "pid": 7, "signal": 6, "key": "img", "crash_loop_key": "k", "core": "core.zst",
             "state": "kept", "reasons": [], "pod_uid": None, "container_id": None}
    assert parse_index_line(entry).to_json() == entry
    # an index written before the crash-loop key was named for what it is
    assert parse_index_line({"id": "c0", "fingerprint": "k0"}).crash_loop_key == "k0"
    event = {"event": "budget", "deleted": ["c1"], "objects_deleted": 2, "time": 3.0, "not_deleted": ["c2: busy"]}
    assert isinstance(parse_index_line(event), BudgetEvent) and parse_index_line(event).to_json() == event
    assert parse_index_line({"id": ""}) is None and parse_index_line("x") is None
    assert isinstance(IndexEntry.from_json(entry), IndexEntry)


def test_the_budget_says_a_deleted_core_in_its_record_and_keeps_the_rest(tmp_path):
    from forensics.capture.budget import append_index, enforce_budget

    # GIVEN two crashes of one crash loop, the older's record holding a key this version does not know
    for cid in ("old", "new"):
        d = tmp_path / "crashes" / cid
        (d / "50-core").mkdir(parents=True)
        (d / "50-core/core.zst").write_bytes(os.urandom(1 << 20))
        (d / "metadata.json").write_text(json.dumps({**DONE, "crash_id": cid, "future": [1]}))
        append_index(str(tmp_path), IndexEntry.from_json({"id": cid, "core": "core.zst", "crash_loop_key": "k"}))
    # WHEN the budget leaves room for one core
    assert enforce_budget(str(tmp_path), 3 << 19) == ["old"]
    # THEN the older record says its core went for the budget, and holds everything else it held
    old = json.loads((tmp_path / "crashes/old/metadata.json").read_text())
    deleted_at = old["core"].pop("deleted_at")
    assert isinstance(deleted_at, float)
    assert old == {**DONE, "crash_id": "old", "future": [1], "core": {**DONE["core"], "state": "deleted-for-budget"}}


def test_the_agent_leaves_a_crash_the_handler_is_still_writing(tmp_path):
    """The agent analyzed a crash whose record said in-progress (its core still streaming in): it looked for
    the word in the core's state, where the record's own state holds it."""
    import sys

    from forensics.agent.serve import Agent, ServeConfig

    # GIVEN a crash whose handler wrote its first record only, and an "analyzer" that leaves a mark
    first = {**DONE, "state": "in-progress", "core": {"state": "pending"}}
    (tmp_path / "crashes/c1").mkdir(parents=True)
    (tmp_path / "crashes/c1/metadata.json").write_text(json.dumps(first))
    mark = tmp_path / "analyzed"
    cfg = ServeConfig(core_dir=str(tmp_path), node="n", events=False, sandbox_uid=None,  # a mark in tmp_path
                      analyze_argv=[sys.executable, "-c", f"open({str(mark)!r}, 'w')"])
    # WHEN the agent takes a step THEN the crash counts as pending, and is not analyzed yet
    agent = Agent(cfg)
    assert agent.step() is False and not mark.exists()
    assert agent.index.as_document()["pending"] == 1
    # and once the handler is done, it is
    (tmp_path / "crashes/c1/metadata.json").write_text(json.dumps(DONE))
    assert agent.step() is True and mark.exists()


def test_each_writers_identity_reads_back_unchanged():
    from forensics.bundle.record import Identity

    crash = {"crash_id": "c1", "node": "n", "pid": 7, "tid": 8, "signal": "SIGSEGV", "time": 1.5, "comm": "python3",
             "exe": "/usr/bin/python3", "image": None, "pod_uid": None, "container_id": None, "runtime": None}
    capture = {"kind": "capture", "node": "n", "pid": 7, "captured_at": 2.0, "comm": "x", "exe": "/x",
               "pod_uid": "u", "container_id": "c", "runtime": "containerd", "qos_class": "Burstable",
               "image": "img", "core_dir": "/cores"}
    waiting = {"kind": "capture-waiting", "node": "n", "captured_at": 2.0, "pod_uid": "u", "core_dir": "/cores"}
    for doc in (crash, capture, waiting):
        assert Identity.from_json(doc).to_json() == doc
    # capture --pod adds the pod's side to the node's (or to nothing, when the node sent none)
    pod_side = dict(pod="p", namespace="ns", pod_uid="u2", owners=({"kind": "Job", "name": "j"},), node_uid="nu",
                    node="node-b", container="main", container_id="c2", agent_pod="agent-1")
    merged = Identity.from_json(waiting).with_pod(**pod_side).to_json()
    assert merged == {**waiting, **pod_side, "owners": [{"kind": "Job", "name": "j"}]}
    assert Identity.from_json(merged).to_json() == merged
    assert Identity(kind=None).with_pod(**pod_side).to_json() == {**pod_side, "owners": [{"kind": "Job", "name": "j"}]}
