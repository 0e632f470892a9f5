"""The Grafana dashboard (forensics/capture/chart/files/forensics-dashboard.json): every panel's query runs on a real
Prometheus (Debian's, on 127.0.0.1) that scrapes two agents' real collectors served by the agent's own metrics server,
and kube-state-metrics' node labels, with the alert rules' recording rules loaded; each answers, and the fingerprints
and the boundary say what the series say."""
from __future__ import annotations

import json
import re

import pytest

from forensics.capture.metricsserver import MetricsServer
from tests.integration.test_agent_alerts import FP_NEW, FP_OLD, RULES, agent_registry, crash_entry
from tests.integration.test_fleet_prometheus import Prometheus

DASHBOARD = RULES.with_name("forensics-dashboard.json")
# what Grafana substitutes: its rate interval (at least 4 scrapes), the node_group variable's "All"
GRAFANA_VARS = {"$__rate_interval": "1m", "$node_group": ".*"}
KSM = ('kube_node_labels{node="gpu-a",label_nvidia_com_gpu_product="NVIDIA-H20",'
       'label_nvidia_com_cuda_driver_version_full="580.126.09"} 1\n'
       'kube_node_labels{node="gpu-c",label_node_kubernetes_io_instance_type="g5.xlarge"} 1\n')


def _targets(doc: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]


def test_dashboard_is_well_formed():
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    variables = re.findall(r"\$\w+", json.dumps([e for _, e in _targets(doc)]))
    assert set(variables) <= GRAFANA_VARS.keys()


@pytest.fixture
def prometheus(tmp_path):
    # GIVEN gpu-a (an H20 node) with two fingerprints and gpu-b (no node labels) with one, served as the agent serves
    gpu_a = agent_registry(str(tmp_path), "gpu-a", [crash_entry(), crash_entry(id="c2", fingerprint=FP_NEW),
                                                    crash_entry(id="c3")])
    gpu_b = agent_registry(str(tmp_path), "gpu-b", [crash_entry(not_kept=(), analysis="done", analysis_failure=None)])
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    servers = [MetricsServer("127.0.0.1", 0, lambda r=r: generate_latest(r), content_type=CONTENT_TYPE_LATEST)
               for r in (gpu_a, gpu_b)]
    servers.append(MetricsServer("127.0.0.1", 0, KSM.encode, content_type="text/plain; version=0.0.4"))
    for s in servers:
        s.start()
    prom = Prometheus(tmp_path, {"forensics-agent": [f"127.0.0.1:{s.port}" for s in servers[:2]],
                                 "kube-state-metrics": [f"127.0.0.1:{servers[2].port}"]}, rule_files=(str(RULES),))
    try:
        prom.wait_for("count(forensics:node_group:info)", 2)
        prom.wait_for("count(forensics:crashes:rate15m_by_node_group)", 2)  # the H20 group and the unlabelled one
        prom.wait_for("min(count_over_time(forensics_crashes_total[1m]))", 5)  # enough samples for increase()
        yield prom
    finally:
        prom.stop()
        for s in servers:
            s.close()


def test_every_panel_query_answers_on_the_agents_series(prometheus):
    doc = json.loads(DASHBOARD.read_text())
    answers = {}
    for title, expr in _targets(doc):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        result = prometheus.query(expr)  # a query Prometheus rejects raises HTTPError (400)
        assert result, f"{title}: {expr} answered nothing"
        answers[expr] = result
    # THEN the fingerprints table counts crashes and nodes per fingerprint
    crashes = {r["metric"]["fingerprint"]: float(r["value"][1]) for r in
               prometheus.query("sum by (fingerprint, crash_class, signal) (forensics_crashes_total)")}
    assert crashes == {FP_OLD: 3, FP_NEW: 1}
    (nodes_b,) = [t["expr"] for p in doc["panels"] if p["title"] == "Fingerprints in the fleet" for t in p["targets"]
                  if t["refId"] == "B"]
    assert {r["metric"]["fingerprint"]: float(r["value"][1]) for r in answers[nodes_b]} == {FP_OLD: 2, FP_NEW: 1}
    # and the boundary: the H20 group has a crashing node, g5.xlarge's node never crashed
    boundary = [p for p in doc["panels"] if p["title"].startswith("The boundary")][0]
    nodes, crashing = (answers[t["expr"].replace("$node_group", ".*")] for t in boundary["targets"])
    assert {r["metric"]["node_group"]: float(r["value"][1]) for r in nodes} == {"NVIDIA-H20 580.126.09": 1,
                                                                               "g5.xlarge": 1}
    assert {r["metric"]["node_group"]: float(r["value"][1]) for r in crashing} == {"NVIDIA-H20 580.126.09": 1}

