"""Building the simulated NVML and the C reproducer; the sim environment helper."""
from __future__ import annotations

import os
import subprocess

import pytest

from forensics.errors import BuildError, ForensicsError
from forensics.resources import find_reproducers
from forensics.simnvml import SIM_ENV, build_c_reproducer, build_simnvml, sim_environment


def test_build_lays_out_a_driver_install(tmp_path):
    # WHEN the sim is built
    lib_dir = build_simnvml(tmp_path)
    # THEN the versioned file, its soname link and the version string are there
    lib = lib_dir / "libnvidia-ml.so.580.126.09"
    assert lib.is_file() and os.readlink(lib_dir / "libnvidia-ml.so.1") == lib.name
    assert b"NVIDIA Management Library 580.126.09" in lib.read_bytes()
    soname = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "[libnvidia-ml.so.1]" in soname
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    for fn in ("nvmlInitWithFlags", "nvmlDeviceGetFieldValues", "nvmlDeviceGetTemperatureV", "nvmlShutdown"):
        assert f" T {fn}\n" in exported


def test_build_is_skipped_when_up_to_date(tmp_path):
    lib = build_simnvml(tmp_path) / "libnvidia-ml.so.580.126.09"
    before = lib.stat().st_mtime_ns
    build_simnvml(tmp_path)
    assert lib.stat().st_mtime_ns == before
    build_simnvml(tmp_path, force=True)
    assert lib.stat().st_mtime_ns != before


def test_missing_gcc_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/gcc")
    with pytest.raises(BuildError) as e:
        build_c_reproducer(tmp_path)
    assert isinstance(e.value, ForensicsError) and "gcc not found" in str(e.value)


def test_c_reproducer_builds(tmp_path):
    exe = build_c_reproducer(tmp_path, nvml_dir=tmp_path)
    assert os.access(exe, os.X_OK) and exe.name == "nvml_nvlink_fieldvalues"


def test_reproducers_are_found():
    root = find_reproducers()
    assert (root / "simnvml" / "simnvml.c").is_file() and (root / "nvml_nvlink_fieldvalues.py").is_file()


def test_sim_environment():
    env = sim_environment("/x", fault="heap-delayed", base={"LD_LIBRARY_PATH": "/a", "FORENSICS_SIMNVML_GPUS": "3"})
    assert env["LD_LIBRARY_PATH"] == "/x:/a" and "FORENSICS_SIMNVML_GPUS" not in env
    assert set(env) - {"LD_LIBRARY_PATH"} <= set(SIM_ENV)
    with pytest.raises(ValueError):
        sim_environment("/x", fault="nope")
