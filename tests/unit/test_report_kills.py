"""A kill read from the evidence (forensics.report.kills.read_kill, pure): a pod's last termination, status and
events as capture --pod writes them, the core's siginfo, the fleet's counts."""
from __future__ import annotations

import pytest

from forensics.bundle.documents import CaptureDocuments
from forensics.fleet.model import FleetGroup, FleetSummary
from forensics.report.kills import KillKind, read_kill


def _bundle(*, exit_code=None, reason=None, events=(), pod_status=None, probe=None, containers=True):
    spec = {"name": "exporter", "resources": {"limits": {"memory": "256Mi"}, "requests": {"memory": "128Mi"}}}
    if probe:
        spec["livenessProbe"] = probe
    doc = {"_bundle_dir": "/b",
           "scheduling": {"pod": {"name": "exporter-1", "namespace": "monitoring", "containers": [
               {"name": "exporter", "restart_count": 4,
                "last_terminated": {"exit_code": exit_code, "reason": reason}}] if containers else []}},
           "events": [{"reason": r, "message": m, "count": n, "time": "2025-01-01T00:00:00Z"} for r, m, n in events],
           "pod": {"metadata": {"ownerReferences": [{"kind": "DaemonSet", "name": "exporter"}]},
                   "spec": {"containers": [spec]}, "status": pod_status or {}}}
    return CaptureDocuments.from_json(doc)


@pytest.mark.parametrize("bundle, kind, signal", [
    (_bundle(exit_code=137, reason="OOMKilled"), KillKind.OOM, "SIGKILL"),
    (_bundle(exit_code=137, reason="Error", probe={"httpGet": {"path": "/healthz", "port": "metrics"},
                                                    "timeoutSeconds": 1, "periodSeconds": 10, "failureThreshold": 3},
             events=[("Unhealthy", "Liveness probe failed: Get \"http://10.1.0.7:9400/healthz\": context deadline "
                      "exceeded", 3), ("Killing", "Container exporter failed liveness probe, will be restarted", 1)]),
     KillKind.LIVENESS, "SIGKILL"),
    (_bundle(containers=False, pod_status={"phase": "Failed", "reason": "Evicted", "message": "The node was low on "
                                           "resource: memory. Container exporter was using 1Gi, request is 128Mi."}),
     KillKind.EVICTED, None),
    (_bundle(exit_code=143, reason="Error"), KillKind.SIGNALED, "SIGTERM"),
], ids=["oom", "liveness", "evicted", "sigterm"])
def test_a_pods_kill_is_read_with_what_explains_it(bundle, kind, signal):
    k = read_kill(None, [bundle], [])
    assert k is not None and k.kind is kind and k.signal == signal
    assert (k.pod, k.container, k.owner) == ("monitoring/exporter-1", "exporter" if kind is not KillKind.EVICTED
                                             else None, "daemonset/exporter")
    if kind is KillKind.OOM:
        assert (k.memory_limit, k.memory_request) == ("256Mi", "128Mi")
    if kind is KillKind.LIVENESS:
        assert k.probe_words == ("HTTP GET /healthz on port metrics, every 10 s, 1 s to answer, 3 failures in a row, "
                                 "first after 0 s")
        assert k.messages[0].startswith("Unhealthy: Liveness probe failed") and k.messages[0].endswith("(3 times)")
    if kind is KillKind.EVICTED:
        assert "was using 1Gi, request is 128Mi" in (k.usage or "")


def test_a_crash_or_a_clean_exit_is_no_kill():
    assert read_kill(None, [_bundle(exit_code=139, reason="Error")], []) is None
    assert read_kill(None, [_bundle(exit_code=0, reason="Completed")], []) is None


def test_the_fleet_says_how_many_pods_were_oom_killed():
    group = FleetGroup(key=(("gpu", "H20"),), nodes=2, pods=3, pods_with_restarts=2, total_restarts=5, max_restarts=3,
                       exit_codes={"137": 2}, reasons={"OOMKilled": 2}, crash_loop=0, images={})
    fleet = FleetSummary(group_by=("gpu",), groups=(group,), pods=3, nodes=2, crashing_groups=(), clean_groups=(),
                         boundary=())
    k = read_kill(None, [], [fleet])
    assert k is not None and (k.kind, k.pods, k.exit_code) == (KillKind.OOM, 2, 137)
