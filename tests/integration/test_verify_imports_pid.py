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

from tests.helpers import ready_process

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
    with ready_process([str(venv / "bin" / "python"), "-m", "waiter"], cwd=workdir, env=env) as (proc, words):
        yield proc, workdir, words[0]


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


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a process's namespaces needs root")
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
    # #20 item 8: the hint is about the PID and the image, not about capturing a core
    assert "core" not in out and "ps" in out and "verify-imports IMAGE" in out


def test_extension_modules_of_the_standard_library_are_one_line(shadowed_process):
    # #15 item 7: --pid listed every stdlib extension module at three lines each
    proc, _, _ = shadowed_process
    code, doc, text = run("--pid", str(proc.pid))
    stdlib = [ln for ln in text.splitlines() if "lib-dynload/" in ln and ln.startswith("      loaded:")]
    assert stdlib == [] and "standard-library extension modules loaded, all OK from" in text
    assert len(run("--pid", str(proc.pid), "-v")[2].splitlines()) > len(text.splitlines())


@pytest.fixture
def chrooted_process(tmp_path):
    """``python3 -m waiter`` chrooted into a Debian root (the deb-incident image's files), from /app where a
    stale nvitop 1.5.0 tree shadows the pip-installed 1.7.1."""
    from tests.debian_images import debian_images
    from tests.roots import RootUnavailable

    if os.geteuid() != 0 or shutil.which("chroot") is None:
        pytest.skip("chroot needs root")
    try:
        deb = debian_images()
    except RootUnavailable as e:
        pytest.skip(f"Debian images cannot be built here: {e}")
    root = tmp_path / "chroot"
    # hard links to the cached root (nothing is written through them: --remove-destination replaces, and the
    # interpreter writes no bytecode), the image's upper layer copied over it
    if subprocess.run(["cp", "-al", str(deb.root), str(root)], capture_output=True, timeout=300).returncode != 0:
        shutil.rmtree(root, ignore_errors=True)  # another file system than the cache's: copy it
        subprocess.run(["cp", "-a", str(deb.root), str(root)], check=True, timeout=600)
    subprocess.run(["cp", "-a", "--remove-destination", f"{deb.upper('deb-incident')}/.", str(root)], check=True,
                   timeout=300)
    (root / "app" / "waiter.py").unlink(missing_ok=True)
    (root / "app" / "waiter.py").write_text(WAITER.replace("import nvitop, psutil", "import nvitop"))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/root"}
    with ready_process([shutil.which("chroot"), str(root), "/bin/sh", "-c", "cd /app && exec python3 -m waiter"],
                       env=env) as (proc, words):
        yield proc, root, words[0]


def test_pid_of_a_chrooted_process_reads_its_paths_inside_its_root(chrooted_process):
    # #15 item 6: /proc/PID/cwd of a chrooted process reads as a host path; it is /app inside its root
    proc, root, imported = chrooted_process
    assert imported == "1.5.0"
    code, doc, out = run("--pid", str(proc.pid), "--json")
    r = doc["result"]
    assert r["image"]["root"] == str(root) and r["python"]["working_dir"] == "/app", out
    nv = mod_of(doc, "nvitop")
    assert nv["verdict"] == "SHADOWED" and nv["resolved"]["file"] == "/app/nvitop/__init__.py"
    assert nv["expected"]["file"] == "/usr/local/lib/python3.11/dist-packages/nvitop/__init__.py"
    assert r["python"]["entrypoint"]["interpreter_real"] == "/usr/bin/python3.11" and code == 3
    assert f"root:        {root} (the process runs in a chroot" in run("--pid", str(proc.pid))[2]
    if os.geteuid() == 0:
        code, doc, out = run("--pid", str(proc.pid), "--json", "--execute")
        x = doc["result"]["execute"]
        assert x["agrees"], out
        assert next(m for m in x["modules"] if m["module"] == "nvitop")["file"] == "/app/nvitop/__init__.py"


def mod_of(doc: dict, name: str) -> dict:
    return next(m for m in doc["result"]["modules"] if m["module"] == name)


@pytest.fixture
def upgraded_in_place(tmp_path):
    """A process importing pynvml from a directory where ``pip install --target`` put nvidia-ml-py 12.575.51
    and nvitop 1.6.0, then ``pip install --target --upgrade`` nvidia-ml-py 13.580.126: both dist-infos stay
    and claim pynvml.py, whose content is 13.580.126's."""
    lib = tmp_path / "lib"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(lib)]
    subprocess.run([*pip, str(wheel("nvidia-ml-py", "12.575.51")), str(wheel("nvitop", "1.6.0"))], check=True,
                   capture_output=True, timeout=300)
    subprocess.run([*pip, "--upgrade", str(wheel("nvidia-ml-py", "13.580.126"))], check=True, capture_output=True,
                   timeout=300)
    assert {p.name for p in lib.glob("nvidia_ml_py-*.dist-info")} == {"nvidia_ml_py-12.575.51.dist-info",
                                                                      "nvidia_ml_py-13.580.126.dist-info"}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONPATH": str(lib)}
    code = "import sys, pynvml; print('ready', pynvml.__file__, flush=True); sys.stdin.readline()"
    with ready_process([host_python(), "-c", code], cwd=tmp_path, env=env) as (proc, words):
        yield proc, lib, words[0]


def test_a_conflict_runs_the_distribution_whose_record_hash_the_file_has(upgraded_in_place):
    proc, lib, imported = upgraded_in_place
    assert imported == f"{lib}/pynvml.py"
    # WHEN verified through /proc/PID
    code, doc, out = run("--pid", str(proc.pid), "--json")
    # THEN the file on disk is 13.580.126's (its RECORD hash), so that is what runs, and its known issues apply
    pv = mod_of(doc, "pynvml")
    assert pv["verdict"] == "CONFLICT", out
    assert pv["distribution"]["version"] == "13.580.126" and pv["record_hash_ok"] is True
    assert "the code of nvidia-ml-py 13.580.126 runs and nvidia-ml-py 12.575.51 never imports" in pv["reason"]
    assert "its content has the RECORD hash of nvidia-ml-py 13.580.126" in pv["reason"]
    assert f"remove the stale metadata {lib}/nvidia_ml_py-12.575.51.dist-info" in pv["fix"]
    assert "12.575.51" not in pv["fix"].split("dist-info", 1)[1]  # no downgrade advised
    hits = {h["id"] for h in doc["result"]["known_issues"]}
    assert "nvitop-cuda13-extra-13.580.126" in hits, hits
