"""The incident decision: which class of incident the evidence shows, on which evidence, and what follows.

Pure: :class:`~.facts.Facts` (read from the typed evidence: the analysis, the reproducers' result,
verify-imports' verdicts, the fleet, the heap's verdict, the capture) and the known-issue matches in,
:class:`~.incident.Decision` out.  Made once, by trying every class's criteria (:data:`.rules.CRITERIA`, one row
per class in :mod:`.rules`, whose docstring lists the order) and taking the first that holds; the conclusion's
wording (:mod:`.verdict`), the titles, the routing (who gets which report, in which order), the asks, the version
facts and the runbook's "do now" steps all follow from the decided class's row, and a template sentence is
written only for the class it holds for.
"""
from __future__ import annotations

import dataclasses

from .facts import Facts
from .grounds import Grounds, read_grounds
from .incident import Decision, Item
from .known import KnownMatch
from .rules import CRITERIA, IncidentRule
from .rules.common import install_steps
from .rules.row import Found

__all__ = ["decide_incident", "decide_grounds"]


def decide_incident(f: Facts, known: list[KnownMatch]) -> Decision:
    """The incident's class and everything that follows from it (see :mod:`.rules` for the order)."""
    return decide_grounds(read_grounds(f, known))


def _first_that_holds(g: Grounds) -> tuple[IncidentRule, Found]:
    for criterion, rule in CRITERIA:
        found = criterion.test(g)
        if found is not None:
            return rule, found
    raise AssertionError("the last criterion (undetermined) always holds")


def decide_grounds(g: Grounds) -> Decision:
    """The decision on ``g``: the first class whose criterion holds, its routes and steps (the setup's fix after
    the class's own), and, for a class that says so, what the evidence lacks."""
    rule, found = _first_that_holds(g)
    items = list(g.items)
    missing: list[str] = []
    if rule.says_missing:
        missing = _missing(g.f)
        if missing:
            items.append(Item(key="missing", source="what the evidence lacks", fact="; ".join(missing)))
    d = Decision(incident=rule.incident, words=rule.words, items=tuple(items), basis=found.basis,
                 missing=tuple(missing), routes=(), steps=(), versions=g.versions, shadowed=g.shadowed,
                 unsupported=g.unsupported, pattern=found.pattern, owner=found.owner)
    return dataclasses.replace(d, routes=tuple(rule.routes(g, d)),
                               steps=tuple(rule.steps(g, d) + install_steps(g, d)))


def _missing(f: Facts) -> list[str]:
    out = []
    if f.analysis is None:
        out.append("a core of the crash and its analysis (forensics analyze --json), or a capture bundle with the core")
    elif not f.has_crash:
        out.append("a core of a crash (the core given is a snapshot of the live process)")
    if not f.repro_runs:
        out.append("the reproducers' runs on an affected node (forensics reproduce --json)")
    elif all(r.status.value == "could not start" for r in f.repro_runs):
        out.append("a reproducer run that could start (it could not load or initialize NVML)")
    if f.has_crash and f.heap is None and f.kind == "heap-corruption":
        out.append("the core's heap reading (forensics analyze --heap)")
    return out
