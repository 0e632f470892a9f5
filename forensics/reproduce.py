"""``forensics reproduce``: run the Python and the C NVML reproducers under the same conditions.

Both run with core dumps on, in fresh run directories, against the same
``libnvidia-ml.so.1`` (the loader's, ``--nvml PATH``, or the simulated one).
Each run's outcome is read from its exit status, its ``VERDICT:`` line and,
when it crashed, the analysis of its core.  The conclusion says which crashed:
both -> the driver library; only the Python one -> the binding or the calling
pattern; neither -> no reproduction.
"""
from __future__ import annotations

import datetime as _dt
import os
import resource
import signal as _signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ForensicsError, InputNotFound

__all__ = ["ReproRun", "ReproduceResult", "parse_header", "conclude", "run_reproducers", "nvml_dir_for",
           "reproduce_payload"]

OUTPUT_LIMIT = 1 << 20  # bytes of a reproducer's stdout/stderr kept


@dataclass(frozen=True, slots=True, kw_only=True)
class ReproRun:
    name: str  # "python" or "c"
    command: tuple[str, ...]
    run_dir: str
    exit_code: int | None
    signal: str | None
    verdict: str | None
    crashed: bool
    core: str | None
    core_note: str | None  # where the core went when it is not in the run directory
    signature: str | None
    fingerprint: str | None
    environment: dict[str, str]
    seconds: float
    stderr_tail: str

    @property
    def outcome(self) -> str:
        if self.crashed:
            return f"crashed ({self.signal})"
        if self.verdict and not self.verdict.startswith("clean"):
            return f"detected: {self.verdict}"
        if self.exit_code == 0:
            return "clean"
        return f"failed (exit {self.exit_code})"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReproduceResult:
    runs: tuple[ReproRun, ...]
    conclusion: str
    environment: dict[str, str]  # the header of the first run that printed one
    nvml: str  # what was on LD_LIBRARY_PATH, or "the loader's default"
    sim: dict[str, str] = field(default_factory=dict)  # simulated-NVML settings, when --sim


def parse_header(stdout: str) -> dict[str, str]:
    """``key: value`` lines of a reproducer's environment header.

    >>> parse_header("x\\n  GPU:            8 x NVIDIA H20\\n  driver:  580.126.09\\nVERDICT: clean\\n")
    {'gpu': '8 x NVIDIA H20', 'driver': '580.126.09'}
    """
    out = {}
    for line in stdout.splitlines():
        if line.startswith("VERDICT: "):
            break
        if line.startswith("  ") and ":" in line:
            k, _, v = line.strip().partition(":")
            out[k.strip().lower()] = v.strip()
    return out


def _verdict(stdout: str) -> str | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("VERDICT: "):
            return line[len("VERDICT: "):].strip()
    return None


def conclude(python: ReproRun | None, c: ReproRun | None) -> str:
    """Which layer the evidence points at, from the two outcomes."""
    def bad(r: ReproRun | None) -> bool:
        return r is not None and (r.crashed or (r.verdict is not None and not r.verdict.startswith("clean")))

    if bad(python) and bad(c):
        return ("both reproducers failed, the C one without Python: suspect the driver library "
                "(libnvidia-ml.so) — report to NVIDIA with the C reproducer")
    if bad(python):
        return ("only the Python reproducer failed: the driver survives the same queries from C; suspect the "
                "binding (nvidia-ml-py) or the calling pattern (threads, shutdown) — report upstream with the "
                "Python reproducer, and note the C result")
    if bad(c):
        return "only the C reproducer failed: suspect the driver library; the Python run may need more iterations"
    return "neither reproducer failed: no reproduction under these conditions (try more iterations or threads)"


def nvml_dir_for(path: str, workdir: Path) -> str:
    """A directory to put first on LD_LIBRARY_PATH so that ``libnvidia-ml.so.1`` is ``path``."""
    p = Path(path)
    if not p.exists():
        raise InputNotFound(path)
    if p.is_dir():
        if not (p / "libnvidia-ml.so.1").exists():
            raise ForensicsError(f"{path}: no libnvidia-ml.so.1 in this directory")
        return str(p.resolve())
    link_dir = workdir / "nvml"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libnvidia-ml.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(p.resolve())
    return str(link_dir)


def _core_in(run_dir: Path, pid: int) -> str | None:
    for name in ("core", f"core.{pid}"):
        if (run_dir / name).is_file():
            return str(run_dir / name)
    cores = sorted(p for p in run_dir.glob("core*") if p.is_file())
    return str(cores[0]) if cores else None


def _core_note() -> str:
    try:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return "kernel.core_pattern unreadable"
    if pattern.startswith("|"):
        return f"kernel.core_pattern pipes cores to {pattern.split()[0][1:]}; look there"
    return f"no core in the run directory (kernel.core_pattern is {pattern!r})"


def _run_one(name: str, cmd: list[str], env: dict[str, str], run_dir: Path, timeout: float,
             analyze: bool) -> ReproRun:
    run_dir.mkdir(parents=True, exist_ok=False)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    t0 = time.perf_counter()
    with open(run_dir / "stdout.txt", "wb") as out, open(run_dir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=limits)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    seconds = time.perf_counter() - t0
    stdout = (run_dir / "stdout.txt").read_bytes()[:OUTPUT_LIMIT].decode(errors="replace")
    stderr = (run_dir / "stderr.txt").read_bytes()[-OUTPUT_LIMIT:].decode(errors="replace")
    crashed = rc < 0 and -rc in (_signal.SIGABRT, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL)
    sig = _signal.Signals(-rc).name if rc < 0 else None
    core = _core_in(run_dir, proc.pid) if crashed else None
    signature = fingerprint = None
    if core and analyze:
        from .analyze import analyze_core
        from .format import signature as _sig

        try:
            a = analyze_core(core)
            signature, fingerprint = _sig(a), a.fingerprint
        except ForensicsError as e:
            signature = f"core not analysed: {e}"
    return ReproRun(
        name=name, command=tuple(cmd), run_dir=str(run_dir), exit_code=rc if rc >= 0 else None, signal=sig,
        verdict=_verdict(stdout), crashed=crashed, core=core, core_note=None if core or not crashed else _core_note(),
        signature=signature, fingerprint=fingerprint, environment=parse_header(stdout), seconds=seconds,
        stderr_tail="\n".join(stderr.splitlines()[-20:]),
    )


def run_reproducers(*, workdir: Path, python: str, nvml_dir: str | None, env: dict[str, str] | None = None,
                    iterations: int = 1000, threads: int = 2, duration: float | None = None,
                    shutdown_race: bool = False, malloc_check: bool = False, timeout: float = 300.0,
                    which: tuple[str, ...] = ("python", "c"), analyze: bool = True,
                    sim: dict[str, str] | None = None) -> ReproduceResult:
    """Build the C reproducer and run both; never overwrite an earlier run (a new directory each time).

    :param python: the interpreter whose nvidia-ml-py the Python reproducer uses
    :param nvml_dir: put first on LD_LIBRARY_PATH (None: whatever the loader finds)
    :param env: the environment to run in (default: this one)
    """
    from .simnvml import build_c_reproducer, find_reproducers

    base_env = dict(os.environ if env is None else env)
    if nvml_dir:
        old = base_env.get("LD_LIBRARY_PATH")
        base_env["LD_LIBRARY_PATH"] = nvml_dir + (os.pathsep + old if old else "")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    runs_dir = workdir / f"reproduce-{stamp}"
    runs: dict[str, ReproRun] = {}
    if "python" in which:
        cmd = [python, str(find_reproducers() / "nvml_nvlink_fieldvalues.py"), "--iterations", str(iterations),
               "--threads", str(threads)]
        if duration:
            cmd += ["--duration", str(duration)]
        if shutdown_race:
            cmd.append("--shutdown-race")
        if malloc_check:
            cmd.append("--malloc-check")
        runs["python"] = _run_one("python", cmd, base_env, runs_dir / "python", timeout, analyze)
    if "c" in which:
        binary = build_c_reproducer(workdir / "bin")
        cmd = [str(binary), "--iterations", str(iterations)] + (["--duration", str(duration)] if duration else [])
        runs["c"] = _run_one("c", cmd, base_env, runs_dir / "c", timeout, analyze)
    header = next((r.environment for r in runs.values() if r.environment), {})
    return ReproduceResult(
        runs=tuple(runs.values()), conclusion=conclude(runs.get("python"), runs.get("c")), environment=header,
        nvml=nvml_dir or "the loader's default", sim=dict(sim or {}),
    )


def reproduce_payload(result: ReproduceResult) -> dict:
    """The body of ``forensics reproduce --json`` (what ``forensics report`` reads)."""
    h = result.environment
    return {
        "reproduce": result,
        "environment": {"gpus": h.get("gpu"), "driver": h.get("driver"), "cuda": h.get("cuda driver"),
                        "nvml": h.get("nvml"), "libnvidia_ml": h.get("libnvidia-ml"), "kernel": h.get("kernel"),
                        "python": h.get("python"), "binding": h.get("binding")},
        "runs": [{"name": r.name, "outcome": r.outcome, "signature": r.signature, "fingerprint": r.fingerprint,
                  "core": r.core, "verdict": r.verdict} for r in result.runs],
        "conclusion": result.conclusion,
    }
