"""A fault of the binding (nvidia-ml-py) or of its calling pattern: the core's heap shows nvidia-ml-py passing a
count larger than its buffer (a report to NVIDIA, who maintain nvidia-ml-py); or only the Python reproducer
crashes while C does not (the calling pattern: nvitop's issue)."""
from __future__ import annotations

from ...model import OverflowVerdict
from ...modes import BINDING_WHERE, NVITOP_WHERE, ReportTemplate
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import (binding_title, crash_phrase, guard_step, has, nvitop_title, nvlink, pin_steps, run_phrase,
                     runbook_title, setup_claims)
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _heap_says_binding(g: Grounds) -> Found | None:
    if g.f.heap_verdict is OverflowVerdict.BINDING:
        return Found(basis=g.has("heap", "repro.c", "core.inside_nvml"))
    return None


def _only_python_crashes(g: Grounds) -> Found | None:
    f = g.f
    if g.python_failed and f.c_run is not None and (g.nvml_involved or not f.has_crash):
        return Found(basis=g.has("repro.python", "repro.c", "core.inside_nvml"), pattern=True)
    return None


def _routes(g: Grounds, d: Decision) -> list[Route]:
    f = g.f
    if not d.pattern:
        return [Route(order=1, owner="NVIDIA (nvidia-ml-py)", where=BINDING_WHERE, report=ReportTemplate.BINDING,
                      action="file: nvidia-ml-py passes a count larger than its buffer", evidence=d.basis,
                      ask=f"Please fix nvidia-ml-py{' ' + f.binding if f.binding else ''}: {f.heap_reason}.")]
    return [Route(order=1, owner="nvitop", where=NVITOP_WHERE, report=ReportTemplate.NVITOP,
                  action=("file once the setup is supported and it still crashes" if d.unsupported
                          else "file: the crash needs the binding's calling pattern"), evidence=d.basis)]


def _steps(g: Grounds, d: Decision) -> list[Step]:
    if not d.pattern:
        return pin_steps(g, d, d.basis)
    # the calling pattern: the guard stops the call; another binding release is the other way to see it go
    return ([guard_step(g.f, d.basis)] if nvlink(g.f) else []) + pin_steps(
        g, d, d.basis, avoid="with which the Python reproducer crashes while the C one, the same queries without "
                             "nvidia-ml-py, runs clean")


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    c, py = f.c_run, f.python_run
    core = has(d, "core", "core.inside_nvml")
    if d.pattern and py is not None:
        out = [Claim(text=f"The evidence points at the binding or the calling pattern: {crash_phrase(f)}." if core
                     else "The evidence points at the binding or the calling pattern.",
                     evidence=core + has(d, "repro.python")),
               Claim(text=f"The Python reproducer {run_phrase(py)}; the C reproducer, making the same queries without "
                          f"Python, {run_phrase(c) if c else 'did not run'}.",
                     evidence=has(d, "repro.python", "repro.c"))]
        if d.unsupported:
            out.insert(0, Claim(text="The setup is unsupported: " + "; ".join(d.unsupported) + ".",
                                evidence=has(d, "imports.requirements", "imports.support")))
            out.append(Claim(text="Make the setup supported and run the reproducers again before filing.",
                             evidence=has(d, "imports.requirements", "imports.support")))
        return out
    binding = d.version_ran("nvidia-ml-py")
    out = [Claim(text=f"The core's heap points at the binding, nvidia-ml-py{' ' + binding if binding else ''}, not the "
                      f"driver: {crash_phrase(f)}, and {f.heap_reason}.", evidence=core + has(d, "heap"))]
    if c is not None:
        out.append(Claim(text="The C reproducer, which makes the same NVML calls without nvidia-ml-py, "
                              f"{run_phrase(c)}.", evidence=has(d, "repro.c")))
    out.append(Claim(text="nvidia-ml-py is NVIDIA's: the binding report goes to them; pin nvidia-ml-py away from this "
                          "release meanwhile.", evidence=has(d, "heap")))
    return out + setup_claims(d, "too")


def _ask_nvitop(g: Grounds, d: Decision) -> str:
    if not d.pattern:
        return ""
    return "Please look at how nvitop calls this NVML query from its threads: the same query from C does not crash."


RULE = IncidentRule(
    incident=IncidentClass.BINDING, words="a fault of the binding (nvidia-ml-py) or of its calling pattern",
    criteria=(Criterion(rank=30, test=_heap_says_binding), Criterion(rank=40, test=_only_python_crashes)),
    routes=_routes, steps=_steps, claims=_claims, ask_nvitop=_ask_nvitop, upgrading=True,
    titles={ReportTemplate.BINDING: binding_title, ReportTemplate.NVITOP: nvitop_title,
            ReportTemplate.RUNBOOK: runbook_title})
