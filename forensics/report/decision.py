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
from .incident import Cause, Decision, IncidentClass, Item, Route, Step
from .known import KnownMatch
from .rules import CRITERIA, RULES, IncidentRule
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


def _causes(g: Grounds, rule: IncidentRule, found: Found) -> list[tuple[IncidentRule, Found]]:
    """The decided class and every class that holds beside it as a second cause (a kill, a shadowed install), in
    the order they are fixed."""
    causes = [(rule, found)] + [(r, fd) for r in RULES if r is not rule and r.accompanies is not None
                                and (fd := r.accompanies(g)) is not None]
    return sorted(causes, key=lambda rf: rf[0].fix_order)


def _words(g: Grounds, rule: IncidentRule) -> str:
    return rule.says(g) if rule.says is not None else rule.words


def decide_grounds(g: Grounds) -> Decision:
    """The decision on ``g``: the first class whose criterion holds, the causes beside it (each fixed in its
    order, with its own evidence, routes and steps; the setup's fix after the steps of a class that is not the
    install's), and, for a class that says so, what the evidence lacks."""
    rule, found = _first_that_holds(g)
    causes = _causes(g, rule, found)
    items = list(g.items)
    missing: list[str] = []
    if rule.says_missing:
        missing = _missing(g.f)
        if missing:
            items.append(Item(key="missing", source="what the evidence lacks", fact="; ".join(missing)))
    several = len(causes) > 1
    listed = tuple(Cause(incident=r.incident, words=_words(g, r), basis=fd.basis,
                         because=r.first_because if several and i < len(causes) - 1 else "")
                   for i, (r, fd) in enumerate(causes))
    basis = tuple(dict.fromkeys(k for c in listed for k in c.basis)) if several else found.basis
    d = Decision(incident=rule.incident, words="; then ".join(c.words for c in listed) if several else listed[0].words,
                 items=tuple(items), basis=basis,
                 missing=tuple(missing), routes=(), steps=(), versions=g.versions, shadowed=g.shadowed,
                 unsupported=g.unsupported, pattern=found.pattern, owner=found.owner, causes=listed)
    routes: list[Route] = []
    steps: list[Step] = []
    for r, fd in causes:  # each cause with its own evidence
        view = dataclasses.replace(d, incident=r.incident, basis=fd.basis, pattern=fd.pattern, owner=fd.owner)
        routes += r.routes(g, view)
        steps += r.steps(g, view)
    if not d.has_cause(IncidentClass.INSTALL):
        steps += install_steps(g, d)
    routes = [dataclasses.replace(x, order=i) for i, x in enumerate(routes, 1)]
    return dataclasses.replace(d, routes=tuple(routes), steps=tuple(steps))


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
