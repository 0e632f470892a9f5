"""Stage 2 of a report: the conclusion in words, claim by claim, from the incident decision.

Pure: :class:`~.facts.Facts` and the known-issue matches in, :class:`Conclusion` out.  The class of
the incident, its evidence, the routing and the runbook's steps are decided once, in
:func:`~.decision.decide_incident`; this module words the conclusion for that class only, as
:class:`Claim` s, each naming the evidence items (:class:`~.decision.Item`) it rests on, so that
``report --explain`` can list them and ``report --check`` can refuse a claim the evidence does not carry.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model import OverflowVerdict
from ..modes import ReportTemplate
from ..reproduce import Outcome, ReproRun
from .decision import Decision, IncidentClass, decide_incident
from .facts import Facts
from .known import KnownMatch, support_facts

__all__ = ["Claim", "Filing", "Conclusion", "decide"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Filing:
    order: int
    where: str  # who gets it
    report: ReportTemplate
    action: str  # what to do with it


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """One sentence of the conclusion and the keys of the evidence items it rests on."""

    text: str
    evidence: tuple[str, ...]


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
    def driver_suspected(self) -> bool:
        return self.incident is IncidentClass.DRIVER

    def unsupported_claims(self) -> list[str]:
        """Claims naming evidence the decision does not hold (``report --check`` fails on each)."""
        keys = self.decision.keys
        return [f"claim without evidence: {c.text[:120]!r} rests on {', '.join(k for k in c.evidence if k not in keys)}"
                for c in self.claims if not c.evidence or any(k not in keys for k in c.evidence)]


def _run_phrase(r: ReproRun) -> str:
    """What one reproducer run did, as a clause: ``crashed (SIGABRT) in field-value call #41, 0.003 s after ...``."""
    status = r.status
    if status is Outcome.CRASHED:
        detail = f"crashed ({r.signal or 'a signal'})"
        if r.calls_to_crash:
            detail += f" in field-value call #{r.calls_to_crash}"
        if r.seconds_to_crash is not None:
            detail += f", {_seconds(r.seconds_to_crash)} after its first query"
        return detail
    if status is Outcome.DETECTED:
        return "stopped at the call that corrupted the heap, under glibc's checking allocator"
    if status is Outcome.NOT_STARTED:
        return f"could not start ({r.outcome.removeprefix('could not start: ')})"
    if status is Outcome.CLEAN:
        return "ran clean"
    return r.outcome


def _sentence(s: str) -> str:
    return s[:1].upper() + s[1:]


def _seconds(t: float) -> str:
    """``0.000412`` -> ``0.41 ms``; ``2.5`` -> ``2.50 s``."""
    return f"{t * 1000:.2f} ms" if t < 1 else f"{t:.2f} s"


def _who(r: ReproRun) -> str:
    return "the C reproducer" if r.name == "c" else "the Python reproducer"


def decide(f: Facts, known: list[KnownMatch]) -> Conclusion:
    """The incident decision (:func:`~.decision.decide_incident`) and its conclusion in words, claim by claim."""
    d = decide_incident(f, known)
    upgrade = list(dict.fromkeys(_sentence(s.fix) for s in support_facts(f) if s.fix))
    fixed = [k for k in known if k.fix]
    upgrade += [_sentence(k.fix) for k in fixed if _sentence(k.fix) not in upgrade]
    claims = _CLAIMS[d.incident](f, d, fixed)
    evidence = [i.fact for i in d.items if i.key in d.basis]
    ask = ""
    if d.incident is IncidentClass.DRIVER and any(r.report is ReportTemplate.NVITOP for r in d.routes):
        ask = ("nvitop cannot fix the driver, but it can avoid the crashing call: a switch (option or "
               "environment variable) that turns the NVLink throughput metrics off, or skipping them on the "
               "affected driver branch, would keep nvitop-exporter up until NVIDIA fixes the driver.")
    elif d.incident is IncidentClass.BINDING and d.pattern:
        ask = "Please look at how nvitop calls this NVML query from its threads: the same query from C does not crash."
    filings = tuple(Filing(order=r.order, where=r.where, report=r.report, action=r.action) for r in d.routes)
    return Conclusion(incident=d.incident, decision=d, claims=tuple(claims), evidence=tuple(evidence),
                      unsupported=d.unsupported, upgrade=tuple(upgrade) if d.incident in _UPGRADING else (),
                      filings=filings, ask_nvitop=ask)


#: the classes whose conclusion is an upgrade (the others' upgrades are steps of the runbook, if any)
_UPGRADING = (IncidentClass.INSTALL, IncidentClass.KNOWN, IncidentClass.DRIVER, IncidentClass.BINDING)


_MODULE_KEYS = ("imports.nvitop", "imports.nvitop_exporter", "imports.pynvml")


def _has(d: Decision, *keys: str) -> tuple[str, ...]:
    return tuple(k for k in keys if k in d.keys)


def _runs_claim(f: Facts, d: Decision) -> list[Claim]:
    runs = [r for r in (f.python_run, f.c_run) if r]
    if not runs:
        return []
    return [Claim(text=_sentence("; ".join(f"{_who(r)} {_run_phrase(r)}" for r in runs)) + ".",
                  evidence=_has(d, *(f"repro.{r.name}" for r in runs)))]


def _setup_claims(f: Facts, d: Decision, also: str) -> list[Claim]:
    out = []
    if d.shadowed:
        out.append(Claim(text="The code that ran is not the installed distribution's: " + "; ".join(d.shadowed)
                         + f". Fix the image {also}.", evidence=_has(d, *_MODULE_KEYS)))
    if d.unsupported:
        out.append(Claim(text=f"The Python setup is also outside what nvitop declares ({'; '.join(d.unsupported)}); "
                              f"fix that {also}.", evidence=_has(d, "imports.requirements", "imports.support")))
    return out


def _driver(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    c, py = f.c_run, f.python_run
    core = _has(d, "core", "core.inside_nvml")
    out = []
    if c is not None and c.failed:
        out.append(Claim(text=f"The evidence points at the NVIDIA driver library: {_crash_phrase(f)}." if core else
                         "The evidence points at the NVIDIA driver library.", evidence=core + _has(d, "repro.c")))
        out.append(Claim(text=f"The C reproducer, which makes the same NVML calls without Python or nvidia-ml-py, "
                              f"{_run_phrase(c)}" + (f"; the Python reproducer {_run_phrase(py)}" if py else "") + ".",
                         evidence=_has(d, "repro.c", "repro.python")))
        if f.heap_verdict in (OverflowVerdict.DRIVER, OverflowVerdict.LIBRARY):
            out.append(Claim(text=f"The core's heap says the same: {f.heap_reason}.", evidence=_has(d, "heap")))
        why = "the C reproducer's crash"
    else:
        out.append(Claim(text=f"The core's heap points at the NVIDIA driver library: {_crash_phrase(f)}, and "
                              f"{f.heap_reason}.", evidence=core + _has(d, "heap")))
        out.append(Claim(text="The reproducers did not crash here; run them on an affected node too." if (py or c) else
                         "Run `forensics reproduce` on an affected node to confirm it from C.",
                         evidence=_has(d, "repro.c", "repro.python") or _has(d, "heap")))
        why = "what the core's heap shows"
    return out + _setup_claims(f, d, f"too, but {why} does not depend on it")


def _binding(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    c, py = f.c_run, f.python_run
    core = _has(d, "core", "core.inside_nvml")
    if d.pattern and py is not None:
        out = [Claim(text=f"The evidence points at the binding or the calling pattern: {_crash_phrase(f)}." if core
                     else "The evidence points at the binding or the calling pattern.",
                     evidence=core + _has(d, "repro.python")),
               Claim(text=f"The Python reproducer {_run_phrase(py)}; the C reproducer, making the same queries without "
                          f"Python, {_run_phrase(c) if c else 'did not run'}.",
                     evidence=_has(d, "repro.python", "repro.c"))]
        if d.unsupported:
            out.insert(0, Claim(text="The setup is unsupported: " + "; ".join(d.unsupported) + ".",
                                evidence=_has(d, "imports.requirements", "imports.support")))
            out.append(Claim(text="Make the setup supported and run the reproducers again before filing.",
                             evidence=_has(d, "imports.requirements", "imports.support")))
        return out
    binding = next((v.ran for v in d.versions if v.package == "nvidia-ml-py"), None)
    out = [Claim(text=f"The core's heap points at the binding, nvidia-ml-py{' ' + binding if binding else ''}, not the "
                      f"driver: {_crash_phrase(f)}, and {f.heap_reason}.", evidence=core + _has(d, "heap"))]
    if c is not None:
        out.append(Claim(text="The C reproducer, which makes the same NVML calls without nvidia-ml-py, "
                              f"{_run_phrase(c)}.", evidence=_has(d, "repro.c")))
    out.append(Claim(text="nvidia-ml-py is NVIDIA's: the binding report goes to them; pin nvidia-ml-py away from this "
                          "release meanwhile.", evidence=_has(d, "heap")))
    return out + _setup_claims(f, d, "too")


def _install(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    keys = _has(d, *(i.key for i in d.items if i.key.startswith("imports.")))
    out = []
    if d.shadowed:
        out.append(Claim(text="The code that ran is not the installed distribution's: " + "; ".join(d.shadowed) + ".",
                         evidence=_has(d, *_MODULE_KEYS)))
    if d.unsupported:
        out.append(Claim(text="The setup is unsupported: " + "; ".join(d.unsupported) + ".",
                         evidence=_has(d, "imports.requirements", "imports.support")))
    out.append(Claim(text="Fix the image first and check it with verify-imports; nothing is filed upstream until the "
                          "supported, installed code still crashes.", evidence=keys))
    if f.has_crash:
        out.append(Claim(text=_sentence(f"the crash: {_crash_phrase(f)}."),
                         evidence=_has(d, "core", "core.inside_nvml")))
    return out + _runs_claim(f, d)


def _known(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    k = fixed[0]
    return [Claim(text=f"This is a known issue: {k.title} (matched on {'; '.join(k.matched_on)}). "
                       f"{_sentence(k.fix)} before filing anything new.", evidence=(f"known.{k.id}",))]


def _not_nvml(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    keys = _has(d, "core", "core.frame")
    if d.incident is IncidentClass.PROGRAM:
        text = (f"Not NVML: the program's own code crashed, in {d.owner or 'its code'}, with no NVML call in progress: "
                f"{_crash_phrase(f)}.")
        owner = "the program's owner fixes it"
    else:
        text = (f"Not NVML: the crash is in {d.owner or 'another library'}, outside libnvidia-ml, with no NVML call in "
                f"progress: {_crash_phrase(f)}.")
        owner = "the owner of that library gets it"
    return [Claim(text=text, evidence=keys)] + _runs_claim(f, d) + [
        Claim(text=f"Nothing is to be filed with NVIDIA or nvitop; {owner}.", evidence=keys)]


def _no_crash(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    out = []
    if f.analysis is not None:
        out.append(Claim(text="No crash was observed: the core is a snapshot of the live process (as gcore leaves it).",
                         evidence=_has(d, "core")))
    elif f.repro_runs:
        out.append(Claim(text="No crash was observed: no core of a crash is in the evidence.",
                         evidence=_has(d, "missing", "repro.python", "repro.c")))
    out += _runs_claim(f, d)
    out.append(Claim(text="Nothing is to be filed; capture the next crash (its core) first.",
                     evidence=_has(d, "missing", "core", "repro.python", "repro.c")))
    return out


def _undetermined(f: Facts, d: Decision, fixed: list[KnownMatch]) -> list[Claim]:
    idle = [r for r in (f.python_run, f.c_run) if r and r.status is Outcome.NOT_STARTED]
    if idle:
        why = "the reproducers could not run here (" + "; ".join(f"{_who(r)} {_run_phrase(r)}" for r in idle) + ")"
    elif f.repro_runs:
        why = "neither reproducer crashed under these conditions"
    else:
        why = "no reproducer ran on an affected node"
    crash = _crash_phrase(f) if f.has_crash else "no crash core was analysed"
    return [Claim(text=f"Not determined yet: {crash}, but {why}.",
                  evidence=_has(d, "core", "core.inside_nvml", "repro.python", "repro.c", "missing")),
            Claim(text="Missing: " + "; ".join(d.missing) + "." if d.missing else
                  "Run `forensics reproduce` on an affected node (both reproducers, the same driver) before filing.",
                  evidence=_has(d, "missing") or _has(d, "core"))]


_CLAIMS = {IncidentClass.DRIVER: _driver, IncidentClass.BINDING: _binding, IncidentClass.INSTALL: _install,
           IncidentClass.KNOWN: _known, IncidentClass.PROGRAM: _not_nvml, IncidentClass.OUTSIDE_NVML: _not_nvml,
           IncidentClass.NO_CRASH: _no_crash, IncidentClass.UNDETERMINED: _undetermined}


def _crash_phrase(f: Facts) -> str:
    if not f.has_crash:
        if f.kind == "snapshot":
            return "no crash was analysed (the core is a snapshot of the live process, as gcore leaves it)"
        return "the process crashed (no core analysed)"
    what = (f'glibc aborts the process with "{f.abort_message}"' if f.abort_message
            else f"the process dies of {f.signal}")
    if f.api:
        where = f" in {f.api}" + (f" ({f.query.what} query)" if f.query and f.query.what else "")
        what += where + (" inside libnvidia-ml" if f.inside_nvml else "")
    return what
