"""`fleet --prometheus` says where the newest bundle of each fingerprint lives (#29 item 3): the agents'
`forensics_latest_bundle_timestamp_seconds{forensics_node, fingerprint, bundle}` (agent serve; the bundle's s3://
URL once uploaded, else NODE:PATH), the newest of the fleet's per fingerprint -- against a real Prometheus."""
from __future__ import annotations

import json

from click.testing import CliRunner

from forensics.cli import cli
from tests.fleetgen import incident_fleet
from tests.integration.test_fleet_prometheus import Prometheus
from tests.ksm_exposition import ksm_text, serve_ksm


def test_the_newest_bundle_of_each_fingerprint_is_named(tmp_path):
    # GIVEN the agents' series: fp-a crashed on two nodes (the newer bundle uploaded), fp-b on one (on its node),
    # fp-c's series without any crash counted (not in the table: not named)
    pods, nodes = incident_fleet()
    crashes = "".join(
        f'forensics_crashes_total{{forensics_node="{node}",fingerprint="{fp}",crash_class="segv",signal="SIGSEGV",'
        f'namespace="monitoring",pod="p",container="exporter",image_digest=""}} {n}\n'
        for node, fp, n in (("h20-001", "fp-a", 3), ("h20-002", "fp-a", 1), ("h20-003", "fp-b", 2)))
    latest = "".join(
        f'forensics_latest_bundle_timestamp_seconds{{forensics_node="{node}",fingerprint="{fp}",'
        f'bundle="{where}"}} {t}\n'
        for node, fp, where, t in (
            ("h20-001", "fp-a", "h20-001:/var/lib/forensics/cores/crashes/20261201T100000Z-1-SIGSEGV", 1764583200),
            ("h20-002", "fp-a", "s3://crashes/prod/h20-002/monitoring/p/20261201T110000Z-fp-a-2/", 1764586800),
            ("h20-003", "fp-b", "h20-003:/var/lib/forensics/cores/crashes/20261201T090000Z-3-SIGSEGV", 1764579600),
            ("h20-004", "fp-c", "s3://crashes/prod/h20-004/_/_/x/", 1764590000)))
    ksm, port = serve_ksm(ksm_text(pods, nodes) + "# TYPE forensics_crashes_total counter\n" + crashes
                          + "# TYPE forensics_latest_bundle_timestamp_seconds gauge\n" + latest)
    prom = Prometheus(tmp_path, {"kube-state-metrics": [f"127.0.0.1:{port}"]})
    try:
        prom.wait_for("count(kube_pod_info)", len(pods["items"]))
        prom.wait_for("count(forensics_latest_bundle_timestamp_seconds)", 4)
        # WHEN the fleet is asked of Prometheus
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--json"])
        t = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url])
    finally:
        prom.stop()
        ksm.shutdown()
        ksm.server_close()
    assert r.exit_code == 0 and t.exit_code == 0, (r.output, t.output)
    # THEN each fingerprint of the table is named with its newest bundle, in the bucket or on its node
    assert json.loads(r.stdout)["fleet"]["latest_bundles"] == {
        "fp-a": "s3://crashes/prod/h20-002/monitoring/p/20261201T110000Z-fp-a-2/",
        "fp-b": "h20-003:/var/lib/forensics/cores/crashes/20261201T090000Z-3-SIGSEGV"}
    assert "Newest bundle of fp-a: s3://crashes/prod/h20-002/monitoring/p/20261201T110000Z-fp-a-2/" in t.stdout
    assert "fp-c" not in t.stdout
