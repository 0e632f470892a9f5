"""No crash observed: no crash core (a snapshot core, or none) and every reproducer ran clean.  Nothing is filed;
the next crash is captured first."""
from __future__ import annotations

from ...modes import INTERNAL_WHERE, ReportTemplate
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import runbook_title, has, runs_claim
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _decides(g: Grounds) -> Found | None:
    f = g.f
    if not f.has_crash and (f.repro_runs or f.analysis is not None) and g.runs_clean:
        return Found(basis=g.has("core", "repro.python", "repro.c"))
    return None


def _routes(g: Grounds, d: Decision) -> list[Route]:
    return [Route(order=1, owner="the team", where=INTERNAL_WHERE, report=ReportTemplate.RUNBOOK,
                  action="nothing to file: capture the next crash", evidence=d.basis)]


def _steps(g: Grounds, d: Decision) -> list[Step]:
    return [Step(text="Nothing crashed in this evidence: keep the core handler armed on the affected nodes "
                      "(forensics core-handler) so that the next crash keeps its core, then analyze it",
                 command=None, evidence=d.basis)]


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    out = []
    if f.analysis is not None:
        out.append(Claim(text="No crash was observed: the core is a snapshot of the live process (as gcore leaves it).",
                         evidence=has(d, "core")))
    elif f.repro_runs:
        out.append(Claim(text="No crash was observed: no core of a crash is in the evidence.",
                         evidence=has(d, "missing", "repro.python", "repro.c")))
    out += runs_claim(f, d)
    out.append(Claim(text="Nothing is to be filed; capture the next crash (its core) first.",
                     evidence=has(d, "missing", "core", "repro.python", "repro.c")))
    return out


RULE = IncidentRule(
    incident=IncidentClass.NO_CRASH, words="no crash observed",
    criteria=(Criterion(rank=60, test=_decides),), routes=_routes, steps=_steps, claims=_claims, says_missing=True,
    titles={ReportTemplate.RUNBOOK: runbook_title})
