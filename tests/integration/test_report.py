"""`forensics report` from real evidence: a real crash core's analysis with planted secrets."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK
from forensics.report.markdown import check_markdown
from tests.crashers.make_core import make_core
from tests.conftest import PYTHONS

SECRET = "ghp_" + "Z" * 36
HOSTILE_NAME = f"server `` ``` </details> | GITHUB_TOKEN={SECRET} on gpu-node-17.cluster.example.com 10.20.30.40"


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def evidence(tmp_path_factory, core_pattern, newest_python):
    # GIVEN a real crash whose sleeping thread carries a hostile name with a token, a host and an IP
    d = tmp_path_factory.mktemp("report")
    core = make_core(d, PYTHONS[newest_python], "heap-prev", env={"EXPORTER_THREAD_NAME": HOSTILE_NAME})
    out = d / "analysis.json"
    r = run("analyze", "--json", "-o", str(out), str(core))
    assert r.exit_code == EXIT_OK, r.stderr
    assert SECRET.encode() in core.read_bytes()  # the evidence really holds the secret
    assert SECRET not in out.read_text()  # and analyze --json masks it already (#33)
    return d, out


def test_runbook_first_seen_is_the_core_write_time(evidence):
    import datetime as dt
    import os

    _, analysis = evidence
    core = json.loads(analysis.read_text())["analysis"]["snapshot"]["core"]
    assert core["mtime"] == os.stat(core["path"]).st_mtime
    md = run("report", "--template", "runbook", str(analysis)).stdout
    first = next(line for line in md.splitlines() if line.startswith("| First seen"))
    when = dt.datetime.fromtimestamp(core["mtime"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert when in first and "the core file's write time" in first


def md_tokens(md: str):
    return MarkdownIt("commonmark").enable("table").parse(md)


def report_json(*args) -> dict:
    r = run("report", "--json", *args)
    assert r.exit_code in (EXIT_OK, EXIT_FINDINGS), r.stderr
    return json.loads(r.stdout)["report"]


def everything(doc: dict) -> str:
    """A report's body, front matter and every attachment, as one text."""
    return doc["markdown"] + "".join(doc["attachments"].values())


@pytest.mark.parametrize("template", ["nvitop", "nvml", "runbook"])
def test_report_is_true_to_the_evidence_and_secret_free(evidence, template):
    d, analysis = evidence
    doc = json.loads(analysis.read_text())["analysis"]
    # WHEN a report is written from it
    r = run("report", "--template", template, str(analysis))
    assert r.exit_code == EXIT_OK, r.stderr
    md = r.stdout
    rep = report_json("--template", template, str(analysis))
    # THEN the planted secret is nowhere, not in an attachment either, and the report says what it replaced
    assert SECRET not in md and SECRET not in everything(rep)
    assert "[REDACTED]" in everything(rep)
    assert "Replaced in the evidence before this report was written: secrets: " in md.replace("\\", "")
    assert re.search(r"\d+ access tokens?", md)
    # and it carries the facts: the abort, the crashing frames, the Python stack read from the core (labelled so)
    if template == "runbook":
        assert "| Failure signature |" in md and "OPEN: not determined yet" in md and doc["fingerprint"] in md
    else:
        assert doc["fingerprint"] not in md  # internal words stay out of upstream reports
        assert "double free or corruption (!prev)" in md.replace("\\", "")
        assert "query_nvlink_throughput_counters" in md.replace("\\", "")
        assert "malloc_printerr" in md.replace("\\", "")
    assert "Traceback (most recent call last)" not in md and "read from the core file" in md
    # and the Markdown is well-formed: our checker and a real parser agree on its structure
    assert check_markdown(rep["body"]) == []
    tokens = md_tokens(rep["body"])
    fences = [t for t in tokens if t.type == "fence"]
    assert fences, "stacks are in fenced blocks"
    # the hostile thread name (in the stacks attachment) never closed a fence
    assert not any(t.type == "fence" and "## " in t.content for t in tokens)
    if template != "nvitop":
        assert any(t.type == "table_open" for t in tokens)


def test_hosts_are_replaced_consistently(evidence):
    _, analysis = evidence
    rep = report_json("--redact-hosts", str(analysis))
    text = everything(rep)
    assert "gpu-node-17.cluster.example.com" not in text and "10.20.30.40" not in text
    assert "host-1" in text and "ip-1" in text
    # the same host gets the same alias wherever it appears
    assert "host-2" not in text
    # the upstream reports replace hosts by default; the runbook keeps them unless asked
    assert "gpu-node-17.cluster.example.com" not in everything(report_json(str(analysis)))
    assert ("gpu-node-17.cluster.example.com"
            in report_json("--template", "runbook", str(analysis))["markdown"].replace("\\", "")
            or "gpu-node-17.cluster.example.com" in everything(report_json("--template", "runbook", str(analysis))))


def test_check_reports_unfilled_fields_and_json(evidence):
    _, analysis = evidence
    r = run("report", "--check", "--json", "--template", "runbook", str(analysis))
    # the evidence has no capture (who was affected is not known): --check says so and exits 3
    assert r.exit_code == EXIT_FINDINGS
    doc = json.loads(r.stdout)
    assert doc["command"] == "report"
    assert "affected" in doc["report"]["missing_fields"]
    assert any("affected" in p for p in doc["report"]["problems"])
    assert SECRET not in r.stdout


def test_no_known_issue_for_a_crash_of_another_class(evidence):
    """A heap-corruption abort in the main thread is not nvitop's exit-time race (a SIGSEGV in a
    non-main thread while exiting), and glibc's advice is not a 'known issue' of every abort."""
    _, analysis = evidence
    rep = report_json(str(analysis))
    assert rep["known_issues"] == []
    assert "Known issues" not in rep["body"] and "nvmlShutdown" not in rep["body"]


def test_bad_evidence_is_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"command": "something-else"}')
    r = run("report", str(p))
    assert r.exit_code == 1 and "unknown document kind" in r.stderr and "Traceback" not in r.stderr
    p.write_text("not json")
    r = run("report", str(p))
    assert r.exit_code == 1 and "not JSON" in r.stderr


@pytest.mark.parametrize("lie", ["analysis-a-list", "threads-a-string", "heap-bytes-not-hex"])
def test_evidence_of_the_right_kind_with_wrong_values_is_one_line(evidence, tmp_path, lie):
    # GIVEN a real analysis document rewritten to lie in one value (valid JSON, the right kind)
    _, analysis = evidence
    doc = json.loads(analysis.read_text())
    if lie == "analysis-a-list":
        doc["analysis"] = [1, 2]
    elif lie == "threads-a-string":
        doc["analysis"]["snapshot"]["threads"] = "x"
    else:
        doc["analysis"]["heap"] = {"corruption": {"rejected": {"address": 1, "size": 32},
                                                  "overflow": {"length": 8, "first_bytes": "zz"}}}
    bad = tmp_path / "lying.json"
    bad.write_text(json.dumps(doc))
    # WHEN a report is made from it
    r = run("report", "--template", "nvml", str(bad))
    # THEN one clear line naming the input, exit 1 -- never an internal error
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if lie == "analysis-a-list":  # nothing of it can be read: refused
        assert r.exit_code == 1 and "not report evidence" in r.stderr and str(bad) in r.stderr, r.stderr
    else:  # the lying value is left out (the report says less), or the input is refused in one line
        assert r.exit_code == 0 or (r.exit_code == 1 and "not report evidence" in r.stderr), r.stderr


def test_many_threads_go_to_the_attachment_not_the_body(evidence, tmp_path):
    # GIVEN an analysis with 300 more threads
    _, analysis = evidence
    doc = json.loads(analysis.read_text())
    t = doc["analysis"]["snapshot"]["threads"][1]
    doc["analysis"]["snapshot"]["threads"] += [dict(t, tid=100000 + i) for i in range(300)]
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    out = tmp_path / "report.md"
    # WHEN the report is written to a file
    r = run("report", "--template", "nvml", "-o", str(out), str(big))
    assert r.exit_code == EXIT_OK, r.stderr
    # THEN the body stays small and every thread is in crash-stacks.txt beside it
    body = out.read_text()
    assert len(body) < 20_000 and check_markdown(body) == []
    stacks = (tmp_path / "report.files" / "crash-stacks.txt").read_text()
    assert "(tid 100299)" in stacks and stacks.count("\nThread ") >= 300
    assert "report.files/crash-stacks.txt" in body


def test_body_only_is_what_gh_issue_create_body_file_pastes(evidence, tmp_path):
    # GIVEN the report written whole, and the same with --body-only
    _, analysis = evidence
    whole, body = tmp_path / "report.md", tmp_path / "body.md"
    assert run("report", "-o", str(whole), str(analysis)).exit_code == EXIT_OK
    r = run("report", "--body-only", "-o", str(body), str(analysis))
    assert r.exit_code == EXIT_OK, r.stderr
    # THEN the body file has no YAML front matter: it is the report's body, and the title is said apart
    text, full = body.read_text(), whole.read_text()
    assert not text.startswith("---") and full.startswith("---\n")
    assert full.endswith(text) and len(text) < len(full)
    title = next(line for line in full.splitlines() if line.startswith("title: "))
    assert "forensics: title: " in r.stderr and "title: " not in text.split("\n", 1)[0]
    assert title.split(": ", 1)[1].strip("'\"")[:20] in r.stderr
    # and printed to stdout the same
    assert run("report", "--body-only", str(analysis)).stdout == text


# Secrets planted where capture does not mask them: separate argv items, NAME forms and a header capture's
# rules missed, a thread name, and the bundle's text files.  Each must be in the raw evidence and in no report.
TOKEN = "tok3n-9f8e7d6c5b"
DB_PW = "dbp4ss-7a6b5c"
CURL_PW = "curlpw-4d3c2b"
BASIC = "YWRtaW46c2VjcmV0LWJhc2ljLXB3"
NV_KEY = "nv-secret-123456"
PLANTED = (TOKEN, DB_PW, CURL_PW, BASIC, NV_KEY)


def test_report_from_a_real_capture_and_its_core(tmp_path, core_pattern, newest_python):
    # GIVEN a live exporter-shaped process with secrets in its environment, arguments and thread name, captured
    import os
    import resource
    import subprocess
    import time

    from tests.crashers.make_core import EXPORTER, build_libcrash

    lib = build_libcrash(tmp_path)
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    env = {**os.environ, "NVIDIA_API_KEY": NV_KEY, "EXPORTER_THREAD_NAME": f"metrics-{TOKEN}"}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # exporter.py ignores arguments after the FIFO: they are there for the core's and /proc's command line
    argv = [PYTHONS[newest_python], str(EXPORTER), str(lib), "segv", str(fifo),
            "--token", TOKEN, f"DB_PASS={DB_PW}", "-u", f"admin:{CURL_PW}", f"Authorization: Basic {BASIC}"]
    proc = subprocess.Popen(argv, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, resource.RLIM_INFINITY)))
    try:
        # the sample blocks opening the FIFO until we read it, then crashes: capture it before that.
        # It starts with cores off (RLIMIT_CORE 0): capture is what turns them on.
        time.sleep(0.5)
        r = CliRunner().invoke(cli, ["capture", "--pid", str(proc.pid), "--core-dir", str(tmp_path / "cores"),
                                     "-o", str(tmp_path / "bundles"), "--json"], catch_exceptions=False)
        assert r.exit_code in (0, 4), r.output
        with open(fifo) as f:
            assert f.read().strip() == "ready"
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (bundle,) = [p for p in (tmp_path / "bundles").iterdir() if p.is_dir()]
    # the node's text files in the bundle: a kernel log line that names the key, nvidia-smi text that does not
    # (the process's own values -- TOKEN -- are masked in the node's text by capture itself, and in the analysis by
    # analyze --json: no report input names them any more, so none is planted here unmasked)
    kernel = bundle / "30-kernel"
    kernel.mkdir(exist_ok=True)
    (kernel / "kernel-nvidia.log").write_text(f"NVRM: Xid 79, pid=4242, exporter NVIDIA_API_KEY={NV_KEY}\n")
    (kernel / "nvidia-smi.txt").write_text(
        f"Driver Version : 580.126.09\n    Process ID : 4242\n        Name : python {NV_KEY}\n")
    core = next(run_dir.glob("core*"))  # written only because capture raised the limit from 0
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(core)).exit_code == 0
    raw = core.read_bytes().decode("latin-1") + "".join(p.read_text(errors="replace") for p in bundle.rglob("*")
                                                         if p.suffix in (".json", ".log", ".txt"))
    for secret in PLANTED:
        assert secret in raw, f"{secret} is not in the raw evidence: the test would prove nothing"
    # WHEN reports are made from the bundle and the analysis, with every template, as Markdown and as JSON
    outputs = {}
    for template in ("nvitop", "nvml", "runbook"):
        for extra in ((), ("--redact-hosts",), ("--json",)):
            r = run("report", "--template", template, *extra, str(bundle), str(analysis))
            assert r.exit_code == 0, r.stderr
            outputs[(template, *extra)] = r.stdout
    # THEN no planted secret is anywhere, and the reports say what was redacted
    for key, out in outputs.items():
        leaked = [s for s in PLANTED if s in out]
        assert not leaked, f"{key}: {leaked}"
    for template in ("nvitop", "nvml", "runbook"):
        doc = json.loads(outputs[(template, "--json")])["report"]
        leaked = [s for s in PLANTED if s in everything(doc)]
        assert not leaked, f"{template} attachments: {leaked}"
    md = outputs[("runbook",)]
    nvitop = outputs[("nvitop",)].replace("\\", "")
    for what in ("authorization header", "user:password option", "repeated secret value"):
        assert re.search(rf"\d+ {what}s?", nvitop), what
    nvml = json.loads(outputs[("nvml", "--json")])["report"]
    smi = nvml["attachments"]["nvidia-smi-q.txt"]
    assert "Driver Version : 580.126.09" in smi and "Name : python [REDACTED]" in smi
    # the capture's files are listed with their sha256 in the runbook, and the crash is there
    assert "00-identity.json" in md and "40-process/snapshot.json" in md
    assert "SIGSEGV" in md and check_markdown(md.split("---\n", 2)[2]) == []


def _pod_bundle(parent: Path, *, node: str, pod: str, namespace: str, smi: str, scheduling: bool = True,
                last_finished: str | None = None) -> Path:
    """A pod capture bundle as `forensics capture --pod` writes it (its directory name embeds the pod name)."""
    from forensics.bundle.write import BundleWriter, new_bundle_dir
    from forensics.capture.pod import summarize_node, summarize_pod

    pod_obj = {"metadata": {"name": pod, "namespace": namespace, "uid": "0b8e-pod-uid"},
               "spec": {"nodeName": node},
               "status": {"phase": "Running", "hostIP": "10.20.30.40", "containerStatuses": [
                   {"name": "exporter", "containerID": "containerd://abc", "image": "nvitop-exporter:1.4",
                    "imageID": "registry.example.com/nvitop-exporter@sha256:" + "a" * 64, "restartCount": 3}]}}
    if last_finished:
        pod_obj["status"]["containerStatuses"][0]["lastState"] = {"terminated": {
            "exitCode": 134, "reason": "Error", "finishedAt": last_finished}}
    node_obj = {"metadata": {"name": node, "uid": "0b8e-node-uid", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/gpu.count": "8", "kubernetes.io/hostname": node}},
        "status": {"nodeInfo": {"kernelVersion": "6.8.0-45-generic"}}}
    summary, node_summary = summarize_pod(pod_obj), summarize_node(node_obj)
    w = BundleWriter(new_bundle_dir(str(parent), f"20250101T000000Z-{namespace}-{pod}"))
    w.add_json("00-identity.json", {"pod": pod, "namespace": namespace, "node": node}, "who")
    if scheduling:
        w.add_json("10-kubernetes/scheduling.json", {"pod": summary, "node": node_summary}, "scheduling")
    w.add_bytes("30-kernel/nvidia-smi.txt", smi.encode(), "nvidia-smi -q")
    w.write_manifest({"pod": f"{namespace}/{pod}"})
    return Path(w.path)


def test_runbook_dates_and_places_the_crash_from_a_pod_capture(tmp_path):
    bundle = _pod_bundle(tmp_path, node="gpu-node-17", pod="exporter-4k2lm", namespace="gpu-jobs",
                         smi="Driver Version : 580.126.09\n", last_finished="2026-11-20T10:41:07Z")
    r = run("report", "--template", "runbook", str(bundle))
    assert r.exit_code == EXIT_OK, r.stderr
    md = r.stdout.replace("\\", "")
    first = next(line for line in md.splitlines() if line.startswith("| First seen"))
    assert "2026-11-20 10:41:07 UTC" in first and "last terminated container" in first
    affected = next(line for line in md.splitlines() if line.startswith("| Affected"))
    assert "node gpu-node-17 (8 x NVIDIA-H20)" in affected
    assert "pod gpu-jobs/exporter-4k2lm (3 container restarts)" in affected


def test_pod_and_node_names_from_the_identity_alone_are_replaced(tmp_path):
    """A bundle without the Kubernetes documents still names its pod and node in 00-identity.json."""
    smi = "Driver Version : 580.126.09\nnode=gpu-node-17 pod=exporter-4k2lm\n"
    bundle = _pod_bundle(tmp_path, node="gpu-node-17", pod="exporter-4k2lm", namespace="gpu-jobs", smi=smi,
                         scheduling=False)
    doc = report_json("--template", "nvitop", "--redact-hosts", str(bundle))
    text = everything(doc)
    assert "exporter-4k2lm" not in text and "gpu-node-17" not in text
    assert "node=node-1 pod=pod-1" in doc["attachments"]["nvidia-smi-q.txt"]


def test_pod_bundle_hosts_are_replaced_as_whole_names_everywhere(tmp_path):
    # GIVEN a pod bundle from a node named "vm" (inside "nvml"), kept under a directory whose name holds a token
    token = "ghp_" + "Q" * 36
    smi = ("Driver Version : 580.126.09\nnvmlDeviceGetFieldValues failed in pynvml.py\n"
           "mount /var/lib/kubelet/pods/exporter-7x9k2/volumes on node=vm, vm: ok\n"
           "PASSWORD=\"two words\" --api-key 'k3y k3y'\n")
    parent = tmp_path / f"upload-{token}"
    bundle = _pod_bundle(parent, node="vm", pod="exporter-7x9k2", namespace="gpu-jobs", smi=smi)
    assert "exporter-7x9k2" in bundle.name and token in str(bundle)
    # WHEN a runbook is made with --redact-hosts (it lists the evidence paths)
    doc = report_json("--template", "runbook", "--redact-hosts", str(bundle))
    md = doc["markdown"].replace("\\", "")
    # THEN the pod and node are gone from the evidence table, as whole names
    assert "exporter-7x9k2" not in md and token not in md
    assert "20250101T000000Z-gpu-jobs-pod-1/" in md and "upload-[REDACTED]" in md
    # and from the nvidia-smi text of the NVIDIA report, whose identifiers merely containing "vm" are intact
    smi_out = report_json("--template", "nvml", str(bundle))["attachments"]["nvidia-smi-q.txt"]
    assert "mount <local>/volumes on node=node-1, node-1: ok" in smi_out and "exporter-7x9k2" not in smi_out
    assert not re.search(r"(?<![A-Za-z0-9_.])vm(?![A-Za-z0-9_])", smi_out)
    assert "nvmlDeviceGetFieldValues failed in pynvml.py" in smi_out and "nnode" not in smi_out
    assert "two words" not in smi_out and "k3y k3y" not in smi_out
    # WHEN the runbook is made without --redact-hosts THEN hosts stay, and secrets still go (the path too)
    r = run("report", "--template", "runbook", "--json", str(bundle))
    assert r.exit_code == EXIT_OK, r.stderr
    assert "exporter-7x9k2" in r.stdout and token not in r.stdout and "two words" not in r.stdout
