"""The Grafana dashboard (forensics/deploy/chart/files/forensics-dashboard.json): every panel's query runs on a real
Prometheus (Debian's, on 127.0.0.1) that scrapes two agents' real collectors served by the agent's own metrics server,
and kube-state-metrics' node labels, with the alert rules' recording rules loaded; each answers, and the fingerprints
and the boundary say what the series say."""
from __future__ import annotations

import json
import re

import pytest

from forensics.deploy.manifests import agent_objects
from forensics.agent.metricsserver import MetricsServer
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
    # the node-group variable applies to every panel, and the uploads have theirs
    assert [title for title, expr in _targets(doc) if "$node_group" not in expr] == []
    used = " ".join(e for _, e in _targets(doc))
    assert all(m in used for m in ("forensics_uploads_total", "forensics_upload_failures_total",
                                   "forensics_uploads_dropped_total", "forensics_uploads_pending",
                                   "forensics_upload_oldest_pending_seconds", "forensics_uploads_pending_bytes"))


def _monitor_honors_labels() -> bool:
    """Whether `agent manifest --scrape podmonitor`'s PodMonitor (the chart's, equal to it: test_helm_chart.py) keeps
    the agent's labels over its target's (honorLabels): how this test's Prometheus scrapes gpu-a's agent."""
    (pm,) = [o for o in agent_objects(core_dir="/c", image="i", namespace="forensics", gpu_label="k=v",
                                      host_prefix="/opt/forensics", scrape="podmonitor") if o["kind"] == "PodMonitor"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    return endpoint.get("honorLabels", False)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    # one Prometheus for the module's tests: they only query it (its start and the samples increase() needs take 10 s)
    tmp_path = tmp_path_factory.mktemp("dashboard")
    # GIVEN gpu-a (an H20 node) with two fingerprints and gpu-b (no node labels) with one, served as the agent serves;
    # gpu-a's third crash a host process's (no pod)
    gpu_a = agent_registry(str(tmp_path), "gpu-a", [crash_entry(), crash_entry(id="c2", fingerprint=FP_NEW),
                                                    crash_entry(id="c3", namespace=None, pod=None, container=None)],
                           upload=True)
    gpu_b = agent_registry(str(tmp_path), "gpu-b", [crash_entry(not_kept=(), analysis="done", analysis_failure=None)])
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    # gpu-a's agent as this one serves it, scraped as the chart's PodMonitor scrapes a pod: its target has the
    # `namespace`, `pod`, `container` prometheus-operator gives it and the `node` service discovery's relabelling adds,
    # honor_labels as the PodMonitor says; gpu-b's as an agent from before the rename served it (its node in `node`),
    # scraped with honor_labels as before: a rollout's fleet of old and new agents
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
                      discovered=() if _monitor_honors_labels() else ("forensics-agent",),
                      target_labels={new_agent: {"node": "gpu-a", "namespace": "forensics", "pod": "agent-x",
                                                 "container": "agent"}})
    try:
        prom.wait_for("count(forensics:node_group:info)", 3)  # gpu-a, gpu-c (kube_node_labels), gpu-b (its agent)
        prom.wait_for("count(forensics:crashes:rate15m_by_node_group)", 2)  # the H20 group and the unlabelled one
        prom.wait_for("min(count_over_time(forensics_crashes_total[1m]))", 5)  # enough samples for increase()
        yield prom
    finally:
        prom.stop()
        for s in servers:
            s.close()


def test_the_agents_node_label_is_not_renamed_by_service_discovery(prometheus):
    # GIVEN the new agent scraped with its target's `node` label (service discovery's)
    # THEN no agent series was stored with exported_node: the agent's node is forensics_node, the target's is node
    assert prometheus.query('count({__name__=~"forensics_.+", exported_node!=""})') == []
    handler = prometheus.query('forensics_handler_installed{job="forensics-agent"}')
    assert [(r["metric"]["node"], r["metric"]["forensics_node"]) for r in handler] == [("gpu-a", "gpu-a")]


def test_a_crash_keeps_the_crashed_pods_labels_over_the_agent_pods(prometheus):
    # GIVEN gpu-a's agent scraped as the PodMonitor scrapes it, its target labelled with the agent pod's namespace,
    # pod and container
    # THEN a crash's series says the crashed pod's: namespace, pod, container as the agent exports them, none stored
    # as exported_* (as they were without honorLabels, with the agent pod's in their place)
    exported = '{__name__=~"forensics_.+", exported_namespace!=""} or {__name__=~"forensics_.+", exported_pod!=""}'
    assert prometheus.query(f'count({exported} or {{__name__=~"forensics_.+", exported_container!=""}})') == []
    crashes = {(r["metric"]["fingerprint"], r["metric"].get("namespace"), r["metric"].get("pod"),
                r["metric"].get("container")): float(r["value"][1])
               for r in prometheus.query('forensics_crashes_total{job="forensics-agent"}')}
    # the host process's crash has no pod: it is not put on the agent's pod either
    assert crashes == {(FP_OLD, "ml", "exporter-0", "exporter"): 1, (FP_NEW, "ml", "exporter-0", "exporter"): 1,
                       (FP_OLD, None, None, None): 1}
    # and a series of the agent's own (no pod of its own) locates the agent: its target's labels
    (handler,) = prometheus.query('forensics_handler_installed{job="forensics-agent"}')
    assert (handler["metric"]["namespace"], handler["metric"]["pod"]) == ("forensics", "agent-x")


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
    nodes_b = nodes_b.replace("$node_group", ".*")
    assert {r["metric"]["fingerprint"]: float(r["value"][1]) for r in answers[nodes_b]} == {FP_OLD: 2, FP_NEW: 1}
    # and the boundary: the H20 group has a crashing node, g5.xlarge's node never crashed
    boundary = [p for p in doc["panels"] if p["title"].startswith("The boundary")][0]
    nodes, crashing = (answers[t["expr"].replace("$node_group", ".*")] for t in boundary["targets"])
    # (gpu-b, an agent's node kube-state-metrics does not describe, in node_group="")
    assert {r["metric"].get("node_group", ""): float(r["value"][1]) for r in nodes} == {
        "NVIDIA-H20 580.126.09": 1, "g5.xlarge": 1, "": 1}
    assert {r["metric"].get("node_group", ""): float(r["value"][1]) for r in crashing} == {
        "NVIDIA-H20 580.126.09": 1, "": 1}


def test_a_node_group_chosen_filters_every_panel(prometheus):
    # GIVEN the dashboard with the node group of gpu-a (the H20 nodes) chosen
    doc = json.loads(DASHBOARD.read_text())
    chosen = {**GRAFANA_VARS, "$node_group": "NVIDIA-H20 580.126.09"}
    for title, expr in _targets(doc):
        for var, value in chosen.items():
            expr = expr.replace(var, value)
        # THEN no panel shows a series of gpu-b, which is in no group; what is by node is gpu-a's
        for r in prometheus.query(expr):
            assert r["metric"].get("node") in (None, "gpu-a"), (title, r)
            assert r["metric"].get("node_group") in (None, "NVIDIA-H20 580.126.09"), (title, r)
    # AND the fingerprints table counts gpu-a's crashes alone (3 with gpu-b's)
    (table,) = [t["expr"] for p in doc["panels"] if p["title"] == "Fingerprints in the fleet" for t in p["targets"]
                if t["refId"] == "A"]
    crashes = prometheus.query(table.replace("$node_group", chosen["$node_group"]))
    assert {r["metric"]["fingerprint"]: float(r["value"][1]) for r in crashes} == {FP_OLD: 2, FP_NEW: 1}

