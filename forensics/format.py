"""The ``analysis`` object of ``forensics analyze --json``: the analysis as JSON values.

The JSON document (:func:`forensics.output.json_document`) is the contract; the text for
people is :mod:`forensics.text.analysis`.
"""
from __future__ import annotations

from .views.frames import merge_frames
from .views.signature import exit_explanation, signature
from .model import Analysis, BatchResult, NativeFrame
from .output import to_jsonable

__all__ = ["analysis_payload", "load_analysis", "load_batch"]


def analysis_payload(analysis: Analysis, *, merged: bool = False) -> dict:
    """The ``analysis`` object of ``forensics analyze --json``.  Threads stopped at the same pcs share their
    native frames' records, and their JSON values share them too (:func:`~forensics.output.to_jsonable`'s
    ``shared``): the result is for reading (a document, a redaction), not for changing in place."""
    data = to_jsonable(analysis, shared=(NativeFrame,))
    data["signature"] = signature(analysis)
    data["crash"]["exit_status"] = analysis.crash.exit_status
    data["exit_explanation"] = exit_explanation(analysis)
    if merged:
        entries: dict[tuple[str, int], dict] = {}  # (kind, id(frame)) -> its merged entry, made once
        for t_json, thread in zip(data["snapshot"]["threads"], analysis.snapshot.threads, strict=True):
            t_json["merged"] = merged_json = []
            for kind, frame in merge_frames(thread):
                entry = entries.get((kind.value, id(frame)))
                if entry is None:
                    entry = entries[kind.value, id(frame)] = {"kind": kind.value, **to_jsonable(frame)}
                merged_json.append(entry)
    return data


def load_analysis(doc: object) -> Analysis:
    """The :class:`Analysis` a ``forensics analyze --json`` document holds: the inverse of
    :func:`analysis_payload` (the values it adds, ``signature``, ``exit_explanation``, ``merged``, are derived
    from the record again).  The one way an analysis is read back (``forensics report``).

    :raises ArtifactFormatError: not an ``analyze`` document, another or no ``schema_version``, a value of the
        wrong type or form
    """
    from .jsonrecords import load_document

    return load_document(doc, "analyze", "analysis", Analysis)


def load_batch(doc: object) -> BatchResult:
    """The :class:`BatchResult` a ``forensics analyze --json`` document of several cores (``analyze-batch``)
    holds under ``batch``: its groups (count, first and last seen), the cores that failed, the snapshots.

    :raises ArtifactFormatError: not an ``analyze-batch`` document, another or no ``schema_version``, a value of
        the wrong type or form
    """
    from .jsonrecords import load_document

    return load_document(doc, "analyze-batch", "batch", BatchResult)
