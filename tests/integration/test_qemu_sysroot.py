"""qemu-user guests run without a sandbox and without binfmt_misc (issue #38 item 5).

A guest started as ``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3.11`` records its executable as
``ROOT/usr/bin/python3.11``: ``analyze --sysroot ROOT`` alone finds it inside ROOT (never at ``ROOT/ROOT/...``)
and gives the Python stack.  And arm64 programs that exec one another run through a binfmt_misc entry registered
in a user and mount namespace of the tests' own, wherever the machine's binfmt_misc has none.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.crashers.make_core import crash_for_core
from tests.roots import _private_binfmt, binfmt_entry_enabled, private_binfmt_problem, sandbox_command

CRASH = '''import ctypes


def read_label():
    return ctypes.string_at(0x10)


read_label()
'''


@pytest.fixture(scope="module")
def direct_guest_core(arm64_cores, tmp_path_factory) -> tuple[Path, Path]:
    """(qemu's core of the arm64 root's CPython crashed in ctypes, run by qemu-aarch64-static -L ROOT directly,
    the root)."""
    root = arm64_cores.root("bookworm")
    qemu = shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip("qemu-aarch64-static is not installed (apt-get install -y qemu-user-static)")
    run = tmp_path_factory.mktemp("qemu-direct")
    script = run / "crash.py"
    script.write_text(CRASH)
    core = crash_for_core([qemu, "-L", str(root), str(root / "usr/bin/python3.11"), str(script)], run, guest=True,
                          timeout=300, outputs=("crash.py",))
    return core, root


def test_a_guest_core_whose_executable_lies_under_the_sysroot_is_read_with_the_sysroot_alone(direct_guest_core):
    core, root = direct_guest_core
    # GIVEN the core records the executable by its host path, under the root
    r = CliRunner().invoke(cli, ["analyze", "--json", "--sysroot", str(root), str(core)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    a = json.loads(r.stdout)["analysis"]
    assert a["snapshot"]["core"]["args"].startswith(f"{root}/usr/bin/python3.11 ")
    # THEN --sysroot ROOT finds it inside ROOT: the objects through the dynamic linker's list, the Python stack
    assert a["snapshot"]["core"]["mappings_from"] == "link_map"
    exe = next(lib for lib in a["snapshot"]["core"]["libraries"] if lib["path"].endswith("python3.11"))
    assert exe["status"] in ("ok", "unverified") and exe["file_path"] == f"{root}/usr/bin/python3.11", exe
    assert a["snapshot"]["python_stack_status"] == "ok", a["snapshot"]["python_stack_status"]
    (crashed,) = [t for t in a["snapshot"]["threads"] if t["is_crashed"]]
    assert [f["function"] for f in crashed["py_frames"][:3]] == ["string_at", "read_label", "<module>"]
    assert a["crash"]["kind"] == "segv"
    assert a["fingerprint_partial"] is None


def test_arm64_programs_run_through_a_binfmt_entry_of_the_tests_own(arm64_cores, tmp_path, monkeypatch):
    # GIVEN the arm64 root, and the machine's binfmt_misc set aside (FORENSICS_TEST_PRIVATE_BINFMT: as on a machine
    # that has no qemu-aarch64 entry)
    root = arm64_cores.root("bookworm")
    problem = private_binfmt_problem("aarch64")
    if problem is not None:
        if not binfmt_entry_enabled("aarch64"):
            pytest.fail(f"arm64 programs cannot run here at all: {problem}")
        pytest.skip(f"no binfmt_misc of a namespace of the tests' own here (the machine's is used): {problem}")
    monkeypatch.setenv("FORENSICS_TEST_PRIVATE_BINFMT", "1")
    # WHEN an arm64 CPython execs an arm64 CPython (as the agent image's script execs its loader)
    again = "import platform; print(platform.machine())"
    cmd = sandbox_command(root, ["/usr/bin/python3.11", "-c",
                                 f"import os, sys; os.execv(sys.executable, ['python3.11', '-c', {again!r}])"],
                          cwd=tmp_path, emulate="aarch64")
    r = subprocess.run(cmd, capture_output=True, text=True, env={}, timeout=300)
    # THEN it runs, through the namespace's own entry, and the machine's binfmt_misc shows no trace of it
    assert (r.returncode, r.stdout.strip()) == (0, "aarch64"), r.stderr
    assert not Path("/proc/sys/fs/binfmt_misc/forensics-tests-aarch64").exists()
    listed = subprocess.run(_private_binfmt("aarch64", ["/bin/ls", "/proc/sys/fs/binfmt_misc"]), capture_output=True,
                            text=True, timeout=60)
    assert sorted(listed.stdout.split()) == ["forensics-tests-aarch64", "register", "status"], listed.stderr
