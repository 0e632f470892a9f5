"""`forensics agent keep` (forensics/capture/keeper.py) against a procfs of the test's own: the handler installed, the
previous pattern written back on SIGTERM, a pattern another program set since left alone.

The real kernel.core_pattern, the real pod and kubectl: tests/integration/test_agent_privilege.py (under the
suite's core_pattern lock). Here the keeper writes a file laid out as /proc/sys/kernel/core_pattern, and the
SIGTERM is a real signal to this process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from forensics.capture.keeper import keep

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the keeper refuses to run but as root")
PREVIOUS = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h"


@pytest.fixture
def proc(tmp_path) -> Path:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/core_pattern").write_text(PREVIOUS + "\n")
    return tmp_path / "proc"


def _sigterm_once(proc: Path, then=None) -> None:
    """SIGTERM to this process once the keeper has installed the handler (after ``then``, another program's write)."""
    def run():
        deadline = time.monotonic() + 30
        while "core-handler" not in (proc / "sys/kernel/core_pattern").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        if then:
            then()
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=run, daemon=True).start()


def test_sigterm_restores_the_pattern_from_before(short_core_dir, proc):
    lines: list[str] = []
    _sigterm_once(proc)
    r = keep(str(short_core_dir), config={"budget": 1 << 30}, proc=str(proc), say=lines.append)
    assert r["restored"] == PREVIOUS and r["left"] is None
    assert (proc / "sys/kernel/core_pattern").read_text() == PREVIOUS
    assert r["installed"].startswith("|") and " core-handler " in r["installed"]
    assert "restored when this pod stops" in lines[0] and "restored to" in lines[1]
    # the signal handlers are this process's own again
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_pattern_another_program_set_since_is_left_alone(short_core_dir, proc):
    taken = "|/usr/share/apport/apport -p%p -s%s -c%c"
    _sigterm_once(proc, then=lambda: (proc / "sys/kernel/core_pattern").write_text(taken))
    r = keep(str(short_core_dir), proc=str(proc), say=lambda line: None)
    assert r["restored"] is None and r["left"] == taken
    assert (proc / "sys/kernel/core_pattern").read_text() == taken


def test_the_command_refuses_to_run_unprivileged(tmp_path):
    # the CLI as the DaemonSet's keeper container runs it; its proc is the real one, so only its refusal to run
    # unprivileged is checked here (the real run: test_agent_privilege)
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "forensics", "agent", "keep", "--core-dir", str(tmp_path / "c")], capture_output=True,
                       text=True, timeout=60, env={"PATH": os.environ["PATH"], "PYTHONPATH": os.getcwd()},
                       cwd="/")
    assert p.returncode == 1 and p.stderr.startswith("forensics: error: "), p.stderr
    assert "root" in p.stderr
