"""The ``result`` object of ``forensics verify-imports --json`` (the text is :mod:`forensics.text.imports`)."""
from __future__ import annotations

from ..output import to_jsonable
from .model import ImportReport

__all__ = ["report_payload", "load_import_report"]


def report_payload(report: ImportReport, *, strict: bool = False) -> dict:
    """The ``result`` object of ``forensics verify-imports --json`` (plus ``ok``, ``failures`` and a verdict
    summary; ``ok`` and ``failures`` under ``--strict`` when ``strict``)."""
    data = to_jsonable(report)
    data["failures"] = list(report.failures(strict=strict))
    data["ok"] = not data["failures"]
    data["verdicts"] = {c.module: c.verdict.value for c in report.modules}
    for c_json, c in zip(data["modules"], report.modules, strict=True):
        c_json["effective_version"] = c.effective_version
        c_json["fails"] = c.fails
        # flat conveniences for readers of the evidence (forensics report): the version that imports, its file
        c_json["version"] = c.effective_version
        c_json["file"] = c.resolved.file if c.resolved else None
    data["image"]["digest"] = report.image.manifest_digest
    if report.execute is not None:
        data["execute"]["agrees"] = report.execute.agrees
    return data


def load_import_report(doc: object) -> ImportReport:
    """The :class:`ImportReport` a ``forensics verify-imports --json`` document holds (the inverse of
    :func:`report_payload`; its conveniences are the record's properties again).

    :raises ArtifactFormatError: not a ``verify-imports`` document of this schema version, or a value of the
        wrong type
    """
    from ..jsonrecords import load_document

    return load_document(doc, "verify-imports", "result", ImportReport)
