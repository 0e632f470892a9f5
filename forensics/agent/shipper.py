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
once); its one line goes to stderr, and the core directory's ``upload-attempts.json`` counts it by crash (a
restart does not begin the count again).
One bundle at a time, in the agent's loop, after the analyses waiting: memory and network are
:class:`~forensics.objstore.client.StoreOptions`' (parts in flight, bandwidth).

No upload waits forever.  What the agent wrote itself (``60-analysis/``, ``UPLOAD.json``) is overwritten in the
bucket when the same crash is uploaded again (:mod:`forensics.objstore.upload`); other bytes at the key of a
file the handler captured are a conflict no retry mends, and the upload is given up at once (``conflict``);
any other failure is tried again up to ``max_attempts`` times in all, then given up (``attempts``).  Either
keeps the whole bundle on the node (nothing captured is lost: ``forensics upload`` can send it by hand once
the bucket is mended) and is said as the queue's bounds say it, below, and in a Kubernetes Event
(``UploadDropped``, :mod:`.events`).

The queue is bounded: when more than ``max_pending`` crashes, or more than ``max_pending_bytes`` of them on the
node's disk, wait for the bucket (unreachable for hours), the oldest analyzed ones are given up until it fits:
``70-upload.json`` says so (``dropped``: ``queue-count`` or ``queue-bytes``, the bound, the queue then, ``why``
in words), its stderr line, ``forensics_uploads_dropped_total{reason}``, the Event, and the bundle is trimmed as
after an upload (the record and the analysis stay; ``keep``: nothing deleted).  A crash given up is never
uploaded or dropped again (remove its ``70-upload.json`` to have it tried again).
The pending bundles are files of the core directory, so its disk budget (the handler's) counts them too.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..bundle import layout
from ..errors import ForensicsError, UploadConflict
from ..objstore.client import ObjectURL, StoreOptions
from ..output import escape_text
from .nodeindex import NodeIndex

__all__ = ["UploadConfig", "UploadStats", "Shipper", "is_uploaded", "trim_uploaded"]

RETRY_FIRST = 30.0
RETRY_MAX = 3600.0
MAX_ATTEMPTS = 20  # failed attempts of one crash's upload at most (30 s doubling to an hour apart: ~13 hours)
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
    max_attempts: int = MAX_ATTEMPTS  # failed attempts of one crash's upload at most; then given up


#: why a crash's upload was given up (70-upload.json's ``dropped``; the metric's ``reason``)
DROP_REASONS = ("queue-count", "queue-bytes", "conflict", "attempts")


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


def _upload_record(crash_dir: str) -> tuple[int, str | None, bool]:
    """(bytes uploaded, why given up or None, the whole bundle kept) from the crash's ``70-upload.json``."""
    try:
        with open(os.path.join(crash_dir, layout.UPLOADED), "rb") as f:
            doc = json.loads(f.read(1 << 16))
    except (OSError, ValueError):  # cut by a full disk: counted as uploaded, its bytes unknown
        return 0, None, True
    if not isinstance(doc, dict):
        return 0, None, True
    whole = doc.get("kept") is not False
    if doc.get("dropped") is not None:
        return 0, (doc["dropped"] if doc["dropped"] in DROP_REASONS else "queue-count"), whole
    n = doc.get("bytes")
    return (n if isinstance(n, int) and n >= 0 else 0), None, whole


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
        self.attempts: dict[str, dict] | None = None  # crash id -> its failed attempts (upload-attempts.json's)
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
                sent, why, whole = _upload_record(c.path)
                if why is not None:
                    self.dropped[c.path] = why
                else:
                    self.done[c.path] = sent
                if not self.cfg.keep and not (why and whole) and os.path.lexists(os.path.join(c.path, layout.MANIFEST)):
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
        if ready[0][0] in self.done or ready[0][0] in self.dropped:
            pending.pop(ready[0][0], None)
        self._count(pending)
        return shipped

    def _bound(self, index: NodeIndex, pending: dict[str, float]) -> set[str]:
        """Give up the oldest analyzed crashes of ``pending`` while it is over a bound; the ones given up (taken
        out of ``pending``)."""
        from ..capture.store import disk_usage

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
            size = self.sizes.get(path, 0)
            self._drop(path, crash_id, over, queued=len(pending), queued_bytes=total)
            total -= size
            pending.pop(path)
            gone.add(path)
        return gone

    def _drop(self, crash_dir: str, crash_id: str, why: str, *, queued: int, queued_bytes: int) -> None:
        bound = self.cfg.max_pending if why == "queue-count" else self.cfg.max_pending_bytes
        unit = "crashes" if why == "queue-count" else "bytes"
        said = f"{queued} crashes, {queued_bytes} bytes waited for the bucket, more than {bound} {unit}"
        self._give_up(crash_dir, crash_id, why, said, {"bound": bound, "queued": queued, "queued_bytes": queued_bytes},
                      trim=not self.cfg.keep)

    def _give_up(self, crash_dir: str, crash_id: str, why: str, said: str, fields: dict, *, trim: bool) -> None:
        """Record that the upload of the crash at ``crash_dir`` is given up for ``why`` (a :data:`DROP_REASONS`),
        ``said`` in words: its ``70-upload.json``, a stderr line, the metric (:attr:`stats`) and, through the
        index, the Event; then trim the bundle as after an upload, or (not ``trim``) keep it whole."""
        from ..bundle.write import write_atomic

        doc = {"dropped": why, "why": said, "dropped_at": time.time(), "failures_since_start": self.failures,
               "kept": not trim, **fields}
        write_atomic(os.path.join(crash_dir, layout.UPLOADED),
                     (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o640)
        what = "the bundle kept on the node" if not trim else "only its record and analysis kept on the node"
        print(escape_text(f"forensics agent serve: upload of {crash_id} given up ({why}: {said}); {what}"),
              file=sys.stderr, flush=True)
        if trim:
            trim_uploaded(crash_dir)
        self._forget_attempts(crash_dir)
        self.retry.pop(crash_dir, None)
        self.sizes.pop(crash_dir, None)
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

    def _attempts_of(self, crash_dir: str) -> int:
        """The failed attempts of the crash's upload so far: its entry in the core directory's
        ``upload-attempts.json`` (read once), or what this agent counted where that file could not be written."""
        if self.attempts is None:
            self.attempts = _read_attempts(_attempts_file(crash_dir))
        entry = self.attempts.get(os.path.basename(crash_dir))
        n = entry.get("attempts") if isinstance(entry, dict) else None
        return n if isinstance(n, int) and n >= 0 else 0

    def _attempted(self, crash_dir: str, error: str) -> int:
        """Count one more failed attempt of the crash's upload; the count now."""
        n = self._attempts_of(crash_dir) + 1
        assert self.attempts is not None
        self.attempts[os.path.basename(crash_dir)] = {"attempts": n, "last_error": error[:300], "last_at": time.time()}
        self._write_attempts(crash_dir)
        return n

    def _forget_attempts(self, crash_dir: str) -> None:
        if self.attempts is not None and self.attempts.pop(os.path.basename(crash_dir), None) is not None:
            self._write_attempts(crash_dir)

    def _write_attempts(self, crash_dir: str) -> None:
        from ..bundle.write import write_atomic

        assert self.attempts is not None
        crashes = os.path.dirname(os.path.abspath(crash_dir))  # crashes the budget deleted meanwhile: forgotten
        self.attempts = {k: v for k, v in self.attempts.items() if os.path.isdir(os.path.join(crashes, k))}
        with contextlib.suppress(OSError):  # a full disk: counted in this agent's memory only
            write_atomic(_attempts_file(crash_dir), (json.dumps(self.attempts, sort_keys=True) + "\n").encode(),
                         mode=0o640)

    def _ship(self, crash_dir: str, crash_id: str) -> bool:
        from ..objstore.upload import read_place, upload_bundle
        from ..bundle.write import write_atomic

        try:
            place = read_place(crash_dir, cluster=self.cfg.cluster, node=self.node)
            result = upload_bundle(crash_dir, self.cfg.dest, place, self.cfg.opts, keep=True)
        except UploadConflict as e:  # other bytes where the core or the evidence go: no retry mends it
            self.failures += 1
            self._give_up(crash_dir, crash_id, "conflict", str(e), {"attempts": self._attempts_of(crash_dir) + 1,
                                                                     "key": e.url}, trim=False)
            return False
        except (ForensicsError, OSError) as e:
            self.failures += 1
            attempts = self._attempted(crash_dir, str(e))
            if attempts >= self.cfg.max_attempts:
                self._give_up(crash_dir, crash_id, "attempts", f"{attempts} attempts failed, the last: {e}",
                              {"attempts": attempts}, trim=False)
                return False
            delay = min(RETRY_MAX, max(RETRY_FIRST, 2 * self.retry.get(crash_dir, (0.0, 0.0))[1]))
            self.retry[crash_dir] = (self.clock() + delay, delay)
            print(escape_text(f"forensics agent serve: upload of {crash_id}: {e} (attempt {attempts} of "
                              f"{self.cfg.max_attempts}, again in {delay:g}s; the bundle stays whole)"),
                  file=sys.stderr, flush=True)
            return False
        self.retry.pop(crash_dir, None)
        self.sizes.pop(crash_dir, None)
        sent = sum(o.size for o in result.objects)
        doc = {"url": result.url, "record": result.record, "objects": len(result.objects), "bytes": sent,
               "uploaded_at": time.time(), "kept": self.cfg.keep, "attempts": self._attempts_of(crash_dir) + 1,
               "replaced": sorted(o.path for o in result.objects if o.replaced)}
        write_atomic(os.path.join(crash_dir, layout.UPLOADED),
                     (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o640)
        self._forget_attempts(crash_dir)
        if not self.cfg.keep:
            trim_uploaded(crash_dir)
        self.done[crash_dir] = sent
        self.changed.append(crash_dir)
        return True


def _attempts_file(crash_dir: str) -> str:
    """The core directory's ``upload-attempts.json``, beside ``crashes/`` where the crash's directory is."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(crash_dir))), layout.UPLOAD_ATTEMPTS)


def _read_attempts(path: str) -> dict[str, dict]:
    """``upload-attempts.json``: crash id -> its failed attempts, the last error and when (bounded: 8 MiB)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(8 << 20))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in doc.items() if isinstance(v, dict)} if isinstance(doc, dict) else {}
