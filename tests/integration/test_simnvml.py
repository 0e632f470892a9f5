"""The simulated NVML under the real PyPI stacks, and the two NVML reproducers.

The stacks (nvitop/nvitop-exporter/nvidia-ml-py of the incident and of today) are
installed once into cached venvs (``forensics.simnvml.ensure_stack_venv``); without
access to PyPI those tests are skipped with the reason.
"""
from __future__ import annotations

import json
import re
import resource
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from forensics.errors import BuildError
from forensics.resources import find_reproducers
from forensics.simnvml import build_c_reproducer, build_simnvml, ensure_stack_venv, sim_environment

REPRO_PY = find_reproducers() / "nvml_nvlink_fieldvalues.py"
GPUS, LINKS = 8, 18


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.fixture(scope="session")
def sim_dir(tmp_path_factory) -> Path:
    return build_simnvml(tmp_path_factory.mktemp("simnvml"))


@pytest.fixture(scope="session")
def c_repro(sim_dir) -> Path:
    return build_c_reproducer(sim_dir.parent / "crepro")


_STACKS: dict[str, Path | str] = {}


def stack_python(name: str) -> Path:
    if name not in _STACKS:
        try:
            _STACKS[name] = ensure_stack_venv(name)
        except BuildError as e:
            _STACKS[name] = str(e)
    got = _STACKS[name]
    if isinstance(got, str):
        pytest.skip(f"stack {name} unavailable: {got}")
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_exporter(python: Path, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "0.5"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_no_core,
    )
    return proc, port


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.communicate()


def exporter_abort_message(python: Path, env: dict[str, str], cwd: Path) -> str:
    """Start the exporter, let it run until it dies (90 s at most), assert SIGABRT; its stderr."""
    proc, _port = start_exporter(python, env, cwd)
    try:
        proc.wait(90)
    finally:
        _out, err = stop(proc)
    assert proc.returncode == -signal.SIGABRT, err[-2000:]
    return err


def scrape_until(port: int, proc: subprocess.Popen, ready, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exporter exited {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if ready(text):
                return text
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"/metrics not ready after {timeout}s:\n{text[-2000:]}")


def samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for m in re.finditer(rf"^{family}(?:_[A-Za-z]+)?\{{(.*?)\}} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out.append((labels, float(m.group(2))))
    return out


def run(cmd, env, cwd, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, preexec_fn=_no_core
    )


def verdict(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("VERDICT: ")]
    assert len(lines) == 1 and out.rstrip().splitlines()[-1] == lines[0], out
    return lines[0]


STACK_IDS = [pytest.param("incident", id="stack=incident"), pytest.param("current", id="stack=current")]


_PER_GPU = ("gpu_utilization", "gpu_memory_used", "gpu_memory_total", "gpu_temperature", "gpu_power_usage",
            "gpu_clock_sm", "gpu_pcie_tx_throughput", "gpu_nvlink_total_tx_throughput",
            "gpu_nvlink_total_rx_throughput")


@pytest.mark.parametrize("stack", STACK_IDS)
def test_exporter_serves_every_gpu_and_nvlink_from_the_sim(stack, sim_dir, tmp_path):
    # GIVEN the real nvitop-exporter of the stack on the simulated node, no fault
    python = stack_python(stack)
    proc, port = start_exporter(python, sim_environment(sim_dir), tmp_path)
    try:
        # WHEN /metrics has per-link NVLink values for every GPU, and every family below has been set for every
        # GPU (the exporter sets them one device after another: a scrape during its first pass can lack GPU 7's)
        def ready(t):
            got = samples(t, "gpu_nvlink_tx_throughput")
            return (len(got) == GPUS * LINKS and all(v == v for _l, v in got)
                    and all(len(samples(t, f)) >= GPUS for f in _PER_GPU))

        text = scrape_until(port, proc, ready)
    finally:
        _out, err = stop(proc)
    # THEN every GPU metric family has all 8 GPUs (no more: one each) and NVLink traffic is flowing
    for family in _PER_GPU:
        got = samples(text, family)
        assert sorted(int(lab["index"]) for lab, _v in got) == list(range(GPUS)), family
        assert {lab["devicename"] for lab, _v in got} == {"NVIDIA H20"}, family
    uuids = {lab["uuid"] for lab, _v in samples(text, "gpu_utilization")}
    assert len(uuids) == GPUS and all(u.startswith("GPU-") for u in uuids)
    for family in ("gpu_nvlink_tx_throughput", "gpu_nvlink_rx_throughput"):
        got = samples(text, family)
        assert {(lab["index"], lab["link"]) for lab, _v in got} == {
            (str(g), str(link)) for g in range(GPUS) for link in range(LINKS)
        }
        assert all(v > 0 for _l, v in got), family
    assert "INFO: Found 8 device(s)." in err


@pytest.mark.parametrize("stack", STACK_IDS)
@pytest.mark.parametrize(
    "heap_message,glibc",
    [("prev", "double free or corruption (!prev)"), ("next-size", "free(): invalid next size (normal)")],
    ids=["message=prev", "message=next-size"],
)
def test_exporter_dies_with_the_glibc_message_under_the_heap_fault(stack, heap_message, glibc, sim_dir, tmp_path):
    # GIVEN the exporter on a node whose NVML corrupts the heap in nvmlDeviceGetFieldValues
    env = sim_environment(sim_dir, fault="heap", heap_message=heap_message, fault_after=2)
    # WHEN it scrapes THEN glibc aborts it with the message
    assert glibc in exporter_abort_message(stack_python(stack), env, tmp_path)


def test_exporter_dies_at_a_later_free_under_the_delayed_fault(sim_dir, tmp_path):
    env = sim_environment(sim_dir, fault="heap-delayed", heap_message="next-size")
    assert "free(): invalid next size (normal)" in exporter_abort_message(stack_python("incident"), env, tmp_path)


def test_python_reproducer_is_clean_without_a_fault(sim_dir, tmp_path):
    python = stack_python("current")
    proc = run([python, REPRO_PY, "--iterations", "50", "--threads", "2"], sim_environment(sim_dir), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert verdict(proc.stdout).startswith("VERDICT: clean: 8 GPUs x 18 links x 50 iterations, no crash")
    assert "driver:         580.126.09" in proc.stdout and "nvidia-ml-py 13.580.126" in proc.stdout


def test_python_reproducer_json(sim_dir, tmp_path):
    python = stack_python("incident")
    proc = run([python, REPRO_PY, "--iterations", "5", "--json"], sim_environment(sim_dir), tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["status"] == "clean" and doc["header"]["binding"].startswith("nvidia-ml-py 12.575.51")
    assert doc["header"]["libnvidia_ml"].endswith("libnvidia-ml.so.580.126.09")


def test_c_reproducer_is_clean_without_a_fault(sim_dir, c_repro, tmp_path):
    proc = run([c_repro, "--iterations", "50"], sim_environment(sim_dir), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert verdict(proc.stdout).startswith("VERDICT: clean: 8 GPUs x 18 links x 50 iterations, no crash")
    assert "libnvidia-ml.so.580.126.09" in proc.stdout


def test_c_reproducer_stops_after_its_duration(sim_dir, c_repro, tmp_path):
    t = time.monotonic()
    proc = run([c_repro, "--iterations", "100000000", "--duration", "0.5"], sim_environment(sim_dir), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t < 30
    m = re.match(r"VERDICT: clean: 8 GPUs x 18 links x (\d+) iterations", verdict(proc.stdout))
    assert m and 0 < int(m.group(1)) < 100000000
    assert "duration 0.5s" in proc.stdout


FAULTS = [
    pytest.param("heap", "prev", signal.SIGABRT, "double free or corruption (!prev)", id="fault=heap,message=prev"),
    pytest.param("heap", "next-size", signal.SIGABRT, "free(): invalid next size (normal)",
                 id="fault=heap,message=next-size"),
    pytest.param("heap-delayed", "next-size", signal.SIGABRT, "free(): invalid next size (normal)",
                 id="fault=heap-delayed"),
    pytest.param("segv", "prev", signal.SIGSEGV, "", id="fault=segv"),
]


@pytest.mark.parametrize("fault,message,sig,glibc", FAULTS)
def test_both_reproducers_crash_under_a_driver_fault(fault, message, sig, glibc, sim_dir, c_repro, tmp_path):
    python = stack_python("current")
    env = sim_environment(sim_dir, fault=fault, heap_message=message, fault_after=5)
    for cmd in ([python, REPRO_PY, "--iterations", "20"], [c_repro, "--iterations", "20"]):
        proc = run(cmd, env, tmp_path)
        assert proc.returncode == -sig, (cmd, proc.stdout[-500:], proc.stderr[-500:])
        assert glibc in proc.stderr
        if cmd[0] == c_repro:  # the C reproducer says which call crashed, then dies of the signal
            assert verdict(proc.stdout).startswith(f"VERDICT: crashed: {signal.Signals(sig).name} ")
        else:
            assert "VERDICT" not in proc.stdout


def test_a_fault_keyed_to_threads_crashes_the_reproducers_that_call_from_threads(sim_dir, c_repro, tmp_path):
    # GIVEN a fault only in calls from threads other than the main one
    python = stack_python("current")
    env = sim_environment(sim_dir, fault="heap", fault_thread="non-main")
    # WHEN the reproducers run from background threads, and the C one from its main thread
    py = run([python, REPRO_PY, "--iterations", "20", "--threads", "2"], env, tmp_path)
    c_main = run([c_repro, "--iterations", "20"], env, tmp_path)
    c_threads = run([c_repro, "--iterations", "20", "--threads", "2"], env, tmp_path)
    # THEN the calling pattern, not the queries, triggers it: every run from threads crashes, in C as in Python
    assert py.returncode == -signal.SIGABRT, py.stderr[-500:]
    assert c_main.returncode == 0 and verdict(c_main.stdout).startswith("VERDICT: clean:")
    assert "calling thread: main" in c_main.stdout
    assert c_threads.returncode == -signal.SIGABRT, c_threads.stdout[-500:]
    line = verdict(c_threads.stdout)
    assert line.startswith("VERDICT: crashed: SIGABRT inside call #") and " in thread " in line, line
    assert "calling thread: 2 background thread(s)" in c_threads.stdout


def test_malloc_check_names_the_culprit_of_a_delayed_corruption(sim_dir, tmp_path):
    python = stack_python("incident")
    env = sim_environment(sim_dir, fault="heap-delayed", heap_message="next-size", fault_after=3)
    # default mode: glibc notices at a later free, the process dies without a verdict
    plain = run([python, REPRO_PY, "--iterations", "20"], env, tmp_path)
    assert plain.returncode == -signal.SIGABRT and "VERDICT" not in plain.stdout
    # --malloc-check: the corruption is caught at the call that made it
    checked = run([python, REPRO_PY, "--iterations", "20", "--threads", "1", "--malloc-check"], env, tmp_path)
    line = verdict(checked.stdout)
    assert line.startswith("VERDICT: heap corruption detected at nvmlDeviceGetFieldValues(gpu 3, 36 NVLink"), line
    assert "call #4" in line
    assert "malloc check:   on" in checked.stdout


def test_malloc_check_is_clean_without_a_fault(sim_dir, tmp_path):
    python = stack_python("current")
    proc = run([python, REPRO_PY, "--iterations", "10", "--malloc-check", "--json"], sim_environment(sim_dir), tmp_path)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["status"] == "clean" and doc["header"]["malloc_check"] is True


def test_shutdown_race(sim_dir, tmp_path):
    python = stack_python("current")
    args = [python, REPRO_PY, "--iterations", "40", "--threads", "2", "--shutdown-race"]
    ok = run(args, sim_environment(sim_dir), tmp_path)
    assert ok.returncode == 0 and "queries after nvmlShutdown answered Uninitialized" in verdict(ok.stdout)
    bad = run(args, sim_environment(sim_dir, fault="use-after-shutdown"), tmp_path)
    assert bad.returncode == -signal.SIGSEGV, bad.stdout[-500:]


def test_sim_node_shape_from_environment(sim_dir, tmp_path):
    python = stack_python("current")
    env = sim_environment(sim_dir, gpus=2)
    env.update(FORENSICS_SIMNVML_NAME="NVIDIA A100-SXM4-80GB", FORENSICS_SIMNVML_DRIVER="535.104.05")
    proc = run([python, REPRO_PY, "--iterations", "3", "--json"], env, tmp_path)
    doc = json.loads(proc.stdout)
    assert doc["header"]["gpu_count"] == 2 and doc["header"]["gpus"] == ["NVIDIA A100-SXM4-80GB"]
    assert doc["header"]["driver"] == "535.104.05"
