"""The node agent's privilege split, run for real minus Kubernetes (#37 item 1).

The DaemonSet's pod, as `forensics agent manifest` makes it, is created through the real kubectl in the kube
stand-in, whose kubelet runs it whole on this machine (tests/kube_standin.py): its init container copies an
installation of this checkout (tests/podruntime.py: the image's /opt/forensics) to the host prefix; the keeper, the
one privileged container, installs the handler; the agent runs `agent serve` with the manifest's securityContext
(setpriv: uid 0, the bounding set SETUID and SETGID, no_new_privs, a read-only root) in a user namespace where no
user namespace can be made (a runtime's default seccomp profile refuses them). A process then really crashes: the
kernel pipes its core to the handler on the host, and the agent analyzes it. Deleting the pod through kubectl stops
it as a kubelet does (SIGTERM, the grace period), and the keeper writes back the core_pattern from before.
Everything runs under the suite's core_pattern lock; the pattern from before is written back in `finally` whatever
happened, and every process started is ended.
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
from pathlib import Path

import pytest

from forensics.deploy.manifests import agent_objects
from tests.kube_standin import StandIn, make_node, write_kubeconfig
from tests.podruntime import PodRuntime, make_install

PATTERN = Path("/proc/sys/kernel/core_pattern")
NS = "forensics"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="writing kernel.core_pattern needs root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("bwrap", "setpriv", "kubectl")),
                       reason="bubblewrap and setpriv run the pod's containers, kubectl creates and deletes it"),
]


def _wait(what: str, check, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)


def _agent_pod(base: Path, node: str, port: int) -> dict:
    """The DaemonSet's pod as its controller would make it on ``node``."""
    (ds,) = [o for o in agent_objects(core_dir=str(base / "c"), image="forensics-agent:test", namespace=NS,
                                      gpu_label="k=v", host_prefix=str(base / "p"), metrics_port=port,
                                      bounds={"min_free": 0, "max_core_size": 1 << 30})
             if o["kind"] == "DaemonSet"]
    template = ds["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "forensics-agent-x1", "namespace": NS, "labels": template["metadata"]["labels"]},
            "spec": {**template["spec"], "nodeName": node}}


def _analysis_status(cores: Path) -> dict[str, str] | None:
    """/proc/PID/status of a running analysis of a crash under ``cores`` (`forensics analyze --json CRASH` exec'd
    by the sandbox's wrapper), as the host sees it; None when none runs now."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"analyze" not in argv or not any(a.startswith(str(cores).encode() + b"/") for a in argv) \
                    or b"forensics.sandbox" in argv:
                continue
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # ended meanwhile
            continue
        return {line.split(":")[0]: line.split(":", 1)[1].strip() for line in status.splitlines()}
    return None


def _crash(cwd: Path) -> int:
    """A Python process that really crashes (SIGSEGV in ctypes), its core piped by the kernel: its PID."""
    p = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], cwd=cwd, capture_output=True,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,
                                                                                    resource.RLIM_INFINITY)))
    assert p.returncode == -signal.SIGSEGV, p.stderr
    return p.returncode


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="fk", dir="/tmp"))  # short: the pattern names it within 128 bytes
    d.chmod(0o755)  # the host's /var/lib and /opt are searchable: the analyses' uid reaches the core directory
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_removing_the_agent_restores_the_core_pattern_from_before(core_pattern_lock, base, tmp_path):
    node = socket.gethostname()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pod = _agent_pod(base, node, port)
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    runtime = PodRuntime(install=make_install(base / "img"), no_userns=("agent",))
    before = None
    try:
        with StandIn(path_env=os.environ["PATH"]) as api, core_pattern_lock.exclusive():
            before = PATTERN.read_text()  # under the lock: another session's momentary pattern is never "restored"
            t0 = time.monotonic()
            api.nodes[node] = make_node(node)
            api.runtime = runtime
            kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
            kubectl = ["kubectl", "--kubeconfig", kubeconfig]
            # GIVEN the agent's pod created as the DaemonSet would, and run whole
            subprocess.run([*kubectl, "create", "--validate=false", "-f", str(tmp_path / "pod.json")], check=True,
                           capture_output=True, timeout=60)
            ours = f"|{base}/p/bin/forensics core-handler {base}/c %P %I %s %t %c"
            _wait("the keeper installs the handler", lambda: PATTERN.read_text().strip() == ours)
            t_installed = time.monotonic()
            assert (base / "p/bin/forensics").is_file()  # copied to the host prefix by the init container
            # WHEN a process crashes, the kernel pipes its core to the handler and the agent analyzes it
            (tmp_path / "run").mkdir()
            _crash(tmp_path / "run")
            crashes = base / "c/crashes"
            seen: list[dict[str, str]] = []  # the analysis' status, read from the host while it runs

            def analyzed():
                st = _analysis_status(crashes)
                if st is not None:
                    seen.append(st)
                return next((p for p in crashes.glob("*/60-analysis/*.json")
                             if p.name in ("analysis.json", "failed.json")), None) if crashes.is_dir() else None

            analysis = _wait("the agent analyzes the crash", analyzed)
            t_analyzed = time.monotonic()
            # AND the pod is deleted through the API (helm uninstall, a drain: the kubelet stops it)
            subprocess.run([*kubectl, "delete", "pod", "-n", NS, pod["metadata"]["name"], "--wait=false"],
                           check=True, capture_output=True, timeout=60)
            stopped = api.wait_stopped(NS, pod["metadata"]["name"], timeout=60)
            t_stopped = time.monotonic()
            after = PATTERN.read_text()
            logs = {c: api.logs(NS, pod["metadata"]["name"], c) for c in ("agent", "keeper")}
    finally:
        if before is not None and PATTERN.read_text() != before:
            PATTERN.write_text(before)
        runtime.close()
    print(f"\nthe keeper installed the handler {t_installed - t0:.1f} s after the pod was made; the crash analyzed "
          f"{t_analyzed - t_installed:.1f} s later; the pod stopped {t_stopped - t_analyzed:.1f} s after that")
    # THEN the pattern from before is back, written by the keeper on its SIGTERM, and both containers ended cleanly
    assert after == before, logs["keeper"]
    assert stopped == {"agent": 0, "keeper": 0}, logs
    assert "kernel.core_pattern restored to" in logs["keeper"]
    # and the crash was analyzed by the unprivileged agent, in the sandbox: another uid, no capability, no_new_privs,
    # a seccomp filter, while user namespaces could not be made (what the sandbox needs none of)
    assert analysis.name == "analysis.json", analysis.read_text()
    doc = json.loads(analysis.read_text())
    assert doc["analysis"]["fingerprint"]
    assert seen, "the analysis was never seen running"
    st = seen[0]
    print(f"\nthe analysis, read from the host while it ran: Uid {st['Uid']}, CapEff {st['CapEff']}, NoNewPrivs "
          f"{st['NoNewPrivs']}, Seccomp {st['Seccomp']}")
    assert st["Uid"].split()[0] != "0" and st["Uid"].split() == [st["Uid"].split()[0]] * 4
    assert (st["CapEff"], st["CapPrm"], st["NoNewPrivs"], st["Seccomp"]) == ("0000000000000000",) * 2 + ("1", "2")
    assert doc["agent"]["sandbox"]["uid"] == int(st["Uid"].split()[0])
