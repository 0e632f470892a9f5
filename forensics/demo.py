"""``forensics demo``: the incident, end to end, on a CPU-only machine.

The real nvitop-exporter of the incident's stack (nvitop 1.5.0 with nvidia-ml-py
12.575.51 installed over it) runs on 127.0.0.1 against the simulated 8-GPU H20
node (driver 580.126.09) with the heap fault on.  forensics raises its core limit,
scrapes /metrics until it dies, analyzes the core, runs both minimal reproducers
under the same fault, and writes the reports.  Each step prints a timeline line;
the paths of everything written are printed at the end.  Nothing earlier is
overwritten: each run writes a new directory unless ``--out`` names an empty one.
"""
from __future__ import annotations

import datetime as _dt
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from .errors import DemoError, ForensicsError

__all__ = ["DemoResult", "run_demo"]

HOSTNAME = "demo-node"  # what the exporter labels its metrics with (never a real address)




@dataclass
class DemoResult:
    out_dir: str
    timeline: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # what -> path
    signature: str | None = None
    fingerprint: str | None = None
    python_frames: list[str] = field(default_factory=list)
    reproduce_conclusion: str | None = None
    conclusion: str | None = None  # the reports' conclusion
    filings: list[str] = field(default_factory=list)  # which report to file where, in order
    ok: bool = False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _enable_cores(pid: int) -> str:
    """Raise the live process's RLIMIT_CORE to unlimited and read it back from /proc."""
    import resource

    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (OSError, ValueError) as e:
        raise DemoError("enable cores", f"prlimit({pid}, RLIMIT_CORE): {e}") from e
    with open(f"/proc/{pid}/limits") as f:
        line = next((ln for ln in f if ln.startswith("Max core file size")), "")
    return " ".join(line.split())


def _wait_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError("start exporter", f"nvitop-exporter exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise DemoError("start exporter", f"nothing listens on 127.0.0.1:{port} after {timeout:g}s")


def _new_dir(base: Path) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for i in range(1000):
        d = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise DemoError("prepare", f"cannot make a new directory under {base}")


@dataclass
class _Run:
    """One demo run: where it writes, its clock, and the result it fills step by step."""

    out_dir: Path
    work_dir: Path
    result: DemoResult
    log: Callable[[str], None]
    t0: float = field(default_factory=time.perf_counter)

    def step(self, text: str) -> None:
        line = f"[{time.perf_counter() - self.t0:6.1f}s] {text}"
        self.result.timeline.append(line)
        self.log(line)


@dataclass
class _Crashed:
    """What the crash step leaves: the exporter's interpreter and environment, its core, the evidence so far."""

    python: Path
    env: dict[str, str]
    core: Path
    bundle: str | None
    imports_file: str | None


def run_demo(*, out: str | None = None, work: str | None = None, fault_after: int = 120,
             timeout: float = 90.0, reproduce: bool = True, log: Callable[[str], None] = lambda s: None) -> DemoResult:
    """Run the demo incident; return what happened and where it was written.

    Its steps: the simulated node and the incident's stack; the exporter started, captured,
    verified and scraped until it crashes; the core analyzed; the reproducers run; the reports
    written.

    :param out: directory for the outputs (must be empty or absent); default a new
        timestamped directory under ``./forensics-demo``
    :param work: where the simulated NVML and scratch files go (default ``<out>/work``)
    :param fault_after: NVLink field-value calls that succeed before the heap corruption
    """
    run = _prepare(out, work, log)
    crashed = _crash_the_exporter(run, fault_after, timeout)
    evidence = _analyze(run, crashed)
    if reproduce:
        evidence.append(_reproduce(run, crashed))
    _write_reports(run, evidence)
    result = run.result
    nvlink = [f for f in result.python_frames if "nvlink" in f.lower()]
    result.ok = bool(nvlink)
    run.step("done: " + (f"nvitop's NVLink throughput query is on the crashing stack: {nvlink[0]}" if nvlink
                         else "the NVLink query is not on the crashing stack"))
    (run.out_dir / "timeline.txt").write_text("\n".join(result.timeline) + "\n")
    result.files["timeline"] = str(run.out_dir / "timeline.txt")
    return result


def _prepare(out: str | None, work: str | None, log: Callable[[str], None]) -> _Run:
    if out:
        out_dir = Path(out).resolve()
        if out_dir.exists() and any(out_dir.iterdir()):
            e = DemoError("prepare", f"{out_dir} is not empty (the demo never overwrites earlier output)")
            e.help_text = ("Give --out a new or empty directory, or leave --out out: each run then gets a new "
                           "directory under ./forensics-demo/.")
            raise e
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        out_dir = _new_dir(Path("forensics-demo").resolve())
    work_dir = Path(work).resolve() if work else out_dir / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    return _Run(out_dir=out_dir, work_dir=work_dir, result=DemoResult(out_dir=str(out_dir)), log=log)


def _crash_the_exporter(run: _Run, fault_after: int, timeout: float) -> _Crashed:
    """The simulated node and the incident's stack; nvitop-exporter started, captured, verified, scraped to its
    crash."""
    from .canary import Thresholds, canary_document, describe_returncode, run_canary
    from .simnvml import build_simnvml, ensure_stack_venv, sim_environment

    step, result, out_dir, work_dir = run.step, run.result, run.out_dir, run.work_dir
    step("build the simulated NVML: 8 x NVIDIA H20, driver 580.126.09, NVML 13.580.126, CUDA 13.0")
    lib_dir = build_simnvml(work_dir / "simnvml")
    step("get the incident's stack: nvitop 1.5.0 + nvitop-exporter 1.5.0, then nvidia-ml-py 12.575.51 over them")
    python = ensure_stack_venv("incident")
    env = sim_environment(lib_dir, fault="heap", fault_after=fault_after, heap_message="prev")
    run_dir = out_dir / "exporter"
    run_dir.mkdir()
    port = _free_port()
    cmd = [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port),
           "--interval", "0.5", "--hostname", HOSTNAME]
    step(f"start nvitop-exporter on 127.0.0.1:{port} with the heap fault after {fault_after} NVLink queries")
    with open(run_dir / "exporter.log", "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True)
    bundle = None
    try:
        _wait_port(port, proc, 30)
        try:
            from .capture.node import capture_pid

            # the node is simulated: this machine's kernel log is not its driver's (kernel_log=False)
            armed = capture_pid(proc.pid, core_dir=str(work_dir / "cores"), bundle_parent=str(out_dir / "capture"),
                                kernel_log=False)
            bundle = armed.bundle
            step(f"forensics capture --pid {proc.pid}: core limit {armed.rlimit_core_before[0]} -> "
                 f"{armed.rlimit_core_after[0]} (read back from /proc), evidence bundle written")
        except ForensicsError as e:  # not root: raise our own child's soft limit instead
            step(f"forensics capture --pid needs root ({e}); raising the child's core limit: {_enable_cores(proc.pid)}")
        imports_file = _verify_imports(proc.pid, out_dir, step)
        if imports_file:
            result.files["verify-imports (what the exporter imports)"] = imports_file
        canary = None
        if proc.poll() is None:
            step("scrape /metrics until the exporter dies (forensics canary, watching the pid)")
            try:
                canary = run_canary(f"http://127.0.0.1:{port}/metrics", requests=1_000_000, concurrency=4,
                                    duration=min(timeout, 60.0), pid=proc.pid, thresholds=Thresholds())
            except ForensicsError as e:  # it died as the soak started
                step(f"forensics canary: {e}")
            if canary is not None and canary.interrupted:  # Ctrl-C: the canary's summary is no end of the demo
                raise KeyboardInterrupt
        else:
            step("the exporter died before the scrape soak started (a loaded machine: raise --fault-after)")
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired as e:
            raise DemoError("wait for the crash", "the exporter did not die within the soak") from e
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if canary is not None:
        canary_file = out_dir / "canary.json"
        canary_file.write_text(canary_document(canary) + "\n")
        result.files["canary (scrapes until the crash)"] = str(canary_file)
        step(f"exporter died: {describe_returncode(rc)} after {canary.requests} scrapes ({canary.ok} answered); "
             f"canary verdict {canary.verdict}")
    else:
        step(f"exporter died: {describe_returncode(rc)}")
    core = next((p for p in sorted(run_dir.glob("core*")) if p.is_file()), None)
    if core is None:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
        raise DemoError("find the core", f"no core in {run_dir} (kernel.core_pattern is {pattern!r})")
    step(f"the kernel wrote {core} ({core.stat().st_size:,} bytes)")
    return _Crashed(python=python, env=env, core=core, bundle=bundle, imports_file=imports_file)


def _analyze(run: _Run, crashed: _Crashed) -> list[str]:
    """forensics analyze on the core: the text and the JSON written; the evidence for the reports so far."""
    from .analyze import analyze_core
    from .views.signature import signature
    from .format import analysis_payload
    from .text.analysis import format_analysis
    from .output import json_document, text_lines

    step, result, out_dir, core = run.step, run.result, run.out_dir, crashed.core
    analysis = analyze_core(str(core))
    result.signature, result.fingerprint = signature(analysis), analysis.fingerprint
    thread = analysis.snapshot.crashed_thread
    result.python_frames = [f"{p.function} ({Path(p.file).name}:{p.line})"
                            for p in (thread.py_frames if thread else ())]
    a_json = out_dir / "analysis.json"
    a_json.write_text(json_document("analyze", {"analysis": analysis_payload(analysis)}) + "\n")
    a_txt = out_dir / "analysis.txt"
    a_txt.write_text(text_lines(format_analysis(analysis, merged=True)))
    result.files["analysis (text, merged stacks)"] = str(a_txt)
    result.files["analysis (JSON)"] = str(a_json)
    step(f"forensics analyze: {result.signature}")

    evidence = [str(a_json)] + [x for x in (crashed.bundle, crashed.imports_file) if x]
    if crashed.bundle:
        result.files["capture bundle (before the crash)"] = crashed.bundle
    return evidence


def _reproduce(run: _Run, crashed: _Crashed) -> str:
    """forensics reproduce: both reproducers on the same node and fault; the path of their JSON."""
    from .output import json_document
    from .reproduce import reproduce_payload, run_reproducers

    step, result, out_dir, work_dir = run.step, run.result, run.out_dir, run.work_dir
    step("forensics reproduce: the Python and the C reproducer on the same node and fault")
    rep = run_reproducers(workdir=work_dir, python=str(crashed.python), nvml_dir=None, env=crashed.env,
                          iterations=200, threads=2, timeout=120)
    result.reproduce_conclusion = rep.conclusion
    r_json = out_dir / "reproduce.json"
    r_json.write_text(json_document("reproduce", reproduce_payload(rep)) + "\n")
    result.files["reproduce (both reproducers)"] = str(r_json)
    step("reproduce: " + "; ".join(f"{r.name} {r.outcome}" for r in rep.runs) + f" -> {rep.conclusion}")
    return str(r_json)


def _write_reports(run: _Run, evidence: list[str]) -> None:
    """forensics report: the NVIDIA report, the nvitop issue and the runbook, with their conclusion."""
    from . import __version__
    from .report import attachment_dir_for, make_report, write_report

    step, result, out_dir = run.step, run.result, run.out_dir
    conclusion = None
    for template in ("nvml", "nvitop", "runbook"):
        path = out_dir / f"report-{template}.md"
        rep_md = make_report(evidence, template=template, tool_version=__version__,
                             attachment_dir=attachment_dir_for(str(path)).name)
        write_report(rep_md, str(path))
        result.files[f"report ({template})"] = str(path)
        if rep_md.attachments:
            result.files[f"report ({template}) attachments"] = str(attachment_dir_for(str(path)))
        if rep_md.problems:
            step(f"forensics report --check --template {template}: " + "; ".join(rep_md.problems))
        conclusion = rep_md.context.conclusion
    if conclusion is not None:
        result.conclusion = conclusion.statement
        result.filings = [f"{x.order}. the {x.report.value} report -> {x.where.split(' (')[0].split(':')[0]}: "
                          f"{x.action}" for x in conclusion.filings]
        step("forensics report: " + conclusion.statement)
        for line in result.filings:
            step(f"  file {line}")
    step("forensics report: the NVIDIA report, the nvitop issue and the incident runbook written, with their "
         "attachments (secrets redacted; host names and local paths replaced in the two upstream reports)")


def _verify_imports(pid: int, out_dir: Path, step: Callable[[str], None]) -> str | None:
    """verify-imports --pid on the live exporter: which nvitop / nvidia-ml-py files it really imports."""
    from .imports.format import report_payload
    from .output import json_document
    from .imports.verify import VerifyOptions, verify_pid

    try:
        report = verify_pid(pid, VerifyOptions(driver="580.126.09"))
    except ForensicsError as e:
        step(f"forensics verify-imports --pid {pid}: {e}")
        return None
    path = out_dir / "verify-imports.json"
    path.write_text(json_document("verify-imports", {"result": report_payload(report)}) + "\n")
    # the stack's modules, and any other (a loaded extension module) that is not OK
    shown = [c for c in report.modules if c.role != "loaded" or c.fails]
    found = ", ".join(f"{c.module} {c.effective_version or '?'} ({c.verdict.value})" for c in shown)
    rest = len(report.modules) - len(shown)
    step(f"forensics verify-imports --pid {pid}: {found}" + (f"; {rest} loaded extension modules OK" if rest else ""))
    return str(path)
