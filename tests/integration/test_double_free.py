"""A chunk freed twice, whichever of glibc's checks catches it, is found and called a second free (#38 item 3).

glibc's message names the neighbour its check read, not the bug: the same double free reads
"double free detected in tcache 2", "(fasttop)", "(top)" or "(!prev)" by the neighbours the chunk has
(``tests/crashers/double_free.py`` arranges each), and on "(!prev)" the chunk may already be merged with a
free neighbour into one chunk on the unsorted list.  Oracles independent of the reader: the crasher writes
the pointer malloc returned before it frees anything; gdb with libc6-dbg prints ``_int_free``'s ``p``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.core import open_core
from forensics.errors import EXIT_OK
from forensics.format import load_analysis
from forensics.heap import read_heap
from forensics.heap.debuginfo import find_libc_debug_file
from forensics.heap.locate import find_libc
from forensics.model import HeapFailureKind
from forensics.report.heapsection import heap_section
from tests.conftest import PYTHONS
from tests.crashers.make_core import crash_for_core

SCRIPT = Path(__file__).resolve().parent.parent / "crashers" / "double_free.py"
TCACHE = "free(): double free detected in tcache 2"
PREV = "double free or corruption (!prev)"
#: (mode, size) -> glibc's message for it (the same on 2.31-2.43 unless said otherwise)
MODES = {
    ("tcache", 200): TCACHE,
    ("fasttop", 40): "double free or corruption (fasttop)",
    ("top", 0xF000): "double free or corruption (top)",
    ("prev", 0x1000): PREV,
    ("merged", 0x1000): PREV,  # merged with the free chunk after it: one chunk on the unsorted list
    ("merged-back", 0x1000): PREV,  # merged into the free chunk before it, which now covers it
}


def crash(python: str, mode: str, size: int, run: Path, root: Path | None = None) -> tuple[Path, dict]:
    run.mkdir(parents=True, exist_ok=True)
    core = crash_for_core([python, str(SCRIPT), mode, str(size), str(run / "oracle.json")], run,
                          outputs=("oracle.json",), root=root, binds=(SCRIPT,) if root else ())
    return core, json.loads((run / "oracle.json").read_text())


def analyze(core: Path, *args: str) -> dict:
    r = CliRunner().invoke(cli, ["analyze", "--json", *args, str(core)], catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    return json.loads(r.stdout)["analysis"]


def has_libc_debug_file(core: Path, sysroot: str | None = None) -> bool:
    libc = find_libc(open_core(str(core), sysroot=sysroot).libraries)
    return libc is not None and find_libc_debug_file(libc.build_id, sysroot=sysroot) is not None


def check_second_free(c: dict, oracle: dict) -> None:
    """The anatomy of a double free: the chunk the crasher freed twice, called a second free, no overflow."""
    assert c["kind"] == "double-free", c
    assert c["rejected"]["address"] == oracle["chunk"], (c["rejected"], oracle)
    second = f"a second free of 0x{oracle['mem']:x} (its chunk at 0x{oracle['chunk']:x}"
    assert c["verdict_reason"].startswith(second), c["verdict_reason"]
    assert c["overflowed"] is None and c["overflow_length"] is None and c["damaged"] is None


@pytest.fixture(scope="module")
def host_cores(tmp_path_factory, core_pattern):
    """One core per mode, crashed by this machine's newest CPython on its glibc."""
    python = PYTHONS[max(PYTHONS, key=lambda v: tuple(map(int, v.split("."))))]
    base = tmp_path_factory.mktemp("double-free")
    return {mode: crash(python, mode, size, base / mode) for mode, size in MODES}


@pytest.mark.parametrize("mode, size", sorted(MODES), ids=[m for m, _ in sorted(MODES)])
def test_each_check_of_a_double_free_finds_the_chunk(mode, size, host_cores):
    # GIVEN one pointer freed twice, its neighbours arranged for one of glibc's double-free checks
    core, oracle = host_cores[mode]
    # WHEN the core is analyzed (libdw's stacks: the frames' registers)
    a = analyze(core)
    c = a["heap"]["corruption"]
    # THEN glibc said what that check says, and the anatomy is a second free of the crasher's pointer
    assert a["crash"]["abort_message"] == MODES[(mode, size)]
    check_second_free(c, oracle)
    # read from _int_free's own variable, where libc's DWARF says it is at the call of malloc_printerr
    if has_libc_debug_file(core):
        assert c["rejected_found_by"].startswith("_int_free's p (register "), c["rejected_found_by"]
    proof = c["verdict_reason"]
    if mode == "merged":  # the case: one free chunk on the unsorted list, its pointer freed again
        assert f"0x{oracle['chunk']:x} is already a free chunk (size 0x{oracle['merged_size']:x}) in the unsorted bin" \
            in proof and c["rejected"]["size"] == oracle["merged_size"] and c["rejected"]["state"] == "free"
    elif mode == "merged-back":
        assert (f"0x{oracle['chunk']:x} lies inside the free chunk 0x{oracle['before']:x} (size "
                f"0x{oracle['merged_size']:x}) in the unsorted bin") in proof
        assert c["rejected"]["size"] == oracle["chunk_size"]  # its own header, left as it was
    elif mode == "prev":
        assert f"0x{oracle['chunk']:x} is already a free chunk (size 0x{oracle['chunk_size']:x}) in the unsorted" \
            in proof
    elif mode == "top":
        assert oracle["top"] == oracle["chunk"] + oracle["chunk_size"] and "top chunk" in proof
    elif mode == "fasttop":
        assert "is already the first chunk of the 0x30 fastbin" in proof
    else:
        assert "is already in a tcache list" in proof


def test_the_text_and_the_reports_heap_section_say_a_second_free(host_cores):
    # GIVEN the consolidated double free
    core, oracle = host_cores["merged"]
    # WHEN analyze prints its text, and a report words its heap section from the JSON
    r = CliRunner().invoke(cli, ["analyze", str(core)], catch_exceptions=False)
    doc = CliRunner().invoke(cli, ["analyze", "--json", str(core)], catch_exceptions=False).stdout
    section = heap_section(load_analysis(json.loads(doc)).heap)
    # THEN both open with the second free, not with who wrote past a buffer (none was)
    assert f"  verdict:         double-free: a second free of 0x{oracle['mem']:x} (its chunk at " in r.stdout
    assert "damaged header:" not in r.stdout and "overflowed:" not in r.stdout
    assert section["summary"].startswith(f"Conclusion: a second free of 0x{oracle['mem']:x} "), section["summary"]
    assert section["summary"].endswith('glibc aborted with "double free or corruption (!prev)" (the PREV_INUSE bit '
                                       "of the chunk after the one being freed).")


@pytest.mark.parametrize("mode", ["merged", "prev", "tcache"])
def test_without_the_frames_registers_the_stack_still_holds_it(mode, host_cores):
    # GIVEN the same cores read without unwound frames (gdb's stacks carry no registers); one chunk is free
    # (merged-back frees two: either would fail "(!prev)" alike, and only the frames tell which free() was given)
    core, oracle = host_cores[mode]
    core_file = open_core(str(core))
    # WHEN only the crashing thread's registers at the signal and its stack words are searched
    c = read_heap(core_file, message=core_file.abort_message, tid=core_file.crashed_tid).corruption
    # THEN the chunk is still the one freed twice (a word of the stack: a callee's save slot of %rbx), and where
    # only glibc's holding it free made it the one, that is said
    assert c.kind is HeapFailureKind.DOUBLE_FREE and c.rejected.address == oracle["chunk"]
    assert c.rejected_found_by.startswith("stack at ")
    assert any("the first value the crashing thread holds that glibc holds free" in p for p in c.problems) \
        is (mode != "tcache")


@pytest.mark.parametrize("mode", ["merged", "prev"])
def test_gdb_reads_the_same_pointer_in_int_free(mode, host_cores):
    # GIVEN gdb with glibc's debug symbols as the oracle of _int_free's argument
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.skip("gdb is not installed")
    core, oracle = host_cores[mode]
    out = subprocess.run([gdb, "-nx", "-batch", "-q", oracle["python"], str(core), "-ex", "frame function _int_free",
                          "-ex", 'printf "P=%lx\\n", p'], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"P=([0-9a-f]+)", out)
    if m is None:
        pytest.skip(f"gdb could not read _int_free's p (no libc6-dbg?): {out[-300:]}")
    # THEN the analysis names the chunk gdb sees
    c = analyze(core)["heap"]["corruption"]
    assert c["rejected"]["address"] == int(m.group(1), 16) == oracle["chunk"]


@pytest.mark.parametrize("version", sorted(PYTHONS), ids=[f"python={v}" for v in sorted(PYTHONS)])
def test_a_double_free_in_tp_dealloc_under_each_interpreter(version, tmp_path, core_pattern):
    # GIVEN a ctypes buffer freed by native code, then again by ctypes' tp_dealloc when it dies: small enough
    # for the tcache, and large enough that its neighbours decide the message
    messages = set()
    for size in (600, 0x3000):
        core, oracle = crash(PYTHONS[version], "dealloc", size, tmp_path / str(size))
        a = analyze(core)
        messages.add(a["crash"]["abort_message"])
        # THEN whatever glibc said, the chunk is found and the verdict is a second free, by CPython's free
        check_second_free(a["heap"]["corruption"], oracle)
        assert a["heap"]["corruption"]["freed_by"]["python_caller"].startswith("main (double_free.py:")
    # and the two sizes made two of glibc's messages for the one bug
    assert TCACHE in messages and len(messages) == 2, messages


@pytest.fixture(scope="module")
def debian_root(request):
    from tests.roots import glibc_root_of

    return glibc_root_of(request)


@pytest.mark.parametrize("mode", ["merged", "merged-back", "tcache"])
@pytest.mark.parametrize("debian_root", ["bullseye", "trixie", "sid"], indirect=True,
                         ids=["glibc=2.31", "glibc=2.41", "glibc=2.43"])
def test_other_glibc_versions(debian_root, mode, tmp_path, core_pattern):
    # GIVEN the double free made by the root's own Python on the root's own glibc (2.43: free() tail-calls
    # _int_free_chunk and leaves no frame of its own)
    suite, root, version, python = debian_root
    size = next(s for m, s in MODES if m == mode)
    core, oracle = crash(python, mode, size, tmp_path / "run", root=root)
    # WHEN analyzed with the root as sysroot (its libc and its libc6-dbg)
    a = analyze(core, "--sysroot", str(root))
    c = a["heap"]["corruption"]
    # THEN the chunk is found, through the DWARF location of the free path's own variable, and is a second free
    assert a["crash"]["abort_message"] == MODES[(mode, size)]
    check_second_free(c, oracle)
    if (version, mode) == ("2.43", "tcache"):
        # free() tail-calls tcache_double_free_verify, whose e is only "the value rdi had on entry": no frame
        # keeps it (the caller is libffi's, with no call-site DWARF); the words of the stack do
        assert c["rejected_found_by"].startswith("stack at "), c["rejected_found_by"]
    else:
        assert re.match(r"((_int_free|_int_free_chunk|_int_free_merge_chunk)'s p|__libc_free's mem) \(register ",
                        c["rejected_found_by"]), c["rejected_found_by"]
