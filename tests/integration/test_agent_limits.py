"""`forensics agent serve` under a pod's pids limit and a flood of idle connections (#33: the agent).

The agent runs as its own process in a cgroup with a pids limit, as in its pod.  prometheus_client's server
gave each metrics connection a thread and no read timeout: 306 idle connections used up the pids, scrapes
stopped, and the next crash's analysis could not be forked, which was recorded as its failure for good.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from tests.cgroups import CGROUP_ROOT, remove_cgroup
from tests.integration import test_agent_serve as _serve
from tests.integration.test_agent_serve import AgentProcess, handle, wait_analyzed

kernel_cores, container = _serve.kernel_cores, _serve.container  # the agent tests' fixtures

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root"),
]


@pytest.fixture
def pids_cgroup():
    """A cgroup of the pids controller (v1's hierarchy, or v2 with pids enabled) for the agent; removed after."""
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        pytest.skip("no cgroup hierarchy")
    if CGROUP_ROOT.name != "pids" and "pids" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
        pytest.skip("the pids controller is not enabled in the cgroup v2 root")
    cg = CGROUP_ROOT / f"forensics-test-agent-{uuid.uuid4().hex[:12]}"
    cg.mkdir()
    try:
        yield cg
    finally:
        remove_cgroup(cg)


def _into(cg: Path, pid: int, limit: int | str) -> None:
    (cg / "pids.max").write_text(str(limit))
    (cg / "cgroup.procs").write_text(str(pid))


def _steady(cg: Path, agent: AgentProcess) -> int:
    """The agent's task count once it holds still (the same for a second): right after start or a scrape a thread
    of its may still be ending, and a limit set from that count would leave a pid to spare once it has."""
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while len(seen) < 10 or len(set(seen[-10:])) > 1:
        assert time.monotonic() < deadline, f"the agent's task count never held still: {seen[-10:]}"
        assert agent.proc.poll() is None, "the agent ended"
        seen.append(int((cg / "pids.current").read_text()))
        time.sleep(0.1)
    return seen[-1]


def _flood(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
    return socks


def test_idle_connections_neither_stop_scrapes_nor_the_next_analysis(kernel_cores, container, pids_cgroup, tmp_path):
    core_dir = tmp_path / "cores"
    # GIVEN the agent in a cgroup of 64 pids, as in a pod
    agent = AgentProcess(core_dir, "node-flood", None, tmp_path)
    flood: list[socket.socket] = []
    try:
        _into(pids_cgroup, agent.proc.pid, 64)
        # WHEN 306 connections are opened to its metrics port and left idle
        flood = _flood(agent.port, 306)
        # THEN a scrape still answers, while they are open
        samples = agent.scrape()
        assert "forensics_crashes" in samples
        # and a crash that comes now is analysed, once, with a fingerprint
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        idx = wait_analyzed(core_dir, 1, timeout=300)
        (crash,) = (core_dir / "crashes").iterdir()
        assert not (crash / "60-analysis" / "failed.json").exists(), (crash / "60-analysis" / "failed.json").read_text()
        assert json.loads((crash / "60-analysis" / "attempts.json").read_text())["attempts"] == 1
        assert list(idx["fingerprints"]) != ["unknown"]
        assert agent.scrape()["forensics_crashes"]
        # and the idle connections were closed by the agent (read timeout), not kept for ever
        closed = 0
        for s in flood:
            s.settimeout(30)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == len(flood)
    finally:
        for s in flood:
            s.close()
        agent.stop()


def test_an_analysis_that_cannot_start_is_retried_not_failed(kernel_cores, container, pids_cgroup, tmp_path):
    core_dir = tmp_path / "cores"
    # GIVEN the agent in a cgroup that has no pid to spare: the analysis' fork fails (EAGAIN)
    agent = AgentProcess(core_dir, "node-pids", None, tmp_path)
    try:
        _into(pids_cgroup, agent.proc.pid, "max")
        (pids_cgroup / "pids.max").write_text(str(_steady(pids_cgroup, agent)))
        # WHEN a crash comes and the agent tries to analyse it for a while
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        (crash,) = (core_dir / "crashes").iterdir()
        adir = crash / "60-analysis"
        deadline = time.monotonic() + 60
        while not ((adir / "attempts.json").exists() or (adir / "failed.json").exists()):
            assert time.monotonic() < deadline, "the agent never tried"
            time.sleep(0.1)
        time.sleep(3)  # a few more rounds
        # THEN the crash is not failed, its attempts not spent, it stays pending, and scrapes answer
        assert not (crash / "60-analysis" / "failed.json").exists(), (crash / "60-analysis" / "failed.json").read_text()
        attempts = crash / "60-analysis" / "attempts.json"
        assert not attempts.exists() or json.loads(attempts.read_text())["attempts"] == 0
        assert json.loads((core_dir / "agent-index.json").read_text())["pending"] == 1
        assert "forensics_crashes" in agent.scrape()
        # WHEN pids are free again: it is analysed, at its first attempt
        (pids_cgroup / "pids.max").write_text("max")
        wait_analyzed(core_dir, 1, timeout=300)
        assert (crash / "60-analysis" / "analysis.json").exists()
        assert json.loads(attempts.read_text())["attempts"] == 1
    finally:
        agent.stop()


def test_an_analysis_short_of_threads_inside_is_retried_then_failed_as_resources(kernel_cores, container, pids_cgroup,
                                                                                   tmp_path):
    """The analysis child forked (one pid to spare) but could not start a thread inside: it was recorded as
    "error" at its first attempt ("internal error: RuntimeError: can't start new thread"), for good."""
    from forensics.agent.serve import MAX_SHORT

    core_dir = tmp_path / "cores"
    # GIVEN the agent in a cgroup with one pid to spare: the analysis forks, then cannot start a thread
    agent = AgentProcess(core_dir, "node-short", None, tmp_path)
    try:
        _into(pids_cgroup, agent.proc.pid, "max")
        (pids_cgroup / "pids.max").write_text(str(_steady(pids_cgroup, agent) + 1))
        # WHEN a crash comes
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        (crash,) = (core_dir / "crashes").iterdir()
        attempts, failed = crash / "60-analysis" / "attempts.json", crash / "60-analysis" / "failed.json"
        deadline = time.monotonic() + 120
        while not (attempts.exists() and "short_of_resources" in attempts.read_text()) and not failed.exists():
            assert time.monotonic() < deadline, "the agent never tried"
            time.sleep(0.1)
        # THEN the first try spends no attempt and says why, typed
        assert not failed.exists(), failed.read_text()
        first = json.loads(attempts.read_text())
        assert first["attempts"] == 0 and first["not_started"].startswith("resources: exit status 1: ")
        assert "can't start new thread" in first["not_started"]
        # AND after MAX_SHORT tries in a row the crash is failed with the reason "resources", counted so
        while not failed.exists():
            assert time.monotonic() < deadline + 60 * MAX_SHORT, "never failed"
            time.sleep(0.2)
        record = json.loads(failed.read_text())
        assert record["reason"] == "resources" and f"{MAX_SHORT} analyses in a row" in record["detail"]
        (pids_cgroup / "pids.max").write_text("max")
        deadline = time.monotonic() + 30
        while {s.labels["reason"]: s.value for s in agent.scrape()["forensics_analysis_failures"]}["resources"] != 1:
            assert time.monotonic() < deadline, "not counted"
            time.sleep(0.2)
    finally:
        agent.stop()


def test_the_analysis_output_is_bounded_on_disk(tmp_path):
    """The analysis child's standard output went straight into its temporary file in the bundle: a child that
    printed without end filled the node's disk until the timeout (only the read-back was bounded)."""
    import sys

    from forensics.agent.serve import ServeConfig, analyze_crash

    # GIVEN an analysis child that prints 8 MiB, then marks that it finished, and a bound of 1 MiB
    crash = tmp_path / "crash"
    crash.mkdir()
    marker = tmp_path / "printed-all"
    child = [sys.executable, "-c", "import sys, pathlib\n"
             "for _ in range(128): sys.stdout.buffer.write(b'x' * 65536); sys.stdout.flush()\n"
             f"pathlib.Path({str(marker)!r}).touch()\n"]
    cfg = ServeConfig(core_dir=str(tmp_path), node="n", analyze_argv=child, analysis_timeout=60,
                      analysis_output=1 << 20, sandbox_uid=None)  # its mark in tmp_path: no sandbox
    # WHEN the agent runs it on a crash
    reason = analyze_crash(str(crash), cfg)
    # THEN it was stopped at the bound (it never printed all), the crash failed saying so, nothing left behind
    assert reason == "error" and not marker.exists()
    failed = json.loads((crash / "60-analysis" / "failed.json").read_text())
    assert failed["detail"] == "python3 wrote more than 1 MiB (stopped): past --analysis-output-max".replace(
        "python3", os.path.basename(sys.executable))
    assert sorted(p.name for p in (crash / "60-analysis").iterdir()) == ["attempts.json", "failed.json"]


def test_agent_serve_takes_the_analysis_output_bound(kernel_cores, container, tmp_path):
    core_dir = tmp_path / "cores"
    # GIVEN the agent with --analysis-output-max 4K (a real analysis prints more)
    agent = AgentProcess(core_dir, "node-out", None, tmp_path, "--analysis-output-max", "4K")
    try:
        # WHEN a crash comes
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        (crash,) = (core_dir / "crashes").iterdir()
        failed = crash / "60-analysis" / "failed.json"
        deadline = time.monotonic() + 120
        while not failed.exists():
            assert time.monotonic() < deadline, "not failed"
            time.sleep(0.2)
        # THEN its analysis is stopped at 4 KiB and the crash failed with that reason
        assert json.loads(failed.read_text())["detail"].endswith(
            "wrote more than 4,096 bytes (stopped): past --analysis-output-max")
    finally:
        agent.stop()


LONG = "frame_" + "x" * 2000  # one C function whose name is 2,006 characters
DEEP_C = r"""
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static volatile int ready;
__attribute__((noinline)) int NAME(int n, int crash) {
    if (n == 0) {
        if (crash) { while (ready < 16) usleep(1000); usleep(200000); *(volatile int *)16 = 1; }
        __sync_fetch_and_add(&ready, 1);
        for (;;) pause();
    }
    return NAME(n - 1, crash) + 1;
}
static void *worker(void *arg) { (void)arg; NAME(400, 0); return 0; }
int main(int argc, char **argv) {
    if (!strcmp(argv[1], "sleep")) { for (;;) pause(); }
    pthread_t t[16];
    for (int i = 0; i < 16; i++) pthread_create(&t[i], 0, worker, 0);
    return NAME(400, 1);
}
""".replace("NAME", LONG)


@pytest.fixture(scope="module")
def deep_core(tmp_path_factory, core_pattern) -> dict[str, Path]:
    """A real kernel core of a process whose 17 threads are 400 frames deep in a function with a 2,006-character
    name: its analysis is larger than the 8 MiB the agent's index reads back."""
    import resource
    import subprocess
    import tempfile

    d = tmp_path_factory.mktemp("deep-core")
    (d / "deep.c").write_text(DEEP_C)
    subprocess.run(["gcc", "-g", "-O0", "-pthread", "-o", str(d / "deep"), str(d / "deep.c")], check=True)
    run = Path(tempfile.mkdtemp(prefix="core-deep-", dir=d))
    p = subprocess.run([str(d / "deep"), "crash"], cwd=run, capture_output=True, timeout=60, preexec_fn=lambda: (
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))))
    assert p.returncode < 0
    (core,) = list(run.iterdir())
    return {"core": core, "binary": d / "deep"}


@pytest.fixture
def deep_container(deep_core):
    """The same program, alive in a pod container's cgroup (the handler stores its mapped objects)."""
    import subprocess

    from tests.cgroups import pod_cgroup

    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    p = subprocess.Popen([str(deep_core["binary"]), "sleep"])
    cg = pod_cgroup(pod_uid, cid)
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(p.pid))
        yield {"pid": p.pid}
    finally:
        remove_cgroup(cg)
        p.kill()
        p.wait()


def test_an_analysis_larger_than_the_index_reads_is_kept_with_its_fingerprint(deep_core, deep_container, tmp_path):
    from tests.integration.test_agent_serve import oracle_fingerprint

    core_dir = tmp_path / "cores"
    # GIVEN a crash whose analysis is larger than 8 MiB (long function names, deep stacks, many threads)
    handle(core_dir, deep_container["pid"], signal.SIGSEGV, deep_core["core"])
    (crash,) = (core_dir / "crashes").iterdir()
    # WHEN the agent analyses it
    agent = AgentProcess(core_dir, "node-deep", None, tmp_path)
    try:
        idx = wait_analyzed(core_dir, 1, timeout=600)
    finally:
        agent.stop()
    # THEN the analysis it wrote is one the index reads back (8 MiB at most), cut and saying so, analysed once,
    # with analyze's own fingerprint
    adir = crash / "60-analysis"
    assert not (adir / "failed.json").exists(), (adir / "failed.json").read_text()
    assert json.loads((adir / "attempts.json").read_text())["attempts"] == 1
    written = (adir / "analysis.json").read_bytes()
    assert len(written) <= 8 << 20
    doc = json.loads(written)
    assert "bytes" in doc["agent"]["cut"]
    fp = oracle_fingerprint(crash)
    assert doc["analysis"]["fingerprint"] == fp and list(idx["fingerprints"]) == [fp]


def _clone(bundle: Path, crashes: Path, n: int) -> list[Path]:
    """``n`` copies of a crash bundle under other names (the record and analysis copied, the rest hard-linked), all
    last changed an hour ago."""
    import shutil

    out = []
    for i in range(n):
        d = crashes / f"{bundle.name}-copy{i:04d}"
        for src in bundle.rglob("*"):
            dst = d / src.relative_to(bundle)
            if src.is_dir():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.name.endswith(".json"):
                shutil.copyfile(src, dst)
            else:
                os.link(src, dst)
        out.append(d)
    hour_ago = time.time() - 3600  # history: its files are not being written (the index re-reads those)
    for d in [bundle, *out]:
        for p in (d / "metadata.json", d / "60-analysis"):
            os.utime(p, (hour_ago, hour_ago))
    return out


def _rchar(pid: int) -> int:
    return int(next(x for x in Path(f"/proc/{pid}/io").read_text().splitlines() if x.startswith("rchar:")).split()[1])


def test_the_idle_agent_reads_each_bundle_once_and_again_only_when_it_changes(kernel_cores, container, tmp_path):
    from forensics.bundle.write import write_atomic

    core_dir = tmp_path / "cores"
    # GIVEN a node with 301 analysed crashes (one real, analysed by the agent, and 300 copies of it)
    handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
    agent = AgentProcess(core_dir, "node-idle", None, tmp_path)
    try:
        wait_analyzed(core_dir, 1)
    finally:
        agent.stop()
    (first,) = (core_dir / "crashes").iterdir()
    copies = _clone(first, core_dir / "crashes", 300)
    one_read = sum(p.stat().st_size for p in first.rglob("*.json"))
    agent = AgentProcess(core_dir, "node-idle", None, tmp_path)
    try:
        wait_analyzed(core_dir, 301)
        time.sleep(2)
        # WHEN it is idle for 3 s
        before = _rchar(agent.proc.pid)
        time.sleep(3)
        read = _rchar(agent.proc.pid) - before
        # THEN it read less than a tenth of one pass over the bundles (0 bytes here; it read them all again
        # on every round, a pass a second and more)
        assert read < 30 * one_read, f"{read:,} bytes read idle; one pass is {301 * one_read:,}"
        # WHEN the budget rewrites a record, a bundle is removed, and a crash comes
        rec = json.loads((copies[0] / "metadata.json").read_text())
        rec["core"] = {**rec["core"], "state": "deleted-for-budget"}
        write_atomic(str(copies[0] / "metadata.json"), json.dumps(rec).encode())
        import shutil

        shutil.rmtree(copies[1])
        handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
        # THEN the index, and the metrics, follow (within the 10 s between full rounds)
        idx = wait_analyzed(core_dir, 301, timeout=120)
        deadline = time.monotonic() + 30
        while True:
            not_kept = {s.labels["reason"]: s.value for s in agent.scrape()["forensics_cores_not_kept"]}
            if not_kept["budget"] == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not_kept["budget"] == 1
        assert sum(g["count"] for g in idx["fingerprints"].values()) == 301
    finally:
        agent.stop()
    # and a reader kept between rounds gives what reading every bundle gives: a bundle removed at once, a change
    # the handler or the agent did not make at its next full round
    from forensics.agent.nodeindex import IndexReader, build_index

    reader = IndexReader(str(core_dir), full_every=3600)
    reader.refresh()
    assert reader.index.as_document() == build_index(str(core_dir)).as_document()
    shutil.rmtree(copies[2])
    assert reader.refresh()
    assert reader.index.as_document() == build_index(str(core_dir)).as_document()
    (copies[3] / "60-analysis" / "analysis.json").unlink()
    reader.full_every = 0
    assert reader.refresh()
    assert reader.index.as_document() == build_index(str(core_dir)).as_document()
    assert reader.index.as_document()["pending"] == 1
