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


def test_a_working_directory_under_a_directory_of_the_root_is_bound(sid_root):
    """bench/analyze.py makes its sid cores in the forensics cache, under $HOME (/root for root): the root's own
    /root is bound read-only, so bubblewrap could not make the mount point ('Read-only file system')."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    home = Path(os.path.expanduser("~"))
    if home.parts[1:2] in ((), ("tmp",)) or not (sid_root / home.parts[1]).is_dir():
        import pytest

        pytest.skip(f"$HOME ({home}) is not under a directory the root has")
    work = Path(tempfile.mkdtemp(prefix=".forensics-test-roots-", dir=home))
    try:
        cmd = sandbox_command(sid_root, ["/usr/bin/sh", "-c", "echo inside > made-here"], cwd=work)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert (work / "made-here").read_text() == "inside\n"
    finally:
        shutil.rmtree(work)
