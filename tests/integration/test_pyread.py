"""The gdb-free Python stack reader (forensics.pyread) on real kernel cores of CPython 3.8-3.13.

Every stack is compared frame for frame with the gdb method (DWARF), then read
again with the interpreter and libpython replaced by stripped copies in a
sysroot, from the core's memory alone, and from deliberately corrupted copies.
"""
from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics.analyze import analyze_core
from forensics.analyze.stacks import parse_py_frames
from forensics.core import CoreMemory, open_core
from forensics.model import LibraryStatus
from forensics.pyread import read_python_state
from forensics.pyread.layouts import build_layout, parse_debug_offsets, DEBUG_OFFSETS_313
from forensics.pyread.locate import detect_version, find_runtime
from forensics.pyread.objects import Reader
from forensics.pyread.walk import first_frame
from tests.conftest import python_params

SCENARIOS = ("heap-prev", "segv", "py-abort")
GARBAGE = 0x4141414141414141

_analyses: dict[tuple[str, str], object] = {}


def gdb_analysis(cores, version: str, scenario: str):
    """analyze_core with the gdb method (never the direct reader under test) of one core, once per session."""
    key = (version, scenario)
    if key not in _analyses:
        analysis = analyze_core(str(cores.get(version, scenario)), method="gdb")
        assert analysis.snapshot.python_method == "gdb", analysis.snapshot.python_stack_status
        _analyses[key] = analysis
    return _analyses[key]


def assert_same_stacks(doc: dict, analysis) -> None:
    """Each Python thread of the gdb analysis has the same name, GIL flag and frames in ``doc``."""
    assert doc["status"] == "ok", doc["detail"]
    snap = analysis.snapshot
    assert snap.python_method == "gdb" and snap.python_stack_status == "ok", snap.python_stack_status
    assert doc["python_version"] == snap.python_version
    by_tid = {t["native_thread_id"]: t for t in doc["threads"]}
    gdb_threads = [t for t in snap.threads if t.py_frames]
    assert gdb_threads, "the gdb method found no Python thread"
    assert len(by_tid) == len(doc["threads"]) == len(gdb_threads)
    for thread in gdb_threads:
        mine = by_tid[thread.tid]
        assert mine["error"] is None
        assert mine["name"] == thread.name
        assert mine["holds_gil"] == thread.holds_gil
        assert parse_py_frames(mine["frames"]) == thread.py_frames, f"thread {thread.tid} ({thread.name})"


def cases():
    return [pytest.param(v.values[0], s, id=f"{v.id},scenario={s}", marks=v.marks)
            for v in python_params() for s in SCENARIOS]


# -- same stacks as gdb ------------------------------------------------------------------------


@pytest.mark.parametrize("version,scenario", cases())
def test_same_stacks_as_gdb(cores, version, scenario):
    # GIVEN a core of a crashed CPython and the gdb method's analysis of it
    analysis = gdb_analysis(cores, version, scenario)
    # WHEN it is read without gdb
    doc = read_python_state(open_core(str(cores.get(version, scenario))))
    # THEN every thread's Python stack is the same, frame for frame
    assert_same_stacks(doc, analysis)
    assert doc["python_version"].startswith(version + ".")
    names = {t["name"] for t in doc["threads"]}
    assert names == {"MainThread", "metrics-server"}
    if scenario == "py-abort":  # os.abort() from Python: the main thread holds the GIL
        main = next(t for t in doc["threads"] if t["name"] == "MainThread")
        assert doc["gil_holder_native_id"] == main["native_thread_id"]


def python_objects(core) -> list:
    """The executable and the libpython the core names (test setup only; the reader does not use names)."""
    return [lib for lib in core.libraries if lib.path == core.executable or lib.name.startswith("libpython")]


def stripped_sysroot(core, root: Path, mode: str) -> Path:
    for lib in python_objects(core):
        dst = root / lib.path.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["strip", f"--strip-{mode}", "-o", str(dst), os.path.realpath(lib.path)], check=True)
    return root


def section_names(path: str) -> set[str]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        return {s.name for s in ELFFile(f).iter_sections()}


@pytest.mark.parametrize("mode", ["debug", "all"])
@pytest.mark.parametrize("version", python_params())
def test_same_stacks_with_stripped_interpreter(cores, version, mode, tmp_path):
    # GIVEN the interpreter and libpython replaced by stripped copies in a sysroot
    analysis = gdb_analysis(cores, version, "heap-prev")
    path = str(cores.get(version, "heap-prev"))
    root = stripped_sysroot(open_core(path), tmp_path / "sysroot", mode)
    core = open_core(path, sysroot=str(root))
    for lib in python_objects(core):
        assert lib.status is LibraryStatus.OK and lib.file_path.startswith(str(root))
        sections = section_names(lib.file_path)
        assert ".debug_info" not in sections and ".dynsym" in sections
        assert (".symtab" in sections) == (mode == "debug")
    # WHEN the stacks are read from the core with those files
    doc = read_python_state(core, sysroot=str(root))
    # THEN they equal the gdb method's (which needed the debug symbols)
    assert_same_stacks(doc, analysis)


@pytest.mark.parametrize("version", python_params())
def test_from_core_memory_alone(cores, version, tmp_path):
    # GIVEN a core that holds the file-backed pages (coredump_filter 0x37) and no file for any object
    from tests.crashers.make_core import make_core
    from tests.conftest import PYTHONS

    path = str(make_core(tmp_path, PYTHONS[version], "segv", coredump_filter=0x37))
    core = open_core(path)
    analysis = analyze_core(path, method="gdb")
    missing = tuple(dataclasses.replace(lib, file_path=None, file_build_id=None, status=LibraryStatus.MISSING)
                    for lib in core.libraries)
    # WHEN it is read with the symbol table and version taken from the core's memory
    doc = read_python_state(dataclasses.replace(core, libraries=missing))
    # THEN the stacks are still the gdb method's
    assert_same_stacks(doc, analysis)


def test_missing_files_and_default_filter_say_why(cores, newest_python):
    # GIVEN a default core (no .dynsym pages in it) and no file for any object
    core = open_core(str(cores.get(newest_python, "segv")))
    missing = tuple(dataclasses.replace(lib, file_path=None, file_build_id=None, status=LibraryStatus.MISSING)
                    for lib in core.libraries)
    # WHEN it is read
    doc = read_python_state(dataclasses.replace(core, libraries=missing))
    # THEN the result says what is missing instead of guessing
    assert doc["status"] == "no-python-symbols"
    assert "--sysroot" in doc["detail"]
    assert doc["threads"] == []


@pytest.mark.parametrize("version", python_params())
def test_version_is_read_from_the_binary(cores, version):
    # GIVEN a core and the object that defines _PyRuntime
    from forensics.pyread import locate

    core = open_core(str(cores.get(version, "segv")))
    expected = gdb_analysis(cores, version, "segv").snapshot.python_version
    with CoreMemory.open(core.path) as mem:
        binary = locate.find_runtime(core, mem)
        assert binary is not None and binary.library.name.startswith("libpython")
        debug = parse_debug_offsets(mem.read_prefix(binary.runtime, 8 + 8 * len(DEBUG_OFFSETS_313)))
        # WHEN the version is detected
        found = detect_version(binary, core, mem, debug["version"] if debug else None)
        # THEN it comes from the best source the version has, and every source agrees with gdb
        best = {"3.8": "sys.version", "3.9": "sys.version", "3.10": "sys.version", "3.11": "Py_Version",
                "3.12": "Py_Version", "3.13": "debug-offsets"}[version]
        assert (found.text, found.source) == (expected, best)
        assert locate._memory_version(binary, mem).text == expected
        assert locate._rodata_version(binary).text == expected
        if version not in ("3.8", "3.9", "3.10"):
            assert locate._py_version_symbol(binary, mem).text == expected


# -- corrupted interpreter state ----------------------------------------------------------------


def file_offset(mem: CoreMemory, addr: int) -> int:
    for seg in mem.segments:
        if seg.vaddr <= addr < seg.vaddr + seg.present:
            return seg.offset + addr - seg.vaddr
    raise AssertionError(f"0x{addr:x} is not in the core file")


def main_thread_slots(path: str) -> dict[str, int]:
    """Addresses of pointer fields of the crashed (main) thread's state, found through the reader's layout."""
    core = open_core(path)
    with CoreMemory.open(path) as mem:
        binary = find_runtime(core, mem)
        debug = parse_debug_offsets(mem.read_prefix(binary.runtime, 8 + 8 * len(DEBUG_OFFSETS_313)))
        version = detect_version(binary, core, mem, debug["version"] if debug else None)
        layout = build_layout(version.major, version.minor, debug)
        rd = Reader(mem)
        interp = rd.struct(layout.interp, rd.ptr(binary.runtime + layout.runtime_head.offset))
        first_ts = addr = interp[layout.interp_head]
        while addr:
            ts = rd.struct(layout.tstate, addr)
            native = ts.get("native_thread_id") or {t.fs_base: t.tid for t in core.threads}.get(ts["thread_id"])
            if native == core.pid:
                break
            addr = ts["next"]
        frame = first_frame(layout, rd, ts)
        if layout.family in (311, 312):
            frame_slot = ts["cframe"] + layout.cframe.start
        else:
            frame_slot = addr + layout.offset("PyThreadState", layout.tstate_frame)
        back = "f_back" if layout.family in (38, 310) else "previous"
        ftype = "PyFrameObject" if layout.family in (38, 310) else "_PyInterpreterFrame"
        return {
            "frame_slot": frame_slot,
            "frame": frame,
            "back_slot": frame + layout.offset(ftype, back),
            "first_next_slot": first_ts + layout.offset("PyThreadState", "next"),
            "first_tstate": first_ts,
            "main_tstate": addr,
        }


def patched_copy(src: str, dst: Path, writes: dict[int, int]) -> str:
    shutil.copyfile(src, dst)
    with CoreMemory.open(src) as mem:
        offsets = {file_offset(mem, addr): value for addr, value in writes.items()}
    with open(dst, "r+b") as f:
        for off, value in offsets.items():
            f.seek(off)
            f.write(value.to_bytes(8, "little"))
    return str(dst)


def read_timed(path: str) -> tuple[dict, float]:
    start = time.perf_counter()
    doc = read_python_state(open_core(path))
    return doc, time.perf_counter() - start


@pytest.mark.parametrize("version", python_params())
def test_overwritten_frame_pointer_gives_flagged_partial_stack(cores, version, tmp_path):
    # GIVEN a core whose crashed thread's current-frame pointer is garbage
    src = str(cores.get(version, "segv"))
    good = read_python_state(open_core(src))
    slots = main_thread_slots(src)
    path = patched_copy(src, tmp_path / "core", {slots["frame_slot"]: GARBAGE})
    # WHEN it is read
    doc, seconds = read_timed(path)
    # THEN that thread says where reading stopped, the other thread is intact, nothing raised
    assert seconds < 5
    main = next(t for t in doc["threads"] if t["name"] == "MainThread")
    assert main["frames"] == []
    assert main["error"] and f"0x{GARBAGE:x}" in main["error"]
    # and the document is a partial result naming that thread, not "ok"
    assert doc["status"] == "error"
    assert f"tid {main['native_thread_id']}: {main['error']}" in doc["detail"]
    other = [t for t in doc["threads"] if t["name"] != "MainThread"]
    assert other == [t for t in good["threads"] if t["name"] != "MainThread"]


@pytest.mark.parametrize("version", python_params())
def test_overwritten_back_pointer_keeps_the_frames_before_it(cores, version, tmp_path):
    # GIVEN a core whose innermost frame's link to its caller is garbage
    src = str(cores.get(version, "segv"))
    good = read_python_state(open_core(src))
    slots = main_thread_slots(src)
    path = patched_copy(src, tmp_path / "core", {slots["back_slot"]: GARBAGE})
    # WHEN it is read
    doc = read_python_state(open_core(path))
    # THEN the innermost frame is kept and the error names the bad address
    main = next(t for t in doc["threads"] if t["name"] == "MainThread")
    good_main = next(t for t in good["threads"] if t["name"] == "MainThread")
    assert [f["function"] for f in main["frames"]] == [good_main["frames"][0]["function"]]
    assert main["frames"][0]["line"] == good_main["frames"][0]["line"]
    assert f"frame 0x{GARBAGE:x}" in main["error"]
    assert doc["status"] == "error" and main["error"] in doc["detail"]


@pytest.mark.parametrize("version", python_params())
def test_frame_cycle_is_detected(cores, version, tmp_path):
    # GIVEN a core whose innermost frame points back to itself
    src = str(cores.get(version, "segv"))
    slots = main_thread_slots(src)
    path = patched_copy(src, tmp_path / "core", {slots["back_slot"]: slots["frame"]})
    # WHEN it is read
    doc, seconds = read_timed(path)
    # THEN the walk stops at once and says so
    assert seconds < 5
    main = next(t for t in doc["threads"] if t["name"] == "MainThread")
    assert len(main["frames"]) == 1
    assert main["error"] == f"frame cycle at 0x{slots['frame']:x}"
    assert doc["status"] == "error" and main["error"] in doc["detail"]


@pytest.mark.parametrize("version", python_params(("3.8", "3.12", "3.13")))
def test_broken_thread_list_is_a_partial_result(cores, version, tmp_path):
    # GIVEN a core whose first thread state's link to the next one is garbage
    src = str(cores.get(version, "segv"))
    slots = main_thread_slots(src)
    assert slots["first_tstate"] != slots["main_tstate"]  # the newest thread comes first
    path = patched_copy(src, tmp_path / "core", {slots["first_next_slot"]: GARBAGE})
    # WHEN it is read
    doc = read_python_state(open_core(path))
    # THEN the first thread is read and the document is flagged
    assert doc["status"] == "error"
    assert f"thread state 0x{GARBAGE:x}" in doc["detail"]
    assert [t["name"] for t in doc["threads"]] == ["metrics-server"]
    assert doc["threads"][0]["frames"]


# -- not CPython --------------------------------------------------------------------------------


def sleep_core(directory: Path) -> Path:
    """A real core of ``sleep`` killed with SIGABRT."""
    directory.mkdir(parents=True, exist_ok=True)

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen([shutil.which("sleep"), "60"], cwd=directory, preexec_fn=limits)
    try:
        time.sleep(0.2)
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = [p for p in directory.iterdir() if p.name.startswith("core")]
    assert found, f"no core in {directory}"
    return found[0]


def test_core_of_a_non_python_program(core_pattern, tmp_path):
    # GIVEN the core of a program that is not CPython
    core = open_core(str(sleep_core(tmp_path / "sleep")))
    # WHEN it is read
    doc = read_python_state(core)
    # THEN it says so, without threads
    assert doc["status"] == "no-python-symbols"
    assert doc["detail"].startswith("not a CPython process")
    assert doc["threads"] == [] and doc["python_version"] is None


def test_never_imports_gdb(cores, newest_python):
    # GIVEN a fresh interpreter
    code = ("import sys; from forensics.core import open_core; from forensics.pyread import read_python_state; "
            f"d = read_python_state(open_core({str(cores.get(newest_python, 'segv'))!r})); "
            "assert d['status'] == 'ok'; "
            "bad = [m for m in sys.modules "
            "       if m.split('.')[0] in ('gdb', 'pygdbmi', 'elftools') or m == 'forensics.gdb']; "
            "print(bad)")
    # WHEN the reader runs in it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # THEN neither gdb, pygdbmi nor pyelftools was imported
    assert out.strip() == "[]"
