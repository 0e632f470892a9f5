"""The checkout's scripts that README tells to run (the fuzz targets, the agent image's build) under an interpreter
without forensics' dependencies -- the system's python3, not the checkout's .venv/bin/python -- end in one line
naming the fix and exit 1, never a traceback (issue #32: they failed with ModuleNotFoundError tracebacks)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    # a fresh venv of the base interpreter: the standard library only, as the system's python3 on a fresh machine
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    return venv / "bin" / "python"


@pytest.mark.parametrize("script,args", [
    ("tests/fuzz_images.py", ["--count", "1"]),
    ("tests/fuzz_cores.py", ["--count", "1"]),
    (".ci/image/build.py", ["--out", "EXISTING"]),
], ids=["fuzz_images", "fuzz_cores", "image_build"])
def test_a_script_run_without_the_venv_says_so_in_one_line(bare_python, tmp_path, script, args):
    # GIVEN an output path that exists (the build would stop there only after the check) and a scratch directory
    (tmp_path / "EXISTING").mkdir()
    # WHEN the script runs, as README writes it but with the wrong interpreter
    r = subprocess.run([str(bare_python), str(ROOT / script), *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    # THEN one line names the interpreter to use, exit 1, nothing else
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.count("\n") == 1 and f".venv/bin/python {script}" in r.stderr, r.stderr
    assert "crash-forensics" in r.stderr, r.stderr
