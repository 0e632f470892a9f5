"""Bench: what one crash costs in ``forensics core-handler``, kept and dropped; prints, asserts nothing.

What it measures
----------------
* The core: a real kernel core of ``tests/crashers/exporter.py`` (``heap-prev``, a few MiB) from this
  interpreter, kept in ``--workdir`` (default ``bench/handler/`` in the forensics cache) and reused.
* The process the handler reads: a live Python of this interpreter that imported what the exporter
  imports (ctypes, threading) and json, ssl, sqlite3 (their extension modules mapped), standing in for the
  dying one as ``bench/capture.py`` does: the kernel keeps a dying process readable in /proc the same way.
* Three kinds of crash, one after the other, ``--crashes`` rounds:

  - ``kept``: a core the handler keeps (the object store already holds the objects, as on a node after
    its first crash);
  - ``loop``: a core dropped by the crash-loop limit (metadata only), as the 6th and later cores of a
    crash-looping container are;
  - ``rlimit``: a core dropped because RLIMIT_CORE is under a page (``%c`` 0): every crash on the node
    of a process that was not opted in goes through the handler this way.

* For each crash, as the kernel runs the handler (absolute path, no environment, cwd ``/``, the core on a
  pipe as its stdin):

  - ``waited``: from the start of the handler to the moment it lets go of the pipe (its stdin becomes
    ``/dev/null``, polled every millisecond): what the dying process waits for (with
    ``kernel.core_pipe_limit`` > 0 the kernel holds it until then; with 0, until the core is read);
  - ``whole``: from the start to the handler's exit.

* Beside them, the named tools on the same core through a pipe: ``zstd -1 -q`` to a file (the least that
  keeps a core) and ``cat > /dev/null`` (the least a handler that keeps nothing must do: drain the pipe).
  Ratios are the handler's waited time over these.

Usage, from the repository root, as root, with kernel.core_pattern a plain file name (``core``)::

    .venv/bin/python bench/handler.py                # 10 rounds
    .venv/bin/python bench/handler.py --crashes 20 --json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FORENSICS = str(Path(sys.executable).parent / "forensics")
LIVE = "import ctypes, json, sqlite3, ssl, threading, time; print('ready', flush=True); time.sleep(3600)"


def make_core(workdir: Path) -> Path:
    from tests.crashers.make_core import make_core as mk

    target = workdir / "core-heap-prev"
    if not target.exists():
        os.environ.pop("EXPORTER_BALLAST_MB", None)
        os.replace(mk(workdir, sys.executable, "heap-prev", timeout=120), target)
    return target


def run_handler(core_dir: Path, core: Path, pid: int, rlimit: str, extra: list[str]) -> tuple[float, float]:
    """(waited, whole) seconds of one handler run fed ``core`` through a pipe."""
    cmd = [FORENSICS, "core-handler", str(core_dir), str(pid), str(pid), "6", str(int(time.time())), rlimit,
           "--min-free", "0", *extra]
    data = core.read_bytes()
    r, w = os.pipe()
    t0 = time.perf_counter()
    h = subprocess.Popen(cmd, stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={}, cwd="/")
    os.close(r)
    fd0 = f"/proc/{h.pid}/fd/0"
    with open(w, "wb", closefd=True) as pipe:  # blocks while the handler does not read, as the kernel does
        pipe.write(data)
    released = None
    while released is None and h.poll() is None:
        try:
            if os.readlink(fd0) == "/dev/null":
                released = time.perf_counter()
        except OSError:  # between the handler's exit and its reaping
            pass
        time.sleep(0.001)
    h.wait()
    done = time.perf_counter()
    err = h.stderr.read().decode(errors="replace")
    h.stderr.close()
    if h.returncode:
        raise SystemExit(f"handler failed ({h.returncode}): {err[-400:]}")
    return ((released or done) - t0), done - t0


def run_tool(argv: list[str], core: Path, out: Path) -> float:
    data = core.read_bytes()
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=f)
        p.stdin.write(data)
        p.stdin.close()
        p.wait()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crashes", type=int, default=10, help="rounds of (kept, loop, rlimit, zstd, cat)")
    ap.add_argument("--workdir", default=None, help="the core, kept for the next run (default: in the cache)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the handler reads /proc/PID/map_files of another process")
    from forensics.cache import cache_dir

    work = Path(a.workdir) if a.workdir else cache_dir() / "bench" / "handler"
    work.mkdir(parents=True, exist_ok=True)
    core = make_core(work)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    live = subprocess.Popen([sys.executable, "-c", LIVE], stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline().strip() == b"ready"
        kept, loop = run / "kept", run / "loop"
        run_handler(kept, core, live.pid, "unlimited", ["--loop-limit", "100000"])  # the store warm
        run_handler(loop, core, live.pid, "unlimited", ["--loop-limit", "0"])
        times: dict[str, list[tuple[float, float]]] = {"kept": [], "loop": [], "rlimit": []}
        tools: dict[str, list[float]] = {"zstd -1": [], "cat": []}
        for i in range(a.crashes):
            order = ["kept", "loop", "rlimit", "zstd -1", "cat"]
            order = order[i % len(order):] + order[:i % len(order)]  # each first in turn: drift weighs alike
            for what in order:
                if what == "kept":
                    times[what].append(run_handler(kept, core, live.pid, "unlimited", ["--loop-limit", "100000"]))
                    for c in (kept / "crashes").iterdir():
                        shutil.rmtree(c)  # the disk bounded; the store stays warm
                elif what == "loop":
                    times[what].append(run_handler(loop, core, live.pid, "unlimited", ["--loop-limit", "0"]))
                elif what == "rlimit":
                    times[what].append(run_handler(loop, core, live.pid, "0", []))
                elif what == "zstd -1":
                    tools[what].append(run_tool(["zstd", "-1", "-q", "-c"], core, run / "out.zst"))
                else:
                    tools[what].append(run_tool(["cat"], core, Path(os.devnull)))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(t for _, t in v)) for k, v in times.items()}
        tmed = {k: statistics.median(v) for k, v in tools.items()}
        doc = {"crashes": a.crashes, "core_bytes": core.stat().st_size, "load": os.getloadavg()[0],
               "median_s": {k: {"waited": w, "whole": t} for k, (w, t) in med.items()}, "tools_s": tmed,
               "waited_over_zstd": {k: med[k][0] / tmed["zstd -1"] for k in med},
               "waited_over_cat": {k: med[k][0] / tmed["cat"] for k in med}}
        if a.json:
            print(json.dumps(doc, indent=2))
            return
        print(f"core handler, {a.crashes} rounds, a {doc['core_bytes']:,}-byte core, median per crash "
              f"(load {doc['load']:.2f}):")
        print(f"  {'':8} {'waited':>9} {'whole':>9} {'waited/zstd -1':>15} {'waited/cat':>11}")
        for k, (w, t) in med.items():
            print(f"  {k:8} {w * 1000:7.1f}ms {t * 1000:7.1f}ms {w / tmed['zstd -1']:15.2f} {w / tmed['cat']:11.2f}")
        for k, v in tmed.items():
            print(f"  {k:8} {v * 1000:7.1f}ms")
    finally:
        live.kill()
        live.wait()
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()
