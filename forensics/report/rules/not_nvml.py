"""Not NVML: a crash with no NVML call in progress on the crashing thread, whose innermost frame past libc is the
program's own (the interpreter's or ctypes': :data:`PROGRAM`) or another native library's
(:data:`OUTSIDE_NVML`).  It is handed to that code's owner; nothing is filed with NVIDIA or nvitop."""
from __future__ import annotations

from ...modes import INTERNAL_WHERE, ReportTemplate
from ..grounds import PROGRAM_RUNTIME, Grounds, fault_frame, fault_library, program_frame
from ..incident import Claim, Decision, IncidentClass, Route, Step
from .common import runbook_title, crash_phrase, has, runs_claim
from .row import Criterion, Found, IncidentRule

__all__ = ["PROGRAM", "OUTSIDE_NVML"]


def _crash_outside_nvml(g: Grounds) -> bool:
    f = g.f
    return f.has_crash and not g.nvml_involved and bool(f.native_frames) and "core.no_native" not in g.keys


def _basis(g: Grounds) -> tuple[str, ...]:
    return g.has("core", "core.frame", "repro.c", "repro.python")


def _programs_own(g: Grounds) -> Found | None:
    lib = fault_library(g.f) or ""
    if _crash_outside_nvml(g) and (lib.startswith(PROGRAM_RUNTIME) or not lib):
        return Found(basis=_basis(g), owner=program_frame(g.f) or fault_frame(g.f))
    return None


def _another_librarys(g: Grounds) -> Found | None:
    lib = fault_library(g.f) or ""
    if _crash_outside_nvml(g) and lib and not lib.startswith(PROGRAM_RUNTIME):
        return Found(basis=_basis(g), owner=fault_frame(g.f))
    return None


def _routes(g: Grounds, d: Decision) -> list[Route]:
    action = (f"hand it to the program's owner ({d.owner or 'its code'}): not NVML, nothing to file with NVIDIA or "
              "nvitop" if d.incident is IncidentClass.PROGRAM else
              f"hand it to the owner of {d.owner or 'the library that faulted'}: not NVML, nothing to file with "
              "NVIDIA or nvitop")
    return [Route(order=1, owner="the team", where=INTERNAL_WHERE, report=ReportTemplate.RUNBOOK, action=action,
                  evidence=d.basis)]


def _steps(g: Grounds, d: Decision) -> list[Step]:
    if d.incident is IncidentClass.PROGRAM:
        return [Step(text=f"Give the crash to the program's owner: it faulted in its own code, "
                          f"{d.owner or 'outside NVML'}, with no NVML call in progress", command=None,
                     evidence=d.basis)]
    return [Step(text=f"Give the crash to the owner of {d.owner or 'the library that faulted'}: it faulted "
                      "there, with no NVML call in progress", command=None, evidence=d.basis)]


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    keys = has(d, "core", "core.frame")
    if d.incident is IncidentClass.PROGRAM:
        text = (f"Not NVML: the program's own code crashed, in {d.owner or 'its code'}, with no NVML call in progress: "
                f"{crash_phrase(f)}.")
        owner = "the program's owner fixes it"
    else:
        text = (f"Not NVML: the crash is in {d.owner or 'another library'}, outside libnvidia-ml, with no NVML call in "
                f"progress: {crash_phrase(f)}.")
        owner = "the owner of that library gets it"
    return [Claim(text=text, evidence=keys)] + runs_claim(f, d) + [
        Claim(text=f"Nothing is to be filed with NVIDIA or nvitop; {owner}.", evidence=keys)]


PROGRAM = IncidentRule(
    incident=IncidentClass.PROGRAM, words="the program's own bug, not NVML",
    criteria=(Criterion(rank=70, test=_programs_own),), routes=_routes, steps=_steps, claims=_claims,
    titles={ReportTemplate.RUNBOOK: runbook_title})
OUTSIDE_NVML = IncidentRule(
    incident=IncidentClass.OUTSIDE_NVML, words="a crash outside NVML, in another library",
    criteria=(Criterion(rank=71, test=_another_librarys),), routes=_routes, steps=_steps, claims=_claims,
    titles={ReportTemplate.RUNBOOK: runbook_title})
