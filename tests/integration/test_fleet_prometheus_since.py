"""`fleet --prometheus --since` a fresh snapshot counts the pods in CrashLoopBackOff as `fleet --from --since` does
-- against a real Prometheus scraping kube-state-metrics' exposition of the incident fleet.

Right after a baseline a crash-looping pod has no restart counted yet (it waits out its back-off), yet it fails
now: its last exit code is counted and its node is a crashing one (the boundary reads it). The Prometheus table
counted the exit codes of restarting pods only, and its nodes crashed only by restarts: the H20 group showed no
exit code, and its nodes counted as never crashing.
"""
from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fleetgen import incident_fleet
from tests.integration.test_fleet_prometheus import Prometheus, _groups
from tests.ksm_exposition import ksm_text, serve_ksm


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("since")
    pods, nodes = incident_fleet()
    (tmp / "pods.json").write_text(json.dumps(pods))
    (tmp / "nodes.json").write_text(json.dumps(nodes))
    ksm, port = serve_ksm(ksm_text(pods, nodes))
    prom = Prometheus(tmp, {"kube-state-metrics": [f"127.0.0.1:{port}"]})
    try:
        prom.wait_for("count(kube_pod_info)", len(pods["items"]))
        yield prom, tmp
    finally:
        prom.stop()
        ksm.shutdown()
        ksm.server_close()


def test_since_a_fresh_snapshot_crash_looping_pods_fail_as_fleet_from_counts_them(fleet):
    prom, tmp = fleet
    files = ["--from", str(tmp / "pods.json"), "--nodes", str(tmp / "nodes.json")]
    # GIVEN a snapshot taken now, and a few scrapes later no restart counter has moved: the 36 H20 pods wait out
    # CrashLoopBackOff
    snap = tmp / "baseline.json"
    assert CliRunner().invoke(cli, ["fleet", "--json", "-o", str(snap), *files]).exit_code == 0
    time.sleep(4)
    # WHEN the fleet since the snapshot is asked of Prometheus and of the pod and node objects
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--since", str(snap), "--json"])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(cli, ["fleet", *files, "--since", str(snap), "--json"])
    assert r2.exit_code == 0, r2.output
    from_prom, from_objects = json.loads(r.stdout), json.loads(r2.stdout)
    h20 = next(g for g in from_prom["fleet"]["groups"] if "NVIDIA-H20" in str(g["key"]))
    assert (h20["total_restarts"], h20["crash_loop"]) == (0, 36)
    # THEN the crash-looping pods' exit codes and their nodes are counted as fleet --from counts them
    assert _groups(from_prom) == _groups(from_objects)
    assert h20["exit_codes"] == {"134": 27, "139": 9}
    assert "NVIDIA-H20" not in " ".join(from_prom["fleet"]["clean_groups"])
