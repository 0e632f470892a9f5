"""A report file's YAML front matter (the plain-text title, where to file it, the attachments) before the body to
paste: written (:func:`front_matter`), read back (:func:`split_front_matter`), its title checked
(:func:`check_title`)."""
from __future__ import annotations

import json
import re

from .context import ReportContext
from ..records import record

__all__ = ["front_matter", "split_front_matter", "read_front_matter", "FrontMatter", "check_title"]

MAX_ATTACHMENTS = 1024  # names of attachments a front matter lists that are checked


@record
class FrontMatter:
    """What ``report --check`` reads of a report file's front matter (:func:`front_matter` writes it): "" / ()
    for what it does not say, and ``problems`` for a value of the wrong type (read as absent)."""

    title: str = ""
    file_at: str = ""
    form: str = ""  # the nvitop issue form's source (the nvitop template only)
    conclusion: str = ""  # the incident class
    attachments: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @classmethod
    def from_yaml(cls, meta: dict) -> FrontMatter:
        problems: list[str] = []

        def text(key: str) -> str:
            v = meta.get(key)
            if v is None or isinstance(v, str):
                return v or ""
            problems.append(f"the front matter's {key} is {_a(v)}, not a string")
            return ""

        names = meta.get("attachments")
        if names is not None and not (isinstance(names, list) and all(isinstance(a, str) for a in names)):
            problems.append(f"the front matter's attachments is {_a(names)}, not a list of file names")
            names = None
        elif names is not None and len(names) > MAX_ATTACHMENTS:
            problems.append(f"the front matter lists {len(names)} attachments; the first {MAX_ATTACHMENTS} checked")
        return cls(title=text("title"), file_at=text("file-at"), form=text("form"), conclusion=text("conclusion"),
                   attachments=tuple((names or [])[:MAX_ATTACHMENTS]), problems=tuple(problems))


def front_matter(ctx: ReportContext, attachment_dir: str) -> str:
    """YAML front matter: the title and where to file this report (json.dumps strings are valid YAML)."""
    filing = next((x for x in ctx.conclusion.filings if x.report is ctx.template), None)
    where = ctx.form.new_issue_url if ctx.template.form and ctx.form else ctx.template.where
    lines = ["---", f"title: {json.dumps(ctx.title, ensure_ascii=False)}", f"file-at: {json.dumps(where)}"]
    if filing:
        lines.append(f"when: {json.dumps(f'{filing.order}. {filing.action}', ensure_ascii=False)}")
    elif ctx.template.upstream:
        lines.append(f"when: {json.dumps('not now: ' + '; '.join(x.action for x in ctx.conclusion.filings))}")
    lines.append(f"conclusion: {json.dumps(ctx.conclusion.incident.value)}")
    if ctx.template.form and ctx.form:
        lines.append(f"labels: {json.dumps(list(ctx.form.labels))}")
        lines.append(f"form: {json.dumps(ctx.form.source)}")
        lines.append("before-filing: \"tick the form's required checkboxes once you have done what they say\"")
    if ctx.attachments:
        lines.append("attachments:")
        for name in sorted(ctx.attachments):
            lines.append(f"  - {json.dumps(f'{attachment_dir}/{name}' if attachment_dir else name)}")
    lines.append("---")
    return "\n".join(lines) + "\n\n"


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter, body) of a report file; ({}, text) when it has none."""
    import yaml

    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        return {}, text
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[end + 5:].lstrip("\n")


def _a(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def read_front_matter(text: str) -> tuple[FrontMatter | None, str]:
    """(front matter read into its record, body) of a report file; (None, text) when it has none."""
    meta, body = split_front_matter(text)
    return (FrontMatter.from_yaml(meta) if meta else None), body


def check_title(title: str) -> list[str]:
    """A GitHub title is plain text: no Markdown heading, no backslash escapes, one line, <= 256 characters."""
    problems = []
    if not title.strip():
        problems.append("the title is empty")
    if title.lstrip().startswith("#") or re.search(r"\\[\\`*_\[\]<>|~#]", title):
        problems.append("the title has Markdown in it (GitHub titles are plain text)")
    if "\n" in title or len(title) > 256:
        problems.append("the title is not one line of at most 256 characters")
    return problems
