"""Stage 3 of a report: the context one template renders, and its attachments.

Pure: :class:`~.facts.Facts`, the :class:`~.verdict.Conclusion` and the known-issue matches
in, :class:`ReportContext` out.  Templates only loop and branch over it; every value is
already redacted (and, for upstream templates, free of local paths and host names).  The
long evidence -- every thread's stacks, the reproducers' sources and output, nvidia-smi -q,
the driver's kernel log -- goes into :attr:`ReportContext.attachments`, written beside the
report, and the body names them.

The stages, each one function: :func:`~.facts.read_facts` (evidence -> facts),
:func:`~.verdict.decide` (facts -> conclusion), :func:`build_context` (-> what a template
shows).  #21's heap reading has its place here: :attr:`ReportContext.heap` ("what the core's
heap says"), filled from an analysis that carries a ``heap`` section, shown by the NVIDIA report.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..model import NativeFrame, PyFrame
from ..modes import ReportTemplate
from ..reproduce import Outcome, ReproRun
from .facts import Facts, Phase, xid_summary
from .form import IssueForm
from .known import KnownMatch
from .incident import IncidentClass
from .phrases import failure, process_name
from .titles import make_title
from .verdict import Conclusion

__all__ = ["UNKNOWN", "OPEN", "ReportContext", "build_context"]

UNKNOWN = "unknown (not in the evidence)"
OPEN = "OPEN: not determined yet"
NATIVE_SHOWN = 14


@dataclass
class ReportContext:
    """Everything a template may show; built by :func:`build_context`."""

    template: ReportTemplate
    title: str
    conclusion: Conclusion
    generated_at: str
    tool_version: str
    # the environment
    nvitop_version: str
    os: str
    os_image: str
    os_node: str
    driver: str
    nvml: str
    cuda: str
    glibc: str
    python: str
    kernel: str
    gpus: str
    gpu_lines: list[str]
    nvml_library: str
    image: str
    versions_prose: str
    smi_excerpt: str
    smi_captured: bool
    system_facts: list[tuple[str, str]]
    bug_report: str
    pyenv: dict[str, Any]
    # the crash
    signature: str
    crash_prose: str
    crash_rows: list[tuple[str, str]]
    process: str
    call: str
    native_top: list[str]
    native_more: int
    traceback: str
    stack_label: str
    logs: str
    glibc_message: str
    verdicts: list[str]  # the reproducers' VERDICT lines
    # reproduction
    snippets: list[str]  # nvitop's issue's Python snippets, each a fenced block
    commands: list[str]
    observed: list[str]
    rate: list[str]
    # the rest
    known_issues: list[KnownMatch]
    unsupported: list[str]
    frequency: list[str]
    ruled_out: list[str]
    workaround: list[str]
    steps: list[dict[str, Any]]  # the runbook's "do now" steps, in order: {"text", "command"}
    ask: str  # what this report asks of its owner ("" when it is not routed to them, or asks nothing)
    upgrade: list[str]  # the upgrades this report may ask for (never its own project's, in an upstream report)
    attachments: dict[str, str]
    attachment_dir: str
    footer: list[str]
    form: IssueForm | None
    nvidia_link: str
    runbook: dict[str, str]
    evidence: list[dict[str, str]]
    heap: dict[str, Any] | None = None  # what the core's heap says (#21); None: no heap reading in the evidence
    missing: list[str] = field(default_factory=list)
    # the capture bundles' files that do not match their MANIFEST.json ("RELPATH: changed"), said in every report
    manifest_mismatch: list[str] = field(default_factory=list)

    def value(self, name: str) -> Any:
        if hasattr(self, name):
            return getattr(self, name)
        return self.runbook.get(name)


def _v(x: Any) -> str:
    return str(x) if x not in (None, "") else UNKNOWN


# ---- stacks ------------------------------------------------------------------------------

_INTERPRETER = re.compile(r"libpython|/python\d|^python\d")


def _native_top(frames: tuple[NativeFrame, ...]) -> tuple[list[str], int]:
    """The frames down to the interpreter (the part that matters), and how many interpreter frames follow."""
    shown: list[str] = []
    for i, fr in enumerate(frames):
        if _INTERPRETER.search(fr.library_name or "") and shown:
            return shown, len(frames) - i
        shown.append(fr.describe(brief=True))
        if len(shown) >= NATIVE_SHOWN:
            return shown, len(frames) - i - 1
    return shown, 0


def _py_lines(py_frames: tuple[PyFrame, ...]) -> list[str]:
    return [f'  File "{fr.file}", line {fr.line if fr.line is not None else "?"}, in {fr.function}'
            for fr in reversed(py_frames)]


def _stacks_text(f: Facts) -> str:
    """Every thread's stacks as read from the core (the attachment): the first fault's thread first, its frames
    from before any signal handler ran."""
    out = [f"Stacks of every thread, read from the core file of pid {f.pid} ({f.process or '?'}).", ""]
    threads = [(f.thread_name, f.tid, f.native_frames, f.py_frames, True)] + [
        (t.name, t.tid, t.native_frames, t.py_frames, False) for t in f.other_threads]
    for name, tid, native, py, crashed in threads:
        out.append(f"Thread {name or 'unnamed'} (tid {tid})" + ("  [crashed]" if crashed else ""))
        if native:
            out.append("  native stack (innermost first):")
            out += ["    " + fr.describe(brief=True) for fr in native]
        if py:
            out.append("  Python stack (most recent call last):")
            out += ["  " + x for x in _py_lines(py)]
        out.append("")
    return "\n".join(out)


# ---- reproduction ------------------------------------------------------------------------

def _cmd(argv: list[str], name: str) -> str:
    """A reproducer's command line as someone else runs it (the script or binary by its file name)."""
    if not argv:
        return ""
    if name == "python":
        rest = [a for a in argv[2:]]
        return " ".join(["python3", "nvml_nvlink_fieldvalues.py", *rest])
    return " ".join(["./nvml_nvlink_fieldvalues", *argv[1:]])


def _who(r: ReproRun, long: bool = False, main: bool = False) -> str:
    """The reproducer in words; ``main``: the C reproducer's same calls from the main thread."""
    if main:
        return ("C reproducer (no Python), the same calls from the main thread" if long else
                "C reproducer from the main thread")
    if long:
        return "Python reproducer (nvidia-ml-py)" if r.name == "python" else "C reproducer (no Python)"
    return "Python reproducer" if r.name == "python" else "C reproducer"


def _all_runs(f: Facts) -> list[tuple[ReproRun, bool]]:
    """The reproducers' runs, each with whether it is the C reproducer's same calls from the main thread (run
    after its calls from worker threads crashed)."""
    runs = [(r, False) for r in f.repro_runs]
    return runs + ([(f.main_thread_run, True)] if f.main_thread_run is not None else [])


def _repro_output(f: Facts) -> str:
    out = []
    for r, main in _all_runs(f):
        out.append(f"== {_who(r, long=True, main=main)}")
        out.append(f"$ {_cmd(list(r.command), r.name)}")
        for k, v in r.environment.items():
            out.append(f"  {k}: {v}")
        if r.verdict:
            out.append(f"VERDICT: {r.verdict}")
        if r.stderr_tail:
            out.append("stderr (last lines):")
            out += ["  " + x for x in r.stderr_tail.splitlines()[-10:]]
        out.append(f"outcome: {r.outcome} after {r.seconds:.2f} s" + (f"; core: {r.signature}" if r.signature else ""))
        out.append("")
    return "\n".join(out)


def _observed(f: Facts) -> list[str]:
    out = []
    for r, main in _all_runs(f):
        line = f"{_who(r, main=main)}: {r.outcome}"
        if r.status is Outcome.CRASHED and (r.verdict or "").startswith("crashed: "):
            line = f"{_who(r, main=main)}: crashed: {(r.verdict or '').removeprefix('crashed: ')}"
        out.append(line)
    return out


def _rate(f: Facts) -> list[str]:
    out = []
    for r, main in _all_runs(f):
        who = _who(r, main=main)
        if not r.failed:
            if r.status is Outcome.CLEAN:
                out.append(f"{who}: no crash in its run ({r.verdict or 'clean'})")
            continue
        if r.calls_to_crash:
            t = r.seconds_to_crash
            out.append(f"{who}: crashed in field-value call #{r.calls_to_crash} (1 crash in {r.calls_to_crash} "
                       f"calls)" + (f", {t * 1000:.2f} ms after its first query" if t is not None else "")
                       + f"; {r.seconds:.2f} s from its start")
        else:
            out.append(f"{who}: crashed {r.seconds:.2f} s after it started (process start included), in 1 of 1 runs")
    out += list(f.frequency)
    return out


_NVLINK_CALL = "device.nvlink_throughput()  # nvmlDeviceGetFieldValues(handle, [(138, link), ..., (139, link), ...])"


def _nvlink_main_snippet(head: str) -> str:
    """nvitop's NVLink throughput of every GPU, from the main thread, in a loop."""
    return (f"# {head}\n"
            "import time\n"
            "from nvitop import Device\n\n"
            "devices = Device.all()\n"
            "while True:\n"
            "    for device in devices:\n"
            f"        {_NVLINK_CALL}\n"
            "    time.sleep(0.5)\n")


def _nvlink_worker_snippet() -> str:
    """The same calls from worker threads, as a collector's ThreadPoolExecutor makes them."""
    return ("# what crashed: nvitop's NVLink throughput of every GPU, queried from worker threads\n"
            "# (a ThreadPoolExecutor: the crashing thread was not the main one)\n"
            "import time\n"
            "from concurrent.futures import ThreadPoolExecutor\n\n"
            "from nvitop import Device\n\n\n"
            "def query(device):\n"
            f"    return {_NVLINK_CALL}\n\n\n"
            "devices = Device.all()\n"
            "with ThreadPoolExecutor(max_workers=len(devices)) as pool:\n"
            "    while True:\n"
            "        list(pool.map(query, devices))\n"
            "        time.sleep(0.5)\n")


def _snippets(f: Facts) -> list[str]:
    """The Python snippets of nvitop's issue, built from the evidence: the calls that crashed, made from the kind of
    thread that crashed (an executor's worker threads when the crashing thread was not the main one; then the same
    calls from the main thread too, saying whether they crash)."""
    if f.query and f.query.what == "NVLink throughput":
        if f.is_main_thread is False:
            main = ("the same calls from the main thread: they run clean (the fault fires only in calls from other "
                    "threads)" if f.thread_only else "the same calls from the main thread")
            return [_nvlink_worker_snippet(), _nvlink_main_snippet(main)]
        return [_nvlink_main_snippet("what nvitop-exporter does on each scrape: nvitop's NVLink throughput of every "
                                     "GPU")]
    if f.caller or f.api:
        return [f"# the call on the crashing stack: {f.caller or '?'} -> {f.api or '?'}\n"
                "# (no minimal snippet known for it; the reproducer commands below run what crashed)\n"]
    return [""]


# ---- the NVIDIA facts ----------------------------------------------------------------------

def _gpu_rows(f: Facts) -> list[tuple[str, str]]:
    """The GPUs' rows: bus ids and each value nvidia-smi -q gives (VBIOS, persistence and MIG mode, Fabric
    Manager), else the bus ids the reproducers read, else the GPUs in words."""
    gpus = f.smi.gpus
    if gpus:
        rows = [("PCI bus ids", ", ".join(g.bus_id for g in gpus))]
        for key, label in (("vbios_version", "VBIOS"), ("persistence_mode", "Persistence mode"),
                           ("mig_mode", "MIG mode"), ("fabric_state", "Fabric Manager state")):
            vals = sorted({v for g in gpus if (v := getattr(g, key))})
            rows.append((label, ", ".join(vals) if vals else "not in nvidia-smi -q"))
        return rows
    if f.gpu_lines:
        return [("PCI bus ids", ", ".join(g.rsplit("PCI bus ", 1)[-1] for g in f.gpu_lines)),
                ("VBIOS, persistence / MIG mode, Fabric Manager", "not captured (no nvidia-smi -q output)")]
    return [("GPUs", _v(f.gpus))]


def _xid_row(f: Facts) -> tuple[str, str]:
    """The Xids of the driver's kernel log lines, per GPU (the GPUs of the evidence said apart)."""
    if f.kernel_log is None and not f.bug_report_text:
        return ("Xid summary", "kernel log not captured")
    bus_ids = tuple(g.bus_id for g in f.smi.gpus if g.bus_id) or tuple(
        g.rsplit("PCI bus ", 1)[-1] for g in f.gpu_lines if "PCI bus " in g)
    xids = xid_summary((f.kernel_log or "") + "\n" + (f.bug_report_text or ""), bus_ids)
    return ("Xid summary", "; ".join(xids) if xids else "no Xid in the driver's kernel log lines")


def _system_facts(f: Facts) -> list[tuple[str, str]]:
    rows = [("Distribution", _os_line(f).split(", kernel")[0]), ("Kernel", _v(f.kernel))] + _gpu_rows(f)
    links = next((r.header.nvlinks for r in f.repro_runs if r.header.nvlinks), None)
    rows.append(("NVLink", f"{links}, as the reproducers read it" if links else "not in the evidence"))
    rows.append(_xid_row(f))
    return rows


def _or(value: str | None, absent: str) -> str:
    """``value``, or ``absent`` when nvidia-smi -q has no such line (an empty value stays empty)."""
    return absent if value is None else value


def _smi_excerpt(f: Facts) -> str:
    smi = f.smi
    if not smi.gpus and not smi.driver_version:
        return ""
    lines = [f"Driver Version: {_or(smi.driver_version, '?')}    CUDA Version: {_or(smi.cuda_version, '?')}"]
    for g in smi.gpus:
        lines.append(f"{g.bus_id}  {_or(g.product_name, '?')}  persistence {_or(g.persistence_mode, '?')}"
                     f"  MIG {_or(g.mig_mode, 'n/a')}  VBIOS {_or(g.vbios_version, '?')}")
    return "\n".join(lines)


# ---- the context -------------------------------------------------------------------------

def _os_line(f: Facts) -> str:
    """The OS as the form asks for it: the container image's distribution and the node's, with the kernel."""
    if not (f.os_image or f.os_node):
        return UNKNOWN
    kernel = f", kernel {f.kernel}" if f.kernel else ""
    if f.in_container is False:
        return f"{f.os_node or f.os_image} (on the node itself, no container){kernel}"
    if f.in_container is None:  # the capture did not say: no "in the container" it cannot back
        return f"{f.os_image or UNKNOWN} (the process's root); node: {f.os_node or UNKNOWN}{kernel}"
    return f"{f.os_image or UNKNOWN} in the container; node: {f.os_node or UNKNOWN}{kernel}"


def _pyenv(f: Facts) -> dict[str, Any]:
    freeze = sorted(f"{n}=={v}" for n, v in f.distributions
                    if any(w in f"{n}=={v}".lower() for w in ("nvi", "cuda", "nvml", "gpu")))
    libs = ", ".join(x for x in (f"nvitop {f.nvitop}" if f.nvitop else "",
                                 f"nvitop-exporter {f.exporter}" if f.exporter else "",
                                 f"nvidia-ml-py {f.binding}" if f.binding else "") if x)
    venv = any("virtual environment" in n for n in f.environment_notes)
    return {
        "install": (f"{f.installer or 'unknown installer'}" + (", in a virtual environment" if venv else "")
                    if f.installer or venv else UNKNOWN),
        "python": _v(f.python),
        "libraries": libs or UNKNOWN,
        "pip_check": list(f.requirement_problems),
        "oneliner": ("\n".join([f"{f.python or '?'} linux"] + freeze) if freeze else ""),
    }


def _ruled_out(f: Facts) -> list[str]:
    out = []
    if f.imports_checked and not f.shadowing:
        out.append("Old source shadowing the installed packages: ruled out (every module imports the installed "
                   "distribution's files)")
    elif f.shadowing:
        out.append("Old source shadowing the installed packages: FOUND: " + "; ".join(f.shadowing))
    if f.nvml_origin:
        out.append(f"Which libnvidia-ml.so: the mapped library comes from the {f.nvml_origin}")
    return out


def build_context(f: Facts, template: ReportTemplate, conclusion: Conclusion, known: list[KnownMatch], *,
                  tool_version: str, footer: list[str], evidence: list[dict[str, str]],
                  reproducer_sources: dict[str, str], form: IssueForm | None = None, nvidia_link: str = "",
                  heap: dict | None = None, now: _dt.datetime | None = None, attachment_dir: str = "") -> ReportContext:
    """The context of ``template`` from the facts and the conclusion: the environment, the crash, the
    reproduction, the runbook's fields, each made by its own function."""
    d = conclusion.decision
    workaround = [s.text + (f": `{s.command}`" if s.command else "") for s in d.steps]
    ctx = ReportContext(
        template=template, title=make_title(template, f, conclusion, form), conclusion=conclusion,
        generated_at=(now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        tool_version=tool_version, **_environment_fields(f), **_crash_fields(f),
        snippets=_snippets(f), commands=_commands(f), observed=_observed(f), rate=_rate(f),
        known_issues=known, unsupported=list(conclusion.unsupported), frequency=list(f.frequency),
        ruled_out=_ruled_out(f), workaround=workaround,
        steps=[{"text": st.text, "command": st.command} for st in d.steps],
        ask=next((r.ask for r in d.routes if r.report is template), ""),
        upgrade=[u for u in conclusion.upgrade if not (template is ReportTemplate.NVITOP and "nvitop" in u.lower())],
        attachments=_attachments(f, template, reproducer_sources), attachment_dir=attachment_dir,
        footer=footer, form=form, nvidia_link=nvidia_link, runbook=_runbook_fields(f, conclusion, evidence, workaround),
        evidence=evidence, heap=heap,
    )
    ctx.missing = [name for name in template.required if _is_unknown(ctx.value(name))]
    return ctx


def _environment_fields(f: Facts) -> dict[str, Any]:
    """What ran where: the versions, the OS, the GPUs, libnvidia-ml, nvidia-smi, NVIDIA's bug report."""
    versions_prose = (
        f"NVIDIA driver {_v(f.driver)} with NVML {_v(f.nvml)} and CUDA {_v(f.cuda)}; the process mapped "
        f"{_v((f.nvml_library or '').rsplit('/', 1)[-1] or None)}"
        + (f" (build-id {f.nvml_build_id})" if f.nvml_build_id else "")
        + f". glibc {_v(f.glibc)}, Python {_v(f.python)}, nvidia-ml-py {_v(f.binding)}; "
        f"OS: {_os_line(f)}."
    )
    smi_excerpt = _smi_excerpt(f)
    return {
        "nvitop_version": ((f"{f.nvitop}" + (f" (nvitop-exporter {f.exporter})" if f.exporter else ""))
                           if f.nvitop else UNKNOWN),
        "os": _os_line(f), "os_image": _v(f.os_image), "os_node": _v(f.os_node), "driver": _v(f.driver),
        "nvml": _v(f.nvml), "cuda": _v(f.cuda), "glibc": _v(f.glibc), "python": _v(f.python),
        "kernel": _v(f.kernel), "gpus": _v(f.gpus), "gpu_lines": list(f.gpu_lines),
        "nvml_library": (f"{f.nvml_library}" + (f" (build-id {f.nvml_build_id})" if f.nvml_build_id else "")
                         if f.nvml_library else UNKNOWN),
        "image": _v(f.image), "versions_prose": versions_prose, "smi_excerpt": smi_excerpt,
        "smi_captured": bool(smi_excerpt), "system_facts": _system_facts(f), "bug_report": _bug_report_line(f),
        "pyenv": _pyenv(f),
    }


def _bug_report_line(f: Facts) -> str:
    """Whether NVIDIA's bug report was captured (and redacted), or how to make one."""
    if f.bug_report_file:
        masked = "secrets masked by structure" in (f.bug_report or "")  # a capture before the masking: none
        return (f"captured: {os.path.basename(f.bug_report_file)} is in the capture bundle "
                + ("(NVIDIA's own file, its secrets masked at capture, host names and addresses not: review it, "
                   "then attach it)" if masked else "(NVIDIA's own file, not redacted: review it, then attach it)"))
    if f.bug_report:
        return f"not captured: {f.bug_report.strip()}"
    return "not captured: run `sudo nvidia-bug-report.sh` on the node and attach nvidia-bug-report.log.gz"


def _thread_words(f: Facts) -> str:
    return f"{f.thread_name or 'unnamed'} (tid {f.tid})" if f.tid is not None else UNKNOWN


def _crash_prose(f: Facts) -> str:
    """The crash in one or two sentences: who, how, in which thread and call, at which phase (a kill: who was
    killed, how)."""
    if not f.has_crash and f.kill is not None:
        k = f.kill
        who = (f"container {k.container} of pod {k.pod}" if k.container else f"pod {k.pod}") if k.pod else \
            f"{process_name(f)}" + (f" (pid {f.pid})" if f.pid is not None else "")
        return f"{who} did not crash: it was {k.words}."
    if not f.has_crash:
        return (f"{process_name(f)} (pid {f.pid}) did not crash: the core is a snapshot of the live process "
                f"({f.signal or 'no signal'}, as gdb's gcore leaves it)." if f.kind == "snapshot" else UNKNOWN)
    return (f"{process_name(f)} (pid {f.pid}) " + failure(f)
            + (f" in thread {_thread_words(f)}" if f.tid is not None else "")
            + (f", in {f.api}" if f.api else "") + (" inside libnvidia-ml" if f.inside_nvml else "")
            + (f", called from {f.caller}" if f.caller else "")
            + (" while the interpreter was exiting" if f.phase is Phase.EXIT else "") + "."
            + (f" Exit {f.exit_explanation.removeprefix('exit ')}." if f.nested and f.exit_explanation else ""))


def _crash_fields(f: Facts) -> dict[str, Any]:
    """The crash: its prose, its table, the native stack's top, the Python stack read from the core, the call,
    the reproducers' verdicts."""
    native_top, native_more = _native_top(f.native_frames)
    thread = _thread_words(f)
    ended = ("the process was aborted" if f.signal == "SIGABRT"
             else "the process was killed by " + (f.signal or "a signal"))
    stack_label = (f"Python stack of thread {thread}, read from the core file: CPython printed no traceback "
                   f"({ended}). Most recent call last:")
    crash_rows = [("Signal", _v(f.signal)), ("glibc message", f.abort_message or "none"),
                  ("Fault address", f.fault or "none"), ("Crashing thread", thread),
                  ("Failing call", _v(f.api)), ("Inside libnvidia-ml", "yes" if f.inside_nvml else "no")]
    if f.exit_status is not None:
        crash_rows.append(("Exit status",
                           f.exit_explanation if f.nested and f.exit_explanation else str(f.exit_status)))
    return {
        "signature": _v(f.signature), "crash_prose": _crash_prose(f), "crash_rows": crash_rows,
        "process": _v(f.process), "call": f.query.detail if f.query else UNKNOWN,
        "native_top": native_top or [UNKNOWN], "native_more": native_more,
        "traceback": "\n".join([stack_label] + _py_lines(f.py_frames)) if f.py_frames else UNKNOWN,
        "stack_label": stack_label, "logs": "\n".join(native_top), "glibc_message": f.abort_message or "",
        "verdicts": [f"{_who(r)}: VERDICT: {r.verdict}" if r.verdict else f"{_who(r)}: {r.outcome}"
                     for r in f.repro_runs],
    }


def _recurrence(f: Facts) -> str:
    """What counts as the incident happening again: a new core of its fingerprint; for a kill, a new one of its
    container (kube-state-metrics' series of it)."""
    k = f.kill
    if f.fingerprint or k is None:
        return "any new core with fingerprint " + (f.fingerprint or "?")
    container = f'container="{k.container}"' if k.container else ""
    if k.kind.value == "oom-killed":
        return ("any new OOM kill of the container: kube_pod_container_status_last_terminated_reason"
                f'{{reason="OOMKilled"{", " + container if container else ""}}} == 1')
    return ("any new restart of the container: increase(kube_pod_container_status_restarts_total"
            f"{{{container}}}[1h]) > 0")


def _runbook_fields(f: Facts, conclusion: Conclusion, evidence: list[dict[str, str]],
                    workaround: list[str]) -> dict[str, str]:
    """The incident record's fields; those the evidence cannot fill stay visibly OPEN."""
    d = conclusion.decision
    return {
        "signature": _v(f.signature or (f"kill: {f.kill.words}" if f.kill else None)),
        "first_seen": _v(f.first_seen),
        "affected": "; ".join(list(f.affected) + list(f.frequency)) or UNKNOWN,
        "versions": "; ".join(x for x in (
            f"driver {_v(f.driver)}, NVML {_v(f.nvml)}, CUDA {_v(f.cuda)}, GPUs {_v(f.gpus)}",
            ", ".join(v.phrase for v in d.versions), f"Python {_v(f.python)}, glibc {_v(f.glibc)}") if x),
        "reproduction": "; ".join(_observed(f)) or OPEN,
        "diagnostics": "; ".join(sorted({f"forensics {e['kind']}" for e in evidence})) or OPEN,
        "mitigation": workaround[0] if workaround else OPEN,
        "recovery": OPEN + " (verify with forensics canary after the mitigation)",
        "conclusion": (conclusion.statement if conclusion.incident is not IncidentClass.UNDETERMINED
                       else OPEN + ": " + conclusion.statement),
        "where_to_file": "; ".join(f"{x.order}. {x.report.value} report -> {x.where}: {x.action}"
                                   for x in conclusion.filings),
        "recurrence": OPEN + f" (suggested: {_recurrence(f)})",
    }


def _commands(f: Facts) -> list[str]:
    """The commands that reproduce it, each runnable as printed beside the attachments: the binding the Python
    reproducer needs, the reproducers as they ran.  (The crashed process's command line is evidence, shown on its
    own: its paths are the node's, and replaced in an upstream report.)"""
    commands: list[str] = []
    if f.binding:  # the Python reproducer needs only the binding (nvitop may declare another range)
        commands.append(f"pip install nvidia-ml-py=={f.binding}   # for the Python reproducer")
    for r, main in _all_runs(f):
        line = _cmd(list(r.command), r.name)
        if r.name == "c" and line and not main:
            commands.append("gcc -O1 -g -o nvml_nvlink_fieldvalues nvml_nvlink_fieldvalues.c -ldl")
        if line:
            commands.append(line + f"   # {r.outcome}")
    return commands


def _attachments(f: Facts, template: ReportTemplate, reproducer_sources: dict[str, str]) -> dict[str, str]:
    """The files attached to the report: the reproducers, stacks and NVIDIA's evidence upstream; the stacks for
    the runbook."""
    attachments: dict[str, str] = {}
    src_names = {"python": "nvml_nvlink_fieldvalues.py", "c": "nvml_nvlink_fieldvalues.c"}
    if template.upstream:
        for lang in ("python", "c"):
            if reproducer_sources.get(lang):
                attachments[src_names[lang]] = reproducer_sources[lang]
        if f.has_crash:
            attachments["crash-stacks.txt"] = _stacks_text(f)
        if f.repro_runs:
            attachments["reproducer-output.txt"] = _repro_output(f)
        if f.nvidia_smi:
            attachments["nvidia-smi-q.txt"] = f.nvidia_smi
        if template in (ReportTemplate.NVML, ReportTemplate.BINDING) and f.kernel_log and f.kernel_log.strip():
            attachments["kernel-nvidia.log"] = f.kernel_log
    elif f.has_crash:  # the runbook: every thread's stacks, with the team's paths
        attachments["crash-stacks.txt"] = _stacks_text(f)
    return attachments

def _is_unknown(v: Any) -> bool:
    if isinstance(v, list):
        return not v or v == [UNKNOWN]
    if isinstance(v, dict):
        return not any(v.values())
    return v in (None, "", UNKNOWN)
