"""gdb is always stopped within its bound, whatever it is doing (#13: no run over its time bound).

Found by the core fuzz (tests/fuzz_cores.py, seed 1110 of a 1,500-mutant run): a core whose Python thread
list pointed into 8 MiB of self-referencing words kept gdb printing; at --timeout, forensics stopped reading
gdb's output and waited for it to exit (pygdbmi's exit), while gdb waited for room in its full stdout pipe.
The analysis never ended.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest


def test_a_gdb_that_floods_its_output_past_the_timeout_is_stopped():
    if subprocess.run(["gdb", "--version"], capture_output=True).returncode != 0:
        pytest.skip("gdb is not installed")
    # GIVEN a gdb session told to print without end, under a 1-second timeout (in a child: a hang cannot hang pytest)
    code = textwrap.dedent("""
        import time
        from forensics.errors import GdbTimeout
        from forensics.gdb import GdbSession
        with GdbSession(timeout=5) as s:
            s._start()  # gdb started and our scripts loaded, as for a core
            s.timeout = 1
            t = time.monotonic()
            try:
                # a flood that never ends: a fast machine drains any finite one within the timeout
                s.console("python import sys; [sys.stdout.write('x' * 1_000_000) for _ in iter(int, 1)]")
            except GdbTimeout as e:
                print("timeout:", e)
            print("closed:", s.closed, round(time.monotonic() - t, 1))
    """)
    t = time.monotonic()
    # WHEN the command times out
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the child and the gdb it could not stop
        p.communicate()
        pytest.fail("the session was not closed in 120 s: gdb blocked on its full output pipe, forensics waiting")
    # THEN gdb is stopped and the session closed within the bound (a few seconds), not never
    assert p.returncode == 0, err[-2000:]
    assert "timeout:" in out and "closed: True" in out, out
    assert time.monotonic() - t < 30
