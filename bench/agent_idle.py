"""Bench: the CPU an idle `forensics agent serve` takes with a week of crash-loop history in its core directory.

A pod in CrashLoopBackOff crashes about every 5 minutes: 2,016 crashes a week, of which the handler keeps the
core of 5 an hour (its loop limit) and records the rest as metadata only. One real crash bundle is made by the
real core handler (the core of a live process taken by gcore), given the demo's real analysis
(reports/demo/analysis.json, 190 KiB), and copied into that week (record and analysis copied, the core
hard-linked). Then the agent runs with nothing to do, and its CPU time (utime + stime of all its threads, from
/proc) is measured over a window, after its first round. Issue #33: 0.4-0.7 CPU-s/s before (every bundle read
again every second); the agent's pod requests 50m.

    sudo .venv/bin/python bench/agent_idle.py [--crashes 2016] [--seconds 20] [--src DIR ...] [--json]

``--src DIR`` runs the forensics package found in DIR (e.g. an older tree from ``git archive``) instead of
this checkout's, to compare before and after on the same history.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORENSICS = str(Path(sys.executable).parent / "forensics")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def template_bundle(work: Path) -> Path:
    """One real crash bundle: the real handler fed a gcore core of a live process, plus the demo's analysis."""
    live = subprocess.Popen(["sleep", "3600"])
    try:
        subprocess.run(["gcore", "-o", str(work / "core"), str(live.pid)], check=True, capture_output=True)
        core = next(work.glob("core.*"))
        cmd = [FORENSICS, "core-handler", str(work / "tmpl"), str(live.pid), str(live.pid), "11",
               str(int(time.time())), "18446744073709551615", "--min-free", "0", "--loop-limit", "1000"]
        with open(core, "rb") as f:
            subprocess.run(cmd, stdin=f, check=True, capture_output=True, env={}, cwd="/")
    finally:
        live.kill()
        live.wait()
    (bundle,) = (work / "tmpl" / "crashes").iterdir()
    analysis = json.loads((ROOT / "reports" / "demo" / "analysis.json").read_text())
    analysis["agent"] = {"seconds": 20.0, "exit_status": 0, "analyzed_at": time.time(), "node": "bench"}
    (bundle / "60-analysis").mkdir(exist_ok=True)
    (bundle / "60-analysis" / "analysis.json").write_text(json.dumps(analysis, indent=2))
    (bundle / "60-analysis" / "attempts.json").write_text(json.dumps({"attempts": 1}))
    return bundle


def week_of_history(tmpl: Path, core_dir: Path, n: int) -> None:
    record = json.loads((tmpl / "metadata.json").read_text())
    crashes = core_dir / "crashes"
    crashes.mkdir(parents=True)
    t0 = time.time() - n * 300
    for i in range(n):
        t = t0 + i * 300
        name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t)) + f"-pid{1000 + i}-SIGSEGV"
        d = crashes / name
        kept = i % 12 < 5  # the loop limit: 5 cores an hour
        for src in tmpl.rglob("*"):
            rel = src.relative_to(tmpl)
            if src.is_dir() or rel.name == "metadata.json":
                continue
            if not kept and (rel.parts[0] in ("50-core", "60-analysis")):
                continue
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel.parts[0] == "50-core":
                os.link(src, d / rel)
            else:
                shutil.copyfile(src, d / rel)
        rec = dict(record, time=t)
        if not kept:
            rec["core"] = {**(record.get("core") or {}), "state": "metadata-only", "file": None,
                           "reasons": ["crash loop: 5 cores of this image and signal in the last hour"]}
        (d / "metadata.json").write_text(json.dumps(rec, indent=2))


def idle_cpu(core_dir: Path, n: int, seconds: float, src: str | None) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["agent", "serve", "--core-dir", str(core_dir), "--node-name", "bench", "--metrics-port", str(port),
            "--no-events"]
    cmd = ([sys.executable, "-c", f"import sys; sys.path.insert(0, {src!r}); from forensics.cli import main; main()",
            *args] if src else [FORENSICS, *args])
    (core_dir / "agent-index.json").unlink(missing_ok=True)
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if json.loads((core_dir / "agent-index.json").read_text())["crashes"] == n:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit("the agent did not index the history")
            time.sleep(0.2)
        time.sleep(2)  # its first rounds done: idle from here
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(agent.pid) - c0) / (time.monotonic() - t0)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--crashes", type=int, default=2016)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--src", action="append", default=[], help="a tree holding another forensics package")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/agent_idle.py: the core handler reads /proc/PID of another process: run as root")
    work = Path(tempfile.mkdtemp(prefix="forensics-bench-idle-"))
    try:
        tmpl = template_bundle(work)
        core_dir = work / "cores"
        week_of_history(tmpl, core_dir, a.crashes)
        shutil.copytree(work / "tmpl" / "objects", core_dir / "objects", dirs_exist_ok=True)
        rows = [(src or "this checkout", idle_cpu(core_dir, a.crashes, a.seconds, src))
                for src in [*a.src, None]]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps({"crashes": a.crashes, "seconds": a.seconds,
                          "cpu_seconds_per_second": dict(rows)}, indent=2))
        return
    print(f"idle agent serve, {a.crashes:,} crashes of history, {a.seconds:g} s measured")
    for name, cpu in rows:
        print(f"  {name:40s} {cpu:.3f} CPU-s/s")


if __name__ == "__main__":
    main()
