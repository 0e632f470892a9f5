"""The incident decision: which class of incident the evidence shows, on which evidence, and what follows.

Pure: :class:`~.facts.Facts` (read from the typed evidence: the analysis, the reproducers' result,
verify-imports' verdicts, the fleet, the heap's verdict, the capture) and the known-issue matches in,
:class:`Decision` out.  Made once; the conclusion's wording (:mod:`.verdict`), the titles, the routing
(who gets which report, in which order), the asks, the version facts and the runbook's "do now" steps
all follow from it, and a template sentence is written only for the class it holds for.

The classes, decided in this order:

- **driver fault**: the C reproducer (no Python, no nvidia-ml-py) crashed, or the core's heap shows the
  driver writing past a correctly sized buffer (or overflowing a buffer of its own) and the Python
  reproducer did not crash alone;
- **shadowed install**: the code that ran is not the installed distribution's (verify-imports: SHADOWED,
  ...) -- the image is fixed first, nothing is filed upstream;
- **binding fault**: the core's heap shows nvidia-ml-py passing a count larger than its buffer (a report to
  NVIDIA, who maintain nvidia-ml-py); or only the Python reproducer crashes while C does not (the calling
  pattern: nvitop's issue);
- **known issue**: a known crash whose whole definition holds, fixed in a later release;
- **no crash observed**: no crash core (a snapshot core, or none) and every reproducer ran clean;
- **the program's own bug**: a crash outside libnvidia-ml, with no NVML call in progress, whose innermost
  frame past libc is the interpreter's or ctypes' (the program's own code did it);
- **a crash outside NVML**: the same in another native library;
- **unsupported install**: the setup is outside what a package declares (pip check, version facts), and
  nothing above decided;
- **undetermined**: what is missing to decide is said.
"""
from __future__ import annotations

import dataclasses
import enum
import shlex
from dataclasses import dataclass

from ..guard import default_env
from ..imports.model import Verdict
from ..model import OverflowVerdict
from ..modes import BINDING_WHERE, INTERNAL_WHERE, NVIDIA_WHERE, NVITOP_WHERE, ReportTemplate
from ..reproduce import ReproRun
from .facts import Facts
from .known import KnownMatch, support_facts

__all__ = ["IncidentClass", "Item", "Route", "Step", "VersionFact", "Decision", "decide_incident", "STACK_PACKAGES"]

#: the Python stack of the incident: distribution name -> the module verify-imports checks
STACK_PACKAGES = {"nvitop": "nvitop", "nvitop-exporter": "nvitop_exporter", "nvidia-ml-py": "pynvml"}
_MODULE_PACKAGE = {m: d for d, m in STACK_PACKAGES.items()}
# the interpreter and ctypes' machinery: a crash whose innermost frame past libc is one of these was made by the
# program's own code (its Python code through ctypes, or the interpreter it runs on)
_PROGRAM_RUNTIME = ("libpython", "python3", "python", "_ctypes", "libffi")


class IncidentClass(enum.Enum):
    DRIVER = "driver-fault"
    BINDING = "binding-fault"
    INSTALL = "shadowed-or-unsupported-install"
    KNOWN = "known-issue"
    PROGRAM = "program-bug"
    OUTSIDE_NVML = "crash-outside-nvml"
    NO_CRASH = "no-crash"
    UNDETERMINED = "undetermined"

    @property
    def words(self) -> str:
        return _CLASS_WORDS[self]


_CLASS_WORDS = {
    IncidentClass.DRIVER: "a fault of the NVIDIA driver library (libnvidia-ml.so)",
    IncidentClass.BINDING: "a fault of the binding (nvidia-ml-py) or of its calling pattern",
    IncidentClass.INSTALL: "a shadowed or unsupported install: the code that ran is not the supported installed one",
    IncidentClass.KNOWN: "a known issue, fixed in a later release",
    IncidentClass.PROGRAM: "the program's own bug, not NVML",
    IncidentClass.OUTSIDE_NVML: "a crash outside NVML, in another library",
    IncidentClass.NO_CRASH: "no crash observed",
    IncidentClass.UNDETERMINED: "not determined yet",
}


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
class Decision:
    incident: IncidentClass
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

    def item(self, key: str) -> Item | None:
        return next((i for i in self.items if i.key == key), None)

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(i.key for i in self.items)


# ---- the evidence, keyed ---------------------------------------------------------------------------------

def _run_fact(r: ReproRun) -> str:
    who = "the C reproducer (no Python, no nvidia-ml-py)" if r.name == "c" else "the Python reproducer (nvidia-ml-py)"
    return f"{who}: {r.outcome}"


def _items(f: Facts, known: list[KnownMatch]) -> list[Item]:
    items: list[Item] = []
    a = f.analysis
    if a is not None:
        core = a.snapshot.core
        items.append(Item(key="core", source="analyze", fact=(
            f"the core of pid {core.pid}: {a.crash.summary}" if a.is_crash else
            f"the core of pid {core.pid} is a snapshot of the live process (no crash)")))
        if f.inside_nvml:
            items.append(Item(key="core.inside_nvml", source="analyze",
                              fact=f"the crashing thread faulted inside libnvidia-ml ({f.api or 'an NVML call'})"))
        elif (a.fault_thread is not None and a.fault_thread.nvml_on_stack) or f.api:
            items.append(Item(key="core.nvml_on_stack", source="analyze",
                              fact=f"an NVML call ({f.api or '?'}) was in progress on the crashing thread"))
        if not a.snapshot.native_method.unwound:
            items.append(Item(key="core.no_native", source="analyze",
                              fact="the native stacks were not unwound (program counters only)"))
        frame = _fault_frame(f)
        if frame:
            items.append(Item(key="core.frame", source="analyze", fact=f"the innermost frame past libc: {frame}"))
    for r in f.repro_runs:
        items.append(Item(key=f"repro.{r.name}", source="reproduce", fact=_run_fact(r)))
    if f.heap is not None:
        items.append(Item(key="heap", source="analyze (the core's heap)",
                          fact=f"the core's heap: {f.heap.verdict.value}: {f.heap.verdict_reason}"))
    for rep in f.imports:
        for m in rep.modules:
            if m.module in _MODULE_PACKAGE:
                items.append(Item(key=f"imports.{m.module}", source="verify-imports", fact=(
                    f"{m.module}: {m.verdict.value}" + (f", {m.resolved.file}" if m.resolved and m.resolved.file
                                                        else "") + (f" ({m.reason})" if m.reason else ""))))
    for p in f.requirement_problems:
        items.append(Item(key="imports.requirements", source="verify-imports (pip check)", fact=p.rstrip(".")))
    for s in support_facts(f):
        items.append(Item(key="imports.support", source="verify-imports (version facts)", fact=s.summary))
    for k in known:
        items.append(Item(key=f"known.{k.id}", source="known crashes", fact=f"{k.title}: {'; '.join(k.matched_on)}"))
    for line in f.frequency:
        items.append(Item(key="fleet", source="fleet / analyze-batch", fact=line))
    return items


def _fault_frame(f: Facts) -> str | None:
    """The crashing thread's innermost frame past libc's abort machinery, as ``symbol (library)``."""
    for fr in f.native_frames:
        lib = fr.library_name or ""
        if lib.startswith(("libc.so", "libc-", "libc_malloc_debug")):
            continue
        return f"{fr.symbol or '??'} ({lib or '?'})"
    return None


def _fault_library(f: Facts) -> str | None:
    for fr in f.native_frames:
        lib = fr.library_name or ""
        if lib.startswith(("libc.so", "libc-", "libc_malloc_debug")):
            continue
        return lib or None
    return None


def _program_frame(f: Facts) -> str | None:
    """The innermost Python frame of the crashing thread that is the program's own (not nvidia-ml-py's)."""
    for p in f.py_frames:
        if not p.file.endswith(("pynvml.py", "libnvml.py")):
            return f"{p.function} ({p.file.rsplit('/', 1)[-1]}:{p.line if p.line is not None else '?'})"
    return None


# ---- versions that ran -----------------------------------------------------------------------------------

def _versions(f: Facts) -> list[VersionFact]:
    out = []
    for package, module in STACK_PACKAGES.items():
        ran = installed = None
        source = "pip's metadata"
        for rep in f.imports:
            m = next((m for m in rep.modules if m.module == module), None)
            if m is None:
                continue
            ran = m.effective_version
            installed = (m.expected_distribution.version if m.expected_distribution else None) or (
                m.distribution.version if m.distribution else None) or m.expected_version
            source = ("the imported file " + m.resolved.file if m.resolved and m.resolved.file else "verify-imports")
            break
        if ran is None:
            ran = {"nvitop": f.nvitop, "nvitop-exporter": f.exporter, "nvidia-ml-py": f.binding}[package]
        if ran or installed:
            out.append(VersionFact(package=package, ran=ran, installed=installed, source=source))
    return out


# ---- the decision ----------------------------------------------------------------------------------------

def _shadowed(f: Facts) -> list[str]:
    out = []
    for rep in f.imports:
        for m in rep.modules:
            if m.module in _MODULE_PACKAGE and m.verdict is not Verdict.OK:
                where = m.resolved.file if m.resolved and m.resolved.file else "?"
                out.append(f"{m.module}: {m.verdict.value}: {where}" + (f" (fix: {m.fix})" if m.fix else ""))
    return out


def _unsupported(f: Facts) -> list[str]:
    out = [p.rstrip(".") for p in f.requirement_problems]
    for s in support_facts(f):
        named = " ".join(s.summary.split()[:2])  # "nvitop 1.5.0"
        if s.severity == "error" and not any(u.startswith(named) for u in out):
            out.append(s.summary)
    return out


def decide_incident(f: Facts, known: list[KnownMatch]) -> Decision:
    """The incident's class and everything that follows from it (see the module's docstring for the order)."""
    items = _items(f, known)
    keys = {i.key for i in items}
    py, c = f.python_run, f.c_run
    c_bad, py_bad = bool(c and c.failed), bool(py and py.failed)
    heap = f.heap_verdict
    heap_own = heap is OverflowVerdict.LIBRARY and ((f.heap and f.heap.freed_in) or "").startswith("libnvidia-ml")
    heap_driver = heap is OverflowVerdict.DRIVER or heap_own
    shadowed, unsupported = _shadowed(f), _unsupported(f)
    fixed = [k for k in known if k.fix]
    nvml_involved = f.inside_nvml or "core.nvml_on_stack" in keys
    missing: list[str] = []
    basis: list[str]
    pattern = False
    owner = None
    # the heap's word for the driver stands unless only the Python reproducer crashed (C clean): then the calling
    # pattern is what triggers it, and nvitop is asked
    if c_bad or (heap_driver and not (py_bad and c is not None)):
        incident = IncidentClass.DRIVER
        basis = [k for k in ("repro.c", "heap", "core.inside_nvml") if k in keys]
    elif shadowed:
        incident = IncidentClass.INSTALL
        basis = [i.key for i in items if i.key.startswith("imports.")]
    elif heap is OverflowVerdict.BINDING:
        incident = IncidentClass.BINDING
        basis = [k for k in ("heap", "repro.c", "core.inside_nvml") if k in keys]
    elif py_bad and c is not None and (nvml_involved or not f.has_crash):
        incident, pattern = IncidentClass.BINDING, True
        basis = [k for k in ("repro.python", "repro.c", "core.inside_nvml") if k in keys]
    elif fixed:
        incident = IncidentClass.KNOWN
        basis = [f"known.{fixed[0].id}"]
    elif not f.has_crash and (f.repro_runs or f.analysis is not None) \
            and all(r.status.value == "clean" for r in f.repro_runs):
        incident = IncidentClass.NO_CRASH
        basis = [k for k in ("core", "repro.python", "repro.c") if k in keys]
    elif f.has_crash and not nvml_involved and f.native_frames and "core.no_native" not in keys:
        lib = _fault_library(f) or ""
        if lib.startswith(_PROGRAM_RUNTIME) or not lib:
            incident = IncidentClass.PROGRAM
            owner = _program_frame(f) or _fault_frame(f)
        else:
            incident, owner = IncidentClass.OUTSIDE_NVML, _fault_frame(f)
        basis = [k for k in ("core", "core.frame", "repro.c", "repro.python") if k in keys]
    elif unsupported:
        incident = IncidentClass.INSTALL
        basis = ["imports.requirements"] if "imports.requirements" in keys else []
    else:
        incident = IncidentClass.UNDETERMINED
        basis = [k for k in ("core", "core.inside_nvml", "repro.python", "repro.c", "heap") if k in keys]
    if incident is IncidentClass.UNDETERMINED or incident is IncidentClass.NO_CRASH:
        missing = _missing(f)
        if missing:
            items.append(Item(key="missing", source="what the evidence lacks", fact="; ".join(missing)))
    d = Decision(incident=incident, items=tuple(items), basis=tuple(basis), missing=tuple(missing), routes=(),
                 steps=(), versions=tuple(_versions(f)), shadowed=tuple(shadowed), unsupported=tuple(unsupported),
                 pattern=pattern, owner=owner)
    return dataclasses.replace(d, routes=tuple(_routes(d, f, fixed)), steps=tuple(_steps(d, f, fixed)))


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


# ---- routing: who gets which report ----------------------------------------------------------------------

def _nvlink(f: Facts) -> bool:
    """nvitop's NVLink throughput query is the crashing call: nvitop can stop making it (its call pattern matters)."""
    return bool(f.query and f.query.what == "NVLink throughput")


def _routes(d: Decision, f: Facts, fixed: list[KnownMatch]) -> list[Route]:
    basis = d.basis
    k = d.incident
    if k is IncidentClass.DRIVER:
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
        if _nvlink(f):
            out.append(Route(order=2, owner="nvitop", where=NVITOP_WHERE, report=ReportTemplate.NVITOP,
                             action="file after the NVIDIA report, linking it: ask for a way to switch the NVLink "
                                    "throughput metrics off until the driver is fixed",
                             evidence=("core.inside_nvml",) if f.inside_nvml else basis))
        return out
    if k is IncidentClass.BINDING and not d.pattern:
        return [Route(order=1, owner="NVIDIA (nvidia-ml-py)", where=BINDING_WHERE, report=ReportTemplate.BINDING,
                      action="file: nvidia-ml-py passes a count larger than its buffer", evidence=basis,
                      ask=f"Please fix nvidia-ml-py{' ' + f.binding if f.binding else ''}: {f.heap_reason}.")]
    if k is IncidentClass.BINDING:
        return [Route(order=1, owner="nvitop", where=NVITOP_WHERE, report=ReportTemplate.NVITOP,
                      action=("file once the setup is supported and it still crashes" if d.unsupported
                              else "file: the crash needs the binding's calling pattern"), evidence=basis)]
    internal = INTERNAL_WHERE
    actions = {
        IncidentClass.INSTALL: "fix the image first; file nothing upstream until the installed code still crashes",
        IncidentClass.KNOWN: "upgrade; comment on the known issue only if the upgrade does not help",
        IncidentClass.PROGRAM: f"hand it to the program's owner ({d.owner or 'its code'}): not NVML, nothing to file "
                               "with NVIDIA or nvitop",
        IncidentClass.OUTSIDE_NVML: f"hand it to the owner of {d.owner or 'the library that faulted'}: not NVML, "
                                    "nothing to file with NVIDIA or nvitop",
        IncidentClass.NO_CRASH: "nothing to file: capture the next crash",
        IncidentClass.UNDETERMINED: "collect what is missing, then file where the evidence points",
    }
    where = fixed[0].sources[0][1] if k is IncidentClass.KNOWN and fixed and fixed[0].sources else internal
    return [Route(order=1, owner="the team", where=where, report=ReportTemplate.RUNBOOK, action=actions[k],
                  evidence=basis)]


# ---- the runbook's "do now" steps ------------------------------------------------------------------------

def _site_packages(f: Facts) -> str | None:
    """Where nvitop is installed (its distribution's sys.path entry), as verify-imports read it."""
    for rep in f.imports:
        for dist in rep.distributions:
            if dist.name.lower() == "nvitop":
                return dist.location
    return None


def _guard_step(f: Facts, evidence: tuple[str, ...]) -> Step:
    site = _site_packages(f)
    text = ("Stop the crashing call: nvitop-exporter has no option to skip the NVLink metrics, so a start-up guard "
            f"makes nvitop's Device.nvlink_throughput return [] ({default_env('Device.nvlink_throughput')}=0 turns it "
            "off again); write it into the site-packages nvitop is installed in, then restart the exporter")
    command = None
    if site:
        command = ("forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --out "
                   + shlex.quote(site))
    else:
        text += " (where that is was not in the evidence: run verify-imports to find it)"
    return Step(text=text, command=command, evidence=evidence)


def _verify_command(f: Facts) -> str | None:
    """The verify-imports command that proves an image fix: the image again, or the process's root and command."""
    for rep in f.imports:
        if rep.image.transport.value != "pid":
            return "forensics verify-imports " + shlex.quote(rep.image.ref)
        if rep.python is not None and rep.python.entrypoint.argv:  # a live process: its root, command and directory
            return (f"forensics verify-imports {shlex.quote('dir:' + (rep.image.root or '/'))} --entrypoint "
                    f"{shlex.quote(shlex.join(rep.python.entrypoint.argv))} --workdir "
                    f"{shlex.quote(rep.python.working_dir)}")
    return None


def _steps(d: Decision, f: Facts, fixed: list[KnownMatch]) -> list[Step]:
    k = d.incident
    basis = d.basis
    steps: list[Step] = []
    if k is IncidentClass.DRIVER:
        if _nvlink(f):
            steps.append(_guard_step(f, basis))
        steps.append(Step(text=f"Move the affected node groups to a driver branch without the crash (this is driver "
                               f"{f.driver or 'of unknown version'})", command=None, evidence=basis))
    elif k is IncidentClass.BINDING and not d.pattern:
        steps += _pin_steps(d, f, basis)
    elif k is IncidentClass.BINDING:
        if _nvlink(f):
            steps.append(_guard_step(f, basis))
    elif k is IncidentClass.KNOWN:
        steps.append(Step(text=f"Upgrade: {fixed[0].fix}", command=None, evidence=basis))
    elif k is IncidentClass.PROGRAM:
        steps.append(Step(text=f"Give the crash to the program's owner: it faulted in its own code, "
                               f"{d.owner or 'outside NVML'}, with no NVML call in progress", command=None,
                          evidence=basis))
    elif k is IncidentClass.OUTSIDE_NVML:
        steps.append(Step(text=f"Give the crash to the owner of {d.owner or 'the library that faulted'}: it faulted "
                               "there, with no NVML call in progress", command=None, evidence=basis))
    elif k is IncidentClass.NO_CRASH:
        steps.append(Step(text="Nothing crashed in this evidence: keep the core handler armed on the affected nodes "
                               "(forensics core-handler) so that the next crash keeps its core, then analyze it",
                          command=None, evidence=basis))
    elif k is IncidentClass.UNDETERMINED:
        steps += [Step(text=f"Collect {m}", command=None, evidence=basis) for m in d.missing]
    steps += _install_steps(d, f)
    return steps


def _install_steps(d: Decision, f: Facts) -> list[Step]:
    """The image's fix (shadowing), and the supported setup: first for an install incident, after the class's own
    steps for any other."""
    out = []
    keys = tuple(i.key for i in d.items if i.key.startswith("imports."))
    for s in d.shadowed:
        out.append(Step(text=f"Fix the image so that the installed code runs: {s}", command=None, evidence=keys))
    if d.shadowed:
        cmd = _verify_command(f)
        out.append(Step(text="Prove it: verify-imports says OK for nvitop, nvitop_exporter and pynvml"
                             + ("" if cmd else " (run it on the fixed image, or with --pid on the restarted process)"),
                        command=cmd, evidence=keys))
    for u in d.unsupported:
        out.append(Step(text=f"Make the setup supported: {u}", command=None, evidence=keys))
    return out


def _pin_steps(d: Decision, f: Facts, evidence: tuple[str, ...]) -> list[Step]:
    """The supported nvidia-ml-py pin (what nvitop declares, without the release whose count overflowed the
    buffer), as the requirement line and the pip command that installs it into the image's environment, then the
    command that proves it took: the binding that interpreter imports is not that release (exit 1 while it is)."""
    ran = next((v.ran for v in d.versions if v.package == "nvidia-ml-py"), None) or f.binding
    declared = None
    for rep in f.imports:
        for dist in rep.distributions:
            if dist.name.lower() == "nvitop":
                declared = next((r for r in dist.requires if r.lower().startswith("nvidia-ml-py")), None)
    pin = (declared.split(";")[0].strip() if declared else "nvidia-ml-py")
    if ran:
        pin += ("," if any(c in pin for c in "<>=!~") else "") + f"!={ran}"
    why = (f" (what nvitop declares, without {ran}, whose count overflowed the buffer)" if declared and ran else
           f" (not {ran}, whose count overflowed the buffer)" if ran else "")
    out = [Step(text=f"Pin the binding in the image's requirements to `{pin}`{why}, and install it into the image's "
                     "environment (the python3 that runs the program)",
                command=f"python3 -m pip install {shlex.quote(pin)}", evidence=evidence)]
    if ran:
        check = ("import importlib.metadata as m, pynvml; v = m.version('nvidia-ml-py'); "
                 f"print('nvidia-ml-py', v, pynvml.__file__); raise SystemExit(v == {ran!r})")
        out.append(Step(text=f"Prove it: the binding that python3 imports is not {ran} (exit 1 while it is)",
                        command=f"python3 -c {shlex.quote(check)}", evidence=evidence))
    return out
