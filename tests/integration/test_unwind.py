"""The libdw unwinder (forensics.unwind) against gdb, frame for frame, on real kernel cores.

Every core the suite makes for every CPython 3.8-3.13 found here, then the same cores read through
a sysroot of stripped copies (debug info stripped; everything stripped), through a capture bundle's
object store, and with a library of another build (withheld: unnamed, never misnamed).

gdb's side is gdb itself: the forensics-native script walks ``gdb.Frame.older()`` as ``bt`` does
and reports, per frame, gdb's function name, ``find_sal()`` file:line, ``info symbol`` offset,
frame type (inlined, tail call) and ``solib_name``.  Compared per frame: pc, function (or, for two
ELF symbols of one address such as ``clone3``/``__clone3``, the same offset into it), offset,
library file, file:line and the inlined mark.  gdb's tail-call frames are left out: gdb
reconstructs them from DWARF call-site records (no return address of theirs is on the stack);
libdw, like eu-stack and pystack, shows the stack as it is.  That they are the only difference is
what these tests assert.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.analyze import analyze_core
from forensics.core import open_core
from forensics.gdb import GdbSession
from forensics.model import CoreFile, LibraryStatus, NativeFrame, NativeStack
from forensics.modes import Unwinder
from forensics.unwind import unwind_core
from tests.conftest import python_params
from tests.crashers.make_core import crash_for_core

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")

SCENARIOS = ("heap-prev", "heap-next-size", "segv", "py-abort", "qsort-abort")
NEWEST_ONLY = ("fpe", "ill", "bus")


def gdb_frames(core: CoreFile, sysroot: str | None = None) -> tuple[tuple[NativeStack, ...], dict]:
    """gdb's native stacks of ``core``, and the file gdb read for each frame's library ({(tid, index): path})."""
    exe = core.libraries[0] if core.libraries else None
    exe_file = exe.file_path if exe is not None and exe.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED) else None
    with GdbSession() as session:
        doc = session.analyze(core, exe_file, python=False, sysroot=sysroot)
        assert doc.native is not None
        read = {(t.tid, f.index): os.path.realpath(f.library) if f.library else None  # while the link farm exists
                for t in doc.native for f in t.frames}
    return doc.native, read


def library_file(core: CoreFile, path: str | None) -> str | None:
    for lib in core.libraries:
        if lib.path == path:
            usable = lib.file_path and lib.status is not LibraryStatus.MISMATCH
            return os.path.realpath(lib.file_path) if usable else None
    return None


@dataclasses.dataclass
class Agreement:
    frames: int = 0
    inlined: int = 0
    with_line: int = 0
    named: int = 0
    tailcalls_left_out: int = 0
    guessed_by_gdb: int = 0  # gdb's frames past an object whose file was withheld
    line_rows_differ: int = 0  # an address with several line-table rows: gdb took a statement row, libdw the last


def assert_same_as_gdb(core: CoreFile, sysroot: str | None = None) -> Agreement:
    ours = unwind_core(core, sysroot=sysroot)
    theirs, file_read = gdb_frames(core, sysroot)
    seen = Agreement()
    assert [t.tid for t in ours] == [t.tid for t in theirs]
    for mine, gdb in zip(ours, theirs, strict=True):
        tid = mine.tid
        assert mine.method is Unwinder.LIBDW
        gdb_list = [f for f in gdb.frames if not f.tailcall]
        seen.tailcalls_left_out += len(gdb.frames) - len(gdb_list)
        if mine.stopped_in_withheld and len(gdb_list) > len(mine.frames):
            # libdw stops where it has no file to unwind with; gdb guesses on, into frames it cannot name
            # and a stack it calls corrupt itself
            beyond = gdb_list[len(mine.frames):]
            assert all(f.symbol is None and f.file is None for f in beyond), (tid, beyond)
            assert gdb.error, (tid, gdb)
            seen.guessed_by_gdb += len(beyond)
            gdb_list = gdb_list[: len(mine.frames)]
        else:
            assert bool(mine.error) == bool(gdb.error), (tid, mine.error, gdb.error)
        assert len(mine.frames) == len(gdb_list), (tid, [f.symbol for f in mine.frames], [f.symbol for f in gdb_list])
        for i, (a, b) in enumerate(zip(mine.frames, gdb_list, strict=True)):
            where = f"thread {tid} frame {i}: libdw {a} vs gdb {b}"
            assert a.pc == b.pc, where
            assert a.inlined == b.inlined, where
            if (a.file, a.line) != (b.file, b.line):
                assert_one_address_two_rows(core, sysroot, a, b, i > 0 and not a.inlined), where
                seen.line_rows_differ += 1
            assert a.offset == b.offset, where
            # the same function, or two ELF symbols of one address (the same offset from one start)
            assert a.symbol == b.symbol or (a.offset is not None and not a.inlined), where
            read = file_read[(gdb.tid, b.index)]
            if a.library not in (None, "[vdso]") and read is not None:
                assert library_file(core, a.library) == read, where
            seen.frames += 1
            seen.inlined += a.inlined
            seen.with_line += a.line is not None
            seen.named += a.symbol is not None
    return seen


def line_rows(core: CoreFile, sysroot: str | None, pc: int) -> list[tuple[str, int, bool]]:
    """The line-table rows at the last address <= ``pc`` with rows, from the object's DWARF, in table
    order: (file name, line, is a statement).  pyelftools reads them, independently of libdw and gdb."""
    from elftools.elf.elffile import ELFFile

    from forensics.core.debugfiles import find_debug_file

    lib = next(x for x in core.libraries if x.path == core.find_mapping(pc).path)
    with open(lib.file_path, "rb") as f:
        first = min(seg["p_vaddr"] for seg in ELFFile(f).iter_segments() if seg["p_type"] == "PT_LOAD")
    addr = pc - (lib.base - (first & ~0xFFF))
    debug = find_debug_file(lib.build_id, sysroot) or lib.file_path
    with open(debug, "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        cu = dwarf.get_CU_at(dwarf.get_aranges().cu_offset_at_addr(addr))
        program = dwarf.line_program_for_CU(cu)
        names = [e.name.decode() for e in program["file_entry"]]
        rows = [e.state for e in program.get_entries() if e.state is not None and not e.state.end_sequence]
    at = max(r.address for r in rows if r.address <= addr)
    return [(names[r.file] if program.header.version >= 5 else names[r.file - 1], r.line, bool(r.is_stmt))
            for r in rows if r.address == at]


def assert_one_address_two_rows(core: CoreFile, sysroot: str | None, ours: NativeFrame, gdbs: NativeFrame,
                                caller: bool) -> None:
    """Where libdw and gdb name different lines for one frame: both must be rows of the same address (DWARF 5
    location views give one address several rows), gdb's a statement row (gdb prefers those, and drops a
    non-statement row that switches files at the same address), libdw's the last row of that address."""
    rows = line_rows(core, sysroot, ours.pc - (1 if caller else 0))
    base = lambda path: (path or "").rsplit("/", 1)[-1]  # noqa: E731
    keys = [(base(f), line) for f, line, _ in rows]
    assert len(rows) > 1, rows
    assert (base(ours.file), ours.line) == keys[-1], (ours, rows)
    assert (base(gdbs.file), gdbs.line, True) in [(base(f), line, stmt) for f, line, stmt in rows], (gdbs, rows)


def cases():
    out = [pytest.param(p.values[0], s, id=f"{p.id},scenario={s}", marks=p.marks)
           for p in python_params() for s in SCENARIOS]
    return out


# -- the cores as they are ---------------------------------------------------------------------


@pytest.mark.parametrize("version,scenario", cases())
def test_same_frames_as_gdb(cores, version, scenario):
    # GIVEN a real core of every CPython here, with its files in place
    core = open_core(str(cores.get(version, scenario)))
    # THEN libdw and gdb give the same frames, inlined ones included
    seen = assert_same_as_gdb(core)
    assert seen.frames >= 20 and seen.named >= 15 and seen.with_line >= 10, seen
    assert seen.inlined or version in ("3.8",), seen  # pyenv's 3.9+ builds inline CPython's call helpers


@pytest.mark.parametrize("scenario", NEWEST_ONLY)
def test_same_frames_as_gdb_other_signals(cores, newest_python, scenario):
    core = open_core(str(cores.get(newest_python, scenario)))
    seen = assert_same_as_gdb(core)
    assert seen.frames >= 20, seen


# -- the same cores through a sysroot of stripped copies -----------------------------------------


def stripped_sysroot(core: CoreFile, root: Path, mode: str) -> Path:
    """Every object the core maps copied under ``root``; the interpreter, libpython and libcrash.so stripped."""
    for lib in core.libraries:
        if not lib.file_path or not lib.path.startswith("/"):
            continue
        dst = root / lib.path.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if lib.path == core.executable or lib.name.startswith(("libpython", "libcrash")):
            subprocess.run(["strip", f"--strip-{mode}", "-o", str(dst), os.path.realpath(lib.file_path)], check=True)
        else:
            shutil.copy(os.path.realpath(lib.file_path), dst)
    return root


@pytest.mark.parametrize("mode", ["debug", "all"])
@pytest.mark.parametrize("version", python_params())
def test_same_frames_as_gdb_from_stripped_files(cores, version, mode, tmp_path):
    # GIVEN the core's files under a sysroot, the interpreter, libpython and the culprit library stripped
    path = str(cores.get(version, "heap-prev"))
    root = stripped_sysroot(open_core(path), tmp_path / "root", mode)
    core = open_core(path, sysroot=str(root))
    assert all(lib.file_path.startswith(str(root)) for lib in core.libraries if lib.status is LibraryStatus.OK
               and lib.path.startswith("/"))
    # THEN both read the stripped copies and agree: names from what is left (.symtab, .dynsym), no invented lines
    seen = assert_same_as_gdb(core, str(root))
    assert seen.frames >= 20, seen
    crashed = unwind_core(core, sysroot=str(root))[0].frames
    culprit = next(f for f in crashed if f.symbol == "forensics_heap_overflow")  # exported: in .dynsym
    assert culprit.file is None and culprit.line is None


def test_a_stripped_library_is_named_from_its_debug_file_in_the_root(cores, newest_python, tmp_path):
    # GIVEN libcrash.so stripped under a sysroot, with its separate debug file where Debian puts it
    from forensics.core.debugfiles import build_id_debug_path

    path = str(cores.get(newest_python, "heap-prev"))
    full = open_core(path)
    root = stripped_sysroot(full, tmp_path / "root", "debug")
    lib = next(x for x in full.libraries if x.name == "libcrash.so")
    debug = root / build_id_debug_path(lib.build_id).lstrip("/")
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", lib.file_path, str(debug)], check=True)
    # WHEN the stacks are read through that root
    frames = unwind_core(open_core(path, sysroot=str(root)), sysroot=str(root))[0].frames
    # THEN the culprit has its source line back, as it has with the unstripped file
    culprit = next(f for f in frames if f.symbol == "forensics_heap_overflow")
    want = next(f for f in unwind_core(full)[0].frames if f.symbol == "forensics_heap_overflow")
    assert (culprit.file, culprit.line) == (want.file, want.line) and want.line


# -- a capture bundle: files from its object store, by build-id ----------------------------------


def make_bundle(core_path: str, where: Path) -> Path:
    from forensics.bundle.write import BundleWriter

    core = open_core(core_path)
    bundle = where / "bundle"
    bundle.mkdir(parents=True)
    w = BundleWriter(str(bundle))
    (bundle / "50-core").mkdir()
    shutil.copy(core_path, bundle / "50-core" / "core")
    w.note_file("50-core/core", "the core")
    for lib in core.libraries:
        if lib.build_id and lib.file_path:
            dst = bundle / "objects" / lib.build_id[:2] / lib.build_id[2:]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.realpath(lib.file_path), dst)
    w.write_manifest()
    return bundle


def test_same_frames_as_gdb_from_a_bundles_object_store(cores, newest_python, tmp_path):
    from forensics.bundle import bundle_sysroot

    bundle = make_bundle(str(cores.get(newest_python, "segv")), tmp_path)
    path, root = bundle_sysroot(str(bundle))
    core = open_core(path, sysroot=root)
    used = [lib for lib in core.libraries if lib.status is LibraryStatus.OK and lib.path.startswith("/")]
    assert used and all(lib.file_path.startswith(root) for lib in used)
    seen = assert_same_as_gdb(core, root)
    assert seen.frames >= 20 and seen.with_line >= 10, seen


# -- a library of another build: withheld, its frames unnamed ------------------------------------


def test_a_library_of_another_build_is_withheld_not_misnamed(cores, newest_python, tmp_path):
    # GIVEN a sysroot whose libcrash.so is another build (other flags, same functions)
    from tests.crashers.make_core import build_libcrash

    path = str(cores.get(newest_python, "heap-prev"))
    root = stripped_sysroot(open_core(path), tmp_path / "root", "debug")
    lib = next(x for x in open_core(path).libraries if x.name == "libcrash.so")
    other = build_libcrash(tmp_path / "other", cflags=["-O0", "-DOTHER_BUILD=1"])
    shutil.copy(other, root / lib.path.lstrip("/"))
    core = open_core(path, sysroot=str(root))
    assert next(x for x in core.libraries if x.name == "libcrash.so").status is LibraryStatus.MISMATCH
    # THEN the frame in it is unnamed (never named from the wrong file), and gdb agrees
    frames = unwind_core(core, sysroot=str(root))[0].frames
    in_lib = [f for f in frames if f.library == lib.path]
    assert in_lib and all(f.symbol is None and f.file is None for f in in_lib)
    # and the unwinding stops there, saying why, where gdb guesses on through frames it cannot name
    crashed = unwind_core(core, sysroot=str(root))[0]
    assert crashed.stopped_in_withheld and "libcrash.so" in crashed.error and "another build" in crashed.error
    seen = assert_same_as_gdb(core, str(root))
    assert seen.guessed_by_gdb > 0, seen


# -- relocated: Debian's own interpreters, crashed in a Debian unstable root -----------------------


SID_VERSIONS = ("3.13", "3.14", "3.15")


@pytest.fixture(scope="module")
def sid_cores(sid_root, tmp_path_factory, core_pattern):
    """Cores of Debian's python3.13-3.15 (stripped; their DWARF in the root's -dbg files, glibc's in its
    libc6-dbg), crashed inside the root: the files they name exist only under the root."""
    from tests.crashers.make_core import build_libcrash, make_core

    base = tmp_path_factory.mktemp("sid-cores")
    lib = build_libcrash(base)
    made: dict[tuple[str, str], Path] = {}

    def get(version: str, scenario: str) -> Path:
        if (version, scenario) not in made:
            made[version, scenario] = make_core(base, f"/usr/bin/python{version}", scenario, libcrash=lib,
                                                root=sid_root)
        return made[version, scenario]

    return get


@pytest.mark.parametrize("scenario", ["heap-prev", "segv"])
@pytest.mark.parametrize("version", SID_VERSIONS)
def test_same_frames_as_gdb_relocated_into_a_root(sid_root, sid_cores, version, scenario):
    # GIVEN a core of Debian's interpreter and glibc, whose files are only under --sysroot
    core = open_core(str(sid_cores(version, scenario)), sysroot=str(sid_root))
    by_name = {lib.name: lib for lib in core.libraries}
    libc = by_name["libc.so.6"]
    assert libc.status is LibraryStatus.OK and libc.file_path.startswith(str(sid_root))
    exe = core.libraries[0]
    assert exe.status is LibraryStatus.OK and exe.file_path.startswith(str(sid_root))
    # THEN both read the root's files and its separate debug files, and agree frame for frame
    seen = assert_same_as_gdb(core, str(sid_root))
    assert seen.frames >= 20 and seen.inlined > 0 and seen.with_line >= 15, seen
    # the interpreter's and glibc's own functions are named from the root's debug files
    frames = unwind_core(core, sysroot=str(sid_root))[0].frames
    names = {f.symbol for f in frames}
    assert "Py_RunMain" in names and "__libc_start_call_main" in names, names


# -- without libdw: gdb unwinds every thread, and says so ------------------------------------------


def test_without_libdw_gdb_unwinds_and_the_snapshot_says_so(cores, newest_python):
    import json
    import sys

    # GIVEN a machine where libdw cannot be loaded (FORENSICS_LIBDW names a file that is not there)
    core = str(cores.get(newest_python, "segv"))
    env = {**os.environ, "FORENSICS_LIBDW": "/nonexistent/libdw.so.1"}
    r = subprocess.run([sys.executable, "-m", "forensics", "analyze", "--json", core], capture_output=True, text=True,
                       env=env, timeout=300)
    # THEN the native stacks come from gdb, every thread says so, and a warning says why
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["native_method"] == "gdb"
    assert all(t["native_method"] == "gdb" for t in snap["threads"])
    assert any("libdw unwinder unavailable" in w and "/nonexistent/libdw.so.1" in w for w in snap["warnings"])
    crashed = next(t for t in snap["threads"] if t["is_crashed"])
    assert crashed["native_frames"][0]["symbol"] == "forensics_bad_write"
    # and with no gdb either: a partial result, program counters only, with both fixes said
    r = subprocess.run([sys.executable, "-m", "forensics", "analyze", "--json", "--gdb", "/nonexistent/gdb", core],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 4, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["native_method"] == "registers"
    said = " ".join(snap["warnings"])
    assert "libdw unwinder unavailable" in said and "apt-get install -y gdb" in said
    assert snap["threads"][0]["py_frames"], "the Python stacks still come from the direct reader"


# -- a stack that loops --------------------------------------------------------------------------


LOOPING_STACK_C = Path(__file__).resolve().parent.parent / "crashers" / "looping_stack.c"


def test_a_looping_stack_is_cut_where_it_repeats(tmp_path, core_pattern):
    # GIVEN a real kernel core of a C program whose two frame records point at each other
    exe = tmp_path / "looping_stack"
    subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-o", str(exe), str(LOOPING_STACK_C)],
                   check=True, timeout=120)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    core_path = crash_for_core([str(exe)], run_dir)
    core = open_core(str(core_path))
    # (the stack really loops: eu-stack, which has no such check, goes round until its own frame limit)
    if shutil.which("eu-stack"):
        eu = subprocess.run(["eu-stack", "--core", str(core_path), "-e", str(exe)], capture_output=True,
                            text=True, timeout=60).stdout
        assert eu.count(" loop_a") > 10 and eu.count(" loop_b") > 10, eu[-2000:]
    # WHEN libdw unwinds it
    (thread,) = unwind_core(core)
    # THEN it stops at the first frame equal to an earlier one (pc and stack pointer), not at MAX_FRAMES,
    # and says why: the frames before the repeat, each once
    assert [f.symbol for f in thread.frames] == ["crash", "loop_a", "loop_b"], thread.frames
    assert thread.error.startswith("stopped after 3 frames: the stack loops (frame #3 repeats frame #1: pc "), thread
    assert f"pc {thread.frames[1].pc:#x}," in thread.error
    # and the analysis keeps that reason on the thread, beside its three frames
    analysis = analyze_core(str(core_path))
    (crashed,) = analysis.snapshot.threads
    assert crashed.native_error == thread.error and crashed.native_method is Unwinder.LIBDW
    assert [f.symbol for f in crashed.native_frames] == ["crash", "loop_a", "loop_b"]
