"""``forensics report``: evidence -> redacted context -> Markdown (jinja2 templates in the package).

:func:`make_report` is the one entry point; templates live in
``forensics/report/templates`` (a base with blocks, one child per report kind).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .context import REQUIRED_FIELDS, TEMPLATES, UNKNOWN, ReportContext, build_context
from .evidence import Evidence, load_evidence
from .markdown import GITHUB_ISSUE_LIMIT, check_markdown, escape, fence
from ..redact import Redactor

__all__ = ["Report", "make_report", "render", "environment", "TEMPLATES"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    markdown: str  # what goes into the issue tracker (under GitHub's limit)
    attachment: str | None  # the whole report when the issue body had to be shortened
    context: ReportContext
    problems: tuple[str, ...]  # --check findings: missing required fields, Markdown defects


@functools.lru_cache(maxsize=1)
def environment():
    """The one jinja2 environment: package templates, StrictUndefined, Markdown-safe filters."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("forensics", "report/templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Markdown, not HTML: every untrusted value goes through |md or |fence
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters["md"] = escape
    env.filters["fence"] = fence
    env.policies["json.dumps_kwargs"] = {"sort_keys": True}
    env.globals["unknown"] = UNKNOWN
    return env


def render(ctx: ReportContext, *, compact: bool = False) -> str:
    """Markdown for ``ctx``; ``compact`` drops the long details blocks (for the issue body)."""
    data = {k: getattr(ctx, k) for k in ctx.__dataclass_fields__}
    if compact:
        data.update(native_rest=[], other_threads=[], reproduce={**ctx.reproduce, "sources": {}})
    text = environment().get_template(f"{ctx.template}.md.j2").render(**data)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"


def make_report(paths: list[str], *, template: str = "nvitop", redact_hosts: bool = False,
                known_hosts: dict[str, str] | None = None, tool_version: str = "",
                reproducer_sources: dict[str, str] | None = None) -> Report:
    """Read the evidence, redact it, render the template, and check the result.

    ``reproducer_sources`` defaults to the minimal reproducers shipped with forensics.
    When the report is longer than GitHub's issue limit, the issue body is the
    compact rendering and the whole report is returned as ``attachment``.
    """
    from .known import match_known_issues

    ev: Evidence = load_evidence(paths)
    _analyze_bundles(ev)
    redactor = Redactor(hosts=redact_hosts, known_hosts=dict(known_hosts or {}))
    if redact_hosts:
        redactor.known_hosts.update(_hosts_in(ev))
    if reproducer_sources is None:
        from ..errors import ForensicsError
        from ..resources import reproducer_sources as shipped_sources

        try:
            reproducer_sources = shipped_sources()
        except ForensicsError:
            reproducer_sources = {}
    ctx = build_context(ev, template, redactor, tool_version=tool_version, reproducer_sources=reproducer_sources)
    ctx.known_issues = match_known_issues(ev)
    full = render(ctx)
    body, attachment = full, None
    if len(full) >= GITHUB_ISSUE_LIMIT:
        body = render(ctx, compact=True)
        body += "\nThe full report (all threads, all frames, reproducer sources) is attached.\n"
        attachment = full
    problems = [f"required field {f!r} is not filled" for f in ctx.missing if f in REQUIRED_FIELDS[template]]
    problems += check_markdown(body)
    return Report(markdown=body, attachment=attachment, context=ctx, problems=tuple(problems))


def _analyze_bundles(ev: Evidence) -> None:
    """A bundle with a core and no analysis among the inputs is analysed (its objects are its sysroot)."""
    if ev.all("analyze"):
        return
    from ..analyze import analyze_core
    from ..bundle import is_bundle
    from ..errors import ForensicsError
    from ..format import analysis_payload
    from ..output import to_jsonable

    for doc in ev.all("capture"):
        bundle = doc.get("_bundle_dir")
        if bundle and is_bundle(bundle):
            try:
                a = analyze_core(bundle)
            except ForensicsError:
                continue
            ev.docs.setdefault("analyze", []).append(to_jsonable({"command": "analyze", "analysis": analysis_payload(a)}))
            return


def _hosts_in(ev: Evidence) -> dict[str, str]:
    """Node, pod and host names the evidence itself names, to be replaced consistently."""
    out: dict[str, str] = {}
    for doc in ev.all("capture"):
        sched = doc.get("scheduling") or {}
        for name, kind in ((((sched.get("node") or {}).get("name")), "node"), (((sched.get("pod") or {}).get("name")), "pod"),
                           ((doc.get("record") or {}).get("node"), "node"), ((doc.get("identity") or {}).get("node"), "node"),
                           ((doc.get("identity") or {}).get("pod"), "pod"), ((doc.get("identity") or {}).get("agent_pod"), "pod"),
                           ((doc.get("identity") or {}).get("hostname"), "host")):
            if isinstance(name, str) and name:
                out.setdefault(name, kind)
    return out
