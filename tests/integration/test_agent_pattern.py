"""`forensics agent serve` watching kernel.core_pattern for real (issue 30 item 2).

The handler is installed with the real `forensics capture --install-handler`, the agent runs as its own process
against the API stand-in (its Events recorded there), and kernel.core_pattern is then taken the way
systemd-coredump's sysctl.d file takes it. Everything runs under the suite's core_pattern lock; the pattern from
before is written back and every process started here is ended in `finally`, whether or not the lock was had.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.kube_standin import StandIn, make_node, write_kubeconfig

FORENSICS = Path(sys.executable).parent / "forensics"
PATTERN = Path("/proc/sys/kernel/core_pattern")
SYSTEMD_COREDUMP = "|/lib/systemd/systemd-coredump %P %u %g %s %t %c %h"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="writing kernel.core_pattern needs root")


def _gauge(port: int) -> dict[str, float]:
    """forensics_handler_installed's samples: {reason: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(body)
            if f.name == "forensics_handler_installed" for s in f.samples}


def _wait(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("reclaim", [False, True], ids=["observe", "reclaim"])
def test_pattern_taken_by_systemd_coredump_is_seen_said_and_with_reclaim_taken_back(
        core_pattern_lock, short_core_dir, tmp_path, reclaim):
    node = socket.gethostname()
    procs: list[subprocess.Popen] = []
    old = None
    try:
        with StandIn(path_env=os.environ["PATH"]) as api, core_pattern_lock.exclusive():
            old = PATTERN.read_text()  # read under the lock: another session's momentary pattern is never "restored"
            api.nodes[node] = make_node(node)
            kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
            # GIVEN the handler installed by the real CLI, and the agent running
            subprocess.run([str(FORENSICS), "capture", "--install-handler", "--core-dir", str(short_core_dir)],
                           check=True, capture_output=True, timeout=60)
            ours = PATTERN.read_text().strip()
            assert ours.startswith(f"|{FORENSICS} core-handler")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            procs.append(subprocess.Popen(
                [str(FORENSICS), "agent", "serve", "--core-dir", str(short_core_dir), "--node-name", node,
                 "--metrics-port", str(port), "--kubeconfig", kubeconfig] + (["--reclaim-pattern"] if reclaim else []),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={"PATH": os.environ["PATH"],
                                                                       "HOME": str(tmp_path)}))

            def gauge():
                try:
                    return _gauge(port)
                except OSError:
                    assert procs[0].poll() is None, procs[0].stderr.read()
                    return None
            assert _wait("the agent serves the gauge", gauge) == {"installed": 1.0}
            # WHEN systemd-coredump takes the pattern (as its sysctl.d file does when its package starts)
            PATTERN.write_text(SYSTEMD_COREDUMP)
            # THEN a node Event says so, within the agent's round and the Events' flush
            events = _wait("a node Event", lambda: [e for e in list(api.events)
                                                     if e["regarding"]["kind"] == "Node"])
            (ev,) = events
            assert ev["regarding"]["name"] == node and ev["apiVersion"] == "events.k8s.io/v1"
            assert ev["reason"] == "CorePatternReplaced" and ev["type"] == "Warning"
            assert "replaced-by-systemd-coredump" in ev["note"] and "systemd-coredump" in ev["note"]
            if not reclaim:
                # the gauge is 0 with the reason, and the pattern is left to systemd-coredump
                assert ev["action"] == "Observed"
                assert _wait("the gauge at 0", lambda: _gauge(port) == {"replaced-by-systemd-coredump": 0.0})
                assert PATTERN.read_text().strip() == SYSTEMD_COREDUMP
            else:
                # the handler's pattern is written back, and the gauge is 1 again
                assert ev["action"] == "Reclaimed"
                _wait("the pattern taken back", lambda: PATTERN.read_text().strip() == ours)
                assert _wait("the gauge at 1", lambda: _gauge(port) == {"installed": 1.0})
            assert len([e for e in api.events if e["regarding"]["kind"] == "Node"]) == 1  # one per taking
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if old is not None:
            PATTERN.write_text(old)
