"""The minimal NVML reproducers themselves, run for real against the simulated libnvidia-ml.

The C reproducer is what an NVIDIA engineer runs: its header must come first (also when
the very first NVML field-value call crashes), every GPU must be named, nvitop's
link-count rule must hold, and its VERDICT line must carry the call, the GPU, the time
to crash and the crash rate -- without changing the core the kernel writes.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_FINDINGS
from forensics.reproduce import parse_header
from forensics.simnvml import build_c_reproducer, build_simnvml, ensure_stack_venv, find_reproducers, sim_environment


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("reproducers")
    return build_simnvml(d / "sim"), build_c_reproducer(d / "bin")


def run_c(built, tmp_path: Path, *args: str, **sim) -> subprocess.CompletedProcess:
    lib_dir, binary = built
    env = sim_environment(lib_dir, **sim)
    return subprocess.run([str(binary), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2))


def verdict(stdout: str) -> str:
    (line,) = [x for x in stdout.splitlines() if x.startswith("VERDICT: ")]
    return line


def test_c_header_comes_first_when_the_first_call_crashes(built, tmp_path, core_pattern):
    # GIVEN a driver whose very first nvmlDeviceGetFieldValues call (GPU 0's link count) corrupts the heap
    # WHEN the C reproducer runs
    p = run_c(built, tmp_path, "--iterations", "5", fault="heap", fault_after=0)
    # THEN it died of glibc's abort, with its core
    assert p.returncode == -6 and "double free or corruption (!prev)" in p.stderr
    assert (tmp_path / "core").is_file()
    # and the environment header, every GPU named, and the query about to crash were printed before it
    lines = p.stdout.splitlines()
    header = parse_header(p.stdout)
    assert lines[0].startswith("nvml_nvlink_fieldvalues (C, no Python)")
    assert header["driver"] == "580.126.09" and header["nvml"] == "13.580.126" and header["gpu"] == "8 x NVIDIA H20"
    assert header["glibc"] and header["libnvidia-ml"].endswith("libnvidia-ml.so.580.126.09")
    assert header["gpu 0"].startswith("NVIDIA H20, GPU-") and "PCI bus 00000000:18:00.0" in header["gpu 0"]
    assert len([k for k in header if k.startswith("gpu ")]) == 8
    query = next(x for x in lines if x.startswith("query #1:"))
    assert "GPU 0 (GPU-" in query and "fieldId 91 NVML_FI_DEV_NVLINK_LINK_COUNT" in query
    assert lines.index(query) < len(lines) - 1  # printed before the crash line
    # and the crash line names the call, the GPU, the time to crash and the rate
    v = verdict(p.stdout)
    assert v.startswith(
        "VERDICT: crashed: SIGABRT inside call #1 (nvmlDeviceGetFieldValues, link count) on GPU 0 (GPU-")
    assert "time to crash" in v and "crash rate 1 in 1 calls" in v


def test_c_crash_line_leaves_the_core_as_the_kernel_writes_it(built, tmp_path, core_pattern):
    # GIVEN a bad pointer write in the 13th field-value call
    p = run_c(built, tmp_path, "--iterations", "5", fault="segv", fault_after=12)
    assert p.returncode == -11
    assert "SIGSEGV inside call #13 (nvmlDeviceGetFieldValues, NVLink throughput) on GPU 4" in verdict(p.stdout)
    # THEN the core still says what the hardware fault said (address, si_code), with NVML on top of the stack:
    # the crash line's handler returned and the fault repeated under the default action
    r = CliRunner().invoke(cli, ["analyze", "--json", str(tmp_path / "core")], catch_exceptions=False)
    doc = json.loads(r.stdout)["analysis"]
    assert doc["crash"]["signal_name"] == "SIGSEGV" and doc["crash"]["fault_address"] == 0x10
    top = next(t for t in doc["snapshot"]["threads"] if t["is_crashed"])["native_frames"][0]
    assert top["symbol"] == "nvlink_bad_pointer_write" and "on_fatal" not in json.dumps(doc)


def test_c_follows_nvitops_link_count_rule(built, tmp_path):
    # GIVEN GPUs whose link-count field fails: nvitop skips them and never asks for NVLink throughput
    p = run_c(built, tmp_path, "--iterations", "3", nvlinks="error")
    assert p.returncode == 2
    assert p.stdout.count("link count: the field returned Not Supported (3): skipped, as nvitop does") == 8
    assert "36 values" not in p.stdout and "values: fieldId 138" not in p.stdout
    assert verdict(p.stdout).startswith("VERDICT: error: could not start: no GPU reports NVLinks")
    # GIVEN 4 links per GPU THEN each call asks for 8 values: 138 and 139 x scopeId 0-3
    p = run_c(built, tmp_path, "--iterations", "3", nvlinks="4")
    assert p.returncode == 0, p.stdout
    assert "nvmlDeviceGetFieldValues(8 values: fieldId 138 x scopeId 0-3, fieldId 139 x scopeId 0-3)" in p.stdout
    assert verdict(p.stdout).startswith("VERDICT: clean: 8 GPUs x 4 links x 3 iterations, no crash (32 calls in")


def test_c_malloc_check_stops_at_the_culprit_call(built, tmp_path, core_pattern):
    # GIVEN a driver that writes over the caller's array header and returns success (glibc would notice much later)
    p = run_c(built, tmp_path, "--iterations", "50", "--malloc-check", fault="heap-delayed", fault_after=10)
    # THEN under glibc's checking allocator it aborts at the free right after the corrupting call
    assert p.returncode == -6
    header = parse_header(p.stdout)
    assert header["malloc check"].startswith("on (glibc.malloc.check=3)")
    v = verdict(p.stdout)
    assert v.startswith("VERDICT: heap corruption detected: SIGABRT after call #") and "returned on GPU" in v


def test_python_follows_nvitops_link_count_rule(built, tmp_path):
    lib_dir, _ = built
    python = ensure_stack_venv("current")
    env = sim_environment(lib_dir, nvlinks="error")
    p = subprocess.run([str(python), str(find_reproducers() / "nvml_nvlink_fieldvalues.py"), "--iterations", "3"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stdout.count("the link count field returned 3 -> skipped, as nvitop does") == 8
    header = parse_header(p.stdout)
    assert "GPU-" in header["gpu 7"] and "PCI bus 00000000:DB:00.0" in header["gpu 7"]
    assert verdict(p.stdout).startswith("VERDICT: error: could not start: no GPU reports NVLinks")


def test_reproduce_without_a_loadable_library_blames_nothing(tmp_path):
    # GIVEN a node without libnvidia-ml.so.1 anywhere the loader looks
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = str(tmp_path / "empty")
    if any(Path(d, "libnvidia-ml.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                                          "/usr/lib64", "/usr/lib")):
        pytest.skip("this machine has a real libnvidia-ml.so.1 the loader would find")
    # WHEN forensics reproduce runs there (as a user would: a subprocess, its real exit status)
    p = subprocess.run([str(Path(os.sys.executable).parent / "forensics"), "reproduce", "--json", "--stack", "current",
                        "--iterations", "5", "--workdir", str(tmp_path / "w")],
                       env=env, capture_output=True, text=True, timeout=300)
    # THEN it is not a crash and not the driver's fault: exit 1, the hint names --nvml FILE and --sim
    assert p.returncode == EXIT_ERROR, (p.stdout, p.stderr)
    assert "--nvml FILE" in p.stderr and "--sim" in p.stderr and "Traceback" not in p.stderr
    doc = json.loads(p.stdout)  # the partial result is still written
    assert [r["status"] for r in doc["runs"]] == ["could not start", "could not start"]
    assert doc["conclusion"].startswith("no conclusion") and "driver library" not in doc["conclusion"]
    assert "NVIDIA" not in doc["conclusion"]


def test_reproduce_says_detected_once(tmp_path, core_pattern):
    r = CliRunner().invoke(cli, ["reproduce", "--sim", "--sim-fault", "heap-delayed", "--sim-fault-after", "10",
                                 "--malloc-check", "--stack", "current", "--iterations", "40",
                                 "--workdir", str(tmp_path)], catch_exceptions=False)
    assert r.exit_code == EXIT_FINDINGS, r.output
    for line in r.stdout.replace(str(tmp_path), "WORKDIR").splitlines():
        assert line.count("detected") <= 1, line
    assert "python: heap corruption detected at nvmlDeviceGetFieldValues" in r.stdout
    assert "     c: heap corruption detected: SIGABRT after call #" in r.stdout


def test_c_verdict_is_the_last_line_while_other_threads_print(built, tmp_path):
    # GIVEN four querying threads printing a line before every call (--trace), one of them crashing at call #30,
    # and every write(2) of the process slowed by strace's injected delay: a thread still printing when another
    # one crashes is caught in the act (the crash line used to be followed by another thread's "query #N" line)
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace): it slows the threads' writes")
    lib_dir, binary = built
    env = sim_environment(lib_dir, fault="segv", fault_after=30, gpus=2)
    for _ in range(6):
        # WHEN the C reproducer runs under it
        p = subprocess.run([strace, "-f", "-o", "/dev/null", "-e", "trace=write", "-e", "inject=write:delay_exit=20000",
                            str(binary), "--iterations", "50", "--threads", "4", "--trace"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
        # THEN it died of the fault and its crash line is the last line, every time
        assert p.returncode == -11, p.stderr[-500:]
        last = p.stdout.rstrip().splitlines()[-1]
        assert last.startswith("VERDICT: crashed: SIGSEGV inside call #"), p.stdout[-1000:]
