"""User mistakes with outputs and inputs, run as a user runs them: one `error:` line, a hint, exit 1.

``-o`` into a directory that does not exist (nothing is created), into /proc or /sys, ``-o -`` as standard
output, an input this user may not read (a real unprivileged process), a kernel thread's PID.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_OK

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
    assert "1 pods on 1 nodes" in r.stdout and "Wrote" not in r.stderr
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
