"""A report written: the Markdown file, its claims record and its attachments beside it (``<stem>.files/``),
each new unless ``--force``."""
from __future__ import annotations

import json
from pathlib import Path

from .claims import claims_path_for, claims_record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every command)
if TYPE_CHECKING:
    from .make import Report

__all__ = ["write_report", "attachment_dir_for"]


def write_report(rep: Report, output: str, *, force: bool = False) -> list[str]:
    """Write the report to ``output`` and its attachments into ``<output stem>.files/`` beside it.

    :return: the paths written
    :raises OutputExists: when a file exists and not ``force``
    """
    from ..errors import OutputExists
    from ..output import check_output_path, text_document, write_new

    check_output_path(output)  # its directory exists: nothing is created above the report
    out = Path(output)
    files_dir = attachment_dir_for(output)
    written = []
    claims = json.dumps(claims_record(rep).to_json(), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    targets = [(out, rep.markdown), (claims_path_for(output), claims)] + [
        (files_dir / name, text) for name, text in sorted(rep.attachments.items())]
    if not force:
        for p, _ in targets:
            if p.exists():
                raise OutputExists(str(p))
    if rep.attachments:
        files_dir.mkdir(exist_ok=True)
    for p, text in targets:
        write_new(str(p), text_document(text), force)  # the text stdout gets: escaped once, here
        written.append(str(p))
    return written


def attachment_dir_for(output: str) -> Path:
    """``report-nvml.md`` -> ``report-nvml.files`` (beside it)."""
    out = Path(output)
    return out.with_name((out.stem if out.suffix == ".md" else out.name) + ".files")
