"""The claims record ``report -o`` writes beside a report (each claim of the conclusion as written, and the
evidence items it rests on, and every sentence it wrote), and the check of a written body against it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .markdown import escape, fenced_lines, prose_lines
from ..output import escape_text
from ..records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every command)
if TYPE_CHECKING:
    from .make import Report

__all__ = ["claims_path_for", "claims_record", "check_claims", "check_claims_file", "MAX_CLAIMS_BYTES", "Claims",
           "RecordedClaim", "ClaimEvidence"]


@record
class ClaimEvidence:
    """An evidence item a claim rests on (``--explain``'s): the fact as the report read it, its key and source."""

    key: str
    source: str
    fact: str


@record
class RecordedClaim:
    """A claim of the conclusion: its text, as written in the body, and the evidence items it rests on (none when
    the record gives none, or gives one without its fact: then the claim is unsupported)."""

    text: str
    written: str
    evidence: tuple[ClaimEvidence, ...] = ()


@record
class Claims:
    """The claims record ``report -o`` writes beside a report (``NAME.claims.json``), read back by ``--check``."""

    incident: str | None
    template: str | None
    claims: tuple[RecordedClaim, ...]
    frame: tuple[str, ...]  # what else the lines holding the conclusion say
    sentences: tuple[str, ...] | None  # every sentence of the body; None: an older report -o wrote none
    # every line of the body's fenced blocks (the commands and their comments, the snippet, the stacks); None: an
    # older report -o wrote none
    fenced: tuple[str, ...] | None = None
    front_matter: dict[str, Any] | None = None  # the front matter as written; None: none was (or an older record)

    def to_json(self) -> dict[str, Any]:
        return {"incident": self.incident, "template": self.template,
                "claims": [{"text": c.text, "written": c.written,
                            "evidence": [{"key": i.key, "source": i.source, "fact": i.fact} for i in c.evidence]}
                           for c in self.claims],
                "frame": list(self.frame), "sentences": None if self.sentences is None else list(self.sentences),
                "fenced": None if self.fenced is None else list(self.fenced), "front_matter": self.front_matter}

    @classmethod
    def from_json(cls, doc: object) -> Claims | None:
        """The record a ``.claims.json`` holds; None when it is not one (not an object, no list of claims).  A claim
        that is not an object reads as an empty one, evidence that is not a list of items each with its fact as
        none: both are then claims without evidence."""
        if not isinstance(doc, dict) or not isinstance(doc.get("claims"), list):
            return None
        incident, template, sentences = doc.get("incident"), doc.get("template"), doc.get("sentences")
        frame, fenced, meta = doc.get("frame"), doc.get("fenced"), doc.get("front_matter")
        return cls(incident=None if incident is None else str(incident),
                   template=None if template is None else str(template),
                   claims=tuple(_recorded_claim(cl) for cl in doc["claims"]),
                   frame=tuple(str(x) for x in frame) if isinstance(frame, list) else (),
                   sentences=tuple(str(s) for s in sentences) if isinstance(sentences, list) else None,
                   fenced=tuple(str(s) for s in fenced) if isinstance(fenced, list) else None,
                   front_matter=meta if isinstance(meta, dict) else None)


def _recorded_claim(cl: object) -> RecordedClaim:
    """A claim of the record as it was written: one that is not an object reads as an empty one, evidence that is
    not a list of items each with its fact as none (both are then claims without evidence)."""
    if not isinstance(cl, dict):
        return RecordedClaim(text="", written="")
    text = str(cl.get("text") or "")
    ev = cl.get("evidence")
    items = (tuple(ClaimEvidence(key=str(i.get("key") or ""), source=str(i.get("source") or ""), fact=str(i["fact"]))
                   for i in ev)
             if isinstance(ev, list) and all(isinstance(i, dict) and i.get("fact") for i in ev) else ())
    return RecordedClaim(text=text, written=str(cl.get("written") or escape(text)) if cl else "", evidence=items)


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


def claims_record(rep: Report) -> Claims:
    """What ``report -o`` writes beside the report (:func:`claims_path_for`): the incident, each claim of the
    conclusion as written in the body and the evidence items it rests on (``--explain``'s data), and what else the
    lines holding the conclusion say (their frame: ``**Conclusion:**``, a table's cells), and every sentence of
    the body outside fenced blocks as written (:func:`~.markdown.prose_lines`) -- so that ``report --check FILE``
    can tell a claim the evidence carries, or a sentence ``report`` wrote, from one added by hand."""
    from ..output import text_document
    from .explain import explanation
    from .frontmatter import split_front_matter

    c = rep.context.conclusion
    e = explanation(c)
    claims = tuple(RecordedClaim(text=cl["text"], written=escape(cl["text"]),
                                 evidence=tuple(ClaimEvidence(**i) for i in cl["evidence"])) for cl in e["claims"])
    frames = sorted({p for _line, pieces in _claim_lines(rep.body, [x.written for x in claims]) for p in pieces})
    body = text_document(rep.body)  # as write_report writes it
    sentences = sorted({s for _i, line in prose_lines(body) for s in line})
    fenced = sorted({line for _i, line in fenced_lines(body)})
    meta = split_front_matter(text_document(rep.markdown))[0] if rep.markdown != rep.body else {}
    return Claims(incident=e["incident"], template=rep.context.template.value, claims=claims, frame=tuple(frames),
                  sentences=tuple(sentences), fenced=tuple(fenced), front_matter=meta or None)


def check_claims(body: str, incident: str, record: Claims | None, front_matter: dict | None = None) -> list[str]:
    """The problems of a written body against its claims record: a claim the record gives no evidence for, a
    sentence on the conclusion's lines that is no recorded claim, or anywhere else one ``report -o`` did not write
    (added by hand), a line of a fenced block (a command's comment, the snippet, a stack) or a value of the front
    matter (the title, where to file it) ``report -o`` did not write, a conclusion that is not in the body at all,
    a record of another incident class."""
    if record is None:
        return ["the claims record is not one report -o wrote (no claims list)"]
    problems = []
    if (record.incident or "") != incident:
        problems.append(f"the claims record is of incident {record.incident!r}, the report's front matter "
                        f"says {incident!r}")
    rendered = []
    for cl in record.claims:
        if not cl.evidence:
            problems.append(f"claim without evidence: {escape_text(cl.text[:120])!r}")
        rendered.append(cl.written)
    frames = set(record.frame)
    lines = _claim_lines(body, rendered)
    if rendered and not lines:
        problems.append("the conclusion is not in the report as written: none of its recorded claims is there")
    for _line, pieces in lines:
        problems += [f"claim without evidence: {escape_text(p[:200])!r} (not in the claims record)"
                     for p in pieces if p not in frames]
    return (problems + _unwritten_sentences(body, rendered, record.sentences) + _unwritten_fenced(body, record.fenced)
            + _unwritten_front_matter(front_matter, record.front_matter))


def _unwritten_fenced(body: str, fenced: tuple[str, ...] | None) -> list[str]:
    """A problem for each line of a fenced block that ``report -o`` did not write there (``fenced``: the claims
    record's): a reproducer's outcome comment changed, a command or a stack line edited."""
    if fenced is None:
        return ["the claims record lists no fenced lines (an older report -o wrote it): the commands, their comments "
                "and the stacks cannot be checked; write the report again"]
    written = set(fenced)
    return [f"claim without evidence: {escape_text(line[:200])!r} (a fenced line report -o did not write)"
            for _i, line in fenced_lines(body) if line not in written]


def _unwritten_front_matter(meta: dict | None, recorded: dict[str, Any] | None) -> list[str]:
    """A problem for each value of the front matter that is not the one ``report -o`` wrote (the title, where and
    when to file it, the incident class, the attachments)."""
    if not meta:
        return []
    if recorded is None:
        return ["the claims record holds no front matter (an older report -o wrote it): the title cannot be "
                "checked; write the report again"]
    return [f"the front matter's {escape_text(str(k))[:60]} is not what report -o wrote: "
            f"{escape_text(repr(v))[:200]}" for k, v in meta.items() if recorded.get(k) != v]


def _unwritten_sentences(body: str, rendered: list[str], sentences: tuple[str, ...] | None) -> list[str]:
    """A problem for each sentence outside the conclusion's lines (checked against the claims) that is not one
    ``report -o`` wrote (``sentences``: the claims record's)."""
    if sentences is None:
        return ["the claims record lists no sentences (an older report -o wrote it): the sentences outside the "
                "conclusion cannot be checked; write the report again"]
    written = set(sentences)
    claimed = {i for i, line in enumerate(body.split("\n")) if any(r and r in line for r in rendered)}
    return [f"claim without evidence: {escape_text(s[:200])!r} (not in the report as report -o wrote it)"
            for i, line in prose_lines(body) if i not in claimed for s in line if s not in written]


#: a claims record is a few KiB; a bigger file is not one report -o wrote (and is not read)
MAX_CLAIMS_BYTES = 16 << 20


def check_claims_file(path: str, body: str, incident: str, front_matter: dict | None = None) -> list[str]:
    sidecar = claims_path_for(path)
    if not sidecar.is_file():
        return [f"no claims record {sidecar.name} beside it (report -o writes one): its claims cannot be checked"]
    if sidecar.stat().st_size > MAX_CLAIMS_BYTES:
        return [f"{sidecar.name}: more than {MAX_CLAIMS_BYTES} bytes: not a claims record report -o wrote"]
    try:
        doc = json.loads(sidecar.read_text(encoding="utf-8", errors="replace"))
    except (ValueError, RecursionError) as e:
        return [f"{sidecar.name}: not JSON ({str(e)[:100]})"]
    return check_claims(body, incident, Claims.from_json(doc), front_matter)
