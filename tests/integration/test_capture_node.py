"""forensics capture --pid on real processes: a plain one and a container-like one.

The container-like process is made with ``unshare`` (its own mount and PID namespaces);
the simulated libnvidia-ml.so (forensics.simnvml) is bind-mounted into it from a "host"
directory, as the NVIDIA container toolkit injects the driver's library, and it is moved
into a cgroup named the way kubelet + containerd (systemd driver) name a pod's container.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.bundle import read_manifest, verify_manifest
from forensics.capture.node import find_container_pids
from forensics.cli import cli
from tests.cgroups import CGROUP_ROOT, pod_cgroup, remove_cgroup


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="capture --pid arms other processes as root")


def _wait_ready(fifo: Path) -> None:
    with open(fifo) as f:
        assert f.read().startswith("ready")


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def _sleeper(tmp_path, hard):
    fifo = tmp_path / f"ready-{hard}"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c",
                          f"open({str(fifo)!r}, 'w').write('ready'); import time; time.sleep(120)"],
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, hard)))
    _wait_ready(fifo)
    return p


@pytest.fixture
def sleeper(tmp_path):
    """A process with RLIMIT_CORE 0 (soft), as most container runtimes start them."""
    p = _sleeper(tmp_path, resource.RLIM_INFINITY)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_capture_a_hard_limit_of_zero(tmp_path):
    p = _sleeper(tmp_path, 0)
    try:
        r = CliRunner().invoke(cli, ["capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores"), "--json"])
        if _has_cap_sys_resource():
            assert json.loads(r.output)["rlimit_core_after"] == ["unlimited", "unlimited"]
        else:  # e.g. this VM's root lacks CAP_SYS_RESOURCE: say so, and how to fix it
            assert r.exit_code == 1 and "hard limit 0" in r.output and "CAP_SYS_RESOURCE" in r.output
    finally:
        p.kill()
        p.wait()


def test_capture_raises_rlimit_core_and_sets_the_filter(sleeper, tmp_path):
    # GIVEN a process with RLIMIT_CORE 0/unlimited
    # WHEN it is captured with --full
    r = CliRunner().invoke(cli, ["capture", "--pid", str(sleeper.pid), "--core-dir", str(tmp_path / "cores"), "--full",
                                 "--json"])
    # THEN the limit reads back unlimited from /proc/PID/limits and file-backed mappings are dumped
    assert r.exit_code in (0, 4), r.output
    doc = json.loads(r.output)
    assert doc["command"] == "capture"
    assert doc["rlimit_core_before"] == ["0", "unlimited"]
    assert doc["rlimit_core_after"] == ["unlimited", "unlimited"]
    assert "Max core file size" in Path(f"/proc/{sleeper.pid}/limits").read_text()
    assert Path(f"/proc/{sleeper.pid}/coredump_filter").read_text().strip() == "0000003f"
    assert doc["core_pattern"] == Path("/proc/sys/kernel/core_pattern").read_text().strip()
    assert doc["destination"]["reasons"]
    bundle = Path(doc["bundle"])
    assert verify_manifest(str(bundle)) == []
    paths = [i["path"] for i in read_manifest(str(bundle))["items"]]
    assert paths == sorted(paths) and paths[0] == "00-identity.json"
    # a second capture makes a second bundle, never overwriting the first
    r2 = CliRunner().invoke(cli, ["capture", "--pid", str(sleeper.pid), "--core-dir", str(tmp_path / "cores"),
                                  "--json"])
    assert json.loads(r2.output)["bundle"] != doc["bundle"] and bundle.is_dir()


def test_capture_errors_are_clear(tmp_path):
    # PID gone
    p = subprocess.Popen(["true"])
    p.wait()
    r = CliRunner().invoke(cli, ["capture", "--pid", str(p.pid), "--core-dir", str(tmp_path)])
    assert r.exit_code == 1 and "does not exist" in r.output
    # not root (effective uid nobody; the saved uid 0 lets the test come back)
    os.seteuid(65534)
    try:
        r = CliRunner().invoke(cli, ["capture", "--pid", str(os.getpid()), "--core-dir", str(tmp_path)])
    finally:
        os.seteuid(0)
    assert r.exit_code == 1 and "needs root" in r.output, r.output
    # bad usage
    r = CliRunner().invoke(cli, ["capture", "--core-dir", str(tmp_path)])
    assert r.exit_code == 2


@pytest.fixture
def container(tmp_path):
    """A process in its own mount + PID namespace, NVML bind-mounted from the host dir, in a kubepods cgroup."""
    from forensics.simnvml import build_simnvml

    host = build_simnvml(tmp_path / "host")  # libnvidia-ml.so.580.126.09 + the .so.1 link
    real = next(p for p in host.iterdir() if p.name.startswith("libnvidia-ml.so.5"))
    ctr = tmp_path / "ctr"
    (ctr / "usr/lib").mkdir(parents=True)
    target = ctr / "usr/lib/libnvidia-ml.so.1"
    target.write_bytes(b"")  # the mount point the toolkit creates in the image
    site = ctr / "site"
    (site / "nvidia_ml_py-12.575.51.dist-info").mkdir(parents=True)
    (site / "pynvml.py").write_text("# the binding\n")
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    script = (f"import ctypes, time; ctypes.CDLL({str(target)!r}); "
              f"open({str(fifo)!r}, 'w').write('ready'); time.sleep(120)")
    inner = f"mount --bind {real} {target} && cd {ctr} && exec {sys.executable} -c \"{script}\""
    env = dict(os.environ, PYTHONPATH=str(site), API_TOKEN="hunter2-secret")
    outer = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private",
                              "sh", "-c", inner], env=env)
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    cg = pod_cgroup(pod_uid, cid)
    try:
        _wait_ready(fifo)
        pid = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        if CGROUP_ROOT.is_dir():
            cg.mkdir(parents=True)
            (cg / "cgroup.procs").write_text(str(pid))
        yield {"pid": pid, "real": real, "target": target, "pod_uid": pod_uid, "cid": cid, "site": site}
    finally:
        remove_cgroup(cg)  # kills the namespace's PID 1 first: killing unshare alone left it (and its cgroup) behind
        outer.kill()
        outer.wait()


def test_capture_names_the_bind_source_of_nvml_in_a_container(container, tmp_path):
    # WHEN the container's process is captured
    r = CliRunner().invoke(cli, ["capture", "--pid", str(container["pid"]), "--core-dir", str(tmp_path / "cores"),
                                 "--json"])
    assert r.exit_code in (0, 4), r.output
    doc = json.loads(r.output)
    snap = doc["snapshot"]
    # THEN the mapped libnvidia-ml is named with its path in the container and its bind source on the host
    nvml = snap["nvml"]
    assert nvml["path"] == str(container["target"])
    assert nvml["bind_source"] == str(container["real"])
    assert nvml["origin"] == "injected-from-host"
    assert nvml["inode"] == container["real"].stat().st_ino
    assert nvml["version"] == "580.126.09" and nvml["build_id"]
    assert snap["in_container_namespace"] is True
    # the host library is found by the bind source and compared by build-id
    assert nvml["host_library"] == str(container["real"]) and nvml["matches_host"] is True
    # the interpreter, libpython and the nvidia-ml-py files it would import
    py = snap["python"]
    assert py["interpreter"] and py["version"]
    (mod,) = [m for m in py["modules"] if m["module"] == "pynvml"]
    assert mod["path"] == str(container["site"] / "pynvml.py") and mod["version"] == "12.575.51"
    # secrets in the environment are redacted
    assert snap["environ"]["API_TOKEN"] != "hunter2-secret"
    # a file pattern in a container: on its root filesystem the core dies with it
    if not doc["core_pattern"].startswith("|"):
        assert doc["destination"]["persistent"] is False
        assert r.exit_code == 4
    # pod and container identity from the cgroup path, and the container's processes found by ID
    if CGROUP_ROOT.is_dir():
        ident = snap["identity"]
        assert ident["pod_uid"] == container["pod_uid"] and ident["container_id"] == container["cid"]
        assert ident["runtime"] == "containerd" and ident["qos_class"] == "burstable"
        assert find_container_pids(container["cid"]) == [container["pid"]]
        assert find_container_pids("containerd://" + container["cid"][:12]) == [container["pid"]]
    # the text output says the same for a human
    t = CliRunner().invoke(cli, ["capture", "--pid", str(container["pid"]), "--core-dir", str(tmp_path / "cores")])
    assert str(container["real"]) in t.output and "NVIDIA container toolkit" in t.output


def test_capture_on_a_full_disk_is_a_clear_error_and_the_process_stays_armed(tmp_path):
    # GIVEN a bundle directory on a tiny filesystem that is already full
    from tests.helpers import tmpfs

    with tmpfs(tmp_path / "full", "64k") as mnt:
        _capture_onto_a_full_filesystem(mnt, tmp_path)


def _capture_onto_a_full_filesystem(mnt, tmp_path):
    proc = subprocess.Popen(["sleep", "60"],
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, resource.RLIM_INFINITY)))
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: full
        finally:
            os.close(fd)
        # WHEN the process is captured with its bundle on that filesystem
        res = CliRunner().invoke(cli, ["capture", "--pid", str(proc.pid), "--core-dir", str(tmp_path / "cores"),
                                       "-o", str(mnt)])
        # THEN one clear line, exit 1, no traceback, and the process was armed all the same
        assert res.exit_code == 1, res.output
        assert "writing the capture bundle failed" in res.stderr and "Traceback" not in res.output + res.stderr
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert "unlimited" in [ln for ln in limits.splitlines() if ln.startswith("Max core file size")][0]
    finally:
        proc.kill()
        proc.wait()


def _capture_sleeping_python(tmp_path, *args, cwd=None, env=None):
    """`forensics capture --pid` of a Python process (``python -c ... ARGS``) waiting in a sleep."""
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('ready'); import time; time.sleep(60)",
                          *args], cwd=cwd, env=env)
    try:
        _wait_ready(fifo)
        r = CliRunner().invoke(cli, ["capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores"), "--json"])
    finally:
        p.kill()
        p.wait()
    assert r.exit_code in (0, 4), r.output
    return r


def test_capture_names_the_binding_the_process_really_imports(tmp_path):
    """The incident's trap: a stale copy in the working directory shadows the installed binding (pip show lies)."""
    from tests.integration.test_verify_imports_helpers import wheel

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel("nvidia-ml-py", "12.575.51"))], check=True, capture_output=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    (work / "pynvml.py").write_text('__version__ = "11.495.46"\n')  # an old copy left in the working directory
    r = _capture_sleeping_python(tmp_path, cwd=work, env=dict(os.environ, PYTHONPATH=str(site)))
    (mod,) = [m for m in json.loads(r.output)["snapshot"]["python"]["modules"] if m["module"] == "pynvml"]
    # python -c puts the working directory first: the stale copy is what imports, and it is named as such
    assert mod["path"] == str(work / "pynvml.py") and mod["version"] == "11.495.46"
    assert mod["verdict"] == "SHADOWED" and mod["origin"] == "working-directory"
    assert "12.575.51" in mod["reason"]


def test_node_logs_are_read_through_the_host_root(tmp_path):
    """In the agent pod the node is /proc/1/root: container logs are symlinks to /var/log/pods on the node."""
    from forensics.capture.node import read_node_logs

    host = tmp_path / "host"
    pods = host / "var/log/pods/kube-system_nvidia-device-plugin-x_1/nvidia-device-plugin-ctr"
    pods.mkdir(parents=True)
    (pods / "0.log").write_text("2026-11-30T00:00:00Z stderr F NVML: Xid 79 on GPU 3\n")
    mine = host / "var/log/pods/monitoring_exporter-x1_u1/exporter"
    mine.mkdir(parents=True)
    (mine / "0.log").write_text("x" * 300_000 + "\nfree(): invalid next size (normal)\n")
    (host / "var/log/containers").mkdir(parents=True)
    cid = "ab" * 32
    (host / "var/log/containers" / "nvidia-device-plugin-x_kube-system_nvidia-device-plugin-ctr-1.log").symlink_to(
        "/var/log/pods/kube-system_nvidia-device-plugin-x_1/nvidia-device-plugin-ctr/0.log")  # absolute, as on a node
    (host / "var/log/containers" / f"exporter-x1_monitoring_exporter-{cid}.log").symlink_to(
        "/var/log/pods/monitoring_exporter-x1_u1/exporter/0.log")
    (host / "var/log/containers" / "other_default_app-1.log").symlink_to("/etc/shadow")  # not ours: not read
    (host / "var/log/containers" / f"escape-{cid}.log").symlink_to("../../../../../../etc/hostname")  # stays inside
    logs = read_node_logs(["u1", cid], host_root=str(host))
    plugin = logs["device-plugin-nvidia-device-plugin-x_kube-system_nvidia-device-plugin-ctr-1.log"]
    assert "Xid 79" in plugin
    mine_log = logs[f"container-exporter-x1_monitoring_exporter-{cid}.log"]
    assert mine_log.endswith("free(): invalid next size (normal)\n") and len(mine_log) <= 256 << 10  # the tail
    assert not any("other_default" in k for k in logs)
    assert f"container-escape-{cid}.log" not in logs  # resolved inside the host root, where it does not exist


def test_capture_masks_secrets_given_as_separate_arguments(tmp_path):
    """`--token VALUE` is two argv items; the value goes wherever it appears (argv and environment)."""
    secret, other = "s3cr3t-token-value-42", "hunter2-password-77"
    r = _capture_sleeping_python(tmp_path, "--token", secret, "--password", other, "--verbose",
                                 env=dict(os.environ, EXPORTER_OPTS=f"--token {secret}"))
    doc = json.loads(r.output)
    bundle = Path(doc["bundle"])
    on_disk = "".join(f.read_text(errors="replace") for f in bundle.rglob("*") if f.is_file())
    assert secret not in r.output and other not in r.output and secret not in on_disk and other not in on_disk
    cmdline = doc["snapshot"]["cmdline"]
    assert cmdline[-5:] == ["--token", "[REDACTED]", "--password", "[REDACTED]", "--verbose"]
    assert doc["snapshot"]["environ"]["EXPORTER_OPTS"] == "--token [REDACTED]"


def _wait_ready_bounded(fifo: Path, p: subprocess.Popen, timeout: float = 30.0) -> None:
    import select

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert p.poll() is None, "the process died before it was ready"
            if select.select([fd], [], [], 0.1)[0] and os.read(fd, 16).startswith(b"ready"):
                return
        raise AssertionError("the process did not say ready")
    finally:
        os.close(fd)


def _fill(d: Path) -> None:
    with open(d / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass


@pytest.mark.parametrize("case", ["read-only-tmpfs", "full-tmpfs", "no-permission"])
def test_an_unwritable_working_directory_is_judged_no_core(tmp_path, core_pattern, case):
    """#20.3: a process whose cwd is read-only (readOnlyRootFilesystem), full or not its to write gets no core,
    and capture must say so (it said "WILL be written", rc 0)."""
    from tests.helpers import tmpfs

    if Path("/proc/sys/kernel/core_pattern").read_text().strip() != "core":
        pytest.skip("kernel.core_pattern is not 'core' (another test holds it)")
    with tmpfs(tmp_path / "cwd", "1M") as cwd:
        # GIVEN a sleeping process in that directory
        if case == "full-tmpfs":
            _fill(cwd)
        if case == "no-permission":
            # nobody's directory; the process is root without CAP_DAC_OVERRIDE (so its limit can still be raised
            # here, where root may lack CAP_SYS_RESOURCE to touch another user's process)
            os.chown(cwd, 65534, 65534)
            cwd.chmod(0o755)
        fifo = cwd / "ready"  # in its cwd, named relatively: nobody cannot walk through pytest's 0700 tmp_path
        os.mkfifo(fifo)
        fifo.chmod(0o666)

        def setup():
            if case == "no-permission":
                import ctypes

                PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1
                assert ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) == 0

        # /bin/sh and sleep: nobody may not be allowed into this checkout's interpreter
        p = subprocess.Popen(["/bin/sh", "-c", "echo ready > ready; exec sleep 120"], cwd=cwd, preexec_fn=setup)
        try:
            _wait_ready_bounded(fifo, p)
            fifo.unlink()
            if case == "read-only-tmpfs":  # once the shell has closed the fifo it wrote (EBUSY until then)
                deadline = time.monotonic() + 10
                while subprocess.run(["mount", "-o", "remount,ro", str(cwd)], capture_output=True).returncode:
                    assert time.monotonic() < deadline, "cannot remount the tmpfs read-only"
                    time.sleep(0.05)
            # WHEN it is captured
            r = CliRunner().invoke(cli, ["capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores"),
                                         "--json"])
            # THEN the verdict is "no core", with the reason, and the exit status 4
            assert r.exit_code == 4, r.output
            dest = json.loads(r.output)["destination"]
            assert dest["will_dump"] is False and dest["survives"] is False
            expected = {"read-only-tmpfs": "is on a read-only mount", "full-tmpfs": "has no free space",
                        "no-permission": "is not writable by the process (fsuid 0, fsgid 0, no CAP_DAC_OVERRIDE)"}[case]
            assert any(expected in x for x in dest["reasons"]), dest["reasons"]
            text = CliRunner().invoke(cli, ["capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores")])
            assert "core:            will NOT be written" in text.output
            # AND a real crash there leaves no core: the verdict was right
            os.kill(p.pid, signal.SIGSEGV)
            p.wait(timeout=30)
            assert p.returncode == -signal.SIGSEGV
            cores = [c for c in cwd.iterdir() if c.name.startswith("core") and c.stat().st_size > 0]
            assert cores == []
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(not CGROUP_ROOT.is_dir(), reason="no cgroup hierarchy (v1 pids or v2) here")
def test_a_test_pod_cgroup_leaves_nothing_behind():
    """#20.10: every test run left an empty kubepods cgroup: the PID 1 of an ``unshare --fork`` namespace
    outlived the killed ``unshare`` and kept its cgroup busy until the cleanup had passed."""
    # GIVEN a pod's container cgroup holding a process whose parent is then killed
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "60"])
    cg = pod_cgroup(pod_uid, cid)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(child))
        outer.kill()
        outer.wait()
    finally:
        # WHEN the test removes it
        remove_cgroup(cg)
    # THEN neither the container's cgroup nor the pod's is left
    assert not cg.exists() and not cg.parent.exists()
