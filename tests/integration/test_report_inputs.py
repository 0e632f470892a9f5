"""`forensics report` on the demo's real evidence (reports/demo: a capture bundle, analyze, verify-imports and
reproduce documents), changed the way a hostile or damaged input would be: what reaches the output is
escaped once (stdout and files the same), keys as well as values; hashes are of what was verified; the
inputs' total is bounded."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
TOKEN = "ghp_" + "Q" * 36


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, env=env)


def demo_bundle(tmp_path: Path, files: dict[str, bytes] | None = None) -> Path:
    """A copy of the demo's capture bundle with ``files`` written into it and its manifest made to say so."""
    src = next((DEMO / "capture").iterdir())
    bundle = tmp_path / src.name
    shutil.copytree(src, bundle)
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    for rel, data in (files or {}).items():
        (bundle / rel).parent.mkdir(parents=True, exist_ok=True)
        (bundle / rel).write_bytes(data)
        manifest["items"] = [i for i in manifest["items"] if i["path"] != rel] + [
            {"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "what": "test"}]
    (bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    return bundle


SMI = (b"Driver Version : 580.126.09\nCUDA Version : 13.0\n\nGPU 00000000:18:00.0\n"
       b"    Product Name : NVIDIA\tH20 \x1b[2Jx\n    Persistence Mode : Enabled\n")


def test_stdout_and_the_report_file_are_the_same_text_escaped_once(tmp_path):
    # GIVEN a bundle whose nvidia-smi -q has a tab and an ESC in the GPU's product name
    bundle = demo_bundle(tmp_path, {"30-kernel/nvidia-smi.txt": SMI})
    # WHEN the nvitop issue is printed, and written with -o
    printed = run("report", bundle)
    assert printed.exit_code == EXIT_OK, printed.output
    out = tmp_path / "r.md"
    assert run("report", bundle, "-o", out).exit_code == EXIT_OK
    written = out.read_text()
    # THEN the line is the same in both: the tab kept (a text), the ESC escaped once, nothing escaped twice
    line = next(x for x in printed.stdout.splitlines() if "H20" in x)
    assert "NVIDIA\tH20 \\x1b[2Jx" in line
    assert line in written.splitlines()
    assert "\\x09" not in printed.stdout and "\\\\x1b" not in printed.stdout
    body = printed.stdout.split("\n---\n", 1)[1]
    assert body == written.split("\n---\n", 1)[1]  # the front matter names the attachments' folder


def test_dict_keys_are_escaped_and_redacted_like_values(tmp_path):
    # GIVEN the demo's reproduce document whose C run's environment has a key with control characters and a
    # key that is a token
    doc = json.loads((DEMO / "reproduce.json").read_text())
    env = doc["reproduce"]["runs"][0]["environment"]
    env["evil\x1b]0;owned\x07\r\nVERDICT: forged"] = "x"
    env[f"auth {TOKEN}"] = "y"
    repro = tmp_path / "reproduce.json"
    repro.write_text(json.dumps(doc))
    out = tmp_path / "r.md"
    # WHEN the NVIDIA report is written with its attachments
    r = run("report", "--template", "nvml", DEMO / "analysis.json", repro, "-o", out)
    assert r.exit_code == EXIT_OK, r.output
    text = (tmp_path / "r.files" / "reproducer-output.txt").read_text()
    # THEN the key is one line with its controls escaped, and the token is masked
    assert "evil\\x1b]0;owned\\x07\\x0d\\x0aVERDICT: forged: x" in text
    assert "\x1b" not in text and "\nVERDICT: forged" not in text
    assert TOKEN not in text and "auth [REDACTED]: y" in text
    assert TOKEN not in out.read_text()


def test_nvidia_smi_is_parsed_once_into_the_facts(tmp_path):
    # GIVEN a bundle with nvidia-smi -q
    from forensics.report.evidence import load_evidence
    from forensics.report.facts import read_facts

    bundle = demo_bundle(tmp_path, {"30-kernel/nvidia-smi.txt": SMI})
    # WHEN its facts are read
    facts = read_facts(load_evidence([str(bundle)]))
    # THEN they carry nvidia-smi -q parsed (what the nvml report's system facts and the nvitop excerpt both use)
    assert facts.smi.driver_version == "580.126.09"
    assert [g.bus_id for g in facts.smi.gpus] == ["00000000:18:00.0"]
    assert facts.smi.gpus[0].persistence_mode == "Enabled"


def test_a_bundle_that_does_not_match_its_manifest_is_said_so_and_no_unverified_hash_is_stated(tmp_path):
    # GIVEN the demo's bundle with one file changed and one removed after its manifest was written
    bundle = demo_bundle(tmp_path)
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    stated = {i["path"]: i["sha256"] for i in manifest["items"]}
    (bundle / "40-process" / "cgroup").write_text("0::/tampered\n")
    (bundle / "40-process" / "limits").unlink()
    # WHEN the runbook is made and checked
    r = run("report", "--template", "runbook", "--check", bundle)
    # THEN it says which files do not match, states no hash for them, and --check exits 3
    assert r.exit_code == EXIT_FINDINGS, r.output
    assert "2 file(s) do not match its MANIFEST.json: 40-process/cgroup: changed; 40-process/limits: missing" \
        in r.stderr
    rows = {name: next(x for x in r.stdout.splitlines() if x.startswith("| ") and f"/40-process/{name} |" in x)
            for name in ("cgroup", "limits")}
    assert stated["40-process/cgroup"] not in r.stdout
    assert "**changed: does not match the bundle's manifest**" in rows["cgroup"]
    assert "**missing: does not match the bundle's manifest**" in rows["limits"]
    assert "A capture bundle does not match its manifest" in r.stdout
    # every hash it states is the hash of the file as it is
    for rel in ("00-identity.json", "40-process/maps", "40-process/status"):
        assert hashlib.sha256((bundle / rel).read_bytes()).hexdigest() in r.stdout


@pytest.mark.parametrize("template", ["nvml", "nvitop"])
def test_an_upstream_report_from_a_bundle_that_does_not_match_its_manifest_says_so_in_its_body(tmp_path, template):
    """The upstream reports have no evidence table: their reader (NVIDIA, nvitop's maintainer) learns it from the
    body, right under the conclusion, not only from our stderr."""
    bundle = demo_bundle(tmp_path)
    (bundle / "40-process" / "cgroup").write_text("0::/tampered\n")
    r = run("report", "--template", template, bundle)
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    i = next(n for n, x in enumerate(lines) if "does not match its capture manifest" in x)
    assert "1 file(s) of the capture bundle changed or went missing" in lines[i]
    assert "40-process/cgroup: changed" in lines[i]
    # right after the conclusion, which stays first
    conclusion = next(x for x in r.stderr.splitlines() if x.startswith("forensics: conclusion: "))
    assert lines[i - 1][:40] == conclusion[len("forensics: conclusion: "):][:40]
    # and an intact bundle's report says nothing of the kind
    r = run("report", "--template", template, demo_bundle(tmp_path / "intact"))
    assert "capture manifest" not in r.stdout


def test_an_intact_bundle_states_its_verified_hashes(tmp_path):
    bundle = demo_bundle(tmp_path)
    r = run("report", "--template", "runbook", bundle)
    assert r.exit_code == EXIT_OK and "do not match" not in r.output
    for item in json.loads((bundle / "MANIFEST.json").read_text())["items"]:
        assert f"`{hashlib.sha256((bundle / item['path']).read_bytes()).hexdigest()}`" in r.stdout


def test_the_inputs_together_are_bounded(tmp_path):
    # GIVEN the demo's analysis and reproduce documents, each under the per-input bound
    a, rep = DEMO / "analysis.json", DEMO / "reproduce.json"
    total = a.stat().st_size + rep.stat().st_size
    # WHEN the bound on all inputs together is one byte less than they are
    r = run("report", a, rep, env={"FORENSICS_MAX_REPORT_BYTES": str(total - 1)})
    # THEN one line names the input that went past it, exit 1, no report
    assert r.exit_code == EXIT_ERROR
    assert r.stdout == ""
    assert f"{rep}: not report evidence: the report's inputs together are more than {total - 1} bytes " \
           "(FORENSICS_MAX_REPORT_BYTES)" in r.stderr
    assert "Traceback" not in r.output
    # and exactly their size is enough
    assert run("report", a, rep, env={"FORENSICS_MAX_REPORT_BYTES": str(total)}).exit_code == EXIT_OK


def test_a_bundles_files_count_towards_the_bound(tmp_path):
    bundle = demo_bundle(tmp_path)
    r = run("report", DEMO / "analysis.json", bundle,
            env={"FORENSICS_MAX_REPORT_BYTES": str((DEMO / "analysis.json").stat().st_size + 1000)})
    assert r.exit_code == EXIT_ERROR
    assert "the report's inputs together are more than" in r.stderr and str(bundle) in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # one line (and its hint)


def _snapshot(**changes) -> bytes:
    src = next((DEMO / "capture").iterdir()) / "40-process" / "snapshot.json"
    return json.dumps({**json.loads(src.read_text()), **changes}).encode()


def _read_in_part(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [x for x in stderr.splitlines() if x.startswith("forensics: check: bundle ") and ": read in part: " in x]


def test_a_bundle_document_of_the_wrong_shape_is_read_in_part_and_said_so(tmp_path):
    # GIVEN the demo's bundle whose process snapshot lists its modules in an object and says "yes" for a boolean,
    # and whose scheduling state has a node that is a list and containers that are not what capture --pod writes
    sched = {"node": ["n"], "pod": {"name": "p", "namespace": "ns",
                                    "containers": [{"restart_count": "many", "image_id": 7}, "c"]}}
    bundle = demo_bundle(tmp_path, {
        "40-process/snapshot.json": _snapshot(python={"modules": {"nvitop": 1}}, in_container_namespace="yes"),
        "10-kubernetes/scheduling.json": json.dumps(sched).encode()})
    # WHEN the runbook is made of it
    out = tmp_path / "r.md"
    r = run("report", "--template", "runbook", bundle, "-o", out)
    # THEN it is written from what could be read (the snapshot's libnvidia-ml.so and its driver version, the pod),
    # and one line says what was not read, each wrong value named by its document and field
    assert r.exit_code == EXIT_OK, r.output
    (line,) = _read_in_part(r.stderr)
    for said in ("10-kubernetes/scheduling.json: node is a list, not an object (not read)",
                 "10-kubernetes/scheduling.json: pod.containers[0].image_id is an int, not a string (not read)",
                 "10-kubernetes/scheduling.json: pod.containers[0].restart_count is a str, not a count (not read)",
                 "10-kubernetes/scheduling.json: pod.containers[1] is a str, not an object (not read)",
                 "40-process/snapshot.json: python.modules is a dict, not a list (not read)",
                 "... (6 in all)"):  # the sixth: in_container_namespace "yes"
        assert said in line, line
    report = out.read_text()
    assert "580.126.09" in report and "pod ns/p (0 container restarts)" in report


def test_a_huge_list_in_a_bundle_document_is_read_to_its_bound(tmp_path):
    # GIVEN the demo's bundle whose process snapshot lists 100,000 modules after nvitop
    from forensics.bundle.documents import MAX_ITEMS

    src = json.loads(_snapshot())
    modules = src["python"]["modules"] + [{"module": f"m{i}", "verdict": "SHADOWED"} for i in range(100_000)]
    bundle = demo_bundle(tmp_path, {"40-process/snapshot.json": _snapshot(python={**src["python"],
                                                                                  "modules": modules})})
    # WHEN the runbook is made of it
    out = tmp_path / "r.md"
    r = run("report", "--template", "runbook", bundle, "-o", out)
    # THEN the first MAX_ITEMS modules are read (the shadowed ones said, to the last one read), and the cut is
    # said in one line
    assert r.exit_code == EXIT_OK, r.output
    (line,) = _read_in_part(r.stderr)
    assert f"python.modules has {len(modules)} entries; the first {MAX_ITEMS} read" in line
    whole = (tmp_path / "r.files" / "full-report.md").read_text()  # the body is cut at GitHub's limit
    last = MAX_ITEMS - len(src["python"]["modules"]) - 1
    assert "m0: SHADOWED; " in whole and f"; m{last}: SHADOWED" in whole and f"m{last + 1}:" not in whole


def test_a_pod_bundles_events_a_list_as_capture_pod_writes_them_are_read(tmp_path):
    # GIVEN the demo's bundle with the pod's events, a JSON list as capture --pod writes 10-kubernetes/events.json
    events = [{"time": "2026-11-20T10:41:07Z", "type": "Warning", "reason": "BackOff", "count": 3,
               "message": "Back-off restarting failed container", "source": {"component": "kubelet"}}]
    bundle = demo_bundle(tmp_path, {"10-kubernetes/events.json": json.dumps(events).encode()})
    # WHEN a report is made of it
    r = run("report", "--template", "runbook", bundle)
    # THEN it is made (the bundle was refused: "a JSON document must be an object")
    assert r.exit_code == EXIT_OK, r.output
    assert not _read_in_part(r.stderr)


@pytest.mark.parametrize("rel, data", [
    ("10-kubernetes/events.json", b'{"items": []}'),  # an object where the list belongs
    ("40-process/snapshot.json", b"[" * 100_000 + b"]" * 100_000),  # nested past any parser's recursion
])
def test_a_bundle_document_that_is_not_its_kind_of_json_is_one_line(tmp_path, rel, data):
    bundle = demo_bundle(tmp_path, {rel: data})
    r = run("report", bundle)
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith(f"forensics: error: {bundle / rel}: not report evidence: "), r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr, r.stderr


def test_the_hint_names_exactly_what_report_reads(tmp_path):
    # GIVEN a report of an input that is not there, and one of canary's --json (the demo's)
    from forensics.report.evidence import KINDS

    missing = run("report", tmp_path / "nothing.json")
    canary = run("report", DEMO / "canary.json")
    # THEN the hint names analyze, verify-imports, reproduce and fleet's --json and capture bundles: what report reads
    # (analyze of a directory writes analyze-batch), and never canary
    assert missing.exit_code == EXIT_ERROR and canary.exit_code == EXIT_ERROR
    hint = missing.stderr.strip().splitlines()[-1]
    assert "canary" not in hint, hint
    named = set(hint.split("`forensics ", 1)[1].split(" --json`", 1)[0].split("|"))
    assert named == {"analyze", "verify-imports", "reproduce", "fleet"} and "capture bundle" in hint
    assert {k.removesuffix("-batch") for k in KINDS} - {"capture"} == named
    # and canary's document is refused in one line, naming its kind, with the same hint
    assert f"{DEMO / 'canary.json'}: not report evidence: unknown document kind 'canary'" in canary.stderr
    assert canary.stderr.strip().splitlines()[-1] == hint
