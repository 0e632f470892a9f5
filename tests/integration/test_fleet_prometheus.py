"""`forensics fleet --prometheus` against a real Prometheus (Debian's, started here on 127.0.0.1).

Prometheus scrapes kube-state-metrics' exposition of the incident's 207-pod fleet (served by a
small test server from tests/fleetgen.py's pod and node objects) and three `forensics agent serve`
processes standing for three H20 nodes, each fed real kernel cores through the real core handler.
The table must equal `fleet --from` on the same pod and node objects, plus the fingerprints.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fleetgen import incident_fleet
from tests.ksm_exposition import ksm_text, serve_ksm
from tests.integration.test_agent_serve import AgentProcess, container, handle, kernel_cores, wait_analyzed  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root")


class Prometheus:
    def __init__(self, workdir: Path, targets: dict[str, list[str]], *, web_config: str | None = None,
                 rule_files: tuple[str, ...] = (), target_labels: dict[str, dict[str, str]] | None = None,
                 discovered: tuple[str, ...] = ()) -> None:
        """``targets``: job -> its targets, scraped with honor_labels (as kube-state-metrics is); a job in
        ``discovered`` is scraped as a service-discovery job is by default (honor_labels false: a scraped label that
        the target has too is stored as exported_LABEL); ``target_labels``: target -> the labels its target has
        (what kubernetes_sd relabelling gives a pod: namespace, pod, node)."""
        from tests.prometheus_env import PrometheusUnavailable, prometheus_binary

        try:
            binary = prometheus_binary()
        except PrometheusUnavailable as e:
            pytest.skip(f"no Prometheus: {e}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        jobs = []
        for job, tg in targets.items():
            static = "".join(f"      - targets: [{t!r}]\n"
                             f"        labels: {json.dumps((target_labels or {}).get(t, {}))}\n" for t in tg)
            jobs.append(f"  - job_name: {job}\n    honor_labels: {str(job not in discovered).lower()}\n"
                        f"    static_configs:\n{static}")
        cfg = workdir / "prometheus.yml"
        rules = "rule_files:\n" + "".join(f"  - {json.dumps(r)}\n" for r in rule_files) if rule_files else ""
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + rules + "scrape_configs:\n"
                       + "".join(jobs))
        web = []
        if web_config:
            (workdir / "web.yml").write_text(web_config)
            web = [f"--web.config.file={workdir / 'web.yml'}"]
        with open(workdir / "prometheus.log", "w") as log:  # Prometheus keeps its own copy of the descriptor
            self.proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}", *web], stdout=log,
                                         stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list:
        data = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]

    def wait_for(self, expr: str, value: float, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                r = self.query(expr)
                last = r
                if r and float(r[0]["value"][1]) == value:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{expr} never became {value}: {last}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()



def _groups(doc: dict) -> dict:
    f = doc["fleet"]
    keep = ("key", "nodes", "pods", "pods_with_restarts", "total_restarts", "max_restarts", "exit_codes", "reasons",
            "crash_loop", "images")
    return {"groups": sorted(([{k: g[k] for k in keep} for g in f["groups"]]), key=lambda g: str(g["key"])),
            "pods": f["pods"], "nodes": f["nodes"], "crashing": f["crashing_groups"], "clean": f["clean_groups"],
            "boundary": f["boundary"], "mixed": f["mixed_images"]}  # one rule, one order


def test_fleet_from_prometheus_equals_fleet_from_pod_objects_and_adds_fingerprints(
        kernel_cores, container, tmp_path):  # noqa: F811 -- the fixtures imported from test_agent_serve
    # GIVEN the incident's fleet in kube-state-metrics' series, and three agents on three H20 nodes that took
    # real crashes
    pods, nodes = incident_fleet()
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    ksm, ksm_port = serve_ksm(ksm_text(pods, nodes))
    agents = []
    per_node = {"h20-000": (3, 1), "h20-001": (2, 0), "h20-002": (1, 1)}  # (SIGSEGV, SIGABRT) crashes
    prom = None
    try:
        for node, (segv, abrt) in per_node.items():
            core_dir = tmp_path / node
            for _ in range(segv):
                handle(core_dir, container["pid"], signal.SIGSEGV, kernel_cores["segv"])
            for _ in range(abrt):
                handle(core_dir, container["pid"], signal.SIGABRT, kernel_cores["abort"])
            agents.append(AgentProcess(core_dir, node, None, tmp_path))
        for node in per_node:
            wait_analyzed(tmp_path / node, sum(per_node[node]))
        fps = {}
        for c in sorted((tmp_path / "h20-000" / "crashes").iterdir()):
            a = json.loads((c / "60-analysis" / "analysis.json").read_text())["analysis"]
            fps[json.loads((c / "metadata.json").read_text())["signal"]] = a["fingerprint"]
        prom = Prometheus(tmp_path, {"kube-state-metrics": [f"127.0.0.1:{ksm_port}"],
                                     "forensics-agent": [f"127.0.0.1:{a.port}" for a in agents]})
        prom.wait_for("count(kube_pod_info)", 207)
        prom.wait_for("sum(forensics_crashes_total)", 8)
        # WHEN the fleet is asked of Prometheus and of the pod objects
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--json"])
        assert r.exit_code == 0, r.output
        from_prom = json.loads(r.stdout)
        r2 = CliRunner().invoke(cli, ["fleet", "--from", str(tmp_path / "pods.json"),
                                      "--nodes", str(tmp_path / "nodes.json"), "--json"])
        from_objects = json.loads(r2.stdout)
        # THEN the table is the same
        assert _groups(from_prom) == _groups(from_objects)
        # AND each group says which crash happens there, how often: 580 / H20 has both fingerprints
        groups = {", ".join(v for _, v in g["key"]): g for g in from_prom["fleet"]["groups"]}
        h20 = groups["NVIDIA-H20, 580.126.09"]
        assert h20["fingerprints"] == {fps[int(signal.SIGSEGV)]: 6, fps[int(signal.SIGABRT)]: 2}
        assert groups["NVIDIA-RTX-6000-Ada-Generation, 570.172.08"]["fingerprints"] == {}
        text = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url]).stdout
        assert f"{fps[int(signal.SIGSEGV)]} x 6, {fps[int(signal.SIGABRT)]} x 2 |" in text
        assert "| NVIDIA-H20, 580.126.09 | 108 | 108 | 106 | 11,648 |" in text
        # a namespace with no pods, and a Prometheus that is not there, are clear errors
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "-n", "nowhere"])
        assert r.exit_code == 1 and "no pods in namespace nowhere" in r.stderr
    finally:
        if prom is not None:
            prom.stop()
        for a in agents:
            a.stop()
        ksm.shutdown()
        ksm.server_close()


def test_unreachable_prometheus_and_bad_options(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", f"http://127.0.0.1:{port}"])
    assert r.exit_code == 1 and "cannot reach it" in r.stderr
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", f"http://127.0.0.1:{port}", "--window", "six hours"])
    assert r.exit_code == 2 and "not a duration" in r.output
    r = CliRunner().invoke(cli, ["fleet", "--window", "6h", "--from", __file__, "--nodes", __file__])
    assert r.exit_code == 2
    token = tmp_path / "missing-token"
    r = CliRunner().invoke(cli, ["fleet", "--prometheus", f"http://127.0.0.1:{port}",
                                 "--bearer-token-file", str(token)])
    assert r.exit_code in (1, 2)


def test_basic_auth(tmp_path):
    """A Prometheus that asks for basic auth (its web config): refused without it, answered with it."""
    import shutil as _shutil

    if _shutil.which("htpasswd") is None:
        pytest.skip("htpasswd (apache2-utils) makes the bcrypt hash Prometheus' web config needs")
    hashed = subprocess.run(["htpasswd", "-nbB", "fleet", "s3cret"], capture_output=True, text=True,
                            check=True).stdout.strip().split(":", 1)[1]
    pods, nodes = incident_fleet()
    ksm, ksm_port = serve_ksm(ksm_text(pods, nodes))
    prom = Prometheus(tmp_path, {"kube-state-metrics": [f"127.0.0.1:{ksm_port}"]},
                      web_config=f"basic_auth_users:\n  fleet: {hashed}\n")
    try:
        deadline = time.monotonic() + 60
        while True:
            r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url, "--basic-auth", "fleet:s3cret", "--json"])
            if r.exit_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["fleet"]["pods"] == 207
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url])
        assert r.exit_code == 1 and "HTTP 401" in r.stderr, r.output
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", prom.url],
                               env={"FORENSICS_PROMETHEUS_BASIC_AUTH": "fleet:s3cret"})
        assert r.exit_code == 0, r.output
    finally:
        prom.stop()
        ksm.shutdown()
        ksm.server_close()
