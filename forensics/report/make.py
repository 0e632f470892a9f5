"""Evidence -> redacted facts -> the conclusion -> Markdown: :func:`make_report`, the one entry point, and the
:class:`Report` it returns.

Its stages are one function each: :func:`~.evidence.load_evidence` (read), redaction and localization of
the evidence tree (:mod:`.redaction`), :func:`~.facts.read_facts` (facts), :func:`~.known.match_known_issues`,
:func:`~.verdict.decide` (the conclusion and which report to file where), :func:`~.context.build_context`,
then the template (:mod:`.render`) and the checks of the body.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .context import ReportContext, build_context
from .evidence import Evidence, load_evidence
from .form import IssueForm, check_form_body, load_shipped_form, read_issue_form
from .frontmatter import check_title, front_matter
from .heapsection import heap_section
from .markdown import GITHUB_ISSUE_LIMIT, check_markdown
from .redaction import escape_value, footer_lines, hosts_in, local_prefixes
from .render import render
from ..errors import ForensicsError, ReportInputError
from ..modes import ReportTemplate
from ..redact import Redactor, facts_of, redact_tree

__all__ = ["Report", "make_report"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    title: str  # plain text
    body: str  # the Markdown to paste (under GitHub's limit)
    markdown: str  # front matter + body: what `report` writes
    attachments: dict[str, str]  # file name -> text, written beside the report
    context: ReportContext
    problems: tuple[str, ...]  # --check findings


def make_report(paths: list[str], **kw: Any) -> Report:
    """Read the evidence, redact it, decide, render the template, and check the result (:func:`_make_report`).

    :raises ReportInputError: also for evidence of the right kind whose values have the wrong type or form
        (a hex string that is not hex, an object where a list belongs): the documents are read where the
        report needs each fact, so a lying document fails there, and is said to be the input's fault
    """
    try:
        return _make_report(paths, **kw)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        if isinstance(e, ForensicsError):
            raise
        raise ReportInputError(", ".join(paths), f"a value of the wrong type or form ({e.__class__.__name__}: "
                                                 f"{str(e)[:200]})") from e


def _make_report(paths: list[str], *, template: ReportTemplate | str = ReportTemplate.NVITOP,
                 redact_hosts: bool | None = None, known_hosts: dict[str, str] | None = None, tool_version: str = "",
                 reproducer_sources: dict[str, str] | None = None, issue_form: str | None = None,
                 nvidia_link: str = "", attachment_dir: str = "") -> Report:
    """Read the evidence, redact it, decide, render the template, and check the result.

    :param redact_hosts: replace host, node and pod names and IPs; None: yes for the upstream templates
        (nvitop, nvml), no for the runbook.  Upstream templates also replace local paths.
    :param issue_form: a newer copy of nvitop's issue form (YAML) to follow instead of the shipped one
    :param nvidia_link: the NVIDIA report's URL, for the nvitop issue to link
    :param attachment_dir: where the attachments will be written, as the report names it
    """
    from .facts import read_facts
    from .known import match_known_issues
    from .localize import PathLocalizer
    from .verdict import decide

    template = ReportTemplate(template)  # ValueError for a name that is none
    upstream = template.upstream
    hosts = upstream if redact_hosts is None else redact_hosts
    form: IssueForm | None = None
    if template.form:
        form = read_issue_form(issue_form) if issue_form else load_shipped_form()
    ev: Evidence = load_evidence(paths)
    _analyze_bundles(ev)
    redactor = Redactor(hosts=hosts, known_hosts=dict(known_hosts or {}))
    if hosts:
        redactor.known_hosts.update(hosts_in(ev))
    # Redact the whole evidence tree once, before anything is picked out of it; first learn every secret
    # value in it (and in the evidence paths), so that each is masked wherever it appears.
    item_paths = [i.path for i in ev.items]
    redactor.facts |= facts_of(ev.docs)  # a learned secret equal to a signal, frame or library name stays there
    redactor.learn({"docs": ev.docs, "paths": item_paths})
    localizer = PathLocalizer(prefixes=local_prefixes(ev))

    def finish(text: str, key: str | None) -> str:
        return escape_value(localizer.text(text) if upstream else text, key)

    # one walk: every key and value redacted, localized (upstream) and escaped
    docs = {k: [redact_tree(d, redactor, finish=finish) for d in v] for k, v in ev.docs.items()}
    redacted = Evidence(docs=docs, items=ev.items)
    facts = read_facts(redacted)
    known = match_known_issues(facts)
    conclusion = decide(facts, known)
    if reproducer_sources is None:
        from ..errors import ForensicsError
        from ..resources import reproducer_sources as shipped_sources

        try:
            reproducer_sources = shipped_sources()
        except ForensicsError:
            reproducer_sources = {}
    evidence = [{"path": escape_value(redactor.text(i.path), None), "kind": i.kind, "sha256": i.sha256,
                 "size": str(i.size), "problem": i.problem} for i in ev.items]
    heap = heap_section(facts.analysis.heap) if facts.analysis and facts.analysis.heap else None
    ctx = build_context(facts, template, conclusion, known, tool_version=tool_version, footer=[],
                        evidence=evidence, reproducer_sources=reproducer_sources, form=form,
                        nvidia_link=nvidia_link, heap=heap, attachment_dir=attachment_dir)
    redactor.absorb(ev.docs)  # what analyze --json, verify-imports --json... masked before this report read them
    ctx.footer = footer_lines(redactor, localizer, upstream, hosts) + redactor.title_note(docs, ctx.title)
    ctx.manifest_mismatch, manifest_lines = _manifest_problems(redacted)
    body = render(ctx)
    if len(body) >= GITHUB_ISSUE_LIMIT:
        ctx.attachments["full-report.md"] = body
        body = (body[: GITHUB_ISSUE_LIMIT - 200].rsplit("\n", 1)[0]
                + "\n\n(cut: the whole report is attached as full-report.md)\n")
    problems = manifest_lines + _check(body, ctx) + conclusion.unsupported_claims()
    return Report(title=ctx.title, body=body, markdown=front_matter(ctx, attachment_dir) + body,
                  attachments=dict(ctx.attachments), context=ctx, problems=tuple(problems))


def _check(body: str, ctx: ReportContext) -> list[str]:
    # an upstream report the incident does not route to its owner is not to be filed: its fields are not required
    routed = not ctx.template.upstream or any(x.report is ctx.template for x in ctx.conclusion.filings)
    problems = [f"required field {f!r} is not filled" for f in ctx.missing
                if f in ctx.template.required and routed]
    problems += check_title(ctx.title)
    problems += check_markdown(body)
    if ctx.template.form and ctx.form:
        problems += check_form_body(body, ctx.form)
    return problems


def _manifest_problems(ev: Evidence) -> tuple[list[str], list[str]]:
    """The capture bundles' files that do not match their manifest (``PATH: changed``: what every report says
    under its conclusion), and one problem line per such bundle (the runbook's evidence table also names each
    file instead of a hash); then one line per bundle document read in part (a value of the wrong type, a list
    past its bound: :mod:`forensics.bundle.documents`)."""
    files: list[str] = []
    lines = []
    for cap in ev.captures():
        bad = list(cap.manifest_problems)
        files += bad
        if bad:
            lines.append(f"bundle {cap.bundle_dir}: {len(bad)} file(s) do not match its MANIFEST.json: "
                         + "; ".join(bad[:5]) + ("; ..." if len(bad) > 5 else ""))
        if cap.problems:
            lines.append(f"bundle {cap.bundle_dir}: read in part: " + "; ".join(cap.problems[:5])
                         + (f"; ... ({len(cap.problems)} in all)" if len(cap.problems) > 5 else ""))
    return files, lines


def _analyze_bundles(ev: Evidence) -> None:
    """A bundle with a core and no analysis among the inputs is analysed (its objects are its sysroot)."""
    if ev.all("analyze"):
        return
    from ..analyze import analyze_core
    from ..bundle import is_bundle
    from ..format import analysis_payload
    from ..output import json_document

    for cap in ev.captures():
        bundle = cap.bundle_dir
        if bundle and is_bundle(bundle):
            try:
                a = analyze_core(bundle)
            except ForensicsError:
                continue
            doc = json.loads(json_document("analyze", {"analysis": analysis_payload(a)}))
            ev.docs.setdefault("analyze", []).append(doc)
            return
