"""``analyze --native-method both`` on real kernel cores: where libdw and gdb agree on what matters (pc,
function, line; the file by its base name; not the frames one of them shows past the program's entry) it says
nothing and exits 0; a real difference is said in one line, exit 4."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.crashers.make_core import crash_for_core

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")

EXIT_OK, EXIT_PARTIAL = 0, 4

STRIPPED_C = r"""
static __attribute__((noinline)) int crash_here(volatile int *p) { return *p + 1; }
static __attribute__((noinline)) int dispatch(volatile int *p) { return crash_here(p) * 2; }
int main(void) { return dispatch((volatile int *)0); }
"""


def _both(*args: str):
    return CliRunner().invoke(cli, ["analyze", "--native-method", "both", *args])


def test_a_debug_build_where_gdb_stops_at_main_agrees(cores, sid_root):
    # GIVEN a core of Debian unstable's debug build of CPython 3.15: gdb's backtrace stops at main, libdw goes on
    # through __libc_start_call_main, __libc_start_main and _start (before: "30 frames (libdw) vs 27 (gdb)", exit 4)
    core = cores.get("sid-3.15d", "segv")
    # WHEN both unwinders run
    r = _both("--json", "--sysroot", str(sid_root), str(core))
    # THEN they agree: nothing said, exit 0
    assert r.exit_code == EXIT_OK, r.output[-2000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["native_disagreements"] == [] and snap["requested_native_method"] == "both"
    frames = snap["threads"][0]["native_frames"]
    assert frames[-1]["symbol"] == "_start", [f["symbol"] for f in frames]  # libdw's stack is the one shown


def test_a_real_difference_is_said_in_one_line(tmp_path, core_pattern):
    # GIVEN a program stripped of every symbol whose debug file sits beside it, named by a .gnu_debuglink: gdb
    # reads it (the debuglink's directory), libdw does not (it looks up debug files by build-id and path)
    (tmp_path / "prog.c").write_text(STRIPPED_C)
    exe = tmp_path / "prog"
    for cmd in (["gcc", "-O1", "-g", "-o", str(exe), str(tmp_path / "prog.c")],
                ["objcopy", "--only-keep-debug", str(exe), str(tmp_path / "prog.debug")],
                ["strip", "--strip-all", str(exe)],
                ["objcopy", f"--add-gnu-debuglink={tmp_path / 'prog.debug'}", str(exe)]):
        subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    core = crash_for_core([str(exe)], run)
    # WHEN both unwinders run
    r = _both(str(core))
    # THEN the difference is one warning line naming the first frame that differs, and the analysis is partial
    assert r.exit_code == EXIT_PARTIAL, r.output[-2000:]
    said = [line for line in r.stdout.splitlines() if "native unwinders disagree" in line]
    assert len(said) == 1, said
    assert " frame 0: ?? at 0x" in said[0] and "(libdw) vs crash_here at 0x" in said[0], said
    assert said[0].endswith("prog.c:2 (gdb)"), said
