"""What an AArch64 core costs ``forensics analyze`` on this x86_64 machine, against its x86_64 twin.

Prints figures and ratios, asserts nothing.

* Cores: ``tests/crashers/exporter.py`` crashed in native code (``segv``) and aborting in glibc
  (``heap-prev``), once under qemu-user in the cached arm64 roots (tests/arm64.py: bookworm's
  CPython 3.11, unstable's 3.14; qemu's default CPU, with pointer authentication) and once natively:
  the twin of the bookworm core is the same program under this machine's ``/usr/bin/python3.11``
  (Debian bookworm's build of the same CPython), the twin of the unstable core the same program in
  the amd64 unstable root of the tests (tests/conftest.py's SID_PACKAGES). Cores are kept in
  ``--workdir`` (default ``bench/arm64/`` in the forensics cache) and reused.
* The command: ``forensics analyze --json --sysroot ROOT CORE`` (the defaults: libdw's native
  stacks, the direct Python reader, the heap anatomy of a heap corruption), the aarch64 core's
  ``ROOT`` the arm64 root plus arm64/libcrash.so, the twin's its root (or none for this machine's).
* CPU: user + system of the process from ``wait4``; peak: its ``ru_maxrss``; median of ``--repeat``
  runs after one warm-up run (the page cache and forensics' debug-file cache are warm for both).
* A twin needs ``kernel.core_pattern`` to write into the process's cwd (the tests' rule): otherwise its
  row says why and only the aarch64 figures are printed.

Usage: ``.venv/bin/python bench/arm64.py [--repeat 5] [--workdir DIR]``
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from forensics.cache import cache_dir  # noqa: E402
from tests.arm64 import (  # noqa: E402
    analysis_sysroot,
    build_guest_libcrash,
    guest_problem,
    guest_python,
    guest_root,
    make_guest_core,
)
from tests.crashers.make_core import core_pattern_problem, make_core  # noqa: E402
from tests.roots import RootUnavailable, build_root  # noqa: E402

SID_PACKAGES = ("python3.13", "python3.13-dbg", "python3.14", "python3.14-dbg", "python3.15", "python3.15-dbg",
                "libc6-dbg")
CASES = (("bookworm", "segv"), ("bookworm", "heap-prev"), ("sid", "segv"))


def measure(cmd: list[str], repeat: int) -> tuple[float, float, int]:
    """(median CPU seconds, median wall seconds, median peak RSS bytes) of ``repeat`` runs after a warm-up."""
    cpu, wall, rss = [], [], []
    for i in range(repeat + 1):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 4):
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
        if i:
            wall.append(time.perf_counter() - start)
            cpu.append(usage.ru_utime + usage.ru_stime)
            rss.append(usage.ru_maxrss * 1024)
    return statistics.median(cpu), statistics.median(wall), int(statistics.median(rss))


def _cached(path: Path, make) -> Path:
    """A core kept at ``path`` between runs (made once by ``make``)."""
    if path.is_file():
        return path
    core = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(core, path)
    return path


def arm64_core(work: Path, suite: str, scenario: str) -> tuple[Path, Path]:
    root = guest_root(suite)
    lib = build_guest_libcrash(work)
    sysroot = work / f"sysroot-{suite}"
    if not sysroot.is_dir():
        analysis_sysroot(root, sysroot, [lib])
    core = _cached(work / "cores" / f"arm64-{suite}-{scenario}.core",
                   lambda: make_guest_core(work, root, guest_python(suite), scenario))
    return core, sysroot


def x86_twin(work: Path, suite: str, scenario: str) -> tuple[Path | None, str | None, str]:
    """(the twin core or None, its sysroot, why there is none)."""
    if suite == "bookworm":
        python, root = "/usr/bin/python3.11", None
        if not os.path.exists(python):
            return None, None, "no /usr/bin/python3.11 here"
    else:
        try:
            root = build_root("sid", SID_PACKAGES)
        except RootUnavailable as e:
            return None, None, str(e)
        python = "/usr/bin/python3.14"
    path = work / "cores" / f"x86_64-{suite}-{scenario}.core"
    if not path.is_file():
        problem = core_pattern_problem()
        if problem:
            return None, None, problem
    core = _cached(path, lambda: make_core(work / "x86", python, scenario, root=root))
    return core, (str(root) if root else None), ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=cache_dir() / "bench" / "arm64")
    args = ap.parse_args()
    problem = guest_problem()
    if problem:
        print(f"no arm64 guests here: {problem}")
        return 1
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    forensics = [sys.executable, "-m", "forensics", "analyze", "--json"]
    print(f"{'core':28} {'size MiB':>9} {'CPU s':>7} {'wall s':>7} {'peak MiB':>9}   aarch64/x86_64 CPU, peak")
    for suite, scenario in CASES:
        core, sysroot = arm64_core(work, suite, scenario)
        a = measure([*forensics, "--sysroot", str(sysroot), str(core)], args.repeat)
        print(f"{f'aarch64 {suite} {scenario}':28} {core.stat().st_size / 2**20:9.1f} {a[0]:7.2f} {a[1]:7.2f} "
              f"{a[2] / 2**20:9.1f}")
        twin, twin_root, why = x86_twin(work, suite, scenario)
        if twin is None:
            print(f"{f'x86_64 {suite} {scenario}':28} n/a: {why}")
            continue
        cmd = [*forensics, *(["--sysroot", twin_root] if twin_root else []), str(twin)]
        x = measure(cmd, args.repeat)
        print(f"{f'x86_64 {suite} {scenario}':28} {twin.stat().st_size / 2**20:9.1f} {x[0]:7.2f} {x[1]:7.2f} "
              f"{x[2] / 2**20:9.1f}   {a[0] / x[0]:.2f}x, {a[2] / x[2]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
