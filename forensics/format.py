"""The ``analysis`` object of ``forensics analyze --json``: the analysis as JSON values.

The JSON document (:func:`forensics.output.json_document`) is the contract; the text for
people is :mod:`forensics.text.analysis`.
"""
from __future__ import annotations

from .analyze.signature import exit_explanation, signature
from .analyze.stacks import merge_frames
from .model import Analysis, BatchResult
from .output import to_jsonable

__all__ = ["analysis_payload", "load_analysis", "load_batch"]


def analysis_payload(analysis: Analysis, *, merged: bool = False) -> dict:
    """The ``analysis`` object of ``forensics analyze --json``."""
    data = to_jsonable(analysis)
    data["signature"] = signature(analysis)
    data["crash"]["exit_status"] = analysis.crash.exit_status
    data["exit_explanation"] = exit_explanation(analysis)
    if merged:
        for t_json, thread in zip(data["snapshot"]["threads"], analysis.snapshot.threads, strict=True):
            t_json["merged"] = [
                {"kind": kind.value, **to_jsonable(frame)} for kind, frame in merge_frames(thread)
            ]
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
