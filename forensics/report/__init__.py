"""``forensics report``: evidence -> redacted facts -> the conclusion -> Markdown in the upstream's form; the
package's public surface.

:func:`make_report` (:mod:`.make`) is the one entry point; its stages are one function each:
:func:`~.evidence.load_evidence` (read), redaction and localization of the evidence tree (:mod:`.redaction`),
:func:`~.facts.read_facts` (facts), :func:`~.known.match_known_issues`, :func:`~.verdict.decide` (the
conclusion and which report to file where), :func:`~.context.build_context`, then the template (:mod:`.render`,
``forensics/report/templates``; the heap's section from :mod:`.heapsection`).  :func:`write_report`
(:mod:`.write`) writes the Markdown and its attachments beside it, with the claims record (:mod:`.claims`);
:func:`check_report_file` (:mod:`.check`) checks a written report against the form and that record.

A report file is YAML front matter (:mod:`.frontmatter`: the plain-text title, where to file it, the
attachments) followed by the body to paste.
"""
from __future__ import annotations

from .check import check_report_file
from .claims import check_claims, claims_path_for, claims_record
from .frontmatter import check_title, split_front_matter
from .heapsection import heap_section
from .make import Report, make_report
from .redaction import TEXT_KEYS, escape_value
from .render import environment, render
from .write import attachment_dir_for, write_report

__all__ = ["Report", "make_report", "render", "environment", "write_report", "check_report_file",
           "split_front_matter", "check_title", "attachment_dir_for", "claims_path_for", "claims_record",
           "check_claims", "heap_section", "escape_value", "TEXT_KEYS"]
