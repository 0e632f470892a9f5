"""The agent's metrics endpoint (forensics/agent/metricsserver.py) against real sockets on 127.0.0.1: idle,
dripping and oversized connections are closed, a flood makes no thread, and a scrape still answers."""
from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from forensics.agent.metricsserver import MetricsServer


@pytest.fixture
def server():
    s = MetricsServer("127.0.0.1", 0, lambda: b"forensics_up 1\n", content_type="text/plain; version=0.0.4",
                      max_connections=64, timeout=1.0)
    s.start()
    try:
        yield s
    finally:
        s.close()


def _get(server, path="/metrics", method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_scrape_answers_and_other_requests_are_refused(server):
    assert _get(server) == (200, b"forensics_up 1\n")
    for path, method, code in (("/other", "GET", 404), ("/metrics", "POST", 405)):
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(server, path, method)
        assert e.value.code == code


def test_a_flood_of_idle_connections_makes_no_thread_and_a_scrape_still_answers(server):
    # GIVEN the endpoint's threads, made at start
    threads = threading.active_count()
    # WHEN 200 connections are opened and left idle (past the 64 it keeps open)
    flood = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(200)]
    try:
        # THEN no thread was made, a scrape answers, and the oldest were closed to make room
        assert threading.active_count() == threads
        assert _get(server)[0] == 200
        assert _closed_within(flood[0], 10)
        # and the idle ones are closed at the read timeout (1 s here)
        assert _closed_within(flood[-1], 10)
    finally:
        for s in flood:
            s.close()


def test_a_dripping_or_oversized_request_head_is_closed(server):
    # GIVEN a client that sends its request head a byte every 0.2 s, and one that sends 9 KiB of head
    drip = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    big = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000)
        t0 = time.monotonic()
        closed = False
        for ch in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            try:
                drip.send(bytes([ch]))
            except OSError:
                closed = True
                break
            if _closed_within(drip, 0.2):
                closed = True
                break
        # THEN both are closed: the dripping one at its 1 s for the whole head, not after its 200 bytes (40 s)
        assert closed and time.monotonic() - t0 < 30
        assert _closed_within(big, 10)
        assert _get(server)[0] == 200
    finally:
        drip.close()
        big.close()


def test_the_health_path_answers_health_never_the_metrics():
    # GIVEN an endpoint whose process is well, then one whose health check names a reason
    why: list[str | None] = [None]
    s = MetricsServer("127.0.0.1", 0, lambda: b"forensics_up 1\n", content_type="text/plain; version=0.0.4",
                      health=lambda: why[0])
    s.start()
    try:
        # THEN /healthz says ok (not the metrics), and 503 with the reason once it is not well
        assert _get(s, "/healthz") == (200, b"ok\n")
        why[0] = "the agent's loop has not come round"
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(s, "/healthz")
        assert e.value.code == 503 and e.value.read() == b"the agent's loop has not come round\n"
        assert _get(s, "/metrics") == (200, b"forensics_up 1\n")  # the metrics stay where they are
    finally:
        s.close()


def test_the_agent_exports_its_build_and_its_health(tmp_path):
    import platform

    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from forensics.agent.serve import Agent, IndexCollector, ServeConfig

    # GIVEN an agent of a given version, its collector registered as agent serve registers it
    agent = Agent(ServeConfig(core_dir=str(tmp_path / "cores"), node="gpu-a", events=False, version="9.8.7"))
    registry = CollectorRegistry()
    registry.register(IndexCollector(agent))
    agent.refresh()
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    # THEN forensics_build_info is 1 with the version and the Python in its labels
    [sample] = families["forensics_build_info"].samples
    assert sample.labels == {"version": "9.8.7", "python": platform.python_version()} and sample.value == 1
    assert families["forensics_build_info"].type == "gauge"
    # AND the agent is well until its loop has not come round for an analysis' time limit and a minute
    assert agent.health() is None
    agent.beat -= agent.cfg.analysis_timeout + 61 + agent.cfg.poll
    assert "has not come round" in (agent.health() or "")
