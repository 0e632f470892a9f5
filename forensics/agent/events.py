"""The agent's Kubernetes Events, as events.k8s.io/v1 defines them: one Event per series of isomorphic crashes,
repeats counted in its ``series`` (``count``, ``lastObservedTime``), as client-go's event recorder counts them.

An events.k8s.io/v1 Event cannot change what it says: the API server refuses an update of its ``note``,
``reason``, ``action``, ``regarding``, ``eventTime``, ``reportingController`` or ``reportingInstance``; only its
``series`` grows (``series.count`` at least 2: the first occurrence has none). So an Event is the series of
crashes of one fingerprint on one pod whose note is the same: the signature, the fingerprint and where the
series' first bundle lives — its path on the node, or its ``s3://`` URL once ``agent serve --upload`` put it
in the bucket. That upload makes a note of its own, and so a new Event naming the object, its series counting
the crashes so far (the one naming the node's path stays until the API server's TTL removes it). The count is
set from the index, never incremented: a restarted agent patches the series to the same count, and an Event the
API server expired is created again with the whole count.

The Event's name is the pod's, the fingerprint and a digest of the note, so the same series always has the same
name. Node Events (``CorePatternReplaced``) are one Event per taking, without series.

An upload given up (``agent serve --upload``: the queue's bounds, a conflict in the bucket, its attempts spent) is
an ``UploadDropped`` Event the same way: one series per pod (or, for a crash whose pod is not named, the node)
and reason, under the note of the first crash given up (its id, why, what stayed on the node, where), counted from
the crashes' records.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass

from ..output import escape_text
from ..redact import Redactor
from .nodeindex import CrashEntry, NodeIndex

__all__ = ["EventSink", "CrashSeries", "crash_series", "dropped_series", "micro_time", "REPORTING_CONTROLLER",
           "EVENTS_RESOURCE"]

REPORTING_CONTROLLER = "forensics-agent"  # a qualified name, as events.k8s.io/v1 requires
EVENTS_RESOURCE = "events.v1.events.k8s.io"  # kubectl's name of the resource (never core/v1's events)
_NOTE_MAX = 1024  # events.k8s.io/v1's bound on a note
_REPORTING_INSTANCE_MAX = 128


def micro_time(t: float) -> str:
    """A MicroTime as the API writes it.

    >>> micro_time(1764583200.25)
    '2025-12-01T10:00:00.250000Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashSeries:
    """One Event's worth of crashes: a fingerprint's on a pod, with the note they share."""

    namespace: str
    pod: str
    pod_uid: str
    fingerprint: str
    note: str
    count: int
    first: float
    last: float
    reason: str = "NativeCrash"  # UploadDropped: ``fingerprint`` is then why the upload was given up
    action: str = "Analyzed"
    on_node: bool = False  # regarding the node ``pod`` (in ``default``): a crash whose pod is not named

    @property
    def name(self) -> str:
        """The Event's name: the pod's, the fingerprint, the note's digest (a DNS subdomain, at most 253)."""
        digest = hashlib.sha256(self.note.encode()).hexdigest()[:10]
        return f"{self.pod[:200]}.{self.reason.lower()}.{self.fingerprint[:24]}.{digest}"

    @property
    def regarding(self) -> dict:
        if self.on_node:
            return {"kind": "Node", "apiVersion": "v1", "name": self.pod, "uid": self.pod_uid}
        return {"kind": "Pod", "apiVersion": "v1", "name": self.pod, "namespace": self.namespace, "uid": self.pod_uid}


def _note(c: CrashEntry, fingerprint: str, node: str) -> str:
    where = f"bundle {c.uploaded_to} (from node {node})" if c.uploaded_to else f"bundle {c.path} on node {node}"
    # shown by kubectl describe: the signature names threads and frames of the crashed process
    return escape_text(Redactor().text(f"{c.signature or 'native crash'}; fingerprint {fingerprint}; {where}"))[
        :_NOTE_MAX]


def crash_series(idx: NodeIndex, node: str) -> dict[str, CrashSeries]:
    """The Events the index wants, by name: for each (pod, fingerprint), its crashes so far under the note of the
    first one (its bundle where it is now). A crash whose pod is not named yet is in none."""
    firsts: dict[tuple[str, str, str], tuple[CrashEntry, int, float]] = {}
    for c in idx.crashes:  # oldest first
        if not (c.pod and c.namespace and c.pod_uid and c.fingerprint):
            continue
        key = (c.namespace, c.pod, c.fingerprint)
        first, n, last = firsts.get(key, (c, 0, c.time))
        firsts[key] = (first, n + 1, max(last, c.time))
    out = {}
    for (ns, pod, fp), (first, n, last) in firsts.items():
        s = CrashSeries(namespace=ns, pod=pod, pod_uid=str(first.pod_uid), fingerprint=fp,
                        note=_note(first, fp, node), count=n, first=first.time, last=last)
        out[s.name] = s
    return out


def dropped_series(idx: NodeIndex, node: str) -> dict[str, CrashSeries]:
    """The ``UploadDropped`` Events the index wants, by name: for each (pod, or the node, and why), the crashes whose
    upload was given up, under the note of the first one."""
    firsts: dict[tuple[str, str, str, str, bool], tuple[CrashEntry, int, float]] = {}
    for c in idx.crashes:  # oldest first
        if not c.upload_dropped:
            continue
        key = (c.namespace, c.pod, c.pod_uid, c.upload_dropped, False) if c.pod and c.namespace and c.pod_uid \
            else ("default", node, node, c.upload_dropped, True)
        first, n, last = firsts.get(key, (c, 0, c.time))
        firsts[key] = (first, n + 1, max(last, c.time))
    out = {}
    for (ns, regarding, uid, why, on_node), (first, n, last) in firsts.items():
        note = escape_text(Redactor().text(
            f"upload of crash {first.id} given up ({why}: {first.upload_dropped_why}); node {node}, "
            f"{first.path}"))[:_NOTE_MAX]
        s = CrashSeries(namespace=ns, pod=regarding, pod_uid=uid, fingerprint=why, note=note, count=n,
                        first=first.time, last=last, reason="UploadDropped", action="Dropped",
                        on_node=on_node)
        out[s.name] = s
    return out


class EventSink:
    """Kubernetes Events for crashes (:func:`crash_series`), coalesced and flushed by a thread.

    :meth:`offer` records the wanted state; the thread creates each new Event, or patches its series when its
    count changed, at most every ``interval`` seconds, through kubectl (the agent's service account in a pod,
    ``--kubeconfig`` elsewhere). Failures are retried on the next flush.
    """

    def __init__(self, kube, node: str, *, interval: float = 2.0) -> None:
        self.kube = kube
        self.node = node
        self.interval = interval
        self.wanted: dict[str, CrashSeries] = {}
        self.sent: dict[str, int] = {}  # Event name -> the count it has
        self.errors = 0
        self.node_events: list[dict] = []  # Events on the node (core_pattern taken), sent by the next flush
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="events", daemon=True)

    def offer_node_event(self, reason: str, action: str, message: str) -> None:
        """One Warning Event on the node (in ``default``, where the kubelet's node Events are); at most 16 wait."""
        with self.lock:
            if len(self.node_events) < 16:
                self.node_events.append({"reason": reason, "action": action, "time": time.time(),
                                         "message": escape_text(Redactor().text(message))[:_NOTE_MAX]})

    def start(self) -> None:
        self.thread.start()

    def offer(self, idx: NodeIndex) -> None:
        wanted = {**crash_series(idx, self.node), **dropped_series(idx, self.node)}
        with self.lock:
            self.wanted = wanted

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        with self.lock:
            todo = [s for name, s in self.wanted.items() if self.sent.get(name) != s.count]
            node_events, self.node_events = self.node_events, []
        for i, ev in enumerate(node_events):
            try:
                self._send_node(ev)
            except Exception:  # noqa: BLE001 - the API server may be away: kept for the next flush
                self.errors += 1
                with self.lock:
                    self.node_events[:0] = node_events[i:][:16]
                break
        for s in todo:
            try:
                self._send(s)
                self.sent[s.name] = s.count
            except Exception:  # noqa: BLE001 - the API server may be away; the next flush retries
                self.errors += 1

    def _event(self, *, name: str, namespace: str, regarding: dict, reason: str, action: str, note: str,
               first: float) -> dict:
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
                "eventTime": micro_time(first), "regarding": regarding, "reason": reason, "action": action,
                "type": "Warning", "note": note, "reportingController": REPORTING_CONTROLLER,
                "reportingInstance": self.node[:_REPORTING_INSTANCE_MAX]}

    def _send_node(self, ev: dict) -> None:
        name = f"{self.node[:200]}.{ev['reason'].lower()}.{int(ev['time'] * 1000):x}"[:253]
        event = self._event(name=name, namespace="default", reason=ev["reason"], action=ev["action"],
                            regarding={"kind": "Node", "apiVersion": "v1", "name": self.node, "uid": self.node},
                            note=ev["message"], first=ev["time"])
        self._create(event, "default")

    def _send(self, s: CrashSeries) -> None:
        from ..errors import KubeError

        series = {"count": s.count, "lastObservedTime": micro_time(s.last)}
        if s.count >= 2:  # a repeat: the Event's series (none before the second occurrence)
            try:
                self._patch(s.name, s.namespace, {"series": series})
                return
            except KubeError as e:
                if "NotFound" not in str(e) and "not found" not in str(e):
                    raise
        event = self._event(name=s.name, namespace=s.namespace, reason=s.reason, action=s.action,
                            regarding=s.regarding, note=s.note, first=s.first)
        if s.count >= 2:  # an Event the API server expired, or one whose note is new (its first bundle uploaded)
            event["series"] = series
        try:
            self._create(event, s.namespace)
        except KubeError as e:  # there already (a restarted agent's first flush, or made since the patch failed)
            if "AlreadyExists" not in str(e) and "already exists" not in str(e):
                raise
            if s.count >= 2:
                self._patch(s.name, s.namespace, {"series": series})

    def _create(self, event: dict, namespace: str) -> None:
        from ..kubectl import run_kubectl

        run_kubectl(self.kube, "create event", ["create", "--validate=false", "-f", "-", "--namespace", namespace],
                    stdin=json.dumps(event), namespaced=False, timeout=30)

    def _patch(self, name: str, namespace: str, patch: dict) -> None:
        from ..kubectl import run_kubectl

        run_kubectl(self.kube, "patch event", ["patch", EVENTS_RESOURCE, name, "--namespace", namespace, "--type",
                                               "merge", "-p", json.dumps(patch)], namespaced=False, timeout=30)
