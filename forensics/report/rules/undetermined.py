"""Not determined yet: no other class holds; what is missing to decide is said, and collected first."""
from __future__ import annotations

from ...modes import INTERNAL_WHERE, ReportTemplate
from ...reproduce import Outcome
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import runbook_title, crash_phrase, has, run_phrase, who
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _decides(g: Grounds) -> Found | None:
    return Found(basis=g.has("core", "core.inside_nvml", "repro.python", "repro.c", "heap"))


def _routes(g: Grounds, d: Decision) -> list[Route]:
    return [Route(order=1, owner="the team", where=INTERNAL_WHERE, report=ReportTemplate.RUNBOOK,
                  action="collect what is missing, then file where the evidence points", evidence=d.basis)]


def _steps(g: Grounds, d: Decision) -> list[Step]:
    return [Step(text=f"Collect {m}", command=None, evidence=d.basis) for m in d.missing]


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    idle = [r for r in (f.python_run, f.c_run) if r and r.status is Outcome.NOT_STARTED]
    if idle:
        why = "the reproducers could not run here (" + "; ".join(f"{who(r)} {run_phrase(r)}" for r in idle) + ")"
    elif f.repro_runs:
        why = "neither reproducer crashed under these conditions"
    else:
        why = "no reproducer ran on an affected node"
    crash = crash_phrase(f) if f.has_crash else "no crash core was analysed"
    return [Claim(text=f"Not determined yet: {crash}, but {why}.",
                  evidence=has(d, "core", "core.inside_nvml", "repro.python", "repro.c", "missing")),
            Claim(text="Missing: " + "; ".join(d.missing) + "." if d.missing else
                  "Run `forensics reproduce` on an affected node (both reproducers, the same driver) before filing.",
                  evidence=has(d, "missing") or has(d, "core"))]


#: the last criterion: it always holds
RULE = IncidentRule(
    incident=IncidentClass.UNDETERMINED, words="not determined yet",
    criteria=(Criterion(rank=1000, test=_decides),), routes=_routes, steps=_steps, claims=_claims,
    says_missing=True,
    titles={ReportTemplate.RUNBOOK: runbook_title})
