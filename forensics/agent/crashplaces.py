"""Where crashes' bundles live, read for ``forensics fleet --bundles``: :class:`~forensics.fleet.model.CrashPlace`
records (fingerprint, node, time, location) from the bundles themselves.

- A core directory (the handler's ``DIR``, with ``crashes/``) or one crash bundle: each crash as the agent's index
  reads it (:func:`~.nodeindex.read_crash`: the fingerprint of its ``60-analysis/``, or of an analyzed crash with
  the same crash-loop key); located at the bucket URL its ``70-upload.json`` names once ``agent serve --upload``
  put it there, else at its local path.
- An ``s3://`` prefix: the bundles under it, from their ``UPLOAD.json`` records alone (``place``: the fingerprint,
  node and time the upload recorded); located at the bundle's ``s3://`` URL. Nothing else is downloaded.

A crash without a fingerprint (not analyzed, nothing to analyze) is not placed.
"""
from __future__ import annotations

import os

from ..bundle.layout import CRASHES, RECORD
from ..errors import FleetInputError
from ..fleet.model import CrashPlace
from .nodeindex import build_index, group_crashes, read_crash

__all__ = ["read_crash_places", "MAX_PLACES"]

MAX_PLACES = 1_000_000  # crashes of one source read (a core directory's; a bucket prefix has objstore's bound)
_HELP = "Pass a core directory (DIR with crashes/), a crash bundle (with metadata.json) or an s3:// prefix of bundles."


def read_crash_places(sources: tuple[str, ...], opts=None, *,
                      problems: list[str] | None = None) -> tuple[CrashPlace, ...]:
    """The crashes with a fingerprint of every source, in the order given (see the module docstring).

    :param opts: :class:`~forensics.objstore.client.StoreOptions` for ``s3://`` sources
    :param problems: where what a bucket did not let be read is said (a listing cut short, a record late or
        malformed: one line each); the rest is read
    :raises FleetInputError: a local source that is neither a core directory nor a crash bundle
    :raises ObjectNotFound: an ``s3://`` source with no bundle under it
    :raises ObjectStoreError: the store refused, or a record is not JSON
    """
    out: list[CrashPlace] = []
    for src in sources:
        out += _bucket_places(src, opts, problems) if src.startswith("s3://") else _local_places(src)
    return tuple(out)


def _local_places(path: str) -> list[CrashPlace]:
    if os.path.isdir(os.path.join(path, CRASHES)):
        entries = build_index(path, limit=MAX_PLACES).crashes
    elif os.path.isfile(os.path.join(path, RECORD)):
        one = read_crash(path)
        entries = group_crashes([one]).crashes if one is not None else []
    else:
        raise FleetInputError(f"--bundles {path}: neither a core directory ({CRASHES}/) nor a crash bundle ({RECORD})",
                              help_text=_HELP)
    return [CrashPlace(fingerprint=e.fingerprint, node=e.node, time=e.time,
                       location=e.uploaded_to or os.path.abspath(e.path)) for e in entries if e.fingerprint]


def _bucket_places(url: str, opts, problems: list[str] | None) -> list[CrashPlace]:
    from ..objstore.client import StoreOptions, parse_object_url
    from ..objstore.fetch import read_bundle_places

    return [CrashPlace(fingerprint=p.fingerprint, node=p.node, time=p.time if p.time is not None else 0.0,
                       location=p.location)
            for p in read_bundle_places(parse_object_url(url), opts or StoreOptions(), problems=problems)
            if p.fingerprint]
