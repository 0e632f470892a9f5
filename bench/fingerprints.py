"""The batch over the suite's crashes: how many bugs ``forensics analyze DIR`` finds, against how many there are.

Prints counts, asserts nothing.

What it runs
------------
* Crashes (each one bug, whatever interpreter runs it): ``tests/crashers/same_bug.py`` in each of its modes --
  a method on a thread, a C extension of the standard library, a C assertion, a native library's own thread in
  one of two functions (two bugs), a NULL write (once more with ``PYTHONFAULTHANDLER=1``: the same bug), a fault
  in a SIGUSR1 handler, one buffer freed twice at two sizes (one bug, two of glibc's messages), two functions
  behind one Python dispatcher (two bugs) -- and ``tests/crashers/exporter.py``'s ``heap-prev`` (glibc aborts in
  free) and ``segv``: 14 crashes of 12 bugs.
* Interpreters: every CPython ``tests/pythons.py`` finds here (3.8-3.13) and Debian unstable's 3.13-3.15,
  release and debug builds, in the sid root of ``tests/roots.py`` (when it can be built or is cached).
* Cores are made once into ``--workdir`` (default ``bench/fingerprints/`` in the forensics cache) and reused.
* Batches (``forensics analyze --json DIR`` of this checkout's ``.venv``, ``-j 2``): every core in one directory
  without ``--sysroot`` (the usual case: a core read on another machine, without the crashed one's libraries),
  then the same cores with their libraries -- this machine's cores as they are, the sid root's with
  ``--sysroot ROOT`` (two batches: one sysroot each; the bench joins their fingerprints).

For each batch: the bugs it says it found (``found.bugs``, its distinct fingerprints), the fingerprints the previous
definition gives (``found.fingerprints_v3``), the cores analyzed and partial, and -- from each core's fingerprint
and the bug the bench crashed -- the bugs split into more than one fingerprint and the fingerprints shared by
two bugs.

Usage, from the repository root::

    .venv/bin/python bench/fingerprints.py           # ~130 cores the first time (a few minutes on 2 CPUs)
    .venv/bin/python bench/fingerprints.py --json    # one JSON document on stdout
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forensics.cache import cache_dir  # noqa: E402
from tests.crashers.make_core import HERE as CRASHERS  # noqa: E402
from tests.crashers.make_core import build_libcrash, core_pattern_problem, crash_for_core, make_core  # noqa: E402
from tests.pythons import discover_pythons  # noqa: E402
from tests.roots import RootUnavailable, build_root  # noqa: E402

__all__ = ["CRASHES", "main"]

SAME_BUG = CRASHERS / "same_bug.py"
SID_BUILDS = ("3.13", "3.13d", "3.14", "3.14d", "3.15", "3.15d")
#: crash name -> (the bug it is, how it is made: same_bug.py's mode or exporter.py's scenario, faulthandler)
CRASHES = {
    "thread-method": ("thread-method", ("same_bug", "thread-method", False)),
    "c-extension": ("c-extension", ("same_bug", "c-extension", False)),
    "assert": ("assert", ("same_bug", "assert", False)),
    "native-a": ("native-a", ("same_bug", "native-a", False)),
    "native-b": ("native-b", ("same_bug", "native-b", False)),
    "null": ("null", ("same_bug", "null", False)),
    "null-faulthandler": ("null", ("same_bug", "null", True)),
    "usr1-handler": ("usr1-handler", ("same_bug", "usr1-handler", False)),
    "double-free-small": ("double-free", ("same_bug", "double-free-small", False)),
    "double-free-large": ("double-free", ("same_bug", "double-free-large", False)),
    "dispatch-sum": ("dispatch-sum", ("same_bug", "dispatch-sum", False)),
    "dispatch-count": ("dispatch-count", ("same_bug", "dispatch-count", False)),
    "heap-prev": ("heap-prev", ("exporter", "heap-prev", False)),
    "segv": ("segv", ("exporter", "segv", False)),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def interpreters() -> tuple[list[tuple[str, str, Path | None]], str]:
    """(key, python, root) of every interpreter here and in the sid root; why the sid root is missing ("" if not)."""
    out: list[tuple[str, str, Path | None]] = [(k, p, None) for k, p in discover_pythons().items()]
    try:
        from tests.conftest import SID_PACKAGES

        root = build_root("sid", SID_PACKAGES)
    except (RootUnavailable, ImportError) as e:
        return out, f"no sid root: {e}"
    return out + [(f"sid-{b}", f"/usr/bin/python{b}", root) for b in SID_BUILDS], ""


def make_cores(workdir: Path, interps: list[tuple[str, str, Path | None]], *, make: bool = True) -> list[dict]:
    """Every crash under every interpreter, made once (kept in ``workdir/cores``): a row per core (``make``
    false: the cores made before only)."""
    cores = workdir / "cores"
    cores.mkdir(parents=True, exist_ok=True)
    lib = build_libcrash(workdir / "lib")
    rows = []
    for key, python, root in interps:
        for crash, (bug, (program, mode, faulthandler)) in CRASHES.items():
            dest = cores / f"{key}--{crash}.core"
            if not dest.exists():
                if not make:
                    continue
                log(f"making core: {crash} under {key}")
                try:
                    if program == "exporter":
                        core = make_core(workdir, python, mode, libcrash=lib, root=root)
                    else:
                        run = Path(tempfile.mkdtemp(prefix=f"run-{crash}-", dir=workdir))
                        env = {"PYTHONFAULTHANDLER": "1" if faulthandler else ""}
                        core = crash_for_core([python, str(SAME_BUG), str(lib), mode], run, env=env, root=root,
                                              binds=(SAME_BUG, lib))
                except Exception as e:  # noqa: BLE001 - a crash that would not make a core is counted, not fatal
                    log(f"  no core: {e}")
                    continue
                os.replace(core, dest)
            rows.append({"core": str(dest), "interpreter": key, "crash": crash, "bug": bug,
                         "root": str(root) if root else None})
    return rows


def run_batch(forensics: str, directory: Path, sysroot: str | None) -> dict:
    cmd = [forensics, "analyze", "--json", "-j", "2", *(["--sysroot", sysroot] if sysroot else []), str(directory)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if not p.stdout.strip():
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def judge(docs: list[dict], bug_of: dict[str, str]) -> dict:
    """The counts of one batch (or of batches joined): what the batch says and what the bench knows."""
    by_bug: dict[str, set[str]] = defaultdict(set)
    by_fp: dict[str, set[str]] = defaultdict(set)
    previous: set[str] = set()
    analyzed = partial = 0
    for doc in docs:
        for c in doc["cores"]:
            name = os.path.basename(c["path"])
            if c["fingerprint"] is None:
                continue
            analyzed += 1
            partial += c["partial"] is not None
            by_bug[bug_of[name]].add(c["fingerprint"])
            by_fp[c["fingerprint"]].add(bug_of[name])
            previous.add(c["fingerprint_v3"])
    return {
        "cores_analyzed": analyzed, "partial": partial, "bugs_crashed": len(set(bug_of.values())),
        "bugs_found": len(by_fp),  # distinct fingerprints over the batches (one batch: its found.bugs)
        "fingerprints_v3_found": len(previous),  # the previous definition's, over the batches
        "said_found": [d["found"] for d in docs],
        "split": {b: len(fps) for b, fps in sorted(by_bug.items()) if len(fps) > 1},
        "shared": {fp: sorted(bugs) for fp, bugs in sorted(by_fp.items()) if len(bugs) > 1},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None, help="cores, reused (default: bench/fingerprints/ in the "
                                                                "forensics cache)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    workdir = args.workdir or cache_dir() / "bench" / "fingerprints"
    interps, why = interpreters()
    if why:
        log(why)
    from tests.conftest import CorePatternLock

    lock = CorePatternLock()  # shared, as a test session holds it: no test points core_pattern elsewhere meanwhile
    try:
        problem = core_pattern_problem()
        if problem:
            log(f"cannot make cores here ({problem}): the batches read the cores made before")
        rows = make_cores(workdir, interps, make=not problem)
        if not rows:
            return 2
    finally:
        lock.close()
    forensics = str(REPO / ".venv" / "bin" / "forensics")
    bug_of = {os.path.basename(r["core"]): r["bug"] for r in rows}
    with tempfile.TemporaryDirectory(prefix="batch-", dir=workdir) as tmp:
        dirs = {"all": Path(tmp) / "all", "host": Path(tmp) / "host", "sid": Path(tmp) / "sid"}
        for d in dirs.values():
            d.mkdir()
        for r in rows:
            name = os.path.basename(r["core"])
            os.link(r["core"], dirs["all"] / name)
            os.link(r["core"], dirs["sid" if r["root"] else "host"] / name)
        root = next((r["root"] for r in rows if r["root"]), None)
        log(f"batch of {len(rows)} cores without --sysroot")
        bare = run_batch(forensics, dirs["all"], None)
        log("batches with the crashed machines' libraries (this machine's cores; the sid root's with --sysroot)")
        with_libs = [run_batch(forensics, dirs["host"], None)] + ([run_batch(forensics, dirs["sid"], root)]
                                                                    if root else [])
    report = {"interpreters": [k for k, _, _ in interps], "crashes": list(CRASHES), "cores": len(rows),
              "without_sysroot": judge([bare], bug_of), "with_libraries": judge(with_libs, bug_of)}
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"{report['cores']} cores: {len(CRASHES)} crashes of {len(set(b for b, _ in CRASHES.values()))} bugs "
          f"under {len(interps)} interpreters ({', '.join(report['interpreters'])})")
    for title, key in (("one batch, no --sysroot", "without_sysroot"),
                       ("with their libraries (host batch + sid batch --sysroot, joined)", "with_libraries")):
        j = report[key]
        said = "; ".join(f"batch says: {f['bugs']} bugs, {f['fingerprints_v3']} fingerprints by the previous "
                         "definition" for f in j["said_found"])
        print(f"\n{title}: {j['cores_analyzed']} cores analyzed ({j['partial']} partial)\n  {said}\n"
              f"  bugs crashed {j['bugs_crashed']}, fingerprints found {j['bugs_found']} "
              f"(by the previous definition: {j['fingerprints_v3_found']})")
        for bug, n in j["split"].items():
            print(f"  split: {bug} has {n} fingerprints")
        for fp, bugs in j["shared"].items():
            print(f"  shared: fingerprint {fp} stands for {', '.join(bugs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
