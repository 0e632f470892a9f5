"""`forensics reproduce` and `forensics demo` on the simulated NVML with the real PyPI stacks."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, core_pattern):
    return tmp_path_factory.mktemp("reproduce")


def test_clean_node_reproduces_nothing(workdir):
    r = run("reproduce", "--json", "--sim", "--iterations", "20", "--workdir", str(workdir))
    assert r.exit_code == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert [x["outcome"] for x in doc["runs"]] == ["clean", "clean"]
    assert doc["environment"]["gpus"] == "8 x NVIDIA H20" and doc["environment"]["driver"] == "580.126.09"
    assert doc["conclusion"].startswith("neither")


def test_a_driver_fault_keyed_to_threads_crashes_both_and_is_the_drivers(workdir):
    # GIVEN a fault of the simulated driver keyed to calls from non-main threads: the C reproducer makes its calls
    # from as many threads as the Python one (--threads, 2 by default)
    r = run("reproduce", "--json", "--sim", "--sim-fault", "heap", "--sim-fault-thread", "non-main",
            "--iterations", "20", "--workdir", str(workdir))
    assert r.exit_code == EXIT_FINDINGS, r.stderr
    doc = json.loads(r.stdout)
    runs = {x["name"]: x for x in doc["runs"]}
    # THEN both crash, and the driver is blamed -- not the binding, whose code the C reproducer does not run
    assert runs["python"]["outcome"] == "crashed (SIGABRT)" and runs["c"]["outcome"] == "crashed (SIGABRT)"
    assert doc["conclusion"].startswith("both reproducers failed") and "driver" in doc["conclusion"]
    assert Path(runs["python"]["core"]).is_file()
    sig = runs["python"]["signature"]
    assert sig.startswith('SIGABRT "double free or corruption (!prev)"')
    # the simulated library is found by its soname (libnvidia-ml.so.1) and its frames are named
    assert "via nvlink_scratch_overflow (libnvidia-ml.so.580.126.09)" in sig
    assert " in thread " in runs["c"]["verdict"]


def test_fault_in_the_driver_crashes_both(workdir):
    r = run("reproduce", "--json", "--sim", "--sim-fault", "segv", "--iterations", "20", "--workdir", str(workdir))
    assert r.exit_code == EXIT_FINDINGS
    doc = json.loads(r.stdout)
    assert [x["outcome"] for x in doc["runs"]] == ["crashed (SIGSEGV)", "crashed (SIGSEGV)"]
    assert doc["conclusion"].startswith("both reproducers failed") and "driver" in doc["conclusion"]


def test_delayed_corruption_crashes_a_victim_stack_outside_nvml(workdir):
    """The realistic case: the overflow happens in NVML, glibc notices at the caller's later free()."""
    r = run("reproduce", "--json", "--sim", "--sim-fault", "heap-delayed", "--iterations", "20",
            "--workdir", str(workdir))
    assert r.exit_code == EXIT_FINDINGS, r.stderr
    runs = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    for name in ("python", "c"):
        assert runs[name]["outcome"] == "crashed (SIGABRT)", runs[name]
        a = run("analyze", "--json", runs[name]["core"])
        doc = json.loads(a.stdout)["analysis"]
        crashed = next(t for t in doc["snapshot"]["threads"] if t["is_crashed"])
        libs = [f["library"] or "" for f in crashed["native_frames"]]
        symbols = [f["symbol"] or "" for f in crashed["native_frames"]]
        # THEN the crashing stack is glibc's free() called from outside NVML: the victim, not the culprit
        assert doc["crash"]["kind"] == "heap-corruption" and "malloc_printerr" in symbols
        first_free = next(i for i, s in enumerate(symbols) if "free" in s)
        caller = next(lib for lib in libs[first_free:] if "libc.so" not in lib)
        assert "libnvidia-ml" not in caller, list(zip(symbols, libs, strict=True))
        assert not any("libnvidia-ml" in lib for lib in libs[:first_free + 1])
        assert "heap-corruption-detected-late" in [f["rule"] for f in doc["findings"]]


def test_a_mid_run_shutdown_race_is_not_the_exit_time_race(workdir, tmp_path):
    """nvitop < 1.7.1's known race is defined by its phase, too: a SIGSEGV in a non-main thread while the
    interpreter exits.  A query racing an nvmlShutdown the program calls mid-run (the reproducer's
    --shutdown-race) has the same signal and thread, but no thread is exiting: it is not listed."""
    import subprocess

    from forensics.simnvml import ensure_stack_venv

    # a query racing nvmlShutdown in the (simulated) driver: SIGSEGV, its core analysed
    r = run("reproduce", "--json", "--sim", "--sim-fault", "use-after-shutdown", "--shutdown-race",
            "--iterations", "40", "--workdir", str(workdir))
    runs = {x["name"]: x for x in json.loads(r.stdout)["runs"]}
    assert runs["python"]["outcome"] == "crashed (SIGSEGV)", runs["python"]
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), runs["python"]["core"]).exit_code == EXIT_OK
    doc = json.loads(analysis.read_text())["analysis"]
    crashed = next(t for t in doc["snapshot"]["threads"] if t["is_crashed"])
    assert crashed["tid"] != doc["snapshot"]["core"]["pid"]  # a non-main thread, as in the known race
    # a capture of a process of the incident's stack (nvitop 1.5.0 on its sys.path)
    python = ensure_stack_venv("incident")
    p = subprocess.Popen([str(python), "-c",
                          "import nvitop, sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        c = run("capture", "--pid", str(p.pid), "--core-dir", str(tmp_path / "cores"), "-o", str(tmp_path / "out"),
                "--json")
    finally:
        p.kill()
        p.wait()
    assert c.exit_code in (0, 4), c.output
    bundle = json.loads(c.stdout)["bundle"]
    modules = {m["module"]: m for m in json.loads(c.stdout)["snapshot"]["python"]["modules"]}
    assert modules["nvitop"]["version"] == "1.5.0"
    # THEN the exit-time race is not listed: the phase part of its definition does not hold
    doc = json.loads(run("report", "--json", str(analysis), bundle).stdout)
    assert doc["report"]["known_issues"] == []


def test_duration_bounds_both_reproducers(workdir):
    r = run("reproduce", "--json", "--sim", "--iterations", "100000000", "--duration", "1", "--workdir", str(workdir))
    assert r.exit_code == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert [x["outcome"] for x in doc["runs"]] == ["clean", "clean"]
    for x in doc["reproduce"]["runs"]:
        assert "--duration" in x["command"], x["command"]


def test_nvml_path_names_the_library_both_reproducers_load(workdir, tmp_path):
    """--nvml FILE: a driver's library outside the loader's path (here: the simulated one, built apart)."""
    from forensics.simnvml import build_simnvml

    lib = build_simnvml(tmp_path / "driver") / "libnvidia-ml.so.580.126.09"
    r = run("reproduce", "--json", "--nvml", str(lib), "--iterations", "5", "--workdir", str(workdir))
    assert r.exit_code == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert [x["outcome"] for x in doc["runs"]] == ["clean", "clean"]
    assert doc["environment"]["libnvidia_ml"] == str(lib)
    for x in doc["reproduce"]["runs"]:
        assert x["environment"].get("libnvidia-ml") == str(lib), x["environment"]


def test_nvml_path_must_exist(tmp_path):
    r = run("reproduce", "--nvml", str(tmp_path / "nope.so"), "--workdir", str(tmp_path))
    assert r.exit_code == 1 and "no such file" in r.stderr


def test_demo_incident_end_to_end(tmp_path, core_pattern):
    # WHEN the demo runs the incident's exporter on the simulated node with the heap fault
    out = tmp_path / "demo"
    r = run("demo", "--json", "--out", str(out))
    assert r.exit_code == EXIT_OK, r.stderr
    demo = json.loads(r.stdout)["demo"]
    # THEN the crash was caught, and nvitop's NVLink throughput query is on the crashing Python stack
    assert demo["ok"] and demo["signature"].startswith('SIGABRT "double free or corruption (!prev)"')
    assert any("Device.nvlink_throughput" in f for f in demo["python_frames"])
    analysis = json.loads((out / "analysis.json").read_text())["analysis"]
    assert analysis["snapshot"]["core"]["nvml"]["driver_version"] == "580.126.09"
    canary = json.loads((out / "canary.json").read_text())
    assert canary["summary"]["verdict"] == "FAIL" and canary["canary"]["process_events"]
    report = (out / "report-nvitop.md").read_text()
    assert "query\\_nvlink\\_throughput\\_counters" in report
    # the NVIDIA report's environment is the evidence's: GPUs, driver, CUDA, the mapped library's build-id, kernel
    nvml = analysis["snapshot"]["core"]["nvml"]
    text = (out / "report-nvml.md").read_text().replace("\\", "")
    assert "NVIDIA driver 580.126.09 with NVML 13.580.126 and CUDA 13.0" in text
    assert f"libnvidia-ml.so.580.126.09 (build-id {nvml['build_id']})" in text
    assert "| GPU 7 | NVIDIA H20, GPU-" in text and f"kernel {os.uname().release}" in text
    assert demo["filings"][0].startswith("1. the nvml report -> NVIDIA") and demo["conclusion"].startswith(
        "The evidence points at the NVIDIA driver library")
    # the core's heap: libnvidia-ml's own 0x500-byte scratch buffer (chunk 0x510, 1288 usable bytes) written 8 bytes
    # past its usable size (the next chunk's size word, PREV_INUSE cleared), freed by the library itself inside
    # nvmlDeviceGetFieldValues, and nothing of the Python side points into it: the library's own buffer
    c = analysis["heap"]["corruption"]
    assert c["overflowed"]["size"] == 0x510 and c["usable_size"] == 1288 and c["rejected"] == c["overflowed"]
    assert c["overflow_past_usable"] == 8 and c["first_bytes"] == "1005000000000000" and c["owner"] is None
    assert c["freed_by"]["function"] == "nvlink_scratch_overflow"
    assert c["freed_by"]["call"] == "nvmlDeviceGetFieldValues"
    assert c["verdict"] == "library-own-buffer" and c["verdict_reason"].startswith(
        "the buffer that overflowed is libnvidia-ml.so.580.126.09's own allocation (chunk "
        f"0x{c['overflowed']['address']:x}, size 0x510, 1288 usable bytes), freed by nvlink_scratch_overflow inside "
        "libnvidia-ml.so.580.126.09 during nvmlDeviceGetFieldValues"), c["verdict_reason"]
    assert c["verdict_reason"].endswith("so no binding count was involved"), c["verdict_reason"]
    section = text.split("## What the core's heap says", 1)[1].split("\n## ", 1)[0]
    assert section.lstrip().startswith("Conclusion: points at libnvidia-ml.so.580.126.09, not the binding: the buffer "
                                       "that overflowed is libnvidia-ml.so.580.126.09's own allocation"), section
    # the report's conclusion stays the driver's (the C reproducer crashed too), and the heap says the same
    assert 'conclusion: "driver-fault"' in text.split("\n---", 1)[0]
    assert "The core's heap says the same: the buffer that overflowed is libnvidia-ml.so.580.126.09's own" in text
    assert "Overflow: 8 bytes past its usable size" in section and "First bytes past the end: 10 05 00" in section
    for internal in ("walker", "pyread", "anatomy", "fast locals"):
        assert internal not in section, internal
    # and the timeline says each step
    timeline = (out / "timeline.txt").read_text()
    for step in ("simulated NVML", "incident's stack", "core limit", "kernel wrote", "forensics analyze",
                 "forensics report"):
        assert step in timeline
    # a second run never overwrites the first
    r2 = run("demo", "--out", str(out))
    assert r2.exit_code == 1 and "not empty" in r2.stderr
