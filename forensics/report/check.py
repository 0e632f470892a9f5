"""``report --check FILE``: a written report checked -- its front matter and title, the Markdown, the form
(nvitop), the attachments, and the conclusion's claims against the record beside it."""
from __future__ import annotations

import os
from pathlib import Path

from .claims import check_claims_file
from .form import check_form_body, load_shipped_form, read_issue_form
from .frontmatter import check_title, split_front_matter
from .markdown import GITHUB_ISSUE_LIMIT, check_markdown

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
    meta, body = split_front_matter(text)
    problems = []
    if not meta:
        problems.append("no front matter (title, file-at) at the top")
    title = str(meta.get("title") or "")
    problems += check_title(title)
    problems += check_markdown(body)
    form_src = str(meta.get("form") or "")
    file_at = str(meta.get("file-at") or "")
    template = "nvitop" if form_src else ("binding" if "nvidia-ml-py" in file_at else
                                          "nvml" if "NVIDIA" in file_at else "")
    if template == "nvitop":
        form = read_issue_form(issue_form) if issue_form else load_shipped_form()
        problems += check_form_body(body, form)
    base = Path(path).parent
    for a in meta.get("attachments") or []:
        if not (base / str(a)).is_file():
            problems.append(f"attachment {a} is missing")
    if len(text) >= GITHUB_ISSUE_LIMIT:
        problems.append(f"{len(text)} characters: over GitHub's issue limit of {GITHUB_ISSUE_LIMIT}")
    problems += check_claims_file(path, body, str(meta.get("conclusion") or ""))
    return template, problems
