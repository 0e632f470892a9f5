"""A known issue: a known crash whose whole definition holds, fixed in a later release (:mod:`..known`).  The
team upgrades; the known issue is commented on only if the upgrade does not help."""
from __future__ import annotations

from ...modes import INTERNAL_WHERE, ReportTemplate
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import runbook_title, sentence
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _decides(g: Grounds) -> Found | None:
    return Found(basis=(f"known.{g.fixed[0].id}",)) if g.fixed else None


def _routes(g: Grounds, d: Decision) -> list[Route]:
    fixed = g.fixed
    where = fixed[0].sources[0][1] if fixed and fixed[0].sources else INTERNAL_WHERE
    return [Route(order=1, owner="the team", where=where, report=ReportTemplate.RUNBOOK,
                  action="upgrade; comment on the known issue only if the upgrade does not help", evidence=d.basis)]


def _steps(g: Grounds, d: Decision) -> list[Step]:
    return [Step(text=f"Upgrade: {g.fixed[0].fix}", command=None, evidence=d.basis)]


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    k = g.fixed[0]
    return [Claim(text=f"This is a known issue: {k.title} (matched on {'; '.join(k.matched_on)}). "
                       f"{sentence(k.fix)} before filing anything new.", evidence=(f"known.{k.id}",))]


RULE = IncidentRule(
    incident=IncidentClass.KNOWN, words="a known issue, fixed in a later release",
    criteria=(Criterion(rank=50, test=_decides),), routes=_routes, steps=_steps, claims=_claims, upgrading=True,
    titles={ReportTemplate.RUNBOOK: runbook_title})
