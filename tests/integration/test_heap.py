"""The glibc heap reader on real cores: plain C and Python heap overflows, this glibc and Debian's others.

Oracles independent of the reader: the crashing program writes, before its overflow, what
glibc itself says (the pointers malloc returned, ``malloc_usable_size``); gdb with
``libc6-dbg`` prints the chunk ``_int_free`` was working on.  Every core is read twice:
with libc's debug file (symbols and DWARF) and with the layout table and the searches only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.core import open_core
from forensics.heap import read_heap
from forensics.model import ChunkState, HeapFailureKind
from tests.crashers.make_core import crash_for_core

HERE = Path(__file__).resolve().parent.parent / "crashers"
C_SOURCE = HERE / "heap_overflow.c"
PY_SOURCE = HERE / "heap_overflow.py"
CTYPES_OVERFLOW = HERE / "ctypes_overflow.py"
REQUEST, OVERFLOW = 2000, 24

#: (mode, fill) -> glibc's message: 0x41 keeps PREV_INUSE and makes a huge size, 0x5a clears
#: PREV_INUSE and sets IS_MMAPPED
MESSAGES = {
    ("free-buffer", 0x41): "free(): invalid next size (normal)",
    ("free-buffer", 0x5A): "double free or corruption (!prev)",
    ("free-next", 0x41): "double free or corruption (out)",
    ("free-next", 0x5A): "munmap_chunk(): invalid pointer",
}


@pytest.fixture(scope="session")
def heap_overflow_bin(tmp_path_factory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("heapc") / "heap_overflow"
    subprocess.run([gcc, "-O1", "-g", "-o", str(out), str(C_SOURCE), "-lpthread"], check=True, timeout=120)
    return out


def _crash(argv: list[str], run_dir: Path, **kw) -> tuple[Path, dict]:
    run_dir.mkdir(parents=True, exist_ok=True)
    core = crash_for_core(argv, run_dir, outputs=("oracle.json",), **kw)
    return core, json.loads((run_dir / "oracle.json").read_text())


def _check(core_path: Path, oracle: dict, message: str, *, sysroot: str | None = None, debug_info: bool = True):
    """The reader's anatomy of ``core_path`` against the crasher's own account of its buffer."""
    core = open_core(str(core_path), sysroot=sysroot)
    assert core.abort_message == message
    report = read_heap(core, sysroot=sysroot, message=core.abort_message, tid=core.crashed_tid, summary=True,
                       debug_info=debug_info)
    assert not report.problems, report.problems
    c = report.corruption
    buffer_chunk, next_chunk = oracle["buffer"] - 16, oracle["next"] - 16
    freed = next_chunk if "(out)" in message or "munmap" in message else buffer_chunk
    # the chunk glibc rejected is the one the program freed; the chunk that overflowed is its buffer
    assert c.rejected is not None and c.rejected.address == freed, c
    assert c.overflowed is not None and c.overflowed.address == buffer_chunk, c
    assert c.damaged.address == next_chunk
    assert c.usable_size == oracle["usable"]
    # the write ran OVERFLOW bytes past REQUEST: that is this many past the usable size
    assert c.overflow_past_usable == oracle["request"] + oracle["overflow"] - oracle["usable"]
    assert c.overflow_exact
    assert c.first_bytes == bytes([oracle["fill"]]).hex() * c.overflow_past_usable
    assert c.inconsistencies and c.kind is HeapFailureKind.OVERFLOW
    # the summary walks the arena that holds it, and finds the broken header where the anatomy did
    summary = report.summary
    arena = next(a for a in summary.arenas if a.address == c.overflowed.arena)
    assert any(h.start <= buffer_chunk < h.end for h in arena.heaps)
    if "munmap" not in message and "(!prev)" not in message:
        assert any(h.broken_at == next_chunk for h in arena.heaps), arena.heaps
    return report


@pytest.mark.parametrize("debug_info", [True, False], ids=["libc-debug-info", "layout-table"])
@pytest.mark.parametrize("thread", [False, True], ids=["main-arena", "thread-arena"])
@pytest.mark.parametrize("mode, fill", sorted(MESSAGES), ids=lambda v: v if isinstance(v, str) else f"fill={v:#x}")
def test_c_program_overflow_is_found_to_its_chunk_and_length(mode, fill, thread, debug_info, heap_overflow_bin,
                                                            tmp_path, core_pattern):
    # GIVEN a C program that writes 24 bytes past a 2000-byte malloc buffer and frees it (or its neighbour)
    full_mode = ("thread-" if thread else "") + mode
    core, oracle = _crash([str(heap_overflow_bin), full_mode, str(REQUEST), str(OVERFLOW), hex(fill),
                           str(tmp_path / "run" / "oracle.json")], tmp_path / "run")
    # WHEN its core is read THEN the anatomy matches what glibc told the program
    report = _check(core, oracle, MESSAGES[(mode, fill)], debug_info=debug_info)
    c = report.corruption
    assert (c.overflowed.arena == report.summary.main_arena) is (not thread)
    assert c.verdict.value == "undetermined" and "not a Python process" in c.verdict_reason
    if debug_info:
        assert "DWARF" in report.summary.layout_source and "symbol main_arena" in report.summary.main_arena_source
    else:
        assert report.summary.layout_source.startswith("table") and "search" in report.summary.main_arena_source


def test_gdb_with_libc_debug_symbols_names_the_same_chunk(heap_overflow_bin, tmp_path, core_pattern):
    # GIVEN the free-buffer overflow, and gdb reading the core with glibc's debug symbols
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.skip("gdb is not installed")
    core, oracle = _crash([str(heap_overflow_bin), "free-buffer", str(REQUEST), str(OVERFLOW), "0x41",
                           str(tmp_path / "run" / "oracle.json")], tmp_path / "run")
    out = subprocess.run([gdb, "-nx", "-batch", "-q", str(heap_overflow_bin), str(core),
                          "-ex", "frame function _int_free", "-ex", "printf \"P=%lx\\n\", p"],
                         capture_output=True, text=True, timeout=120).stdout
    m = re.search(r"P=([0-9a-f]+)", out)
    if m is None:
        pytest.skip(f"gdb could not read _int_free's p (no libc6-dbg?): {out[-300:]}")
    # WHEN the reader finds the rejected chunk from the core alone
    core_file = open_core(str(core))
    c = read_heap(core_file, message=core_file.abort_message, tid=core_file.crashed_tid).corruption
    # THEN it is the chunk gdb sees in _int_free's argument
    assert c.rejected.address == int(m.group(1), 16) == oracle["buffer"] - 16


def test_the_anchor_exporter_cores(cores, newest_python):
    # GIVEN the anchor cores: libcrash.so writes 16 bytes past a 0x500-byte buffer and frees it
    for scenario, message, first in (("heap-prev", "double free or corruption (!prev)", "1005000000000000"),
                                     ("heap-next-size", "free(): invalid next size (normal)", "41" * 8)):
        core = open_core(str(cores.get(newest_python, scenario)))
        assert core.abort_message == message
        c = read_heap(core, message=message, tid=core.crashed_tid).corruption
        # THEN the buffer (0x510-byte chunk) is both the rejected and the overflowed chunk, 8 bytes past
        # its usable size 0x508: the next chunk's size word, whose bytes are shown
        assert c.rejected.address == c.overflowed.address and c.overflowed.size == 0x510
        assert c.usable_size == 0x508 and c.overflow_past_usable == 8 and c.first_bytes == first
        assert c.damaged.address == c.overflowed.address + 0x510


def test_the_summary_of_a_core_that_did_not_corrupt_its_heap(cores, newest_python):
    # GIVEN a SIGSEGV core: its heap is whole
    core = open_core(str(cores.get(newest_python, "segv")))
    report = read_heap(core, summary=True)
    s = report.summary
    # THEN every arena's heaps walk to their top chunk without a break, its bins are whole,
    # and each thread's tcache is found
    assert s.arenas and s.arenas[0].kind == "main" and s.arenas[0].address == s.main_arena
    for a in s.arenas:
        assert not a.problems, a.problems
        for h in a.heaps:
            assert h.broken_at is None and h.walked_to == a.top and h.chunks_in_use > 0
    assert all(t.address is not None for t in s.tcaches)
    assert report.corruption is None


# -- other glibc versions: Debian roots (tests/roots.py) -------------------------------------------------------

@pytest.fixture(scope="session")
def glibc_root(request):
    from tests.roots import glibc_root_of

    return glibc_root_of(request)


@pytest.mark.parametrize("debug_info", [True, False], ids=["libc-debug-info", "layout-table"])
@pytest.mark.parametrize("mode, fill", [("thread-free-buffer", 0x41), ("free-next", 0x5A)], ids=["thread-next-size",
                                                                                               "main-munmap"])
@pytest.mark.parametrize("glibc_root", ["bullseye", "trixie", "sid"], indirect=True,
                         ids=["glibc=2.31", "glibc=2.41", "glibc=2.43"])
def test_other_glibc_versions(glibc_root, mode, fill, debug_info, tmp_path, core_pattern):
    # GIVEN the overflow made through ctypes by the root's own Python on the root's own glibc
    suite, root, version, python = glibc_root
    run = tmp_path / "run"
    core, oracle = _crash([python, str(PY_SOURCE), mode, str(REQUEST), str(OVERFLOW), hex(fill),
                           str(run / "oracle.json")], run, root=root, binds=(PY_SOURCE,))
    # WHEN read with the root as sysroot (its libc, and its libc6-dbg unless the table is asked for)
    report = _check(core, oracle, MESSAGES[(mode.removeprefix("thread-"), fill)], sysroot=str(root),
                    debug_info=debug_info)
    # THEN the version is the root's, and the layout came from where it was asked to
    assert report.summary.glibc_version == version
    assert report.summary.layout_source.startswith("DWARF") is debug_info
    assert all(t.address is not None for t in report.summary.tcaches)
    assert not any(t.bins and any(b.broken_at for b in t.bins) for t in report.summary.tcaches)
    assert report.corruption.overflowed.state is ChunkState.IN_USE
    assert os.path.exists(core)


@pytest.mark.parametrize("mode, request_size, message", [
    ("top", REQUEST, "malloc(): corrupted top size"),
    ("unsorted", REQUEST, "malloc(): invalid size (unsorted)"),
], ids=["top", "unsorted"])
def test_overflow_into_the_top_chunk_or_a_free_chunk(mode, request_size, message, heap_overflow_bin, tmp_path,
                                                     core_pattern):
    # GIVEN the overflow runs over the top chunk's size, or over a free chunk in the unsorted bin, and glibc
    # notices at the next malloc (a check on its lists, not on a freed pointer)
    core, oracle = _crash([str(heap_overflow_bin), mode, str(request_size), str(OVERFLOW), "0x41",
                           str(tmp_path / "run" / "oracle.json")], tmp_path / "run")
    core_file = open_core(str(core))
    assert core_file.abort_message == message
    c = read_heap(core_file, message=message, tid=core_file.crashed_tid).corruption
    # THEN the damaged chunk is the one after the buffer (found on the arena's lists), the buffer overflowed
    assert c.damaged.address == oracle["next"] - 16 and c.rejected.address == c.damaged.address
    assert c.rejected_found_by.startswith("top of arena" if mode == "top" else "unsorted bin 1 of arena")
    assert c.overflowed.address == oracle["buffer"] - 16 and c.usable_size == oracle["usable"]
    assert c.overflow_past_usable == oracle["request"] + oracle["overflow"] - oracle["usable"]


def test_a_double_free_is_not_an_overflow(heap_overflow_bin, tmp_path, core_pattern):
    # GIVEN a 64-byte chunk freed twice (the tcache's key catches it)
    core, oracle = _crash([str(heap_overflow_bin), "double-free", "64", "0", "0",
                           str(tmp_path / "run" / "oracle.json")], tmp_path / "run")
    core_file = open_core(str(core))
    assert core_file.abort_message == "free(): double free detected in tcache 2"
    c = read_heap(core_file, message=core_file.abort_message, tid=core_file.crashed_tid).corruption
    # THEN the rejected chunk is the one freed twice, and no buffer is blamed for an overflow
    assert c.rejected.address == oracle["buffer"] - 16
    assert "already in a tcache list" in c.inconsistencies[0]
    assert c.overflowed is None and "second free" in c.verdict_reason
    assert c.kind is HeapFailureKind.DOUBLE_FREE

def test_a_chunk_whose_own_size_word_was_written_over_is_sized_from_the_heap(newest_python, tmp_path, core_pattern):
    # GIVEN a worker's 36-entry ctypes array (1440 bytes: a 0x5b0 chunk) whose own size word a record written at
    # values[-1] made 0x425; glibc notices when ctypes' tp_dealloc frees the array (#40: the report said "a
    # 1440-byte buffer in the chunk ... (size 0x420, 1048 usable bytes)")
    from forensics.analyze import analyze_core
    from forensics.report.heapsection import heap_section
    from tests.conftest import PYTHONS

    run = tmp_path / "run"
    core, oracle = _crash([PYTHONS[newest_python], str(CTYPES_OVERFLOW), str(run / "oracle.json"), "own-header"], run)
    analysis = analyze_core(str(core))
    c = analysis.heap.corruption
    # THEN the header as read (damaged) is the word written, too small for the array, and no overflow is measured
    chunk, true = oracle["chunk"], oracle["usable"] + 8
    assert c.damaged.address == c.overflowed.address == chunk and c.damaged.size == oracle["size_word"] & ~7
    assert c.buffer_size == oracle["size"] == 1440 and c.overflow_length is None
    # and the chunk is sized from the heap after it -- the next valid header -- never from the word written over
    assert c.overflowed.size == true and c.usable_size == oracle["usable"] >= c.buffer_size
    assert f"the next chunk's header is at 0x{chunk + true:x}: the chunk is 0x{true:x} bytes" in c.inconsistencies[-1]
    # as gdb reads the core: the size word is the one written, and a header (its chunk before in use) starts at
    # the chunk's true end
    gdb = shutil.which("gdb")
    if gdb is not None:
        out = subprocess.run([gdb, "-nx", "-batch", "-q", "-c", str(core), "-ex", f"x/2gx {chunk + 8:#x}",
                              "-ex", f"x/2gx {chunk + true:#x}"], capture_output=True, text=True, timeout=120).stdout
        words = [int(w, 16) for line in out.splitlines() if ":" in line for w in line.split(":", 1)[1].split()]
        assert words[0] == oracle["size_word"] and words[3] & 1 and words[3] & ~7 >= 0x20, out
    # and the report's heap section sizes the array's chunk the same
    section = heap_section(analysis.heap)["summary"]
    assert f"in the chunk at 0x{chunk:x} (size 0x{true:x}, {oracle['usable']} usable bytes)" in section, section
    assert "1048 usable" not in section


def test_the_chunk_before_a_damaged_header_past_many_chunks_in_use(newest_python, tmp_path, core_pattern):
    # GIVEN 32 MiB of 4 KiB chunks in use, then a 2000-byte buffer written 24 bytes past, caught when the chunk
    # after it is freed ("(out)"): no link leads back from that chunk to the buffer, and no free chunk lies
    # between them and the heap's start
    from forensics.analyze import analyze_core
    from forensics.core.memory import CoreMemory
    from forensics.heap.arenas import read_arenas
    from forensics.heap.locate import find_glibc
    from forensics.heap.walk import HeapMemory, HeapValidationError, for_each_chunk_header, walk_to
    from tests.conftest import PYTHONS

    run = tmp_path / "run"
    core, oracle = _crash([PYTHONS[newest_python], str(PY_SOURCE), "free-next", str(REQUEST), str(OVERFLOW), "0x41",
                           str(run / "oracle.json"), "32"], run)
    # WHEN analyzed (the pointer free() was given from the frames; the buffer's address, an int local of the
    # Python frame, as where the chunks are followed from) and read again from the stack's words alone
    with_frames = analyze_core(str(core)).heap.corruption
    core_file = open_core(str(core))
    words_only = read_heap(core_file, message=core_file.abort_message, tid=core_file.crashed_tid).corruption
    # THEN both name the buffer's chunk as the one written past, to the byte
    for c in (with_frames, words_only):
        assert c.rejected.address == oracle["next"] - 16 and c.overflowed.address == oracle["buffer"] - 16, c
        assert c.usable_size == oracle["usable"] and c.overflow_past_usable == REQUEST + OVERFLOW - oracle["usable"]
    # and a walk to one header (walk_to) ends where the chunk-by-chunk walk of the heap says, at every 997th chunk
    with CoreMemory.open(str(core)) as mem:
        hm = HeapMemory(mem)
        heap = read_arenas(hm, find_glibc(core_file, mem), core_file)
        region = heap.arenas[0].regions[0]
        chunks = []
        with pytest.raises(HeapValidationError) as broken:  # the walk breaks at the header written over
            for addr, *_rest in for_each_chunk_header(hm, region):
                chunks.append(addr)
        assert broken.value.address == oracle["next"] - 16 and len(chunks) > 8000
        for before, target in list(zip(chunks, chunks[1:], strict=False))[::997]:
            assert walk_to(hm, region, region.first, target)[0] == before
        hm.release()
