"""#33 item 1: the image's start-up code under ``verify-imports --execute`` can do nothing it cannot do in its
own container.

A live "container" is made here with bubblewrap (``--unshare-all``: its own user, mount, pid, net, ipc, uts and
cgroup namespaces; the host's / read-only, a tmpfs /tmp), running this machine's ``python3`` with a hostile
``sitecustomize`` on its ``PYTHONPATH``.  That code runs once when the container starts and again in the probe
``verify-imports --pid --execute`` runs; each time it tries to reach a listener on the host's 127.0.0.1, to
write a file on the host through a procfs it mounts (``/proc/1/root``, ``/proc/<this test>/root``) and to see
this test's process, and records what it got in a directory the container shares with the test.  For images,
a ``.pth`` allocates 1.5 GB, writes 1 GiB to /tmp (one file, and many) or forks 1,000 times; each must be
stopped by the probe's limits and said in one line.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.imports.execute import PROBE_LIMITS

from tests.helpers import ready_process

from .test_verify_imports_helpers import SITE, Layer, base_blob, host_python, image_config, make_blob, write_oci

PYTHON = "/usr/bin/python3"

HOSTILE = r'''
import ctypes, json, os, socket
rec = {"pid": os.getpid(), "uid": os.getuid()}
try:  # (a process of another pid namespace has no /proc/self in the container's /proc)
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "NoNewPrivs", "Groups"):
                rec[k] = v.strip()
except OSError as e:
    rec["status"] = repr(e)
try:  # the host's loopback
    s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    s.sendall(b"escaped")
    s.close()
    rec["connect"] = "connected"
except OSError as e:
    rec["connect"] = repr(e)
try:  # a fresh procfs: its pid 1's root
    d = "/tmp/hostile-proc-%d" % os.getpid()
    os.makedirs(d, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"proc", d.encode(), b"proc", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount proc")
    rec["fresh_proc_pids"] = sorted(int(x) for x in os.listdir(d) if x.isdigit())
    rec["write"] = []
    for pid in (1, HOST_PID):  # pid 1's root, or the root of a process of ours with no more capabilities
        try:
            with open("%s/%d/root%s" % (d, pid, TARGET), "w") as f:
                f.write("escaped")
            rec["write"] = "written"
            break
        except OSError as e:
            rec["write"].append(repr(e))
except OSError as e:
    rec["write"] = repr(e)
try:  # the test's own process
    os.kill(HOST_PID, 0)
    rec["kill"] = "visible"
except OSError as e:
    rec["kill"] = repr(e)
with open("/tmp/report/records.jsonl", "a") as f:
    f.write(json.dumps(rec) + "\n")
'''

WAITER = "import sys; print('ready', flush=True); sys.stdin.readline()"


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "entering another process's namespaces needs root"
    if shutil.which("bwrap") is None or not os.path.exists(PYTHON):
        return "bubblewrap or /usr/bin/python3 missing (run: bash tests/imports_env.sh)"
    p = subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True)
    return None if p.returncode == 0 else f"bubblewrap cannot create namespaces here: {p.stderr.strip()}"


def _descendant(pid: int, exe: str) -> int:
    """The process under ``pid`` (bubblewrap's monitor, then its init) that runs ``exe``."""
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            if os.path.realpath(f"/proc/{child}/exe") == os.path.realpath(exe):
                return int(child)
            todo.append(int(child))
    raise AssertionError(f"no {exe} under {pid}")


@pytest.fixture
def container(tmp_path, request):
    """The container's pid on this machine (its python3), the listener, the host file, the records; its user is
    ``request.param`` inside (root by default; bubblewrap maps it to root outside)."""
    uid = getattr(request, "param", 0)
    problem = _problem()
    if problem:
        pytest.skip(problem)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    target = tmp_path / "escaped-to-the-host"
    hostile, report = tmp_path / "hostile", tmp_path / "report"
    hostile.mkdir()
    report.mkdir()
    (hostile / "sitecustomize.py").write_text(
        HOSTILE.replace("PORT", str(listener.getsockname()[1])).replace("TARGET", repr(str(target)))
        .replace("HOST_PID", str(os.getpid())))
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
           "--tmpfs", "/tmp", "--bind", str(report), "/tmp/report", "--ro-bind", str(hostile), "/tmp/hostile",
           "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "PYTHONPATH", "/tmp/hostile",
           "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--chdir", "/", "--uid", str(uid), "--gid", str(uid),
           "--", PYTHON, "-c", WAITER]
    try:
        with ready_process(cmd) as (proc, _):
            yield _descendant(proc.pid, PYTHON), listener, target, report / "records.jsonl"
    finally:
        listener.close()


def _accepted(listener: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return got
        conn.settimeout(2)
        got.append(conn.recv(64))
        conn.close()


@pytest.mark.parametrize("container", [0, 1000], indirect=True, ids=lambda u: f"container-uid={u}")
def test_the_probe_does_no_more_than_the_container(container):
    pid, listener, target, records = container
    # GIVEN the container started: its own start-up code ran once, and could do none of it
    own = json.loads(records.read_text().splitlines()[0])
    assert "Refused" in own["connect"] and own["write"] != "written" and "ProcessLookupError" in own["kill"], own
    assert _accepted(listener) == [] and not target.exists()
    # WHEN the probe runs in it
    result = CliRunner().invoke(cli, ["verify-imports", "--pid", str(pid), "--json", "--execute"],
                                catch_exceptions=False)
    # THEN the probe ran (its answer is in the report) ...
    # ... nothing reached the host's loopback, nothing was written on the host through a fresh procfs
    assert not target.exists(), target.read_text()
    assert _accepted(listener) == []
    assert result.exit_code in (0, 3), result.output
    x = json.loads(result.stdout)["result"]["execute"]
    lines = records.read_text().splitlines()
    assert len(lines) == 2, x
    probe = json.loads(lines[1])
    assert "Refused" in probe["connect"] and probe["write"] != "written", probe
    # the test's process is not there to see
    assert "ProcessLookupError" in probe["kill"], probe
    assert probe.get("fresh_proc_pids", [0])[-1] < 100, probe
    # its credentials are the container's: uid, groups, no capability beyond its own, no_new_privs
    assert probe["uid"] == own["uid"] and probe["Groups"] == own["Groups"]
    assert int(probe["CapEff"], 16) & ~int(own["CapBnd"], 16) == 0
    assert int(probe["CapBnd"], 16) & ~int(own["CapBnd"], 16) == 0 and probe["CapInh"] == "0000000000000000"
    assert probe["NoNewPrivs"] == "1"
    ran = next(n for n in x["notes"] if n.startswith("ran in the process's namespaces"))
    assert all(ns in ran for ns in ("user", "mnt", "pid", "net", "ipc", "uts")), ran


def test_a_process_gone_before_the_probe_is_refused_in_one_line(container, monkeypatch):
    # GIVEN a plan read for the PID whose start time is not the process's (what a process that took the PID
    # after the plan was read shows; a test cannot make the kernel reuse a PID on demand)
    pid, _, _, records = container
    from forensics.imports import execute

    plan = execute._enter_plan(pid)
    plan["start"] = str(int(plan["start"]) + 1)
    monkeypatch.setattr(execute, "_enter_plan", lambda p: plan)
    # WHEN the probe is run
    result = CliRunner().invoke(cli, ["verify-imports", "--pid", str(pid), "--execute"])
    # THEN nothing ran in it, and it says why in one line
    assert result.exit_code == 1, result.output
    assert "--execute: namespaces: not run: process" in result.output and "Traceback" not in result.output
    assert len(records.read_text().splitlines()) == 1


def test_a_process_whose_user_namespace_maps_no_uid_is_refused(tmp_path):
    # GIVEN a python3 in a user namespace of its own with no uid_map (unshare --user: it runs as the overflow
    # uid, and no id of ours means anything in it)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")
    with ready_process(["unshare", "--user", PYTHON, "-c", WAITER], cwd=tmp_path) as (proc, _):
        pid = proc.pid  # unshare without --fork execs python3
        # WHEN --execute is asked for
        result = CliRunner().invoke(cli, ["verify-imports", "--pid", str(pid), "--execute"])
    # THEN it runs nothing, and says why in one line
    assert result.exit_code == 1, result.output
    assert (f"--execute: namespaces: not run: the uid 0 / gid 0 of process {pid} is not mapped in its user "
            "namespace") in result.output and "Traceback" not in result.output


# -- the image's sandbox: memory, /tmp, file size, processes -----------------------------------------------

HOGS = {
    # name: (the module a .pth imports, the limit that stops it)
    "memory": ("b = bytearray(1536 << 20)\nraise SystemExit('HOSTILE: allocated 1.5 GB')\n", "memory limit"),
    "one-file": ("with open('/tmp/big', 'wb') as f:\n    for _ in range(1024):\n        f.write(bytes(1 << 20))\n"
                 "raise SystemExit('HOSTILE: wrote 1 GiB')\n", "file-size limit"),
    "many-files": ("for i in range(32):\n    with open('/tmp/f%d' % i, 'wb') as f:\n"
                   "        for _ in range(32):\n            f.write(bytes(1 << 20))\n"
                   "raise SystemExit('HOSTILE: wrote 1 GiB')\n", "space limit"),
    "fork": ("import os, time\nfor i in range(1000):\n    if os.fork() == 0:\n        time.sleep(60)\n"
             "        os._exit(0)\nraise SystemExit('HOSTILE: forked 1000 times')\n", "process limit"),
}


def _bwrap_problem() -> str | None:
    if shutil.which("bwrap") is None or host_python() is None:
        return "bubblewrap or CPython 3.11 (pyenv) missing (run: bash tests/imports_env.sh)"
    p = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
                       capture_output=True, text=True)
    return None if p.returncode == 0 else f"bubblewrap cannot create namespaces here: {p.stderr.strip()}"


@pytest.mark.parametrize("hog", list(HOGS), ids=lambda h: f"hog={h}")
def test_the_image_sandbox_stops_start_up_code_at_its_limits(tmp_path, hog):
    problem = _bwrap_problem()
    if problem:
        pytest.skip(problem)
    code, limit = HOGS[hog]
    # GIVEN an image whose site-packages holds a .pth that imports the hog
    layer = Layer().dir("/srv").file(f"{SITE}/hog.py", code).file(f"{SITE}/hog.pth", "import hog\n")
    blobs = [base_blob(), make_blob(layer.tar_bytes(), tmp_path / "blobs")]
    ref = write_oci(tmp_path / "oci", blobs, image_config(blobs, entrypoint=["python3", "-c", "pass"], workdir="/srv"))
    # WHEN --execute runs its interpreter
    result = CliRunner().invoke(cli, ["verify-imports", ref, "--json", "--execute"], catch_exceptions=False)
    # THEN the hog was stopped (the interpreter went on to answer), and the limit is said in one note
    assert "HOSTILE" not in result.output, result.output
    x = json.loads(result.stdout)["result"]["execute"]
    assert x["startup_error"] is None and x["modules"], x
    said = [n for n in x["notes"] if limit in n]
    assert len(said) == 1 and "hog.pth" in said[0] and "\n" not in said[0], x["notes"]
    text = CliRunner().invoke(cli, ["verify-imports", ref, "--execute"]).output
    assert "Traceback" not in text and limit in text


def test_the_limits_are_what_the_docs_say():
    # verify-imports' page (moved out of README.md) states the probe's limits
    readme = (Path(__file__).resolve().parents[2] / "docs" / "verify-imports.md").read_text()
    for words in (f"{PROBE_LIMITS.data >> 20} MiB", f"{PROBE_LIMITS.address_space >> 30} GiB",
                  f"{PROBE_LIMITS.file_size >> 20} MiB", f"{PROBE_LIMITS.tmpfs >> 20} MiB",
                  f"{PROBE_LIMITS.processes} tasks"):
        assert words in readme, words
