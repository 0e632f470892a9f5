"""Stage 2 of a report: the conclusion in words, claim by claim, from the incident decision.

Pure: :class:`~.facts.Facts` and the known-issue matches in, :class:`Conclusion` out.  The class of
the incident, its evidence, the routing and the runbook's steps are decided once, in
:func:`~.decision.decide_incident`; the decided class's row (:mod:`.rules`) words the conclusion, as
:class:`Claim` s, each naming the evidence items (:class:`~.incident.Item`) it rests on, so that
``report --explain`` can list them and ``report --check`` can refuse a claim the evidence does not carry.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..modes import ReportTemplate
from .decision import decide_grounds
from .facts import Facts
from .grounds import Grounds, read_grounds
from .incident import Claim, Decision, IncidentClass
from .known import KnownMatch, support_facts
from .rules import rule_for
from .rules.common import sentence

__all__ = ["Filing", "Conclusion", "decide"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Filing:
    order: int
    where: str  # who gets it
    report: ReportTemplate
    action: str  # what to do with it


@dataclass(frozen=True, slots=True, kw_only=True)
class Conclusion:
    incident: IncidentClass
    decision: Decision
    claims: tuple[Claim, ...]  # the statement, sentence by sentence, with its evidence
    evidence: tuple[str, ...]  # the facts it rests on, one line each
    unsupported: tuple[str, ...]  # the setup outside what the packages declare (pip check, support facts)
    upgrade: tuple[str, ...]  # what to upgrade to, from the support facts and known issues
    filings: tuple[Filing, ...]
    ask_nvitop: str  # what the nvitop issue asks for ("" when nvitop is asked nothing)

    @property
    def statement(self) -> str:
        """The conclusion, in one paragraph, plain text, first in every report."""
        return " ".join(c.text for c in self.claims)

    @property
    def words(self) -> str:
        """The class in words."""
        return self.decision.words

    @property
    def driver_suspected(self) -> bool:
        return self.incident is IncidentClass.DRIVER

    def unsupported_claims(self) -> list[str]:
        """Claims naming evidence the decision does not hold (``report --check`` fails on each)."""
        keys = self.decision.keys
        return [f"claim without evidence: {c.text[:120]!r} rests on {', '.join(k for k in c.evidence if k not in keys)}"
                for c in self.claims if not c.evidence or any(k not in keys for k in c.evidence)]


def decide(f: Facts, known: list[KnownMatch]) -> Conclusion:
    """The incident decision (:func:`~.decision.decide_incident`) and its conclusion in words, claim by claim: the
    decided class's row words it; with two causes, a first claim says them in the order they are fixed, and each
    cause's row words its own part, on its own evidence."""
    g = read_grounds(f, known)
    d = decide_grounds(g)
    rule = rule_for(d.incident)
    upgrade = list(dict.fromkeys(sentence(s.fix) for s in support_facts(f) if s.fix))
    upgrade += [sentence(k.fix) for k in g.fixed if sentence(k.fix) not in upgrade]
    claims = rule.claims(g, d) if len(d.causes) <= 1 else _claims_of_causes(g, d)
    evidence = [i.fact for i in d.items if i.key in d.basis]
    ask = rule.ask_nvitop(g, d) if rule.ask_nvitop else ""
    filings = tuple(Filing(order=r.order, where=r.where, report=r.report, action=r.action) for r in d.routes)
    upgrading = any(rule_for(c.incident).upgrading for c in d.causes) or rule.upgrading
    return Conclusion(incident=d.incident, decision=d, claims=tuple(claims), evidence=tuple(evidence),
                      unsupported=d.unsupported, upgrade=tuple(upgrade) if upgrading else (),
                      filings=filings, ask_nvitop=ask)


def _claims_of_causes(g: Grounds, d: Decision) -> list[Claim]:
    """Two causes (or more): which, in the order they are fixed and why, then each cause's own claims."""
    n = len(d.causes)
    order = "; ".join(f"({i}) {c.words}" + (f", first because {c.because}" if c.because else "")
                      for i, c in enumerate(d.causes, 1))
    out = [Claim(text=f"{n} causes, to be fixed in this order: {order}.", evidence=d.basis)]
    for c in d.causes:
        view = d if c.incident is d.incident else dataclasses.replace(d, incident=c.incident, pattern=False,
                                                                       owner=None)
        out += rule_for(c.incident).claims(g, dataclasses.replace(view, basis=c.basis))
    return out
