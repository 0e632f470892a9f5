"""Benchmark what a heap corruption's anatomy costs: ``analyze --native --json`` against ``pystack core --native``
on a >= 2 GiB heap core and 3 small cores, side by side in one run (#38 item 4).

Prints ratios, asserts nothing.

What it measures
----------------
* Cores, made by real crashing processes under this machine's newest CPython (``tests/pythons.py``) and kept in
  ``--workdir`` (default ``bench/heap/`` in the forensics cache), reused between runs:

  - big (``--big``, both by default), each after ``--big-mb`` MiB (default 2304: the issue's 2.3 GiB) of 4 KiB
    malloc chunks kept alive: ``tests/crashers/double_free.py merged`` -- one 4 KiB chunk freed twice after its
    first free merged it with its free neighbour into one chunk on the unsorted list, near the top of the heap:
    glibc's "(!prev)", the case whose chunk was "not found" after a walk of the whole heap (9.3x pystack's CPU);
    ``tests/crashers/heap_overflow.py free-next`` -- 24 bytes written past a 2000-byte buffer, glibc catching
    it when the chunk after it is freed ("(out)"): the chunk before the damaged header, which no link leads
    back to, lies past the 2.3 GiB of chunks in use;
  - small: the same double free without the ballast; ``double_free.py tcache 200`` (tcache's own message);
    ``tests/crashers/exporter.py heap-prev`` (libcrash.so writes past its buffer and frees it: an overflow).

* Tools, run alternately on the same core (the order rotates per repetition; each core is read once
  beforehand so both find it in the page cache):

  - ``forensics analyze --native --json CORE`` from a wheel of this checkout installed into
    ``bench/.wheel-venv`` (``bench/analyze.py``'s, rebuilt when a source file changes): native stacks by libdw,
    Python stacks by the direct reader, and the heap's anatomy, which a heap-corruption crash gets by default;
  - ``pystack core --native CORE PYTHON`` (pystack 1.7.2 in ``bench/.venv``);
  - with ``--baseline REF``: the same analysis by a wheel of that git ref of this checkout (built once into
    ``--workdir``, run by the wheel venv's interpreter): the code before a change, on the same cores.

* CPU: user + system from ``wait4`` (the process and what it waited for), median of ``--repeat`` runs.
  Peak memory: the process tree's RSS sampled every ~10 ms (``bench/analyze.py``'s ``measure``).
* Where the time goes (default on; ``--no-phases``): ``analyze --native --json`` run in-process by the
  wheel's interpreter, once per core and repetition, its stages' CPU (``time.thread_time`` of the thread that
  ran each: libdw unwinds on one of its own) -- importing the CLI and the stage modules, libdw's stacks
  (``unwind_core``), the Python stacks (``read_python_stacks``), glibc's heap (``read_heap``: the anatomy,
  modules it loads included), everything else (reading the core, the snapshot, the fingerprint, the JSON) --
  and the whole analysis; the interpreter's own start (``python -c pass``) beside them; for the big core
  also the anatomy read again from the stack's words alone (gdb's stacks, no libc6-dbg).  Medians.

Goals (printed as PASS/MISS, never asserted):

  (a) the big cores: ``analyze --native --json`` CPU at most 2x ``pystack core --native``'s;
  (b) the small cores: at most 0.5x pystack's (the issue's aim there; the phases say where the time goes);
  (c) peak memory (process tree) at most 61 MB on every core.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import analyze as A  # noqa: E402  (bench/analyze.py: measure, the wheel and pystack venvs)
import psutil  # noqa: E402

from tests.crashers.make_core import HERE as CRASHERS  # noqa: E402
from tests.crashers.make_core import build_libcrash, core_pattern_problem, crash_for_core, make_core  # noqa: E402
from tests.pythons import discover_pythons  # noqa: E402

MiB = 1 << 20
DOUBLE_FREE = CRASHERS / "double_free.py"
HEAP_OVERFLOW = CRASHERS / "heap_overflow.py"
BIG_KINDS = ("double-free", "overflow")
GOAL_BIG_RATIO = 2.0
GOAL_SMALL_RATIO = 0.5
GOAL_PEAK_MB = 61.0
PHASES = ("start", "imports", "unwind", "python_stacks", "heap", "other", "analysis", "heap_without_frames")


@dataclass
class Case:
    name: str
    path: str
    python: str
    expect: bytes  # what both tools print of the crashing Python frame
    big: bool = False
    results: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)

    @property
    def size_mb(self) -> float:
        return os.stat(self.path).st_size / MiB


def _cached(workdir: Path, name: str, make) -> Path:
    """The core ``name`` in ``workdir/cores``, made by ``make(run_dir) -> core`` when missing."""
    cores = workdir / "cores"
    cores.mkdir(parents=True, exist_ok=True)
    dest, meta = cores / f"{name}.core", cores / f"{name}.json"
    if dest.exists() and meta.exists() and json.loads(meta.read_text()).get("size") == dest.stat().st_size:
        A.log(f"reusing {dest}")
        return dest
    run = workdir / "make" / name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    A.log(f"making core {name}")
    core = make(run)
    os.replace(core, dest)
    shutil.rmtree(run, ignore_errors=True)
    meta.write_text(json.dumps({"size": dest.stat().st_size}))
    return dest


def prepare_cores(workdir: Path, python: str, big_mb: int, big: tuple[str, ...]) -> list[Case]:
    def double_free(mode: str, size: str, ballast: int = 0):
        def make(run: Path) -> Path:
            argv = [python, str(DOUBLE_FREE), mode, size, str(run / "oracle.json")]
            argv += [str(ballast)] if ballast else []
            return crash_for_core(argv, run, outputs=("oracle.json",), timeout=900.0 if ballast else 60.0)
        return make

    def overflow_after(ballast: int):
        def make(run: Path) -> Path:
            argv = [python, str(HEAP_OVERFLOW), "free-next", "2000", "24", "0x41", str(run / "oracle.json"),
                    str(ballast)]
            return crash_for_core(argv, run, outputs=("oracle.json",), timeout=900.0)
        return make

    version = Path(python).resolve().name
    cases = []
    for kind in big:
        free = shutil.disk_usage(workdir).free
        if free < (big_mb + 1024) * MiB:
            A.log(f"skipping the big {kind} core: {free // MiB} MiB free in {workdir}, need {big_mb + 1024}")
        elif kind == "double-free":
            path = _cached(workdir, f"{version}-double-free-merged-heap{big_mb}",
                           double_free("merged", "0x1000", big_mb))
            cases.append(Case(f"double free, {big_mb} MiB heap", str(path), python, b"double_free.py", big=True))
        else:
            path = _cached(workdir, f"{version}-overflow-free-next-heap{big_mb}", overflow_after(big_mb))
            cases.append(Case(f"overflow, {big_mb} MiB heap", str(path), python, b"heap_overflow.py", big=True))
    cases.append(Case("double free (merged)", str(_cached(workdir, f"{version}-double-free-merged",
                                                             double_free("merged", "0x1000"))),
                      python, b"double_free.py"))
    cases.append(Case("double free (tcache)", str(_cached(workdir, f"{version}-double-free-tcache",
                                                             double_free("tcache", "200"))),
                      python, b"double_free.py"))
    lib = build_libcrash(workdir / "lib")
    overflow = _cached(workdir, f"{version}-heap-prev", lambda run: make_core(run, python, "heap-prev", libcrash=lib))
    cases.append(Case("overflow (heap-prev)", str(overflow), python, A.EXPECT))
    return cases


def ensure_baseline(ref: str, workdir: Path) -> tuple[str | None, str]:
    """The package of git ref ``ref`` of this checkout, unpacked from its wheel (built with the bench wheel venv's
    pip, dependencies from that venv) into ``workdir/baseline-SHA``; or None and why."""
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        return None, proc.stderr.strip()
    sha = proc.stdout.strip()
    site = workdir / f"baseline-{sha[:12]}" / "site"
    if (site / "forensics" / "__init__.py").exists():
        return str(site), sha
    base = site.parent
    shutil.rmtree(base, ignore_errors=True)
    (base / "src").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], capture_output=True, timeout=300)
    subprocess.run(["tar", "-x", "-C", str(base / "src")], input=archive.stdout, check=True, timeout=300)
    py = Path(A.forensics_exe()).parent / "python"
    proc = subprocess.run([str(py), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(base / "wheel"),
                           str(base / "src")], capture_output=True, text=True, timeout=600)
    wheel = next((base / "wheel").glob("*.whl"), None)
    if proc.returncode != 0 or wheel is None:
        return None, f"pip wheel failed: {proc.stderr.strip()[-300:]}"
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    subprocess.run([str(py), "-m", "compileall", "-q", str(site / "forensics")], check=True, timeout=600)
    return str(site), sha


def _baseline_command(site: str, core: str) -> list[str]:
    code = (f"import sys; sys.path.insert(0, {site!r}); sys.argv = ['forensics', 'analyze', '--native', '--json', "
            f"{core!r}]; import forensics.cli; forensics.cli.main()")
    return [str(Path(A.forensics_exe()).parent / "python"), "-I", "-c", code]


def bench_case(case: Case, pystack: str | None, repeat: int, timeout: float, workdir: Path,
               baseline: str | None = None) -> None:
    A.read_through(case.path)
    cmds = {"forensics": [A.forensics_exe(), "analyze", "--native", "--json", case.path]}
    if baseline:
        cmds["baseline"] = _baseline_command(baseline, case.path)
    if pystack:
        cmds["pystack"] = [pystack, "core", "--native", case.path, case.python]
    tools = list(cmds)
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    for rep in range(repeat):
        for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
            m = A.measure(cmds[tool], timeout=timeout, out_path=out / f"{tool}.txt", expect=case.expect)
            case.results.setdefault(tool, []).append(m)
            A.log(f"  {case.name:<26} {tool:<9} {m.cpu_s or 0:7.3f}s cpu {m.wall_s:7.3f}s wall "
                  f"{m.peak_tree_mb:6.1f} MB" + ("" if m.ok else f"  NOT OK: {m.note}"))


_PHASE_PROBE = r"""
import json, os, sys, time
core_path, without_frames = sys.argv[1], sys.argv[2] == "1"
pt = time.process_time
t0 = pt()
import forensics.cli, forensics.heap, forensics.pyread, forensics.unwind
t1 = pt()
spent, results = {}, {}


def timed(module, name, key):
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()  # libdw unwinds on a thread of its own: each stage its own thread's CPU
        try:
            results[key] = fn(*args, **kwargs)
            return results[key]
        finally:
            spent[key] = spent.get(key, 0.0) + time.thread_time() - start
    setattr(module, name, wrapper)
    return fn


timed(forensics.unwind, "unwind_core", "unwind")
timed(forensics.pyread, "read_python_stacks", "python_stacks")
read_heap = timed(forensics.heap, "read_heap", "heap")
report = os.dup(1)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
sys.argv = ["forensics", "analyze", "--native", "--json", core_path]
try:
    forensics.cli.main()
except SystemExit:
    pass
sys.stdout.flush()
t2 = pt()
heap = results.get("heap")
out = {"imports": t1 - t0, **spent, "other": t2 - t1 - sum(spent.values()), "analysis": t2 - t0,
       "found_by": heap.corruption.rejected_found_by if heap is not None and heap.corruption else None}
if without_frames:  # the anatomy again, from the stack's words alone (gdb's stacks, no libc6-dbg)
    from forensics.core import open_core

    core = open_core(core_path)
    t3 = pt()
    h = read_heap(core, message=core.abort_message, tid=core.crashed_tid, is_python=True)
    out["heap_without_frames"] = pt() - t3
    out["found_by_without_frames"] = h.corruption.rejected_found_by if h.corruption else None
os.write(report, json.dumps(out).encode())
"""


def phases(case: Case, repeat: int) -> None:
    """Where one analysis' CPU goes, stage by stage, in fresh processes of the wheel's interpreter."""
    python = Path(A.forensics_exe()).parent / "python"
    exe = str(python if python.exists() else sys.executable)
    runs = []
    for _ in range(max(1, repeat)):
        # -I and a neutral cwd: "-c" would put the cwd first on sys.path, and from the checkout that imports the
        # source tree instead of the installed wheel
        proc = subprocess.run([exe, "-I", "-c", _PHASE_PROBE, case.path, "1" if case.big else "0"],
                              capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir())
        if proc.returncode != 0:
            case.phases = {"error": proc.stderr.strip()[-300:]}
            return
        runs.append(json.loads(proc.stdout))
    starts = []
    for _ in range(max(1, repeat)):
        m = A.measure([exe, "-I", "-c", "pass"], timeout=60, out_path=Path(os.devnull), expect=None)
        starts.append(m.cpu_s or 0.0)
    case.phases = {k: statistics.median(r.get(k) or 0.0 for r in runs) for k in PHASES[1:] if k in runs[0]}
    case.phases["start"] = statistics.median(starts)
    case.phases["found_by"] = runs[0].get("found_by")
    case.phases["found_by_without_frames"] = runs[0].get("found_by_without_frames")


def _median(ms, key):
    vals = [getattr(m, key) for m in ms if m.ok and getattr(m, key) is not None]
    return statistics.median(vals) if vals else None


def report(cases: list[Case], settings: dict) -> dict:
    rows = []
    for c in cases:
        f, p, b = c.results.get("forensics", []), c.results.get("pystack", []), c.results.get("baseline", [])
        fc, pc, bc = _median(f, "cpu_s"), _median(p, "cpu_s"), _median(b, "cpu_s")
        rows.append({"core": c.name, "size_mb": round(c.size_mb), "big": c.big,
                     "forensics_cpu_s": fc, "pystack_cpu_s": pc, "baseline_cpu_s": bc,
                     "cpu_ratio": fc / pc if fc and pc else None,
                     "baseline_ratio": bc / pc if bc and pc else None,
                     "forensics_peak_mb": max((m.peak_tree_mb for m in f), default=None),
                     "pystack_peak_mb": max((m.peak_tree_mb for m in p), default=None),
                     "ok": all(m.ok for m in f + p + b), "phases": c.phases})
    big = [r for r in rows if r["big"]]
    small = [r for r in rows if not r["big"]]

    def goal(gid, text, rs, ok):
        if not rs or any(r["cpu_ratio"] is None for r in rs if "ratio" in text):
            return {"id": gid, "text": text, "status": "n/a"}
        return {"id": gid, "text": text, "status": "PASS" if ok(rs) else "MISS"}

    goals = [
        goal("a", f"big cores: analyze --native CPU <= {GOAL_BIG_RATIO}x pystack --native", big,
             lambda rs: all(r["cpu_ratio"] <= GOAL_BIG_RATIO for r in rs)),
        goal("b", f"small cores: analyze --native CPU <= {GOAL_SMALL_RATIO}x pystack --native", small,
             lambda rs: all(r["cpu_ratio"] <= GOAL_SMALL_RATIO for r in rs)),
        goal("c", f"peak memory (process tree) <= {GOAL_PEAK_MB:.0f} MB on every core", rows,
             lambda rs: all((r["forensics_peak_mb"] or 0) <= GOAL_PEAK_MB for r in rs)),
    ]
    return {"settings": settings, "rows": rows, "goals": goals}


def _f(x, spec):
    return format(x, spec) if x is not None else "-"


def print_report(rep: dict) -> None:
    s = rep["settings"]
    print(f"machine: {s['machine']}, load {s['load']}; repeat {s['repeat']}")
    print(f"forensics: {s['forensics']} ({s['forensics_install']}); pystack: {s['pystack']}")
    print("\nCPU, seconds (median; user+system), and peak RSS of the process tree, MB"
          + (f"; baseline: {s['baseline']}" if s.get("baseline") else ""))
    print(f"{'core':<28} {'MB':>6} | {'forensics':>9} {'pystack':>8} {'ratio':>6} | {'baseline':>8} {'ratio':>6} | "
          f"{'f peak':>7} {'p peak':>7}")
    for r in rep["rows"]:
        print(f"{r['core']:<28} {r['size_mb']:>6} | {_f(r['forensics_cpu_s'], '9.3f')} "
              f"{_f(r['pystack_cpu_s'], '8.3f')} {_f(r['cpu_ratio'], '6.2f')} | {_f(r['baseline_cpu_s'], '8.3f')} "
              f"{_f(r['baseline_ratio'], '6.2f')} | {_f(r['forensics_peak_mb'], '7.1f')} "
              f"{_f(r['pystack_peak_mb'], '7.1f')}" + ("" if r["ok"] else "  (a run was not ok)"))
    print("\nWhere an analysis' CPU goes, seconds (median, in-process; start = the interpreter's own)")
    print(f"{'core':<28} " + " ".join(f"{p:>10}" for p in PHASES))
    for r in rep["rows"]:
        ph = r["phases"]
        if "error" in ph:
            print(f"{r['core']:<28} error: {ph['error']}")
            continue
        print(f"{r['core']:<28} " + " ".join(f"{_f(ph.get(p), '10.3f')}" for p in PHASES))
    for r in rep["rows"]:
        ph = r["phases"]
        if ph.get("found_by"):
            print(f"  {r['core']}: the rejected chunk found in {ph['found_by']}"
                  + (f"; without the frames: {ph['found_by_without_frames']}" if ph.get("found_by_without_frames")
                     else ""))
    print("\nGoals")
    for g in rep["goals"]:
        print(f"  ({g['id']}) {g['status']:<4} {g['text']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mb", type=int, default=2304, help="MiB of 4 KiB malloc chunks in the big cores (0: none)")
    ap.add_argument("--big", default=",".join(BIG_KINDS),
                    help=f"which big cores: a comma-separated subset of {', '.join(BIG_KINDS)}")
    ap.add_argument("--baseline", metavar="REF", default=None,
                    help="also measure a wheel of this git ref of the checkout (the code before a change), alternately")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each tool on each core")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--no-phases", action="store_true", help="skip the in-process stage timings")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    problem = core_pattern_problem()
    if problem:
        A.log(f"cannot make cores here: {problem}")
        return 1
    pythons = discover_pythons()
    if not pythons:
        A.log("no CPython interpreters found (tests/pythons.py)")
        return 1
    python = pythons[max(pythons, key=lambda v: tuple(map(int, v.split("."))))]
    pystack, pystack_info = A.ensure_pystack()
    if not pystack:
        A.log(f"pystack unavailable, continuing without it: {pystack_info}")
    A._FORENSICS_EXE, wheel_info = A.ensure_wheel()
    if not A._FORENSICS_EXE:
        A.log(f"cannot install the forensics wheel: {wheel_info}")
        return 1
    if args.workdir is None:
        from forensics.cache import cache_dir

        args.workdir = cache_dir() / "bench" / "heap"
    args.workdir.mkdir(parents=True, exist_ok=True)
    big = tuple(k for k in args.big.split(",") if k) if args.big_mb else ()
    unknown = set(big) - set(BIG_KINDS)
    if unknown:
        A.log(f"unknown big core(s): {', '.join(sorted(unknown))}; choose from {', '.join(BIG_KINDS)}")
        return 2
    baseline, baseline_sha = None, ""
    if args.baseline:
        baseline, why = ensure_baseline(args.baseline, args.workdir)
        baseline_sha = why
        if baseline is None:
            A.log(f"cannot build the baseline {args.baseline}: {why}")
            return 1
    cases = prepare_cores(args.workdir, python, args.big_mb, big)
    for c in cases:
        A.log(f"{c.name}: {c.path} ({c.size_mb:.0f} MB)")
        bench_case(c, pystack, args.repeat, args.timeout, args.workdir, baseline)
        if not args.no_phases:
            phases(c, args.repeat)
    settings = {"machine": f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / (1 << 30):.0f} GiB, "
                           f"{platform.machine()}",
                "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "repeat": args.repeat,
                "forensics": A.forensics_exe(), "forensics_install": wheel_info,
                "pystack": pystack_info if pystack else f"unavailable ({pystack_info})", "python": python,
                "baseline": f"{args.baseline} ({baseline_sha[:12]})" if args.baseline else None}
    rep = report(cases, settings)
    if args.json:
        json.dump(rep, sys.stdout, indent=2)
        print()
    else:
        print_report(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
