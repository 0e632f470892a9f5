"""`forensics fleet` on saved kubectl output of a fleet shaped like the incident's, and on 10,000 pods."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.fleet import summarize_fleet
from tests.fleetgen import big_fleet, incident_fleet


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def saved(tmp_path):
    pods, nodes = incident_fleet()
    p, n = tmp_path / "pods.json", tmp_path / "nodes.json"
    p.write_text(json.dumps(pods))
    n.write_text(json.dumps(nodes))
    return p, n


def test_incident_fleet_cross_comparison(saved):
    p, n = saved
    r = run("fleet", "--json", "--from", str(p), "--nodes", str(n))
    assert r.exit_code == 0, r.stderr
    f = json.loads(r.stdout)["fleet"]
    groups = {", ".join(v for _, v in g["key"]): g for g in f["groups"]}
    h20 = groups["NVIDIA-H20, 580.126.09"]
    ada = groups["NVIDIA-RTX-6000-Ada-Generation, 570.172.08"]
    assert (h20["pods"], h20["pods_with_restarts"], h20["total_restarts"]) == (108, 106, 11648)
    assert (ada["pods"], ada["pods_with_restarts"], ada["total_restarts"]) == (99, 0, 0)
    assert h20["exit_codes"] == {"134": 79, "139": 27} and h20["crash_loop"] == 36
    assert f["crashing_groups"] == ["NVIDIA-H20, 580.126.09"]
    assert f["clean_groups"] == ["NVIDIA-RTX-6000-Ada-Generation, 570.172.08"]
    assert any(b.startswith("nvidia.com/cuda.driver.major: 580 (106 of 108") for b in f["boundary"])
    assert f["mixed_images"] is True and len(h20["images"]) == 2
    # the Markdown table carries the same figures
    md = run("fleet", "--from", str(p), "--nodes", str(n)).stdout
    assert "| NVIDIA-H20, 580.126.09 | 108 | 108 | 106 | 11,648 |" in md


def test_a_sidecar_is_not_a_mixed_rollout():
    """Each container name is judged on its own: one exporter digest plus a sidecar's digest is one rollout."""
    from tests.fleetgen import IMAGE_OLD

    pods, nodes = incident_fleet()
    for pod in pods["items"]:
        cs = pod["status"]["containerStatuses"]
        cs[0]["imageID"] = "docker-pullable://" + IMAGE_OLD  # the exporter: one digest everywhere
        cs.append({"name": "log-shipper", "restartCount": 0, "imageID": "docker-pullable://registry.local/fluent-bit@sha256:"
                   + "c" * 64, "state": {"running": {}}, "lastState": {}})
    assert summarize_fleet(pods, nodes).mixed_images is False
    # one exporter on another digest is a mixed rollout again
    status = pods["items"][150]["status"]["containerStatuses"][0]
    status["imageID"] = "docker-pullable://registry.local/x@sha256:" + "d" * 64
    assert summarize_fleet(pods, nodes).mixed_images is True


def test_group_by_and_fallback_to_instance_type(saved):
    p, n = saved
    r = run("fleet", "--json", "--from", str(p), "--nodes", str(n), "--group-by", "node.kubernetes.io/instance-type")
    names = [", ".join(v for _, v in g["key"]) for g in json.loads(r.stdout)["fleet"]["groups"]]
    assert names == ["gpu-h20-8x", "gpu-ada-8x"]
    # nodes without GPU feature discovery labels fall back to the instance type
    pods, nodes = incident_fleet()
    for node in nodes["items"]:
        for k in list(node["metadata"]["labels"]):
            if k.startswith("nvidia.com/"):
                del node["metadata"]["labels"][k]
    s = summarize_fleet(pods, nodes)
    assert sorted(g.name for g in s.groups) == ["gpu-ada-8x", "gpu-h20-8x"]


def test_since_a_saved_snapshot_counts_new_restarts_only(saved, tmp_path):
    p, n = saved
    snap = tmp_path / "baseline.json"
    assert run("fleet", "--json", "-o", str(snap), "--from", str(p), "--nodes", str(n)).exit_code == 0
    # GIVEN three more restarts of one pod after the baseline
    pods = json.loads(p.read_text())
    pods["items"][150]["status"]["containerStatuses"][0]["restartCount"] += 3
    p2 = tmp_path / "pods2.json"
    p2.write_text(json.dumps(pods))
    f = json.loads(run("fleet", "--json", "--from", str(p2), "--nodes", str(n), "--since", str(snap)).stdout)["fleet"]
    assert f["baseline"] == "snapshot"
    assert sum(g["total_restarts"] for g in f["groups"]) == 3
    assert sum(g["pods_with_restarts"] for g in f["groups"]) == 1


def test_since_a_time(saved):
    p, n = saved
    r = run("fleet", "--json", "--from", str(p), "--nodes", str(n), "--since", "2026-11-20T15:00:00Z")
    f = json.loads(r.stdout)["fleet"]
    # pods started before the time count one restart when their last termination is after it
    h20 = [g for g in f["groups"] if g["key"][0][1] == "NVIDIA-H20"][0]
    assert 0 < h20["pods_with_restarts"] < 106 and h20["total_restarts"] == h20["pods_with_restarts"]


def test_ten_thousand_pods(tmp_path):
    pods, nodes = big_fleet(10_000)
    s = summarize_fleet(pods, nodes)
    assert s.pods == 10_000 and sum(g.pods for g in s.groups) == 10_000
    assert s.crashing_groups and s.clean_groups


def test_bad_input(tmp_path, saved):
    p, n = saved
    r = run("fleet", "--from", str(p))
    assert r.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    r = run("fleet", "--from", str(bad), "--nodes", str(n))
    assert r.exit_code == 1 and "expected a JSON object" in r.stderr
    r = run("fleet", "--kubeconfig", str(tmp_path / "none"), "-n", "x")
    assert r.exit_code == 1 and "kubectl get pods failed" in r.stderr and "Traceback" not in r.stderr


def test_real_kubectl_against_the_api_stand_in(tmp_path):
    import shutil

    from tests.kube_standin import StandIn, write_kubeconfig

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    pods, nodes = incident_fleet()
    with StandIn(path_env="/usr/bin:/bin") as api:
        for p in pods["items"]:
            api.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        # a pod of another app in the same namespace must be left out by the selector
        other = json.loads(json.dumps(pods["items"][0]))
        other["metadata"].update(name="other", uid="uid-other", labels={"app": "other"})
        api.pods[("monitoring", "other")] = other
        for n in nodes["items"]:
            api.nodes[n["metadata"]["name"]] = n
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url, namespace="monitoring")
        r = run("fleet", "--json", "--kubeconfig", kubeconfig, "-n", "monitoring", "-l", "app=nvitop-exporter")
    assert r.exit_code == 0, r.stderr
    f = json.loads(r.stdout)["fleet"]
    assert f["pods"] == 207
    h20 = [g for g in f["groups"] if g["key"][0][1] == "NVIDIA-H20"][0]
    assert (h20["pods_with_restarts"], h20["total_restarts"]) == (106, 11648)


@pytest.mark.parametrize("case", ["swapped", "no-pods", "nodes-are-pods"])
def test_files_that_cannot_be_a_fleet_are_refused(saved, tmp_path, case):
    """#20.9: swapped --from / --nodes printed "0 pods on 0 nodes", rc 0."""
    p, n = saved
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": []}))
    args = {"swapped": (n, p), "no-pods": (empty, n), "nodes-are-pods": (p, p)}[case]
    r = CliRunner().invoke(cli, ["fleet", "--from", str(args[0]), "--nodes", str(args[1])])
    assert r.exit_code == 1, r.output
    message = r.stderr.splitlines()[0]
    expected = {"swapped": f"--from {n} holds 207 Node objects and --nodes {p} holds 207 pods: "
                           "the two files are swapped",
                "no-pods": f"--from {empty} holds no pods (nothing)",
                "nodes-are-pods": f"--nodes {p} holds no nodes (207 Pod)"}[case]
    assert expected in message, r.stderr
    assert "0 pods on 0 nodes" not in r.output


def test_since_a_fresh_snapshot_crash_looping_pods_are_not_clean(saved, tmp_path):
    # GIVEN a snapshot taken now, and the same pods a moment later: 36 H20 pods wait out CrashLoopBackOff, no
    # restart of any pod counted since
    p, n = saved
    snap = tmp_path / "baseline.json"
    assert run("fleet", "--json", "-o", str(snap), "--from", str(p), "--nodes", str(n)).exit_code == 0
    r = run("fleet", "--json", "--from", str(p), "--nodes", str(n), "--since", str(snap))
    f = json.loads(r.stdout)["fleet"]
    h20 = next(g for g in f["groups"] if g["key"][0][1] == "NVIDIA-H20")
    assert (h20["total_restarts"], h20["crash_loop"]) == (0, 36)
    # THEN the group is not called clean: its crash-looping pods fail now
    assert f["clean_groups"] == ["NVIDIA-RTX-6000-Ada-Generation, 570.172.08"]
    assert "NVIDIA-H20, 580.126.09" in f["crashing_groups"]
    text = run("fleet", "--from", str(p), "--nodes", str(n), "--since", str(snap)).stdout
    assert "Clean: NVIDIA-RTX-6000-Ada-Generation, 570.172.08\n" in text and "Clean: NVIDIA-H20" not in text


def test_bundles_that_are_no_bundles_are_one_clear_error(saved, tmp_path):
    # GIVEN a directory that is neither a core directory nor a crash bundle, and --bundles beside --prometheus
    p, n = saved
    (tmp_path / "not-cores").mkdir()
    # WHEN fleet is asked to read them
    r = run("fleet", "--from", str(p), "--nodes", str(n), "--bundles", str(tmp_path / "not-cores"))
    # THEN one error line names the source and what it should be (exit 1); the exclusive options are usage (exit 2)
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "not-cores: neither a core directory (crashes/) nor a crash bundle (metadata.json)" in r.stderr
    r = run("fleet", "--prometheus", "http://127.0.0.1:9", "--bundles", str(tmp_path))
    assert r.exit_code == 2 and "--prometheus and --bundles are exclusive" in r.output


def test_bundles_of_hostile_names_print_escaped(saved, tmp_path):
    # GIVEN a crash bundle of an H20 node whose path holds a terminal escape and a newline, analyzed by an agent
    p, n = saved
    pods = json.loads(p.read_text())
    node = next(x["spec"]["nodeName"] for x in pods["items"] if x["spec"].get("nodeName", "").startswith("h20"))
    bundle = tmp_path / "cores\x1b[2J\nFORGED" / "crashes" / "20261201T100000Z-1-SIGSEGV"
    (bundle / "60-analysis").mkdir(parents=True)
    (bundle / "metadata.json").write_text(json.dumps({"schema_version": 1, "crash_id": "c1", "state": "done",
                                                      "time": 1764583200.0, "node": "host", "signal": 11}))
    (bundle / "60-analysis" / "analysis.json").write_text(json.dumps(
        {"analysis": {"fingerprint": "0123456789ab"}, "agent": {"node": node}}))
    # WHEN the table is printed
    r = run("fleet", "--from", str(p), "--nodes", str(n), "--bundles", str(bundle.parent.parent))
    # THEN the crash counts in the node's group, and the path is one line, its controls escaped
    assert r.exit_code == 0, r.stderr
    assert "0123456789ab x 1 |" in r.stdout
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("Newest bundle of 0123456789ab: ")]
    assert "\\x1b[2J\\x0aFORGED" in line and "\x1b" not in r.stdout
