"""User mistakes with outputs and inputs, run as a user runs them: one `error:` line, a hint, exit 1.

``-o`` into a directory that does not exist (nothing is created), into /proc or /sys, ``-o -`` as standard
output, an input this user may not read (a real unprivileged process), a kernel thread's PID.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def fleet_files(tmp_path):
    pods = {"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "a", "namespace": "x", "uid": "u1"},
                                       "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}]}
    nodes = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n", "labels": {}}}]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    return ["fleet", "--from", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json")]


@pytest.mark.parametrize("where,why", [
    ("missing/out.txt", "the directory {tmp}/missing does not exist"),
    ("/proc/version", "a file of the kernel's (/proc, /sys)"),
    ("/proc/forensics-out.txt", "no such file or directory"),
    ("/sys/forensics-out.txt", "permission denied"),
], ids=["missing-directory", "proc-file", "proc-new", "sys"])
def test_an_output_that_cannot_be_written_is_one_error(fleet_files, tmp_path, where, why):
    path = where if where.startswith("/") else str(tmp_path / where)
    r = run(*fleet_files, "-o", path, "--force")
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith(f"forensics: error: {path}: cannot write it: {why.format(tmp=tmp_path)}"), r.stderr
    assert "forensics: hint:" in r.stderr and "internal error" not in r.stderr
    assert not (tmp_path / "missing").exists()  # no directory made for it


def test_dash_is_standard_output(fleet_files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(*fleet_files, "-o", "-")
    assert r.exit_code == EXIT_OK, r.output
    assert "1 pod on 1 node, grouped by" in r.stdout and "Wrote" not in r.stderr
    assert not (tmp_path / "-").exists()


def test_report_makes_no_directory_for_its_output(tmp_path, fleet_files):
    doc = tmp_path / "fleet.json"
    r = run(*fleet_files, "--json", "-o", str(doc))
    assert r.exit_code == EXIT_OK, r.output
    target = tmp_path / "nonexistent" / "r.md"
    r = run("report", str(doc), "-o", str(target))
    assert r.exit_code == EXIT_ERROR and "does not exist" in r.stderr, r.output
    assert not target.parent.exists()


def _as_nobody() -> list[str] | None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.parametrize("command", [["analyze"], ["analyze", "--json"], ["report"]])
@pytest.mark.parametrize("closed", ["file", "directory"])
def test_an_input_this_user_may_not_read_is_permission_denied(command, closed):
    # GIVEN a file only root may read (or in a directory only root may search), and a real process of an
    # unprivileged user
    nobody = _as_nobody()
    if nobody is None:
        pytest.skip("needs root and setpriv to run a command as another user")
    d = Path(tempfile.mkdtemp(prefix="forensics-unreadable-"))
    try:
        core = d / "core.4242"
        core.write_bytes(b"\x7fELF" + b"\0" * 200)
        core.chmod(0o600 if closed == "file" else 0o644)
        d.chmod(0o755 if closed == "file" else 0o700)
        # WHEN forensics is run on it as that user
        p = subprocess.run([*nobody, sys.executable, "-m", "forensics", *command, str(core)], capture_output=True,
                           text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    finally:
        shutil.rmtree(d)
    # THEN one error line, its hint, exit 1 (not click's usage error, exit 2; not "no such file")
    assert p.returncode == EXIT_ERROR, p.stderr
    assert p.stderr.startswith(f"forensics: error: {core}: permission denied\nforensics: hint: "), p.stderr


def _a_kernel_thread() -> int | None:
    from forensics.pidstat import read_pid_stat

    for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if name.isdigit():
            st = read_pid_stat(int(name))
            if st is not None and st.kernel_thread:
                return st.pid
    return None


@pytest.mark.parametrize("command", [["capture", "--pid"], ["verify-imports", "--pid"]])
def test_a_kernel_thread_is_no_process_to_capture(command, tmp_path):
    pid = _a_kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread visible in this PID namespace")
    r = run(*command, str(pid), *(["-o", str(tmp_path / "b")] if command[0] == "capture" else []))
    assert r.exit_code == EXIT_ERROR, r.output
    assert f"forensics: error: process {pid} (" in r.stderr and "is a kernel thread" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


def test_the_demos_non_empty_out_gets_a_hint_about_out(tmp_path):
    (tmp_path / "earlier.txt").write_text("x")
    r = run("demo", "--out", str(tmp_path))
    assert r.exit_code == EXIT_ERROR
    assert "is not empty" in r.stderr and "forensics: hint: Give --out a new or empty directory" in r.stderr
    assert "exporter.log" not in r.stderr  # the exporter never started


def test_an_empty_batch_says_what_analyze_looks_for(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    r = run("analyze", str(tmp_path))
    assert r.exit_code == EXIT_ERROR
    assert r.stderr.startswith("forensics: error: no cores or capture bundles found in the given directories (1 other")
    assert "forensics: hint: analyze DIR takes ELF core files" in r.stderr and "core_pattern" in r.stderr


def test_analyze_of_a_capture_taken_before_any_crash_says_so(tmp_path):
    # GIVEN the bundle capture --pid wrote of a live process (before it crashed)
    if os.geteuid() != 0:
        pytest.skip("capture --pid needs root")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        r = run("capture", "--pid", str(sleeper.pid), "--core-dir", str(tmp_path / "cores"), "-o", str(tmp_path / "b"))
        assert r.exit_code in (0, 4), r.output
    finally:
        sleeper.kill()
        sleeper.wait()
    (bundle,) = (tmp_path / "b").iterdir()
    # WHEN it is analyzed
    r = run("analyze", str(bundle))
    # THEN it says what it is and where the core will come from -- not the core handler's metadata-only hint
    assert r.exit_code == EXIT_ERROR
    assert "a capture of a live process (forensics capture), taken before any crash: it holds no core" in r.stderr
    assert "arming.json" in r.stderr and str(tmp_path / "cores") in r.stderr and "RLIMIT_CORE" not in r.stderr


def test_capture_of_ones_own_process_needs_no_root():
    # GIVEN an unprivileged user's process whose soft core limit is 0 (its hard limit unlimited)
    nobody = _as_nobody()
    if nobody is None:
        pytest.skip("needs root and setpriv to run as another user")
    tmp_path = Path(tempfile.mkdtemp(prefix="forensics-own-"))  # pytest's own directories are root's alone
    tmp_path.chmod(0o777)
    sleeper = subprocess.Popen([*nobody, "prlimit", "--core=0:unlimited", "sleep", "60"])
    try:
        pid = sleeper.pid  # setpriv and prlimit exec: the PID is the sleeper's own
        deadline = time.monotonic() + 10
        while b"sleep" not in Path(f"/proc/{pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        # WHEN the same user captures it
        p = subprocess.run([*nobody, sys.executable, "-m", "forensics", "capture", "--pid", str(pid), "--core-dir",
                            str(tmp_path / "cores"), "-o", str(tmp_path / "b")], capture_output=True, text=True,
                           timeout=300, cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        limits = Path(f"/proc/{pid}/limits").read_text()
    finally:
        sleeper.kill()
        sleeper.wait()
        shutil.rmtree(tmp_path)
    # THEN its soft limit is raised to its hard one, without root
    assert p.returncode in (0, 4), p.stderr
    assert "needs root" not in p.stderr and f"process {pid} (sleep) armed" in p.stdout
    assert re.search(r"Max core file size\s+unlimited\s+unlimited", limits), limits


def test_agent_serve_refuses_a_core_directory_that_is_not_there(tmp_path):
    # GIVEN a --core-dir with a typo, and one that is a file
    (tmp_path / "file").write_text("x")
    for core_dir, why in ((tmp_path / "typo", "no such directory"), (tmp_path / "file", "not a directory")):
        # WHEN the agent is started on it
        r = run("agent", "serve", "--core-dir", str(core_dir), "--metrics-port", "0", "--no-events")
        # THEN it does not watch it forever without a word: one error line, a hint, exit 1
        assert r.exit_code == EXIT_ERROR, r.output
        assert r.stderr.startswith(f"forensics: error: core directory {core_dir}: {why}\nforensics: hint: "), r.stderr
    assert not (tmp_path / "typo").exists()


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_ctrl_c_ends_agent_serve_with_130(tmp_path):
    # GIVEN a running agent (its index written: it is serving)
    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "forensics", "agent", "serve", "--core-dir", str(core_dir),
                          "--metrics-port", str(port), "--no-events"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status == 200
        except OSError:
            return p.poll() is not None

    try:
        _wait_for(healthy, 120, "agent not serving")
        assert p.poll() is None, p.communicate()
        # WHEN it gets SIGINT (Ctrl-C)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # THEN it stops as for SIGTERM and exits as an interrupted command does (README: 130), not 0
    assert p.returncode == EXIT_INTERRUPTED, err
    assert err.rstrip().endswith("forensics: interrupted"), err


@pytest.mark.parametrize("command", [["analyze", "{core}"], ["report", "{core}"], ["fleet", "--from", "{pods}",
                                                                                    "--nodes", "{nodes}"]],
                         ids=["analyze", "report", "fleet"])
def test_an_output_that_is_a_directory_is_the_documented_error(command, fleet_files, tmp_path):
    # GIVEN -o naming a directory (docs/errors.md: "FILE is a directory")
    (tmp_path / "core").write_bytes(b"")
    args = [a.format(core=tmp_path / "core", pods=fleet_files[2], nodes=fleet_files[4]) for a in command]
    # WHEN the command is run, the fast path of analyze included (a subprocess: click is not the parser there)
    p = subprocess.run([sys.executable, "-m", "forensics", *args, "-o", str(tmp_path)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # THEN one error line and its hint, exit 1 -- not click's usage error (exit 2)
    assert p.returncode == EXIT_ERROR, p.stderr
    assert p.stderr == (f"forensics: error: {tmp_path}: cannot write it: a directory\nforensics: hint: Choose another "
                        "--output path in a directory that exists and that you may write (forensics creates no "
                        "directory for it), or --output - for standard output.\n"), p.stderr


@pytest.mark.parametrize("closed", ["the directory", "a directory inside it"])
def test_analyze_of_a_directory_this_user_may_not_read_is_permission_denied(closed):
    # GIVEN a core directory only root may read (or one of its subdirectories), and an unprivileged user
    nobody = _as_nobody()
    if nobody is None:
        pytest.skip("needs root and setpriv to run a command as another user")
    d = Path(tempfile.mkdtemp(prefix="forensics-closed-"))
    top, sub = d / "cores", d / "cores" / "crashes"
    try:
        sub.mkdir(parents=True)
        (sub / "core.4242").write_bytes(b"\x7fELF" + b"\0" * 200)
        d.chmod(0o755)
        (top if closed == "the directory" else sub).chmod(0o700)
        top.chmod(0o700 if closed == "the directory" else 0o755)
        # WHEN analyze is given the directory as that user
        p = subprocess.run([*nobody, sys.executable, "-m", "forensics", "analyze", str(top)], capture_output=True,
                           text=True, timeout=120, cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    finally:
        shutil.rmtree(d)
    # THEN it says "permission denied" (with the hint, or as the batch's unreadable entry), never "no cores found"
    assert "no cores or capture bundles found" not in p.stderr, p.stderr
    if closed == "the directory":
        assert p.returncode == EXIT_ERROR, p.stderr
        assert p.stderr.startswith(f"forensics: error: {top}: permission denied\nforensics: hint: Run as a user "), \
            p.stderr
    else:
        assert p.returncode == 3, p.stdout + p.stderr
        assert f"Unreadable:\n  {sub}: permission denied" in p.stdout, p.stdout


@pytest.mark.parametrize("args", [["analyze", "--timeout", "-1", "core"], ["analyze", "--timeout=0", "core"],
                                  ["capture", "--pid", "1", "--timeout", "-5"],
                                  ["reproduce", "--sim", "--duration", "0"],
                                  ["reproduce", "--sim", "--timeout", "nan"]],
                         ids=" ".join)
def test_a_duration_of_zero_or_less_is_refused(args, tmp_path):
    # GIVEN a duration that cannot be one; WHEN the command is run (analyze through its click-free fast path too)
    (tmp_path / "core").write_bytes(b"")
    p = subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # THEN it is refused before any work, a usage error naming the option
    assert p.returncode == 2, p.stderr
    assert "a duration is a number of seconds above 0" in p.stderr and "Invalid value for '--" in p.stderr, p.stderr
