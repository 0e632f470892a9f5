"""``analyze --heap``: every arena, its heaps (chunks walked), its bins, and each thread's tcache.

Each heap is walked chunk by chunk from its first chunk to its top chunk; a
header that fails its check stops the walk there (``broken_at``), and the walk
resumes at the next place where two consecutive headers are valid again, so one
corrupted chunk does not hide the rest of the heap.  Bins and tcaches are
walked with the checks of :mod:`.walk`.  Everything is bounded: chunks per heap
(:data:`~forensics.heap.walk.MAX_CHUNKS`), entries per list, arenas, heaps.
"""
from __future__ import annotations

from forensics.heap.arenas import ArenaInfo, Heap
from forensics.heap.layout import MALLOC_ALIGNMENT, SIZE_SZ
from forensics.heap.locate import find_thread_tls
from forensics.heap.walk import (
    MAX_CHUNKS,
    HeapValidationError,
    Region,
    for_each_chunk_resyncing,
    read_tcache,
    validate_bin,
    validate_fastbin,
)
from forensics.model import Arch, CoreFile, HeapArena, HeapBin, HeapRegion, HeapSummary, ThreadCache

__all__ = ["summarize_heap", "walk_region", "find_tcaches"]

def walk_region(heap: Heap, region: Region, *, limit: int = MAX_CHUNKS) -> HeapRegion:
    """Count a heap's chunks in use and free; a broken header is recorded and stepped over."""
    in_use = free = b_in_use = b_free = 0
    broken_at = None
    problem = None
    walked_to = region.first
    chunks = 0
    for item in for_each_chunk_resyncing(heap.hm, region, limit=limit, records=False):
        if isinstance(item, HeapValidationError):
            if broken_at is None:
                broken_at, problem = item.address, item.reason
            else:
                problem = f"{problem}; broken again at 0x{item.address:x}"
            continue
        addr, size, _flags, _prev, state = item
        chunks += 1
        if broken_at is not None and problem is not None and walked_to < broken_at <= addr and "resumed" not in problem:
            problem = f"{problem}; the walk resumed at 0x{addr:x}"
        walked_to = addr
        if state == 1:  # free
            free += 1
            b_free += size
        elif state == 0:  # in use
            in_use += 1
            b_in_use += size
    if chunks >= limit:
        problem = (problem + "; " if problem else "") + f"stopped after {limit:,} chunks"
    return HeapRegion(start=region.start, end=region.end, first_chunk=region.first, chunks_in_use=in_use,
                      bytes_in_use=b_in_use, chunks_free=free, bytes_free=b_free, walked_to=walked_to,
                      broken_at=broken_at, problem=problem)


def _arena_bins(heap: Heap, arena: ArenaInfo) -> tuple[HeapBin, ...]:
    layout = heap.layout
    out: list[HeapBin] = []
    if layout.arena_fastbins is not None:
        for i in range(layout.nfastbins):
            b = validate_fastbin(heap.hm, layout, arena.address, i, arena.regions)
            if b.count or b.broken_at is not None:
                out.append(b)
    for i in range(1, layout.nbins):
        b = validate_bin(heap.hm, layout, arena.address, i, arena.regions)
        if b.count or b.broken_at is not None:
            out.append(b)
    return tuple(out)


def _is_tcache(heap: Heap, addr: int) -> bool:
    if addr & (MALLOC_ALIGNMENT - 1) or heap.region_of(addr) is None:
        return False
    try:
        size = heap.hm.u64(addr - SIZE_SZ) & ~7
    except HeapValidationError:
        return False
    return size == heap.layout.tcache_chunk_size


def find_tcaches(heap: Heap, core: CoreFile) -> dict[int, tuple[int | None, int | None, str]]:
    """``{tid: (tcache, arena, how found)}`` for every thread of the core."""
    arenas = {a.address for a in heap.arenas}
    above = core.arch is Arch.AARCH64  # TLS variant I: the static TLS blocks lie above the thread pointer
    by_fs = find_thread_tls(heap.hm, heap.glibc, [t.fs_base for t in core.threads],
                            lambda a: _is_tcache(heap, a), lambda a: a in arenas, above=above)
    out = {}
    for t in core.threads:
        if t.fs_base in by_fs:
            out[t.tid] = by_fs[t.fs_base]
        elif above and not t.fs_base:
            out[t.tid] = _first_tcache(heap, core, t.tid) or (
                None, None, "the thread pointer (TPIDR_EL0, NT_ARM_TLS) is not in the core: qemu-user writes no "
                            "NT_ARM_TLS")
        else:
            out[t.tid] = (None, None, "fs_base is 0 or its TLS area is not in the core")
    return out


#: chunks at the start of the main heap searched for the main thread's tcache (glibc 2.43 allocates one 0x40
#: chunk before it)
FIRST_CHUNKS = 8


def _first_tcache(heap: Heap, core: CoreFile, tid: int) -> tuple[int, int, str] | None:
    """The main thread's tcache without its thread pointer: the first chunk of the tcache's size at the start of
    the main heap -- the process's first malloc() made it, in the main thread (tcache_init); glibc 2.43 has one
    chunk before it.  None for another thread, or when none of the first :data:`FIRST_CHUNKS` chunks is one."""
    main = next((a for a in heap.arenas if a.kind == "main"), None)
    if tid != core.pid or main is None or not main.regions:
        return None
    chunk = main.regions[0].first
    for _ in range(FIRST_CHUNKS):
        try:
            size = heap.hm.u64(chunk + SIZE_SZ) & ~7
        except HeapValidationError:
            return None
        if size == heap.layout.tcache_chunk_size and _is_tcache(heap, chunk + 2 * SIZE_SZ):
            return (chunk + 2 * SIZE_SZ, main.address, "the main heap's first chunk of a tcache's size, the main "
                                                      "thread's (its first malloc() made it); the core has no "
                                                      "thread pointer")
        if size < 2 * SIZE_SZ:
            return None
        chunk += size
    return None


def _tcache_max_count(heap: Heap) -> int | None:
    if heap.glibc.mp is None:
        return None
    try:
        return heap.hm.u64(heap.glibc.mp + heap.layout.par_tcache_count)
    except HeapValidationError:
        return None


def summarize_heap(heap: Heap, core: CoreFile, *, tcaches: dict | None = None) -> HeapSummary:
    """The ``analyze --heap`` summary of a heap located by :func:`forensics.heap.arenas.read_arenas`."""
    layout = heap.layout
    problems = list(heap.problems)
    arenas = []
    for a in heap.arenas:
        regions = tuple(walk_region(heap, r) for r in a.regions)
        arena_problems = list(a.problems)
        for r in regions:
            if r.broken_at is not None:
                arena_problems.append(f"heap 0x{r.start:x}: chunk walk broke at 0x{r.broken_at:x}: {r.problem}")
        bins = _arena_bins(heap, a)
        for b in bins:
            if b.broken_at is not None:
                arena_problems.append(f"{b.kind} bin {b.index} broken at 0x{b.broken_at:x}: {b.problem}")
        arenas.append(HeapArena(address=a.address, kind=a.kind, top=a.top, top_size=a.top_size,
                                system_mem=a.system_mem, attached_threads=a.attached_threads, heaps=regions,
                                bins=bins, problems=tuple(arena_problems)))
    tcaches = tcaches if tcaches is not None else find_tcaches(heap, core)
    max_count = _tcache_max_count(heap)
    caches = []
    for tid, (tc, arena, how) in sorted(tcaches.items()):
        tc_bins: tuple[HeapBin, ...] = ()
        if tc is not None:
            try:
                tc_bins = read_tcache(heap.hm, layout, tc, heap.regions(), max_count)
            except HeapValidationError as e:
                how += f"; its struct is not readable at 0x{e.address:x}"
        caches.append(ThreadCache(tid=tid, address=tc, found_by=how, arena=arena, bins=tc_bins))
    n_mmaps = mmapped = None
    if heap.glibc.mp is not None:
        try:
            n_mmaps = heap.hm.u64(heap.glibc.mp + layout.par_n_mmaps) & 0xFFFFFFFF
            mmapped = heap.hm.u64(heap.glibc.mp + layout.par_mmapped_mem)
        except HeapValidationError:
            pass
    g = heap.glibc
    return HeapSummary(
        glibc_version=g.version_text or layout.version_text + " (assumed)",
        version_source=g.version_source, layout_source=layout.source, main_arena=g.main_arena,
        main_arena_source=g.main_arena_source, sbrk_base=heap.sbrk_base, mmapped_chunks=n_mmaps,
        mmapped_bytes=mmapped, arenas=tuple(arenas), tcaches=tuple(caches), problems=tuple(problems))
