"""The Grafana dashboard (forensics/capture/chart/files/forensics-dashboard.json): every panel's query runs on a real
Prometheus (Debian's, on 127.0.0.1) that scrapes two agents' real collectors served by the agent's own metrics server,
and kube-state-metrics' node labels, with the alert rules' recording rules loaded; each answers, and the fingerprints
and the boundary say what the series say."""
from __future__ import annotations

import json
import re

import pytest

from forensics.capture.metricsserver import MetricsServer
from tests.integration.test_agent_alerts import FP_NEW, FP_OLD, RULES, agent_registry, crash_entry, old_agent
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
    # label_replace's "$1" is a group of its regex; Grafana leaves a name no variable has as it is
    variables = re.findall(r"\$(?!\d+\b)\w+", json.dumps([e for _, e in _targets(doc)]))
    assert set(variables) <= GRAFANA_VARS.keys()


@pytest.fixture
def prometheus(tmp_path):
    # GIVEN gpu-a (an H20 node) with two fingerprints and gpu-b (no node labels) with one, served as the agent serves
    gpu_a = agent_registry(str(tmp_path), "gpu-a", [crash_entry(), crash_entry(id="c2", fingerprint=FP_NEW),
                                                    crash_entry(id="c3")])
    gpu_b = agent_registry(str(tmp_path), "gpu-b", [crash_entry(not_kept=(), analysis="done", analysis_failure=None)])
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    # gpu-a's agent as this one serves it, scraped as service discovery scrapes a pod (its target has a `node` label,
    # honor_labels false); gpu-b's as an agent from before the rename served it (its node in `node`), scraped with
    # honor_labels as before: a rollout's fleet of old and new agents
    old = "\n".join(old_agent(x) if "forensics_node=" in x else x for x in generate_latest(gpu_b).decode().split("\n"))
    servers = [MetricsServer("127.0.0.1", 0, lambda: generate_latest(gpu_a), content_type=CONTENT_TYPE_LATEST),
               MetricsServer("127.0.0.1", 0, old.encode, content_type=CONTENT_TYPE_LATEST),
               MetricsServer("127.0.0.1", 0, KSM.encode, content_type="text/plain; version=0.0.4")]
    for s in servers:
        s.start()
    new_agent = f"127.0.0.1:{servers[0].port}"
    prom = Prometheus(tmp_path, {"forensics-agent": [new_agent],
                                 "forensics-agent-old": [f"127.0.0.1:{servers[1].port}"],
                                 "kube-state-metrics": [f"127.0.0.1:{servers[2].port}"]}, rule_files=(str(RULES),),
                      discovered=("forensics-agent",),
                      target_labels={new_agent: {"node": "gpu-a", "namespace": "forensics", "pod": "agent-x"}})
    try:
        prom.wait_for("count(forensics:node_group:info)", 2)
        prom.wait_for("count(forensics:crashes:rate15m_by_node_group)", 2)  # the H20 group and the unlabelled one
        prom.wait_for("min(count_over_time(forensics_crashes_total[1m]))", 5)  # enough samples for increase()
        yield prom
    finally:
        prom.stop()
        for s in servers:
            s.close()


def test_the_agents_node_label_is_not_renamed_by_service_discovery(prometheus):
    # GIVEN the new agent scraped with its target's `node` label (service discovery's), honor_labels false
    # THEN no agent series was stored with exported_node: the agent's node is forensics_node, the target's is node
    assert prometheus.query('count({__name__=~"forensics_.+", exported_node!=""})') == []
    handler = prometheus.query('forensics_handler_installed{job="forensics-agent"}')
    assert [(r["metric"]["node"], r["metric"]["forensics_node"]) for r in handler] == [("gpu-a", "gpu-a")]


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

