"""`fleet --prometheus -l SELECTOR` against a real Prometheus: every selector kubectl takes that PromQL can ask
exactly gives the table `fleet --from` gives on the pods the selector picks; the rest is a usage error (exit 2).
The nodes carry labels of every kind the boundary's chain sorts: few values (`zone`, crossing the groups), one
value per node (`serial`), and many values over all nodes but two over the nodes with pods (`pool`: 20 spare
nodes without pods have their own), so both tables' boundary is found by the same rule from the same counts.

It used to split `-l` on '=' only: `app!=x` became `label_app!="=x"`... and matched nothing, silently.
The pods the selector picks are stated here, by Kubernetes' meaning of each operator, for the incident's
fleet with a `tier` label on two pods in three and a `canary` label on one pod in five.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fleetgen import incident_fleet
from tests.integration.test_fleet_prometheus import Prometheus, _groups
from tests.ksm_exposition import ksm_text, serve_ksm

# selector -> which pods (by their labels) Kubernetes picks for it
SELECTORS = {
    "app=nvitop-exporter": lambda lab: lab.get("app") == "nvitop-exporter",
    "tier==a": lambda lab: lab.get("tier") == "a",
    "tier!=a": lambda lab: lab.get("tier") != "a",  # pods without the label too
    "tier in (a, b)": lambda lab: lab.get("tier") in ("a", "b"),
    "tier notin (a)": lambda lab: lab.get("tier") != "a",
    "tier": lambda lab: "tier" in lab,
    "!tier": lambda lab: "tier" not in lab,
    "app=nvitop-exporter, tier!=b,!canary": lambda lab: (lab.get("app") == "nvitop-exporter"
                                                         and lab.get("tier") != "b" and "canary" not in lab),
    "example.com/team in (gpu.infra)": lambda lab: lab.get("example.com/team") == "gpu.infra",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("selectors")
    pods, nodes = incident_fleet()
    for i, pod in enumerate(pods["items"]):
        labels = pod["metadata"]["labels"]
        if i % 3 != 2:
            labels["tier"] = "ab"[i % 3]
        if i % 5 == 0:
            labels["canary"] = "yes"
        if i % 2:
            labels["example.com/team"] = "gpu.infra" if i % 4 == 1 else "gpuXinfra"  # '.' is no regex wildcard
    for i, node in enumerate(nodes["items"]):
        labels = node["metadata"]["labels"]
        labels.update({"zone": "ab"[i % 2], "serial": f"sn-{i:04d}",
                       "pool": "h20" if labels["nvidia.com/gpu.product"] == "NVIDIA-H20" else "ada"})
    spare = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"spare-{i}", "labels": {
        "kubernetes.io/hostname": f"spare-{i}", "pool": f"spare-{i}"}}} for i in range(20)]
    nodes = {"kind": "List", "items": nodes["items"] + spare}
    ksm, port = serve_ksm(ksm_text(pods, nodes))
    prom = Prometheus(tmp, {"kube-state-metrics": [f"127.0.0.1:{port}"]})
    try:
        prom.wait_for("count(kube_pod_info)", len(pods["items"]))
        yield prom, pods, nodes, tmp
    finally:
        prom.stop()
        ksm.shutdown()
        ksm.server_close()


def test_the_boundary_is_found_among_labels_of_every_kind(fleet):
    prom, pods, nodes, tmp = fleet
    (tmp / "all-pods.json").write_text(json.dumps(pods))
    (tmp / "all-nodes.json").write_text(json.dumps(nodes))
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--json"])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(cli, ["fleet", "--from", str(tmp / "all-pods.json"), "--nodes",
                                  str(tmp / "all-nodes.json"), "--json"])
    from_prom, from_objects = json.loads(r.stdout), json.loads(r2.stdout)
    assert _groups(from_prom) == _groups(from_objects)
    boundary = from_prom["fleet"]["boundary"]
    assert "pool: h20 (106 of 108 nodes crashing) vs ada (99 nodes, none crashing)" in boundary
    assert not [x for x in boundary if x.startswith(("zone", "serial", "kubernetes"))]
    assert from_prom["fleet"]["nodes"] == 207


@pytest.mark.parametrize("selector", list(SELECTORS))
def test_a_selector_picks_the_pods_kubernetes_would(fleet, selector):
    prom, pods, nodes, tmp = fleet
    picked = [p for p in pods["items"] if SELECTORS[selector](p["metadata"]["labels"])]
    assert 0 < len(picked) < len(pods["items"]) or selector == "app=nvitop-exporter"
    (tmp / "pods.json").write_text(json.dumps({"kind": "List", "items": picked}))
    (tmp / "nodes.json").write_text(json.dumps(nodes))
    # WHEN the fleet is asked of Prometheus with -l, and of the pods the selector picks
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "-l", selector, "--json"])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(cli, ["fleet", "--from", str(tmp / "pods.json"), "--nodes", str(tmp / "nodes.json"),
                                  "--json"])
    assert r2.exit_code == 0, r2.output
    # THEN the two tables are the same
    from_prom, from_objects = json.loads(r.stdout), json.loads(r2.stdout)
    assert from_prom["fleet"]["pods"] == len(picked)
    assert _groups(from_prom) == _groups(from_objects)


@pytest.mark.parametrize("selector, says", [
    ("tier>1", "cannot compare label values as numbers"),
    ("tier=", "an empty value is no label to Prometheus"),
    ("tier in (a,)", "an empty value is no label to Prometheus"),
    ("tier=a b", "cannot read it at 'b'"),
    ("!tier=a", "'!' goes only before a bare key"),
    ("tier=a,", "a requirement missing after the last comma"),
    ("-tier=a", "is not a label key"),
])
def test_a_selector_prometheus_cannot_ask_exactly_is_a_usage_error(fleet, selector, says):
    prom = fleet[0]
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "-l", selector])
    assert r.exit_code == 2, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("forensics: error:")]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in r.stderr, r.stderr


def test_a_label_no_pod_has_is_an_error_not_every_pod(fleet):
    # kube-state-metrics exports only allow-listed pod labels: `nosuch!=x` must not quietly mean every pod
    prom = fleet[0]
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "-l", "nosuch!=x"])
    assert r.exit_code == 1, r.output
    assert "no pod has label_nosuch" in r.stderr and "allow-listed" in r.stderr
