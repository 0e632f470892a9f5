"""``agent serve --upload``: each crash's bundle into the bucket once the agent is done with it; then the node
keeps only what its index reads.

A crash is ready when the handler's record is done and its analysis is not pending (done, failed, or nothing
to analyze: a metadata-only crash), and it has no ``70-upload.json``.  It is uploaded whole
(:func:`forensics.objstore.upload.upload_bundle`, every object verified, ``60-analysis/`` included, the
node's copy kept by that call), then ``70-upload.json`` is written (the bundle's URL, its ``UPLOAD.json``,
objects, bytes, when), then -- unless ``keep`` -- everything but the handler's record (``metadata.json``),
the agent's ``60-analysis/`` and ``70-upload.json`` is deleted: the core and the evidence are in the bucket,
the index still counts the crash with its fingerprint and pod, and says where its bundle went.

Pending uploads are the crashes without ``70-upload.json``: an agent restarted finds them again.  A failed
upload leaves the bundle whole and is tried again after 30 s, doubling to an hour (a restarted agent tries at
once); its one line goes to stderr.  One bundle at a time, in the agent's loop, after the analyses waiting:
memory and network are :class:`~forensics.objstore.client.StoreOptions`' (parts in flight, bandwidth).

The queue is bounded: when more than ``max_pending`` crashes, or more than ``max_pending_bytes`` of them on the
node's disk, wait for the bucket (unreachable for hours), the oldest analyzed ones are given up until it fits:
``70-upload.json`` says so (``dropped``: ``queue-count`` or ``queue-bytes``, the bound, the queue then), its
stderr line, ``forensics_uploads_dropped_total{reason}``, and the bundle is trimmed as after an upload (the
record and the analysis stay; ``keep``: nothing deleted).  A crash given up is never uploaded or dropped again.
The pending bundles are files of the core directory, so its disk budget (the handler's) counts them too.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..bundle import layout
from ..errors import ForensicsError
from ..objstore.client import ObjectURL, StoreOptions
from ..output import escape_text
from .nodeindex import NodeIndex

__all__ = ["UploadConfig", "UploadStats", "Shipper", "is_uploaded", "trim_uploaded"]

RETRY_FIRST = 30.0
RETRY_MAX = 3600.0
#: what stays on the node after a verified upload: what the index reads, and where the bundle went
_KEPT = (layout.RECORD, layout.ANALYSIS_DIR, layout.UPLOADED)


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadConfig:
    dest: ObjectURL
    opts: StoreOptions
    cluster: str
    keep: bool = False
    max_pending: int = 500  # crashes waiting for the bucket at most; the oldest given up past it
    max_pending_bytes: int = 10 << 30  # their bytes on the node's disk at most


#: why a crash's upload was given up (70-upload.json's ``dropped``; the metric's ``reason``)
DROP_REASONS = ("queue-count", "queue-bytes")


def is_uploaded(crash_dir: str) -> bool:
    return os.path.isfile(os.path.join(crash_dir, layout.UPLOADED))


def trim_uploaded(crash_dir: str) -> None:
    """Delete what the bucket holds now: everything of the crash's directory but :data:`_KEPT` (no link
    followed: a directory is removed as itself)."""
    for entry in os.scandir(crash_dir):
        if entry.name in _KEPT:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadStats:
    """What the metrics say of the uploads: counted from the crashes' directories (``70-upload.json``), but the
    failures (attempts since the agent started)."""

    uploaded: int = 0
    uploaded_bytes: int = 0
    failures: int = 0
    pending: int = 0  # crashes not uploaded yet (their analysis first)
    pending_bytes: int = 0  # their bytes on the node's disk
    oldest_pending_seconds: float = 0.0  # since the oldest of them crashed
    dropped: tuple[tuple[str, int], ...] = tuple((r, 0) for r in DROP_REASONS)  # uploads given up, by reason


def _upload_record(crash_dir: str) -> tuple[int, str | None]:
    """(bytes uploaded, why given up or None) from the crash's ``70-upload.json``."""
    try:
        with open(os.path.join(crash_dir, layout.UPLOADED), "rb") as f:
            doc = json.loads(f.read(1 << 16))
    except (OSError, ValueError):  # cut by a full disk: counted as uploaded, its bytes unknown
        return 0, None
    if not isinstance(doc, dict):
        return 0, None
    if doc.get("dropped") is not None:
        return 0, doc["dropped"] if doc["dropped"] in DROP_REASONS else "queue-count"
    n = doc.get("bytes")
    return (n if isinstance(n, int) and n >= 0 else 0), None


class Shipper:
    """Uploads the oldest ready crash on each call of :meth:`ship_next`; :attr:`stats` for the metrics (a new
    record each round: the metrics thread reads it whole)."""

    def __init__(self, cfg: UploadConfig, node: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.node = node
        self.clock = clock
        self.retry: dict[str, tuple[float, float]] = {}  # crash directory -> (not before, last delay)
        # crash directories uploaded, with their bytes: skipped without a look at the disk, so an idle agent's
        # round costs no stat per crash
        self.done: dict[str, int] = {}
        self.dropped: dict[str, str] = {}  # crash directory -> why its upload was given up
        self.sizes: dict[str, int] = {}  # a pending crash directory's bytes on disk (sealed: counted once)
        self.failures = 0
        self.stats = UploadStats()
        self.changed: list[str] = []  # crash directories uploaded or given up (for the index to read again)

    def ship_next(self, index: NodeIndex) -> bool:
        """Upload one ready crash (or finish trimming one); True when one was."""
        now = self.clock()
        ready: list[tuple[str, str]] = []
        pending: dict[str, float] = {}  # crash directory -> when it crashed
        trim: str | None = None
        for c in index.crashes:
            if c.path in self.done or c.path in self.dropped or c.in_progress:
                continue
            if is_uploaded(c.path):
                sent, why = _upload_record(c.path)
                if why is not None:
                    self.dropped[c.path] = why
                else:
                    self.done[c.path] = sent
                if not self.cfg.keep and os.path.lexists(os.path.join(c.path, layout.MANIFEST)):
                    trim = trim or c.path  # an agent stopped between the record and the trim
                continue
            if not os.path.isdir(c.path):
                continue
            pending[c.path] = c.time
            if c.analysis != "pending" and self.retry.get(c.path, (0.0, 0.0))[0] <= now:
                ready.append((c.path, c.id))
        gone = self._bound(index, pending)
        ready = [r for r in ready if r[0] not in gone]
        self._count(pending)
        if trim is not None:
            trim_uploaded(trim)
            return True
        if not ready:
            return False
        shipped = self._ship(*ready[0])
        if shipped:
            pending.pop(ready[0][0], None)
        self._count(pending)
        return shipped

    def _bound(self, index: NodeIndex, pending: dict[str, float]) -> set[str]:
        """Give up the oldest analyzed crashes of ``pending`` while it is over a bound; the ones given up (taken
        out of ``pending``)."""
        from .store import disk_usage

        for path in pending:
            if path not in self.sizes:
                self.sizes[path] = disk_usage(path)
        total = sum(self.sizes[p] for p in pending)
        gone: set[str] = set()
        ids = {c.path: (c.id, c.analysis) for c in index.crashes}
        for path in sorted(pending, key=lambda p: (pending[p], p)):
            over = "queue-count" if len(pending) > self.cfg.max_pending else \
                "queue-bytes" if total > self.cfg.max_pending_bytes else None
            if over is None:
                break
            crash_id, analysis = ids[path]
            if analysis == "pending":  # its analysis first: the next one may go
                continue
            self._drop(path, crash_id, over, queued=len(pending), queued_bytes=total)
            total -= self.sizes.pop(path, 0)
            pending.pop(path)
            gone.add(path)
        return gone

    def _drop(self, crash_dir: str, crash_id: str, why: str, *, queued: int, queued_bytes: int) -> None:
        from ..bundle.write import write_atomic

        bound = self.cfg.max_pending if why == "queue-count" else self.cfg.max_pending_bytes
        doc = {"dropped": why, "dropped_at": time.time(), "bound": bound, "queued": queued,
               "queued_bytes": queued_bytes, "failures_since_start": self.failures, "kept": self.cfg.keep}
        write_atomic(os.path.join(crash_dir, layout.UPLOADED),
                     (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o640)
        what = "the bundle kept on the node" if self.cfg.keep else "only its record and analysis kept on the node"
        unit = "crashes" if why == "queue-count" else "bytes"
        print(escape_text(f"forensics agent serve: upload of {crash_id} given up ({why}: {queued} crashes, "
                          f"{queued_bytes} bytes wait for the bucket, more than {bound} {unit}); {what}"),
              file=sys.stderr, flush=True)
        if not self.cfg.keep:
            trim_uploaded(crash_dir)
        self.retry.pop(crash_dir, None)
        self.dropped[crash_dir] = why
        self.changed.append(crash_dir)

    def _count(self, pending: dict[str, float]) -> None:
        by_reason = {r: 0 for r in DROP_REASONS}
        for why in self.dropped.values():
            by_reason[why] += 1
        self.stats = UploadStats(
            uploaded=len(self.done), uploaded_bytes=sum(self.done.values()), failures=self.failures,
            pending=len(pending), pending_bytes=sum(self.sizes.get(p, 0) for p in pending),
            oldest_pending_seconds=max(0.0, time.time() - min(pending.values())) if pending else 0.0,
            dropped=tuple(by_reason.items()))

    def _ship(self, crash_dir: str, crash_id: str) -> bool:
        from ..objstore.upload import read_place, upload_bundle
        from ..bundle.write import write_atomic

        try:
            place = read_place(crash_dir, cluster=self.cfg.cluster, node=self.node)
            result = upload_bundle(crash_dir, self.cfg.dest, place, self.cfg.opts, keep=True)
        except (ForensicsError, OSError) as e:
            delay = min(RETRY_MAX, max(RETRY_FIRST, 2 * self.retry.get(crash_dir, (0.0, 0.0))[1]))
            self.retry[crash_dir] = (self.clock() + delay, delay)
            self.failures += 1
            print(escape_text(f"forensics agent serve: upload of {crash_id}: {e} (again in {delay:g}s; the "
                              "bundle stays whole)"), file=sys.stderr, flush=True)
            return False
        self.retry.pop(crash_dir, None)
        self.sizes.pop(crash_dir, None)
        sent = sum(o.size for o in result.objects)
        doc = {"url": result.url, "record": result.record, "objects": len(result.objects), "bytes": sent,
               "uploaded_at": time.time(), "kept": self.cfg.keep}
        write_atomic(os.path.join(crash_dir, layout.UPLOADED),
                     (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o640)
        if not self.cfg.keep:
            trim_uploaded(crash_dir)
        self.done[crash_dir] = sent
        self.changed.append(crash_dir)
        return True
