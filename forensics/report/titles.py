"""Each report's title, plain text: the class's own title for a report routed to it (its row's ``titles``,
:mod:`.rules`), and for an upstream report the incident is not routed to, "not for WHOM (the class): ..."."""
from __future__ import annotations

from ..modes import ReportTemplate
from .facts import Facts
from .form import IssueForm
from .phrases import failure_line, plain, where_it_failed
from .rules import rule_for
from .verdict import Conclusion

__all__ = ["make_title"]


def make_title(template: ReportTemplate, f: Facts, c: Conclusion, form: IssueForm | None = None) -> str:
    """A plain-text title that says what the incident is (its class) and names the failing call and the versions
    that ran; an upstream report of a class it is not for says so first.

    >>> from forensics.report.facts import Facts
    >>> from forensics.report.verdict import decide
    >>> f = Facts(has_crash=True, signal="SIGSEGV", api="nvmlShutdown", driver="580.126.09")
    >>> make_title(ReportTemplate.RUNBOOK, f, decide(f, []))
    'the process crashes with SIGSEGV in nvmlShutdown on driver 580.126.09: not determined yet'
    """
    prefix = (form.title_prefix if form else "[BUG] ") if template.form else ""
    d = c.decision
    # the title of the cause routed to this report (the decided class's for the runbook)
    owners = [d.incident] if not template.upstream else [k.incident for k in d.causes] or [d.incident]
    own = next((t for k in owners if (t := rule_for(k).titles.get(template)) is not None), None)
    routed = not template.upstream or any(r.report is template for r in d.routes)
    if not routed or own is None:
        return plain(f"{prefix}not for {template.whom} ({c.words}): {failure_line(f)}{where_it_failed(f)}")
    return plain(prefix + own(f, d))
