"""Meta tests: modules import alone, public API is declared, the built wheel works outside the checkout."""
from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import forensics

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(m.name for m in pkgutil.walk_packages(forensics.__path__, "forensics."))


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module):
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("module", MODULES)
def test_public_definitions_are_in_all(module):
    path = Path(__import__(module, fromlist=["_"]).__file__)
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{module} has no module docstring"
    public = {
        n.name for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_") and ast.get_docstring(n)
    }
    declared = set(getattr(sys.modules[module], "__all__", ()))
    assert public <= declared, f"{module}: documented but not in __all__: {sorted(public - declared)}"


def test_wheel_ships_gdb_scripts_and_analyzes_outside_the_checkout(tmp_path, cores, newest_python):
    # GIVEN a wheel built from the checkout, installed into a directory of its own
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"),
         str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    wheel = next((tmp_path / "w").glob("crash_forensics-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    # the distribution is crash-forensics ("forensics" on PyPI is another project); the command is forensics
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "\nName: crash-forensics\n" in zipfile.ZipFile(wheel).read(meta).decode()
    points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert "forensics = forensics.cli:main" in points.decode()
    assert "forensics/gdb_scripts/forensics_python.py" in names
    assert "forensics/gdb_scripts/forensics_native.py" in names
    # the agent's Helm chart, its alert rules and dashboard are package data (`forensics agent chart` copies them)
    assert {"forensics/deploy/chart/Chart.yaml", "forensics/deploy/chart/templates/daemonset.yaml",
            "forensics/deploy/chart/files/forensics-alerts.yaml",
            "forensics/deploy/chart/files/forensics-dashboard.json", "forensics/deploy/chart/values.schema.json",
            "forensics/deploy/chart/values-cos.yaml", "forensics/deploy/chart/values-bottlerocket.yaml"} <= set(names)
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # WHEN it analyzes a real core from a directory outside the checkout
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import forensics, sys; print(forensics.__file__, file=sys.stderr); from forensics.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", code, "analyze", "--json", str(cores.get(newest_python, "segv"))],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    # THEN the installed copy was used and both gdb scripts were found
    assert str(target) in r.stderr
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["snapshot"]["python_stack_status"] == "ok"
    assert a["snapshot"]["threads"][0]["py_frames"][0]["function"] == "query_nvlink_throughput_counters"


def test_readme_starts_with_the_install_and_the_two_set_up_commands():
    # the distribution name a user installs is the one pyproject.toml builds, and the two set-up commands stay
    readme = (ROOT / "README.md").read_text()
    head = readme[:readme.index("## Set up and run")]
    name = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
                if line.startswith("name = "))
    # (not published on PyPI yet: the install is from the checkout, and the text names the distribution)
    assert name == "crash-forensics" and "## Install\n\n```sh\npipx install . " in head and f"**`{name}`**" in head
    assert "```sh\nbash .ci/main\n```" in readme
    assert "```sh\nbash .ci/setup && .venv/bin/python -m pytest -q tests\n```" in readme
