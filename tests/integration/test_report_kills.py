"""Kills are their own class (issue #40 item 2): a process stopped from outside is no crash, and its runbook names
the kill, its likely sender and the steps that fit; nothing is filed upstream.

Real kills: an exporter OOM-killed by the kernel under a real cgroup memory limit (tests/cgroups.py), its pod's
evidence captured with ``forensics capture --pod`` from the API stand-in (tests/kube_standin.py, the real
kubectl), the pod's status set from what the kernel did (exit 137, OOMKilled when the cgroup counted an OOM kill:
what containerd reports); and a sleeping interpreter a watchdog killed with ``kill -ABRT`` (the core's siginfo
names the watchdog).  Every runbook step runs as printed: kubectl's against the stand-in, ``ps`` on this machine.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from forensics.errors import EXIT_OK
from tests.cgroups import memory_cgroup
from tests.crashers.make_core import EXPORTER, _wait_ready, build_libcrash
from tests.integration.test_incidents import TEMPLATES, Reports, analyze, check_every_report, run, run_printed
from tests.kube_standin import StandIn, make_daemonset, make_node, make_pod, write_kubeconfig

NS = "monitoring"
LIMIT = 64 << 20  # the container's limits.memory, 64Mi


def _grows_until_killed() -> str:
    """An exporter whose memory grows without bound (each scrape's samples kept): it touches every page it takes."""
    return ("import sys\nsys.stdin.readline()\nkept = []\nwhile True:\n    b = bytearray(1 << 20)\n"
            "    b[::4096] = b'x' * 256\n    kept.append(b)\n")


@pytest.fixture
def oom_killed(tmp_path):
    """A real OOM kill: the process grows in a 64 MiB memory cgroup until the kernel's OOM killer kills it."""
    with memory_cgroup(LIMIT, "report-oom") as cg:
        if cg is None:
            pytest.skip("no memory cgroup this test may make (needs root and a memory controller)")
        proc = subprocess.Popen([sys.executable, "-c", _grows_until_killed()], stdin=subprocess.PIPE,
                                preexec_fn=cg.enter)
        try:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        yield {"returncode": rc, "oom_kills": cg.oom_kills, "peak": cg.peak}


def _kubelet_status(pod: dict, killed: dict) -> None:
    """The pod's status as the kubelet writes it for that exit: exit 128 + the signal, reason OOMKilled when the
    cgroup counted an OOM kill (containerd's report), one restart, waiting in CrashLoopBackOff."""
    code = 128 - killed["returncode"] if killed["returncode"] < 0 else killed["returncode"]
    cs = pod["status"]["containerStatuses"][0]
    cs["lastState"] = {"terminated": {"exitCode": code, "reason": "OOMKilled" if killed["oom_kills"] else "Error",
                                      "startedAt": "2025-01-01T00:00:00Z", "finishedAt": "2025-01-01T00:03:10Z"}}
    cs["restartCount"] = 1


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    bindir = tmp_path / "image-bin"  # the agent image: a forensics on PATH, as the installed console script runs it
    bindir.mkdir()
    (bindir / "forensics").write_text(f"#!{sys.executable}\nfrom forensics.cli import main\nmain()\n")
    (bindir / "forensics").chmod(0o755)
    monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache
    with StandIn(path_env=f"{bindir}:/usr/local/bin:/usr/bin:/bin") as s:
        node = socket.gethostname()
        s.nodes[node] = make_node(node)
        yield s, write_kubeconfig(str(tmp_path / "kubeconfig"), s.url, namespace="default"), node


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_an_oom_killed_exporter_is_a_kill_with_its_limit_raised(oom_killed, cluster, tmp_path):
    standin, kubeconfig, node = cluster
    # GIVEN an exporter the kernel's OOM killer killed at its container's 64Mi limit (a real cgroup: the oracle)
    assert oom_killed["returncode"] == -signal.SIGKILL and oom_killed["oom_kills"] >= 1, oom_killed
    assert oom_killed["peak"] is None or oom_killed["peak"] >= LIMIT * 0.9
    # and its pod as the API shows it: owned by the DaemonSet that holds the limit, its last exit the kernel's
    container = {"name": "exporter", "image": "nvcr.io/nvidia/exporter:1.5.0",
                 "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "32Mi"}}}
    pod = make_pod(name="exporter-oom", namespace=NS, uid=str(uuid.uuid4()), node=node,
                   container_id=uuid.uuid4().hex * 2, running=False)
    pod["spec"]["containers"] = [container]
    _kubelet_status(pod, oom_killed)
    standin.pods[(NS, "exporter-oom")] = pod
    standin.daemonsets[(NS, "exporter")] = make_daemonset(name="exporter", namespace=NS, container=container)
    # WHEN the pod is captured (its container is not running: the bundle has its status, events and spec) and
    # reported
    r = run("capture", "--kubeconfig", kubeconfig, "--core-dir", tmp_path / "cores", "-o", tmp_path / "out", "-n", NS,
            "--pod", "exporter-oom", "--json")
    assert r.exit_code in (0, 4), r.output
    bundle = Path(json.loads(r.stdout)["bundle"])
    rep = Reports([bundle], tmp_path)
    # THEN it is a kill, not a crash, in every report; nothing goes upstream
    check_every_report(rep, "kill")
    assert [(f["order"], f["report"]) for f in rep.conclusion["filings"]] == [(1, "runbook")]
    title = rep.title("runbook")
    assert title == (f"container exporter of pod {NS}/exporter-oom OOM-killed by the kernel at its memory limit of "
                     "64Mi (exit 137, SIGKILL): a kill, not a crash"), title
    statement = rep.conclusion["statement"]
    assert statement.startswith("Not a crash: container exporter of pod monitoring/exporter-oom was OOM-killed")
    assert "it reached its limit of 64Mi (its request is 32Mi)" in statement
    for t in ("nvml", "binding", "nvitop"):
        assert rep.title(t).removeprefix("[BUG] ").startswith("not for ")
    # and every runbook step runs as printed against the API: the limit read, raised on the DaemonSet, proved
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    steps = rep.commands()
    assert [c.split()[:3] for c in steps] == [["kubectl", "get", "pod"], ["kubectl", "set", "resources"],
                                              ["kubectl", "get", "daemonset/exporter"]]
    done = run_printed(steps, tmp_path, env)
    assert [d.returncode for d in done] == [0, 0, 0], [(d.stdout, d.stderr) for d in done]
    assert json.loads(done[0].stdout)["limits"]["memory"] == "64Mi"
    assert standin.daemonset_patches == [(NS, "exporter")]
    tmpl = standin.daemonsets[(NS, "exporter")]["spec"]["template"]["spec"]["containers"][0]
    assert tmpl["resources"]["limits"]["memory"] == "128Mi" and done[2].stdout == "128Mi"


def _watchdog_kill(tmp_path: Path, python: str) -> tuple[Path, subprocess.Popen]:
    """A sleeping interpreter (the crashers' exporter, its ``sleep`` scenario) killed with ``kill -ABRT`` by a
    watchdog shell that stays alive after it: (the core, the watchdog)."""
    lib = build_libcrash(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fifo = run_dir / "ready"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}

    def cores_on():
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen([python, str(EXPORTER), str(lib), "sleep", str(fifo)], cwd=run_dir, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=cores_on)
    watchdog = None
    try:
        _wait_ready(fifo, proc, 60)
        time.sleep(0.1)
        watchdog = subprocess.Popen(["bash", "-c", f"kill -ABRT {proc.pid}; sleep 120; exit 0"])
        assert proc.wait(timeout=60) == -signal.SIGABRT
    except BaseException:
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    core = next(p for p in run_dir.iterdir() if p.name.startswith("core"))
    return core, watchdog


def test_a_core_whose_signal_was_sent_names_its_sender(tmp_path, core_pattern):
    # GIVEN a sleeping interpreter a watchdog killed with kill -ABRT: its core's siginfo names the watchdog
    core, watchdog = _watchdog_kill(tmp_path, sys.executable)
    try:
        rep = Reports([analyze(core, tmp_path / "analysis.json")], tmp_path)
        # THEN it is a kill, not a crash: the sender named, nothing filed upstream
        check_every_report(rep, "kill")
        assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
        sender = f"pid {watchdog.pid} (uid {os.getuid()}) with kill(2)"
        assert rep.title("runbook").endswith(f"killed by SIGABRT, sent by {sender} (exit 134): a kill, not a crash")
        assert rep.conclusion["statement"].startswith("Not a crash: ") and \
            f"No instruction of the process faulted: SIGABRT came from {sender}." in rep.conclusion["statement"]
        # and its step runs as printed on the node: ps names the watchdog (its command line says what it did)
        (cmd,) = rep.commands()
        assert cmd == f"ps -o pid,ppid,user,lstart,args -p {watchdog.pid}"
        (done,) = run_printed([cmd], tmp_path)
        assert done.returncode == EXIT_OK and "kill -ABRT" in done.stdout, done.stdout
        for t in TEMPLATES:
            assert "crashes with" not in rep.title(t)
    finally:
        watchdog.kill()
        watchdog.wait()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_a_binding_fault_and_a_kill_at_once(oom_killed, cluster, tmp_path, core_pattern, monkeypatch):
    from forensics.simnvml import build_simnvml, seed_binding_fault, sim_environment
    from tests.crashers.make_core import crash_for_core
    from tests.integration.test_incidents import REPRO_PY, reproduce, run_every_command, stack_copy

    standin, kubeconfig, node = cluster
    # GIVEN the exporter's container OOM-killed at its 64Mi limit (the pod's evidence, as in the test above) and a
    # core of its crash on the binding's fault (nvidia-ml-py passing count=37 for its 36-entry array), with the
    # reproducers run on the same node (the unseeded binding: both clean)
    container = {"name": "exporter", "image": "nvcr.io/nvidia/exporter:1.5.0",
                 "resources": {"limits": {"memory": "64Mi"}}}
    pod = make_pod(name="exporter-oom", namespace=NS, uid=str(uuid.uuid4()), node=node,
                   container_id=uuid.uuid4().hex * 2, running=False)
    pod["spec"]["containers"] = [container]
    _kubelet_status(pod, oom_killed)
    standin.pods[(NS, "exporter-oom")] = pod
    standin.daemonsets[(NS, "exporter")] = make_daemonset(name="exporter", namespace=NS, container=container)
    r = run("capture", "--kubeconfig", kubeconfig, "--core-dir", tmp_path / "cores", "-o", tmp_path / "out", "-n", NS,
            "--pod", "exporter-oom", "--json")
    assert r.exit_code in (0, 4), r.output
    bundle = Path(json.loads(r.stdout)["bundle"])
    sim = build_simnvml(tmp_path / "sim")
    python = stack_copy("incident", tmp_path)
    env = sim_environment(sim, fault="none", detect="call", fault_after=2)
    env["PYTHONPATH"] = str(seed_binding_fault(python, tmp_path / "binding", 1))
    (tmp_path / "run").mkdir()
    core = crash_for_core([str(python), str(REPRO_PY), "--threads", "1", "--iterations", "20"], tmp_path / "run",
                          env=env, timeout=120)
    evidence = [analyze(core, tmp_path / "analysis.json"), reproduce(tmp_path, "--stack", "incident"), bundle]
    rep = Reports(evidence, tmp_path)
    # THEN the incident is the binding's fault, the kill a cause of its own, fixed first: the runbook (the kill's
    # limit), then the binding report to NVIDIA -- each with its own evidence
    check_every_report(rep, "binding-fault")
    routes = rep.explain["routes"]
    assert [(x["order"], x["report"]) for x in routes] == [(1, "runbook"), (2, "binding")]
    assert [i["key"] for i in routes[0]["evidence"]] == ["kill", "kill.memory"]
    assert [i["key"] for i in routes[1]["evidence"]] == ["core.inside_nvml", "repro.c", "heap"]
    assert rep.conclusion["statement"].startswith(
        "2 causes, to be fixed in this order: (1) a kill: OOM-killed by the kernel at its memory limit of 64Mi (exit "
        "137, SIGKILL), first because a process that keeps being killed restarts before any fix of what else is "
        "wrong can be seen working; (2) a fault of the binding")
    assert rep.title("runbook").startswith("python")
    assert ": a kill: OOM-killed by the kernel at its memory limit of 64Mi (exit 137, SIGKILL), fixed first; then a " \
           "fault of the binding" in rep.title("runbook"), rep.title("runbook")
    assert rep.title("binding").startswith("nvidia-ml-py 12.575.51 passes a count larger than its buffer")
    # and every runbook step, in that order, runs as printed: the limit read, raised and proved, then the pin and
    # its proof
    steps = rep.commands()
    assert [c.split()[:3] for c in steps] == [["kubectl", "get", "pod"], ["kubectl", "set", "resources"],
                                              ["kubectl", "get", "daemonset/exporter"],
                                              ["python3", "-m", "pip"], ["python3", "-c", "'import"]]
    monkeypatch.setenv("KUBECONFIG", kubeconfig)  # the stand-in's, for the kubectl steps
    ran = run_every_command(rep, sim, python)
    assert [ran[c] for c in steps] == [[0]] * 5
    tmpl = standin.daemonsets[(NS, "exporter")]["spec"]["template"]["spec"]["containers"][0]
    assert tmpl["resources"]["limits"]["memory"] == "128Mi"
