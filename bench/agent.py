"""Bench: the core handler's time per crash with `forensics agent serve` analyzing on the node, and without.

The agent analyzes at the lowest priority (SCHED_IDLE, nice 19, idle I/O); the handler is what the
kernel waits on. N real kernel cores (a small C crasher's SIGSEGV) go through the real handler, as
the kernel runs it, alternately with the agent (and its analysis) stopped and running through a
backlog of analyses, so other load on the machine weighs on both alike.
Target (issue #17): with the agent, within 10 % of without. Needs root and kernel.core_pattern
writing a plain file name (``core``).

    .venv/bin/python bench/agent.py [--crashes 30] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORENSICS = str(Path(sys.executable).parent / "forensics")
C = "int main(void) { *(volatile int *)16 = 1; return 0; }\n"


def handler_seconds(core_dir: Path, core: Path, pid: int) -> float:
    cmd = [FORENSICS, "core-handler", str(core_dir), str(pid), str(pid), "11", str(int(time.time())),
           "18446744073709551615", "--min-free", "0", "--loop-limit", "1000"]
    with open(core, "rb") as f:
        t = time.perf_counter()
        p = subprocess.run(cmd, stdin=f, capture_output=True, env={}, cwd="/")
        dt = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"handler failed: {p.stderr.decode()[-300:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--crashes", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if Path("/proc/sys/kernel/core_pattern").read_text().strip() != "core":
        raise SystemExit("bench/agent.py: kernel.core_pattern must be 'core' (cores in the cwd)")
    work = Path(tempfile.mkdtemp(prefix="forensics-bench-agent-"))
    live = subprocess.Popen(["sleep", "3600"])
    agent = None
    try:
        (work / "c.c").write_text(C)
        subprocess.run(["gcc", "-o", str(work / "crasher"), str(work / "c.c")], check=True)
        subprocess.run([str(work / "crasher")], cwd=work, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)), capture_output=True)
        core = next(p for p in work.iterdir() if p.name.startswith("core"))
        busy = work / "busy"
        for _ in range(a.crashes * 2):  # a backlog the agent analyzes while the measured crashes come
            handler_seconds(busy, core, live.pid)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        agent = subprocess.Popen([FORENSICS, "agent", "serve", "--core-dir", str(busy), "--no-events",
                                  "--metrics-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not list(busy.glob("crashes/*/60-analysis/attempts.json")):
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not start analyzing")
            time.sleep(0.05)
        # alternate: the agent (and its analysis) stopped, then running, crash by crash, so the machine's other
        # load drifts alike under both
        import psutil

        def agent_tree(sig: int) -> None:
            procs = [psutil.Process(agent.pid)] + psutil.Process(agent.pid).children(recursive=True)
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)

        without, with_agent = [], []
        for _ in range(a.crashes):
            agent_tree(signal.SIGSTOP)
            without.append(handler_seconds(work / "alone", core, live.pid))
            agent_tree(signal.SIGCONT)
            time.sleep(0.2)  # the analysis under way again
            with_agent.append(handler_seconds(busy, core, live.pid))
        analyzing = len(list(busy.glob("crashes/*/60-analysis/attempts.json")))
        m0, m1 = statistics.median(without), statistics.median(with_agent)
        doc = {"crashes": a.crashes, "core_bytes": core.stat().st_size, "median_without_s": m0, "median_with_s": m1,
               "ratio": m1 / m0, "analyses_started_meanwhile": analyzing, "target_met": m1 <= 1.1 * m0}
        if a.json:
            print(json.dumps(doc, indent=2))
        else:
            print(f"core handler, {a.crashes} crashes of a {doc['core_bytes']:,}-byte core, median per crash:")
            print(f"  without the agent  {m0 * 1000:8.1f} ms")
            print(f"  with the agent     {m1 * 1000:8.1f} ms  ({analyzing} analyses started meanwhile)")
            print(f"  ratio {doc['ratio']:.3f}; target (within 10 %): {'met' if doc['target_met'] else 'NOT met'}")
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=60)
        live.kill()
        live.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
