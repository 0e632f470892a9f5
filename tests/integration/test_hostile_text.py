"""What a crashed container, an image or a cluster user names reaches a terminal escaped (#13 item 5).

Each test makes the hostile input for real -- a core of a process whose thread name, command line and
loaded library's file name carry terminal escapes and a forged line, an image whose file names and
config do, a live process whose comm and working directory do, pods and nodes the API stand-in names so --
and reads every text output of the command (stdout, stderr, warnings with -v) for a character a terminal
acts on.  Each also checks that the hostile text did reach the output, escaped, so the test cannot pass
because the name was never shown.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.conftest import PYTHONS
from tests.crashers.make_core import EXPORTER, build_libcrash, crash_for_core
from tests.fuzzing import CONTROL

#: a title change, a screen clear, a forged line of analyze's own shape
FORGED = '\x1b]0;owned\x07\x1b[2J\r\nThread "MainThread" tid 1  [FORGED]'
FORGED_ESCAPED = '\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0aThread "MainThread" tid 1  [FORGED]'


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def assert_terminal_safe(*texts: str) -> None:
    for text in texts:
        bad = CONTROL.search(text)
        assert bad is None, (f"{bad.group()!r} reaches the terminal in:\n"
                             f"{text[max(0, bad.start() - 200):bad.end() + 80]}")
        assert not any(line.startswith('Thread "MainThread" tid 1  [FORGED]') for line in text.splitlines())


@pytest.fixture(scope="module")
def hostile_core(tmp_path_factory, core_pattern, newest_python) -> Path:
    """A real SIGSEGV core: the poller thread's name, the command line and the path of the library the process
    loaded (NT_FILE) carry FORGED."""
    work = tmp_path_factory.mktemp("hostile")
    lib = build_libcrash(work)
    evil_lib = work / f"libcrash{FORGED.replace('/', '_')}.so"
    shutil.copyfile(lib, evil_lib)
    run_dir = work / "run"
    run_dir.mkdir()
    return crash_for_core([PYTHONS[newest_python], str(EXPORTER), str(evil_lib), "segv"], run_dir,
                          env={"EXPORTER_THREAD_NAME": FORGED[:15]}, binds=(EXPORTER, evil_lib))


def test_analyze_text_of_a_hostile_core(hostile_core, tmp_path):
    # WHEN the core is analysed in text, with -v (warnings), with libdw naming frames, and in a batch
    one = run("analyze", str(hostile_core), "-v")
    native = run("analyze", str(hostile_core), "--method", "direct", "--native-method", "libdw", "--native", "-v")
    d = tmp_path / "batch"
    d.mkdir()
    (d / f"core.{FORGED.replace('/', '_')}").symlink_to(hostile_core)
    batch = run("analyze", str(d), str(hostile_core))
    # THEN nothing a terminal acts on reaches it, and the names are there, escaped
    for r in (one, native, batch):
        assert r.exit_code in (0, 3, 4), r.stderr
        assert_terminal_safe(r.stdout, r.stderr)
    assert FORGED_ESCAPED in one.stdout  # the library's path, in the command line and the native frames
    assert 'Thread "\\x1b]0;owned\\x07\\x1b[2J\\x0d" tid' in one.stdout  # the poller thread's name
    assert FORGED_ESCAPED in batch.stdout


def test_report_text_of_a_hostile_core(hostile_core, tmp_path):
    # GIVEN analyze's JSON of the core (the report's evidence)
    evidence = tmp_path / "analysis.json"
    assert run("analyze", str(hostile_core), "--json", "-o", str(evidence)).exit_code in (0, 4)
    # WHEN a report is made of it, to the terminal and to a file
    r = run("report", str(evidence))
    out = tmp_path / "report.md"
    w = run("report", str(evidence), "-o", str(out))
    # THEN the Markdown printed, the summary on stderr and the file written carry no control character
    assert r.exit_code == 0 and w.exit_code == 0, r.stderr + w.stderr
    assert_terminal_safe(r.stdout, r.stderr, w.stderr, out.read_text())
    assert "owned" in r.stdout


def test_verify_imports_text_of_a_hostile_image(tmp_path):
    from tests.fuzz_images import SITE, SeedImage

    # GIVEN an image whose config, .pth line and module directory carry FORGED
    img = SeedImage()
    img.config["config"]["WorkingDir"] = "/app" + FORGED
    img.config["config"]["Env"].append("PYTHONPATH=/opt/" + FORGED)
    img.config["config"]["Entrypoint"] = ["python3", "-m", "nvitop" + FORGED]
    for members in img.layers:
        for i, (ti, data) in enumerate(members):
            if ti.name == f"{SITE}/extra.pth".lstrip("/"):
                members[i] = (ti, data + ("/opt/" + FORGED + "\n").encode())
            if ti.name == f"{SITE}/pynvml.py".lstrip("/"):
                ti.name = f"{SITE}/pynvml{FORGED.replace('/', '_')}.py".lstrip("/")
    ref = img.write_oci(tmp_path / "oci")
    # WHEN it is verified in text, every path looked at shown (-v)
    r = run("verify-imports", ref, "-v", "-m", "pynvml", "-m", "nvitop" + FORGED)
    # THEN no control character reaches the terminal, and the names are shown escaped
    assert r.exit_code in (0, 3), r.stderr
    assert_terminal_safe(r.stdout, r.stderr)
    assert "\\x1b]0;owned\\x07" in r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="capture --pid arms other processes as root")
def test_capture_text_of_a_hostile_process(tmp_path):
    # GIVEN a live process whose comm and working directory carry FORGED (both are the process's to set)
    cwd = tmp_path / f"work{FORGED.replace('/', '_')}"
    cwd.mkdir()
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    code = (f"open('/proc/self/comm', 'w').write({FORGED[:15]!r}); open({str(fifo)!r}, 'w').write('ready'); "
            "import time; time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, FORGED], cwd=cwd)
    try:
        with open(fifo) as f:
            assert f.read() == "ready"
        assert "\x1b" in Path(f"/proc/{p.pid}/comm").read_text()
        # WHEN it is captured, in text
        r = run("capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores"), "-o", str(tmp_path / "b"))
    finally:
        p.kill()
        p.wait()
    # THEN the summary is terminal-safe and names the process escaped
    assert r.exit_code in (0, 4), r.stderr
    assert_terminal_safe(r.stdout, r.stderr)
    assert "\\x1b]0;owned\\x07" in r.stdout


def test_fleet_text_of_hostile_pod_and_node_names(tmp_path):
    from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    # GIVEN an API (the stand-in: a real server would refuse such names, a compromised or fake one would not)
    # whose pods, node, image and labels carry FORGED
    with StandIn(path_env="/usr/bin:/bin") as api:
        for i in range(3):
            pod = make_pod(name=f"exporter-{i}{FORGED}", namespace="monitoring", uid=f"uid-{i}",
                           node=f"node{FORGED}", container_id="c" * 64, restarts=5, last_exit=139)
            pod["metadata"]["labels"] = {"app": "nvitop-exporter"}
            pod["status"]["containerStatuses"][0]["image"] = "nvcr.io/nvidia/exporter:" + FORGED
            api.pods[("monitoring", pod["metadata"]["name"])] = pod
        node = make_node(f"node{FORGED}")
        node["metadata"]["labels"]["nvidia.com/gpu.product"] = "H20" + FORGED
        api.nodes[node["metadata"]["name"]] = node
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url, namespace="monitoring")
        # WHEN fleet lists them in text
        r = run("fleet", "--kubeconfig", kubeconfig, "-n", "monitoring", "-l", "app=nvitop-exporter")
        j = run("fleet", "--json", "--kubeconfig", kubeconfig, "-n", "monitoring", "-l", "app=nvitop-exporter")
    # THEN the table is terminal-safe and shows the names escaped; the JSON keeps them exactly
    assert r.exit_code == 0, r.stderr
    assert_terminal_safe(r.stdout, r.stderr)
    assert "\\x1b]0;owned\\x07" in r.stdout
    assert json.loads(j.stdout)["fleet"]["crashing_groups"][0].startswith("H20" + FORGED)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("kubectl") is None,
                    reason="the agent test needs root (a pod cgroup) and kubectl")
def test_agent_event_of_a_hostile_crash(hostile_core, tmp_path):
    """The agent's NativeCrash Event (kubectl describe shows its message) names the crash's signature: the
    library's file name from the core."""
    import signal as _signal
    import socket
    import time
    import uuid

    from tests.cgroups import pod_cgroup, remove_cgroup
    from tests.integration.test_agent_serve import NS, AgentProcess, handle, wait_analyzed
    from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

    # GIVEN a pod's live process, the hostile core taken for it by the real handler, and the API stand-in
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    p = subprocess.Popen(["sleep", "600"])
    cg = pod_cgroup(pod_uid, cid)
    core_dir, node = tmp_path / "cores", socket.gethostname()
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(p.pid))
        with StandIn(path_env=os.environ["PATH"]) as api:
            api.nodes[node] = make_node(node)
            api.pods[(NS, "exporter-0")] = make_pod(name="exporter-0", namespace=NS, uid=pod_uid, node=node,
                                                    container_id=cid, restarts=1, last_exit=139)
            kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url)
            handle(core_dir, p.pid, _signal.SIGSEGV, hostile_core)
            # WHEN the agent analyses it and sends its Event
            agent = AgentProcess(core_dir, node, kubeconfig, tmp_path)
            try:
                wait_analyzed(core_dir, 1)
                deadline = time.monotonic() + 60
                while not [e for e in api.events if e["reason"] == "NativeCrash"] and time.monotonic() < deadline:
                    time.sleep(0.3)
            finally:
                agent.stop()
            events = [e for e in api.events if e["reason"] == "NativeCrash"]
    finally:
        remove_cgroup(cg)
        p.kill()
        p.wait()
    # THEN its note carries the names escaped, one line
    assert events, "no NativeCrash Event"
    assert_terminal_safe(events[0]["note"])
    assert "\\x1b]0;owned\\x07" in events[0]["note"]
