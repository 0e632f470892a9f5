"""Start-up cost of the command line: ``forensics --help``, ``forensics analyze --help`` and analyze's click-free
fast path (``forensics analyze MISSING``: parsed without click, the input checked, one error line), as CPU time
(user + system of the child, ``os.wait4``), median of interleaved runs, against another tree of the package.

    .venv/bin/python bench/startup.py --src /tmp/before [--runs 25] [--json]

``--src DIR`` is a tree holding another ``forensics`` package (``git archive REF forensics | tar -x -C DIR``);
each tree runs as ``python -c 'sys.path.insert(0, TREE); from forensics.cli import main; main()' ARGS`` with
this interpreter, byte-compiled first, so the two differ only in their code.  It prints each command's median
for each tree and the ratio to the first ``--src``.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {
    "forensics --help": ["--help"],
    "forensics analyze --help": ["analyze", "--help"],
    "forensics analyze MISSING (fast path)": ["analyze", "/nonexistent/core.1"],
}


def cpu_of(tree: str, args: list[str]) -> float:
    """CPU seconds (user + system) of one run of the command line from ``tree``."""
    code = f"import sys; sys.path.insert(0, {tree!r}); from forensics.cli import main; main()"
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    _, _status, usage = os.wait4(p.pid, 0)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", action="append", default=[], help="another tree holding the forensics package")
    ap.add_argument("--runs", type=int, default=25, help="runs per command per tree (interleaved)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON document")
    a = ap.parse_args(argv)
    trees = [*a.src, str(HERE)]
    for tree in trees:
        compileall.compile_dir(os.path.join(tree, "forensics"), quiet=1)
    times: dict[str, dict[str, list[float]]] = {name: {t: [] for t in trees} for name in COMMANDS}
    for _ in range(a.runs):
        for name, args in COMMANDS.items():
            for tree in trees:
                times[name][tree].append(cpu_of(tree, args))
    result = {name: {t: statistics.median(v) for t, v in per.items()} for name, per in times.items()}
    if a.json:
        print(json.dumps({"runs": a.runs, "median_cpu_s": result}, indent=1, sort_keys=True))
        return 0
    base = trees[0]
    print(f"CPU time, median of {a.runs} interleaved runs; ratio to {base}")
    for name, per in result.items():
        print(name)
        for tree, t in per.items():
            print(f"  {t * 1000:7.1f} ms  {t / per[base]:.3f}x  {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
