"""The records of an incident decision: its class (:class:`IncidentClass`), the evidence items it reads
(:class:`Item`), who gets which report (:class:`Route`), the runbook's steps (:class:`Step`), the versions that
ran (:class:`VersionFact`), the conclusion's sentences (:class:`Claim`) and the decision itself
(:class:`Decision`).

Records only: what decides and what each class says are the rows of :mod:`.rules`; :mod:`.decision` runs them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..modes import ReportTemplate

__all__ = ["IncidentClass", "Item", "Route", "Step", "VersionFact", "Claim", "Cause", "Decision"]


class IncidentClass(enum.Enum):
    DRIVER = "driver-fault"
    BINDING = "binding-fault"
    INSTALL = "shadowed-or-unsupported-install"
    KNOWN = "known-issue"
    PROGRAM = "program-bug"
    OUTSIDE_NVML = "crash-outside-nvml"
    NO_CRASH = "no-crash"
    KILL = "kill"  # stopped from outside: an OOM kill, an eviction, a failed liveness probe, a sent signal
    UNDETERMINED = "undetermined"


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One piece of evidence a claim rests on: ``key`` names it (``core``, ``repro.c``, ``heap``,
    ``imports.nvitop``...), ``source`` the document it comes from, ``fact`` the fact in words."""

    key: str
    source: str
    fact: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Who gets which report, in which order, and what it asks of them."""

    order: int
    owner: str  # in words: "NVIDIA (the driver)", "NVIDIA (nvidia-ml-py)", "nvitop", "the team"
    where: str
    report: ReportTemplate
    action: str
    evidence: tuple[str, ...]
    ask: str = ""  # what the report asks of its owner ("" for the runbook)


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One "do now" step of the runbook: what to do, the command that does or proves it (run as printed), and
    the evidence it follows from."""

    text: str
    command: str | None
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionFact:
    """A package's version as it ran (the code the process imported), beside what pip lists when they differ."""

    package: str
    ran: str | None  # the version of the code that was imported (verify-imports' effective version)
    installed: str | None  # the installed distribution's
    source: str  # where "ran" comes from

    @property
    def phrase(self) -> str:
        if self.ran and self.installed and self.ran != self.installed:
            return f"{self.package} {self.ran} ran ({self.source}; {self.installed} is installed but did not run)"
        return f"{self.package} {self.ran or self.installed}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One sentence of the conclusion and the keys of the evidence items it rests on."""

    text: str
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """One cause of the incident: its class, its words, the evidence it rests on, and (the first of two) why it is
    fixed first."""

    incident: IncidentClass
    words: str
    basis: tuple[str, ...]
    because: str = ""  # why it is fixed before the next cause ("" for the last, or the only one)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    incident: IncidentClass  # the class decided (by the rows' order): what the core or the evidence shows
    words: str  # the incident in words: its class's, or every cause's in the order they are fixed
    items: tuple[Item, ...]  # every piece of evidence read, keyed
    basis: tuple[str, ...]  # the keys of the items the class was decided on
    missing: tuple[str, ...]  # what is missing to decide (undetermined), or to confirm
    routes: tuple[Route, ...]
    steps: tuple[Step, ...]
    versions: tuple[VersionFact, ...]
    shadowed: tuple[str, ...] = ()  # "nvitop: SHADOWED by /app/nvitop/__init__.py (fix: ...)"
    unsupported: tuple[str, ...] = ()  # the setup outside what the packages declare
    pattern: bool = False  # BINDING: the calling pattern (only the Python reproducer crashes), not a binding bug
    owner: str | None = None  # PROGRAM / OUTSIDE_NVML: the frame and whose code it is
    causes: tuple[Cause, ...] = ()  # every cause, in the order they are fixed (one: the decided class alone)

    def has_cause(self, incident: IncidentClass) -> bool:
        return any(c.incident is incident for c in self.causes)

    def item(self, key: str) -> Item | None:
        return next((i for i in self.items if i.key == key), None)

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(i.key for i in self.items)

    def version_ran(self, package: str) -> str | None:
        """The version of ``package`` whose code ran (None: not in the evidence)."""
        return next((v.ran for v in self.versions if v.package == package), None)
