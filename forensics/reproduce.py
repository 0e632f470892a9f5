"""``forensics reproduce``: run the Python and the C NVML reproducers under the same conditions.

Both run with core dumps on, in fresh run directories, against the same
``libnvidia-ml.so.1`` (the loader's, ``--nvml PATH``, or the simulated one).
Each run's :class:`Outcome` is read from its exit status and its ``VERDICT:`` line
(the C reproducer prints one even when it crashes: the call in progress, the GPU,
the time to crash and the crash rate) and, when it crashed, the analysis of its core.
The conclusion says which crashed: both -> the driver library; only the Python one ->
the binding or the calling pattern; neither -> no reproduction.  When the C reproducer's calls from worker threads
crashed, it runs once more with the same calls from the main thread (``--threads 0``): where the fault fires
(:attr:`ReproduceResult.main_thread`, :attr:`ReproduceResult.thread_only`).  A reproducer that
could not start (no libnvidia-ml.so.1 to load, NVML initialization failed, no
NVLinks) is not a crash and supports no conclusion: :class:`ReproducerNotStarted`.
"""
from __future__ import annotations

import datetime as _dt
import enum
import os
import re
import resource
import signal as _signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ForensicsError, NvmlLibraryNotFound

__all__ = ["Outcome", "ReproRun", "ReproduceResult", "ReproHeader", "load_reproduce", "gpu_lines_of",
           "parse_header", "parse_crash_verdict", "conclude",
           "run_reproducers", "nvml_dir_for", "reproduce_payload"]

OUTPUT_LIMIT = 1 << 20  # bytes of a reproducer's stdout kept from its start (the header) and from its end
_FATAL = (_signal.SIGABRT, _signal.SIGSEGV, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL)


class Outcome(enum.Enum):
    CLEAN = "clean"
    CRASHED = "crashed"
    DETECTED = "heap corruption detected"  # --malloc-check stopped it at the culprit call
    ERRORS = "NVML errors"  # ran to the end; some calls or fields returned an error
    NOT_STARTED = "could not start"  # library not loadable, NVML init failed, nothing to query
    FAILED = "failed"  # any other exit (a timeout, an unexpected status)




#: a header line's key (lowercased, as :func:`parse_header` keeps it) -> ReproHeader's field
_HEADER_FIELDS = {"gpu": "gpu", "driver": "driver", "cuda driver": "cuda_driver", "nvml": "nvml",
                  "libnvidia-ml": "libnvidia_ml", "kernel": "kernel", "python": "python", "binding": "binding",
                  "glibc": "glibc", "call": "call", "nvlinks": "nvlinks", "nvidia_smi": "nvidia_smi"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReproHeader:
    """The facts of a reproducer's environment header that are read by name (None: the header has no such line);
    the header itself stays the record's ``environment`` (every line of it, printed as it is)."""

    gpu: str | None = None  # "8 x NVIDIA H20"
    driver: str | None = None
    cuda_driver: str | None = None
    nvml: str | None = None  # NVML's version
    libnvidia_ml: str | None = None  # the library's path
    kernel: str | None = None
    python: str | None = None
    binding: str | None = None  # "nvidia-ml-py 12.575.51 (PATH)"
    glibc: str | None = None  # "glibc 2.36"
    call: str | None = None  # the NVML call the reproducer makes, as it words it
    nvlinks: str | None = None  # "18 on each GPU"
    nvidia_smi: str | None = None

    @classmethod
    def of(cls, environment: dict[str, str]) -> ReproHeader:
        return cls(**{field: environment[key] for key, field in _HEADER_FIELDS.items() if key in environment})


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
    seconds: float  # from the process's start to its end
    stderr_tail: str
    calls_to_crash: int | None = None  # the field-value call in progress (the C reproducer's crash verdict)
    seconds_to_crash: float | None = None  # from the first query to the crash (the C reproducer's crash verdict)

    @property
    def status(self) -> Outcome:
        v = self.verdict or ""
        if v.startswith("heap corruption detected"):
            return Outcome.DETECTED
        if self.crashed:
            return Outcome.CRASHED
        if v.startswith("error: could not start"):
            return Outcome.NOT_STARTED
        if v.startswith("clean") and self.exit_code == 0:
            return Outcome.CLEAN
        if v.startswith("errors"):
            return Outcome.ERRORS
        return Outcome.FAILED

    @property
    def outcome(self) -> str:
        """One phrase: ``crashed (SIGABRT)``, ``heap corruption detected at ...``, ``could not start: ...``."""
        s = self.status
        if s is Outcome.CRASHED:
            return f"crashed ({self.signal})"
        if s is Outcome.DETECTED:
            return self.verdict or s.value
        if s is Outcome.NOT_STARTED:
            return (self.verdict or "").removeprefix("error: ")
        if s is Outcome.CLEAN:
            return "clean"
        if s is Outcome.ERRORS:
            return f"ran, with NVML errors: {self.verdict}"
        return f"failed (exit {self.exit_code})" + (f": {self.verdict}" if self.verdict else "")

    @property
    def header(self) -> ReproHeader:
        return ReproHeader.of(self.environment)

    @property
    def failed(self) -> bool:
        """Crashed or detected heap corruption: evidence of a fault."""
        return self.status in (Outcome.CRASHED, Outcome.DETECTED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReproduceResult:
    runs: tuple[ReproRun, ...]
    conclusion: str
    environment: dict[str, str]  # the header of the first run that printed one
    nvml: str  # what was on LD_LIBRARY_PATH, or "the loader's default"
    sim: dict[str, str] = field(default_factory=dict)  # simulated-NVML settings, when --sim
    # the C reproducer's same calls from the main thread, run when its calls from worker threads crashed: where the
    # fault fires (None: not run)
    main_thread: ReproRun | None = None

    @property
    def thread_only(self) -> bool | None:
        """True: the fault fires only in calls from threads other than the main one (the C reproducer crashed from
        its worker threads and ran clean from the main thread, the same calls); False: from the main thread too;
        None: not learned."""
        c = next((r for r in self.runs if r.name == "c"), None)
        if c is None or self.main_thread is None or not c.failed:
            return None
        if self.main_thread.status is Outcome.CLEAN:
            return True
        return False if self.main_thread.failed else None

    @property
    def header(self) -> ReproHeader:
        """The header's named facts (of the first run that printed one)."""
        return ReproHeader.of(self.environment)

    @property
    def not_started(self) -> list[ReproRun]:
        return [r for r in self.runs if r.status is Outcome.NOT_STARTED]


def parse_header(stdout: str) -> dict[str, str]:
    """``key: value`` lines of a reproducer's environment header (indented by exactly two spaces).

    >>> parse_header("x\\n  GPU:            8 x NVIDIA H20\\n    GPU 0: 18 NVLinks\\n"
    ...              "  driver:  580.126.09\\nVERDICT: clean\\n")
    {'gpu': '8 x NVIDIA H20', 'driver': '580.126.09'}
    """
    out = {}
    for line in stdout.splitlines():
        if line.startswith("VERDICT: "):
            break
        if line.startswith("  ") and not line.startswith("   ") and ":" in line:
            k, _, v = line.strip().partition(":")
            out[k.strip().lower()] = v.strip()
    return out


_CRASH_CALL = re.compile(r"call #(\d+)")
_CRASH_TIME = re.compile(r"time to crash (\d+(?:\.\d+)?) s")


def parse_crash_verdict(verdict: str | None) -> tuple[int | None, float | None]:
    """(call number, seconds since the first query) from the C reproducer's crash verdict.

    >>> parse_crash_verdict("crashed: SIGABRT inside call #41 (...) on GPU 1 (...); time to crash 0.021 s after "
    ...                     "the first query; crash rate 1 in 41 calls")
    (41, 0.021)
    """
    if not verdict or not verdict.startswith(("crashed", "heap corruption detected")):
        return None, None
    call, when = _CRASH_CALL.search(verdict), _CRASH_TIME.search(verdict)
    return (int(call.group(1)) if call else None), (float(when.group(1)) if when else None)


def _verdict(stdout: str) -> str | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("VERDICT: "):
            return line[len("VERDICT: "):].strip()
    return None


def conclude(python: ReproRun | None, c: ReproRun | None) -> str:
    """Which layer the evidence points at, from the two outcomes.

    A run that could not start makes no claim: the conclusion says so instead of blaming anything.
    """
    idle = [r for r in (python, c) if r is not None and r.status is Outcome.NOT_STARTED]
    if idle:
        return "no conclusion: " + "; ".join(f"the {_label(r)} reproducer {r.outcome}" for r in idle)
    py_bad, c_bad = bool(python and python.failed), bool(c and c.failed)
    if py_bad and c_bad:
        return ("both reproducers failed, the C one without Python: suspect the driver library "
                "(libnvidia-ml.so) — report to NVIDIA with the C reproducer")
    if py_bad:
        return ("only the Python reproducer failed: the driver survives the same queries from C; suspect the "
                "binding (nvidia-ml-py) or the calling pattern (threads, shutdown) — report upstream with the "
                "Python reproducer, and note the C result")
    if c_bad and python is None:  # not run (another architecture without its interpreter, or not asked for)
        return "the C reproducer failed (the Python one did not run): suspect the driver library"
    if c_bad:
        return "only the C reproducer failed: suspect the driver library; the Python run may need more iterations"
    return "neither reproducer failed: no reproduction under these conditions (try more iterations or threads)"


def _label(r: ReproRun) -> str:
    return "Python" if r.name == "python" else "C"




def nvml_dir_for(path: str, workdir: Path) -> str:
    """A directory to put first on LD_LIBRARY_PATH so that ``libnvidia-ml.so.1`` is ``path``."""
    p = Path(path)
    if not p.exists():
        raise NvmlLibraryNotFound(path)
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


def _core_in(run_dir: Path, pid: int, *, guest: bool = False) -> str | None:
    """The core the run left: under qemu-user (``guest``) the one qemu wrote of the emulated program
    (``qemu_<program>_<date>_<pid>.core``), not the host's core of the emulator itself."""
    if guest:
        cores = sorted(p for p in run_dir.glob("qemu_*.core") if p.is_file())
        if cores:
            _drop_emulator_core(run_dir, pid)
        return str(cores[0]) if cores else None
    for name in ("core", f"core.{pid}"):
        if (run_dir / name).is_file():
            return str(run_dir / name)
    cores = sorted(p for p in run_dir.glob("core*") if p.is_file())
    return str(cores[0]) if cores else None


def _drop_emulator_core(run_dir: Path, pid: int) -> None:
    """Remove the core the host's kernel wrote of qemu-user itself (this machine's architecture, 150 MB and
    more) beside the one qemu wrote of the emulated program: it is the emulator's state, not the crash's."""
    from .simnvml import elf_arch, host_arch

    for name in ("core", f"core.{pid}"):
        path = run_dir / name
        if path.is_file() and not path.is_symlink() and elf_arch(path) == host_arch():
            path.unlink()


def _core_note() -> str:
    try:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:
        return "kernel.core_pattern unreadable"
    if pattern.startswith("|"):
        return f"kernel.core_pattern pipes cores to {pattern.split()[0][1:]}; look there"
    return f"no core in the run directory (kernel.core_pattern is {pattern!r})"


def _read_ends(path: Path) -> tuple[str, str]:
    """The first and the last OUTPUT_LIMIT bytes of a file (the header and the verdict), decoded."""
    with open(path, "rb") as f:
        head = f.read(OUTPUT_LIMIT)
        size = os.fstat(f.fileno()).st_size
        if size <= OUTPUT_LIMIT:
            tail = head
        else:
            f.seek(max(OUTPUT_LIMIT, size - OUTPUT_LIMIT))
            tail = f.read(OUTPUT_LIMIT)
    return head.decode(errors="replace"), tail.decode(errors="replace")


def _run_one(name: str, cmd: list[str], env: dict[str, str], run_dir: Path, timeout: float,
             analyze: bool, sysroot: str | None = None, guest: bool = False) -> ReproRun:
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
        except BaseException:  # Ctrl-C, SIGTERM (Terminated): the reproducer does not outlive the command
            proc.kill()
            proc.wait()
            raise
    seconds = time.perf_counter() - t0
    head, tail = _read_ends(run_dir / "stdout.txt")
    _, stderr = _read_ends(run_dir / "stderr.txt")
    crashed = rc < 0 and -rc in _FATAL
    sig = _signal.Signals(-rc).name if rc < 0 else None
    core = _core_in(run_dir, proc.pid, guest=guest) if crashed else None
    signature = fingerprint = None
    if core and analyze:
        from .analyze import analyze_core
        from .views.signature import signature as _sig

        try:
            a = analyze_core(core, sysroot=sysroot)
            signature, fingerprint = _sig(a), a.fingerprint
        except ForensicsError as e:
            signature = f"core not analysed: {e}"
    verdict = _verdict(tail)
    calls, to_crash = parse_crash_verdict(verdict)
    return ReproRun(
        name=name, command=tuple(cmd), run_dir=str(run_dir), exit_code=rc if rc >= 0 else None, signal=sig,
        verdict=verdict, crashed=crashed, core=core, core_note=None if core or not crashed else _core_note(),
        signature=signature, fingerprint=fingerprint, environment=parse_header(head), seconds=seconds,
        stderr_tail="\n".join(stderr.splitlines()[-20:]), calls_to_crash=calls, seconds_to_crash=to_crash,
    )


def run_reproducers(*, workdir: Path, python: str, nvml_dir: str | None, env: dict[str, str] | None = None,
                    iterations: int = 1000, threads: int = 2, duration: float | None = None,
                    shutdown_race: bool = False, malloc_check: bool = False, timeout: float = 300.0,
                    which: tuple[str, ...] = ("python", "c"), analyze: bool = True,
                    sim: dict[str, str] | None = None, arch: str | None = None,
                    sysroot: str | None = None) -> ReproduceResult:
    """Build the C reproducer and run both; never overwrite an earlier run (a new directory each time).

    :param python: the interpreter whose nvidia-ml-py the Python reproducer uses (for another ``arch``:
        one of that architecture, in ``sysroot``: ``/usr/bin/python3.11`` is the root's)
    :param arch: the architecture the C reproducer is built for (None: this machine's); another one runs
        here under qemu-user with ``sysroot`` (:func:`forensics.simnvml.guest_command`), and its core is
        the one qemu writes of the emulated program
    :param sysroot: the root of ``arch`` (its C library and loader); the cores are analyzed with it too
    :param nvml_dir: put first on LD_LIBRARY_PATH (None: whatever the loader finds)
    :param env: the environment to run in (default: this one)
    :param malloc_check: both reproducers under glibc's checking allocator (stop at the culprit call)
    """
    from .resources import find_reproducers
    from .simnvml import arch_name, build_c_reproducer, guest_command, guest_program, host_arch

    guest = arch_name(arch) != host_arch()
    if guest and sysroot and python:
        python = guest_program(python, sysroot)
    base_env = dict(os.environ if env is None else env)
    if nvml_dir:
        old = base_env.get("LD_LIBRARY_PATH")
        base_env["LD_LIBRARY_PATH"] = nvml_dir + (os.pathsep + old if old else "")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    runs_dir = workdir / f"reproduce-{stamp}"
    runs: dict[str, ReproRun] = {}
    binary = build_c_reproducer(workdir / (f"bin-{arch_name(arch)}" if guest else "bin"), arch=arch) \
        if "c" in which else None
    programs = tuple(Path(p) for p in (python if "python" in which else None, binary) if p)
    analysis_root = _guest_analysis_root(workdir, arch_name(arch), sysroot, programs, base_env) \
        if guest and sysroot and analyze else sysroot
    if "python" in which:
        cmd = guest_command([python, str(find_reproducers() / "nvml_nvlink_fieldvalues.py"), "--iterations",
                             str(iterations), "--threads", str(threads)], arch, sysroot)
        if duration:
            cmd += ["--duration", str(duration)]
        if shutdown_race:
            cmd.append("--shutdown-race")
        if malloc_check:
            cmd.append("--malloc-check")
        runs["python"] = _run_one("python", cmd, base_env, runs_dir / "python", timeout, analyze, analysis_root,
                                  guest)
    if binary is not None:
        # the Python reproducer's calling pattern: a fault only calls from threads meet crashes both, the driver's
        cmd = guest_command([str(binary), "--iterations", str(iterations), "--threads", str(threads)] + (
            ["--duration", str(duration)] if duration else []), arch, sysroot)
        if malloc_check:
            cmd.append("--malloc-check")
        runs["c"] = _run_one("c", cmd, base_env, runs_dir / "c", timeout, analyze, analysis_root, guest)
    main_thread = None
    if binary is not None and threads > 0 and runs["c"].failed:  # where it fires: the same calls, from main
        cmd = guest_command([str(binary), "--iterations", str(iterations), "--threads", "0"] + (
            ["--duration", str(duration)] if duration else []), arch, sysroot)
        if malloc_check:
            cmd.append("--malloc-check")
        main_thread = _run_one("c", cmd, base_env, runs_dir / "c-main-thread", timeout, analyze, analysis_root, guest)
    header = next((r.environment for r in runs.values() if r.environment.get("driver")),
                  next((r.environment for r in runs.values() if r.environment), {}))
    conclusion = conclude(runs.get("python"), runs.get("c"))
    if main_thread is not None:
        conclusion += ("; the same calls from the main thread " + ("ran clean: the fault fires only in calls from "
                                                                   "threads other than the main one"
                                                                   if main_thread.status is Outcome.CLEAN else
                                                                   f"{main_thread.outcome} too"))
    return ReproduceResult(
        runs=tuple(runs.values()), conclusion=conclusion, environment=header,
        nvml=nvml_dir or "the loader's default", sim=dict(sim or {}), main_thread=main_thread,
    )


def _guest_analysis_root(workdir: Path, arch: str, sysroot: str, programs: tuple[Path, ...],
                         env: dict[str, str]) -> str:
    """The root the guest cores are analyzed with: ``sysroot`` plus the programs qemu-user ran from this
    machine's paths (the C reproducer; the root's interpreter, named by its path here) and the
    LD_LIBRARY_PATH directories it loaded from them (the simulated NVML), each at its own path
    (:func:`forensics.simnvml.guest_analysis_root`); ``sysroot`` itself where that cannot be made."""
    from .simnvml import guest_analysis_root

    dirs = tuple(Path(d) for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and os.path.isabs(d))
    try:
        return str(guest_analysis_root(sysroot, workdir / f"sysroot-{arch}", files=programs, dirs=dirs))
    except OSError:
        return sysroot


def load_reproduce(doc: object) -> ReproduceResult:
    """The :class:`ReproduceResult` a ``forensics reproduce --json`` document holds (the inverse of
    :func:`reproduce_payload`: its ``environment`` and ``runs`` summaries are derived from the record again).

    :raises ArtifactFormatError: not a ``reproduce`` document of this schema version, or a value of the wrong type
    """
    from .jsonrecords import load_document

    return load_document(doc, "reproduce", "reproduce", ReproduceResult)


def reproduce_payload(result: ReproduceResult) -> dict:
    """The body of ``forensics reproduce --json`` (what ``forensics report`` reads)."""
    h = result.environment
    return {
        "reproduce": result,
        "environment": {"gpus": h.get("gpu"), "driver": h.get("driver"), "cuda": h.get("cuda driver"),
                        "nvml": h.get("nvml"), "libnvidia_ml": h.get("libnvidia-ml"), "kernel": h.get("kernel"),
                        "python": h.get("python"), "binding": h.get("binding"), "glibc": h.get("glibc"),
                        "call": h.get("call")},
        "runs": [{"name": r.name, "status": r.status.value, "outcome": r.outcome, "signature": r.signature,
                  "fingerprint": r.fingerprint, "core": r.core, "verdict": r.verdict, "seconds": round(r.seconds, 3),
                  "calls_to_crash": r.calls_to_crash, "seconds_to_crash": r.seconds_to_crash,
                  "command": list(r.command), "gpus": gpu_lines_of(r.environment)}
                 for r in result.runs],
        "main_thread": None if result.main_thread is None else {
            "status": result.main_thread.status.value, "outcome": result.main_thread.outcome,
            "command": list(result.main_thread.command), "thread_only": result.thread_only},
        "conclusion": result.conclusion,
    }


def gpu_lines_of(header: dict[str, str]) -> list[str]:
    """``GPU 0: NVIDIA H20, GPU-<uuid>, PCI bus 00000000:18:00.0`` lines of a header, in index order."""
    keys = sorted((k for k in header if re.fullmatch(r"gpu \d+", k)), key=lambda k: int(k.split()[1]))
    return [f"GPU {k.split()[1]}: {header[k]}" for k in keys]
