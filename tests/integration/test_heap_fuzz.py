"""Mutated heap metadata in a real core: the heap reader ends every walk, never raises, and stays small.

A real core (the exporter's heap corruption) is copied, and words of glibc's bookkeeping in it
are overwritten with values chosen to hurt a walker: chunk sizes and prev_sizes, free-list
links, the arenas' top/next/bins/system_mem, heap_info fields, tcache counts and entries.
Each mutated core is read for the corruption's anatomy and for the full summary.  The bounds:
no exception, each read under a time limit, and Python's peak allocation under a limit.
"""
from __future__ import annotations

import mmap
import random
import shutil
import struct
import time
import tracemalloc

import pytest

from forensics.core import open_core
from forensics.core.memory import CoreMemory
from forensics.heap import read_heap

ITERATIONS = 80
MAX_SECONDS = 20.0  # per mutated core (anatomy + summary); an unmutated one takes well under 1 s
MAX_PEAK_MB = 96.0


def _offset(segments, addr: int) -> int | None:
    for s in segments:
        if s.vaddr <= addr and addr + 8 <= s.vaddr + s.present:
            return s.offset + addr - s.vaddr
    return None


def _metadata_words(core, report) -> list[int]:
    """Addresses of heap bookkeeping words in the core: what the mutations aim at."""
    s = report.summary
    lay_words = []
    with CoreMemory.open(core.path) as mem:
        for a in s.arenas:
            lay_words += [a.address + off for off in range(0, 2200, 8)]  # the whole malloc_state
            for h in a.heaps:
                if a.kind == "thread":
                    lay_words += [h.start + off for off in range(0, 48, 8)]  # heap_info
                addr, n = h.first_chunk, 0
                while addr < a.top and n < 3000:  # chunk headers, and fd/bk of every chunk
                    lay_words += [addr, addr + 8, addr + 16, addr + 24]
                    size = int.from_bytes(mem.read(addr + 8, 8), "little") & ~7
                    if size < 32:
                        break
                    addr += size
                    n += 1
        for t in s.tcaches:
            if t.address:
                lay_words += [t.address + off for off in range(0, 640, 8)]
    return lay_words


def _evil_values(rng: random.Random, addr: int, word: int) -> int:
    choice = rng.randrange(10)
    return [
        0,
        (1 << 64) - 1,
        rng.getrandbits(64),
        addr,  # a self pointer: a one-entry cycle
        addr - 16,
        word ^ (1 << rng.randrange(64)),  # one flipped bit (a size's flags, a pointer's high bits)
        (word & ~0xF) + 16 * rng.randrange(-4, 5),  # a plausible size or pointer, off by a few chunks
        0x10,
        word | 7,
        1 << rng.randrange(32, 63),
    ][choice] & ((1 << 64) - 1)


@pytest.mark.slow
def test_mutated_heap_metadata_never_hangs_or_raises(cores, newest_python, tmp_path):
    # GIVEN a copy of a real heap-corruption core, and the addresses of its heap bookkeeping
    src = cores.get(newest_python, "heap-next-size")
    path = tmp_path / "core"
    shutil.copyfile(src, path)
    core = open_core(str(path))
    baseline = read_heap(core, message=core.abort_message, tid=core.crashed_tid, summary=True)
    assert baseline.corruption.overflowed is not None and not baseline.problems
    words = _metadata_words(core, baseline)
    with CoreMemory.open(str(path)) as mem:
        segments = mem.segments
    targets = [(a, o) for a in words if (o := _offset(segments, a)) is not None]
    assert len(targets) > 1000
    # half the mutations aim at what the anatomy reads: the chunks around the overflow, the arena's head
    c = baseline.corruption
    near = {c.overflowed.address + d for d in range(-64, 0x600, 8)} | \
        {baseline.summary.main_arena + d for d in range(0, 160, 8)}
    hot = [(a, o) for a, o in targets if a in near]
    rng = random.Random(21)
    worst_s = 0.0
    worst_peak = 0
    outcomes = {"same anatomy": 0, "other anatomy": 0, "no anatomy": 0, "no heap": 0}
    expected = (c.overflowed.address, c.overflow_past_usable)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        for i in range(ITERATIONS):
            pool = hot if i % 2 else targets
            picks = rng.sample(pool, min(len(pool), rng.randint(1, 8)))
            saved = [(o, mm[o:o + 8]) for _a, o in picks]
            for a, o in picks:
                old = struct.unpack_from("<Q", mm, o)[0]
                struct.pack_into("<Q", mm, o, _evil_values(rng, a, old))
            mm.flush()
            try:
                # WHEN the mutated core is read for the anatomy and the whole summary
                traced = i % 4 == 0  # tracemalloc slows the reader down several times
                if traced:
                    tracemalloc.start()
                t0 = time.perf_counter()
                report = read_heap(core, message=core.abort_message, tid=core.crashed_tid, summary=True)
                elapsed = time.perf_counter() - t0
                peak = 0
                if traced:
                    _cur, peak = tracemalloc.get_traced_memory()
                    tracemalloc.stop()
                # THEN it ends in bounded time and memory, with a report (perhaps saying what broke)
                assert elapsed < MAX_SECONDS, (i, [hex(a) for a, _ in picks])
                worst_s, worst_peak = max(worst_s, elapsed), max(worst_peak, peak)
                assert peak < MAX_PEAK_MB * 1e6, (i, peak)
                found = report.corruption
                if report.summary is None:
                    outcomes["no heap"] += 1
                    assert report.problems
                elif found is None or found.overflowed is None:
                    outcomes["no anatomy"] += 1
                elif (found.overflowed.address, found.overflow_past_usable) == expected:
                    outcomes["same anatomy"] += 1
                else:
                    outcomes["other anatomy"] += 1
            finally:
                if tracemalloc.is_tracing():
                    tracemalloc.stop()
                for o, old in saved:
                    mm[o:o + 8] = old
    print(f"\n{ITERATIONS} mutated cores: worst {worst_s:.2f} s, peak {worst_peak / 1e6:.1f} MB, {outcomes}")
    # the mutations reached the reader: some reads still found the overflow, others did not
    assert outcomes["same anatomy"] > 0 and outcomes["same anatomy"] < ITERATIONS
