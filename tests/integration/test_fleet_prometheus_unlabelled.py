"""`fleet --prometheus` counts the pods `fleet --from` puts in "(no labels)": a pod no node was found for yet
(Pending, unscheduled: kube-state-metrics' `kube_pod_info` has `node=""`), and pods on a node without a
`kube_node_labels` series (a node deleted, or one kube-state-metrics has not listed) -- against a real Prometheus.

They were left out of the Prometheus table (its pods, its Nodes column and the boundary's number of nodes): the
per-pod query joined each pod with its node's labels, and a pod whose node has none fell out of the join.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forensics.agent.serve import NODE_LABEL
from forensics.cli import cli
from forensics.fleet.prom import AGENT_NODE
from tests.fleetgen import incident_fleet
from tests.integration.test_fleet_prometheus import Prometheus, _groups
from tests.ksm_exposition import ksm_text, serve_ksm


def _pending(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"nvitop-exporter-p{i}", "namespace": "monitoring", "uid": f"uid-p{i}",
                         "labels": {"app": "nvitop-exporter"}},
            "spec": {}, "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    assert AGENT_NODE == NODE_LABEL  # fleet --prometheus reads the label agent serve exports
    tmp = tmp_path_factory.mktemp("unlabelled")
    pods, nodes = incident_fleet()
    # two H20 nodes lose their Node object (and so their kube_node_labels series): one of their pods restarts,
    # with exit 139 in CrashLoopBackOff, the other runs clean; two pods are not scheduled anywhere
    gone = {"h20-000", "h20-107"}
    nodes = {"kind": "List", "items": [n for n in nodes["items"] if n["metadata"]["name"] not in gone]}
    pods["items"] += [_pending(0), _pending(1)]
    on_gone = [p for p in pods["items"] if p["spec"].get("nodeName") in gone]
    assert [p["status"]["containerStatuses"][0]["restartCount"] > 0 for p in on_gone] == [True, False]
    (tmp / "pods.json").write_text(json.dumps(pods))
    (tmp / "nodes.json").write_text(json.dumps(nodes))
    # beside them, the agents' crashes on the unlabelled node with the restarting pod (its series as `forensics agent
    # serve` exports them: the node in forensics_node) and on a labelled H20 node (an agent from before the rename:
    # the node in `node`)
    crashes = "".join(
        f'forensics_crashes_total{{{label}="{node}",fingerprint="{fp}",crash_class="segv",signal="SIGSEGV",'
        f'namespace="monitoring",pod="p",container="exporter",image_digest=""}} {n}\n'
        for label, node, fp, n in ((AGENT_NODE, "h20-000", "fp-gone", 3), ("node", "h20-001", "fp-h20", 2)))
    ksm, port = serve_ksm(ksm_text(pods, nodes) + "# HELP forensics_crashes_total crashes\n"
                          "# TYPE forensics_crashes_total counter\n" + crashes)
    prom = Prometheus(tmp, {"kube-state-metrics": [f"127.0.0.1:{port}"]})
    try:
        prom.wait_for("count(kube_pod_info)", len(pods["items"]))
        prom.wait_for("sum(forensics_crashes_total)", 5)
        yield prom, tmp
    finally:
        prom.stop()
        ksm.shutdown()
        ksm.server_close()


@pytest.mark.parametrize("args", [[], ["-l", "app=nvitop-exporter"], ["--group-by", "nvidia.com/gpu.product"]],
                         ids=["default", "selector", "group-by"])
def test_pods_on_no_node_or_an_unlabelled_one_count_as_fleet_from_counts_them(fleet, args):
    prom, tmp = fleet
    # WHEN the fleet is asked of Prometheus and of the pod and node objects
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--json", *args])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(cli, ["fleet", "--from", str(tmp / "pods.json"), "--nodes", str(tmp / "nodes.json"),
                                  "--json", *args])
    assert r2.exit_code == 0, r2.output
    from_prom, from_objects = json.loads(r.stdout), json.loads(r2.stdout)
    # THEN the two tables are the same
    assert _groups(from_prom) == _groups(from_objects)
    # AND the four pods are in the group "(no labels)": on two nodes (the two pending pods are on none), one of
    # them restarting; every pod and every node with pods is counted
    f = from_prom["fleet"]
    assert f["pods"] == 209 and f["nodes"] == 207
    none = [g for g in f["groups"] if not g["key"]]
    assert len(none) == 1, f["groups"]
    assert (none[0]["pods"], none[0]["nodes"], none[0]["pods_with_restarts"], none[0]["exit_codes"]) == (
        4, 2, 1, {"139": 1})
    # AND the crashes on the unlabelled node are that group's, the others their node's group's
    assert none[0]["fingerprints"] == {"fp-gone": 3}
    assert [g["fingerprints"] for g in f["groups"] if "NVIDIA-H20" in str(g["key"])] == [{"fp-h20": 2}]
    text = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, *args]).stdout
    assert "| (no labels) | 2 | 4 | 1 |" in text, text
