"""The node's crash index, rebuilt from the crash bundles the core handler wrote (``agent serve``).

Every figure the agent publishes (metrics, Events, ``DIR/agent-index.json``) is computed here
from the bundles themselves: ``crashes/ID/metadata.json`` (the handler's record) and, once the
agent analyzed the crash, ``crashes/ID/60-analysis/``.  Nothing is counted from memory of what
happened before, so an agent killed at any point and started again counts every crash once,
and nothing it does deletes evidence.

The fingerprint is whatever ``forensics analyze`` computed (``analysis.fingerprint``); a crash
without a core to analyze (metadata only: the crash-loop limit, RLIMIT_CORE, a full disk) takes
the fingerprint of an analyzed crash with the same handler crash-loop key, and says so.  The
handler's crash-loop key itself is not a fingerprint and is never published as one.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace

from ..bundle.layout import ANALYSIS, ANALYSIS_DIR, ANALYSIS_FAILED, ANALYSIS_POD, CRASHES, RECORD, UPLOADED
from ..bundle.record import CoreRecord, CoreState, CrashRecord, RecordState

__all__ = ["CrashEntry", "FingerprintGroup", "NodeIndex", "read_crash", "build_index",
           "NOT_KEPT_REASONS", "MAX_READ", "group_crashes", "IndexReader"]

#: why a crash's core is not on disk whole, as the metrics label it (bounded: these values only)
NOT_KEPT_REASONS = ("rlimit", "loop-limit", "disk-full", "min-free", "cut", "truncated-stream", "not-a-core",
                    "budget", "failed")
#: analyze's crash class of a signal another process sent (model.CrashKind.SENT_SIGNAL's value): a kill, no crash
SENT_SIGNAL = "sent-signal"
MAX_READ = 8 << 20  # a record or an analysis larger than this is not read (the agent writes none larger)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashEntry:
    """One crash as its bundle says it."""

    id: str
    path: str
    time: float
    signal: int | None
    signal_name: str | None
    pod_uid: str | None
    container_id: str | None
    image: str | None
    loop_key: str | None  # the handler's crash-loop key (not a fingerprint)
    core_state: CoreState | None  # None: a state this version does not know
    in_progress: bool  # the handler is still at it (its first record): nothing to analyze yet
    not_kept: tuple[str, ...]  # NOT_KEPT_REASONS that apply
    analysis: str  # "done", "failed", "pending", "none" (nothing to analyze)
    analysis_failure: str | None
    fingerprint: str | None
    fingerprint_source: str | None  # "analysis" or "same crash-loop key as ID"
    signature: str | None
    crash_class: str | None
    nvml_build_id: str | None
    driver: str | None
    namespace: str | None
    pod: str | None
    container: str | None
    image_digest: str | None
    uploaded_to: str | None = None  # the bucket's URL of the bundle (agent serve --upload's 70-upload.json)
    upload_dropped: str | None = None  # why its upload was given up (70-upload.json's dropped), with ...
    upload_dropped_why: str | None = None  # ... what it says of it in words, and what stayed on the node
    node: str | None = None  # the agent's node (its --node-name, in the analysis it wrote), else the handler's host
    # the key the previous fingerprint definition gives it (the analysis' fingerprint_vN, N = its version - 1), so
    # alert rules tell a key renamed by a new definition from a new bug
    previous_fingerprint: str | None = None
    sender_uid: int | None = None  # a signal another process sent (crash_class "sent-signal"): the sender's uid

    @property
    def is_sent(self) -> bool:
        """Another process sent the signal (a kill): no crash, counted apart."""
        return self.crash_class == SENT_SIGNAL


@dataclass(slots=True)
class FingerprintGroup:
    fingerprint: str
    count: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    example: str = ""
    signature: str | None = None
    crash_class: str | None = None
    pods: set = field(default_factory=set)
    containers: set = field(default_factory=set)
    image_digests: set = field(default_factory=set)
    nvml_build_ids: set = field(default_factory=set)
    drivers: set = field(default_factory=set)


@dataclass(slots=True)
class NodeIndex:
    crashes: list[CrashEntry]
    groups: dict[str, FingerprintGroup]

    def as_document(self) -> dict:
        return {"crashes": len(self.crashes),
                "pending": sum(1 for c in self.crashes if c.analysis == "pending"),
                "sent_signals": sum(1 for c in self.crashes if c.is_sent),
                "fingerprints": {fp: {"count": g.count, "first_seen": g.first_seen, "last_seen": g.last_seen,
                                      "example_bundle": g.example, "signature": g.signature,
                                      "crash_class": g.crash_class, "pods": sorted(g.pods),
                                      "containers": sorted(g.containers), "image_digests": sorted(g.image_digests),
                                      "libnvidia_ml_build_ids": sorted(g.nvml_build_ids),
                                      "drivers": sorted(g.drivers)}
                                 for fp, g in sorted(self.groups.items())}}


def _read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_READ + 1)
    except OSError:  # not written (yet): the entry says what is missing (status "none" or "pending")
        return None
    if len(data) > MAX_READ:
        return None
    try:
        doc = json.loads(data)
    except ValueError:  # a record cut by a full disk: as if not written
        return None
    return doc if isinstance(doc, dict) else None


def _not_kept(core: CoreRecord) -> tuple[str, ...]:
    """Why a crash's core is not whole, as the metric's reasons.

    >>> _not_kept(CoreRecord(state=CoreState.METADATA_ONLY, reasons=("no room to create the core's file on /d "
    ...                      "(No space left on device; out of space or of inodes): metadata only",)))
    ('disk-full',)
    """
    state = core.state
    reasons = " ".join(core.reasons)
    out = []
    if state is CoreState.METADATA_ONLY:
        if "RLIMIT_CORE" in reasons:
            out.append("rlimit")
        if "crash loop" in reasons:
            out.append("loop-limit")
        if "below the minimum" in reasons:
            out.append("min-free")
    if "disk filled up" in reasons or "no room to create the core's file" in reasons or state is CoreState.PARTIAL:
        out.append("disk-full")
    if "core cut at" in reasons:
        out.append("cut")
    if "the stream ended" in reasons:
        out.append("truncated-stream")
    if state is CoreState.NOT_A_CORE:
        out.append("not-a-core")
    if state is CoreState.DELETED_FOR_BUDGET:
        out.append("budget")
    if state is CoreState.FAILED:
        out.append("failed")
    return tuple(out)


def _dropped_why(uploaded: dict) -> str | None:
    """What a record of an upload given up says of it: why, in words, and what stayed on the node."""
    if not uploaded.get("dropped"):
        return None
    said = uploaded.get("why")
    why = said if isinstance(said, str) else "given up"
    kept = "the whole bundle stays" if uploaded.get("kept") is not False else "its record and analysis stay"
    return f"{why[:600]}; {kept} on the node"


def read_crash(crash_dir: str) -> CrashEntry | None:
    """The entry of one crash bundle; None when it has no readable record yet."""
    rec = CrashRecord.from_json(_read_json(os.path.join(crash_dir, RECORD)))
    if rec is None:
        return None
    core = rec.core
    analysis = _read_json(os.path.join(crash_dir, ANALYSIS))
    failed = _read_json(os.path.join(crash_dir, ANALYSIS_FAILED))
    pod = _read_json(os.path.join(crash_dir, ANALYSIS_POD)) or {}
    uploaded = _read_json(os.path.join(crash_dir, UPLOADED)) or {}
    has_core = bool(core.file) and core.state is not None and core.state.has_core
    if rec.state is not RecordState.DONE:
        status = "pending" if rec.state is RecordState.IN_PROGRESS else "none"
    elif analysis is not None:
        status = "done"
    elif failed is not None:
        status = "failed"
    elif has_core:
        status = "pending"
    else:
        status = "none"
    a = (analysis or {}).get("analysis") or {}
    snap_core = ((a.get("snapshot") or {}).get("core") or {}) if isinstance(a, dict) else {}
    nvml_v = snap_core.get("nvml")
    nvml = nvml_v if isinstance(nvml_v, dict) else {}
    fp = a.get("fingerprint") if isinstance(a.get("fingerprint"), str) else None
    crash_v = a.get("crash") if isinstance(a, dict) else None
    crash: dict = crash_v if isinstance(crash_v, dict) else {}
    sender_v = crash.get("sender")
    sender: dict = sender_v if isinstance(sender_v, dict) else {}
    agent = (analysis or {}).get("agent")
    agent_node = agent.get("node") if isinstance(agent, dict) else None
    return CrashEntry(
        id=os.path.basename(crash_dir), path=crash_dir, time=float(rec.time or 0.0), signal=rec.signal,
        signal_name=rec.signal_name, pod_uid=rec.pod_uid, container_id=rec.container_id, image=rec.image_key,
        loop_key=rec.loop_key, core_state=core.state, in_progress=rec.state is RecordState.IN_PROGRESS,
        not_kept=_not_kept(core),
        analysis=status, analysis_failure=(failed or {}).get("reason") if status == "failed" else None,
        fingerprint=fp, fingerprint_source="analysis" if fp else None,
        signature=a.get("signature") if isinstance(a.get("signature"), str) else None,
        crash_class=crash.get("kind") if isinstance(crash.get("kind"), str) else None,
        previous_fingerprint=_previous_fingerprint(a),
        sender_uid=sender.get("uid") if isinstance(sender.get("uid"), int) else None,
        nvml_build_id=nvml.get("build_id"), driver=nvml.get("driver_version"),
        namespace=pod.get("namespace"), pod=pod.get("name"), container=pod.get("container"),
        image_digest=pod.get("image_digest"),
        uploaded_to=uploaded.get("url") if isinstance(uploaded.get("url"), str) else None,
        upload_dropped=str(uploaded["dropped"])[:32] if uploaded.get("dropped") else None,
        upload_dropped_why=_dropped_why(uploaded),
        node=agent_node if isinstance(agent_node, str) and agent_node else rec.node,
    )


def _previous_fingerprint(a: dict) -> str | None:
    """The key the definition before the analysis' own gives the crash: ``fingerprint_vN`` for N its
    ``fingerprint_version`` - 1 (an analysis written before the version was carried is of version 3)."""
    version = a.get("fingerprint_version")
    key = a.get(f"fingerprint_v{(version if isinstance(version, int) else 3) - 1}")
    return key if isinstance(key, str) else None


def build_index(core_dir: str, *, limit: int = 1_000_000) -> NodeIndex:
    """Read every crash bundle under ``DIR/crashes`` (oldest first) and group them by fingerprint."""
    crashes_dir = os.path.join(core_dir, CRASHES)
    try:
        names = sorted(os.listdir(crashes_dir))[:limit]
    except OSError:
        names = []
    return group_crashes([e for e in (read_crash(os.path.join(crashes_dir, n)) for n in names) if e is not None])


def group_crashes(entries: list[CrashEntry]) -> NodeIndex:
    """The index of crash entries (any order): oldest first, grouped by fingerprint."""
    entries = sorted(entries, key=lambda e: (e.time, e.id))
    # a crash with nothing to analyze takes the fingerprint of an analyzed crash with the same crash-loop key
    by_key: dict[str, CrashEntry] = {}
    for e in entries:
        if e.fingerprint and e.loop_key:
            by_key.setdefault(e.loop_key, e)
    out: list[CrashEntry] = []
    groups: dict[str, FingerprintGroup] = {}
    for e in entries:
        if not e.fingerprint and e.loop_key in by_key:
            src = by_key[e.loop_key]
            e = replace(e, fingerprint=src.fingerprint, fingerprint_source=f"same crash-loop key as {src.id}",
                        signature=src.signature, crash_class=src.crash_class,
                        nvml_build_id=e.nvml_build_id or src.nvml_build_id, driver=e.driver or src.driver)
        out.append(e)
        if e.is_sent:  # a kill is no crash: in the index, in no fingerprint's group
            continue
        fp = e.fingerprint or "unknown"
        g = groups.get(fp)
        if g is None:
            g = groups[fp] = FingerprintGroup(fingerprint=fp, first_seen=e.time, example=e.path,
                                              signature=e.signature, crash_class=e.crash_class)
        g.count += 1
        g.first_seen = min(g.first_seen, e.time)
        g.last_seen = max(g.last_seen, e.time)
        for s, v in ((g.pods, f"{e.namespace}/{e.pod}" if e.pod else e.pod_uid), (g.containers, e.container),
                     (g.image_digests, e.image_digest), (g.nvml_build_ids, e.nvml_build_id), (g.drivers, e.driver)):
            if v:
                s.add(v)
    return NodeIndex(crashes=out, groups=groups)


#: a bundle whose record or analysis directory changed this recently is read again on the next round too: two
#: changes within one tick of the file system's clock leave the same mtime (git's "racy" rule)
_SETTLE_NS = 2_000_000_000


def _bundle_key(crash_dir: str) -> tuple:
    """What says a bundle changed, for the index: the record and the analysis directory (dev, inode, mtime, size).

    Everything the index reads is written by a rename (``write_atomic``): the record's inode changes, or the
    analysis directory's mtime does (analysis, failure, pod, attempts)."""
    return tuple(_stat_key(os.path.join(crash_dir, rel)) for rel in (RECORD, ANALYSIS_DIR))


class IndexReader:
    """The node index kept between rounds (``agent serve``): each bundle is read once, and again only when it
    changed (:func:`_bundle_key`).

    A round lists ``crashes/`` only when its mtime moved, and looks at the bundles that may change on their own
    (no readable record yet, the handler still writing, an analysis pending, changed in the last 2 s) and those
    :meth:`touch` named; every ``full_every`` seconds it looks at all (a record the budget rewrote, a bundle
    removed by hand). An idle round costs a ``stat`` of the directory. The index it gives is what
    :func:`build_index` would read then; a restarted agent reads every bundle again.
    """

    def __init__(self, core_dir: str, *, limit: int = 1_000_000, full_every: float = 10.0) -> None:
        self.crashes_dir = os.path.join(core_dir, CRASHES)
        self.limit = limit
        self.full_every = full_every
        self.index = NodeIndex(crashes=[], groups={})
        self._read: dict[str, tuple[tuple | None, CrashEntry | None]] = {}  # name -> (key when settled, entry)
        self._names: list[str] = []
        self._listed: tuple | None = None  # the directory's key when it was listed (settled)
        self._full_at = -float("inf")
        self._touched: set[str] = set()

    def touch(self, crash_dir: str) -> None:
        """Read this bundle again on the next round (the agent wrote into it)."""
        self._touched.add(os.path.basename(crash_dir.rstrip("/")))

    def refresh(self) -> bool:
        """Read what changed since the last call; True when the index changed."""
        now, mono = time.time_ns(), time.monotonic()
        full = mono - self._full_at >= self.full_every
        if full:
            self._full_at = mono
        listed = _stat_key(self.crashes_dir)
        if full or listed is None or listed != self._listed:
            try:
                self._names = sorted(os.listdir(self.crashes_dir))[:self.limit]
            except OSError:
                self._names = []
            self._listed = listed if listed is not None and listed[2] < now - _SETTLE_NS else None
        touched, self._touched = self._touched, set()
        changed = len(self._names) != len(self._read)
        read: dict[str, tuple[tuple | None, CrashEntry | None]] = {}
        for name in self._names:
            before = self._read.get(name)
            if not full and before is not None and before[0] is not None and name not in touched \
                    and not _may_change(before[1]):
                read[name] = before
                continue
            crash_dir = os.path.join(self.crashes_dir, name)
            key = _bundle_key(crash_dir)
            if before is not None and before[0] == key and name not in touched:
                read[name] = before
                continue
            entry = read_crash(crash_dir)
            changed = changed or before is None or before[1] != entry
            settled = all(k is None or k[2] < now - _SETTLE_NS for k in key)
            read[name] = (key if settled else None, entry)
        self._read = read
        if changed:
            self.index = group_crashes([e for _, e in read.values() if e is not None])
        return changed


def _stat_key(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _may_change(entry: CrashEntry | None) -> bool:
    """A bundle that changes without the agent: no readable record yet, the handler still writing, or its
    analysis pending (the agent's own writes are :meth:`IndexReader.touch`-ed)."""
    return entry is None or entry.analysis == "pending" or entry.in_progress
