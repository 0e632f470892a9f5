"""`forensics agent serve` on real kernel cores taken by the real core handler.

Crashes: a small C program crashed by the kernel (SIGSEGV, SIGABRT); each core is fed to the
installed `forensics core-handler` as the kernel feeds it, while a process standing for the crashed
container lives in a pod's cgroup (so the record carries the pod UID and container ID). The agent
runs as its own process: its metrics are scraped over HTTP and parsed with prometheus_client,
its Events are read back with the real kubectl from the API stand-in. The oracle for every
fingerprint is `forensics analyze --json` run on the same bundle.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from forensics.analyze.fingerprint import FINGERPRINT_VERSION

from tests.cgroups import CGROUP_ROOT, pod_cgroup, remove_cgroup
from tests.podruntime import searchable_view
from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

FORENSICS = Path(sys.executable).parent / "forensics"
NS = "monitoring"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root"),
    pytest.mark.skipif(not CGROUP_ROOT.is_dir(), reason="no cgroup hierarchy to place the container's process"),
]

CRASHER_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (!strcmp(argv[1], "sleep")) { for (;;) pause(); }
    if (!strcmp(argv[1], "abort")) abort();
    *(volatile int *)16 = 1;
    return 0;
}
"""


@pytest.fixture(scope="module")
def kernel_cores(tmp_path_factory, core_pattern) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("agent-cores")
    (d / "crasher.c").write_text(CRASHER_C)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(d / "crasher"), str(d / "crasher.c")], check=True)
    out = {}
    for mode in ("segv", "abort"):
        run = Path(tempfile.mkdtemp(prefix=f"core-{mode}-", dir=d))
        p = subprocess.run([str(d / "crasher"), mode], cwd=run, capture_output=True, timeout=60, preexec_fn=lambda: (
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))))
        assert p.returncode < 0
        (core,) = list(run.iterdir())
        out[mode] = core
    out["crasher"] = d / "crasher"
    return out


@pytest.fixture
def container(kernel_cores):
    """A live process in a pod container's cgroup: the handler's /proc read names the pod UID and container ID."""
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    p = subprocess.Popen([str(kernel_cores["crasher"]), "sleep"])
    cg = pod_cgroup(pod_uid, cid)
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(p.pid))
        yield {"pid": p.pid, "pod_uid": pod_uid, "cid": cid}
    finally:
        remove_cgroup(cg)
        p.kill()
        p.wait()


def handle(core_dir: Path, pid: int, signo: int, core: Path) -> None:
    """The real handler, as the kernel runs it: absolute path, no environment, the core on stdin."""
    cmd = [str(FORENSICS), "core-handler", str(core_dir), str(pid), str(pid), str(signo), str(int(time.time())),
           "18446744073709551615", "--min-free", "0"]
    with open(core, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
    assert p.returncode == 0, p.stderr


class AgentProcess:
    def __init__(self, core_dir: Path, node: str, kubeconfig: str | None, home: Path, *extra: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = [str(FORENSICS), "agent", "serve", "--core-dir", str(core_dir), "--node-name", node,
                "--metrics-port", str(self.port), "--analysis-timeout", "120"]
        args += ["--kubeconfig", kubeconfig] if kubeconfig else ["--no-events"]
        args += extra
        # each analysis runs in the sandbox as an unprivileged uid: the core directory and the interpreter made
        # reachable to it in a mount namespace of the agent's own (pytest's directories are private)
        core_dir.mkdir(parents=True, exist_ok=True)
        view = searchable_view(bind=[str(core_dir), *([kubeconfig] if kubeconfig else [])], homes=[str(home)])
        self.proc = subprocess.Popen([*view, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={"PATH": os.environ["PATH"], "HOME": str(home)})
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        deadline = time.monotonic() + 60
        while True:
            try:
                self.scrape()
                break
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read()
                assert time.monotonic() < deadline, "the agent did not serve metrics"
                time.sleep(0.1)

    def scrape(self) -> dict[str, list]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=10) as r:
            body = r.read().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(body)}

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_analyzed(core_dir: Path, n: int, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            idx = json.loads((core_dir / "agent-index.json").read_text())
            if idx["crashes"] == n and idx["pending"] == 0:
                return idx
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"the agent did not analyze {n} crashes in {timeout}s")


def crash_counts(samples: list) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in samples:
        if s.name == "forensics_crashes_total":
            out[s.labels["fingerprint"]] = out.get(s.labels["fingerprint"], 0) + s.value
    return out


def oracle_fingerprint(bundle: Path) -> str:
    p = subprocess.run([str(FORENSICS), "analyze", "--json", str(bundle)], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 4), p.stderr
    return json.loads(p.stdout)["analysis"]["fingerprint"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_agent_analyzes_each_crash_once_and_publishes_metrics_and_events(kernel_cores, container, tmp_path):
    core_dir = tmp_path / "cores"
    node = socket.gethostname()
    # GIVEN the pod of the crashing container in the API, and 3 SIGSEGV + 1 SIGABRT crashes taken by the handler
    with StandIn(path_env=os.environ["PATH"]) as api:
        api.nodes[node] = make_node(node)
        api.pods[(NS, "exporter-a1")] = make_pod(name="exporter-a1", namespace=NS, uid=container["pod_uid"], node=node,
                                                 container_id=container["cid"], restarts=4, last_exit=139)
        kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
        for _ in range(3):
            handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        handle(core_dir, container["pid"], signal.SIGABRT, kernel_cores["abort"])
        # WHEN the agent runs on the node
        agent = AgentProcess(core_dir, node, kubeconfig, tmp_path)
        try:
            idx = wait_analyzed(core_dir, 4)
            # THEN each crash was analyzed once, into its own bundle, with analyze's own fingerprint
            crashes = sorted((core_dir / "crashes").iterdir())
            by_signal: dict[int, set] = {}
            for c in crashes:
                a = json.loads((c / "60-analysis" / "analysis.json").read_text())
                assert json.loads((c / "60-analysis" / "attempts.json").read_text())["attempts"] == 1
                signo = json.loads((c / "metadata.json").read_text())["signal"]
                by_signal.setdefault(signo, set()).add(a["analysis"]["fingerprint"])
            (segv_fp,), (abort_fp,) = by_signal[signal.SIGSEGV], by_signal[signal.SIGABRT]
            # the previous definition's key of each, exported beside it (forensics_crashes_total's previous_fingerprint)
            segv_prev = next(json.loads((c / "60-analysis" / "analysis.json").read_text())["analysis"]
                             [f"fingerprint_v{FINGERPRINT_VERSION - 1}"] for c in crashes if c.name.endswith("SIGSEGV"))
            assert segv_prev and len(segv_prev) == 12
            assert segv_fp != abort_fp
            segv_bundle = next(c for c in crashes if c.name.endswith("SIGSEGV"))
            assert oracle_fingerprint(segv_bundle) == segv_fp
            # the index, the metrics and the bundles agree
            assert {fp: g["count"] for fp, g in idx["fingerprints"].items()} == {segv_fp: 3, abort_fp: 1}
            deadline = time.monotonic() + 30
            while True:
                samples = agent.scrape()
                crash_series = [s for s in samples["forensics_crashes"] if s.name == "forensics_crashes_total"]
                if all(s.labels["pod"] for s in crash_series) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert crash_counts(samples["forensics_crashes"]) == {segv_fp: 3, abort_fp: 1}
            s0 = next(s for s in crash_series if s.labels["fingerprint"] == segv_fp)
            assert s0.labels == {"forensics_node": node, "fingerprint": segv_fp,
                                 "previous_fingerprint": segv_prev, "crash_class": s0.labels["crash_class"],
                                 "signal": "SIGSEGV", "namespace": NS,
                                 "pod": "exporter-a1", "container": "exporter",
                                 "image_digest": "sha256:" + "ab" * 32}
            assert {s.labels["reason"]: s.value for s in samples["forensics_analysis_failures"]} == {
                "timeout": 0, "memory": 0, "resources": 0, "error": 0, "interrupted": 0}
            stored = {s.labels["kind"]: s.value for s in samples["forensics_stored_bytes"]}
            assert stored["cores"] > 0 and stored["objects"] > 0
            # one events.k8s.io/v1 Event per distinct crash on the pod (every write passed the API server's rules for
            # that version, which the stand-in applies), a repeat counted in its series (none on a single crash)
            def series_counts(items) -> list[int]:
                return sorted((e.get("series") or {}).get("count", 1) for e in items)

            deadline = time.monotonic() + 30
            while True:
                ev = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "events.v1.events.k8s.io", "-n", NS,
                                     "-o", "json"], capture_output=True, text=True,
                                    env={**os.environ, "HOME": str(tmp_path)})
                items = [e for e in json.loads(ev.stdout)["items"] if e["reason"] == "NativeCrash"]
                if series_counts(items) == [1, 3] or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert series_counts(items) == [1, 3], items
            for e in items:
                assert e["apiVersion"] == "events.k8s.io/v1" and "count" not in e and "deprecatedCount" not in e
                assert e["type"] == "Warning" and e["regarding"]["uid"] == container["pod_uid"]
                assert e["action"] == "Analyzed" and e["reportingController"] == "forensics-agent"
                assert e["reportingInstance"] == node and e["regarding"]["name"] == "exporter-a1"
                assert any(fp in e["note"] for fp in (segv_fp, abort_fp)) and str(core_dir) in e["note"]
                if e.get("series"):  # the last crash of the series, after the Event's first
                    # the crash times are whole seconds (the handler's record): two crashes may share one
                    assert e["series"]["lastObservedTime"] >= e["eventTime"]
            # WHEN the same crash happens again: the Event's series counts it, no second Event
            handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
            wait_analyzed(core_dir, 5)
            deadline = time.monotonic() + 30
            while True:
                items = [e for e in api.events if e["reason"] == "NativeCrash"]
                if series_counts(items) == [1, 4] or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert series_counts(items) == [1, 4]
            # AND core/v1 readers (kubectl describe) see the same Events, their series with them
            core = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "events", "-n", NS, "-o", "json"],
                                  capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
            assert series_counts(e for e in json.loads(core.stdout)["items"] if e["reason"] == "NativeCrash") == [1, 4]
        finally:
            agent.stop()
        # WHEN the agent is restarted: nothing counted twice, nothing analyzed twice, Events unchanged
        writes = len(api.event_writes)
        agent = AgentProcess(core_dir, node, kubeconfig, tmp_path)
        try:
            time.sleep(3)
            assert crash_counts(agent.scrape()["forensics_crashes"]) == {segv_fp: 4, abort_fp: 1}
            assert all(json.loads((c / "60-analysis" / "attempts.json").read_text())["attempts"] == 1
                       for c in (core_dir / "crashes").iterdir())
            assert series_counts(e for e in api.events if e["reason"] == "NativeCrash") == [1, 4]
            assert len(api.event_writes) - writes <= 2  # at most the re-sent wanted state, never a new Event
        finally:
            agent.stop()


def test_agent_killed_mid_analysis_counts_the_same_after_restart(kernel_cores, container, tmp_path):
    """Killed (SIGKILL) while it analyzes: the restarted agent finishes the work and counts each crash once."""
    core_dir = tmp_path / "cores"
    for _ in range(4):
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
    agent = AgentProcess(core_dir, "node-a", None, tmp_path)
    try:
        # WHEN it is killed as soon as an analysis is under way
        deadline = time.monotonic() + 60
        while not list(core_dir.glob("crashes/*/60-analysis/attempts.json")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        agent.stop(signal.SIGKILL)
    finally:
        agent.stop()
    # THEN a new agent counts 4 crashes, analyzes each, and no bundle loses anything
    # (what the handler wrote; a decompressed 50-core/core next to it is analyze's, issue #20 item 6)
    evidence = lambda: {p: p.read_bytes() for p in [*core_dir.glob("crashes/*/50-core/*.zst"),  # noqa: E731
                                                    *core_dir.glob("crashes/*/metadata.json")]}
    before = evidence()
    agent = AgentProcess(core_dir, "node-a", None, tmp_path)
    try:
        idx = wait_analyzed(core_dir, 4)
        assert sum(g["count"] for g in idx["fingerprints"].values()) == 4 and len(idx["fingerprints"]) == 1
        assert sum(crash_counts(agent.scrape()["forensics_crashes"]).values()) == 4
    finally:
        agent.stop()
    assert evidence() == before and len(before) == 8


def test_analysis_runs_at_idle_priority_and_is_bounded(kernel_cores, container, tmp_path):
    """The analysis never competes with the handler: SCHED_IDLE, nice 19; past its time bound it is killed."""
    core_dir = tmp_path / "cores"
    handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
    # an "analyzer" that reports its own scheduling and then hangs, in place of forensics analyze
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys, time\n"
                     "open(sys.argv[-2], 'w').write(f'{os.sched_getscheduler(0)} {os.nice(0)}')\n"
                     "time.sleep(60)\n")
    from forensics.agent.serve import ServeConfig, analyze_crash

    (crash,) = (core_dir / "crashes").iterdir()
    cfg = ServeConfig(core_dir=str(core_dir), node="n", analysis_timeout=2, sandbox_uid=None,  # writes tmp_path
                      analyze_argv=[sys.executable, str(probe), str(tmp_path / "sched")])
    t = time.monotonic()
    assert analyze_crash(str(crash), cfg) == "timeout"
    assert time.monotonic() - t < 50  # killed at its 2 s bound, not after the probe's 60 s: a bound, not a speed
    policy, nice = (tmp_path / "sched").read_text().split()
    assert int(policy) == os.SCHED_IDLE and int(nice) == 19
    failed = json.loads((crash / "60-analysis" / "failed.json").read_text())
    assert failed["reason"] == "timeout"


@pytest.mark.slow
def test_fifty_crashes_in_ten_seconds_with_the_agent_killed_once(kernel_cores, container, tmp_path):
    """#17: 50 crashes in 10 s on one node: 50 analyses; index = metrics = bundles; the agent killed mid-analysis
    and restarted counts the same. (The handler's time per crash with and without the agent is bench/agent.py's.)"""
    import threading

    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    (core_dir / "handler.json").write_text(json.dumps({"config": {"loop_limit": 100, "min_free": 0}}))
    agent = AgentProcess(core_dir, "node-50", None, tmp_path)
    errors: list[BaseException] = []
    try:
        # WHEN 50 crashes come in 10 s, while the agent runs
        def crash(i: int) -> None:
            try:
                handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = []
        t0 = time.monotonic()
        for i in range(50):
            threads.append(threading.Thread(target=crash, args=(i,)))
            threads[-1].start()
            time.sleep(max(0.0, t0 + (i + 1) * 0.2 - time.monotonic()))
        for t in threads:
            t.join()
        assert not errors, errors
        # and the agent is killed while it analyzes, then started again
        deadline = time.monotonic() + 120
        while len(list(core_dir.glob("crashes/*/60-analysis/analysis.json"))) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        agent.stop(signal.SIGKILL)
        agent = AgentProcess(core_dir, "node-50", None, tmp_path)
        idx = wait_analyzed(core_dir, 50, timeout=900)
        # THEN 50 bundles, 50 analyses, and the index and the metrics count 50
        bundles = list((core_dir / "crashes").iterdir())
        assert len(bundles) == 50
        assert len(list(core_dir.glob("crashes/*/60-analysis/analysis.json"))) == 50
        assert sum(g["count"] for g in idx["fingerprints"].values()) == 50 and len(idx["fingerprints"]) == 1
        assert sum(crash_counts(agent.scrape()["forensics_crashes"]).values()) == 50
        attempts = [json.loads((b / "60-analysis" / "attempts.json").read_text())["attempts"] for b in bundles]
        assert attempts.count(1) >= 49 and max(attempts) <= 2  # the one killed mid-analysis ran again, once
    finally:
        agent.stop()
