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
    oldest_pending_seconds: float = 0.0  # since the oldest of them crashed


def _uploaded_bytes(crash_dir: str) -> int:
    try:
        with open(os.path.join(crash_dir, layout.UPLOADED), "rb") as f:
            doc = json.loads(f.read(1 << 16))
    except (OSError, ValueError):  # cut by a full disk: counted, its bytes unknown
        return 0
    n = doc.get("bytes") if isinstance(doc, dict) else None
    return n if isinstance(n, int) and n >= 0 else 0


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
        self.failures = 0
        self.stats = UploadStats()
        self.last_shipped: str | None = None  # the crash directory uploaded last (for the index to read again)

    def ship_next(self, index: NodeIndex) -> bool:
        """Upload one ready crash (or finish trimming one); True when one was."""
        now = self.clock()
        ready: list[tuple[str, str]] = []
        pending: dict[str, float] = {}  # crash directory -> when it crashed
        trim: str | None = None
        for c in index.crashes:
            if c.path in self.done or c.in_progress:
                continue
            if is_uploaded(c.path):
                self.done[c.path] = _uploaded_bytes(c.path)
                if not self.cfg.keep and os.path.lexists(os.path.join(c.path, layout.MANIFEST)):
                    trim = trim or c.path  # an agent stopped between the record and the trim
                continue
            if not os.path.isdir(c.path):
                continue
            pending[c.path] = c.time
            if c.analysis != "pending" and self.retry.get(c.path, (0.0, 0.0))[0] <= now:
                ready.append((c.path, c.id))
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

    def _count(self, pending: dict[str, float]) -> None:
        self.stats = UploadStats(
            uploaded=len(self.done), uploaded_bytes=sum(self.done.values()), failures=self.failures,
            pending=len(pending),
            oldest_pending_seconds=max(0.0, time.time() - min(pending.values())) if pending else 0.0)

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
        sent = sum(o.size for o in result.objects)
        doc = {"url": result.url, "record": result.record, "objects": len(result.objects), "bytes": sent,
               "uploaded_at": time.time(), "kept": self.cfg.keep}
        write_atomic(os.path.join(crash_dir, layout.UPLOADED),
                     (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o640)
        if not self.cfg.keep:
            trim_uploaded(crash_dir)
        self.done[crash_dir] = sent
        self.last_shipped = crash_dir
        return True
