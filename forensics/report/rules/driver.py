"""A fault of the NVIDIA driver library: the C reproducer (no Python, no nvidia-ml-py) crashed, or the core's heap
shows the driver writing past a correctly sized buffer (or overflowing a buffer of its own) and the Python
reproducer did not crash alone.  NVIDIA gets the driver report first; nvitop the second when its NVLink query is
the crashing call (it can stop making it)."""
from __future__ import annotations

from ...model import OverflowVerdict
from ...modes import NVIDIA_WHERE, NVITOP_WHERE, ReportTemplate
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import (crash_phrase, guard_step, has, nvidia_call_title, nvitop_driver_title, nvlink, run_phrase,
                     runbook_title, setup_claims, where_it_fires)
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _decides(g: Grounds) -> Found | None:
    # the heap's word for the driver stands unless only the Python reproducer crashed (C clean): then the calling
    # pattern is what triggers it, and nvitop is asked
    if g.c_failed or (g.heap_says_driver and not (g.python_failed and g.f.c_run is not None)):
        return Found(basis=g.has("repro.c", "heap", "core.inside_nvml"))
    return None


def _routes(g: Grounds, d: Decision) -> list[Route]:
    f, basis = g.f, d.basis
    why = ("the driver crashes in the C reproducer" if "repro.c" in basis and f.c_run and f.c_run.failed else
           "the core shows the driver overflowing a buffer it allocated and freed itself"
           if f.heap_verdict is OverflowVerdict.LIBRARY else
           "the core shows the driver writing past a buffer sized for the count")
    api = f.api or f.earlier_api or "the NVML call"
    out = [Route(order=1, owner="NVIDIA (the driver)", where=NVIDIA_WHERE, report=ReportTemplate.NVML,
                 action="file first: " + why, evidence=basis,
                 ask=f"Please fix {api} in driver {f.driver or '(version in the evidence)'}: " + why + "; "
                     + ("the C reproducer attached shows it without Python or nvidia-ml-py."
                        if f.c_run and f.c_run.failed else "the core's heap reading is below."))]
    if nvlink(f):
        out.append(Route(order=2, owner="nvitop", where=NVITOP_WHERE, report=ReportTemplate.NVITOP,
                         action="file after the NVIDIA report, linking it: ask for a way to switch the NVLink "
                                "throughput metrics off until the driver is fixed",
                         evidence=("core.inside_nvml",) if f.inside_nvml else basis))
    return out


def _steps(g: Grounds, d: Decision) -> list[Step]:
    f = g.f
    steps = [guard_step(f, d.basis)] if nvlink(f) else []
    steps.append(Step(text=f"Move the affected node groups to a driver branch without the crash (this is driver "
                           f"{f.driver or 'of unknown version'})", command=None, evidence=d.basis))
    return steps


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    c, py = f.c_run, f.python_run
    core = has(d, "core", "core.inside_nvml")
    out = []
    if c is not None and c.failed:
        out.append(Claim(text=f"The evidence points at the NVIDIA driver library: {crash_phrase(f)}." if core else
                         "The evidence points at the NVIDIA driver library.", evidence=core + has(d, "repro.c")))
        out.append(Claim(text=f"The C reproducer, which makes the same NVML calls without Python or nvidia-ml-py, "
                              f"{run_phrase(c)}" + (f"; the Python reproducer {run_phrase(py)}" if py else "") + ".",
                         evidence=has(d, "repro.c", "repro.python")))
        where = where_it_fires(f)
        if where is not None:
            out.append(Claim(text=where, evidence=has(d, "repro.c", "repro.c.main")))
        if f.heap_verdict in (OverflowVerdict.DRIVER, OverflowVerdict.LIBRARY):
            out.append(Claim(text=f"The core's heap says the same: {f.heap_reason}.", evidence=has(d, "heap")))
        why = "the C reproducer's crash"
    else:
        out.append(Claim(text=f"The core's heap points at the NVIDIA driver library: {crash_phrase(f)}, and "
                              f"{f.heap_reason}.", evidence=core + has(d, "heap")))
        out.append(Claim(text="The reproducers did not crash here; run them on an affected node too." if (py or c) else
                         "Run `forensics reproduce` on an affected node to confirm it from C.",
                         evidence=has(d, "repro.c", "repro.python") or has(d, "heap")))
        why = "what the core's heap shows"
    return out + setup_claims(d, f"too, but {why} does not depend on it")


def _ask_nvitop(g: Grounds, d: Decision) -> str:
    if not any(r.report is ReportTemplate.NVITOP for r in d.routes):
        return ""
    return ("nvitop cannot fix the driver, but it can avoid the crashing call: a switch (option or environment "
            "variable) that turns the NVLink throughput metrics off, or skipping them on the affected driver branch, "
            "would keep nvitop-exporter up until NVIDIA fixes the driver.")


RULE = IncidentRule(
    incident=IncidentClass.DRIVER, words="a fault of the NVIDIA driver library (libnvidia-ml.so)",
    criteria=(Criterion(rank=10, test=_decides),), routes=_routes, steps=_steps, claims=_claims,
    ask_nvitop=_ask_nvitop, upgrading=True,
    titles={ReportTemplate.NVML: nvidia_call_title, ReportTemplate.NVITOP: nvitop_driver_title,
            ReportTemplate.RUNBOOK: runbook_title})
