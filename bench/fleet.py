"""Bench: `forensics fleet --prometheus` on a 10,000-node fleet, side by side with `fleet --from` on the same fleet.

A real Prometheus (Debian's, tests/prometheus_env.py) scrapes kube-state-metrics' exposition of
tests/fleetgen.py's big fleet (10,000 nodes, one exporter pod each: ~90,000 series) served on
127.0.0.1; then both commands run as processes of this venv's `forensics`, each timed (wall) and
measured (peak RSS of the process, by GNU time). Targets (issue #17): --prometheus under 2 s and
100 MB. Beside them, Prometheus' own CPU time while --prometheus ran (its process's, from /proc; the scrapes'
share is in it): the floor of --prometheus's wall time on this many cores, whatever the client does, and a
figure that moves less than wall time on a shared machine. Prints a table, or --json.

    .venv/bin/python bench/fleet.py [--nodes 10000] [--repeat 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fleetgen import big_fleet  # noqa: E402
from tests.ksm_exposition import ksm_text, serve_ksm  # noqa: E402
from tests.prometheus_env import prometheus_binary  # noqa: E402

FORENSICS = str(Path(sys.executable).parent / "forensics")


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, exit status) of one run.

    The peak comes from GNU time (%M) when it is there: wait4's ru_maxrss of a child forked from this
    process counts this process's own memory (the fleet it generated) from before the exec.
    """
    gnu_time = shutil.which("time") if os.path.exists("/usr/bin/time") else None
    t = time.perf_counter()
    p = subprocess.run(([gnu_time, "-f", "%M"] if gnu_time else []) + cmd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t
    peak = float(p.stderr.strip().splitlines()[-1]) / 1024 if gnu_time else float("nan")
    return seconds, peak, p.returncode


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Prometheus': what its query evaluation cost, whatever the machine's load)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forensics-bench-fleet-"))
    prom = None
    srv = None
    try:
        pods, nodes = big_fleet(a.nodes)
        (work / "pods.json").write_text(json.dumps(pods))
        (work / "nodes.json").write_text(json.dumps(nodes))
        srv, port = serve_ksm(ksm_text(pods, nodes))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            pport = s.getsockname()[1]
        (work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 5s\n"
            "scrape_configs:\n  - job_name: kube-state-metrics\n    honor_labels: true\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        with open(work / "prometheus.log", "w") as log:  # Prometheus keeps its own copy of the descriptor
            prom = subprocess.Popen([prometheus_binary(), f"--config.file={work / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{pport}"],
                                    stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{pport}"
        deadline = time.monotonic() + 120
        while True:
            try:
                q = urllib.parse.urlencode({"query": "count(kube_pod_info)"}).encode()
                with urllib.request.urlopen(f"{url}/api/v1/query", data=q, timeout=10) as r:
                    res = json.loads(r.read())["data"]["result"]
                if res and int(float(res[0]["value"][1])) == a.nodes:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("Prometheus did not scrape the fleet in 120 s")
            time.sleep(1)
        rows = {}
        for name, cmd in (("fleet --prometheus", [FORENSICS, "fleet", "--prometheus", url, "--json"]),
                          ("fleet --from", [FORENSICS, "fleet", "--from", str(work / "pods.json"), "--nodes",
                                            str(work / "nodes.json"), "--json"])):
            runs, prom_cpu = [], []
            for _ in range(a.repeat):
                before = cpu_seconds(prom.pid)
                runs.append(timed(cmd))
                prom_cpu.append(cpu_seconds(prom.pid) - before)
            if any(rc != 0 for _, _, rc in runs):
                raise SystemExit(f"{name} failed")
            rows[name] = {"seconds": min(t for t, _, _ in runs), "peak_rss_mb": max(m for _, m, _ in runs)}
            if name == "fleet --prometheus":
                rows[name]["prometheus_cpu_seconds"] = min(prom_cpu)
        rows["ratio"] = {"seconds": rows["fleet --prometheus"]["seconds"] / rows["fleet --from"]["seconds"],
                         "peak_rss_mb": rows["fleet --prometheus"]["peak_rss_mb"] / rows["fleet --from"]["peak_rss_mb"]}
        target = rows["fleet --prometheus"]["seconds"] < 2 and rows["fleet --prometheus"]["peak_rss_mb"] < 100
        if a.json:
            print(json.dumps({"nodes": a.nodes, "rows": rows, "target_met": target,
                              "load_average": os.getloadavg()[0]}, indent=2))
        else:
            print(f"{a.nodes:,} nodes / pods; best of {a.repeat} (wall), peak RSS")
            for name in ("fleet --prometheus", "fleet --from"):
                r = rows[name]
                print(f"  {name:20} {r['seconds']:7.2f} s  {r['peak_rss_mb']:7.1f} MB")
            floor = rows["fleet --prometheus"]["prometheus_cpu_seconds"]
            print(f"  Prometheus' own CPU while --prometheus ran: {floor:.2f} s ({os.cpu_count()} CPUs here; "
                  f"load average {os.getloadavg()[0]:.1f})")
            ratio = rows["ratio"]
            print(f"  --prometheus / --from: {ratio['seconds']:.2f}x time, {ratio['peak_rss_mb']:.2f}x memory")
            print(f"  target (--prometheus < 2 s and < 100 MB): {'met' if target else 'NOT met'}")
    finally:
        if prom is not None:
            prom.send_signal(signal.SIGTERM)
            prom.wait(timeout=60)
        if srv is not None:
            srv.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
