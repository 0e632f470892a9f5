"""Benchmark ``forensics analyze`` (auto and ``--method direct``) against pystack and gdb on real cores.

Prints ratios, asserts nothing.

What it measures
----------------
* Cores: ``tests/crashers/exporter.py`` crashed under every CPython that
  ``tests/pythons.py`` finds, once aborting in glibc (``heap-prev``) and once on
  SIGSEGV (``segv``), plus one big core (``--big-mb``, default 2048 MiB of
  written Python heap via ``EXPORTER_BALLAST_MB``) from the newest CPython, and one
  heap-walk core (``--heap-mb``, default 256 MiB of 4 KiB malloc chunks, ~65,000 of them, via
  ``EXPORTER_HEAP_BALLAST_MB``): what ``--heap`` costs grows with the chunks, not the core's size.
  Cores live in ``--workdir`` (default ``bench/analyze/`` in the forensics cache) and are reused
  between runs, keyed by interpreter path, scenario and ballast.
* forensics is measured from a wheel built from this checkout and installed into
  ``bench/.wheel-venv`` (rebuilt when a source file changes), never from the editable
  install: an installed wheel carries compiled bytecode, as a node's install does.
* Tools, run alternately on the same core (the order rotates per repetition;
  each core file is read once beforehand so all of them find it in the page cache):

  - "forensics": ``forensics analyze --native CORE`` (the defaults: native stacks by
    elfutils' libdw in-process, Python stacks by its own reader of the interpreter
    state, the merged view printed)
  - "eu-stack": ``eu-stack --core CORE -e PYTHON -s -i -m`` (elfutils: native frames
    with source lines and inlined frames; no Python stacks)
  - "direct": ``forensics analyze --method direct CORE`` (that reader alone,
    no gdb at all; native stacks are program counters only)
  - "heap": ``forensics analyze --heap CORE`` (auto, plus glibc's heap walked whole:
    every arena, heap, bin and tcache); its ratio over "forensics" is what ``--heap``
    costs.  The heap-corruption cores pay for the corruption's anatomy in both runs
    (the default reads it); the SIGSEGV cores pay nothing for the heap by default.
  - ``pystack core --native CORE PYTHON`` (pystack==1.7.2, installed into
    bench/.venv when missing)
  - ``gdb -nx -batch -q`` with the CPython helper ``$(dirname PYTHON)/python3.X-gdb.py``
    sourced, then ``thread apply all py-bt`` and ``thread apply all bt``
    (debuginfod off, python-scripts auto-load off: the helper is sourced explicitly)

* Wall time: ``time.perf_counter`` from spawn to exit (reaped with ``wait4``),
  median of ``--repeat`` runs.  CPU time: user + system from ``wait4``'s rusage
  (the process and every descendant it waited for, gdb included), median of the runs.
  "cold": one run of forensics per core with an empty forensics cache (no plain copy
  of glibc's compressed debug file yet: what the first analysis on a node pays).
* Peak memory: a sampler thread sums the RSS of the whole process tree every
  ~10 ms (forensics and its gdb, pystack, gdb) and keeps the maximum ("tree"); the
  largest single process ("single") is the larger of the sampled value and the
  kernel's ``ru_maxrss`` from ``wait4``.  Shared pages count once per process
  in the tree sum, so "tree" is an upper bound, though a peak shorter than the
  sampling interval can be missed.  ``ru_maxrss`` also counts the memory the child
  inherited from this script before exec, so "single" never reads below this
  script's own RSS (~20-40 MB): for the small ``direct`` process it is a floor,
  not its peak.  MB here means MiB.
* A run counts as ok when the tool exits 0 and its output names the crashing
  Python function (``query_nvlink_throughput_counters``).
* Ratios: forensics (auto) over gdb and over pystack, and direct over pystack,
  per core and over all cores (geomean and worst), for wall time and tree peak.
* Batch: ``--batch`` (default 200) hard links of the small cores above, mixed
  versions and scenarios in one directory, analyzed by
  ``forensics analyze --json DIR`` (auto); prints cores per second and peak memory.

Goals (from the issues; printed as PASS/MISS, never asserted; "n/a" when a tool
or core they need was not measured):

  (a) ``forensics analyze`` (auto) wall time at most 1.5x the gdb run on every core;
  (b) auto peak memory (process tree) under 150 MB for the big core;
  (c) a 200-core batch at 10 or more cores per second with 2 workers (``-j 2``), every core analyzed;
  (d) ``--method direct`` wall time at most 2x pystack on every core;
  (e) ``--method direct`` peak memory (process tree) under 60 MB for the big core;
  (f) ``analyze --native`` CPU time at most 1.0x ``pystack core --native`` on every core (medians);
  (g) ``analyze --native`` peak memory (process tree) at most pystack's on every core;
  (h) Python stacks only, on the interpreters current images run: ``analyze --method direct`` CPU
      time at most ``pystack core``'s (no native frames) on every CPython 3.14 and 3.15 core;
  (i) many threads: ``analyze --native`` on a 200+ thread core at most 2x ``pystack core --native``'s CPU
      and under 300 MB (process tree).

Many threads (``--threads 10,60,200``, ``--threads-repeat``, ``--threads-only``, ``--no-threads``): cores of
``tests/crashers/many_threads.py`` (N threads waiting in ``Event.wait``, the main thread faulting in
libcrash.so) from Debian unstable's CPython 3.15 in the sid root (glibc 2.43, whose thread stacks have no
guard mapping between them), else from this machine's newest CPython; ``analyze --native --sysroot ROOT``
against ``pystack core --native CORE PYTHON --lib-search-path DIRS``, alternately, CPU, peak RSS and the CPU
per thread (the slope from the fewest threads to the most).

The last comparison runs on Debian unstable's CPython 3.14 and 3.15 (release builds), crashed
inside the cached sid root of ``tests/roots.py`` (``heap-prev`` and ``py-abort``) and read from
here: ``forensics analyze --method direct --sysroot ROOT CORE`` against
``pystack core CORE ROOT/usr/bin/python3.X --lib-search-path DIRS`` (the root's library
directories), alternately, ``--stacks-repeat`` runs each (default 7), CPU and wall side by side.

Usage, from the repository root::

    .venv/bin/python bench/analyze.py            # full run (~20 min on 2 CPUs)
    .venv/bin/python bench/analyze.py --quick    # newest CPython, no big core, 20-core batch
    .venv/bin/python bench/analyze.py --json     # one JSON document on stdout
    .venv/bin/python bench/analyze.py --stacks-only   # only (h): 3.14/3.15 Python stacks vs pystack
    .venv/bin/python bench/analyze.py --threads-only  # only (i): 10, 60, 200 threads vs pystack
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.crashers.make_core import HERE as CRASHERS  # noqa: E402
from tests.crashers.make_core import build_libcrash, core_pattern_problem, crash_for_core, make_core  # noqa: E402
from tests.pythons import discover_pythons  # noqa: E402
from tests.roots import RootUnavailable, build_root, sandbox_command  # noqa: E402

__all__ = ["Measurement", "CoreCase", "measure", "main"]

BENCH_VENV = REPO / "bench" / ".venv"
MANY_THREADS = CRASHERS / "many_threads.py"
PYSTACK_SPEC = "pystack==1.7.2"
SCENARIOS = ("heap-prev", "segv")  # glibc abort, SIGSEGV
BIG_SCENARIO = "heap-prev"
EXPECT = b"query_nvlink_throughput_counters"
TOOLS = ("forensics", "direct", "heap", "pystack", "eu-stack", "gdb")
WHEEL_VENV = REPO / "bench" / ".wheel-venv"
EXPECT_BY_TOOL = {"eu-stack": b"TID "}  # native frames only: no Python function to look for
SAMPLE_S = 0.010
MiB = 1 << 20

GOAL_WALL_RATIO = 1.5
GOAL_BIG_PEAK_MB = 150.0
GOAL_BATCH_RATE = 10.0
BATCH_JOBS = 2
GOAL_NATIVE_CPU_RATIO = 1.0  # analyze --native / pystack core --native
GOAL_DIRECT_WALL_RATIO = 2.0  # direct / pystack
GOAL_DIRECT_BIG_PEAK_MB = 60.0
GOAL_STACKS_CPU_RATIO = 1.0  # analyze --method direct / pystack core, CPython 3.14 and 3.15
SID_VERSIONS = ("3.14", "3.15")
SID_SCENARIOS = ("heap-prev", "py-abort")
STACK_TOOLS = ("direct", "pystack")
THREAD_COUNTS = "10,60,200"
THREADS_MINOR = "3.15"
THREAD_TOOLS = ("forensics", "pystack")
GOAL_THREADS_MIN = 200
GOAL_THREADS_CPU_RATIO = 2.0  # analyze --native / pystack core --native, on a 200+ thread core
GOAL_THREADS_PEAK_MB = 300.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- measuring one command ---------------------------------------------------------------------

@dataclass
class Measurement:
    wall_s: float
    peak_tree_mb: float
    peak_single_mb: float
    rc: int | None
    ok: bool
    note: str = ""
    cpu_s: float | None = None  # user + system, the process and its waited-for descendants


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_leftovers(pid: int, seen: dict[int, psutil.Process]) -> None:
    """Kill what is left of the tree of ``pid``: its process group, and any descendant that left it."""
    _kill_group(pid)
    for p in seen.values():
        try:
            if p.pid != pid and p.is_running():
                p.kill()
        except psutil.Error:
            pass


def _failure(rc: int, out_path: Path, expect: bytes | None, timed_out: bool, timeout: float) -> str:
    """Why a run does not count ("" when it does): a timeout, an exit status, or output lacking ``expect``."""
    if timed_out:
        return f"timed out after {timeout:.0f}s"
    if rc != 0:
        return f"exit status {rc}"
    if expect is not None:
        with open(out_path, "rb") as f:
            if expect not in f.read():
                return f"output lacks {expect.decode()}"
    return ""


def measure(cmd: list[str], *, timeout: float, out_path: Path, expect: bytes | None = EXPECT,
            env: dict[str, str] | None = None) -> Measurement:
    """Run ``cmd`` once (stdout+stderr to ``out_path``); wall time and peak RSS of its process tree.

    The command runs in its own session; whatever of it is left when it ends or
    times out is killed by process-group id and by the pids seen while sampling.
    """
    peak = {"tree": 0, "single": 0}
    seen: dict[int, psutil.Process] = {}
    done = threading.Event()
    timed_out = threading.Event()

    with open(out_path, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    try:
        root = psutil.Process(proc.pid)
        seen[proc.pid] = root
    except psutil.NoSuchProcess:
        root = None

    def sample() -> None:
        deadline = start + timeout
        while not done.is_set():
            if root is not None:
                try:
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    procs = []
                total = 0
                for p in procs:
                    seen.setdefault(p.pid, p)
                    try:
                        rss = p.memory_info().rss
                    except psutil.Error:
                        continue
                    total += rss
                    peak["single"] = max(peak["single"], rss)
                peak["tree"] = max(peak["tree"], total)
            if time.perf_counter() > deadline:
                timed_out.set()
                _kill_group(proc.pid)
                return
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    status = None
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        done.set()
        sampler.join(timeout=5)
        if status is None:  # interrupted: the child was not reaped
            _kill_group(proc.pid)
            proc.wait()
        _kill_leftovers(proc.pid, seen)
    single = max(peak["single"], usage.ru_maxrss * 1024)
    note = _failure(proc.returncode, out_path, expect, timed_out.is_set(), timeout)
    return Measurement(wall_s=wall, peak_tree_mb=peak["tree"] / MiB, peak_single_mb=single / MiB,
                       rc=proc.returncode, ok=not note, note=note, cpu_s=usage.ru_utime + usage.ru_stime)


# -- the bench environment ---------------------------------------------------------------------

def ensure_pystack() -> tuple[str | None, str]:
    """The pystack executable in bench/.venv (installed there when missing), or None and why."""
    exe = BENCH_VENV / "bin" / "pystack"
    py = BENCH_VENV / "bin" / "python"
    try:
        if not py.exists():
            log(f"creating {BENCH_VENV.relative_to(REPO)}")
            subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True, timeout=300,
                           capture_output=True)
        have = subprocess.run([str(py), "-c", "import pystack, importlib.metadata as m; print(m.version('pystack'))"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
        if have != PYSTACK_SPEC.split("==")[1] or not exe.exists():
            log(f"installing {PYSTACK_SPEC} into {BENCH_VENV.relative_to(REPO)}")
            proc = subprocess.run([str(py), "-m", "pip", "install", "-q", PYSTACK_SPEC], capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode != 0 or not exe.exists():
                return None, f"pip install {PYSTACK_SPEC} failed: {proc.stderr.strip()[-300:]}"
        version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
        return str(exe), (version.stdout or version.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot set up {BENCH_VENV}: {e}"


def _source_key() -> str:
    """A hash of what the wheel is built from (the package, the shipped scripts, pyproject.toml)."""
    h = hashlib.sha256()
    files = [REPO / "pyproject.toml", *sorted(p for d in ("forensics", "gdb_scripts", "reproducers")
                                              for p in (REPO / d).rglob("*") if p.is_file()
                                              and "__pycache__" not in p.parts)]
    for p in files:
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def ensure_wheel() -> tuple[str | None, str]:
    """forensics installed from a wheel of this checkout into bench/.wheel-venv (rebuilt when the source
    changed), or None and why."""
    exe, py, stamp = WHEEL_VENV / "bin" / "forensics", WHEEL_VENV / "bin" / "python", WHEEL_VENV / ".source"
    key = _source_key()
    try:
        if exe.exists() and stamp.exists() and stamp.read_text() == key:
            return str(exe), f"wheel of this checkout (source {key}) in {WHEEL_VENV.relative_to(REPO)}"
        if not py.exists():
            log(f"creating {WHEEL_VENV.relative_to(REPO)}")
            subprocess.run([sys.executable, "-m", "venv", str(WHEEL_VENV)], check=True, timeout=300,
                           capture_output=True)
        wheels = WHEEL_VENV / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        log("building the forensics wheel of this checkout")
        proc = subprocess.run([str(py), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
                              capture_output=True, text=True, timeout=600)
        wheel = next(wheels.glob("*forensics-*.whl"), None)  # the distribution is crash-forensics
        if proc.returncode != 0 or wheel is None:
            return None, f"pip wheel failed: {proc.stderr.strip()[-300:]}"
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--force-reinstall", str(wheel)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not exe.exists():
            return None, f"pip install {wheel.name} failed: {proc.stderr.strip()[-300:]}"
        stamp.write_text(key)
        return str(exe), f"wheel of this checkout (source {key}) in {WHEEL_VENV.relative_to(REPO)}"
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot set up {WHEEL_VENV}: {e}"


_FORENSICS_EXE: str | None = None


def forensics_exe() -> str:
    """The forensics command measured: the installed wheel's (main() sets it), else this checkout's .venv."""
    if _FORENSICS_EXE:
        return _FORENSICS_EXE
    here = Path(sys.executable).parent / "forensics"
    return str(here if here.exists() else REPO / ".venv" / "bin" / "forensics")


def gdb_helper(python: str) -> Path | None:
    m = re.search(r"python(3\.\d+)", os.path.realpath(python))
    if not m:
        return None
    helper = Path(python).parent / f"python{m.group(1)}-gdb.py"
    return helper if helper.exists() else None


def tool_commands(core: Path, python: str, pystack: str | None, gdb: str) -> dict[str, list[str] | None]:
    helper = gdb_helper(python)
    gdb_cmd = [gdb, "-nx", "-batch", "-q", "-iex", "set debuginfod enabled off",
               "-iex", "set auto-load python-scripts off"]
    if helper:
        gdb_cmd += ["-ex", f"source {helper}", "-ex", "thread apply all py-bt"]
    gdb_cmd += ["-ex", "thread apply all bt", python, str(core)]
    eu_stack = shutil.which("eu-stack")
    return {
        "forensics": [forensics_exe(), "analyze", "--native", str(core)],
        "direct": [forensics_exe(), "analyze", "--method", "direct", str(core)],
        "heap": [forensics_exe(), "analyze", "--heap", str(core)],
        "pystack": [pystack, "core", "--native", str(core), python] if pystack else None,
        "eu-stack": ([eu_stack, f"--core={core}", "-e", os.path.realpath(python), "-s", "-i", "-m"]
                     if eu_stack else None),
        "gdb": gdb_cmd,
    }


# -- cores -------------------------------------------------------------------------------------

@dataclass
class CoreCase:
    version: str
    python: str
    scenario: str
    ballast_mb: int
    path: str
    size: int
    heap_mb: int = 0  # MiB of 4 KiB malloc chunks (EXPORTER_HEAP_BALLAST_MB)
    results: dict[str, list[Measurement]] = field(default_factory=dict)
    heap: dict | None = None  # heap_probe's figures

    @property
    def label(self) -> str:
        return (f"{self.version} {self.scenario}" + (f" +{self.ballast_mb}M" if self.ballast_mb else "")
                + (f" +{self.heap_mb}M heap" if self.heap_mb else ""))


def _full_version(python: str, minor: str) -> str:
    m = re.search(r"/versions/(\d+\.\d+\.\d+)/", python)
    return m.group(1) if m else minor


def get_core(workdir: Path, lib: Path, python: str, version: str, scenario: str, ballast_mb: int,
             heap_mb: int = 0) -> CoreCase:
    """The cached core for (python, scenario, ballast, heap ballast), made with make_core when missing."""
    key = hashlib.sha1(f"{os.path.realpath(python)}\0{scenario}\0{ballast_mb}\0{heap_mb}".encode()).hexdigest()[:10]
    name = (f"{version}-{scenario}" + (f"-big{ballast_mb}" if ballast_mb else "") + (f"-heap{heap_mb}" if heap_mb
                                                                                        else "") + f"-{key}")
    cores = workdir / "cores"
    cores.mkdir(parents=True, exist_ok=True)
    dest, meta = cores / f"{name}.core", cores / f"{name}.json"
    if dest.exists() and meta.exists() and json.loads(meta.read_text()).get("size") == dest.stat().st_size:
        log(f"reusing {dest}")
    else:
        log(f"making core: {version} {scenario}" + (f" with {ballast_mb} MiB ballast" if ballast_mb else "")
            + (f" with {heap_mb} MiB of 4 KiB heap chunks" if heap_mb else ""))
        env = {"EXPORTER_BALLAST_MB": str(ballast_mb), "EXPORTER_HEAP_BALLAST_MB": str(heap_mb)}
        (workdir / "make").mkdir(exist_ok=True)
        core = make_core(workdir / "make", python, scenario, libcrash=lib, env=env,
                         timeout=600.0 if ballast_mb or heap_mb else 60.0)
        os.replace(core, dest)
        shutil.rmtree(core.parent, ignore_errors=True)
        meta.write_text(json.dumps({"python": python, "scenario": scenario, "ballast_mb": ballast_mb,
                                    "heap_mb": heap_mb, "size": dest.stat().st_size}))
    return CoreCase(version=version, python=python, scenario=scenario, ballast_mb=ballast_mb, path=str(dest),
                    size=dest.stat().st_size, heap_mb=heap_mb)


def prepare_cores(workdir: Path, pythons: dict[str, str], big_mb: int | None,
                  heap_mb: int | None = None) -> list[CoreCase]:
    lib_dir = workdir / "lib"
    if not (lib_dir / "libcrash.so").exists() and (workdir / "cores").exists():
        shutil.rmtree(workdir / "cores")  # the cached cores name a libcrash.so that is gone
    lib = build_libcrash(lib_dir)
    cases = []
    for minor, python in pythons.items():
        for scenario in SCENARIOS:
            cases.append(get_core(workdir, lib, python, _full_version(python, minor), scenario, 0))
    if big_mb:
        minor, python = list(pythons.items())[-1]
        free = shutil.disk_usage(workdir).free
        if free < (big_mb + 1024) * MiB:
            log(f"skipping the big core: {free // MiB} MiB free in {workdir}, need {big_mb + 1024}")
        else:
            cases.append(get_core(workdir, lib, python, _full_version(python, minor), BIG_SCENARIO, big_mb))
    if heap_mb:
        minor, python = list(pythons.items())[-1]
        cases.append(get_core(workdir, lib, python, _full_version(python, minor), BIG_SCENARIO, 0, heap_mb))
    return cases


def read_through(path: str) -> None:
    """Read the file once so every tool finds it in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MiB):
            pass


# -- runs --------------------------------------------------------------------------------------

def bench_core(case: CoreCase, cmds: dict[str, list[str] | None], repeat: int, timeout: float,
               workdir: Path) -> None:
    read_through(case.path)
    tools = [t for t in TOOLS if cmds[t]]
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    for rep in range(repeat):
        order = tools[rep % len(tools):] + tools[:rep % len(tools)]
        for tool in order:
            m = measure(cmds[tool], timeout=timeout, out_path=out / f"{tool}.txt",
                        expect=EXPECT_BY_TOOL.get(tool, EXPECT))
            case.results.setdefault(tool, []).append(m)
            if not m.ok:
                shutil.copy(out / f"{tool}.txt", out / f"{tool}-{Path(case.path).stem}.failed.txt")
            log(f"  {case.label:<28} {tool:<9} {m.wall_s:7.3f}s {m.cpu_s or 0:7.3f}s cpu {m.peak_tree_mb:7.1f} MB"
                + ("" if m.ok else f"  NOT OK: {m.note}"))
    if cmds.get("forensics"):
        # the first analysis on a node: an empty forensics cache (no plain copy of glibc's debug file yet)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="forensics-bench-cache-") as empty:
            m = measure(cmds["forensics"], timeout=timeout, out_path=out / "forensics-cold.txt",
                        env={**os.environ, "FORENSICS_CACHE": empty})
        case.results["forensics-cold"] = [m]
        log(f"  {case.label:<28} {'cold':<9} {m.wall_s:7.3f}s {m.cpu_s or 0:7.3f}s cpu {m.peak_tree_mb:7.1f} MB"
            + ("" if m.ok else f"  NOT OK: {m.note}"))


_HEAP_PROBE = r"""
import json, sys, time
from forensics.core import open_core
from forensics.heap import read_heap
core = open_core(sys.argv[1])
t0 = time.perf_counter()
a = read_heap(core, message=core.abort_message, tid=core.crashed_tid)
t1 = time.perf_counter()
s = read_heap(core, message=None, corruption=False, summary=True)
t2 = time.perf_counter()
arenas = s.summary.arenas if s.summary else ()
print(json.dumps({"anatomy_s": t1 - t0 if core.abort_message else None, "summary_s": t2 - t1,
                  "arenas": len(arenas), "heaps": sum(len(x.heaps) for x in arenas),
                  "chunks": sum(h.chunks_in_use + h.chunks_free for x in arenas for h in x.heaps),
                  "heap_mb": sum(h.end - h.start for x in arenas for h in x.heaps) / (1 << 20),
                  "mmapped_mb": (s.summary.mmapped_bytes or 0) / (1 << 20) if s.summary else None,
                  "problems": list(s.problems)}))
"""


def heap_probe(case: CoreCase, repeat: int) -> dict | None:
    """What reading glibc's heap costs in-process (a warm libc layout cache): the anatomy, the summary."""
    python = Path(forensics_exe()).parent / "python"
    runs = []
    for _ in range(max(1, repeat)):
        proc = subprocess.run([str(python if python.exists() else sys.executable), "-c", _HEAP_PROBE, case.path],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-300:]}
        runs.append(json.loads(proc.stdout))
    best = dict(runs[0])
    for key in ("anatomy_s", "summary_s"):
        vals = [r[key] for r in runs if r[key] is not None]
        best[key] = statistics.median(vals) if vals else None
    return best


def summarize(ms: list[Measurement]) -> dict:
    cpus = [m.cpu_s for m in ms if m.cpu_s is not None]
    return {
        "wall_s": statistics.median(m.wall_s for m in ms),
        "walls_s": [round(m.wall_s, 4) for m in ms],
        "cpu_s": statistics.median(cpus) if cpus else None,
        "cpus_s": [round(c, 4) for c in cpus],
        "peak_tree_mb": max(m.peak_tree_mb for m in ms),
        "peak_single_mb": max(m.peak_single_mb for m in ms),
        "ok": all(m.ok for m in ms),
        "notes": sorted({m.note for m in ms if m.note}),
    }


def run_batch(workdir: Path, cases: list[CoreCase], n: int, timeout: float) -> dict:
    small = [c for c in cases if not c.ballast_mb]
    bdir = workdir / f"batch-{n}"
    shutil.rmtree(bdir, ignore_errors=True)
    bdir.mkdir(parents=True)
    for i in range(n):
        src = small[i % len(small)].path
        dst = bdir / f"core.{i:04d}"
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
    read_through(small[0].path)
    for c in small:
        read_through(c.path)
    log(f"batch: forensics analyze --json -j {BATCH_JOBS} {bdir} ({n} cores, {len(small)} distinct)")
    out = workdir / "out" / "batch.json"
    m = measure([forensics_exe(), "analyze", "--json", "-j", str(BATCH_JOBS), str(bdir)], timeout=timeout,
                out_path=out, expect=None)
    analyzed = complete = 0
    note = m.note
    try:
        doc = json.loads(out.read_bytes())
        analyzed = doc["batch"]["total"] - len(doc["batch"]["failed"])
        complete = sum(1 for c in doc["cores"] if c.get("complete"))
    except (ValueError, KeyError, TypeError) as e:
        note = note or f"unreadable JSON: {e}"
    return {
        "cores": n, "distinct": len(small), "analyzed": analyzed, "complete": complete,
        "wall_s": m.wall_s, "cores_per_s": n / m.wall_s, "cpu_s": m.cpu_s, "jobs": BATCH_JOBS,
        "peak_tree_mb": m.peak_tree_mb,
        "peak_single_mb": m.peak_single_mb, "rc": m.rc, "note": note,
    }


# -- Python stacks only: CPython 3.14 and 3.15 ------------------------------------------------------

@dataclass
class StackCase:
    """A core of Debian unstable's CPython 3.14/3.15, crashed inside the sid root."""

    version: str  # "3.14.10"
    minor: str
    scenario: str
    root: str
    path: str
    size: int
    results: dict[str, list[Measurement]] = field(default_factory=dict)


def prepare_sid_cores(workdir: Path) -> tuple[list[StackCase], str]:
    """The 3.14/3.15 cores (cached in the workdir, keyed by the root); [] and why when there is no root."""
    from tests.conftest import SID_PACKAGES

    try:
        root = build_root("sid", SID_PACKAGES)
    except RootUnavailable as e:
        return [], str(e)
    cores = workdir / "sid-cores"
    cores.mkdir(parents=True, exist_ok=True)
    lib = build_libcrash(workdir / "lib")
    cases = []
    for minor in SID_VERSIONS:
        python = f"/usr/bin/python{minor}"
        probe = sandbox_command(root, [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                                cwd=cores)
        version = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout.strip() or minor
        for scenario in SID_SCENARIOS:
            dest = cores / f"{root.name}-{minor}-{scenario}.core"
            if not dest.exists():
                log(f"making core: sid {minor} {scenario} (inside {root})")
                (workdir / "make").mkdir(exist_ok=True)
                core = make_core(workdir / "make", python, scenario, libcrash=lib, root=root)
                os.replace(core, dest)
                shutil.rmtree(core.parent, ignore_errors=True)
            cases.append(StackCase(version=version, minor=minor, scenario=scenario, root=str(root), path=str(dest),
                                   size=dest.stat().st_size))
    return cases, ""


def stack_commands(case: StackCase, pystack: str | None) -> dict[str, list[str] | None]:
    """Python stacks only: forensics' walker with the core's own layouts, and pystack without native frames."""
    dirs = ":".join(f"{case.root}/{d}" for d in ("usr/lib/x86_64-linux-gnu", f"usr/lib/python{case.minor}/lib-dynload"))
    return {
        "direct": [forensics_exe(), "analyze", "--method", "direct", "--sysroot", case.root, case.path],
        "pystack": ([pystack, "core", case.path, f"{case.root}/usr/bin/python{case.minor}", "--lib-search-path", dirs]
                    if pystack else None),
    }


def bench_stacks(case: StackCase, cmds: dict[str, list[str] | None], repeat: int, timeout: float,
                 workdir: Path) -> None:
    read_through(case.path)
    tools = [t for t in STACK_TOOLS if cmds[t]]
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    for rep in range(repeat):
        for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
            m = measure(cmds[tool], timeout=timeout, out_path=out / f"stacks-{tool}.txt")
            case.results.setdefault(tool, []).append(m)
            log(f"  {case.version} {case.scenario:<10} {tool:<8} cpu {m.cpu_s or 0:6.3f}s wall {m.wall_s:6.3f}s"
                + ("" if m.ok else f"  NOT OK: {m.note}"))


def stacks_report(cases: list[StackCase], why_none: str) -> dict:
    rows = []
    for c in cases:
        tools = {t: summarize(ms) for t, ms in c.results.items()}
        d, p = tools.get("direct"), tools.get("pystack")
        rows.append({"version": c.version, "scenario": c.scenario, "core": c.path, "core_mb": c.size / MiB,
                     "tools": tools, "cpu_ratio": _ratio(d and d["cpu_s"], p and p["cpu_s"]),
                     "wall_ratio": _ratio(d and d["wall_s"], p and p["wall_s"])})
    goal = {"id": "h",
            "goal": f"(h) direct CPU <= {GOAL_STACKS_CPU_RATIO:g}x pystack on every 3.14/3.15 core "
                    "(Python stacks only)",
            "value": None, "detail": why_none or "not measured", "pass": None}
    have = [r for r in rows if r["cpu_ratio"] is not None]
    if have:
        worst = max(have, key=lambda r: r["cpu_ratio"])
        bad = [f"{r['version']} {r['scenario']}" for r in rows if not all(t["ok"] for t in r["tools"].values())]
        not_ok = f"; not ok: {', '.join(bad)}" if bad else ""
        goal.update(value=round(worst["cpu_ratio"], 3),
                    detail=f"worst {worst['cpu_ratio']:.2f}x ({worst['version']} {worst['scenario']}), geomean "
                           f"{_geomean([r['cpu_ratio'] for r in have]):.2f}x{not_ok}")
        goal["pass"] = worst["cpu_ratio"] <= GOAL_STACKS_CPU_RATIO and not bad
    return {"cores": rows, "goal": goal}


def print_stacks(st: dict) -> None:
    if not st["cores"]:
        return
    print("\nPython stacks only: forensics analyze --method direct vs pystack core (no native frames), Debian "
          "unstable's CPython in the sid root, medians")
    print(f"{'python':<8} {'scenario':<10} {'core MB':>7} | {'direct cpu':>10} {'pystack cpu':>11} {'d/p':>5} | "
          f"{'direct wall':>11} {'pystack wall':>12} {'d/p':>5}")
    for r in st["cores"]:
        d, p = r["tools"].get("direct", {}), r["tools"].get("pystack", {})
        flag = "" if all(v["ok"] for v in r["tools"].values()) else "  !" + ",".join(
            k for k, v in r["tools"].items() if not v["ok"])
        print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>7.0f} | {_f(d.get('cpu_s'), '10.3f')} "
              f"{_f(p.get('cpu_s'), '11.3f')} {_f(r['cpu_ratio'], '5.2f')} | {_f(d.get('wall_s'), '11.3f')} "
              f"{_f(p.get('wall_s'), '12.3f')} {_f(r['wall_ratio'], '5.2f')}{flag}")


# -- many threads: the cost per thread, against pystack ----------------------------------------------

@dataclass
class ThreadCase:
    """A core of tests/crashers/many_threads.py: N threads waiting, the main thread faulting."""

    threads: int
    python: str  # the interpreter's path (inside ``root`` when there is one)
    root: str | None
    path: str
    size: int
    results: dict[str, list[Measurement]] = field(default_factory=dict)


def prepare_thread_cores(workdir: Path, counts: list[int]) -> tuple[list[ThreadCase], str]:
    """The many-thread cores (cached in the workdir): Debian unstable's CPython 3.15 in the sid root of
    tests/roots.py (glibc 2.43: thread stacks with no guard mapping), else this machine's newest CPython."""
    from tests.conftest import SID_PACKAGES

    try:
        root: Path | None = build_root("sid", SID_PACKAGES)
        python, key, where = f"/usr/bin/python{THREADS_MINOR}", f"{root.name}-{THREADS_MINOR}", "the sid root"
    except RootUnavailable as e:
        root, found = None, discover_pythons()
        if not found:
            return [], f"no sid root ({e}) and no CPython here"
        minor, python = list(found.items())[-1]
        key, where = f"host-{minor}", f"this machine (no sid root: {e})"
    cores = workdir / "thread-cores"
    cores.mkdir(parents=True, exist_ok=True)
    lib = build_libcrash(workdir / "lib")
    cases = []
    for n in counts:
        dest = cores / f"{key}-{n}.core"
        if not dest.exists():
            log(f"making core: {n} threads, {python} in {where}")
            run = Path(tempfile.mkdtemp(prefix=f"threads-{n}-", dir=workdir))
            core = crash_for_core([python, str(MANY_THREADS), str(lib), str(n)], run, root=root,
                                  binds=(MANY_THREADS, lib), timeout=300)
            os.replace(core, dest)
            shutil.rmtree(run, ignore_errors=True)
        cases.append(ThreadCase(threads=n, python=python, root=str(root) if root else None, path=str(dest),
                                size=dest.stat().st_size))
    return cases, ""


def thread_commands(case: ThreadCase, pystack: str | None) -> dict[str, list[str] | None]:
    """Native and Python stacks of every thread: ``analyze --native`` (the defaults) and ``pystack core --native``."""
    if case.root is None:
        return {"forensics": [forensics_exe(), "analyze", "--native", case.path],
                "pystack": [pystack, "core", "--native", case.path, case.python] if pystack else None}
    minor = THREADS_MINOR
    dirs = ":".join(f"{case.root}/{d}" for d in ("usr/lib/x86_64-linux-gnu", f"usr/lib/python{minor}/lib-dynload"))
    return {
        "forensics": [forensics_exe(), "analyze", "--native", "--sysroot", case.root, case.path],
        "pystack": ([pystack, "core", "--native", case.path, f"{case.root}{case.python}", "--lib-search-path", dirs]
                    if pystack else None),
    }


def bench_threads(case: ThreadCase, cmds: dict[str, list[str] | None], repeat: int, timeout: float,
                  workdir: Path) -> None:
    read_through(case.path)
    tools = [t for t in THREAD_TOOLS if cmds[t]]
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    for rep in range(repeat):
        for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
            m = measure(cmds[tool], timeout=timeout, out_path=out / f"threads-{tool}.txt", expect=b"many_threads.py")
            case.results.setdefault(tool, []).append(m)
            log(f"  {case.threads:>4} threads {tool:<9} cpu {m.cpu_s or 0:6.3f}s peak {m.peak_tree_mb:7.1f} MB"
                + ("" if m.ok else f"  NOT OK: {m.note}"))


def threads_report(cases: list[ThreadCase], why_none: str) -> dict:
    rows = []
    for c in cases:
        tools = {t: summarize(ms) for t, ms in c.results.items()}
        f, p = tools.get("forensics"), tools.get("pystack")
        rows.append({"threads": c.threads, "core": c.path, "core_mb": c.size / MiB, "sid": c.root is not None,
                     "tools": tools, "cpu_ratio": _ratio(f and f["cpu_s"], p and p["cpu_s"]),
                     "peak_ratio": _ratio(f and f["peak_tree_mb"], p and p["peak_tree_mb"])})
    per_thread = {}
    if len(rows) >= 2:  # CPU per thread: the slope from the fewest threads to the most
        lo, hi = min(rows, key=lambda r: r["threads"]), max(rows, key=lambda r: r["threads"])
        for tool in THREAD_TOOLS:
            a, b = lo["tools"].get(tool), hi["tools"].get(tool)
            if a and b and hi["threads"] > lo["threads"]:
                per_thread[tool] = (b["cpu_s"] - a["cpu_s"]) / (hi["threads"] - lo["threads"]) * 1000
    goal = {"id": "i", "goal": f"(i) analyze --native on a {GOAL_THREADS_MIN}+ thread core: CPU <= "
                               f"{GOAL_THREADS_CPU_RATIO:g}x pystack's, peak under {GOAL_THREADS_PEAK_MB:g} MB",
            "value": None, "detail": why_none or "not measured", "pass": None}
    big = [r for r in rows if r["threads"] >= GOAL_THREADS_MIN and r["cpu_ratio"] is not None]
    if big:
        r = max(big, key=lambda r: r["threads"])
        peak = r["tools"]["forensics"]["peak_tree_mb"]
        ok = all(t["ok"] for t in r["tools"].values())
        goal.update(value=round(r["cpu_ratio"], 3),
                    detail=f"{r['threads']} threads: {r['cpu_ratio']:.2f}x pystack's CPU, peak {peak:.0f} MB"
                           + ("" if ok else "; a run was not ok"))
        goal["pass"] = ok and r["cpu_ratio"] <= GOAL_THREADS_CPU_RATIO and peak < GOAL_THREADS_PEAK_MB
    return {"cores": rows, "per_thread_ms": per_thread, "goal": goal}


def print_threads(th: dict) -> None:
    if not th["cores"]:
        return
    where = "Debian unstable's CPython 3.15 in the sid root" if th["cores"][0]["sid"] else "this machine's CPython"
    print(f"\nMany threads: forensics analyze --native vs pystack core --native, {where}, medians "
          "(peak: the process tree's RSS)")
    print(f"{'threads':>7} {'core MB':>8} | {'f cpu':>7} {'p cpu':>7} {'f/p':>5} | "
          f"{'f peak':>7} {'p peak':>7} {'f/p':>5}")
    for r in th["cores"]:
        f, p = r["tools"].get("forensics", {}), r["tools"].get("pystack", {})
        flag = "" if all(v["ok"] for v in r["tools"].values()) else "  !" + ",".join(
            k for k, v in r["tools"].items() if not v["ok"])
        print(f"{r['threads']:>7} {r['core_mb']:>8.0f} | {_f(f.get('cpu_s'), '7.3f')} {_f(p.get('cpu_s'), '7.3f')} "
              f"{_f(r['cpu_ratio'], '5.2f')} | {_f(f.get('peak_tree_mb'), '7.1f')} {_f(p.get('peak_tree_mb'), '7.1f')} "
              f"{_f(r['peak_ratio'], '5.2f')}{flag}")
    if th["per_thread_ms"]:
        print("  CPU per thread (slope, fewest to most threads): " + ", ".join(
            f"{tool} {ms:.2f} ms" for tool, ms in th["per_thread_ms"].items()))


# -- report ------------------------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return statistics.geometric_mean(xs) if xs else None


# (key in "ratios"/"summary", numerator tool, denominator tool); "gdb" and "pystack" are forensics (auto) over them
RATIOS = (("gdb", "forensics", "gdb"), ("pystack", "forensics", "pystack"), ("direct_pystack", "direct", "pystack"),
          ("heap", "heap", "forensics"), ("eu_stack", "forensics", "eu-stack"))


def _where(r: dict) -> str:
    return f"{r['version']} {r['scenario']}" + (f" +{r['ballast_mb']}M" if r["ballast_mb"] else "")


def _worst_ratio_goal(gid: str, rows: list[dict], key: str, tool: str, limit: float, text: str) -> dict:
    """Goal: ratios[key]["wall"] <= limit on every core, and every run of ``tool`` ok."""
    have = [r for r in rows if r["ratios"][key]["wall"] is not None]
    goal = {"id": gid, "goal": text, "value": None, "detail": "not measured", "pass": None}
    if not have:
        return goal
    worst = max(have, key=lambda r: r["ratios"][key]["wall"])
    w = worst["ratios"][key]["wall"]
    bad = [_where(r) for r in rows if tool in r["tools"] and not r["tools"][tool]["ok"]]
    detail = f"worst {w:.2f}x ({_where(worst)})"
    if len(have) < len(rows):
        detail += f", measured on {len(have)} of {len(rows)} cores"
    if bad:
        detail += f"; {tool} not ok on {', '.join(bad)}"
    goal.update(value=round(w, 3), detail=detail)
    goal["pass"] = w <= limit and not bad
    return goal


def _worst_goal(gid: str, rows: list[dict], key: str, measure_: str, tool: str, limit: float, text: str) -> dict:
    """Goal: ratios[key][measure_] <= limit on every core, and every run of ``tool`` ok."""
    have = [r for r in rows if r["ratios"][key].get(measure_) is not None]
    goal = {"id": gid, "goal": text, "value": None, "detail": "not measured", "pass": None}
    if not have:
        return goal
    worst = max(have, key=lambda r: r["ratios"][key][measure_])
    w = worst["ratios"][key][measure_]
    bad = [_where(r) for r in rows if tool in r["tools"] and not r["tools"][tool]["ok"]]
    detail = (f"worst {w:.2f}x ({_where(worst)}), geomean "
              f"{_geomean([r['ratios'][key][measure_] for r in have]):.2f}x over {len(have)} cores")
    if bad:
        detail += f"; {tool} not ok on {', '.join(bad)}"
    goal.update(value=round(w, 3), detail=detail, **{"pass": w <= limit and not bad})
    return goal


def _big_peak_goal(gid: str, rows: list[dict], tool: str, limit: float, text: str) -> dict:
    big = [r for r in rows if r["ballast_mb"]]
    goal = {"id": gid, "goal": text, "value": None, "detail": "no big core measured", "pass": None}
    if big and tool in big[0]["tools"]:
        t = big[0]["tools"][tool]
        goal["goal"] = f"{text} on the {big[0]['core_mb']:.0f} MB core"
        goal["value"] = round(t["peak_tree_mb"], 1)
        goal["detail"] = (f"tree {t['peak_tree_mb']:.1f} MB, largest process {t['peak_single_mb']:.1f} MB"
                          + ("" if t["ok"] else f"; not ok: {', '.join(t['notes'])}"))
        goal["pass"] = t["peak_tree_mb"] < limit and t["ok"]
    return goal


def build_report(cases: list[CoreCase], batch: dict | None, settings: dict) -> dict:
    rows = []
    for c in cases:
        tools = {t: summarize(ms) for t, ms in c.results.items()}
        ratios = {}
        for key, num, den in RATIOS:
            n, d = tools.get(num), tools.get(den)
            ratios[key] = {
                "wall": _ratio(n and n["wall_s"], d and d["wall_s"]),
                "cpu": _ratio(n and n["cpu_s"], d and d["cpu_s"]),
                "peak_tree": _ratio(n and n["peak_tree_mb"], d and d["peak_tree_mb"]),
            }
        cold = tools.get("forensics-cold")
        pystack = tools.get("pystack")
        ratios["cold_pystack"] = {"cpu": _ratio(cold and cold["cpu_s"], pystack and pystack["cpu_s"])}
        rows.append({"version": c.version, "python": c.python, "scenario": c.scenario + ("+heap" if c.heap_mb else ""),
                     "ballast_mb": c.ballast_mb, "core": c.path, "core_mb": c.size / MiB,
                     "tools": tools, "ratios": ratios, "heap": c.heap, "heap_mb": c.heap_mb})
    summary = {}
    for key, num, den in RATIOS:
        walls = [r["ratios"][key]["wall"] for r in rows if r["ratios"][key]["wall"]]
        cpus = [r["ratios"][key]["cpu"] for r in rows if r["ratios"][key]["cpu"]]
        mems = [r["ratios"][key]["peak_tree"] for r in rows if r["ratios"][key]["peak_tree"]]
        summary[key] = {"of": f"{num}/{den}", "wall_geomean": _geomean(walls), "wall_max": max(walls, default=None),
                        "cpu_geomean": _geomean(cpus), "cpu_max": max(cpus, default=None),
                        "peak_geomean": _geomean(mems), "peak_max": max(mems, default=None)}
    goals = [
        _worst_ratio_goal("a", rows, "gdb", "forensics", GOAL_WALL_RATIO,
                          f"(a) auto wall <= {GOAL_WALL_RATIO:g}x gdb on every core"),
        _big_peak_goal("b", rows, "forensics", GOAL_BIG_PEAK_MB, f"(b) auto peak < {GOAL_BIG_PEAK_MB:.0f} MB"),
    ]
    gc = {"id": "c", "goal": f"(c) batch >= {GOAL_BATCH_RATE:g} cores/s with {BATCH_JOBS} workers", "value": None,
          "detail": "no batch run", "pass": None}
    if batch:
        gc["value"] = round(batch["cores_per_s"], 2)
        gc["detail"] = f"{batch['cores']} cores in {batch['wall_s']:.1f}s, analyzed {batch['analyzed']}"
        gc["pass"] = batch["cores_per_s"] >= GOAL_BATCH_RATE and batch["analyzed"] == batch["cores"]
    goals.append(gc)
    goals.append(_worst_ratio_goal("d", rows, "direct_pystack", "direct", GOAL_DIRECT_WALL_RATIO,
                                   f"(d) direct wall <= {GOAL_DIRECT_WALL_RATIO:g}x pystack on every core"))
    goals.append(_big_peak_goal("e", rows, "direct", GOAL_DIRECT_BIG_PEAK_MB,
                                f"(e) direct peak < {GOAL_DIRECT_BIG_PEAK_MB:.0f} MB"))
    goals.append(_worst_goal("f", rows, "pystack", "cpu", "forensics", GOAL_NATIVE_CPU_RATIO,
                             f"(f) analyze --native CPU <= {GOAL_NATIVE_CPU_RATIO:g}x pystack --native on every core"))
    goals.append(_worst_goal("g", rows, "pystack", "peak_tree", "forensics", 1.0,
                             "(g) analyze --native peak (process tree) <= pystack's on every core"))
    return {"schema_version": 1, "settings": settings, "cores": rows, "summary": summary, "batch": batch,
            "goals": goals}


def _f(x: float | None, spec: str) -> str:
    if x is not None:
        return format(x, spec)
    width = re.match(r"\d*", spec).group()
    return "-".rjust(int(width or 0))


def print_report(rep: dict) -> None:
    s = rep["settings"]
    print(f"forensics analyze (auto, --method direct) vs pystack vs gdb+py-bt  "
          f"({s['machine']}; median of {s['repeat']}, MB = MiB)")
    print(f"forensics: {s.get('forensics_install')}")
    print(f"pystack: {s['pystack']}   eu-stack: {s.get('eu_stack')}   gdb: {s['gdb_version']}")
    hdr = f"{'python':<8} {'scenario':<10} {'core MB':>8} |"
    rhdr = f" {'f/gdb':>6} {'f/pystack':>9} {'d/pystack':>9} {'h/f':>6}"
    print("\nWall time, seconds (median); f = forensics (auto), d = direct, h = forensics --heap")
    print(hdr + f" {'forensics':>9} {'direct':>8} {'heap':>8} {'pystack':>8} {'gdb':>8} |" + rhdr)
    for r in rep["cores"]:
        t, q = r["tools"], r["ratios"]
        w = {k: t[k]["wall_s"] if k in t else None for k in TOOLS}
        flag = "" if all(v["ok"] for v in t.values()) else "  !" + ",".join(k for k, v in t.items() if not v["ok"])
        print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>8.0f} | {_f(w['forensics'], '9.3f')} "
              f"{_f(w['direct'], '8.3f')} {_f(w['heap'], '8.3f')} {_f(w['pystack'], '8.3f')} {_f(w['gdb'], '8.3f')} | "
              f"{_f(q['gdb']['wall'], '6.2f')} {_f(q['pystack']['wall'], '9.2f')} "
              f"{_f(q['direct_pystack']['wall'], '9.2f')} {_f(q['heap']['wall'], '6.2f')}{flag}")
    print("\nPeak memory, MB: process tree summed (largest single process)")
    print(hdr + f" {'forensics':>15} {'direct':>15} {'heap':>15} {'pystack':>15} {'gdb':>15} |" + rhdr)
    for r in rep["cores"]:
        t, q = r["tools"], r["ratios"]
        cells = []
        for k in ("forensics", "direct", "heap", "pystack", "gdb"):
            cells.append(f"{t[k]['peak_tree_mb']:6.1f} ({t[k]['peak_single_mb']:6.1f})" if k in t else f"{'-':>15}")
        print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>8.0f} | {' '.join(cells)} | "
              f"{_f(q['gdb']['peak_tree'], '6.2f')} {_f(q['pystack']['peak_tree'], '9.2f')} "
              f"{_f(q['direct_pystack']['peak_tree'], '9.2f')} {_f(q['heap']['peak_tree'], '6.2f')}")
    print("\nRatios over all cores: geomean (worst)")
    for v in rep["summary"].values():
        print(f"  {v['of']:<18} wall {_f(v['wall_geomean'], '.2f')}x ({_f(v['wall_max'], '.2f')}x)   "
              f"peak {_f(v['peak_geomean'], '.2f')}x ({_f(v['peak_max'], '.2f')}x)")
    print("\nglibc's heap read in-process (forensics.heap.read_heap; median, seconds): the anatomy of the "
          "corruption (what the default path adds for a heap-corruption crash) and --heap's whole walk")
    print(f"{'python':<8} {'scenario':<10} {'core MB':>8} | {'anatomy':>8} {'summary':>8} | {'arenas':>6} "
          f"{'heaps':>5} {'chunks':>8} {'heap MB':>8} {'mmapped MB':>10}")
    for r in rep["cores"]:
        h = r.get("heap") or {}
        if "error" in h or not h:
            print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>8.0f} | {h.get('error', 'not measured')}")
            continue
        print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>8.0f} | {_f(h['anatomy_s'], '8.3f')} "
              f"{_f(h['summary_s'], '8.3f')} | {h['arenas']:>6} {h['heaps']:>5} {h['chunks']:>8} "
              f"{h['heap_mb']:>8.1f} {_f(h['mmapped_mb'], '10.1f')}")
    print("\nNative stacks: analyze --native vs pystack core --native vs eu-stack -s -i -m "
          "(CPU = user+system seconds, median; cold = one run with an empty forensics cache)")
    print(f"{'python':<8} {'scenario':<10} {'core MB':>8} | {'forensics':>9} {'cold':>7} {'pystack':>8} "
          f"{'eu-stack':>8} | {'f/pystack':>9} {'cold/p':>6} {'f/eu':>6} | peak MB {'forensics':>9} {'pystack':>8} "
          f"{'eu-stack':>8} {'f/p':>5}")
    for r in rep["cores"]:
        t, q = r["tools"], r["ratios"]
        c = {k: t[k]["cpu_s"] if k in t else None for k in ("forensics", "forensics-cold", "pystack", "eu-stack")}
        pk = {k: t[k]["peak_tree_mb"] if k in t else None for k in ("forensics", "pystack", "eu-stack")}
        print(f"{r['version']:<8} {r['scenario']:<10} {r['core_mb']:>8.0f} | {_f(c['forensics'], '9.3f')} "
              f"{_f(c['forensics-cold'], '7.3f')} {_f(c['pystack'], '8.3f')} {_f(c['eu-stack'], '8.3f')} | "
              f"{_f(q['pystack']['cpu'], '9.2f')} {_f(q['cold_pystack']['cpu'], '6.2f')} "
              f"{_f(q['eu_stack']['cpu'], '6.2f')} | "
              f"        {_f(pk['forensics'], '9.1f')} {_f(pk['pystack'], '8.1f')} {_f(pk['eu-stack'], '8.1f')} "
              f"{_f(q['pystack']['peak_tree'], '5.2f')}")
    for key in ("pystack", "eu_stack"):
        v = rep["summary"][key]
        print(f"  {v['of']:<18} CPU {_f(v['cpu_geomean'], '.2f')}x geomean ({_f(v['cpu_max'], '.2f')}x worst)   "
              f"peak {_f(v['peak_geomean'], '.2f')}x ({_f(v['peak_max'], '.2f')}x)")
    b = rep["batch"]
    if b:
        print(f"\nBatch: forensics analyze --json -j {b.get('jobs', '?')} DIR, {b['cores']} cores "
              f"({b['distinct']} distinct, hard links)")
        print(f"  {b['wall_s']:.1f}s, {b['cores_per_s']:.2f} cores/s, analyzed {b['analyzed']}/{b['cores']} "
              f"(complete {b['complete']}), peak {b['peak_tree_mb']:.1f} MB tree ({b['peak_single_mb']:.1f} MB "
              f"largest process)" + (f"  NOTE: {b['note']}" if b["note"] else ""))
    print_stacks(rep.get("stacks") or {"cores": []})
    print_threads(rep.get("threads") or {"cores": []})
    print("\nGoals")
    for g in rep["goals"]:
        verdict = "n/a " if g["pass"] is None else ("PASS" if g["pass"] else "MISS")
        print(f"  {verdict}  {g['goal']}: {g['detail']}")


def _eu_stack_version() -> str:
    exe = shutil.which("eu-stack")
    if not exe:
        return "not installed (apt-get install -y elfutils)"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0] if out else exe


# -- main --------------------------------------------------------------------------------------

def run_threads(args: argparse.Namespace, pystack: str | None) -> dict:
    """(i): the many-thread cores, each measured; the report's ``threads`` section."""
    if args.no_threads or args.stacks_only:
        return threads_report([], "--no-threads" if args.no_threads else "--stacks-only")
    counts = sorted({int(n) for n in args.threads.split(",") if n.strip()})
    cases, why = prepare_thread_cores(args.workdir, counts)
    if why:
        log(f"no many-thread cores: {why}")
    for c in cases:
        bench_threads(c, thread_commands(c, pystack), args.threads_repeat, args.timeout, args.workdir)
    return threads_report(cases, why)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None,
                    help="cores and outputs, reused (default: bench/analyze/ in the forensics cache)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per tool per core (default 3; --quick 1)")
    ap.add_argument("--no-big", action="store_true", help="skip the big core")
    ap.add_argument("--big-mb", type=int, default=2048, help="Python heap ballast of the big core, MiB")
    ap.add_argument("--heap-mb", type=int, default=256,
                    help="MiB of 4 KiB malloc chunks in the heap-walk core (0: no such core; --quick: none)")
    ap.add_argument("--batch", type=int, default=None, help="cores in the batch (default 200; --quick 20; 0: none)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
    ap.add_argument("--gdb", default="gdb", help="gdb for the reference run")
    ap.add_argument("--python", action="append", metavar="X.Y", help="only these CPython versions (repeatable)")
    ap.add_argument("--quick", action="store_true", help="newest CPython only, no big core, 20-core batch")
    ap.add_argument("--json", action="store_true", help="write the figures as one JSON document to stdout")
    ap.add_argument("--stacks-only", action="store_true",
                    help="only (h): Python stacks of Debian unstable's 3.14 and 3.15 against pystack")
    ap.add_argument("--no-stacks", action="store_true", help="skip (h) (it needs the sid root of tests/roots.py)")
    ap.add_argument("--stacks-repeat", type=int, default=7, help="runs per tool per 3.14/3.15 core")
    ap.add_argument("--editable", action="store_true",
                    help="measure the checkout's .venv instead of an installed wheel (not for the goals)")
    ap.add_argument("--threads-only", action="store_true",
                    help="only (i): many-thread cores against pystack (Debian's 3.15 if the sid root is there)")
    ap.add_argument("--no-threads", action="store_true", help="skip (i)")
    ap.add_argument("--threads", default=THREAD_COUNTS,
                    help=f"thread counts of the cores (default {THREAD_COUNTS})")
    ap.add_argument("--threads-repeat", type=int, default=3, help="runs per tool per many-thread core")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    batch_n = args.batch if args.batch is not None else (20 if args.quick else 200)

    problem = core_pattern_problem()
    if problem:
        log(f"cannot make cores here: {problem}")
        return 1
    pythons = discover_pythons()
    if args.python:
        pythons = {k: v for k, v in pythons.items() if k in args.python}
    if args.quick:
        pythons = dict(list(pythons.items())[-1:])
    if not pythons:
        log("no CPython interpreters found (tests/pythons.py)")
        return 1
    gdb = shutil.which(args.gdb)
    if not gdb:
        log(f"{args.gdb} not found")
        return 1
    pystack, pystack_info = ensure_pystack()
    if not pystack:
        log(f"pystack unavailable, continuing without it: {pystack_info}")
    global _FORENSICS_EXE
    if args.editable:
        wheel_info = "the checkout's editable .venv (--editable): not what the goals are measured on"
    else:
        _FORENSICS_EXE, wheel_info = ensure_wheel()
        if not _FORENSICS_EXE:
            log(f"cannot install the forensics wheel: {wheel_info}")
            return 1

    if args.workdir is None:
        from forensics.cache import cache_dir

        args.workdir = cache_dir() / "bench" / "analyze"
    args.workdir.mkdir(parents=True, exist_ok=True)
    cases: list[CoreCase] = []
    batch = None
    if not args.stacks_only and not args.threads_only:
        cases = prepare_cores(args.workdir, pythons, None if (args.no_big or args.quick) else args.big_mb,
                              None if args.quick else args.heap_mb)
        for c in cases:
            log(f"{c.label}: {c.path} ({c.size / MiB:.0f} MB)")
            bench_core(c, tool_commands(Path(c.path), c.python, pystack, gdb), repeat, args.timeout, args.workdir)
            c.heap = heap_probe(c, repeat)
        batch = run_batch(args.workdir, cases, batch_n, max(args.timeout, 10.0 * batch_n)) if batch_n else None
    stack_cases, why = ([], "--no-stacks") if args.no_stacks or args.threads_only else \
        prepare_sid_cores(args.workdir)
    if why:
        log(f"no CPython 3.14/3.15 cores: {why}")
    for c in stack_cases:
        bench_stacks(c, stack_commands(c, pystack), args.stacks_repeat, args.timeout, args.workdir)

    gdb_version = subprocess.run([gdb, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
    settings = {
        "machine": f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / (1 << 30):.0f} GiB, {platform.machine()}",
        "repeat": repeat, "workdir": str(args.workdir), "timeout_s": args.timeout,
        "forensics": forensics_exe(), "forensics_install": wheel_info,
        "eu_stack": _eu_stack_version(),
        "pystack": pystack_info if pystack else f"unavailable ({pystack_info})",
        "gdb": gdb, "gdb_version": gdb_version, "pythons": pythons,
    }
    rep = build_report(cases, batch, settings)
    rep["stacks"] = stacks_report(stack_cases, why)
    rep["threads"] = run_threads(args, pystack)
    rep["goals"] += [rep["stacks"]["goal"], rep["threads"]["goal"]]
    if args.json:
        json.dump(rep, sys.stdout, indent=2, default=lambda o: asdict(o))
        print()
    else:
        print_report(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
