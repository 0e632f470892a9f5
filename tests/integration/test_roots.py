"""The cached Debian roots of tests/roots.py: built once, complete, and runnable with bubblewrap."""
from __future__ import annotations

import json
import subprocess

from tests.roots import build_root, sandbox_command


def test_sid_root_runs_its_own_interpreters_and_glibc(sid_root, tmp_path):
    # GIVEN the cached unstable root (built by the first test run on this machine)
    marker = json.loads((sid_root / ".forensics-root.json").read_text())
    assert marker["suite"] == "sid" and "python3.14" in marker["packages"] and marker["release_date"]
    # WHEN its interpreters run inside it
    code = "import sys, platform; print(sys.version.split()[0], platform.libc_ver()[1])"
    out = {}
    for v in ("3.13", "3.14", "3.15"):
        cmd = sandbox_command(sid_root, [f"/usr/bin/python{v}", "-c", code], cwd=tmp_path)
        out[v] = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    # THEN each is that version, on the root's glibc (not this machine's 2.36)
    for v, (version, libc) in out.items():
        assert version.startswith(v + "."), out
        assert tuple(map(int, libc.split("."))) >= (2, 41), out
    # and asking again returns the same cached directory without rebuilding
    from tests.conftest import SID_PACKAGES

    assert build_root("sid", list(reversed(SID_PACKAGES))) == sid_root
