"""Benchmark ``forensics core-handler`` against ``zstd -1`` on the same core stream; prints, asserts nothing.

What it measures
----------------
* The core: a real kernel core of ``tests/crashers/exporter.py`` (``heap-prev``) from
  this interpreter, grown to about ``--mb`` MiB (default 1024) of written Python heap with
  ``EXPORTER_BALLAST_MB``; kept in ``--workdir`` (default ``bench/capture/`` in the forensics cache)
  and reused.
* Both tools read the core through a pipe (``cat CORE |``), as the kernel hands it over,
  and write their output to a file in the work directory, alternately, ``--repeat`` times
  (median).  The core is read once first so both find it in the page cache.

  - ``zstd -1 -q -c > out.zst`` (Debian's zstd binary)
  - ``forensics core-handler DIR PID TID 6 TIME unlimited``, with PID a live process
    (so the handler also reads /proc, opens and stores the mapped objects in the build-id
    store: the metadata work it does for a real crash; the store is warm after the first run,
    as on a node after the first crash)
* Throughput: core bytes / wall seconds (spawn to exit).  Peak memory: ``ru_maxrss`` of
  the handler process (``wait4``), MiB.

Goals (from the issue; printed as PASS/MISS): handler throughput at least 0.8 of
``zstd -1``; handler peak memory constant and under 64 MB (also checked at ``--mb``/4 to
show it does not grow with the core).

Usage, from the repository root, as root::

    .venv/bin/python bench/capture.py                 # 1 GiB core, 3 repetitions
    .venv/bin/python bench/capture.py --mb 256 --repeat 1
"""
from __future__ import annotations

import argparse
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

FORENSICS = Path(sys.executable).parent / "forensics"
HANDLER_CODE = "from forensics.cli import main\nmain()\n"


def make_core(workdir: Path, mb: int) -> Path:
    from tests.crashers.make_core import make_core as mk

    target = workdir / f"core-{mb}"
    if target.exists():
        return target
    os.environ["EXPORTER_BALLAST_MB"] = str(mb)
    core = mk(workdir, sys.executable, "heap-prev", timeout=600)
    os.replace(core, target)
    return target


def _wait(p: subprocess.Popen) -> tuple[int, int]:
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, ru.ru_maxrss  # KiB


def run_zstd(core: Path, out: Path) -> tuple[float, int]:
    t = time.perf_counter()
    cat = subprocess.Popen(["cat", str(core)], stdout=subprocess.PIPE)
    with open(out, "wb") as f:
        z = subprocess.Popen(["zstd", "-1", "-q", "-c"], stdin=cat.stdout, stdout=f)
        cat.stdout.close()
        rc, rss = _wait(z)
    cat.wait()
    assert rc == 0
    return time.perf_counter() - t, rss


def run_handler(core: Path, core_dir: Path, live_pid: int, program: list[str]) -> tuple[float, int, dict]:
    import json

    t = time.perf_counter()
    cat = subprocess.Popen(["cat", str(core)], stdout=subprocess.PIPE)
    h = subprocess.Popen([*program, "core-handler", str(core_dir), str(live_pid), str(live_pid), "6",
                          str(int(time.time())), "18446744073709551615", "--min-free", "0", "--loop-limit", "100000"],
                         stdin=cat.stdout, env={}, cwd="/")
    cat.stdout.close()
    rc, rss = _wait(h)
    cat.wait()
    dt = time.perf_counter() - t
    newest = max((core_dir / "crashes").iterdir(), key=lambda p: p.stat().st_mtime)
    meta = json.loads((newest / "metadata.json").read_text())
    shutil.rmtree(newest)  # keep the disk bounded between repetitions
    return dt, rss, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=None,
                    help="kept for the next run (default: bench/capture/ in the forensics cache)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the handler reads /proc/PID/map_files of another process")
    if args.workdir is None:
        from forensics.cache import cache_dir

        args.workdir = cache_dir() / "bench" / "capture"
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    wrapper = work / "forensics"
    wrapper.write_text(f"#!{sys.executable}\n{HANDLER_CODE}")
    wrapper.chmod(0o755)
    program = [str(wrapper)]
    live = subprocess.Popen([sys.executable, "-c", "import ctypes, time; time.sleep(3600)"])
    try:
        results = {}
        for mb in sorted({args.mb, max(args.mb // 4, 16)}):
            core = make_core(work, mb)
            size = core.stat().st_size
            with open(core, "rb") as f:  # page cache
                while f.read(8 << 20):
                    pass
            core_dir = Path(tempfile.mkdtemp(prefix="cores-", dir=work))
            run_handler(core, core_dir, live.pid, program)  # warm the object store, as after a node's first crash
            z_times, h_times, h_rss = [], [], []
            meta = {}
            for i in range(args.repeat):
                order = ("z", "h") if i % 2 == 0 else ("h", "z")
                for tool in order:
                    if tool == "z":
                        dt, _ = run_zstd(core, work / "out.zst")
                        z_times.append(dt)
                    else:
                        dt, rss, meta = run_handler(core, core_dir, live.pid, program)
                        h_times.append(dt)
                        h_rss.append(rss)
            zt, ht = statistics.median(z_times), statistics.median(h_times)
            zsize = (work / "out.zst").stat().st_size
            results[mb] = (size, zt, ht, max(h_rss), zsize, meta["core"]["bytes_compressed"])
            shutil.rmtree(core_dir)
        print(f"{'core':>12} {'zstd -1':>12} {'handler':>12} {'ratio':>7} {'handler RSS':>12} {'zstd out':>10} "
              f"{'handler out':>12}")
        for _mb, (size, zt, ht, rss, zs, hs) in sorted(results.items()):
            print(f"{size / 2**20:9.0f}MiB {size / zt / 2**20:8.0f}MiB/s {size / ht / 2**20:8.0f}MiB/s "
                  f"{zt / ht:7.2f} {rss / 1024:9.1f}MiB {zs / 2**20:8.1f}MiB {hs / 2**20:10.1f}MiB")
        size, zt, ht, rss, _, _ = results[args.mb]
        print(f"throughput goal (>= 0.8 of zstd -1): {'PASS' if zt / ht >= 0.8 else 'MISS'} ({zt / ht:.2f})")
        rss_all = [r[3] for r in results.values()]
        print(f"memory goal (< 64 MB, constant): {'PASS' if max(rss_all) < 64 * 1024 else 'MISS'} "
              f"({', '.join(f'{r / 1024:.1f}' for r in rss_all)} MiB)")
    finally:
        live.kill()
        live.wait()


if __name__ == "__main__":
    main()
