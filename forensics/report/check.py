"""``report --check FILE``: a written report checked -- its front matter and title, the Markdown, the form
(nvitop), the attachments, the conclusion's claims against the record beside it, and what the file and its
attachments would leak (a secret, a raw control character: :mod:`.leaks`)."""
from __future__ import annotations

import os
from pathlib import Path

from .claims import check_claims_file
from .form import check_form_body, load_shipped_form, read_issue_form
from .frontmatter import FrontMatter, check_title, read_front_matter, split_front_matter
from .leaks import check_leaks
from .markdown import GITHUB_ISSUE_LIMIT, check_markdown
from ..modes import ReportTemplate

__all__ = ["check_report_file"]


def check_report_file(path: str, *, issue_form: str | None = None) -> tuple[str, list[str]]:
    """Check a written report: front matter and title, the Markdown, the form (nvitop), the attachments, and
    the conclusion's claims against the evidence recorded beside it (:func:`claims_path_for`).

    :return: (the template it was made with, or "" when unknown; the problems)
    """
    from ..errors import InputNotFound

    if not os.path.isfile(path):
        raise InputNotFound(path)  # a report file: not a core (no core_pattern hint)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    read, body = read_front_matter(text)
    problems = []
    if read is None:
        problems.append("no front matter (title, file-at) at the top")
    meta = read or FrontMatter()
    problems += meta.problems
    problems += check_title(meta.title)
    problems += check_markdown(body)
    file_at = meta.file_at
    template = ReportTemplate.NVITOP if meta.form else next((t for t in ReportTemplate if t.where == file_at), None)
    if template is ReportTemplate.NVITOP:
        form = read_issue_form(issue_form) if issue_form else load_shipped_form()
        problems += check_form_body(body, form)
    base = Path(path).parent
    for a in meta.attachments:
        if not (base / a).is_file():
            problems.append(f"attachment {a} is missing")
    if len(text) >= GITHUB_ISSUE_LIMIT:
        problems.append(f"{len(text)} characters: over GitHub's issue limit of {GITHUB_ISSUE_LIMIT}")
    problems += check_claims_file(path, body, meta.conclusion, split_front_matter(text)[0])
    problems += check_leaks(path, text, meta.attachments)  # a secret or a raw control character, file and line
    return (template.value if template else ""), problems
