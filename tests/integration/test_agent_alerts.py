"""The agent's Prometheus rules (forensics/capture/chart/files/forensics-alerts.yaml) against real promtool:
`promtool check rules`, then `promtool test rules` on input series whose names and label keys are taken from the
agent's real exposition (IndexCollector's output, parsed back), so a rule on a series the agent does not export,
or with a label it does not carry, fails here.  promtool comes with Debian's prometheus package
(tests/prometheus_env.py unpacks it into the forensics cache)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forensics.bundle.record import CoreState
from forensics.capture.nodeindex import CrashEntry, NodeIndex
from forensics.capture.serve import Agent, IndexCollector, ServeConfig
from tests.prometheus_env import PrometheusUnavailable, prometheus_binary

yaml = pytest.importorskip("yaml")

RULES = Path(__file__).resolve().parents[2] / "forensics/capture/chart/files/forensics-alerts.yaml"
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


def agent_registry(core_dir: str, node: str, crashes: list[CrashEntry]):
    """A registry holding the agent's real collector (as `agent serve` registers it) over ``crashes``."""
    from prometheus_client.core import CollectorRegistry

    agent = Agent(ServeConfig(core_dir=core_dir, node=node, events=False))
    agent.index = NodeIndex(crashes=crashes, groups={})
    registry = CollectorRegistry()
    registry.register(IndexCollector(agent))
    return registry


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Sample name -> the labels of one of its samples, from a scrape of a real IndexCollector over one crash."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = agent_registry(str(tmp_path_factory.mktemp("cores")), "gpu-a", [crash_entry()])
    text = generate_latest(registry).decode()
    return {s.name: dict(s.labels) for fam in text_string_to_metric_families(text) for s in fam.samples}


def _series(exported: dict[str, dict[str, str]], name: str, **labels: str) -> str:
    """`name{...}` with the label keys the agent really exports for ``name``, the values given overriding."""
    assert name in exported, f"the agent exports no {name}: {sorted(exported)}"
    real = exported[name]
    assert labels.keys() <= real.keys(), f"{name} has no label {sorted(labels.keys() - real.keys())}"
    merged = {**real, **labels}
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(merged.items())) + "}"


def scraped(series: str, node: str) -> str:
    """``series`` as a scrape through service discovery stores it: with the target's ``node`` label (kubernetes_sd
    relabelling ``__meta_kubernetes_pod_node_name`` to ``node``, as the prometheus-community chart's pod job does)."""
    return series.replace("{", "{" + f"node={json.dumps(node)},", 1)


def old_agent(series: str) -> str:
    """``series`` as an agent from before the rename exported it: its node in ``node``, not ``forensics_node``."""
    assert "forensics_node=" in series
    return series.replace("forensics_node=", "node=")


def test_the_agent_exports_no_label_service_discovery_adds(exported):
    # GIVEN a scrape of the agent's real collector: THEN its node is in forensics_node, on every family but build_info
    for name, labels in exported.items():
        assert "node" not in labels and "exported_node" not in labels, (name, labels)
        if name != "forensics_build_info":
            assert labels["forensics_node"] == "gpu-a", (name, labels)


def test_rules_pass_promtool_check(promtool):
    p = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_rules_use_only_series_the_agent_exports(exported):
    # GIVEN every forensics_* name in the rules' expressions
    import re

    doc = yaml.safe_load(RULES.read_text())
    exprs = [re.sub(r'"[^"]*"', '""', r["expr"]) for g in doc["groups"] for r in g["rules"]]  # no label names
    used = {m for e in exprs for m in re.findall(r"\bforensics_[a-z_]+", e)}
    # THEN each is a sample name the agent exports (or the pending handler gauge)
    assert used <= exported.keys(), used - exported.keys()
    assert {"forensics_crashes_total", "forensics_analysis_failures_total", "forensics_cores_not_kept_total"} <= used


def _unit_tests(exported) -> dict:
    s = lambda name, **kw: _series(exported, name, **kw)  # noqa: E731
    crash, failures = "forensics_crashes_total", "forensics_analysis_failures_total"
    not_kept = "forensics_cores_not_kept_total"
    new_labels = {"fingerprint": FP_NEW, "crash_class": "double-free", "signal": "SIGSEGV", "severity": "warning"}
    return {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m",  # a known fingerprint all along on gpu-a; a new one on gpu-b from minute 90
         "input_series": [{"series": s(crash, forensics_node="gpu-a", fingerprint=FP_OLD), "values": "1+0x200"},
                          {"series": s(crash, forensics_node="gpu-b", fingerprint=FP_NEW), "values": "_x90 1+0x110"}],
         "alert_rule_test": [
             {"eval_time": "80m", "alertname": "ForensicsNewCrashFingerprint", "exp_alerts": []},
             {"eval_time": "100m", "alertname": "ForensicsNewCrashFingerprint", "exp_alerts": [
                 {"exp_labels": new_labels, "exp_annotations": {
                     "summary": f"New native crash fingerprint {FP_NEW} (double-free, SIGSEGV)",
                     "description": "A crash whose fingerprint no node reported in the previous day; "
                                    "`forensics fleet` groups its bundles."}}]},
             # an hour on, the fingerprint is known: the alert resolves
             {"eval_time": "160m", "alertname": "ForensicsNewCrashFingerprint", "exp_alerts": []}]},
        # gpu-a (H100, driver full), gpu-d (H100, driver parts) and gpu-b (no labels) crash once a minute, gpu-c (only
        # an instance type) never; gpu-a's agent scraped as a static target, gpu-b's and gpu-c's through service
        # discovery (its own `node` label beside the agent's forensics_node), gpu-d's still the old agent (`node`)
        {"interval": "1m",
         "input_series": [
             {"series": s(crash, forensics_node="gpu-a"), "values": "0+1x60"},
             {"series": scraped(s(crash, forensics_node="gpu-b"), "gpu-b"), "values": "0+1x60"},
             {"series": scraped(s(crash, forensics_node="gpu-c"), "gpu-c"), "values": "0+0x60"},
             {"series": old_agent(s(crash, forensics_node="gpu-d")), "values": "0+2x60"},
             {"series": 'kube_node_labels{node="gpu-a",label_nvidia_com_gpu_product="NVIDIA-H100-80GB-HBM3",'
                        'label_nvidia_com_cuda_driver_version_full="580.126.09",'
                        'label_node_kubernetes_io_instance_type="p5.48xlarge"}', "values": "1+0x60"},
             {"series": 'kube_node_labels{node="gpu-d",label_nvidia_com_gpu_product="NVIDIA-H100-80GB-HBM3",'
                        'label_nvidia_com_cuda_driver_major="580",label_nvidia_com_cuda_driver_minor="126",'
                        'label_nvidia_com_cuda_driver_rev="09"}', "values": "1+0x60"},
             {"series": 'kube_node_labels{node="gpu-c",label_node_kubernetes_io_instance_type="g5.xlarge"}',
              "values": "1+0x60"}],
         "promql_expr_test": [
             {"expr": "forensics:crashes:rate15m_by_node_group * 3600", "eval_time": "30m", "exp_samples": [
                 {"labels": '{node_group="NVIDIA-H100-80GB-HBM3 580.126.09"}', "value": 180},
                 {"labels": '{node_group="g5.xlarge"}', "value": 0},
                 {"labels": "{}", "value": 60}]}],
         "alert_rule_test": [
             {"eval_time": "10m", "alertname": "ForensicsCrashRateHigh", "exp_alerts": []},
             {"eval_time": "40m", "alertname": "ForensicsCrashRateHigh", "exp_alerts": [
                 {"exp_labels": {"severity": "warning", "node_group": "NVIDIA-H100-80GB-HBM3 580.126.09"},
                  "exp_annotations": {"summary": "Native crashes at 180/h in node group "
                                                 "NVIDIA-H100-80GB-HBM3 580.126.09"}},
                 {"exp_labels": {"severity": "warning"},
                  "exp_annotations": {"summary": "Native crashes at 60/h in node group "}}]}]},
        {"interval": "1m",
         "input_series": [
             {"series": scraped(s(failures, forensics_node="gpu-a", reason="timeout"), "gpu-a"),
              "values": "0x10 1+0x50"},
             {"series": scraped(s(failures, forensics_node="gpu-a", reason="memory"), "gpu-a"),
              "values": "0+0x60"},
             {"series": s(not_kept, forensics_node="gpu-a", reason="budget"), "values": "0x20 2+0x40"},
             {"series": s(not_kept, forensics_node="gpu-a", reason="disk-full"), "values": "0+0x60"},
             {"series": old_agent(s("forensics_handler_installed", forensics_node="gpu-a", reason="replaced")),
              "values": "1x10 0x50"},
             {"series": 'up{job="forensics/forensics-agent",instance="10.0.0.7:9847"}', "values": "1x5 0x55"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "ForensicsAnalysesFailing", "exp_alerts": []},
             {"eval_time": "15m", "alertname": "ForensicsAnalysesFailing", "exp_alerts": [
                 {"exp_labels": {"severity": "warning", "node": "gpu-a", "reason": "timeout"},
                  "exp_annotations": {"summary": "On-node analyses failing on gpu-a (timeout)",
                                      "description": "The crash bundles keep their cores; run `forensics analyze` "
                                                     "on one off the node."}}]},
             {"eval_time": "15m", "alertname": "ForensicsCoresNotKept", "exp_alerts": []},
             {"eval_time": "25m", "alertname": "ForensicsCoresNotKept", "exp_alerts": [
                 {"exp_labels": {"severity": "warning", "node": "gpu-a", "reason": "budget"},
                  "exp_annotations": {"summary": "Cores not kept whole on gpu-a (budget)",
                                      "description": "The core handler cut or dropped cores: raise the budget or the "
                                                     "disk bounds, or fix the crash loop."}}]},
             {"eval_time": "12m", "alertname": "ForensicsHandlerNotInstalled", "exp_alerts": []},
             {"eval_time": "20m", "alertname": "ForensicsHandlerNotInstalled", "exp_alerts": [
                 {"exp_labels": {"severity": "critical", "node": "gpu-a"},
                  "exp_annotations": {"summary": "The core handler is not installed on gpu-a: crashes there are not "
                                                 "captured"}}]},
             {"eval_time": "10m", "alertname": "ForensicsAgentDown", "exp_alerts": []},
             {"eval_time": "20m", "alertname": "ForensicsAgentDown", "exp_alerts": [
                 {"exp_labels": {"severity": "critical", "job": "forensics/forensics-agent",
                                 "instance": "10.0.0.7:9847"},
                  "exp_annotations": {"summary": "The forensics agent on 10.0.0.7:9847 is not answering scrapes"}}]}]},
    ]}


def test_rules_fire_on_the_agents_series(promtool, exported, tmp_path):
    # GIVEN promtool unit tests whose input series carry the agent's real names and label keys
    tests = tmp_path / "forensics-alerts-test.yaml"
    tests.write_text(yaml.safe_dump(_unit_tests(exported), sort_keys=False))
    # WHEN promtool evaluates the rules over them
    p = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=300)
    # THEN every expected alert fires at its time, and none before
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout
