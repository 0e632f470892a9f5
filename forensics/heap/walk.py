"""Validating walkers of glibc's heap in a core: chunks, arenas, heaps, bins, tcaches.

Nothing here trusts what it reads.  Every walker is bounded (a step cap, a
visited set, the region it walks) and checks each link before following it; a
link that fails a check raises :class:`HeapValidationError` naming the address
that broke the chain and why.  The callers (:mod:`.summary`, :mod:`.anatomy`)
turn that error into data: a chain that "ends at 0x... : reason".

The checks are glibc's own (``malloc.c``): chunk sizes are multiples of 16 and at
least ``MINSIZE``; a chunk lies inside its heap; a free list's entries are
aligned, inside a heap, of the list's size class, and (doubly linked bins)
``fd->bk == p && bk->fd == p``; single lists (tcache, fastbins) store their next
pointers safe-linked from 2.32 (``(pos >> 12) ^ ptr``).
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.heap.layout import (
    FLAG_BITS,
    HEAP_MAX_SIZE,
    MALLOC_ALIGNMENT,
    MINSIZE,
    PREV_INUSE,
    SIZE_SZ,
    MallocLayout,
)
from forensics.model import ChunkState, HeapBin, HeapChunk
from forensics.records import record

__all__ = [
    "HeapValidationError",
    "HeapMemory",
    "Region",
    "MAX_CHUNKS",
    "WALK_SPAN",
    "MAX_LIST",
    "MAX_ARENAS",
    "MAX_HEAPS",
    "reveal",
    "validate_chunk",
    "for_each_chunk",
    "for_each_chunk_header",
    "walk_to",
    "for_each_chunk_resyncing",
    "resync",
    "RESYNC_WINDOW",
    "for_each_arena",
    "for_each_heap_of_arena",
    "for_each_bin_chunk",
    "validate_bin",
    "validate_fastbin",
    "validate_tcache_bin",
    "read_tcache",
    "tcache_entries",
    "fastbin_chunk_size",
    "smallbin_chunk_size",
]

#: bytes of the core read at once when a chunk walk leaves the bytes in hand (one pread a MiB, not one each 16 KiB)
WALK_SPAN = 1 << 20
MAX_CHUNKS = 4_000_000  # chunks walked in one heap before the walk stops (a 2 GB heap of 512-byte chunks)
MAX_LIST = 100_000  # entries followed in one free list
MAX_ARENAS = 1024
MAX_HEAPS = 4096  # heaps of one thread arena (64 MiB each: 256 GiB)
_Q = struct.Struct("<Q")
_QQ = struct.Struct("<QQ")


class HeapValidationError(ValueError):
    """A heap structure that fails a check; ``address`` is where the chain broke."""

    def __init__(self, address: int, reason: str) -> None:
        super().__init__(f"0x{address:x}: {reason}")
        self.address = address
        self.reason = reason


class HeapMemory:
    """Reads of the core's memory for the heap walkers: through a zero-copy view of the segment last
    read (chunk walks read one segment in small sequential steps), else through the core reader."""

    def __init__(self, mem: CoreMemory) -> None:
        self.mem = mem
        self._base = 0
        self._end = 0
        self._view: memoryview | bytes = b""

    def _window(self, addr: int, size: int, span: int | None = None) -> bool:
        if self._base <= addr and addr + size <= self._end:
            return True
        view = (self.mem.view(addr, span) if span else self.mem.view(addr)) if hasattr(self.mem, "view") else None
        if view is None:
            return False
        self._base, self._view = view
        self._end = self._base + len(self._view)
        return addr + size <= self._end

    def read(self, addr: int, size: int) -> bytes:
        """``size`` bytes at ``addr``; :class:`HeapValidationError` when not in the core."""
        if self._window(addr, size):
            off = addr - self._base
            return bytes(self._view[off:off + size])
        try:
            return self.mem.read(addr, size)
        except MemoryNotInCore:
            raise HeapValidationError(addr, "not in the core") from None

    def u64(self, addr: int) -> int:
        if self._window(addr, 8):
            return _Q.unpack_from(self._view, addr - self._base)[0]
        return _Q.unpack(self.read(addr, 8))[0]

    def pair(self, addr: int) -> tuple[int, int]:
        if self._window(addr, 16):
            return _QQ.unpack_from(self._view, addr - self._base)
        return _QQ.unpack(self.read(addr, 16))

    def pair_ahead(self, addr: int) -> tuple[int, int]:
        """:meth:`pair` for a walk going forward: a miss reads :data:`WALK_SPAN` bytes ahead at once."""
        if self._window(addr, 16, WALK_SPAN):
            return _QQ.unpack_from(self._view, addr - self._base)
        return _QQ.unpack(self.read(addr, 16))

    def readable(self, addr: int, size: int = 8) -> bool:
        try:
            self.read(addr, size)
        except HeapValidationError:
            return False
        return True

    def release(self) -> None:
        """Drop the view of the core's mapping (before the core is closed)."""
        if isinstance(self._view, memoryview):
            self._view.release()
        self._view, self._base, self._end = b"", 0, 0


@record
class Region:
    """A heap's chunk area: chunks from ``first`` up to ``end`` (the top chunk ends it)."""

    start: int  # the heap's start (heap_info for a thread heap; sbrk_base for the main heap)
    first: int  # its first chunk
    end: int  # one past its last byte
    arena: int
    top: int | None  # the arena's top chunk when it is in this region

    def contains(self, addr: int) -> bool:
        return self.first <= addr < self.end


def reveal(layout: MallocLayout, pos: int, stored: int) -> int:
    """A single-list next pointer as stored at ``pos`` -> the pointer (safe-linking, 2.32+).

    >>> from forensics.heap.layout import layout_for_version
    >>> hex(reveal(layout_for_version((2, 36)), 0x55550000a2b0, 0x55505550a2a0))
    '0x55550000a2aa'
    >>> hex(reveal(layout_for_version((2, 31)), 0x55550000a2b0, 0x55550000a2aa))
    '0x55550000a2aa'
    """
    return ((pos >> 12) ^ stored) if layout.safe_linking else stored


def validate_chunk(hm: HeapMemory, addr: int, region: Region | None = None) -> HeapChunk:
    """The chunk header at ``addr``, checked: aligned, readable, size >= MINSIZE and a multiple of 16,
    and (with ``region``) inside it.

    :raises HeapValidationError: when a check fails (the error names ``addr``)
    """
    if addr & (MALLOC_ALIGNMENT - 1):
        raise HeapValidationError(addr, "chunk address not 16-byte aligned")
    prev_size, size_field = hm.pair(addr)
    size = size_field & ~FLAG_BITS
    flags = size_field & FLAG_BITS
    if size < MINSIZE:
        raise HeapValidationError(addr, f"size field 0x{size_field:x}: below the minimum chunk size (0x20)")
    if size & (MALLOC_ALIGNMENT - 1):
        raise HeapValidationError(addr, f"size field 0x{size_field:x}: not a multiple of 16")
    if region is not None and addr + size > region.end:
        raise HeapValidationError(addr, f"size 0x{size:x} runs past the heap's end 0x{region.end:x}")
    return HeapChunk(address=addr, size=size, flags=flags, prev_size=prev_size,
                     arena=region.arena if region else None)


_IN_USE, _FREE, _TOP, _LAST = 0, 1, 2, 3
_STATES = (ChunkState.IN_USE, ChunkState.FREE, ChunkState.TOP, ChunkState.UNKNOWN)


def for_each_chunk_header(hm: HeapMemory, region: Region, *,
                          limit: int = MAX_CHUNKS) -> Iterator[tuple[int, int, int, int, int]]:
    """:func:`for_each_chunk` as plain tuples ``(address, size, flags, prev_size, state)`` (a state index
    into ``(IN_USE, FREE, TOP, UNKNOWN)``): the walk without a record per chunk, for counting walks.

    :raises HeapValidationError: as :func:`for_each_chunk`
    """
    addr = region.first
    end, top = region.end, region.top
    if addr + MINSIZE > end:
        return
    prev_size, field = hm.pair(addr)
    count = 0
    while True:
        size, flags = field & ~FLAG_BITS, field & FLAG_BITS
        if addr & (MALLOC_ALIGNMENT - 1):
            raise HeapValidationError(addr, "chunk address not 16-byte aligned")
        if size < MINSIZE:
            raise HeapValidationError(addr, f"size field 0x{field:x}: below the minimum chunk size (0x20)")
        if size & (MALLOC_ALIGNMENT - 1):
            raise HeapValidationError(addr, f"size field 0x{field:x}: not a multiple of 16")
        if addr + size > end:
            raise HeapValidationError(addr, f"size 0x{size:x} runs past the heap's end 0x{end:x}")
        count += 1
        if count > limit:
            raise HeapValidationError(addr, f"stopped after {limit:,} chunks")
        if addr == top:
            yield addr, size, flags, prev_size, _TOP
            return
        nxt = addr + size
        if nxt + 2 * SIZE_SZ > end:
            # an old heap ends with fenceposts (size 0x10): the last chunk has no next header to read
            yield addr, size, flags, prev_size, _LAST
            return
        if hm._base <= nxt and nxt + 16 <= hm._end:  # hm.pair's own fast path, inline: one call less a chunk
            next_prev, next_field = _QQ.unpack_from(hm._view, nxt - hm._base)
        else:
            next_prev, next_field = hm.pair_ahead(nxt)
        yield addr, size, flags, prev_size, _IN_USE if next_field & PREV_INUSE else _FREE
        if (next_field & ~FLAG_BITS) == 2 * SIZE_SZ and top is None:
            return  # a fencepost ends an old heap of a thread arena
        addr, prev_size, field = nxt, next_prev, next_field


def walk_to(hm: HeapMemory, region: Region, start: int, target: int, *,
            limit: int = MAX_CHUNKS) -> tuple[int, int, int]:
    """The chunk whose end reaches ``target`` on the walk of ``region`` from the chunk at ``start`` (a chunk
    boundary): ``(address, size field, prev_size)`` -- its end is ``target`` when ``target`` is a chunk boundary
    on that walk, past it when a chunk spans it; the walk's last chunk when it ends first (the top, the
    region's end).  :func:`for_each_chunk_header`'s checks, with no chunk yielded: what a walk to one address
    costs is its loop.

    :raises HeapValidationError: at the first header below ``target`` that fails a check, or after ``limit``
    """
    addr, end, top = start, region.end, region.top
    prev_size, field = hm.pair_ahead(addr)
    unpack = _QQ.unpack_from
    for _ in range(limit):
        size = field & ~FLAG_BITS
        if addr & (MALLOC_ALIGNMENT - 1) or size < MINSIZE or size & (MALLOC_ALIGNMENT - 1) or addr + size > end:
            validate_chunk(hm, addr, region)  # raises, saying which check failed
        nxt = addr + size
        if nxt >= target or addr == top or nxt + 2 * SIZE_SZ > end:
            return addr, field, prev_size
        if hm._base <= nxt and nxt + 16 <= hm._end:
            prev_size, field = unpack(hm._view, nxt - hm._base)
        else:
            prev_size, field = hm.pair_ahead(nxt)
        if (field & ~FLAG_BITS) == 2 * SIZE_SZ and top is None:
            return nxt, field, prev_size  # a fencepost ends an old heap of a thread arena
        addr = nxt
    raise HeapValidationError(addr, f"stopped after {limit:,} chunks")


def for_each_chunk(hm: HeapMemory, region: Region, *, limit: int = MAX_CHUNKS) -> Iterator[HeapChunk]:
    """The chunks of a heap region, in address order, up to and including the top chunk.

    Each chunk's state comes from its next chunk's PREV_INUSE bit (tcache and
    fastbin entries read as in use: glibc keeps them so).  The walk ends at the
    arena's top chunk, at the region's end, or at an old heap's fencepost.

    :raises HeapValidationError: at the first chunk whose header fails :func:`validate_chunk`'s checks,
        or after ``limit`` chunks
    """
    arena = region.arena
    for addr, size, flags, prev_size, state in for_each_chunk_header(hm, region, limit=limit):
        yield HeapChunk(address=addr, size=size, flags=flags, prev_size=prev_size, state=_STATES[state], arena=arena)


#: bytes searched past a broken header for the next two valid consecutive headers
RESYNC_WINDOW = 1 << 20


def resync(hm: HeapMemory, region: Region, after: int, *, window: int = RESYNC_WINDOW) -> int | None:
    """The first 16-aligned address past ``after`` where a chunk and the one after it both validate
    (or the top chunk starts), within ``window`` bytes; None when there is none."""
    addr = (after + MALLOC_ALIGNMENT) & ~(MALLOC_ALIGNMENT - 1)
    end = min(region.end - MINSIZE, after + window)
    while addr < end:
        if region.top is not None and addr == region.top:
            return addr
        try:
            c = validate_chunk(hm, addr, region)
            n = validate_chunk(hm, addr + c.size, region)
            if n.address != region.top:
                validate_chunk(hm, n.address + n.size, region)  # raises when the third is no chunk
            return addr
        except HeapValidationError:
            pass
        addr += MALLOC_ALIGNMENT
    return None


def for_each_chunk_resyncing(hm: HeapMemory, region: Region, *, limit: int = MAX_CHUNKS,
                             records: bool = True) -> Iterator:
    """:func:`for_each_chunk`, stepping over broken headers: yields each chunk, and each break as the
    :class:`HeapValidationError` that stopped the walk there, then resumes at :func:`resync`'s address.
    At most ``limit`` chunks in all.  ``records=False`` yields :func:`for_each_chunk_header`'s tuples."""
    start = region.first
    budget = limit
    walk = for_each_chunk if records else for_each_chunk_header
    while budget > 0:
        sub = Region(start=region.start, first=start, end=region.end, arena=region.arena, top=region.top)
        try:
            for c in walk(hm, sub, limit=budget):
                budget -= 1
                yield c
            return
        except HeapValidationError as e:
            yield e
            if budget <= 0:
                return
            nxt = resync(hm, region, e.address)
            if nxt is None:
                return
            start = nxt


def for_each_arena(hm: HeapMemory, layout: MallocLayout, main_arena: int) -> Iterator[int]:
    """The arenas linked from ``main_arena.next``, main first, each once.

    :raises HeapValidationError: at a link that is not readable, misaligned or loops
        (after the arenas before it were yielded)
    """
    yield main_arena
    seen = {main_arena}
    cur = main_arena
    for _ in range(MAX_ARENAS):
        nxt = hm.u64(cur + layout.arena_next)
        if nxt == main_arena or nxt == 0:
            return
        if nxt & 7 or nxt in seen:
            what = "a cycle" if nxt in seen else "misaligned"
            raise HeapValidationError(cur + layout.arena_next, f"arena 0x{cur:x}: next 0x{nxt:x} is {what}")
        if not hm.readable(nxt, layout.arena_size):
            raise HeapValidationError(cur + layout.arena_next, f"arena 0x{cur:x}: next 0x{nxt:x} is not in the core")
        yield nxt
        seen.add(nxt)
        cur = nxt
    raise HeapValidationError(cur, f"more than {MAX_ARENAS} arenas")


def for_each_heap_of_arena(hm: HeapMemory, layout: MallocLayout, arena: int) -> Iterator[Region]:
    """A thread arena's heaps (``heap_info`` chain from its top chunk's heap), newest first.

    :raises HeapValidationError: when a ``heap_info`` does not belong to the arena, is not in
        the core, or the chain is longer than :data:`MAX_HEAPS` (after the heaps before it were yielded)
    """
    top = hm.u64(arena + layout.arena_top)
    heap = top & ~(HEAP_MAX_SIZE - 1)
    count = 0
    seen: set[int] = set()
    while heap:
        if heap in seen or count >= MAX_HEAPS:
            raise HeapValidationError(heap, "heap_info chain loops or is too long")
        seen.add(heap)
        ar_ptr, prev = hm.pair(heap)
        size = hm.u64(heap + 2 * SIZE_SZ)
        if ar_ptr != arena:
            raise HeapValidationError(heap, f"heap_info.ar_ptr 0x{ar_ptr:x} is not its arena 0x{arena:x}")
        if not layout.heap_info_size <= size <= HEAP_MAX_SIZE:
            raise HeapValidationError(heap, f"heap_info.size 0x{size:x} is not a heap size")
        own = heap + layout.heap_info_size == arena
        first = layout.first_chunk_of_arena_heap(heap) if own else layout.first_chunk_of_heap(heap)
        yield Region(start=heap, first=first, end=heap + size, arena=arena,
                     top=top if heap <= top < heap + size else None)
        count += 1
        if prev & (HEAP_MAX_SIZE - 1):
            raise HeapValidationError(heap + SIZE_SZ, f"heap_info.prev 0x{prev:x} is not heap-aligned")
        heap = prev


def fastbin_chunk_size(index: int) -> int:
    """The chunk size of fastbin ``index`` (0x20, 0x30, ...)."""
    return (index + 2) * MALLOC_ALIGNMENT


def smallbin_chunk_size(index: int) -> int:
    """The chunk size of small bin ``index`` (2..63: 0x20 ... 0x3f0)."""
    return index * MALLOC_ALIGNMENT


def _check_in_heap(regions: list[Region], addr: int) -> Region:
    for r in regions:
        if r.contains(addr):
            return r
    raise HeapValidationError(addr, "outside every heap of the arena")


def for_each_bin_chunk(hm: HeapMemory, layout: MallocLayout, arena: int, index: int, regions: list[Region],
                       *, limit: int = MAX_LIST) -> Iterator[HeapChunk]:
    """The chunks of bin ``index`` (1: unsorted, 2-63: small, 64-126: large) of ``arena``, through its fd links.

    Every entry is checked: inside a heap of the arena, aligned, its size of the
    bin's class (small bins), a free chunk's footer, ``fd->bk == p``.

    :raises HeapValidationError: at the first entry that fails a check (after the entries before it)
    """
    head = layout.bin_address(arena, index)
    size_class = smallbin_chunk_size(index) if 2 <= index < 64 else None
    count = 0
    prev = head
    fd, _bk = hm.pair(head + 2 * SIZE_SZ)
    cur = fd
    while cur != head:
        if count >= limit:
            raise HeapValidationError(cur, f"more than {limit:,} entries")
        if cur & (MALLOC_ALIGNMENT - 1):
            raise HeapValidationError(cur, f"entry after 0x{prev:x} is misaligned")
        region = _check_in_heap(regions, cur)
        chunk = validate_chunk(hm, cur, region)
        if size_class is not None and chunk.size != size_class:
            raise HeapValidationError(cur, f"size 0x{chunk.size:x} in the 0x{size_class:x} bin")
        # a free chunk's footer: the next chunk's prev_size is its size, and PREV_INUSE is clear
        if chunk.address + chunk.size + 2 * SIZE_SZ <= region.end:
            n_prev, n_size = hm.pair(chunk.address + chunk.size)
            if n_size & PREV_INUSE:
                raise HeapValidationError(cur, "the next chunk's PREV_INUSE is set: this chunk is in use")
            if n_prev != chunk.size:
                raise HeapValidationError(cur, f"the next chunk's prev_size 0x{n_prev:x} is not its size "
                                               f"0x{chunk.size:x}")
        nfd, nbk = hm.pair(cur + 2 * SIZE_SZ)
        if nbk != prev:
            raise HeapValidationError(cur, f"bk 0x{nbk:x} does not point back to 0x{prev:x}")
        count += 1
        yield chunk
        prev, cur = cur, nfd


def validate_bin(hm: HeapMemory, layout: MallocLayout, arena: int, index: int, regions: list[Region],
                 *, limit: int = MAX_LIST) -> HeapBin:
    """Walk bin ``index`` (1: unsorted, 2-63: small, 64-126: large) of ``arena`` through its fd links
    (:func:`for_each_bin_chunk`'s checks).  A failed check ends the walk with ``broken_at`` and ``problem``;
    the entries before it are counted.
    """
    kind = "unsorted" if index == 1 else "small" if index < 64 else "large"
    size_class = smallbin_chunk_size(index) if kind == "small" else None
    count = 0
    try:
        for _chunk in for_each_bin_chunk(hm, layout, arena, index, regions, limit=limit):
            count += 1
    except HeapValidationError as e:
        return HeapBin(kind=kind, index=index, chunk_size=size_class, count=count, broken_at=e.address,
                       problem=e.reason)
    return HeapBin(kind=kind, index=index, chunk_size=size_class, count=count)


def _single_list(hm: HeapMemory, layout: MallocLayout, first: int, *, in_mem: bool, size_class: int | None,
                 regions: list[Region], limit: int) -> int:
    """Length of a safe-linked single list starting at ``first`` (a chunk, or a user pointer when ``in_mem``)."""
    count = 0
    cur = first
    seen: set[int] = set()
    while cur:
        if count >= limit:
            raise HeapValidationError(cur, f"more than {limit:,} entries")
        if cur in seen:
            raise HeapValidationError(cur, "the list loops")
        seen.add(cur)
        if cur & (MALLOC_ALIGNMENT - 1):
            raise HeapValidationError(cur, "misaligned entry (a corrupted or unrevealed next pointer)")
        chunk_addr = cur - 2 * SIZE_SZ if in_mem else cur
        if regions:
            _check_in_heap(regions, chunk_addr)
        chunk = validate_chunk(hm, chunk_addr)
        if size_class is not None and chunk.size != size_class:
            raise HeapValidationError(cur, f"chunk size 0x{chunk.size:x} in the 0x{size_class:x} list")
        link = cur if in_mem else cur + 2 * SIZE_SZ
        cur = reveal(layout, link, hm.u64(link))
        count += 1
    return count


def validate_fastbin(hm: HeapMemory, layout: MallocLayout, arena: int, index: int, regions: list[Region],
                     *, limit: int = MAX_LIST) -> HeapBin:
    """Walk fastbin ``index`` of ``arena`` (chunks of one size; next pointers safe-linked from 2.32)."""
    size_class = fastbin_chunk_size(index)
    try:
        first = hm.u64(arena + (layout.arena_fastbins or 0) + index * SIZE_SZ)
        count = _single_list(hm, layout, first, in_mem=False, size_class=size_class, regions=regions, limit=limit)
    except HeapValidationError as e:
        return HeapBin(kind="fastbin", index=index, chunk_size=size_class, count=0, broken_at=e.address,
                       problem=e.reason)
    return HeapBin(kind="fastbin", index=index, chunk_size=size_class, count=count)


def validate_tcache_bin(hm: HeapMemory, layout: MallocLayout, tcache: int, index: int, regions: list[Region],
                        *, limit: int = MAX_LIST) -> HeapBin:
    """Walk tcache bin ``index`` of the ``tcache_perthread_struct`` at ``tcache``.

    Small bins (0-63) hold one chunk size each; 2.42's large bins (64-75) hold a range.
    """
    size_class = MINSIZE + index * MALLOC_ALIGNMENT if index < 64 else None
    try:
        first = hm.u64(tcache + layout.tcache_entries + index * SIZE_SZ)
        count = _single_list(hm, layout, first, in_mem=True, size_class=size_class, regions=regions, limit=limit)
    except HeapValidationError as e:
        return HeapBin(kind="tcache", index=index, chunk_size=size_class, count=0, broken_at=e.address,
                       problem=e.reason)
    return HeapBin(kind="tcache", index=index, chunk_size=size_class, count=count)


def tcache_entries(hm: HeapMemory, layout: MallocLayout, tcache: int, *, limit: int = MAX_LIST) -> set[int]:
    """The user pointers held by every bin of a tcache, each list followed until it ends or breaks."""
    out: set[int] = set()
    for i in range(layout.tcache_bins):
        try:
            cur = hm.u64(tcache + layout.tcache_entries + i * SIZE_SZ)
            for _ in range(limit):
                if not cur or cur in out or cur & (MALLOC_ALIGNMENT - 1):
                    break
                out.add(cur)
                cur = reveal(layout, cur, hm.u64(cur))
        except HeapValidationError:
            continue
    return out


def read_tcache(hm: HeapMemory, layout: MallocLayout, tcache: int, regions: list[Region],
                max_count: int | None = None) -> tuple[HeapBin, ...]:
    """The non-empty or broken bins of a tcache, each walked, with the stored count checked against the walk.

    :param max_count: ``mp_.tcache_count`` when known (2.42+ stores free slots: count = max - slots)
    :raises HeapValidationError: when the struct itself is not in the core
    """
    raw = hm.read(tcache + layout.tcache_counts, layout.tcache_bins * layout.tcache_count_size)
    fmt = f"<{layout.tcache_bins}{'H' if layout.tcache_count_size == 2 else 'B'}"
    counts = struct.unpack(fmt, raw)
    entries = struct.unpack(f"<{layout.tcache_bins}Q", hm.read(tcache + layout.tcache_entries,
                                                              layout.tcache_bins * SIZE_SZ))
    out = []
    for i in range(layout.tcache_bins):
        if not entries[i] and (layout.tcache_counts_free_slots or not counts[i]):
            continue
        b = validate_tcache_bin(hm, layout, tcache, i, regions)
        stored = counts[i]
        if layout.tcache_counts_free_slots:
            stored = (max_count - counts[i]) if max_count is not None and counts[i] <= max_count else None
        if b.broken_at is None and stored is not None and stored != b.count:
            b = HeapBin(kind=b.kind, index=i, chunk_size=b.chunk_size, count=b.count, broken_at=None,
                        problem=f"the tcache counts {stored} entries, the list holds {b.count}")
        out.append(b)
    return tuple(out)

