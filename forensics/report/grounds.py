"""What an incident decision stands on: the typed facts, the known-issue matches, and what is read from them once
-- the evidence keyed into items, the versions that ran, the modules not OK, the setup outside what the packages
declare, and the judgements every rule's predicate reads (:class:`Grounds`).

Pure: :class:`~.facts.Facts` and the known-issue matches in, :class:`Grounds` out (:func:`read_grounds`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..imports.model import Verdict
from ..model import OverflowVerdict
from ..reproduce import Outcome, ReproRun
from .facts import Facts
from .incident import Item, VersionFact
from .known import KnownMatch, support_facts

__all__ = ["Grounds", "read_grounds", "STACK_PACKAGES", "fault_frame", "fault_library", "program_frame"]

#: the Python stack of the incident: distribution name -> the module verify-imports checks
STACK_PACKAGES = {"nvitop": "nvitop", "nvitop-exporter": "nvitop_exporter", "nvidia-ml-py": "pynvml"}
_MODULE_PACKAGE = {m: d for d, m in STACK_PACKAGES.items()}
# the interpreter and ctypes' machinery: a crash whose innermost frame past libc is one of these was made by the
# program's own code (its Python code through ctypes, or the interpreter it runs on)
PROGRAM_RUNTIME = ("libpython", "python3", "python", "_ctypes", "libffi")
_LIBC = ("libc.so", "libc-", "libc_malloc_debug")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grounds:
    """The facts and what every rule reads of them, read once."""

    f: Facts
    known: tuple[KnownMatch, ...]
    items: tuple[Item, ...]  # every piece of evidence, keyed
    versions: tuple[VersionFact, ...]
    shadowed: tuple[str, ...]  # the stack's modules whose code is not the installed distribution's
    unsupported: tuple[str, ...]  # the setup outside what the packages declare

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(i.key for i in self.items)

    def has(self, *keys: str) -> tuple[str, ...]:
        """``keys`` the evidence holds, in the order given."""
        present = self.keys
        return tuple(k for k in keys if k in present)

    @property
    def fixed(self) -> tuple[KnownMatch, ...]:
        """The known issues that match and are fixed in a later release."""
        return tuple(k for k in self.known if k.fix)

    @property
    def c_failed(self) -> bool:
        return bool(self.f.c_run and self.f.c_run.failed)

    @property
    def python_failed(self) -> bool:
        return bool(self.f.python_run and self.f.python_run.failed)

    @property
    def heap_says_driver(self) -> bool:
        """The core's heap shows the driver writing past a buffer sized for the count, or overflowing one of its
        own (allocated and freed inside libnvidia-ml)."""
        heap = self.f.heap_verdict
        own = heap is OverflowVerdict.LIBRARY and ((self.f.heap and self.f.heap.freed_in) or "").startswith(
            "libnvidia-ml")
        return heap is OverflowVerdict.DRIVER or own

    @property
    def nvml_involved(self) -> bool:
        """The crashing thread faulted inside libnvidia-ml, or an NVML call was in progress on it."""
        return self.f.inside_nvml or "core.nvml_on_stack" in self.keys

    @property
    def runs_clean(self) -> bool:
        """Every reproducer run (none included) ran clean."""
        return all(r.status is Outcome.CLEAN for r in self.f.repro_runs)


def read_grounds(f: Facts, known: list[KnownMatch]) -> Grounds:
    """What the decision stands on (see :class:`Grounds`)."""
    return Grounds(f=f, known=tuple(known), items=tuple(_items(f, known)), versions=tuple(_versions(f)),
                   shadowed=tuple(_shadowed(f)), unsupported=tuple(_unsupported(f)))


# ---- the evidence, keyed ---------------------------------------------------------------------------------

def _run_fact(r: ReproRun) -> str:
    who = "the C reproducer (no Python, no nvidia-ml-py)" if r.name == "c" else "the Python reproducer (nvidia-ml-py)"
    return f"{who}: {r.outcome}"


def _core_items(f: Facts) -> list[Item]:
    a = f.analysis
    if a is None:
        return []
    core = a.snapshot.core
    items = [Item(key="core", source="analyze", fact=(
        f"the core of pid {core.pid}: {a.crash.summary}" if a.is_crash else
        f"the core of pid {core.pid} is a snapshot of the live process (no crash)"))]
    if f.inside_nvml:
        items.append(Item(key="core.inside_nvml", source="analyze",
                          fact=f"the crashing thread faulted inside libnvidia-ml ({f.api or 'an NVML call'})"))
    elif (a.fault_thread is not None and a.fault_thread.nvml_on_stack) or f.api:
        items.append(Item(key="core.nvml_on_stack", source="analyze",
                          fact=f"an NVML call ({f.api or '?'}) was in progress on the crashing thread"))
    if not a.snapshot.native_method.unwound:
        items.append(Item(key="core.no_native", source="analyze",
                          fact="the native stacks were not unwound (program counters only)"))
    frame = fault_frame(f)
    if frame:
        items.append(Item(key="core.frame", source="analyze", fact=f"the innermost frame past libc: {frame}"))
    return items


def _import_items(f: Facts) -> list[Item]:
    items = []
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
    return items


def _kill_items(f: Facts) -> list[Item]:
    k = f.kill
    if k is None:
        return []
    where = ", ".join(x for x in (f"pod {k.pod}" if k.pod else "", f"container {k.container}" if k.container else "",
                                  f"{k.pods} pods" if k.pods else "") if x)
    items = [Item(key="kill", source=k.source,
                  fact=k.words + (f" ({where})" if where else "") + (f"; sender {k.sender}" if k.sender else ""))]
    if k.memory_limit or k.memory_request or k.usage:
        items.append(Item(key="kill.memory", source="the pod's spec and status", fact="; ".join(x for x in (
            f"memory limit {k.memory_limit}" if k.memory_limit else "",
            f"memory request {k.memory_request}" if k.memory_request else "", k.usage or "") if x)))
    if k.probe is not None:
        items.append(Item(key="kill.probe", source="the pod's spec", fact=f"liveness probe: {k.probe_words}"))
    if k.messages:
        items.append(Item(key="kill.events", source="the pod's events", fact="; ".join(k.messages)))
    return items


def _items(f: Facts, known: list[KnownMatch]) -> list[Item]:
    items = _core_items(f) + _kill_items(f)
    for r in f.repro_runs:
        items.append(Item(key=f"repro.{r.name}", source="reproduce", fact=_run_fact(r)))
    if f.main_thread_run is not None:
        items.append(Item(key="repro.c.main", source="reproduce",
                          fact=f"the C reproducer, the same calls from the main thread: {f.main_thread_run.outcome}"))
    if f.heap is not None:
        items.append(Item(key="heap", source="analyze (the core's heap)",
                          fact=f"the core's heap: {f.heap.verdict.value}: {f.heap.verdict_reason}"))
    items += _import_items(f)
    for k in known:
        items.append(Item(key=f"known.{k.id}", source="known crashes", fact=f"{k.title}: {'; '.join(k.matched_on)}"))
    for line in f.frequency:
        items.append(Item(key="fleet", source="fleet / analyze-batch", fact=line))
    return items


def _past_libc(f: Facts):
    """The crashing thread's innermost native frame past libc's abort machinery (None: there is none)."""
    return next((fr for fr in f.native_frames if not (fr.library_name or "").startswith(_LIBC)), None)


def fault_frame(f: Facts) -> str | None:
    """The crashing thread's innermost frame past libc's abort machinery, as ``symbol (library)``."""
    fr = _past_libc(f)
    return f"{fr.symbol or '??'} ({fr.library_name or '?'})" if fr is not None else None


def fault_library(f: Facts) -> str | None:
    fr = _past_libc(f)
    return (fr.library_name or None) if fr is not None else None


def program_frame(f: Facts) -> str | None:
    """The innermost Python frame of the crashing thread that is the program's own (not nvidia-ml-py's)."""
    for p in f.py_frames:
        if not p.file.endswith(("pynvml.py", "libnvml.py")):
            return f"{p.function} ({p.file.rsplit('/', 1)[-1]}:{p.line if p.line is not None else '?'})"
    return None


# ---- versions that ran -----------------------------------------------------------------------------------

def _version_of(f: Facts, package: str, module: str) -> VersionFact | None:
    for rep in f.imports:
        m = next((m for m in rep.modules if m.module == module), None)
        if m is None:
            continue
        installed = (m.expected_distribution.version if m.expected_distribution else None) or (
            m.distribution.version if m.distribution else None) or m.expected_version
        source = ("the imported file " + m.resolved.file if m.resolved and m.resolved.file else "verify-imports")
        ran = m.effective_version
        if ran is None:
            ran = {"nvitop": f.nvitop, "nvitop-exporter": f.exporter, "nvidia-ml-py": f.binding}[package]
        return VersionFact(package=package, ran=ran, installed=installed, source=source) if ran or installed \
            else None
    ran = {"nvitop": f.nvitop, "nvitop-exporter": f.exporter, "nvidia-ml-py": f.binding}[package]
    return VersionFact(package=package, ran=ran, installed=None, source="pip's metadata") if ran else None


def _versions(f: Facts) -> list[VersionFact]:
    return [v for package, module in STACK_PACKAGES.items() if (v := _version_of(f, package, module)) is not None]


# ---- what is not as installed, not as declared -------------------------------------------------------------

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
