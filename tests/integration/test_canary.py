"""`forensics canary` against real HTTP servers on 127.0.0.1.

The nvitop-exporter cases live with the simulated NVML.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


class Server:
    def __init__(self, tmp: Path, *flags: str, core_ok: bool = False) -> None:
        self.port_file = tmp / f"port-{len(list(tmp.iterdir()))}"
        self.cwd = tmp

        def limits():
            if core_ok:
                resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

        self.proc = subprocess.Popen([sys.executable, "-m", "tests.expo_server", str(self.port_file), *flags],
                                     cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=limits)
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port_file.read_text()}/metrics"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(tmp_path):
    servers = []

    def start(*flags, core_ok=False):
        s = Server(tmp_path, *flags, core_ok=core_ok)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def test_healthy_endpoint_passes_with_figures(server):
    s = server("--nan")
    r = run("canary", s.url, "--interval", "0",
            "--json", "--requests", "300", "--concurrency", "20", "--expect", "nvitop_gpu_utilization")
    assert r.exit_code == EXIT_OK, r.stdout
    doc = json.loads(r.stdout)
    c, summary = doc["canary"], doc["summary"]
    assert summary["verdict"] == "PASS" and c["requests"] == 300 and c["ok"] == 300
    assert summary["p50"] <= summary["p95"] <= summary["p99"] <= summary["max"]
    assert c["families"]["nvitop_gpu_utilization"] == 8
    # NaN samples are counted per family: the guard's missing NVLink metrics show up like this
    assert c["nan_samples"] == {"nvitop_nvlink_throughput": 8}
    assert c["body_min"] == c["body_max"] > 0


def test_missing_family_and_http_errors_fail(server):
    s = server("--status", "500")
    r = run("canary", s.url, "--interval", "0", "--requests", "50")
    assert r.exit_code == EXIT_FINDINGS
    assert "FAIL because success rate 0.0000 < 1.0" in r.stdout and "HTTP 500: 50" in r.stdout
    s2 = server()
    r = run("canary", s2.url, "--interval", "0", "--requests", "50", "--expect", "nvitop_nvlink_throughput")
    assert r.exit_code == EXIT_FINDINGS and "missing metric families: nvitop_nvlink_throughput" in r.stdout


def test_invalid_exposition_fails(server):
    s = server("--garbage")
    r = run("canary", s.url, "--interval", "0", "--requests", "20")
    assert r.exit_code == EXIT_FINDINGS and "not valid exposition format" in r.stdout


def test_p99_threshold(server):
    s = server()
    r = run("canary", s.url, "--interval", "0", "--requests", "50", "--max-p99", "0.0001")
    assert r.exit_code == EXIT_FINDINGS and "p99 latency" in r.stdout


def test_crash_of_the_watched_process_fails_the_run_and_names_the_core(server, core_pattern):
    # GIVEN a server whose process dies of SIGSEGV (with cores on) in the middle of the soak
    s = server(core_ok=True)
    timer = threading.Timer(0.5, lambda: os.kill(s.proc.pid, signal.SIGSEGV))
    timer.start()
    try:
        r = run("canary", s.url, "--interval", "0",
                "--json", "--requests", "1000000", "--duration", "3", "--pid", str(s.proc.pid))
    finally:
        timer.cancel()
        s.proc.wait()
    # THEN the run fails, says the process exited, and names the new core in its cwd
    assert r.exit_code == EXIT_FINDINGS
    c = json.loads(r.stdout)["canary"]
    assert any("exited" in e or "died" in e for e in c["process_events"])
    assert c["new_cores"] and Path(c["new_cores"][0]).parent == s.cwd
    assert c["errors"]  # scrapes after the crash were refused


def test_too_short_hint_from_fleet_data(server, tmp_path):
    from tests.fleetgen import incident_fleet

    pods, nodes = incident_fleet()
    (tmp_path / "p.json").write_text(json.dumps(pods))
    (tmp_path / "n.json").write_text(json.dumps(nodes))
    fleet_json = tmp_path / "fleet.json"
    assert run("fleet", "--json", "-o", str(fleet_json), "--from", str(tmp_path / "p.json"),
               "--nodes", str(tmp_path / "n.json")).exit_code == 0
    s = server()
    r = run("canary", s.url, "--interval", "0", "--requests", "20", "--fleet", str(fleet_json))
    assert "hint: the fleet crashes" in r.stdout and "run at least" in r.stdout


def test_bad_arguments():
    r = run("canary", "ftp://127.0.0.1/x")
    assert r.exit_code == 1 and "is not an http:// or https:// URL" in r.stderr
    r = run("canary", "http://127.0.0.1:9/metrics", "--requests", "0")
    assert r.exit_code == 1 and "--requests" in r.stderr


@pytest.mark.skipif(__import__("shutil").which("kubectl") is None, reason="kubectl is not installed")
def test_canary_watches_a_pod_through_kubectl(server, tmp_path, monkeypatch):
    """--pod: the real kubectl against the API stand-in; a restart during the run fails it, with the exit code."""
    from tests.kube_standin import StandIn, make_pod, write_kubeconfig

    s = server()
    monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache
    with StandIn(path_env=os.environ["PATH"]) as api:
        api.pods[("monitoring", "exporter-x1")] = make_pod(name="exporter-x1", namespace="monitoring", uid="u1",
                                                         node="n1", container_id="ab" * 32, restarts=3, last_exit=134)
        kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
        args = ("canary", s.url, "--json", "--requests", "1000000", "--duration", "3", "--concurrency", "2",
                "--pod", "exporter-x1", "-n", "monitoring", "--kubeconfig", kubeconfig, "--context", "standin")
        # a quiet pod: PASS
        r = run(*args)
        assert r.exit_code == EXIT_OK, r.output
        # WHEN the pod's container restarts during the run (the kubelet's status changes)
        def restart():
            time.sleep(1.0)
            with api.lock:
                cs = api.pods[("monitoring", "exporter-x1")]["status"]["containerStatuses"][0]
                cs["restartCount"] = 4
                cs["lastState"] = {"terminated": {"exitCode": 139, "reason": "Error", "signal": 11,
                                                  "finishedAt": "2026-11-30T00:00:01Z"}}

        t = threading.Thread(target=restart)
        t.start()
        r = run(*args)
        t.join()
    # THEN it fails, naming the restart and the exit code
    assert r.exit_code == EXIT_FINDINGS, r.output
    c = json.loads(r.stdout)["canary"]
    assert any("pod exporter-x1 restarted 1 times during the run (last exit code 139" in e for e in c["process_events"])
    assert c["verdict"] == "FAIL"


def test_the_soak_stops_as_soon_as_the_watched_process_dies(server):
    """#20.9: scrapes of a dead process are not a soak; they were 248 connection failures."""
    # GIVEN 50 scrapers on a server that is killed half a second in
    s = server()
    timer = threading.Timer(0.5, lambda: os.kill(s.proc.pid, signal.SIGKILL))
    timer.start()
    try:
        r = run("canary", s.url, "--interval", "0",
                "--json", "--requests", "10000000", "--duration", "20", "--concurrency", "50",
                "--pid", str(s.proc.pid))
    finally:
        timer.cancel()
        s.proc.wait()
    # THEN it stops at the first failed scrape: about one failure per scraper in flight (the scrapes cut by the
    # kill, a refused one or two while the kernel ends the process), not a failure per scraper per poll; and says why
    c = json.loads(r.stdout)["canary"]
    assert r.exit_code == EXIT_FINDINGS
    assert sum(c["errors"].values()) <= 50 + 10, c["errors"]
    assert c["elapsed"] < 5
    assert c["stopped_early"] == f"pid {s.proc.pid} died: scraping stopped"
    assert any("killed by SIGKILL" in e for e in c["process_events"])


def test_ctrl_c_prints_the_partial_summary_and_exits_130(server):
    # GIVEN a long soak in its own process
    s = server()
    p = subprocess.Popen([sys.executable, "-m", "forensics", "canary", s.url, "--requests", "10000000",
                          "--duration", "60", "--concurrency", "4"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        time.sleep(2.0)
        # WHEN the user presses Ctrl-C
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # THEN the figures of the scrapes made so far are printed, marked, and the exit status is 130
    assert p.returncode == 130, (out, err)
    first = out.splitlines()[0]
    assert first.startswith(f"INTERRUPTED: {s.url}: ") and "success 100.00%" in first, out
    assert "stopped early: interrupted (Ctrl-C)" in out
    assert "Traceback" not in err


def test_a_watched_process_its_parent_reaps_is_named_with_its_signal(server, tmp_path):
    # GIVEN a process whose parent (a shell, as a runtime or an init would) reaps it the moment it dies of
    # SIGABRT: no zombie is left whose /proc/PID/stat holds the status
    if os.geteuid() != 0:
        pytest.skip("the kernel's process events need CAP_NET_ADMIN")
    s = server()
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(1.5); os.abort()"
    shell = subprocess.Popen(["sh", "-c", f'ulimit -c 0; {sys.executable} -c "{code}"; sleep 30'],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid = int(shell.stdout.readline())
        # WHEN the canary watches it
        r = run("canary", s.url, "--interval", "0",
                "--json", "--requests", "1000000", "--duration", "6", "--pid", str(pid))
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    # THEN the run fails and says what it died of
    c = json.loads(r.stdout)["canary"]
    assert r.exit_code == EXIT_FINDINGS
    assert f"pid {pid} died during the run: killed by SIGABRT, exit status 134" in c["process_events"], c


def test_an_interval_under_10s_lowers_the_default_timeout_as_prometheus_does(server, tmp_path):
    # GIVEN an endpoint that logs each scrape's headers
    log = tmp_path / "headers.jsonl"
    s = server("--log", str(log))
    # WHEN canary scrapes it every second without --timeout (Prometheus' scrape_timeout default is 10 s, lowered
    # to a shorter scrape_interval)
    r = run("canary", s.url, "--interval", "1", "--duration", "2.5")
    # THEN it runs (it refused: "--timeout 10 is longer than --interval 1"), with a 1 s scrape timeout
    assert r.exit_code == EXIT_OK, r.output
    sent = {json.loads(line)["X-Prometheus-Scrape-Timeout-Seconds"] for line in log.read_text().splitlines()}
    assert sent == {"1"}, sent
    # and a --timeout over the interval, given, is refused with a hint about the options, not about URLs
    r = run("canary", s.url, "--interval", "1", "--timeout", "2")
    assert r.exit_code == 1 and "forensics: error: canary: --timeout 2 is longer than --interval 1" in r.stderr
    assert "forensics: hint: Give --timeout at most --interval, or leave it out" in r.stderr, r.stderr


@pytest.mark.parametrize("option", ["--duration", "--timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_duration_of_zero_or_less_is_refused(option, value):
    r = run("canary", "http://127.0.0.1:9/metrics", option, value)
    assert r.exit_code == 2 and "a duration is a number of seconds above 0" in r.output, r.output


def test_a_load_test_runs_for_its_duration(server):
    # GIVEN a fast endpoint, and a load test without --requests
    s = server()
    # WHEN canary runs back to back with 2 scrapers for 3 s (docs: --interval 0 --concurrency 4 --duration 60)
    t0 = time.monotonic()
    r = run("canary", s.url, "--json", "--interval", "0", "--concurrency", "2", "--duration", "3")
    took = time.monotonic() - t0
    # THEN it scraped for its duration (it stopped after the default 1000 scrapes, in a fraction of a second)
    assert r.exit_code == EXIT_OK, r.output
    doc = json.loads(r.stdout)
    assert doc["canary"]["elapsed"] >= 2.9 and took >= 2.9, (doc["canary"]["elapsed"], took)
