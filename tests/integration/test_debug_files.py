"""Separate debug files in a root (``/usr/lib/debug/.build-id/xx/rest.debug``, ``/usr/lib/debug/PATH.debug``),
matched by build-id, for every reader: gdb (CPython's DWARF layout), libdw (native frames), the Python
walker (``_PyRuntime`` of an interpreter that does not export it).  Real files of Debian unstable's sid
root; the cores are Debian's python3.14 crashed inside it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from forensics.core import open_core
from forensics.core.debugfiles import build_id_debug_path, find_debug_file, path_debug_path
from forensics.core.image import ElfImage
from forensics.bundle.record import CoreState
from forensics.model import PythonStatus
from forensics.pyread import read_python_stacks
from tests.integration.test_pyread import thread_named

PYTHON = "/usr/bin/python3.14"


def put(src: Path, dst: Path) -> None:
    """``src`` at ``dst`` (a hard link when the filesystem allows: the root's debug files are big)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


@pytest.fixture(scope="module")
def py314(cores):
    interp = cores.interpreter("sid-3.14")
    core = open_core(str(cores.get("sid-3.14", "heap-prev")), sysroot=str(interp.root))
    exe = next(lib for lib in core.libraries if lib.path == PYTHON)
    debug = interp.root / build_id_debug_path(exe.build_id).lstrip("/")
    assert debug.is_file()
    return interp.root, core, exe, debug


def test_debug_file_beside_the_objects_path_is_found_by_build_id(py314, tmp_path):
    root, core, exe, debug = py314
    # GIVEN a root holding python3.14's debug file as /usr/lib/debug/usr/bin/python3.14.debug only
    put(debug, tmp_path / "r" / path_debug_path(PYTHON).lstrip("/"))
    # THEN it is found there, by the object's path, and kept because its build-id is the object's
    found = find_debug_file(exe.build_id, str(tmp_path / "r"), PYTHON)
    assert found == str(tmp_path / "r" / path_debug_path(PYTHON).lstrip("/"))
    # and a file of another build at that path is never used
    other = tmp_path / "o" / path_debug_path(PYTHON).lstrip("/")
    other.parent.mkdir(parents=True)
    shutil.copyfile(root / "usr/bin/python3.15", other)
    assert find_debug_file(exe.build_id, str(tmp_path / "o"), PYTHON) is None


def test_debug_file_lookup_never_leaves_the_root(py314, tmp_path):
    _, _, exe, debug = py314
    # GIVEN a root whose /usr/lib/debug is a symlink to a directory of this machine that holds the file
    outside = tmp_path / "outside"
    put(debug, outside / ".build-id" / exe.build_id[:2] / f"{exe.build_id[2:]}.debug")
    hostile = tmp_path / "h"
    (hostile / "usr/lib").mkdir(parents=True)
    os.symlink(str(outside), hostile / "usr/lib/debug")
    # THEN the link is resolved inside the root, where nothing is: the file outside it is not used
    assert find_debug_file(exe.build_id, str(hostile), PYTHON) is None
    # while the same layout inside the root is found
    os.unlink(hostile / "usr/lib/debug")
    shutil.copytree(outside, hostile / "usr/lib/debug", copy_function=os.link)
    assert find_debug_file(exe.build_id, str(hostile), PYTHON).startswith(str(hostile) + "/")


def not_exported_root(py314, tmp_path: Path, *, with_debug: str | None) -> Path:
    """A root with python3.14 whose dynamic symbol table does not export _PyRuntime (its name renamed in
    .dynstr, as an interpreter linked without --export-dynamic would lack it), and its debug file."""
    root, _, exe, debug = py314
    new = tmp_path / "root"
    dst = new / PYTHON.lstrip("/")
    dst.parent.mkdir(parents=True)
    shutil.copyfile(root / PYTHON.lstrip("/"), dst)
    data = bytearray(dst.read_bytes())
    at = data.find(b"\0_PyRuntime\0")
    assert at > 0
    data[at + 1:at + 11] = b"_PyRuntimX"
    dst.write_bytes(bytes(data))
    image = ElfImage.from_file(str(dst))
    assert image.find_dynamic_symbol("_PyRuntime") is None and image.build_id() == exe.build_id
    if with_debug == "build-id":
        put(debug, new / build_id_debug_path(exe.build_id).lstrip("/"))
    elif with_debug == "path":
        put(debug, new / path_debug_path(PYTHON).lstrip("/"))
    return new


@pytest.mark.parametrize("where", ["build-id", "path"])
def test_runtime_not_exported_is_found_in_the_debug_files_symbol_table(py314, tmp_path, where):
    _, core, _, _ = py314
    good = read_python_stacks(core, sysroot=str(py314[0]))
    # GIVEN a root whose interpreter does not export _PyRuntime, with its debug file (by build-id or by path)
    root = not_exported_root(py314, tmp_path, with_debug=where)
    # WHEN its core is read
    stacks = read_python_stacks(open_core(core.path, sysroot=str(root)), sysroot=str(root))
    # THEN _PyRuntime comes from the debug file's .symtab and the stacks are the same
    assert stacks.status is PythonStatus.OK, stacks.detail
    assert stacks.threads == good.threads
    assert thread_named(stacks, "MainThread").frames[0].function == "query_nvlink_throughput_counters"


def test_runtime_not_exported_without_a_debug_file_is_found_in_memory(py314, tmp_path):
    _, core, _, _ = py314
    root = not_exported_root(py314, tmp_path, with_debug=None)
    stacks = read_python_stacks(open_core(core.path, sysroot=str(root)), sysroot=str(root))
    assert stacks.status is PythonStatus.OK, stacks.detail
    assert "_PyRuntime found in the core's memory (no file's symbol table gave it)" in stacks.layout


def _descendant(pid: int, comm: str) -> int | None:
    """The first process below ``pid`` whose name starts with ``comm`` (bwrap forks the sandboxed one)."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip().startswith(comm) and p != pid:
                    return p
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return None


def test_a_bundle_keeps_the_debug_files_and_analyzes_the_same_anywhere(cores, tmp_path):
    # GIVEN Debian's python3.14 running inside the sid root (the process whose /proc the handler reads,
    # as the kernel keeps a dying one), and a real core of that interpreter
    import subprocess
    import time

    from click.testing import CliRunner

    from forensics.capture.handler import run_core_handler
    from forensics.cli import cli
    from tests.roots import sandbox_command

    interp = cores.interpreter("sid-3.14")
    core = cores.get("sid-3.14", "heap-prev")
    proc = subprocess.Popen(sandbox_command(interp.root, [PYTHON, "-c", "import time; time.sleep(120)"],
                                            cwd=tmp_path))
    try:
        deadline = time.monotonic() + 30
        pid = None
        while pid is None and time.monotonic() < deadline:
            pid = _descendant(proc.pid, "python3")
            time.sleep(0.05)
        assert pid, "the sandboxed python did not start"
        time.sleep(0.3)  # its libraries mapped
        # WHEN the core handler keeps the crash
        with open(core, "rb") as f:
            r = run_core_handler(str(tmp_path / "cores"), pid, pid, 6, time.time(), None, stdin_fd=f.fileno())
    finally:
        proc.kill()
        proc.wait()
    assert r.core_state is CoreState.KEPT, r.warnings
    (crash,) = sorted((tmp_path / "cores" / "crashes").iterdir())
    meta = json.loads((crash / "metadata.json").read_text())
    # THEN the debug files the container had are in the object store, by build-id
    exe_id = meta["objects"][PYTHON]
    assert meta["debug_files"][PYTHON] == f"{exe_id}.debug"
    libc = next(p for p in meta["objects"] if p.endswith("/libc.so.6"))
    assert meta["debug_files"][libc] == f"{meta['objects'][libc]}.debug"
    for key in meta["debug_files"].values():
        assert (tmp_path / "cores" / "objects" / key[:2] / key[2:]).is_file()
    # and the bundle alone (no sid root) gives the Python stacks by both layouts, the DWARF one from the stored
    # debug file, and names glibc 2.43's frames from its stored debug file
    res = CliRunner().invoke(cli, ["analyze", "--json", "--method", "both", str(crash)], catch_exceptions=False)
    a = json.loads(res.stdout)["analysis"]
    snap = a["snapshot"]
    assert snap["python_status"] == "ok" and snap["method_disagreements"] == [], res.stderr
    crashed = snap["threads"][0]
    assert crashed["py_frames"][0]["function"] == "query_nvlink_throughput_counters"
    assert "malloc_printerr" in [f["symbol"] for f in crashed["native_frames"]]

