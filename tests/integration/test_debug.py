"""`forensics debug CORE`: gdb opened on a real kernel core, ready -- the program, the debug directories, CPython's
gdb helper for that interpreter and the crashed thread selected; `--print` shows the command, which is run here in
gdb's batch mode with `-batch -ex py-bt` appended (CPython's own helper is the oracle of the Python frames)."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.core import open_core

FORENSICS = Path(sys.executable).parent / "forensics"

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (bash .ci/setup)")


def forensics(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(FORENSICS), *args], capture_output=True, text=True, timeout=300)


def test_debug_print_is_a_gdb_command_showing_the_crashed_threads_python_frames(cores, newest_python):
    # GIVEN a real kernel core of an exporter whose main thread died in a native call made from Python, while
    # a thread named metrics-server slept in serve_forever
    core = cores.get(newest_python, "segv")
    crashed = open_core(str(core)).crashed_tid
    # WHEN forensics debug --print names the command
    p = forensics("debug", "--print", str(core))
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout.strip())
    # THEN it is gdb on the core and its program, with CPython's helper of that interpreter ...
    assert Path(argv[0]).name.startswith("gdb") and argv[argv.index("-c") + 1] == str(core.resolve())
    helper = next(a for a in argv if a.startswith("source "))[len("source "):]
    assert re.search(rf"python{re.escape(newest_python)}\S*-gdb\.py$", helper), helper
    # ... and run in batch mode with py-bt appended, it shows the crashed thread selected and its Python frames
    run = subprocess.run(argv + ["-batch", "-ex", "py-bt"], capture_output=True, text=True, timeout=300)
    out = run.stdout
    assert re.search(rf"\[Current thread is \d+ \(.*LWP {crashed}\)\)\]", out), out[-3000:]
    frames = out.split("Traceback (most recent call first):", 1)[1]
    assert re.search(r'File ".*exporter\.py", line \d+, in query_nvlink_throughput_counters', frames), frames
    assert "in collect" in frames and "serve_forever" not in frames  # the crashed thread's, not the sleeper's


def test_debug_with_the_crashed_machines_files_and_this_machines_helper(cores, sid_root):
    # GIVEN a core of Debian unstable's CPython 3.13, crashed inside its root (the crashed machine's files)
    core = cores.get("sid-3.13", "segv")
    # WHEN forensics debug --print is given the root
    p = forensics("debug", "--sysroot", str(sid_root), "--print", str(core))
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout.strip())
    # THEN gdb reads the root's files and debug files, and no script of the root runs on its own
    assert f"set sysroot {sid_root}" in argv and "set auto-load python-scripts off" in argv
    assert any(a.startswith(f"set debug-file-directory {sid_root}/usr/lib/debug") for a in argv), argv
    if not any(a.startswith("source ") for a in argv):
        pytest.skip(f"no python-gdb.py of CPython 3.13 on this machine ({p.stderr.strip()})")
    helper = next(a for a in argv if a.startswith("source "))[len("source "):]
    assert not helper.startswith(str(sid_root))  # this machine's helper of that version, not the image's code
    run = subprocess.run(argv + ["-batch", "-ex", "py-bt", "-ex", "bt 1"], capture_output=True, text=True,
                         timeout=300)
    # and its Python frames and the native frame that faulted are named
    assert "in query_nvlink_throughput_counters" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    assert "forensics_bad_write" in run.stdout


def test_debug_never_loads_the_crashed_images_own_python_helper(cores, sid_root):
    # GIVEN a core of Debian unstable's CPython 3.14, whose python-gdb.py is in the root only (none of 3.14 here)
    core = cores.get("sid-3.14", "segv")
    p = forensics("debug", "--sysroot", str(sid_root), "--print", str(core))
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout.strip())
    in_root = sid_root / "usr/share/gdb/auto-load/usr/bin/python3.14-gdb.py"
    if any(a.startswith("source ") for a in argv):
        pytest.skip("this machine has a python-gdb.py of CPython 3.14: the root's is not needed")
    # THEN the root's helper (code from the crashed image) is named, with how to load it, not run
    assert in_root.is_file()
    assert f"the crashed image's own python-gdb.py ({in_root}) is not loaded" in p.stderr, p.stderr
    assert not any(str(in_root) in a for a in argv)
