"""The JSON other commands write, read back into their records at the edge (#28 item 2).

``report`` reads an analysis only through :func:`forensics.format.load_analysis` (and reproduce's,
verify-imports' and fleet's documents only through their loaders): no module of the report package
picks a value out of those documents by key.  Each loader is the inverse of its payload, on the demo's
real documents (``reports/demo``), and refuses a document of another or no schema version in one line.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, ArtifactFormatError
from forensics.format import analysis_payload, load_analysis, load_batch
from forensics.model import BatchEntry, BatchGroup, BatchResult, PythonMethod
from forensics.modes import NativeMethod, StackMethod, UnwoundBy
from forensics.imports.format import load_import_report, report_payload
from forensics.output import json_document
from forensics.reproduce import load_reproduce, reproduce_payload
from tests.import_graph import PACKAGE_DIR

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
# the keys under which the documents' records lie, and fields of those records: report must not read any of them
# out of a dict (a record's attribute of that name is fine).
RECORD_KEYS = {"analysis", "crash", "heap", "threads", "native_frames", "py_frames", "signal_frames", "corruption",
               "fingerprint", "runs", "reproduce", "result", "distributions", "known_issues", "requirement_problems",
               "fleet", "boundary", "batch", "groups", "first_seen", "last_seen", "entries", "issues", "defined_by",
               "fields_any", "frames_any", "package_below", "severity"}
# a capture bundle's documents as report gathers them, and their fields: read only by forensics.bundle.documents
# (report's evidence reader, which gathers them, is the edge and not checked)
BUNDLE_KEYS = {"identity", "scheduling", "snapshot", "record", "_bundle_dir", "manifest_problems", "gpu_labels",
               "containers", "restart_count", "image_id", "last_terminated", "finished_at", "modules", "cmdline",
               "in_container_namespace", "pod_uid", "agent_pod", "hostname", "Driver Version", "Product Name",
               "nvlinks", "cuda driver", "libnvidia-ml"}


def _keyed_reads(path: Path, names: set[str] = RECORD_KEYS) -> list[str]:
    """``doc["analysis"]``, ``doc.get("crash")``, ``_get(doc, "analysis", ...)`` in a module: where it is."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get":
                keys = node.args[:1]
            elif isinstance(func, ast.Name) and func.id == "_get":
                keys = node.args[1:]
        for k in keys:
            if isinstance(k, ast.Constant) and k.value in names:
                where = path.relative_to(PACKAGE_DIR.parent) if path.is_relative_to(PACKAGE_DIR.parent) else path
                out.append(f"{where}:{node.lineno}: {k.value!r}")
    return out


def test_report_reads_the_other_commands_documents_only_through_their_loaders():
    report = PACKAGE_DIR / "report"
    found = [hit for p in sorted(report.rglob("*.py")) for hit in _keyed_reads(p)]
    assert found == [], ("read the document with load_analysis / load_batch / load_reproduce / load_import_report / "
                         "load_fleet")
    facts = (report / "facts.py").read_text()
    assert "load_analysis(" in facts and "load_reproduce(" in facts and "load_import_report(" in facts


def test_report_reads_a_bundles_documents_only_through_their_records():
    # the bundle's documents (forensics.bundle.documents), nvidia-smi -q (SmiFacts) and the reproducers' header
    # (ReproHeader): no module of the report package past its evidence reader picks their values by key
    report = PACKAGE_DIR / "report"
    found = [hit for p in sorted(report.rglob("*.py")) if p.name != "evidence.py"
             for hit in _keyed_reads(p, BUNDLE_KEYS)]
    assert found == [], "read the bundle through Evidence.captures() (CaptureDocuments)"


def test_the_bundle_key_check_sees_a_keyed_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(doc):\n    return (doc.get('scheduling') or {})['gpu_labels']\n")
    assert len(_keyed_reads(module, BUNDLE_KEYS)) == 2


@pytest.mark.parametrize("name, loader, payload, key", [
    ("analysis.json", load_analysis, analysis_payload, "analysis"),
    ("reproduce.json", load_reproduce, reproduce_payload, None),
    ("verify-imports.json", load_import_report, report_payload, "result"),
])
def test_each_loader_is_the_inverse_of_its_payload(name, loader, payload, key):
    doc = json.loads((DEMO / name).read_text())
    record = loader(doc)
    body = payload(record)
    again = json.loads(json_document(doc["command"], {key: body} if key else body))
    # the record comes back from its own document whole
    assert loader(again) == record
    # and every value the stored document holds is read (fields added since it was written take their defaults)
    assert _within(doc, again, "$") == []


def _within(old: object, new: object, where: str) -> list[str]:
    """Where ``old`` (a stored document) differs from ``new`` (written again), ignoring keys only ``new`` has."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k, v in old.items() if k != "redaction"
                for d in (_within(v, new[k], f"{where}.{k}") if k in new else [f"{where}.{k}: dropped"])]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (u, v) in enumerate(zip(old, new, strict=True)) for d in _within(u, v, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} != {new!r}"[:200]]


def _analysis_doc() -> dict:
    return json.loads((DEMO / "analysis.json").read_text())


@pytest.mark.parametrize("change, said", [
    (lambda d: d.pop("schema_version"), "it has no schema_version"),
    (lambda d: d.update(schema_version=2), "its schema_version is 2; this forensics reads 1"),
    (lambda d: d["analysis"]["crash"].update(tid="1367"), "$.analysis.crash.tid: expected int, found str"),
    (lambda d: d["analysis"]["crash"].update(kind="melted"), "$.analysis.crash.kind: 'melted' is not one of"),
    (lambda d: d["analysis"]["snapshot"].pop("threads"), "$.analysis.snapshot.threads: missing"),
    # what unwound the stacks is one of the unwinders (or their join), not any string
    (lambda d: d["analysis"]["snapshot"].update(native_method="lldb"),
     "$.analysis.snapshot.native_method: 'lldb' is not one of 'libdw', 'gdb', 'libdw+gdb', 'registers'"),
    (lambda d: d["analysis"]["snapshot"].update(native_method="gdb+libdw"),
     "$.analysis.snapshot.native_method: 'gdb+libdw' is not one of"),
    (lambda d: d["analysis"]["snapshot"]["threads"][0].update(native_method="libdw+gdb"),
     "$.analysis.snapshot.threads[0].native_method: 'libdw+gdb' is not one of 'libdw', 'gdb', 'registers'"),
])
def test_a_document_this_version_cannot_read_is_one_clear_error(change, said, tmp_path):
    doc = _analysis_doc()
    change(doc)
    with pytest.raises(ArtifactFormatError) as e:
        load_analysis(doc)
    assert said in str(e.value) and "\n" not in str(e.value)
    # and report refuses it in one line naming the file, before writing anything
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["report", str(path)])
    assert r.exit_code == EXIT_ERROR
    assert f"{path}: not report evidence: not a `forensics analyze --json` document this version reads" in r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def _batch() -> BatchResult:
    group = BatchGroup(fingerprint="f" * 16, signature="SIGABRT heap-corruption in nvmlDeviceGetFieldValues", count=3,
                       first_seen=1_700_000_000.0, last_seen=1_700_007_200.0, example="/cores/core.1",
                       paths=("/cores/core.1", "/cores/core.2", "/cores/core.3"), partial=("/cores/core.3: truncated",))
    return BatchResult(groups=(group,), failed=(BatchEntry(path="/cores/core.4", mtime=1.0, analysis=None,
                                                           error="not a core"),), total=4, skipped=("notes.txt",))


def test_an_analyze_batch_document_is_read_into_its_record(tmp_path):
    # GIVEN analyze's batch document (the record analyze --json writes for several cores)
    batch = _batch()
    doc = json.loads(json_document("analyze-batch", {"batch": batch, "cores": []}))
    # THEN load_batch gives the record back whole
    assert load_batch(doc) == batch
    # and report reads its groups through it: the batch's count and oldest core reach the runbook
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["report", "--template", "runbook", str(DEMO / "analysis.json"), str(path)])
    assert r.exit_code == 0, r.stderr
    assert "3 cores of this crash in the batch (first 2023-11-14 22:13 UTC, last 2023-11-15 00:13 UTC)" in r.stdout
    # and a batch whose values are of the wrong type is refused in one line naming the file, nothing written
    doc["batch"]["groups"][0]["count"] = "3"
    path.write_text(json.dumps(doc))
    r = CliRunner().invoke(cli, ["report", str(DEMO / "analysis.json"), str(path)])
    assert r.exit_code == EXIT_ERROR and r.stdout == "" and "Traceback" not in r.stderr
    assert f"{path}: not report evidence: not a `forensics analyze-batch --json` document this version reads" in \
        r.stderr and "$.batch.groups[0].count: expected int, found str" in r.stderr


@pytest.mark.parametrize("method, native, python, complete", [
    ("auto", "auto", "direct", False), ("direct", "auto", "direct", True), ("gdb", "none", "gdb", True),
    ("both", "libdw", "none", False),
])
def test_the_snapshots_modes_are_enums_spelled_as_before(method, native, python, complete):
    # GIVEN the demo's analysis with the modes asked and the method used set, as analyze --json writes them
    doc = _analysis_doc()
    assert load_analysis(doc).snapshot.is_complete  # as the demo wrote it
    snap = doc["analysis"]["snapshot"]
    snap.update(requested_method=method, requested_native_method=native, python_method=python,
                native_method="registers")
    # WHEN it is read back
    a = load_analysis(doc)
    # THEN each is its enum's member, is_complete compares members (program counters only is complete only when
    # no unwinder was asked for), and the JSON spells them as it did
    s = a.snapshot
    assert (s.requested_method, s.requested_native_method, s.python_method, s.native_method) == (
        StackMethod(method), NativeMethod(native), PythonMethod(python), UnwoundBy.REGISTERS)
    assert s.is_complete is complete
    again = analysis_payload(a)["snapshot"]
    assert [again[k] for k in ("requested_method", "requested_native_method", "python_method", "native_method")] == [
        method, native, python, "registers"]


@pytest.mark.parametrize("label", [m.value for m in UnwoundBy])
def test_what_unwound_the_stacks_is_read_as_its_members_and_written_as_before(label):
    # GIVEN the demo's analysis whose snapshot and threads say what unwound them, as analyze --json writes it
    doc = _analysis_doc()
    snap = doc["analysis"]["snapshot"]
    assert load_analysis(doc).snapshot.native_method is UnwoundBy.LIBDW  # as the demo wrote it
    threads = UnwoundBy(label).unwinders
    snap["native_method"] = label
    for i, t in enumerate(snap["threads"]):
        t["native_method"] = threads[i % len(threads)].value
    # WHEN it is read back
    s = load_analysis(doc).snapshot
    # THEN the snapshot's is the join's member, each thread's an unwinder, is_complete asks the member (only
    # program counters, no unwinder asked off, is incomplete), and the JSON spells them as it did
    assert s.native_method is UnwoundBy(label) and UnwoundBy.of(t.native_method for t in s.threads) is s.native_method
    assert s.is_complete is (label != "registers")
    again = analysis_payload(load_analysis(doc))["snapshot"]
    assert again["native_method"] == label and [t["native_method"] for t in again["threads"]] == [
        t["native_method"] for t in snap["threads"]]


def test_the_known_issue_files_are_read_into_records():
    from forensics.errors import ForensicsError
    from forensics.report.known import (CrashDefinition, KnownCrash, VersionFactEntry, _read_entries,
                                        load_known_crashes, load_version_facts)

    # the shipped files, whole: every entry a record, every definition's parts typed
    crashes = load_known_crashes()
    assert crashes and all(isinstance(c, KnownCrash) and isinstance(c.defined_by, CrashDefinition) for c in crashes)
    assert crashes[0].defined_by.package_below == {"nvitop": "1.7.1"} and crashes[0].defined_by.kind is None
    facts = load_version_facts()
    assert all(isinstance(v, VersionFactEntry) and v.id == k for k, v in facts.items())
    assert 251 in facts["nvidia-ml-py-12.575.51-field-ids"].fields
    # a broken entry is one error naming where, not a KeyError deep in the matching
    bad = json.dumps({"entries": [{"id": "x", "title": "t", "defined_by": {"fields_any": ["251"]}}]})
    with pytest.raises(ForensicsError) as e:
        _read_entries(bad, "entries", KnownCrash, "known_crashes.json")
    assert str(e.value) == ("known_crashes.json: the shipped file is broken: $.entries[0].defined_by.fields_any[0]: "
                            "expected int, found str")
