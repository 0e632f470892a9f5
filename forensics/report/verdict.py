"""Stage 2 of a report: the conclusion the evidence supports, and which report to file where.

Pure: :class:`~.facts.Facts` and the known-issue matches in, :class:`Conclusion` out.

- The reproducers decide binding vs driver: the C reproducer calls libnvidia-ml without Python
  or nvidia-ml-py; if it crashes, the driver library is the suspect (whatever else is true);
  if only the Python one crashes, the binding or the calling pattern is.
- verify-imports decides whether the setup is supported: a pairing outside what a package
  declares (``pip check`` fails, a ``support`` version fact) is the first thing a maintainer
  answers ("upgrade and retry"), so it leads -- unless the C reproducer already took the
  binding out of the question.
- A known crash whose definition holds, with a fix released, means "upgrade", not "file".
- The core's heap (#21) decides it too when the crash is caught during the native call: the
  buffer that overflowed, the count it was passed with, its size; or a buffer libnvidia-ml
  allocated and freed itself inside the call, with nothing of the Python side pointing into it
  (``library-own-buffer``).  It settles the question when no reproducer has, and stands beside the
  reproducers when they ran.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..model import OverflowVerdict
from ..reproduce import Outcome, ReproRun
from .facts import Facts
from .known import KnownMatch, support_facts

__all__ = ["Suspect", "Filing", "Conclusion", "decide", "NVIDIA_WHERE", "NVITOP_REPO"]

NVITOP_REPO = "XuehaiPan/nvitop"
NVIDIA_WHERE = ("NVIDIA: an NVIDIA Enterprise Support case, or the NVIDIA Developer Forums "
                "(https://forums.developer.nvidia.com/) -- with the C reproducer and nvidia-bug-report.log.gz")


class Suspect(enum.Enum):
    DRIVER = "the driver library (libnvidia-ml.so)"
    BINDING_OR_CALLER = "the binding (nvidia-ml-py) or the calling pattern (threads, shutdown)"
    KNOWN = "a known issue, fixed in a later release"
    UNDETERMINED = "not determined yet"


@dataclass(frozen=True, slots=True, kw_only=True)
class Filing:
    order: int
    where: str  # who gets it
    report: str  # the template: nvml | nvitop | runbook
    action: str  # what to do with it


@dataclass(frozen=True, slots=True, kw_only=True)
class Conclusion:
    suspect: Suspect
    statement: str  # the conclusion, in one paragraph, plain text, first in every report
    evidence: tuple[str, ...]  # the facts it rests on, one line each
    unsupported: tuple[str, ...]  # the setup outside what the packages declare (pip check, support facts)
    upgrade: tuple[str, ...]  # what to upgrade to, from the support facts and known issues
    filings: tuple[Filing, ...]
    ask_nvitop: str  # what the nvitop issue asks for

    @property
    def driver_suspected(self) -> bool:
        return self.suspect is Suspect.DRIVER


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
    py, c = f.python_run, f.c_run
    py_bad = bool(py and py.failed)
    c_bad = bool(c and c.failed)
    idle = [r for r in (py, c) if r and r.status is Outcome.NOT_STARTED]
    evidence = [f"{_who(r)} {_run_phrase(r)}" for r in (py, c) if r]
    # the driver library's own buffer: only libnvidia-ml's free() points at the driver (another library's
    # own buffer is that library's bug, which this report's parties do not own)
    heap_own = f.heap_verdict is OverflowVerdict.LIBRARY and ((f.heap and f.heap.freed_in) or "").startswith(
        "libnvidia-ml")
    heap_driver = f.heap_verdict is OverflowVerdict.DRIVER or heap_own
    heap_binding = f.heap_verdict is OverflowVerdict.BINDING
    if f.heap_verdict:
        evidence.append(f"the core's heap: {f.heap_verdict.value}: {f.heap_reason}")
    support = support_facts(f)
    unsupported = [p.rstrip(".") for p in f.requirement_problems]  # pip check, as pip says it
    for s in support:  # a declared bound the knowledge file knows, unless pip check already said it
        named = " ".join(s["summary"].split()[:2])  # "nvitop 1.5.0"
        if s["severity"] == "error" and not any(u.startswith(named) for u in unsupported):
            unsupported.append(s["summary"])
    for sh in f.shadowing:  # the code that runs is not the installed distribution's
        if sh.split(":")[0] in ("nvitop", "nvitop_exporter", "pynvml"):
            unsupported.append(f"the process imports {sh}, not the installed distribution: fix the image first")
    upgrade = list(dict.fromkeys(_sentence(s["fix"]) for s in support if s.get("fix")))
    fixed = [k for k in known if k.fix]
    upgrade += [_sentence(k.fix) for k in fixed if _sentence(k.fix) not in upgrade]
    crash = _crash_phrase(f)

    runs = _Runs(py=py, c=c, py_bad=py_bad, c_bad=c_bad, heap_driver=heap_driver, heap_binding=heap_binding,
                 heap_own=heap_own)
    if c_bad or (heap_driver and not py_bad):
        suspect, statement, filings, ask = _points_at_driver(f, runs, crash, unsupported)
    elif py_bad or heap_binding:
        suspect, statement, filings, ask = _points_at_binding(f, runs, crash, unsupported)
    elif fixed:
        suspect, statement, filings, ask = _known_issue(fixed[0])
    else:
        suspect, statement, filings, ask = _undetermined(runs, idle, crash, unsupported)
    return Conclusion(suspect=suspect, statement=statement, evidence=tuple(evidence), unsupported=tuple(unsupported),
                      upgrade=tuple(upgrade), filings=filings, ask_nvitop=ask)


@dataclass(frozen=True)
class _Runs:
    """The reproducers' runs and what the core's heap said, as decide() reads them."""
    py: ReproRun | None
    c: ReproRun | None
    py_bad: bool
    c_bad: bool
    heap_driver: bool
    heap_binding: bool
    heap_own: bool = False  # heap_driver because libnvidia-ml overflowed a buffer of its own


_Outcome = tuple[Suspect, str, tuple[Filing, ...], str]  # suspect, statement, filings, the ask of nvitop


def _points_at_driver(f: Facts, runs: _Runs, crash: str, unsupported: list[str]) -> _Outcome:
    py, c = runs.py, runs.c
    suspect = Suspect.DRIVER
    if runs.c_bad and c is not None:  # c_bad: the C run crashed
        statement = (f"The evidence points at the NVIDIA driver library: {crash}. The C reproducer, which makes "
                     f"the same NVML calls without Python or nvidia-ml-py, {_run_phrase(c)}"
                     + (f"; the Python reproducer {_run_phrase(py)}" if py else "") + ".")
        if runs.heap_driver:
            statement += f" The core's heap says the same: {f.heap_reason}."
    else:
        statement = (f"The core's heap points at the NVIDIA driver library: {crash}, and {f.heap_reason}."
                     + (" The reproducers did not crash here; run them on an affected node too." if (py or c)
                        else " Run `forensics reproduce` on an affected node to confirm it from C."))
    if unsupported:
        statement += (" The Python setup is also outside what nvitop declares (" + "; ".join(unsupported) + "); "
                      "fix that too, but "
                      + ("the C reproducer's crash" if runs.c_bad else "what the core's heap shows")
                      + " does not depend on it.")
    filings = (
        Filing(order=1, where=NVIDIA_WHERE, report="nvml",
               action="file first: " + ("the driver crashes in the C reproducer" if runs.c_bad else
                                        "the core shows the driver overflowing a buffer it allocated and freed "
                                        "itself" if runs.heap_own else
                                        "the core shows the driver writing past a buffer sized for the count")),
        Filing(order=2, where=f"nvitop (https://github.com/{NVITOP_REPO}/issues)", report="nvitop",
               action="file after the NVIDIA report, linking it: ask for a way to switch the NVLink "
                      "throughput metrics off until the driver is fixed"),
    )
    ask = ("nvitop cannot fix the driver, but it can avoid the crashing call: a switch (option or "
           "environment variable) that turns the NVLink throughput metrics off, or skipping them on the "
           "affected driver branch, would keep nvitop-exporter up until NVIDIA fixes the driver.")
    return suspect, statement, filings, ask


def _points_at_binding(f: Facts, runs: _Runs, crash: str, unsupported: list[str]) -> _Outcome:
    py, c = runs.py, runs.c
    suspect = Suspect.BINDING_OR_CALLER
    if runs.py_bad and py is not None:  # py_bad: the Python run crashed
        statement = (f"The evidence points at the binding or the calling pattern: {crash}. The Python reproducer "
                     f"{_run_phrase(py)}; the C reproducer, making the same queries without Python from one "
                     f"thread, {_run_phrase(c) if c else 'did not run'}.")
        if runs.heap_binding:
            statement += f" The core's heap says the same: {f.heap_reason}."
    else:
        statement = f"The core's heap points at the binding: {crash}, and {f.heap_reason}."
    if unsupported:
        statement = ("The setup is unsupported: " + "; ".join(unsupported) + ". " + statement +
                     " Make the setup supported and run the reproducers again before filing.")
    filings = (
        Filing(order=1, where=f"nvitop (https://github.com/{NVITOP_REPO}/issues)", report="nvitop",
               action=("file once the setup is supported and it still crashes" if unsupported
                       else "file: the crash needs the binding's calling pattern")),
    )
    ask = "Please look at how nvitop calls this NVML query from its threads: the same query from C does not crash."
    return suspect, statement, filings, ask


def _known_issue(k: KnownMatch) -> _Outcome:
    suspect = Suspect.KNOWN
    statement = (f"This is a known issue: {k.title} (matched on {'; '.join(k.matched_on)}). "
                 f"{k.fix[0].upper() + k.fix[1:]}"
                 " before filing anything new.")
    filings = (Filing(order=1, where=k.sources[0][1] if k.sources else "the known issue", report="runbook",
                      action="upgrade; comment on the known issue only if the upgrade does not help"),)
    ask = f"The crash matches {k.title}; it still happens after: {k.fix}."
    return suspect, statement, filings, ask


def _undetermined(runs: _Runs, idle: list[ReproRun], crash: str, unsupported: list[str]) -> _Outcome:
    py, c = runs.py, runs.c
    suspect = Suspect.UNDETERMINED
    if idle:
        why = "the reproducers could not run here (" + "; ".join(f"{_who(r)} {_run_phrase(r)}" for r in idle) + ")"
    elif py or c:
        why = "neither reproducer crashed under these conditions"
    else:
        why = "no reproducer ran on an affected node"
    statement = (f"Driver or binding is not determined yet: {crash}, but {why}. Run `forensics reproduce` on an "
                 "affected node (both reproducers, the same driver) before filing upstream.")
    if unsupported:
        statement = ("The setup is unsupported: " + "; ".join(unsupported) + ". Upgrade and retry first; "
                     + statement[0].lower() + statement[1:])
    filings = (Filing(order=1, where="nobody yet", report="runbook",
                      action="reproduce on an affected node, then file where the reproducers point"),)
    ask = "Driver or binding is not determined yet; the reproducers did not settle it."
    return suspect, statement, filings, ask


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
