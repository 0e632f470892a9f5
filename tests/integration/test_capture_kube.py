"""forensics capture --pod: the real kubectl against the API stand-in (tests/kube_standin.py).

The pod's container is a real process on this machine in a cgroup named as kubelet +
containerd name it; the stand-in "kubelet" runs the agent pod's command here, so the agent
finds the process by container ID in /proc/*/cgroup, arms it and sends its bundle back
through the pod log.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.bundle import verify_manifest
from forensics.bundle.record import CoreState
from forensics.capture.handler import HandlerConfig, run_core_handler
from forensics.cli import cli
from tests.cgroups import CGROUP_ROOT, pod_cgroup, remove_cgroup
from tests.kube_standin import StandIn, make_event, make_node, make_pod, write_kubeconfig


pytestmark = [
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
    pytest.mark.skipif(os.geteuid() != 0 or not CGROUP_ROOT.is_dir(),
                       reason="needs root and a cgroup hierarchy (v1 pids or v2) to place the container's process"),
]
NS = "monitoring"


@pytest.fixture
def pod_process(tmp_path):
    """A running process in the cgroup of a pod's container (systemd driver, containerd)."""
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c",
                          f"open({str(fifo)!r}, 'w').write('ready'); import time; time.sleep(120)"])
    cg = pod_cgroup(pod_uid, cid)
    try:
        with open(fifo) as f:
            f.read()
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(p.pid))
        yield {"pid": p.pid, "pod_uid": pod_uid, "cid": cid}
    finally:
        p.kill()
        p.wait()
        time.sleep(0.05)
        remove_cgroup(cg)


@pytest.fixture
def cluster(tmp_path, monkeypatch, pod_process):
    # the "image": a forensics on PATH, as the installed console script runs it
    bindir = tmp_path / "image-bin"
    bindir.mkdir()
    (bindir / "forensics").write_text(
        f"#!{sys.executable}\nfrom forensics.cli import main\nmain()\n")
    (bindir / "forensics").chmod(0o755)
    monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache
    node = socket.gethostname()
    with StandIn(path_env=f"{bindir}:/usr/local/bin:/usr/bin:/bin") as s:
        s.nodes[node] = make_node(node)
        s.nodes["gone"] = make_node("gone", ready=False)
        s.pods[(NS, "exporter-7d9f")] = make_pod(name="exporter-7d9f", namespace=NS, uid=pod_process["pod_uid"],
                                                 node=node, container_id=pod_process["cid"], restarts=3, last_exit=134)
        s.pods[(NS, "exporter-crashloop")] = make_pod(name="exporter-crashloop", namespace=NS, uid=str(uuid.uuid4()),
                                                      node=node, container_id="cd" * 32, running=False, last_exit=139)
        s.pods[(NS, "exporter-on-gone-node")] = make_pod(name="exporter-on-gone-node", namespace=NS,
                                                         uid=str(uuid.uuid4()), node="gone", container_id="ef" * 32)
        s.events += [
            make_event(namespace=NS, pod="exporter-7d9f", uid=pod_process["pod_uid"], reason="BackOff",
                       message="Back-off restarting failed container exporter", time="2025-01-01T00:02:00Z"),
            make_event(namespace=NS, pod="exporter-7d9f", uid=pod_process["pod_uid"], reason="Started",
                       message="Started container exporter", time="2025-01-01T00:01:30Z", kind="Normal"),
            make_event(namespace=NS, pod="other", uid="x", reason="Other", message="not ours",
                       time="2025-01-01T00:00:00Z"),
        ]
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), s.url, namespace="default")
        yield s, kubeconfig


def _handled_crash(core_dir: Path, pid: int, signo: int, core: Path):
    """The core handler's record of a crash of ``pid`` on the node, fed ``core`` as the kernel would."""
    fd = os.open(core, os.O_RDONLY)
    try:
        return run_core_handler(str(core_dir), pid, pid, signo, time.time(), None, stdin_fd=fd,
                                config=HandlerConfig(min_free=0))
    finally:
        os.close(fd)


def _capture(kubeconfig, core_dir, out, *args):
    return CliRunner().invoke(cli, ["capture", "--kubeconfig", kubeconfig, "--core-dir", str(core_dir), "-o", str(out),
                                    "-n", NS, *args])


def test_capture_pod_end_to_end(cluster, pod_process, tmp_path):
    standin, kubeconfig = cluster
    core_dir = tmp_path / "cores"
    # GIVEN an earlier crash of this container kept by the core handler on the node
    core = Path(__file__).resolve()  # any bytes: the record, not the core's content, is what travels here
    earlier = _handled_crash(core_dir, pod_process["pid"], 6, core)
    # and one of the pod's previous container (a restart gets a new container ID; the pod UID stays)
    previous_cid = uuid.uuid4().hex * 2
    cg = pod_cgroup(pod_process["pod_uid"], previous_cid)
    prev = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(prev.pid))
        previous = _handled_crash(core_dir, prev.pid, 11, core)
    finally:
        prev.kill()
        prev.wait()
        time.sleep(0.05)
        remove_cgroup(cg)
    metadata = json.loads((Path(previous.crash_dir) / "metadata.json").read_text())
    assert metadata["identity"]["container_id"] == previous_cid
    # WHEN the pod is captured from the "workstation"
    r = _capture(kubeconfig, core_dir, tmp_path / "out", "--pod", "exporter-7d9f", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    bundle = Path(doc["bundle"])
    # THEN the bundle is in on-call order, complete and verified
    ident = json.loads((bundle / "00-identity.json").read_text())
    assert ident["pod_uid"] == pod_process["pod_uid"] and ident["node_uid"] == f"node-uid-{socket.gethostname()}"
    assert ident["owners"][0]["kind"] == "DaemonSet"
    events = json.loads((bundle / "10-kubernetes/events.json").read_text())
    assert [e["reason"] for e in events] == ["Started", "BackOff"]
    sched = json.loads((bundle / "10-kubernetes/scheduling.json").read_text())
    c = sched["pod"]["containers"][0]
    assert c["restart_count"] == 3 and c["last_terminated"]["exit_code"] == 134 and c["last_terminated"]["signal"] == 6
    assert sched["node"]["gpu_labels"]["nvidia.com/gpu.product"] == "NVIDIA-H20"
    assert sched["node"]["kernel"] and sched["node"]["container_runtime"].startswith("containerd")
    snap = json.loads((bundle / "40-process/snapshot.json").read_text())
    assert snap["pid"] == pod_process["pid"] and snap["identity"]["container_id"] == pod_process["cid"]
    arming = json.loads((bundle / "40-process/arming.json").read_text())
    assert arming["rlimit_core_after"][0] == arming["rlimit_core_after"][1] != "0"
    for crash in (earlier, previous):
        assert (bundle / "50-core" / os.path.basename(crash.crash_dir) / "metadata.json").is_file()
    assert verify_manifest(str(bundle)) == []
    # the agent pod was pinned to the node, privileged with hostPID, and deleted
    assert standin.created and standin.deleted == standin.created
    # a second capture never overwrites the first bundle
    r2 = _capture(kubeconfig, core_dir, tmp_path / "out", "--pod", "exporter-7d9f", "--json")
    assert json.loads(r2.output)["bundle"] != doc["bundle"]
    # and the text says what the agent armed and its verdict on the core (#20.2)
    r3 = _capture(kubeconfig, core_dir, tmp_path / "out", "--pod", "exporter-7d9f")
    assert r3.exit_code == (0 if doc["survives"] else 4), r3.output
    assert "armed on the node: RLIMIT_CORE" in r3.output and "\ncore:            " in r3.output
    assert "earlier crashes recorded by the node's core handler for this pod: 2" in r3.output


def test_capture_pod_says_the_core_will_not_survive_and_exits_4(cluster, tmp_path, core_pattern):
    """#20.2: capture --pod printed the pod and "Wrote ...", never the agent's verdict, never exit 4.

    The verdict reads kernel.core_pattern (``core``: the core goes to the read-only cwd): the session's
    share of the machine-wide lock keeps another session from pointing it at a handler meanwhile."""
    from tests.helpers import tmpfs

    standin, kubeconfig = cluster
    # GIVEN a pod's process running in a read-only directory (readOnlyRootFilesystem)
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    with tmpfs(tmp_path / "ro", "1M") as ro:
        p = subprocess.Popen(["sleep", "120"], cwd=ro)
        cg = pod_cgroup(pod_uid, cid)
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
            cg.mkdir(parents=True)
            (cg / "cgroup.procs").write_text(str(p.pid))
            standin.pods[(NS, "exporter-ro")] = make_pod(name="exporter-ro", namespace=NS, uid=pod_uid,
                                                         node=socket.gethostname(), container_id=cid)
            # WHEN it is captured from the workstation
            r = _capture(kubeconfig, tmp_path / "cores", tmp_path / "out", "--pod", "exporter-ro")
        finally:
            remove_cgroup(cg)
            p.kill()
            p.wait()
    # THEN the verdict the agent computed on the node is printed, and the exit status is 4
    assert r.exit_code == 4, r.output
    assert "core:            will NOT be written" in r.output and "is on a read-only mount" in r.output


@pytest.mark.parametrize("pattern", ["core", "handler"])
def test_capture_pod_in_crashloopbackoff_arms_what_can_be_armed(cluster, tmp_path, short_core_dir, core_pattern,
                                                                pattern):
    """#20.1: a pod in CrashLoopBackOff (the incident's state) was refused; its next start inherits the
    node's handler and the cores of its earlier containers are on the node."""
    import resource

    from forensics.capture.pattern import handler_pattern

    standin, kubeconfig = cluster
    core_dir = short_core_dir
    pod_uid = standin.pods[(NS, "exporter-crashloop")]["metadata"]["uid"]
    # the machine-wide lock before the processes: they live 60-120 s, which a wait for another session's hold
    # could outlast (the capture then found nothing to arm and the test failed); not had in time, it skips
    with core_pattern.exclusive() if pattern == "handler" else contextlib.nullcontext():
        # GIVEN the pod's sandbox running on the node (RLIMIT_CORE unlimited, which new containers of the pod get)
        sandbox_cg = pod_cgroup(pod_uid, uuid.uuid4().hex + uuid.uuid4().hex)
        sandbox = subprocess.Popen(["sleep", "120"], preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
        # and its containerd shim (runc starts the pod's next container from it) with RLIMIT_CORE 0, as the runtime
        # runs it
        sandbox_id = sandbox_cg.name[len("cri-containerd-"):-len(".scope")]
        shim = subprocess.Popen(
            ["bash", "-c", f"exec -a containerd-shim-runc-v2 {sys.executable} -c 'import time; time.sleep(120)' "
             f"-namespace k8s.io -id {sandbox_id} -address /run/x.sock"],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, resource.RLIM_INFINITY)))
        # and a crash of an earlier container of the pod, recorded by the core handler
        earlier_cg = pod_cgroup(pod_uid, uuid.uuid4().hex * 2)
        earlier_proc = subprocess.Popen(["sleep", "60"])
        try:
            # (the shim is what capture looks for by its command line: wait until bash has exec'd it, which a loaded
            # machine can delay past the capture -- the test then found nothing to arm)
            deadline = time.monotonic() + 30
            while not Path(f"/proc/{shim.pid}/cmdline").read_bytes().startswith(b"containerd-shim-runc-v2\0"):
                assert time.monotonic() < deadline, "the stand-in shim never started"
                time.sleep(0.02)
            sandbox_cg.mkdir(parents=True)
            (sandbox_cg / "cgroup.procs").write_text(str(sandbox.pid))
            earlier_cg.mkdir(parents=True)
            (earlier_cg / "cgroup.procs").write_text(str(earlier_proc.pid))
            earlier = _handled_crash(core_dir, earlier_proc.pid, 11, Path(__file__))
            remove_cgroup(earlier_cg)
            # WHEN it is captured, with the node's core_pattern a file name or the forensics handler
            saved = Path("/proc/sys/kernel/core_pattern").read_text()
            try:
                if pattern == "handler":
                    Path("/proc/sys/kernel/core_pattern").write_text(
                        handler_pattern(str(core_dir), str(Path(sys.executable).parent / "forensics")))
                r = _capture(kubeconfig, core_dir, tmp_path / "out", "--pod", "exporter-crashloop", "--json")
                text = _capture(kubeconfig, core_dir, tmp_path / "out", "--pod", "exporter-crashloop")
            finally:
                Path("/proc/sys/kernel/core_pattern").write_text(saved)
        finally:
            remove_cgroup(sandbox_cg)
            remove_cgroup(earlier_cg)
            for p in (sandbox, earlier_proc, shim):
                p.kill()
                p.wait()
    # THEN it is captured (not refused), the earlier crash is brought back, and the verdict says what the next
    # start gets: the handler keeps its core (0), a file pattern loses it with the container (4)
    assert r.exit_code == (0 if pattern == "handler" else 4), r.output
    doc = json.loads(r.stdout)
    bundle = Path(doc["bundle"])
    assert doc["running"] is False and doc["earlier_crashes"] == [os.path.basename(earlier.crash_dir)]
    assert (bundle / "50-core" / os.path.basename(earlier.crash_dir) / "metadata.json").is_file()
    arming = json.loads((bundle / "40-process" / "arming.json").read_text())
    # what can be armed was: the shim's limit, which the next container inherits, raised and read back
    assert [a["pid"] for a in arming["armed"]] == [shim.pid]
    assert arming["armed"][0]["rlimit_core_before"][0] == "0"
    assert arming["rlimit_core_next"] == "unlimited" and "runtime shim" in arming["rlimit_core_next_from"]
    assert sandbox.pid in arming["pod_pids"]
    # (the second capture finds it armed already)
    assert f"not running: armed its next start through the pod's container runtime shim (pid {shim.pid}): " \
           f"RLIMIT_CORE unlimited -> unlimited" in text.output
    if pattern == "handler":
        assert arming["destination"]["survives"] is True
        assert "core:            WILL be written" in text.output
    else:
        assert "core:            will NOT be written" in text.output and "dies with the container" in text.output
    assert verify_manifest(str(bundle)) == []
    assert standin.deleted == standin.created


def _manifests(output: str) -> list[dict]:
    """The objects of the YAML a command printed (from its first document on; its comments are YAML's)."""
    import yaml

    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("---", "apiVersion:")))
    return [d for d in yaml.safe_load_all("\n".join(lines[start:])) if d]


def test_dry_run_needs_no_api_server(tmp_path, monkeypatch):
    """#20.2: --dry-run still needed the API server."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(str(tmp_path / "kc"), f"http://127.0.0.1:{port}")
    r = CliRunner().invoke(cli, ["capture", "--kubeconfig", kubeconfig, "--pod", "exporter-x", "-n", NS, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "nothing was sent to the API server" in r.output
    (pod,) = _manifests(r.output)
    assert pod["spec"]["nodeName"] == f"<node of {NS}/exporter-x>" and pod["spec"]["hostPID"] is True


def test_dry_run_prints_the_agent_pod(cluster, pod_process, tmp_path):
    standin, kubeconfig = cluster
    r = _capture(kubeconfig, "/var/lib/forensics/cores", tmp_path, "--pod", "exporter-7d9f", "--dry-run",
                 "--agent-image", "registry.local/forensics:1")
    assert r.exit_code == 0, r.output
    (pod,) = _manifests(r.output)
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["hostPID"] is True and pod["spec"]["nodeName"] == socket.gethostname()
    assert container["securityContext"]["privileged"] is True and container["image"] == "registry.local/forensics:1"
    assert "/var/lib/forensics/cores" in [v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v]
    assert pod_process["cid"] in r.output
    assert not standin.created


def test_the_agent_pod_goes_into_the_agent_namespace(cluster, pod_process, tmp_path):
    # GIVEN a target namespace whose Pod Security level would reject a privileged pod
    standin, kubeconfig = cluster
    # WHEN the pod is captured with --agent-namespace
    r = _capture(kubeconfig, tmp_path / "cores", tmp_path / "out", "--pod", "exporter-7d9f", "--json",
                 "--agent-namespace", "forensics-system")
    assert r.exit_code in (0, 4), r.output
    # THEN the privileged agent pod is made (and deleted) there, and the target's evidence is still its own
    assert [ns for ns, _ in standin.created_in] == ["forensics-system"]
    assert standin.deleted == standin.created
    bundle = Path(json.loads(r.output)["bundle"])
    assert json.loads((bundle / "00-identity.json").read_text())["namespace"] == NS
    dry = _capture(kubeconfig, tmp_path / "cores", tmp_path, "--pod", "exporter-7d9f", "--dry-run",
                   "--agent-namespace", "forensics-system")
    assert [p["metadata"]["namespace"] for p in _manifests(dry.output)] == ["forensics-system"], dry.output


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--pod", "nope"], f"pod {NS}/nope not found", id="pod-not-found"),
        pytest.param(["--pod", "exporter-on-gone-node"], "node gone unreachable", id="node-unreachable"),
        pytest.param(["--pod", "exporter-7d9f", "--kubectl", "/nonexistent/kubectl"], "kubectl not found",
                     id="no-kubectl"),
        pytest.param(["--pod", "exporter-7d9f", "--container", "sidecar"], "has no container 'sidecar'",
                     id="no-container"),
    ],
)
def test_pod_mode_errors(cluster, tmp_path, args, message):
    standin, kubeconfig = cluster
    r = _capture(kubeconfig, tmp_path / "cores", tmp_path / "out", *args)
    assert r.exit_code == 1 and message in r.output, r.output
    assert standin.created == []  # each is found before any agent pod is made


def test_a_failing_agent_is_reported_and_its_pod_deleted(cluster, tmp_path):
    standin, kubeconfig = cluster
    node = socket.gethostname()
    standin.pods[(NS, "exporter-elsewhere")] = make_pod(name="exporter-elsewhere", namespace=NS, uid=str(uuid.uuid4()),
                                                       node=node, container_id="ab" * 32)
    r = _capture(kubeconfig, tmp_path / "cores", tmp_path / "out", "--pod", "exporter-elsewhere")
    assert r.exit_code == 1 and "no process of container" in r.output, r.output
    assert len(standin.created) == 1 and standin.deleted == standin.created
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_agent_keeps_big_files_on_the_node_within_its_log_budget(pod_process, tmp_path, cores, newest_python):
    """The pod log is rotated by the kubelet: metadata always travels, objects and cores while they fit."""
    import base64
    import io
    import tarfile

    from forensics.capture.agent import BEGIN, END

    core_dir = tmp_path / "cores"
    core = cores.get(newest_python, "heap-prev")  # a real kernel core of a Python process: MBs compressed
    earlier = _handled_crash(core_dir, pod_process["pid"], 6, core)
    assert earlier.core_state is CoreState.KEPT and Path(earlier.core_path).stat().st_size > 64 << 10
    r = CliRunner().invoke(cli, ["agent", "run", "--container-id", f"containerd://{pod_process['cid']}",
                                 "--core-dir", str(core_dir), "--max-inline", "64K"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    data = base64.b64decode("".join(lines[lines.index(BEGIN) + 1: lines.index(END)]))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        sizes = {m.name: m.size for m in tar.getmembers() if m.isfile()}
        left = json.load(tar.extractfile("left-on-node.json"))
    crash = os.path.basename(earlier.crash_dir)
    # the metadata travelled; the core and the big objects stayed, each listed with where it is on the node
    assert "00-identity.json" in sizes and "40-process/snapshot.json" in sizes
    assert f"50-core/{crash}/metadata.json" in sizes
    assert f"50-core/{crash}/50-core/core.zst" not in sizes
    kept = {x["path"] for x in left["files"]}
    assert f"50-core/{crash}/50-core/core.zst" in kept
    assert all(Path(x["node_path"]).is_file() and Path(x["node_path"]).stat().st_size == x["size"]
               for x in left["files"])
    sent_big = sum(size for name, size in sizes.items() if name.startswith("objects/") or name.endswith(".zst"))
    assert sent_big <= 64 << 10
    assert not kept & set(sizes)


def test_unreachable_api_server(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(str(tmp_path / "kc"), f"http://127.0.0.1:{port}")
    r = CliRunner().invoke(cli, ["capture", "--kubeconfig", kubeconfig, "--pod", "x", "--core-dir", str(tmp_path)])
    assert r.exit_code == 1 and "kubectl get pod failed" in r.output, r.output


def test_agent_manifest_daemonset():
    r = CliRunner().invoke(cli, ["agent", "manifest", "--core-dir", "/var/lib/forensics/cores"])
    assert r.exit_code == 0
    out = r.output
    (ds,) = [o for o in _manifests(out) if o["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and spec["tolerations"]
    commands = [c["command"] for c in spec["containers"]]
    assert any("keep" in c for c in commands) and any("serve" in c for c in commands), commands
    assert "/var/lib/forensics/cores" in [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    # one privileged container (the keeper: it installs and restores the handler), nothing on the node's PIDs
    assert out.count("privileged: true") == 1 and "hostPID" not in out


def test_an_agent_pod_left_behind_is_a_warning_with_the_command_to_delete_it(cluster, tmp_path):
    # GIVEN an API server that lets us create the privileged agent pod but not delete it
    standin, kubeconfig = cluster
    standin.refuse_delete = True
    # WHEN the pod is captured
    r = _capture(kubeconfig, tmp_path / "cores", tmp_path / "out", "--pod", "exporter-7d9f")
    # THEN the capture is done, and the user is told that a privileged pod is left and how to remove it
    (name,) = standin.created
    assert r.exit_code == 0, r.output
    assert f"warning: the privileged agent pod {NS}/{name} may still exist" in r.stderr
    assert f"kubectl delete pod {name} -n {NS}" in r.stderr and "forbidden" in r.stderr
