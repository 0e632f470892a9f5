"""Benchmark: `forensics canary` scrape rate against wrk and a curl loop, on one static exposition.

Goal (issue "Fleet view, mitigation guard and canary verification"): at least 1,000 scrapes/s with 50
concurrent requests on this 2-core machine.  The three clients hit the same loopback endpoint
(tests/expo_server.py, a threaded HTTP/1.1 keep-alive server) one after the other, alternating
over --repeat rounds; the script prints each client's median rate and the ratios.  Nothing is
asserted: targets are printed as PASS/MISS.

    .venv/bin/python bench/canary.py [--seconds 5] [--concurrency 50] [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_server(tmp: Path) -> tuple[subprocess.Popen, str]:
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, "-m", "tests.expo_server", str(port_file), "--nan"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("bench: the exposition server did not start")
        time.sleep(0.02)
    return proc, f"http://127.0.0.1:{port_file.read_text()}/metrics"


def run_canary(url: str, seconds: float, concurrency: int) -> float:
    from forensics.canary import run_canary as soak

    r = soak(url, requests=10_000_000, concurrency=concurrency, duration=seconds)
    return r.rate


def run_wrk(url: str, seconds: float, concurrency: int) -> float | None:
    if not shutil.which("wrk"):
        return None
    out = subprocess.run(["wrk", "-t2", f"-c{concurrency}", f"-d{max(1, int(seconds))}s", url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return float(m.group(1)) if m else None


def run_curl(url: str, seconds: float) -> float | None:
    if not shutil.which("curl"):
        return None
    n = 0
    deadline = time.monotonic() + seconds
    t0 = time.perf_counter()
    while time.monotonic() < deadline:
        subprocess.run(["curl", "-s", "-o", "/dev/null", url], check=False, timeout=30)
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rates: dict[str, list[float]] = {"forensics canary": [], "wrk": [], "curl loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(Path(tmp))
        try:
            for _ in range(a.repeat):
                rates["forensics canary"].append(run_canary(url, a.seconds, a.concurrency))
                w = run_wrk(url, a.seconds, a.concurrency)
                if w is not None:
                    rates["wrk"].append(w)
                c = run_curl(url, min(a.seconds, 3.0))
                if c is not None:
                    rates["curl loop"].append(c)
        finally:
            proc.kill()
            proc.wait()
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    ours = med["forensics canary"]
    result = {
        "url_kind": "static exposition, 791 bytes, threaded Python HTTP/1.1 server on 127.0.0.1",
        "concurrency": a.concurrency, "seconds": a.seconds, "repeat": a.repeat, "median_rate_per_s": med,
        "ratio_to_wrk": ours / med["wrk"] if "wrk" in med else None,
        "ratio_to_curl_loop": ours / med["curl loop"] if "curl loop" in med else None,
        "target_1000_per_s": "PASS" if ours >= 1000 else "MISS",
    }
    if a.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    print(f"endpoint: {result['url_kind']}; concurrency {a.concurrency}; {a.repeat} rounds of {a.seconds:g}s")
    for k, v in med.items():
        print(f"  {k:<18} {v:9.0f} scrapes/s (median)")
    if result["ratio_to_wrk"] is not None:
        print(f"  canary / wrk        {result['ratio_to_wrk']:.2f}  (wrk is C; both limited by the Python server)")
    if result["ratio_to_curl_loop"] is not None:
        print(f"  canary / curl loop  {result['ratio_to_curl_loop']:.1f}")
    print(f"  target >= 1000 scrapes/s at concurrency {a.concurrency}: {result['target_1000_per_s']}")


if __name__ == "__main__":
    main()
