"""The row each incident class is: :class:`IncidentRule` (its predicate, wording, routes, steps, claims, titles),
with the predicate's :class:`Criterion` and what one finds (:class:`Found`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...modes import ReportTemplate
from ..facts import Facts
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step

__all__ = ["IncidentRule", "Criterion", "Found", "TitleRule"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """What a criterion that holds decided on: the evidence keys, and what the class's words need of it."""

    basis: tuple[str, ...]
    pattern: bool = False  # BINDING: the calling pattern (only the Python reproducer crashes), not a binding bug
    owner: str | None = None  # PROGRAM / OUTSIDE_NVML: the frame and whose code it is


@dataclass(frozen=True, slots=True, kw_only=True)
class Criterion:
    """One way the evidence shows a class: ``test`` over the grounds (its :class:`Found`, or None), tried at
    ``rank`` in the decision order (the lowest first, over every class's criteria)."""

    rank: int
    test: Callable[[Grounds], Found | None]


#: a title of one template: the facts, the decision -> plain text (shortened to one line by the caller)
TitleRule = Callable[[Facts, Decision], str]


@dataclass(frozen=True, slots=True, kw_only=True)
class IncidentRule:
    """An incident class as one row: when it holds (``criteria``), its words, who gets which report
    (``routes``), the runbook's steps (``steps``: the setup's fix follows them for every class), the conclusion's
    claims, what the nvitop issue asks (``ask_nvitop``), its titles (``titles``: the template -> the title of a
    report routed to it), whether its conclusion asks for the upgrades (``upgrading``) and whether it says what
    the evidence lacks (``says_missing``).

    A class that can be a second cause beside the decided one (a kill, a shadowed install) says when
    (``accompanies``); the causes are fixed in ``fix_order`` (the lowest first: the cause that must be fixed for
    the other to be seen), the first one saying why (``first_because``), each with its own evidence, routes and
    steps.  ``says`` words the class for this incident (the kill's kind and limit), where its words are too
    general."""

    incident: IncidentClass
    words: str
    criteria: tuple[Criterion, ...]
    routes: Callable[[Grounds, Decision], list[Route]]
    steps: Callable[[Grounds, Decision], list[Step]]
    claims: Callable[[Grounds, Decision], list[Claim]]
    titles: dict[ReportTemplate, TitleRule] = field(default_factory=dict)
    ask_nvitop: Callable[[Grounds, Decision], str] | None = None
    upgrading: bool = False
    says_missing: bool = False
    accompanies: Callable[[Grounds], Found | None] | None = None
    fix_order: int = 2
    first_because: str = ""
    says: Callable[[Grounds], str] | None = None
