"""The agent's Prometheus rules (forensics/deploy/chart/files/forensics-alerts.yaml) against real promtool:
`promtool check rules`, then the `promtool test rules` files of the repository (tests/data/alerts/*.yaml, which show
every alert firing and not firing), whose input series are checked against a real `agent serve`'s scrape -- a real
crash and a real kill analyzed, their uploads failed -- name by name and label key by label key, so a rule or a test
on a series the agent does not export, or with a label it does not carry, fails here; kube-state-metrics' series
against its documented names and labels.  promtool comes with Debian's prometheus package (tests/prometheus_env.py
unpacks it into the forensics cache)."""
from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from forensics.bundle.record import CoreState
from forensics.agent.nodeindex import CrashEntry, NodeIndex
from forensics.agent.serve import Agent, IndexCollector, ServeConfig
from tests.podruntime import searchable_view
from tests.prometheus_env import PrometheusUnavailable, prometheus_binary

yaml = pytest.importorskip("yaml")

RULES = Path(__file__).resolve().parents[2] / "forensics/deploy/chart/files/forensics-alerts.yaml"
FP_OLD, FP_NEW = "0123456789ab", "ba9876543210"


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        binary = Path(prometheus_binary())
    except PrometheusUnavailable as e:
        pytest.skip(f"no prometheus package: {e}")
    tool = binary.with_name("promtool")
    if not tool.is_file():
        pytest.skip(f"no promtool beside {binary}")
    return str(tool)


def crash_entry(**overrides) -> CrashEntry:
    """One analyzed crash as the node index holds it (its analysis failed: a timeout; its core cut for the budget)."""
    fields = dict(id="c1", path="/c1", time=0.0, signal=11, signal_name="SIGSEGV", pod_uid="u", container_id="k",
                  image="img", loop_key=None, core_state=CoreState.KEPT, in_progress=False, not_kept=("budget",),
                  analysis="failed", analysis_failure="timeout", fingerprint=FP_OLD, fingerprint_source="analysis",
                  signature="free", crash_class="double-free", nvml_build_id=None, driver=None, namespace="ml",
                  pod="exporter-0", container="exporter", image_digest="sha256:" + "0" * 64)
    fields.update(overrides)
    return CrashEntry(**fields)  # type: ignore[arg-type]


def agent_registry(core_dir: str, node: str, crashes: list[CrashEntry], *, upload: bool = False):
    """A registry holding the agent's real collector (as `agent serve` registers it) over ``crashes``; ``upload``: as
    `agent serve --upload` (its uploads' families, nothing sent yet)."""
    from prometheus_client.core import CollectorRegistry

    cfg = None
    if upload:
        from forensics.agent.shipper import UploadConfig
        from forensics.objstore.client import StoreOptions, parse_object_url

        cfg = UploadConfig(dest=parse_object_url("s3://crash-bundles/fleet"), cluster="prod", opts=StoreOptions())
    agent = Agent(ServeConfig(core_dir=core_dir, node=node, events=False, upload=cfg))
    agent.index = NodeIndex(crashes=crashes, groups={})
    registry = CollectorRegistry()
    registry.register(IndexCollector(agent))
    return registry


def old_agent(series: str) -> str:
    """``series`` as an agent from before the rename exported it: its node in ``node``, not ``forensics_node``."""
    assert "forensics_node=" in series
    return series.replace("forensics_node=", "node=")


ALERT_TESTS = Path(__file__).resolve().parents[1] / "data" / "alerts"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"
#: the labels a scrape gives a target's series (prometheus-operator's monitors, kubernetes_sd relabelling)
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service", "node"}
#: kube-state-metrics' series the rules read, with their label keys (its docs/metrics: node-metrics.md,
#: pod-metrics.md, daemonset-metrics.md); kube_node_labels' label_* are those --metric-labels-allowlist names
KSM_LABELS = {
    "kube_node_labels": {"node"},
    "kube_node_status_capacity": {"node", "resource", "unit"},
    "kube_pod_info": {"namespace", "pod", "uid", "host_ip", "pod_ip", "node", "created_by_kind", "created_by_name",
                      "priority_class", "host_network"},
    "kube_daemonset_status_desired_number_scheduled": {"namespace", "daemonset"},
    "kube_daemonset_status_number_ready": {"namespace", "daemonset"},
}
CRASHER_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "sleep")) { for (;;) pause(); }
    abort();
}
"""
FORENSICS = Path(sys.executable).parent / "forensics"


def _kernel_core(cmd: list[str], run: Path, kill: int | None) -> Path:
    """The core the kernel writes (kernel.core_pattern `core`: into the cwd) of ``cmd`` dying, by its own hand or by
    ``kill`` sent from here."""
    run.mkdir()
    p = subprocess.Popen(cmd, cwd=run, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
    if kill is not None:
        time.sleep(0.3)
        p.send_signal(kill)
    assert p.wait(timeout=60) < 0
    (core,) = [f for f in run.iterdir() if f.name.startswith("core")]
    return core


def _handle(core_dir: Path, core: Path, stand_in: int, signo: int) -> None:
    """Feed ``core`` to the installed core handler as the kernel does, a live process standing for /proc/PID."""
    with open(core, "rb") as f:
        p = subprocess.run([str(FORENSICS), "core-handler", str(core_dir), str(stand_in), str(stand_in), str(signo),
                            str(int(time.time())), "18446744073709551615"], stdin=f, capture_output=True, text=True,
                           env={}, cwd="/", timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def real_scrape(core_pattern, tmp_path_factory) -> str:
    """The exposition of a real `agent serve` (its own process, scraped over HTTP) that has analyzed a real crash
    (abort) and a real kill (SIGSEGV sent by this process), and failed to upload both to a bucket nobody answers for."""
    if os.geteuid() != 0:
        pytest.skip("the core handler reads /proc/PID of other processes as root")
    d = tmp_path_factory.mktemp("real-agent")
    (d / "crasher.c").write_text(CRASHER_C)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(d / "crasher"), str(d / "crasher.c")], check=True)
    crasher = str(d / "crasher")
    aborted = _kernel_core([crasher], d / "abort", None)
    killed = _kernel_core([crasher, "sleep"], d / "kill", signal.SIGSEGV)
    stand_in = subprocess.Popen([crasher, "sleep"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port, closed = s.getsockname()[1], None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # closed again: an upload's connection is refused
    agent = None
    try:
        _handle(d / "cores", aborted, stand_in.pid, signal.SIGABRT)
        _handle(d / "cores", killed, stand_in.pid, signal.SIGSEGV)
        # (its analyses run in the sandbox as an unprivileged uid: the core directory, the homes and the interpreter
        # made reachable to it in a mount namespace of the agent's own; pytest's directories are private)
        (d / "home").mkdir()
        view = searchable_view(bind=[str(d / "cores")], homes=[str(d / "home"), str(d / "cache")])
        agent = subprocess.Popen(
            [*view, str(FORENSICS), "agent", "serve", "--core-dir", str(d / "cores"), "--node-name", "gpu-real",
             "--no-events",
             "--metrics-port", str(port), "--analysis-timeout", "120", "--upload", "s3://crash-bundles/fleet",
             "--endpoint-url", f"http://127.0.0.1:{closed}", "--region", "us-east-1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={"PATH": os.environ["PATH"], "HOME": str(d / "home"), "AWS_ACCESS_KEY_ID": "AKIAFORENSICSTEST01",
                 "AWS_SECRET_ACCESS_KEY": "forensics-test-secret-key-0123456789", "FORENSICS_CACHE": str(d / "cache")})
        deadline, text = time.monotonic() + 300, ""
        while time.monotonic() < deadline:
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            done = ("forensics_crashes_total{" in text and "forensics_signals_sent_total{" in text
                    and re.search(r"^forensics_upload_failures_total\{[^}]*\} [1-9]", text, re.M))
            if done:
                return text
            time.sleep(0.5)
        pytest.fail(f"the agent did not analyze both crashes and try to upload them:\n{text}")
    finally:
        if agent is not None:
            agent.terminate()
            agent.communicate(timeout=60)
        stand_in.kill()
        stand_in.wait()
    raise AssertionError("unreachable")


def _samples(text: str) -> dict[str, set[frozenset[str]]]:
    """Sample name -> the label key sets its samples carry, in an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return out


def _alert_tests() -> list[tuple[Path, dict]]:
    return [(f, yaml.safe_load(f.read_text())) for f in sorted(ALERT_TESTS.glob("*.yaml"))]


def _input_series() -> list[tuple[str, frozenset[str], str]]:
    """Every input series of the promtool tests: (name, its label keys, the series as written)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for _f, doc in _alert_tests():
        for test in doc["tests"]:
            for item in test["input_series"]:
                (family,) = text_string_to_metric_families(item["series"] + " 1\n")
                (sample,) = family.samples
                out.append((sample.name, frozenset(sample.labels), item["series"]))
    return out


def test_the_agent_exports_no_label_service_discovery_adds(real_scrape):
    # GIVEN a scrape of a real agent: THEN its node is in forensics_node, on every family but build_info
    for name, key_sets in _samples(real_scrape).items():
        for keys in key_sets:
            assert "node" not in keys and "exported_node" not in keys, (name, keys)
            if name != "forensics_build_info":
                assert "forensics_node" in keys, (name, keys)


def test_rules_pass_promtool_check(promtool):
    p = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_the_rules_read_only_series_a_real_agent_and_kube_state_metrics_export(real_scrape):
    # GIVEN every series name in the rules' expressions (label values and names inside quotes left out)
    doc = yaml.safe_load(RULES.read_text())
    exprs = [re.sub(r'"[^"]*"', '""', r["expr"]) for g in doc["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b(?:forensics|kube)_[a-z_]+\b", e)}
    # THEN each is a sample a real agent exports, or one of kube-state-metrics' the rules are written for
    exported = _samples(real_scrape)
    assert used <= exported.keys() | KSM_LABELS.keys(), used - exported.keys() - KSM_LABELS.keys()
    assert {"forensics_crashes_total", "forensics_uploads_dropped_total", "forensics_upload_failures_total",
            "forensics_upload_oldest_pending_seconds", "kube_pod_info"} <= used


def test_the_promtool_tests_input_series_are_shaped_as_a_real_agents(real_scrape):
    # GIVEN the series of a real agent's scrape, and every input series of the promtool tests in the repository
    exported = _samples(real_scrape)
    for name, keys, written in _input_series():
        if name.startswith("forensics_"):
            # THEN each of the agent's has a name the agent exports and its label keys, give or take the labels a scrape
            # adds to its target; an agent from before forensics_node carried `node` in its place
            assert name in exported, f"the agent exports no {name}: {written}"
            # (an agent from before forensics_node lacks the labels added since: a subset of today's)
            own = keys - TARGET_LABELS - {"forensics_node"}
            real = {k - TARGET_LABELS - {"forensics_node"} for k in exported[name]}
            older = "forensics_node" not in keys and name != "forensics_build_info"
            assert (any(own <= r for r in real) if older else own in real), \
                f"{written}: the agent's {name} has the labels {sorted(sorted(r) for r in real)}"
            assert "forensics_node" in keys or "node" in keys or name == "forensics_build_info", written
        elif name in KSM_LABELS:
            extra = {k for k in keys if name == "kube_node_labels" and k.startswith("label_")}
            assert keys - extra == KSM_LABELS[name], f"{written}: kube-state-metrics' {name} has {KSM_LABELS[name]}"
        else:
            assert name == "up" and keys >= {"job", "instance"}, written


def test_the_promtool_tests_in_the_repository_pass(promtool):
    # GIVEN the promtool test files in tests/data/alerts WHEN promtool runs them THEN every expected alert fires at its
    # time, none before, and every expected sample is there
    files = [str(f) for f, _ in _alert_tests()]
    assert len(files) >= 3
    p = subprocess.run([promtool, "test", "rules", *files], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") == len(files), p.stdout


def test_every_alert_is_shown_firing_and_not_firing_and_has_its_runbook():
    alerts = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    firing, quiet = set(), set()
    for _f, doc in _alert_tests():
        assert doc["rule_files"] == ["../../../forensics/deploy/chart/files/forensics-alerts.yaml"]
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert firing == quiet == alerts.keys(), (alerts.keys() - firing, alerts.keys() - quiet)
    # AND each alert's runbook is a section of docs/alerts.md, its anchor the alert's name
    headings = {line[3:].strip().lower() for line in DOCS.read_text().splitlines() if line.startswith("## ")}
    for name, rule in alerts.items():
        url = rule["annotations"]["runbook_url"]
        assert url == f"https://github.com/forensics/forensics/blob/main/docs/alerts.md#{name.lower()}", url
        assert name.lower() in headings, f"docs/alerts.md has no section {name}"
