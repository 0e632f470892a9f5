"""guard on the real nvitop (PyPI), in real interpreters: guards that compose, targets checked where they go.

Two guards on one module (two attributes of ``nvitop.api.device``) once made ``import nvitop`` fail with
RecursionError: each guard's import hook walked ``sys.meta_path`` and called the other's.  A target that
does not exist was written with exit 0 and never acted; one whose class is misspelt stopped the import.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_OK
from forensics.simnvml import build_simnvml, ensure_stack_venv, sim_environment

QUERY = ("import json; from nvitop import Device; d = Device(0); "
         "print(json.dumps([d.nvlink_throughput(), d.nvlink_link_count()]))")


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    return build_simnvml(tmp_path_factory.mktemp("sim"))


@pytest.fixture(scope="module")
def stack_site() -> Path:
    python = ensure_stack_venv("incident")
    return next(python.parent.parent.glob("lib/python3*/site-packages"))


@pytest.fixture
def venv(tmp_path, stack_site) -> tuple[Path, Path]:
    """A fresh venv whose site-packages holds nvitop (a link to the incident stack's) and sees the rest
    of the stack through a .pth: the guards go into its own site-packages, next to nvitop."""
    python = os.path.realpath(stack_site.parent.parent.parent / "bin" / "python")
    subprocess.run([python, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    site = next((tmp_path / "venv").glob("lib/python3*/site-packages"))
    (site / "nvitop").symlink_to(stack_site / "nvitop")
    (site / "zz-incident-stack.pth").write_text(f"{stack_site}\n")
    return tmp_path / "venv" / "bin" / "python", site


def query(python: Path, sim: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", QUERY], env={**sim_environment(sim), **env},
                          capture_output=True, text=True, timeout=120)


def test_two_guards_on_one_module_both_act(venv, sim):
    # GIVEN two guards on two attributes of nvitop.api.device, in the site-packages nvitop is in
    python, site = venv
    for attr, value in (("Device.nvlink_throughput", "[]"), ("Device.nvlink_link_count", "0")):
        r = run("guard", "--target", f"nvitop.api.device:{attr}", "--returns", value, "--out", str(site),
                "--env", "FORENSICS_GUARD_" + attr.split(".")[1].upper())
        assert r.exit_code == EXIT_OK, r.output
        assert "warning" not in r.stderr  # found where it goes: nothing to warn about
    # WHEN nvitop is imported and both are called in a real interpreter
    p = query(python, sim)
    # THEN it imports, both guards act, each says so once
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == [[], 0]
    assert p.stderr.count("forensics guard active") == 2, p.stderr
    # and each switch turns only its own guard off (the simulated node has 18 NVLinks)
    off = query(python, sim, FORENSICS_GUARD_NVLINK_LINK_COUNT="0")
    assert off.returncode == 0, off.stderr[-2000:]
    assert json.loads(off.stdout) == [[], 18]
    assert off.stderr.count("forensics guard active") == 1


def test_a_target_not_in_its_package_is_refused(venv):
    python, site = venv
    for target, why in (("nvitop.api.devices:Device.nvlink_throughput", "no module nvitop.api.devices"),
                        ("nvitop.api.device:Device.nvlinkthroughput", "Device has no attribute nvlinkthroughput"),
                        ("nvitop.api.device:Devic.nvlink_throughput", "has no attribute Devic")):
        r = run("guard", "--target", target, "--returns", "[]", "--out", str(site))
        assert r.exit_code == EXIT_ERROR, r.output
        assert "error: bad guard" in r.stderr and why in r.stderr and "would never act" in r.stderr
        assert "Traceback" not in r.stderr
    assert not list(site.glob("forensics_guard_*"))  # nothing written


def test_a_misspelt_guard_never_stops_the_import(venv, sim, tmp_path):
    # GIVEN a guard written where its package is not (unchecked: a warning), then dropped into site-packages
    python, site = venv
    elsewhere = tmp_path / "layer"
    elsewhere.mkdir()
    r = run("guard", "--target", "nvitop.api.device:Devic.nvlink_throughput", "--returns", "[]",
            "--env", "FORENSICS_GUARD_NVLINK", "--out", str(elsewhere))
    assert r.exit_code == EXIT_OK, r.output
    assert "warning: nvitop is not in" in r.stderr and "not checked" in r.stderr
    for f in elsewhere.iterdir():
        shutil.copy(f, site / f.name)
    # WHEN nvitop is imported
    p = query(python, sim)
    # THEN the import goes on untouched and the guard says it is not active
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)[1] == 18
    assert "forensics guard NOT active: nvitop.api.device:Devic.nvlink_throughput: AttributeError" in p.stderr


def test_the_runbooks_command_works_without_env_or_out(tmp_path, monkeypatch):
    # the incident report prints `forensics guard --target ... --returns '[]'`: no --env, no --out
    monkeypatch.chdir(tmp_path)
    r = run("guard", "--target", "nvitop.api.device:Device.nvlink_throughput", "--returns", "[]")
    assert r.exit_code == EXIT_OK, r.output
    assert "FORENSICS_GUARD_DEVICE_NVLINK_THROUGHPUT=0 turns the guard off" in r.stdout
    assert (tmp_path / "forensics_guard_nvitop_api_device_device_nvlink_throughput.pth").is_file()
