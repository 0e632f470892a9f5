"""guard and canary with the real nvitop / nvitop-exporter (PyPI) on the simulated NVML."""
from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK
from forensics.simnvml import build_simnvml, ensure_stack_venv, sim_environment

TARGET = "nvitop.api.device:Device.nvlink_throughput"
NVLINK_FAMILIES = ("gpu_nvlink_total_tx_throughput_MiBps", "gpu_nvlink_total_rx_throughput_MiBps")


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    return build_simnvml(tmp_path_factory.mktemp("sim"))


@pytest.fixture(scope="module")
def guarded_venv(tmp_path_factory) -> tuple[Path, Path]:
    """A real venv seeing the incident stack (nvitop 1.5.0), with the guard installed in its site-packages."""
    stack_python = ensure_stack_venv("incident")
    stack_site = next(stack_python.parent.parent.glob("lib/python3*/site-packages"))
    d = tmp_path_factory.mktemp("guarded")
    subprocess.run([os.path.realpath(stack_python), "-m", "venv", "--without-pip", str(d / "venv")], check=True)
    site = next((d / "venv").glob("lib/python3*/site-packages"))
    (site / "zz-incident-stack.pth").write_text(f"{stack_site}\n")
    r = run("guard", "--target", TARGET, "--returns", "[]", "--env", "FORENSICS_GUARD_NVLINK", "--out", str(site))
    assert r.exit_code == EXIT_OK, r.stderr
    return d / "venv" / "bin" / "python", site


QUERY = ("from nvitop import Device; import time, json; d = Device(0); d.nvlink_throughput(); time.sleep(0.3); "
         "print(json.dumps([[t.tx, t.rx] for t in d.nvlink_throughput()]))")


def test_guard_switches_the_call_off_and_the_env_switch_back_on(guarded_venv, sim):
    python, _ = guarded_venv
    env = sim_environment(sim)
    on = subprocess.run([str(python), "-c", QUERY], env=env, capture_output=True, text=True, timeout=120)
    assert on.returncode == 0, on.stderr
    assert json.loads(on.stdout) == []
    assert "forensics guard active" in on.stderr and on.stderr.count("forensics guard active") == 1
    off = subprocess.run([str(python), "-c", QUERY], env={**env, "FORENSICS_GUARD_NVLINK": "0"},
                         capture_output=True, text=True, timeout=120)
    assert off.returncode == 0, off.stderr
    values = json.loads(off.stdout)
    assert len(values) == 18 and all(tx > 0 and rx > 0 for tx, rx in values)  # real values from the sim's links
    assert "forensics guard active" not in off.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_exporter(python: Path, env: dict, cwd: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()

    def cores():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen([str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port),
                             "--interval", "0.5", "--hostname", "test-node"], env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=cores)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/metrics"


@pytest.mark.parametrize(
    "case", ["healthy", "heap-fault", "heap-fault-guarded"],
)
def test_canary_against_the_real_exporter(case, guarded_venv, sim, tmp_path, core_pattern):
    python, _ = guarded_venv
    fault = "none" if case == "healthy" else "heap"
    env = sim_environment(sim, fault=fault, fault_after=30)
    if case != "heap-fault-guarded":
        env["FORENSICS_GUARD_NVLINK"] = "0"  # the guard is installed but switched off
    proc, url = _start_exporter(python, env, tmp_path)
    try:
        r = run("canary", url, "--json", "--interval", "0",
                "--requests", "100000", "--duration", "8", "--concurrency", "4",
                "--pid", str(proc.pid), "--expect", "gpu_utilization_Percentage")
        alive_at_end = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    doc = json.loads(r.stdout)
    c = doc["canary"]
    if case == "heap-fault":
        # the exporter dies of the heap corruption during the run: FAIL, with the exit and the core named
        assert r.exit_code == EXIT_FINDINGS
        assert any("died during the run: killed by SIGABRT" in e for e in c["process_events"]), c["process_events"]
        assert c["new_cores"] and Path(c["new_cores"][0]).parent == tmp_path
    else:
        assert r.exit_code == EXIT_OK, c["reasons"]
        assert c["families"]["gpu_utilization_Percentage"] == 8
        if case == "healthy":
            assert not any(f in c["nan_samples"] for f in NVLINK_FAMILIES)
        else:
            # the guard's missing NVLink metrics show up as NaN families; the exporter survived the fault
            assert all(c["nan_samples"].get(f) == 8 for f in NVLINK_FAMILIES)
            assert alive_at_end and not c["process_events"]


def _readme_canary_example() -> list[str]:
    """The first `forensics canary http://127.0.0.1:8000/metrics ...` line of the canary's page (moved out of
    README.md into docs/), as its words; README's tour shows the same line."""
    root = Path(__file__).resolve().parents[2]

    def first(page: str) -> str:
        text = (root / page).read_text()
        return next(ln for ln in text.splitlines() if ln.startswith("forensics canary http://127.0.0.1:8000/metrics"))

    line = first("docs/fleet-guard-canary.md")
    assert first("README.md") == line
    return line.split()[1:]


def test_the_readme_canary_example_passes_a_healthy_exporter(guarded_venv, sim, tmp_path):
    """#32: the README's example (50 scrapes in flight, no pause) failed the healthy exporter with timeouts;
    Prometheus scrapes a target once per scrape_interval."""
    python, _ = guarded_venv
    env = sim_environment(sim, fault="none")
    env["FORENSICS_GUARD_NVLINK"] = "0"
    proc, url = _start_exporter(python, env, tmp_path)
    (tmp_path / "baseline.json").write_text("{}")
    words = _readme_canary_example()
    args = [url if w == "http://127.0.0.1:8000/metrics" else str(proc.pid) if w == "4242"
            else str(tmp_path / "baseline.json") if w == "baseline.json" else w for w in words]
    try:
        # as written, but 31 s instead of its --duration (the last one counts)
        r = run(*args, "--json", "--duration", "31")
        alive = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert r.exit_code == EXIT_OK, r.output
    c = json.loads(r.stdout)["canary"]
    assert alive and c["verdict"] == "PASS" and not c["errors"]
    # at a Prometheus pace: one scrape in flight, 15 s apart (0, 15, 30)
    assert c["concurrency"] == 1 and c["requests"] == 3 and c["ok"] == 3
    # the exporter (prometheus_client) answered what Prometheus asks for: OpenMetrics, gzip-encoded
    assert c["gzip_bodies"] == 3
    assert all(t.startswith("application/openmetrics-text") for t in c["content_types"])
    assert c["families"]["gpu_utilization_Percentage"] == 8
