"""The one Python-stack walker (forensics.pyread) on real kernel cores of CPython 3.8-3.15.

Cores of this machine's CPython 3.8-3.13 and of Debian unstable's 3.13, 3.14 and 3.15
(release and ``-dbg`` builds, crashed inside a cached sid root and read from here
with the root as sysroot).  Every stack is compared frame for frame with two
independent oracles: pystack, and CPython's own ``py-bt`` (python-gdb.py); then read
again with gdb's DWARF layout, with stripped files, from the core's memory alone,
and from deliberately corrupted copies.
"""
from __future__ import annotations

import dataclasses
import json
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
from forensics.core import CoreMemory, open_core
from forensics.model import DwarfLayout, LayoutSource, LibraryStatus, PythonStatus
from forensics.pyread import Limits, read_python_stacks
from forensics.pyread.debug_offsets import parse_debug_offsets, read_size
from forensics.pyread.layouts import choose_layout, debug_offset_shapes
from forensics.pyread.locate import detect_version, find_runtime
from forensics.pyread.objects import Budget, Reader
from forensics.pyread.walk import first_frame
from tests.conftest import SID_BUILDS, python_params
from tests.oracles import frame_keys, py_bt_stacks, pystack_stacks

SCENARIOS = ("heap-prev", "segv", "py-abort")
GARBAGE = 0x4141414141414141
RELEASE_SID = tuple(b for b in SID_BUILDS if not b.endswith("d"))


def read(cores, key: str, scenario: str, **kw):
    """The direct reader's stacks of one core (with the root as sysroot for a sid build)."""
    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    return read_python_stacks(open_core(str(cores.get(key, scenario)), sysroot=sysroot), sysroot=sysroot, **kw)


def cases(sid=SID_BUILDS):
    out = []
    for p in python_params(sid=sid):
        for s in SCENARIOS:
            if p.values[0].startswith("sid-") and s == "segv":
                continue  # heap-prev and py-abort cover the sid builds; segv adds nothing there
            out.append(pytest.param(p.values[0], s, id=f"{p.id},scenario={s}", marks=p.marks))
    return out


# -- the same stacks as pystack and py-bt --------------------------------------------------------


@pytest.mark.parametrize("key,scenario", cases())
def test_same_stacks_as_pystack_and_py_bt(cores, key, scenario):
    # GIVEN a core of a crashed CPython (this machine's, or Debian's inside the sid root)
    interp = cores.interpreter(key)
    path = str(cores.get(key, scenario))
    root = str(interp.root) if interp.root else None
    # WHEN it is read without gdb
    stacks = read(cores, key, scenario)
    # THEN the version is the interpreter's, read whole, with both threads named
    assert stacks.status is PythonStatus.OK, stacks.detail
    assert stacks.version.startswith(interp.version + ".")
    assert {t.name for t in stacks.threads} == {"MainThread", "metrics-server"}
    assert all(t.error is None for t in stacks.threads)
    if tuple(map(int, interp.version.split("."))) >= (3, 13):
        assert stacks.layout_source is LayoutSource.DEBUG_OFFSETS, stacks.layout
    mine = {t.native_thread_id: frame_keys(t.frames) for t in stacks.threads}
    # and every thread's frames equal pystack's, frame for frame
    assert mine == pystack_stacks(path, interp.executable, root=root)
    if scenario == "py-abort":  # os.abort() from Python: the main thread holds the GIL
        main = next(t for t in stacks.threads if t.name == "MainThread")
        assert stacks.gil_holder == main.native_thread_id and main.holds_gil
    # and, where the build is a debug one (pyenv's -g builds, Debian's -dbg), CPython's own py-bt's (on
    # Debian's optimized release builds py-bt takes 20-30 s a core, unwinding with their separate DWARF)
    if interp.root is not None and not interp.debug_build:
        return
    gdb_py = interp.gdb_py()
    assert gdb_py, f"no python-gdb.py for {key}"
    libcrash = os.path.dirname(next(lib.path for lib in open_core(path).libraries if lib.name == "libcrash.so"))
    py_bt = py_bt_stacks(path, interp.executable, gdb_py, root=root, lib_dirs=(libcrash,))
    if interp.version == "3.8":
        # 3.8's python-gdb.py misreads the line of the outermost <module> frame (it prints 332 for
        # exporter.py, a 77-line file; pystack and this reader say 76): only that line is not compared
        for frames in (mine, py_bt):
            for frames_of_thread in frames.values():
                if frames_of_thread and frames_of_thread[-1][0] == "<module>":
                    frames_of_thread[-1] = frames_of_thread[-1][:2] + (None,)
    assert mine == py_bt


@pytest.mark.parametrize("key", python_params(sid=SID_BUILDS))
def test_dwarf_layout_and_direct_layout_agree(cores, key):
    # GIVEN a core, read by both methods: the layout from the DWARF of the core's own interpreter (gdb)
    # and the layout from the core's debug offsets and the table
    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    # WHEN analyze compares them
    a = analyze_core(str(cores.get(key, "heap-prev")), sysroot=sysroot, method="both")
    # THEN the layouts agree field for field and the stacks frame for frame
    snap = a.snapshot
    assert snap.method_disagreements == (), snap.method_disagreements
    assert snap.python_status is PythonStatus.OK and snap.is_complete, snap.warnings
    gdb_stacks = read_python_stacks(snap.core, sysroot=sysroot, dwarf=_dwarf(snap.core, interp))
    assert gdb_stacks.layout_source is LayoutSource.DWARF and gdb_stacks.status is PythonStatus.OK
    assert [t.frames for t in gdb_stacks.threads] == [t.frames for t in read(cores, key, "heap-prev").threads]


def _dwarf(core, interp) -> DwarfLayout:
    from forensics.gdb import run_gdb

    exe = next(lib for lib in core.libraries if lib.path == core.executable)
    return run_gdb(core, exe.file_path, native=False, sysroot=str(interp.root) if interp.root else None).layout


# -- subinterpreters --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", python_params(("3.12", "3.13"), sid=("3.13", "3.14", "3.15")))
def test_every_interpreter_and_its_threads(cores, key, tmp_path):
    # GIVEN a crash while a thread runs in a subinterpreter it entered, which started a thread of its own
    from forensics.text.analysis import format_analysis
    from tests.crashers.make_core import make_core

    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    path = str(make_core(tmp_path, interp.python, "heap-prev", root=interp.root, env={"EXPORTER_SUBINTERPRETER": "1"}))
    # WHEN it is read
    stacks = read_python_stacks(open_core(path, sysroot=sysroot), sysroot=sysroot)
    # THEN every interpreter's thread states are read, labelled by interpreter, as pystack reads them
    assert stacks.status is PythonStatus.OK, stacks.detail
    mine = {(t.native_thread_id, t.interpreter_id): frame_keys(t.frames) for t in stacks.threads}
    assert mine == pystack_stacks(path, interp.executable, root=sysroot, by_interpreter=True)
    assert {(t.name, t.interpreter_id) for t in stacks.threads if t.interpreter_id} >= {("sub-worker", 1)}
    # and analyze shows the thread that entered the subinterpreter once: its frames there on top of the
    # main interpreter's that called in, named as the main interpreter names it
    a = analyze_core(path, sysroot=sysroot, method="direct")
    runner = next(t for t in a.snapshot.threads if t.name == "sub-runner")
    assert runner.interpreter_id == 1
    assert [f.function for f in runner.py_frames][:2] == ["sub_serve", "<module>"]
    assert [f.interpreter_id for f in runner.py_frames] == sorted((f.interpreter_id for f in runner.py_frames),
                                                                   reverse=True)
    assert "enter_subinterpreter" in [f.function for f in runner.py_frames if f.interpreter_id == 0]
    worker = next(t for t in a.snapshot.threads if t.name == "sub-worker")
    assert worker.interpreter_id == 1 and worker.py_frames[0].function == "sub_worker"
    lines = list(format_analysis(a))
    at = next(i for i, ln in enumerate(lines) if ln.startswith('Thread "sub-runner"'))
    assert "in interpreter 1" in lines[at] and lines[at + 2] == "    [interpreter 1]"
    assert "    [interpreter 0]" in lines[at:at + 12]


# -- without the files, or with stripped ones -----------------------------------------------------------


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
    good = read(cores, version, "heap-prev")
    path = str(cores.get(version, "heap-prev"))
    root = stripped_sysroot(open_core(path), tmp_path / "sysroot", mode)
    core = open_core(path, sysroot=str(root))
    for lib in python_objects(core):
        assert lib.status is LibraryStatus.OK and lib.file_path.startswith(str(root))
        sections = section_names(lib.file_path)
        assert ".debug_info" not in sections and ".dynsym" in sections
        assert (".symtab" in sections) == (mode == "debug")
    # WHEN the stacks are read from the core with those files
    stacks = read_python_stacks(core, sysroot=str(root))
    # THEN they are the same
    assert stacks.status is PythonStatus.OK and stacks.threads == good.threads


@pytest.mark.parametrize("key", python_params(sid=("3.14",)))
def test_from_core_memory_alone(cores, key, tmp_path):
    # GIVEN a core that holds the file-backed pages (coredump_filter 0x37) and no file for any object
    from tests.crashers.make_core import make_core

    interp = cores.interpreter(key)
    path = str(make_core(tmp_path, interp.python, "segv", coredump_filter=0x37, root=interp.root))
    core = open_core(path)
    missing = tuple(dataclasses.replace(lib, file_path=None, file_build_id=None, status=LibraryStatus.MISSING)
                    for lib in core.libraries)
    # WHEN it is read with the symbol table and version taken from the core's memory
    stacks = read_python_stacks(dataclasses.replace(core, libraries=missing))
    # THEN the stacks are pystack's (given the files)
    assert stacks.status is PythonStatus.OK, stacks.detail
    root = str(interp.root) if interp.root else None
    assert {t.native_thread_id: frame_keys(t.frames) for t in stacks.threads} == pystack_stacks(
        path, interp.executable, root=root)


def test_missing_files_the_runtime_is_found_in_memory_else_it_says_why(cores, newest_python, tmp_path):
    # GIVEN a default core (no .dynsym pages in it) and no file for any object
    path = str(cores.get(newest_python, "segv"))
    core = open_core(path)
    missing = tuple(dataclasses.replace(lib, file_path=None, file_build_id=None, status=LibraryStatus.MISSING)
                    for lib in core.libraries)
    good = read_python_stacks(core)
    # WHEN it is read
    stacks = read_python_stacks(dataclasses.replace(core, libraries=missing))
    # THEN the runtime is found in the core's own memory, and the record says so
    assert stacks.status is PythonStatus.OK and stacks.threads == good.threads
    assert "_PyRuntime found in the core's memory" in stacks.layout
    # and when that memory does not hold it either (the interpreter's data zeroed), it says what is missing
    from forensics.core.image import ElfImage
    from forensics.pyread.scan import _writable

    lib = next(lib for lib in core.libraries if lib.name.startswith("libpython"))
    with CoreMemory.open(path) as mem:
        image = ElfImage.from_memory(mem, lib.base)
        offsets = []  # every part of the core file that holds the object's writable data
        for a, n in _writable(image):
            for seg in mem.segments:
                lo, hi = max(a, seg.vaddr), min(a + n, seg.vaddr + seg.present)
                if lo < hi:
                    offsets.append((seg.offset + lo - seg.vaddr, hi - lo))
    blank = tmp_path / "core"
    shutil.copyfile(path, blank)
    with open(blank, "r+b") as f:
        for off, n in offsets:
            f.seek(off)
            f.write(bytes(n))
    stacks = read_python_stacks(dataclasses.replace(core, path=str(blank), libraries=missing))
    assert stacks.status is PythonStatus.NO_RUNTIME and stacks.threads == ()
    assert stacks.detail.startswith(f"no CPython runtime (_PyRuntime) found: {core.executable} is missing here")
    assert stacks.detail.endswith("and the core's own memory did not give it")


@pytest.mark.parametrize("key", python_params(sid=RELEASE_SID))
def test_version_is_read_from_the_binary(cores, key):
    # GIVEN a core and the object that defines _PyRuntime
    from forensics.pyread import locate

    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    core = open_core(str(cores.get(key, "heap-prev")), sysroot=sysroot)
    cmd = [interp.python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]
    if sysroot:
        from tests.roots import sandbox_command

        cmd = sandbox_command(interp.root, cmd, cwd=Path(core.path).parent)
    expected = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    with CoreMemory.open(core.path) as mem:
        binary = locate.find_runtime(core, mem)
        assert binary is not None
        raw = mem.read_prefix(binary.runtime, 4096)
        debug = parse_debug_offsets(raw, debug_offset_shapes(), runtime_size=binary.runtime_size)
        # WHEN the version is detected
        found = detect_version(binary, core, mem, debug.version if debug else None)
        # THEN it comes from the best source the version has, and every source agrees
        minor = int(interp.version.split(".")[1])
        best = "sys.version" if minor <= 10 else "Py_Version" if minor <= 12 else "debug-offsets"
        assert found.source == best
        assert found.text == expected and found.text.startswith(interp.version + ".")
        assert locate._memory_version(binary, mem).text == expected
        assert locate._rodata_version(binary).text == expected
        if minor >= 11:
            assert locate._py_version_symbol(binary, mem).text == expected


def test_a_newer_version_with_valid_debug_offsets_is_read_and_says_so(cores, tmp_path):
    # GIVEN a 3.15 core whose debug offsets and Py_Version say 3.16.0a1 (a version newer than any known)
    path = str(cores.get("sid-3.15", "heap-prev"))
    root = str(cores.interpreter("sid-3.15").root)
    core = open_core(path, sysroot=root)
    with CoreMemory.open(path) as mem:
        binary = find_runtime(core, mem)
        runtime = binary.runtime
    newer = patched_copy(path, tmp_path / "core.3.16", {runtime + 8: 0x031000A1})
    # WHEN it is read
    stacks = read_python_stacks(open_core(newer, sysroot=root), sysroot=root)
    # THEN the stacks are read, and the record says which offsets and which table it trusted
    assert stacks.status is PythonStatus.OK, stacks.detail
    assert stacks.version == "3.16.0a1"
    assert stacks.layout.startswith("_Py_DebugOffsets of 3.16.0a1, read with the 3.15 struct shape over table 3.15")
    assert "3.16 is newer than any known version" in stacks.layout
    assert [t.frames for t in stacks.threads] == [t.frames for t in read(cores, "sid-3.15", "heap-prev").threads]


def test_a_version_that_cannot_be_read_says_exactly_why_once(cores, tmp_path):
    # GIVEN a 3.14 core whose executable says it is CPython 3.99 (Py_Version) and whose debug offsets
    # say 3.99 too, with a struct that does not hold together
    from forensics.core.image import ElfImage
    from forensics.core import elf

    interp = cores.interpreter("sid-3.14")
    path = str(cores.get("sid-3.14", "heap-prev"))
    root = tmp_path / "root"
    exe = root / "usr/bin/python3.14"
    exe.parent.mkdir(parents=True)
    shutil.copyfile(interp.executable, exe)
    image = ElfImage.from_file(str(exe))
    vaddr = image.find_dynamic_symbol("Py_Version")
    seg = next(p for p in image.phdrs if p.type == elf.PT_LOAD and p.vaddr <= vaddr < p.vaddr + p.filesz)
    with open(exe, "r+b") as f:
        f.seek(seg.offset + vaddr - seg.vaddr)
        f.write((0x036300F0).to_bytes(4, "little"))
    core = open_core(path, sysroot=str(root))
    with CoreMemory.open(path) as mem:
        runtime = find_runtime(core, mem).runtime
    bad = patched_copy(path, tmp_path / "core.3.99", {runtime + 8: 0x036300F0, runtime + 24: 0})
    # WHEN it is analyzed
    a = analyze_core(bad, sysroot=str(root), method="direct")
    # THEN one line says why: the refused offsets, and no table for that version; no warning repeats it
    status = a.snapshot.python_stack_status
    assert a.snapshot.python_status is PythonStatus.UNSUPPORTED
    assert status.startswith("unavailable: CPython 3.99 is not in the layout table (3.8, ")
    assert status.endswith("(its _Py_DebugOffsets were refused: runtime_state.size is 0 (read with the 3.15 shape))")
    assert not any("3.99" in w for w in a.snapshot.warnings)


# -- corrupted interpreter state ----------------------------------------------------------------


def file_offset(mem: CoreMemory, addr: int) -> int:
    for seg in mem.segments:
        if seg.vaddr <= addr < seg.vaddr + seg.present:
            return seg.offset + addr - seg.vaddr
    raise AssertionError(f"0x{addr:x} is not in the core file")


def core_layout(path: str, sysroot: str | None = None):
    """(core, runtime address, layout) as the direct reader finds them (test setup)."""
    core = open_core(path, sysroot=sysroot)
    with CoreMemory.open(path) as mem:
        binary = find_runtime(core, mem, sysroot=sysroot)
        shapes = debug_offset_shapes()
        debug = parse_debug_offsets(mem.read_prefix(binary.runtime, max(read_size(s) for s in shapes.values())),
                                    shapes)
        version = detect_version(binary, core, mem, debug.version if debug else None)
        layout = choose_layout(version.major, version.minor, debug=debug).layout
    return core, binary.runtime, layout


def main_thread_slots(path: str, sysroot: str | None = None) -> dict[str, int]:
    """Addresses of pointer fields of the crashed (main) thread's state, found through the reader's layout."""
    core, runtime, layout = core_layout(path, sysroot)
    with CoreMemory.open(path) as mem:
        rd = Reader(mem, Budget(Limits()))
        interp_addr = rd.ptr(runtime + layout.runtime_head.offset)
        interp = rd.struct(layout.interp, interp_addr)
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
            "interp": interp_addr,
            "head_slot": interp_addr + layout.offset("PyInterpreterState", layout.interp_head),
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


def read_timed(path: str, sysroot: str | None = None, **kw):
    start = time.perf_counter()
    stacks = read_python_stacks(open_core(path, sysroot=sysroot), sysroot=sysroot, **kw)
    return stacks, time.perf_counter() - start


def thread_named(stacks, name: str):
    return next(t for t in stacks.threads if t.name == name)


CORRUPTION_KEYS = python_params(sid=("3.14", "3.15"))


def corrupt_case(cores, key: str, tmp_path: Path):
    interp = cores.interpreter(key)
    sysroot = str(interp.root) if interp.root else None
    scenario = "heap-prev" if sysroot else "segv"
    src = str(cores.get(key, scenario))
    return src, sysroot, read(cores, key, scenario), main_thread_slots(src, sysroot)


@pytest.mark.parametrize("key", CORRUPTION_KEYS)
def test_overwritten_frame_pointer_gives_flagged_partial_stack(cores, key, tmp_path):
    # GIVEN a core whose crashed thread's current-frame pointer is garbage
    src, sysroot, good, slots = corrupt_case(cores, key, tmp_path)
    path = patched_copy(src, tmp_path / "core", {slots["frame_slot"]: GARBAGE})
    # WHEN it is read
    stacks, seconds = read_timed(path, sysroot)
    # THEN that thread says where reading stopped, the other thread is intact, nothing raised
    main = thread_named(stacks, "MainThread")
    assert main.frames == () and f"0x{GARBAGE:x}" in main.error
    # and the record is a partial result naming that thread, not OK
    assert stacks.status is PythonStatus.PARTIAL
    assert f"tid {main.native_thread_id}: {main.error}" in stacks.detail
    assert thread_named(stacks, "metrics-server") == thread_named(good, "metrics-server")


@pytest.mark.parametrize("key", CORRUPTION_KEYS)
def test_overwritten_back_pointer_keeps_the_frames_before_it(cores, key, tmp_path):
    # GIVEN a core whose innermost frame's link to its caller is garbage
    src, sysroot, good, slots = corrupt_case(cores, key, tmp_path)
    path = patched_copy(src, tmp_path / "core", {slots["back_slot"]: GARBAGE})
    # WHEN it is read
    stacks, _ = read_timed(path, sysroot)
    # THEN the innermost frame is kept and the error names the bad address
    main, good_main = thread_named(stacks, "MainThread"), thread_named(good, "MainThread")
    assert main.frames == good_main.frames[:1]
    assert f"frame 0x{GARBAGE:x}" in main.error
    assert stacks.status is PythonStatus.PARTIAL and main.error in stacks.detail


@pytest.mark.parametrize("key", CORRUPTION_KEYS)
def test_frame_cycle_is_detected(cores, key, tmp_path):
    # GIVEN a core whose innermost frame points back to itself
    src, sysroot, _, slots = corrupt_case(cores, key, tmp_path)
    path = patched_copy(src, tmp_path / "core", {slots["back_slot"]: slots["frame"]})
    # WHEN it is read
    stacks, seconds = read_timed(path, sysroot)
    # THEN the walk stops at once and says so
    main = thread_named(stacks, "MainThread")
    assert len(main.frames) == 1
    assert main.error == f"frame cycle at 0x{slots['frame']:x}"
    assert stacks.status is PythonStatus.PARTIAL and main.error in stacks.detail


@pytest.mark.parametrize("key", python_params(("3.8", "3.12", "3.13"), sid=("3.14",)))
def test_broken_thread_list_is_a_partial_result(cores, key, tmp_path):
    # GIVEN a core whose first thread state's link to the next one is garbage
    src, sysroot, _, slots = corrupt_case(cores, key, tmp_path)
    assert slots["first_tstate"] != slots["main_tstate"]  # the newest thread comes first
    path = patched_copy(src, tmp_path / "core", {slots["first_next_slot"]: GARBAGE})
    # WHEN it is read
    stacks, _ = read_timed(path, sysroot)
    # THEN the first thread is read and the record is flagged
    assert stacks.status is PythonStatus.PARTIAL
    assert f"thread state 0x{GARBAGE:x}" in stacks.detail
    assert [t.name for t in stacks.threads] == ["metrics-server"]
    assert stacks.threads[0].frames


# -- issue 13.3(c): a thread list through self-referencing words --------------------------------------


def crafted_core(cores, key: str, tmp_path: Path, *, pass_interp_check: bool) -> tuple[str, str | None, dict]:
    """A copy of a real core whose thread list leads into 8 MiB of self-referencing words.

    The region is the exporter's ballast (a bytearray of written pages).  Each 64-byte cell holds
    words that point one cell further on: as a thread state its ``next`` leads into the next cell and
    its current frame into the region; as a frame its ``previous`` leads on, its code to garbage.  With
    ``pass_interp_check`` each cell is also a thread state that points back to the interpreter and on
    to the next cell, so only the walk's own bounds stop it.
    """
    from tests.crashers.make_core import make_core

    interp_ = cores.interpreter(key)
    sysroot = str(interp_.root) if interp_.root else None
    src = str(make_core(tmp_path, interp_.python, "segv", root=interp_.root, env={"EXPORTER_BALLAST_MB": "9"}))
    slots = main_thread_slots(src, sysroot)
    core, _, layout = core_layout(src, sysroot)
    with CoreMemory.open(src) as mem:
        seg = max((s for s in mem.segments if s.present >= 9 << 20), key=lambda s: s.present)
    start = seg.vaddr + (1 << 20)
    size = 8 << 20
    cell = 64 * 8
    ts_next = layout.offset("PyThreadState", "next")
    ts_frame = layout.offset("PyThreadState", layout.tstate_frame)
    ts_interp = layout.offset("PyThreadState", "interp")
    buf = bytearray(size)
    words = memoryview(buf).cast("Q")
    for i in range(0, size // 8):
        words[i] = start + ((i * 8 + cell) % size)  # every word points one cell further on
    if pass_interp_check:
        for c in range(0, size, cell):
            words[(c + ts_interp) // 8] = slots["interp"]
            words[(c + ts_next) // 8] = start + (c + cell) % size  # the next cell is the next thread state
    assert ts_next != ts_frame
    dst = tmp_path / "core.crafted"
    shutil.copyfile(src, dst)
    with CoreMemory.open(src) as mem:
        off = file_offset(mem, start)
    with open(dst, "r+b") as f:
        f.seek(off)
        f.write(buf)
    path = patched_copy(str(dst), tmp_path / "core.crafted2", {slots["head_slot"]: start})
    return path, sysroot, slots


@pytest.mark.parametrize("key", python_params(("3.12",), sid=("3.14",)))
def test_thread_list_into_self_referencing_words_is_refused_at_once(cores, key, tmp_path):
    # GIVEN a crafted core whose thread list points into 8 MiB of self-referencing words
    path, sysroot, slots = crafted_core(cores, key, tmp_path, pass_interp_check=False)
    # WHEN it is read
    stacks, seconds = read_timed(path, sysroot)
    # THEN the first bogus thread state is refused: it does not point back to its interpreter
    assert stacks.status is PythonStatus.FAILED and stacks.threads == ()
    assert "belongs to interpreter 0x" in stacks.detail and f"not 0x{slots['interp']:x}" in stacks.detail
    assert seconds < 30  # a bound, not a speed: the unbounded walk took 110 s; under load this is well under 1 s


@pytest.mark.parametrize("key", python_params(("3.12",), sid=("3.14",)))
def test_crafted_thread_list_is_cut_and_says_so(cores, key, tmp_path):
    # GIVEN the same region, crafted so that every cell also passes the thread state's back-pointer check
    path, sysroot, _ = crafted_core(cores, key, tmp_path, pass_interp_check=True)
    # WHEN it is read with the default bounds
    stacks, seconds = read_timed(path, sysroot)
    # THEN the walk stops where the chains stop looking like CPython's, says why, and is quick and small
    assert stacks.status is PythonStatus.PARTIAL
    assert "(not a frame chain)" in stacks.detail
    assert stacks.detail.endswith("thread states in a row have no readable stack (not a thread list)")
    assert len(stacks.threads) <= 16 and seconds < 30  # (the unbounded walk: 110 s)
    # and each bound of the whole walk cuts it where it is, saying which (threads, frames, reads, time)
    for limits, said in ((Limits(threads=4), "cut at the walk's bound of 4 threads"),
                         (Limits(total_frames=50), "cut at the walk's bound of 50 frames in all"),
                         (Limits(reads=200), "cut at the walk's bound of 200 memory reads"),
                         (Limits(seconds=0), "cut at the walk's time bound of 0 s")):
        cut, _ = read_timed(path, sysroot, limits=limits)
        assert cut.status is PythonStatus.PARTIAL and cut.cut == said and cut.detail.endswith(said), cut.detail
    # and as a user sees it: one Stacks line that says so, in text and JSON, in bounded output
    from tests.integration.test_cli_analyze import run

    args = ["--method", "direct", path] + (["--sysroot", sysroot] if sysroot else [])
    r = run("analyze", *args)
    stacks_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("Stacks:"))
    assert "(not a thread list)" in stacks_line and len(r.stdout) < 200_000
    doc = json.loads(run("analyze", "--json", *args).stdout)
    assert doc["analysis"]["snapshot"]["python_status"] == "partial"
    # and with the default method, which adds gdb's DWARF layout when the direct stacks are not whole (the
    # path the unbounded walk took 235 s on): the same bounded walk, the same bounded output
    default = ["analyze", path] + (["--sysroot", sysroot] if sysroot else [])
    t = time.monotonic()
    r = run(*default)
    assert time.monotonic() - t < 120  # a bound, not a speed
    stacks_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("Stacks:"))
    assert "not a thread list" in stacks_line and len(r.stdout) < 200_000, stacks_line


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
    stacks = read_python_stacks(core)
    # THEN it says so, without threads
    assert stacks.status is PythonStatus.NOT_PYTHON
    assert stacks.detail.startswith("not a CPython process")
    assert stacks.threads == () and stacks.version is None


def test_never_imports_gdb(cores, newest_python):
    # GIVEN a fresh interpreter
    code = ("import sys; from forensics.core import open_core; from forensics.pyread import read_python_stacks; "
            f"d = read_python_stacks(open_core({str(cores.get(newest_python, 'segv'))!r})); "
            "assert d.status.value == 'ok', d; "
            "bad = [m for m in sys.modules "
            "       if m.split('.')[0] in ('gdb', 'pygdbmi', 'elftools') or m == 'forensics.gdb']; "
            "print(bad)")
    # WHEN the reader runs in it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # THEN neither gdb, pygdbmi nor pyelftools was imported
    assert out.strip() == "[]"


# -- the bound of the memory scan -----------------------------------------------------------------

BIG_DATA_C = Path(__file__).resolve().parent.parent / "crashers" / "big_data.c"


def test_the_memory_scan_reads_at_most_64_mib_of_an_objects_data(cores, newest_python, core_pattern, tmp_path):
    # GIVEN a real CPython's _Py_DebugOffsets (the start of _PyRuntime), read from a real core of it
    from forensics.core.image import ElfImage
    from forensics.pyread.debug_offsets import COOKIE
    from forensics.pyread.locate import find_runtime
    from forensics.pyread.scan import MAX_SCAN_BYTES, _writable, find_runtime_in_memory
    from tests.crashers.make_core import crash_for_core

    assert MAX_SCAN_BYTES == 64 << 20  # (what this test holds it to)
    path = str(cores.get(newest_python, "segv"))
    shapes = debug_offset_shapes()
    with CoreMemory.open(path) as mem:
        binary = find_runtime(open_core(path), mem)
        assert binary is not None
        offsets = mem.read_prefix(binary.runtime, max(read_size(s) for s in shapes.values()))
    if offsets[:8] != COOKIE:
        pytest.skip(f"CPython {newest_python} publishes no _Py_DebugOffsets (3.13 and later do)")
    assert parse_debug_offsets(offsets, shapes) is not None
    (tmp_path / "offsets").write_bytes(offsets)
    # and a real program whose writable data is 80 MiB, holding those bytes 1 MiB in, or 70 MiB in
    exe = tmp_path / "big_data"
    subprocess.run(["gcc", "-O0", "-o", str(exe), str(BIG_DATA_C)], check=True, timeout=120)
    for planted_at in (1 << 20, 70 << 20):
        run_dir = tmp_path / f"run-{planted_at}"
        run_dir.mkdir()
        core_path = str(crash_for_core([str(exe), str(planted_at), str(tmp_path / "offsets")], run_dir))
        core = open_core(core_path)
        with CoreMemory.open(core_path) as mem:
            image = ElfImage.from_memory(mem, core.libraries[0].base)
            start, size = _writable(image)[0]
            assert size > 80 << 20
            # (the bytes are in the core, where they were put: 1 MiB or 70 MiB into the program's data)
            data = mem.read_prefix(start, size)
            assert len(data) == size
            where = data.find(offsets)
            assert planted_at <= where < planted_at + (1 << 20)
            # WHEN the interpreter is looked for in the core's memory
            found = find_runtime_in_memory(core, mem)
            # THEN within the first 64 MiB it is found, past them it is not looked for
            if planted_at < 64 << 20:
                assert found is not None and found.runtime == start + where and found.file_path is None
            else:
                assert where > 64 << 20 and found is None
