"""`forensics report` from real evidence: a real crash core's analysis with planted secrets."""
from __future__ import annotations

import json
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
    assert SECRET in out.read_text()  # the evidence really holds the secret
    return d, out


def md_tokens(md: str):
    return MarkdownIt("commonmark").enable("table").parse(md)


@pytest.mark.parametrize("template", ["nvitop", "nvml", "runbook"])
def test_report_is_true_to_the_evidence_and_secret_free(evidence, template):
    d, analysis = evidence
    doc = json.loads(analysis.read_text())["analysis"]
    # WHEN a report is written from it
    r = run("report", "--template", template, str(analysis))
    assert r.exit_code == EXIT_OK, r.stderr
    md = r.stdout
    # THEN the planted secret is nowhere, and the report says what it redacted
    assert SECRET not in md
    assert "[REDACTED]" in md or "\\[REDACTED\\]" in md
    assert "Redacted:" in md and "access tokens" in md
    # and it carries the facts
    assert doc["fingerprint"] in md
    if template == "runbook":
        assert "| Failure signature |" in md and "OPEN: not determined yet" in md
    else:
        assert "double free or corruption (\\!prev)" in md or "double free or corruption (!prev)" in md
        assert 'line ' in md and "query_nvlink_throughput_counters" in md.replace("\\_", "_")
        assert "malloc_printerr" in md.replace("\\_", "_")
    # and the Markdown is well-formed: our checker and a real parser agree on its structure
    assert check_markdown(md) == []
    tokens = md_tokens(md)
    fences = [t for t in tokens if t.type == "fence"]
    assert fences, "stacks are in fenced blocks"
    # the hostile thread name never closed a fence: every fence's content is what we put there
    assert not any(t.type == "fence" and "## " in t.content for t in tokens)
    if template != "runbook":
        assert any(t.type == "table_open" for t in tokens)


def test_hosts_are_replaced_consistently(evidence):
    _, analysis = evidence
    r = run("report", "--redact-hosts", str(analysis))
    assert r.exit_code == EXIT_OK
    md = r.stdout
    assert "gpu-node-17.cluster.example.com" not in md and "10.20.30.40" not in md
    assert "host-1" in md and "ip-1" in md
    # the same host gets the same alias wherever it appears
    assert md.count("host-1") >= 1 and "host-2" not in md


def test_check_reports_unfilled_fields_and_json(evidence):
    _, analysis = evidence
    r = run("report", "--check", "--json", str(analysis))
    # the evidence has no driver (no NVML in this process): --check says so and exits 3
    assert r.exit_code == EXIT_FINDINGS
    doc = json.loads(r.stdout)
    assert doc["command"] == "report"
    assert "driver" in doc["report"]["missing_fields"]
    assert any("driver" in p for p in doc["report"]["problems"])
    assert SECRET not in r.stdout


def test_known_issue_matching(evidence):
    _, analysis = evidence
    doc = json.loads(run("report", "--json", str(analysis)).stdout)
    titles = [k["title"] for k in doc["report"]["known_issues"]]
    # a heap-corruption crash matches the heap entry, and not the nvitop shutdown race (a SIGSEGV)
    assert any("heap corruption" in t for t in titles)
    assert not any("nvmlShutdown" in t for t in titles)


def test_bad_evidence_is_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"command": "something-else"}')
    r = run("report", str(p))
    assert r.exit_code == 1 and "unknown document kind" in r.stderr and "Traceback" not in r.stderr
    p.write_text("not json")
    r = run("report", str(p))
    assert r.exit_code == 1 and "not JSON" in r.stderr


def test_overlong_report_moves_details_to_an_attachment(evidence, tmp_path):
    # GIVEN an analysis whose other threads make the report longer than GitHub allows
    _, analysis = evidence
    doc = json.loads(analysis.read_text())
    t = doc["analysis"]["snapshot"]["threads"][1]
    doc["analysis"]["snapshot"]["threads"] += [dict(t, tid=100000 + i) for i in range(300)]
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    out = tmp_path / "report.md"
    r = run("report", "--check", "-o", str(out), str(big))
    assert r.exit_code == EXIT_FINDINGS or r.exit_code == EXIT_OK
    body = out.read_text()
    assert len(body) < 65_536 and "attached" in body
    full = Path(str(out) + ".full.md").read_text()
    assert len(full) > 65_536 and check_markdown(body) == []


def test_report_from_a_real_capture_and_its_core(tmp_path, core_pattern, newest_python):
    # GIVEN a live exporter-shaped process with secrets in its environment and arguments, captured for real
    import os
    import resource
    import subprocess
    import time

    from tests.crashers.make_core import EXPORTER, build_libcrash

    lib = build_libcrash(tmp_path)
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    env = {**os.environ, "NVIDIA_API_KEY": "nv-secret-123456", "EXPORTER_THREAD_NAME": "metrics-server"}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen([PYTHONS[newest_python], str(EXPORTER), str(lib), "segv", str(fifo)], cwd=run_dir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
    core = next(run_dir.glob("core*"))  # written only because capture raised the limit from 0
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(core)).exit_code == 0
    # WHEN a report is made from the bundle and the analysis
    r = run("report", "--template", "runbook", str(bundle), str(analysis))
    assert r.exit_code == 0, r.stderr
    md = r.stdout
    # THEN the secret is absent, the capture's files are listed with their sha256, and the crash is there
    assert "nv-secret-123456" not in md
    assert "00-identity.json" in md and "40-process/snapshot.json" in md
    assert "SIGSEGV" in md and check_markdown(md) == []
