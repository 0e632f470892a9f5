"""The agent's events.k8s.io/v1 Events (forensics/agent/events.py): which series the index wants, and that what
the sink writes passes the API server's validation of that version (tests/kube_standin.py's port of
k8s.io/kubernetes pkg/apis/core/validation/events.go), which refuses what an older Event shape would do."""
from __future__ import annotations

from forensics.bundle.record import CoreState
from forensics.agent.events import EventSink, crash_series, dropped_series
from forensics.agent.nodeindex import CrashEntry, group_crashes
from tests.kube_standin import _merge, validate_group_event


def entry(id: str, t: float, **kw) -> CrashEntry:
    fields = dict(id=id, path=f"/cores/crashes/{id}", time=t, signal=6, signal_name="SIGABRT", pod_uid="uid-1",
                  container_id="c", image="img", loop_key=None, core_state=CoreState.KEPT, in_progress=False,
                  not_kept=(), analysis="done", analysis_failure=None, fingerprint="0123456789ab",
                  fingerprint_source="analysis", signature="double free in nvmlDeviceGetFieldValues",
                  crash_class="double-free", nvml_build_id=None, driver=None, namespace="monitoring",
                  pod="exporter-0", container="exporter", image_digest=None)
    fields.update(kw)
    return CrashEntry(**fields)  # type: ignore[arg-type]


def test_repeats_are_one_series_under_the_first_bundles_note():
    # GIVEN three crashes of one fingerprint on a pod, and one of another pod not named yet
    idx = group_crashes([entry("a", 100.0), entry("b", 200.0), entry("c", 300.5), entry("d", 50.0, pod=None)])
    # WHEN the sink asks which Events the index wants
    (s,) = crash_series(idx, "gpu-3").values()
    # THEN one series: three crashes, from the first's time to the last's, its note naming the first bundle
    assert (s.count, s.first, s.last) == (3, 100.0, 300.5)
    assert s.note == "double free in nvmlDeviceGetFieldValues; fingerprint 0123456789ab; bundle /cores/crashes/a " \
                     "on node gpu-3"
    # AND once the first bundle is in the bucket, the note names the object: another Event (its name differs)
    (u,) = crash_series(group_crashes([entry("a", 100.0, uploaded_to="s3://b/k/a/"), entry("b", 200.0)]),
                        "gpu-3").values()
    assert u.note.endswith("bundle s3://b/k/a/ (from node gpu-3)") and u.name != s.name and u.count == 2


def test_the_events_written_pass_the_api_servers_rules_for_events_k8s_io_v1():
    sink = EventSink(None, "gpu-3")
    (s,) = crash_series(group_crashes([entry("a", 100.0), entry("b", 200.25)]), "gpu-3").values()
    # GIVEN the Event of the first crash as the sink creates it, then its series as the sink patches it
    first = sink._event(name=s.name, namespace=s.namespace, reason="NativeCrash", action="Analyzed", note=s.note,
                        regarding={"kind": "Pod", "apiVersion": "v1", "name": s.pod, "namespace": s.namespace,
                                   "uid": s.pod_uid}, first=s.first)
    assert validate_group_event(first) == []
    repeat = _merge(first, {"series": {"count": 2, "lastObservedTime": "1970-01-01T00:03:20.250000Z"}})
    assert validate_group_event(repeat, first) == []
    # AND the node's Event (no namespace on what it regards: in default)
    node = sink._event(name="gpu-3.corepatternreplaced.1", namespace="default", reason="CorePatternReplaced",
                       action="Observed", note="taken", first=1.0,
                       regarding={"kind": "Node", "apiVersion": "v1", "name": "gpu-3", "uid": "gpu-3"})
    assert validate_group_event(node) == []
    # THEN what core/v1's way of counting would write is refused: a count, a series of 1, a note rewritten
    assert validate_group_event({**first, "deprecatedCount": 1}) == [
        "deprecatedCount: Invalid value: needs to be unset"]
    assert "series.count: Invalid value: should be at least 2" in validate_group_event(
        _merge(first, {"series": {"count": 1, "lastObservedTime": "1970-01-01T00:03:20Z"}}), first)
    assert validate_group_event(_merge(repeat, {"note": "another bundle"}), repeat) == [
        "note: Invalid value: field is immutable"]


def test_uploads_given_up_are_one_series_per_pod_and_reason_and_pass_the_api_servers_rules():
    # GIVEN two crashes of a pod whose uploads were given up for a conflict, one for its attempts, and one of a pod
    # not named (the node's)
    why = "s3://b/k/50-core/core.zst: already holds other bytes (...); the whole bundle stays on the node"
    idx = group_crashes([entry("a", 100.0, upload_dropped="conflict", upload_dropped_why=why),
                         entry("b", 200.0, upload_dropped="conflict", upload_dropped_why=why),
                         entry("c", 300.0, upload_dropped="attempts", upload_dropped_why="20 attempts failed"),
                         entry("d", 400.0, pod=None, upload_dropped="queue-count", upload_dropped_why="over"),
                         entry("e", 500.0)])
    # WHEN the sink asks which Events the index wants
    series = {(s.regarding["kind"], s.fingerprint): s for s in dropped_series(idx, "gpu-3").values()}
    # THEN one series per (pod or node, reason), counted, under the first crash's note
    assert sorted(series) == [("Node", "queue-count"), ("Pod", "attempts"), ("Pod", "conflict")]
    conflict = series[("Pod", "conflict")]
    assert (conflict.count, conflict.first, conflict.last, conflict.reason) == (2, 100.0, 200.0, "UploadDropped")
    assert conflict.note == f"upload of crash a given up (conflict: {why}); node gpu-3, /cores/crashes/a"
    node = series[("Node", "queue-count")]
    assert node.regarding == {"kind": "Node", "apiVersion": "v1", "name": "gpu-3", "uid": "gpu-3"}
    assert node.namespace == "default" and node.name.startswith("gpu-3.uploaddropped.queue-count.")
    # AND the Events the sink writes of them pass events.k8s.io/v1's validation, the repeat's series too
    sink = EventSink(None, "gpu-3")
    for s in series.values():
        event = sink._event(name=s.name, namespace=s.namespace, reason=s.reason, action=s.action, note=s.note,
                            regarding=s.regarding, first=s.first)
        assert validate_group_event(event) == [], s
    # AND a crash's own NativeCrash series keeps its name (a restarted agent finds its Events)
    (crash,) = crash_series(group_crashes([entry("a", 100.0)]), "gpu-3").values()
    assert crash.name.startswith("exporter-0.nativecrash.0123456789ab.") and crash.regarding["kind"] == "Pod"
