"""The claims record ``report -o`` writes beside a report (each claim of the conclusion as written, and the
evidence items it rests on, and every sentence it wrote), and the check of a written body against it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .markdown import escape, prose_lines
from ..output import escape_text

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every command)
if TYPE_CHECKING:
    from .make import Report

__all__ = ["claims_path_for", "claims_record", "check_claims", "check_claims_file", "MAX_CLAIMS_BYTES"]


def claims_path_for(output: str) -> Path:
    """``report-nvml.md`` -> ``report-nvml.claims.json`` (beside it): the claims and the evidence they rest on."""
    out = Path(output)
    return out.with_name((out.stem if out.suffix == ".md" else out.name) + ".claims.json")


def _claim_lines(body: str, rendered: list[str]) -> list[tuple[str, list[str]]]:
    """The body's lines that hold a claim, each with what is left of it once its claims are taken out (pieces)."""
    out = []
    for line in body.split("\n"):
        if not any(r and r in line for r in rendered):
            continue
        for r in sorted(rendered, key=len, reverse=True):  # the longest first: a claim may contain a shorter one
            if r:
                line = line.replace(r, "\0")
        out.append((line, [x.strip() for x in line.split("\0") if x.strip()]))
    return out


def claims_record(rep: Report) -> dict[str, Any]:
    """What ``report -o`` writes beside the report (:func:`claims_path_for`): the incident, each claim of the
    conclusion as written in the body and the evidence items it rests on (``--explain``'s data), and what else the
    lines holding the conclusion say (their frame: ``**Conclusion:**``, a table's cells), and every sentence of
    the body outside fenced blocks as written (:func:`~.markdown.prose_lines`) -- so that ``report --check FILE``
    can tell a claim the evidence carries, or a sentence ``report`` wrote, from one added by hand."""
    from ..output import text_document
    from .explain import explanation

    c = rep.context.conclusion
    e = explanation(c)
    claims = [{"text": cl["text"], "written": escape(cl["text"]), "evidence": cl["evidence"]} for cl in e["claims"]]
    frames = sorted({p for _line, pieces in _claim_lines(rep.body, [x["written"] for x in claims]) for p in pieces})
    sentences = sorted({s for _i, line in prose_lines(text_document(rep.body)) for s in line})
    return {"incident": e["incident"], "template": rep.context.template, "claims": claims, "frame": frames,
            "sentences": sentences}


def check_claims(body: str, incident: str, record: Any) -> list[str]:
    """The problems of a written body against its claims record: a claim the record gives no evidence for, a
    sentence on the conclusion's lines that is no recorded claim, or anywhere else one ``report -o`` did not write
    (added by hand), a conclusion that is not in the body at all, a record of another incident class."""
    if not isinstance(record, dict) or not isinstance(record.get("claims"), list):
        return ["the claims record is not one report -o wrote (no claims list)"]
    problems = []
    if str(record.get("incident") or "") != incident:
        problems.append(f"the claims record is of incident {record.get('incident')!r}, the report's front matter "
                        f"says {incident!r}")
    rendered = []
    for cl in record["claims"]:
        text = str(cl.get("text") or "") if isinstance(cl, dict) else ""
        ev = cl.get("evidence") if isinstance(cl, dict) else None
        if not isinstance(ev, list) or not ev or not all(isinstance(i, dict) and i.get("fact") for i in ev):
            problems.append(f"claim without evidence: {escape_text(text[:120])!r}")
        rendered.append(str(cl.get("written") or escape(text)) if isinstance(cl, dict) else "")
    frames = {str(x) for x in record.get("frame") or []}
    lines = _claim_lines(body, rendered)
    if rendered and not lines:
        problems.append("the conclusion is not in the report as written: none of its recorded claims is there")
    for _line, pieces in lines:
        problems += [f"claim without evidence: {escape_text(p[:200])!r} (not in the claims record)"
                     for p in pieces if p not in frames]
    return problems + _unwritten_sentences(body, rendered, record.get("sentences"))


def _unwritten_sentences(body: str, rendered: list[str], sentences: object) -> list[str]:
    """A problem for each sentence outside the conclusion's lines (checked against the claims) that is not one
    ``report -o`` wrote (``sentences``: the claims record's)."""
    if not isinstance(sentences, list):
        return ["the claims record lists no sentences (an older report -o wrote it): the sentences outside the "
                "conclusion cannot be checked; write the report again"]
    written = {str(s) for s in sentences}
    claimed = {i for i, line in enumerate(body.split("\n")) if any(r and r in line for r in rendered)}
    return [f"claim without evidence: {escape_text(s[:200])!r} (not in the report as report -o wrote it)"
            for i, line in prose_lines(body) if i not in claimed for s in line if s not in written]


#: a claims record is a few KiB; a bigger file is not one report -o wrote (and is not read)
MAX_CLAIMS_BYTES = 16 << 20


def check_claims_file(path: str, body: str, incident: str) -> list[str]:
    sidecar = claims_path_for(path)
    if not sidecar.is_file():
        return [f"no claims record {sidecar.name} beside it (report -o writes one): its claims cannot be checked"]
    if sidecar.stat().st_size > MAX_CLAIMS_BYTES:
        return [f"{sidecar.name}: more than {MAX_CLAIMS_BYTES} bytes: not a claims record report -o wrote"]
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8", errors="replace"))
    except ValueError as e:
        return [f"{sidecar.name}: not JSON ({str(e)[:100]})"]
    return check_claims(body, incident, record)
