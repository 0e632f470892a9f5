"""verify-imports --pid on a live process started from a directory that shadows nvitop.

A real CPython 3.11 venv holds nvitop 1.7.1 (pip-installed, with RECORD); the process runs
``python -m waiter`` from a directory holding a stale nvitop 1.5.0 tree, imports nvitop and psutil
(an extension module /proc/PID/maps then shows), says "ready" and waits on stdin.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from click.testing import CliRunner

from forensics.cli import cli

from .test_verify_imports_helpers import host_python, wheel


pytestmark = pytest.mark.skipif(host_python() is None, reason="CPython 3.11 (pyenv) not found")

WAITER = """import sys
import nvitop, psutil
sys.stdout.write("ready %s\\n" % nvitop.__version__)
sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("pidvenv") / "venv"
    subprocess.run([host_python(), "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
    wheels = [str(wheel("nvitop", "1.7.1")), str(wheel("nvidia-ml-py", "13.580.126")), str(wheel("psutil"))]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(d / "bin" / "python"), "install", "-q", "--no-deps",
                    "--no-index", *wheels], check=True, capture_output=True, timeout=300)
    return d


@pytest.fixture
def shadowed_process(venv, tmp_path):
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    with zipfile.ZipFile(wheel("nvitop", "1.5.0")) as z:
        for n in z.namelist():
            if n.startswith("nvitop/"):
                z.extract(n, workdir)
    (workdir / "waiter.py").write_text(WAITER)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-m", "waiter"], cwd=workdir, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), proc.stderr.read() if proc.poll() is not None else line
        yield proc, workdir, line.split()[1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(*args):
    result = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    doc = json.loads(result.stdout) if "--json" in args and result.exit_code in (0, 3) else None
    return result.exit_code, doc, result.output


def test_pid_catches_the_shadowing_working_directory(shadowed_process, venv):
    proc, workdir, imported = shadowed_process
    assert imported == "1.5.0"  # the live process really runs the stale tree
    # WHEN verified through /proc/PID
    code, doc, out = run("--pid", str(proc.pid), "--json")
    # THEN nvitop is SHADOWED by the working directory, naming both versions
    assert code == 3, out
    mods = {m["module"]: m for m in doc["result"]["modules"]}
    nv = mods["nvitop"]
    assert nv["verdict"] == "SHADOWED" and nv["effective_version"] == "1.5.0" and nv["expected_version"] == "1.7.1"
    assert nv["resolved"]["file"] == f"{workdir}/nvitop/__init__.py" and nv["origin"] == "working-directory"
    assert doc["result"]["image"]["transport"] == "pid"
    assert any("virtual environment" in n for n in doc["result"]["python"]["notes"])
    # the extension module the process has loaded is checked against what a fresh start would import
    ext = [m for m in mods.values() if m["loaded_file"]]
    assert any(m["module"] == "psutil._psutil_linux" and m["verdict"] == "OK" for m in ext), ext
    assert mods["pynvml"]["verdict"] == "OK"


@pytest.mark.skipif(shutil.which("nsenter") is None or os.geteuid() != 0, reason="needs nsenter and root")
def test_pid_execute_agrees(shadowed_process):
    proc, workdir, _ = shadowed_process
    code, doc, out = run("--pid", str(proc.pid), "--json", "--execute")
    x = doc["result"]["execute"]
    assert x["method"] == "nsenter" and x["agrees"], out
    nv = next(m for m in x["modules"] if m["module"] == "nvitop")
    assert nv["file"] == f"{workdir}/nvitop/__init__.py" and nv["version"] == "1.5.0"


def test_pid_of_a_gone_process_is_a_clear_error():
    p = subprocess.Popen(["true"])
    p.wait()
    code, _, out = run("--pid", str(p.pid))
    assert code == 1 and "does not exist" in out
