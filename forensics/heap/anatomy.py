"""The anatomy of a heap corruption glibc aborted on: which chunk, which buffer overflowed, how far, and who.

:func:`find_corruption` works in four steps, each from the core alone:

1. :func:`find_rejected_chunk` -- the chunk glibc was checking.  glibc's message
   names the check (``free(): invalid next size (normal)`` looks at the size of
   the chunk after the one being freed); the chunk is one of the values the
   crashing thread holds (its registers at the signal, then the words of its
   stack from the stack pointer up: ``free()``'s argument and ``_int_free``'s
   chunk pointer are there whichever native unwinder, if any, made the frames).
   The first value whose chunk fails that very check is the one.  Checks on a
   free list (``malloc(): unsorted double linked list corrupted``) walk the
   lists instead; the entry that fails is the chunk.
2. the damaged header -- the rejected chunk's own (its size), or its
   neighbour's (``!prev``, ``invalid next size``), with what is inconsistent in it;
3. :func:`find_chunk_before` -- the chunk whose end is that header: the buffer
   that ran over it (the heap is walked from its start; glibc keeps no back links
   for chunks in use);
4. :func:`measure_overflow` -- its usable size and how far the write went past
   it: the header words that cannot be glibc's, the slack after a buffer of known
   size that calloc zeroed, and the run of the same bytes beyond them.

A Python owner of the overflowing buffer (a ctypes object in a frame of the
crashing thread) and the native call it was passed to are matched by
:func:`decide`, which states who wrote past the end.
"""
from __future__ import annotations

import dataclasses
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence

from forensics.core import elf
from forensics.core.arch import spec_of
from forensics.heap.arenas import Heap
from forensics.heap.layout import FLAG_BITS, IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, PREV_INUSE, SIZE_SZ
from forensics.heap.freedptr import FreedPointer, find_freed_pointer
from forensics.heap.walk import (
    MAX_LIST,
    HeapValidationError,
    Region,
    fastbin_chunk_size,
    for_each_bin_chunk,
    for_each_chunk_resyncing,
    reveal,
    smallbin_chunk_size,
    tcache_entries,
    validate_bin,
    validate_chunk,
    validate_fastbin,
    validate_tcache_bin,
    walk_to,
)
from forensics.records import record
from forensics.model import (
    BufferOwner,
    ChunkState,
    FrameRegisters,
    HeapChunk,
    HeapCorruption,
    HeapFailureKind,
    NativeCall,
    OverflowVerdict,
)

__all__ = ["Check", "CHECKS", "classify_message", "Candidate", "candidates", "find_rejected_chunk",
           "find_chunk_before", "describe_header", "measure_overflow", "decide", "find_corruption", "STACK_WINDOW",
           "own_size_rewritten", "free_chunks", "freed_before", "list_entries", "CHAIN_WINDOW"]

#: bytes of the crashing thread's stack searched for the rejected chunk, from its stack pointer up
STACK_WINDOW = 64 << 10
_FIRST_BYTES = 64
_REGISTER_ORDER = ("rdi", "rsi", "rbx", "rbp", "r12", "r13", "r14", "r15", "rdx", "rcx", "r8", "r9", "rax",
                   "r10", "r11")
#: AArch64: the argument registers, the callee-saved x19-x28 (where _int_free keeps its chunk across calls),
#: the rest; x29/x30 (frame pointer, link register) are code and stack addresses
_A64_REGISTER_ORDER = (*(f"x{i}" for i in range(8)), *(f"x{i}" for i in range(19, 29)),
                       *(f"x{i}" for i in range(8, 19)))


@record
class Check:
    """One of glibc's malloc checks: the message's text, what it tests, and what it tested."""

    text: str
    kind: str
    looks_at: str


def _check(text: str, kind: str, looks_at: str) -> Check:
    return Check(text=text, kind=kind, looks_at=looks_at)


#: longest text first: "corrupted size vs. prev_size while consolidating" before "corrupted size vs. prev_size"
CHECKS = tuple(sorted((
    _check("free(): invalid next size", "next-size", "the size of the chunk after the one being freed"),
    _check("realloc(): invalid next size", "next-size", "the size of the chunk after the one being reallocated"),
    _check("double free or corruption (!prev)", "next-prev-inuse",
          "the PREV_INUSE bit of the chunk after the one being freed"),
    _check("double free or corruption (out)", "out", "whether the chunk after the one being freed is in the arena"),
    _check("double free or corruption (top)", "top", "whether the chunk being freed is the arena's top chunk"),
    _check("double free or corruption (fasttop)", "fasttop",
          "whether the chunk being freed is already first in its fastbin"),
    _check("free(): invalid pointer", "invalid-pointer", "the freed pointer's alignment and the chunk's size"),
    _check("realloc(): invalid pointer", "invalid-pointer", "the pointer's alignment and the chunk's size"),
    _check("free(): invalid size", "invalid-size", "the size field of the chunk being freed"),
    _check("realloc(): invalid old size", "invalid-size", "the size field of the chunk being reallocated"),
    _check("munmap_chunk(): invalid pointer", "munmap", "the prev_size and size of an mmapped chunk"),
    _check("free(): double free detected in tcache", "tcache-double", "the key of the chunk being freed"),
    _check("free(): unaligned chunk detected in tcache", "tcache-list", "the entries of a tcache list"),
    _check("free(): too many chunks detected in tcache", "tcache-list", "the length of a tcache list"),
    _check("malloc(): unaligned tcache chunk detected", "tcache-list", "the entries of a tcache list"),
    _check("tcache_thread_shutdown(): unaligned tcache chunk", "tcache-list", "the entries of a tcache list"),
    _check("corrupted size vs. prev_size while consolidating", "consolidate-prev",
          "the freed chunk's prev_size against the size of the chunk before it"),
    _check("corrupted size vs. prev_size", "bins", "a free chunk's size against the next chunk's prev_size"),
    _check("corrupted double-linked list", "bins", "a free chunk's fd/bk links"),
    _check("malloc(): corrupted top size", "top-size", "the size of the arena's top chunk"),
    _check("(unsorted)", "bins", "the chunks of the unsorted bin"),
    _check("corrupted unsorted chunks", "bins", "the links of the unsorted bin"),
    _check("double linked list corrupted", "bins", "the links of a bin"),
    _check("malloc(): memory corruption (fast)", "fast-list", "the size of a fastbin's first chunk"),
    _check("fastbin chunk detected", "fast-list", "the entries of a fastbin"),
    _check("malloc_consolidate(): invalid chunk size", "fast-list", "the sizes of fastbin chunks"),
    _check("invalid fastbin entry (free)", "fast-list", "the first chunk of a fastbin"),
), key=lambda c: -len(c.text)))

_OWN_HEADER = {"invalid-pointer", "invalid-size", "munmap", "out", "top", "consolidate-prev", "tcache-double",
               "fasttop"}
#: checks that catch a second free of the same chunk, not a write past a buffer
_DOUBLE_FREE = {"top", "fasttop", "tcache-double"}
#: checks on free lists and the top chunk, not on a pointer being freed
_LIST_KINDS = {"bins", "fast-list", "top-size", "tcache-list"}
#: checks a second free of a chunk glibc already merged into a free neighbour fails, by the neighbours it had:
#: the chunk is, or lies inside, a free chunk of a bin or the top chunk
_MERGED_FREE = {"next-prev-inuse", "out", "top", "next-size"}


def classify_message(message: str | None) -> Check | None:
    """The check that produced glibc's message, or None for a message that is not malloc's.

    >>> classify_message("free(): invalid next size (normal)").kind
    'next-size'
    >>> classify_message("corrupted size vs. prev_size while consolidating").kind
    'consolidate-prev'
    >>> classify_message("Fatal Python error: Segmentation fault") is None
    True
    """
    if not message:
        return None
    for check in CHECKS:
        if check.text in message:
            return check
    return None


class Candidate:
    """A value the crashing thread held, and where.  A plain class: one is made for each of the thousands of
    words of the thread's stack (a record's generic ``__init__`` costs more than the check that follows)."""

    __slots__ = ("value", "_where", "_sp", "_offset")

    def __init__(self, value: int, where: str | None = None, *, sp: int = 0, offset: int = 0) -> None:
        """``where`` in words, or (for a stack word) the stack pointer and the word's offset from it, said in
        words only when asked (one candidate is ever said)."""
        self.value = value
        self._where = where
        self._sp = sp
        self._offset = offset

    @property
    def where(self) -> str:
        if self._where is not None:
            return self._where
        return f"stack at 0x{self._sp + self._offset:x} (sp+0x{self._offset:x})"

    def __repr__(self) -> str:
        return f"Candidate(value={self.value!r}, where={self.where!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Candidate) and (self.value, self.where) == (other.value, other.where)

    def __hash__(self) -> int:
        return hash((self.value, self.where))


def candidates(heap: Heap, tid: int | None) -> Iterator[Candidate]:
    """The crashing thread's registers (NT_PRSTATUS, in the core's machine's layout), then its stack words from
    the stack pointer up."""
    regs = next((r for pid, r in _thread_registers(heap) if tid is None or pid == tid), None)
    if regs is None:
        return
    spec = spec_of(heap.core.arch)
    for name in _REGISTER_ORDER if spec.machine == elf.EM_X86_64 else _A64_REGISTER_ORDER:
        yield Candidate(regs[name], f"register {name}")
    sp = regs[spec.sp]
    mapping = heap.core.find_mapping(sp)
    end = min(sp + STACK_WINDOW, mapping.end if mapping else sp + STACK_WINDOW)
    data = heap.hm.mem.read_prefix(sp, end - sp)
    for i, value in enumerate(struct.unpack_from(f"<{len(data) // 8}Q", data)):
        yield Candidate(value, sp=sp, offset=8 * i)


def _chunk(heap: Heap, addr: int, region: Region | None, state: ChunkState = ChunkState.UNKNOWN) -> HeapChunk | None:
    try:
        prev_size, size_field = heap.hm.pair(addr)
    except HeapValidationError:
        return None
    return HeapChunk(address=addr, size=size_field & ~FLAG_BITS, flags=size_field & FLAG_BITS, prev_size=prev_size,
                     state=state, arena=region.arena if region else None)


def _flags(f: int) -> str:
    names = [n for bit, n in ((PREV_INUSE, "PREV_INUSE"), (IS_MMAPPED, "IS_MMAPPED"), (4, "NON_MAIN_ARENA"))
             if f & bit]
    return "|".join(names) or "no flags"


def _is_linked_free(heap: Heap, c: HeapChunk) -> bool:
    """Whether ``c`` is a free chunk properly linked in a bin (fd->bk == c and bk->fd == c)."""
    try:
        fd, bk = heap.hm.pair(c.address + 2 * SIZE_SZ)
        if fd & 7 or bk & 7 or not fd or not bk:
            return False
        return heap.hm.u64(fd + 3 * SIZE_SZ) == c.address and heap.hm.u64(bk + 2 * SIZE_SZ) == c.address
    except HeapValidationError:
        return False


def _arena_end(heap: Heap, region: Region) -> int:
    arena = heap.arena(region.arena)
    if arena is not None and region.top is not None and arena.top_size is not None:
        return region.top + arena.top_size
    return region.end


def _system_mem(heap: Heap, region: Region) -> int:
    arena = heap.arena(region.arena)
    return arena.system_mem if arena is not None else 1 << 46


def _stack_mappings(heap: Heap) -> list:
    """The mappings holding a thread's stack pointer (never an mmapped chunk's)."""
    out = []
    sp = spec_of(heap.core.arch).sp
    for _pid, regs in _thread_registers(heap):
        m = heap.core.find_mapping(regs[sp])
        if m is not None:
            out.append(m)
    return out


def _thread_registers(heap: Heap) -> Iterator[tuple[int, dict[str, int]]]:
    """(tid, registers by name) of each NT_PRSTATUS note, read in the layout of the core's machine."""
    spec = spec_of(heap.core.arch)
    layout = heap.hm.mem.layout
    for note in layout.notes if layout is not None else ():
        if note.name == b"CORE" and note.type == elf.NT_PRSTATUS:
            try:
                yield elf.parse_prstatus_registers(note.desc, spec)
            except ValueError:
                continue


def _test_munmap(heap: Heap, c: HeapChunk, region: Region | None) -> list[str] | None:
    size_field = c.size | c.flags
    if not c.flags & IS_MMAPPED:
        return None
    if region is not None:
        return [f"size field 0x{size_field:x} has IS_MMAPPED set on a chunk inside the heap of arena "
                f"0x{region.arena:x}: glibc took it for a chunk of its own mapping"]
    mapping = heap.core.find_mapping(c.address)
    if mapping is None or mapping.path is not None or "w" not in mapping.perms or \
            any(m.start == mapping.start for m in _stack_mappings(heap)):
        return None  # an mmapped chunk lives in an anonymous, writable mapping that is no thread's stack
    page = heap.core_page_size
    total = c.prev_size + c.size + (SIZE_SZ if heap.layout.mmap_overhead == SIZE_SZ else 0)
    if ((c.address - c.prev_size) | total) & (page - 1):
        return [f"size field 0x{size_field:x} has IS_MMAPPED set, but prev_size 0x{c.prev_size:x} and size "
                f"0x{c.size:x} do not describe a page-aligned mapping"]
    return None


def _test_own_size(heap: Heap, kind: str, c: HeapChunk, region: Region) -> list[str] | None:
    """Checks ``invalid-size``, ``invalid-pointer``, ``top`` and ``tcache-double``: the chunk's own header."""
    size_field = c.size | c.flags
    if kind == "invalid-size":
        if c.size < MINSIZE or c.size & (MALLOC_ALIGNMENT - 1):
            return [f"size field 0x{size_field:x}: size 0x{c.size:x} is "
                    + ("below the minimum chunk size 0x20" if c.size < MINSIZE else "not a multiple of 16")]
        return None
    if kind == "invalid-pointer":
        if c.address + c.size >= 1 << 64 and not c.flags & IS_MMAPPED:
            return [f"size field 0x{size_field:x}: size 0x{c.size:x} wraps past the end of the address space "
                    f"from 0x{c.address:x}"]
        return None
    if kind == "top":
        return ["the chunk being freed is the arena's top chunk (a double free, or a pointer into the wilderness)"] \
            if region.top == c.address else None
    # tcache-double
    if c.mem not in heap.cached:
        return None
    key = heap.hm.u64(c.mem + SIZE_SZ)
    return [f"0x{c.mem:x} is already in a tcache list (its key 0x{key:x} marks a tcache entry): "
            "it was freed before"]


_OWN_SIZE_TESTS = {"invalid-size", "invalid-pointer", "top", "tcache-double"}


def _test_fasttop(heap: Heap, c: HeapChunk, region: Region) -> list[str] | None:
    """Check ``fasttop``: the chunk being freed is already the first chunk of its fastbin."""
    layout = heap.layout
    index = (c.size >> 4) - 2
    if layout.arena_fastbins is None or not 0 <= index < layout.nfastbins:
        return None
    try:
        first = heap.hm.u64(region.arena + layout.arena_fastbins + index * SIZE_SZ)
    except HeapValidationError:
        return None
    if first != c.address:
        return None
    return [f"0x{c.address:x} is already the first chunk of the 0x{fastbin_chunk_size(index):x} fastbin of arena "
            f"0x{region.arena:x}: it was freed before"]


def _test_out(heap: Heap, c: HeapChunk, region: Region) -> list[str] | None:
    """Check ``out``: the chunk after the one being freed must lie inside its arena."""
    nxt_addr = c.address + c.size
    end = _arena_end(heap, region)
    main = heap.arenas[0] if heap.arenas else None
    if region.arena != heap.glibc.main_arena and not c.flags & 4 and main is not None and main.top_size:
        # NON_MAIN_ARENA clear: glibc took the chunk for one of main_arena's and checked it against that
        end = main.top + main.top_size
        note = (f"NON_MAIN_ARENA is clear on a chunk of thread arena 0x{region.arena:x}, so glibc checked it "
                f"against main_arena, whose heap ends at 0x{end:x}")
    else:
        note = f"the arena's heap ends at 0x{end:x}"
    if nxt_addr >= end or c.address == region.top:
        out = [f"size field 0x{c.size | c.flags:x}: the next chunk would be at 0x{nxt_addr:x}; {note}"]
        if c.address == region.top:
            out.append(f"0x{c.address:x} is the arena's top chunk: its size field was overwritten")
        return out
    return None


def _test_consolidate_prev(heap: Heap, c: HeapChunk, region: Region) -> list[str] | None:
    """Check ``consolidate-prev``: a clear PREV_INUSE says the chunk before is free, of size prev_size."""
    if c.flags & PREV_INUSE:
        return None
    prev_addr = c.address - c.prev_size
    p = _chunk(heap, prev_addr, region)
    if p is None or p.size != c.prev_size:
        return [f"size field 0x{c.size | c.flags:x}: PREV_INUSE clear says the chunk before it is free, of "
                f"prev_size 0x{c.prev_size:x}; " + (f"the chunk at 0x{prev_addr:x} has size 0x{p.size:x}"
                                                   if p else f"0x{prev_addr:x} is not in the core")]
    return None


def _test_next(heap: Heap, kind: str, c: HeapChunk, region: Region) -> list[str] | None:
    """Checks ``next-size`` and ``next-prev-inuse``: the header of the chunk after the one being freed."""
    nxt_addr = c.address + c.size
    if nxt_addr + 2 * SIZE_SZ > region.end:
        return None
    nxt = _chunk(heap, nxt_addr, region)
    if nxt is None:
        return None
    nxt_field = nxt.size | nxt.flags
    if kind == "next-size":
        if nxt.size <= 2 * SIZE_SZ or nxt.size >= _system_mem(heap, region):
            return [f"the next chunk at 0x{nxt_addr:x} has size field 0x{nxt_field:x}: size 0x{nxt.size:x} is "
                    + ("not above 0x10" if nxt.size <= 2 * SIZE_SZ else
                       f"at least the arena's system_mem 0x{_system_mem(heap, region):x}")]
        return None
    if kind == "next-prev-inuse":
        if nxt.flags & PREV_INUSE or _is_linked_free(heap, c):
            return None
        problems = [f"the next chunk at 0x{nxt_addr:x} has size field 0x{nxt_field:x}: PREV_INUSE clear says "
                    f"0x{c.address:x} is free, but it was being freed (in use)"]
        if nxt.prev_size != c.size:
            problems.append(f"its prev_size 0x{nxt.prev_size:x} is not the size 0x{c.size:x} of the chunk before it")
        return problems
    return None


def _unlink_problems(heap: Heap, n_addr: int, region: Region) -> list[str] | None:
    """What glibc's unlink_chunk finds wrong with the free chunk at ``n_addr`` (its size against the prev_size
    of the chunk after it, its fd and bk links), or None when it would unlink it."""
    n = _chunk(heap, n_addr, region)
    if n is None:
        return None
    try:
        after_prev = heap.hm.u64(n_addr + n.size)
    except HeapValidationError:
        return [f"its size 0x{n.size:x} leads out of the core, to 0x{n_addr + n.size:x}"]
    if after_prev != n.size:
        return [f"its size field 0x{n.size | n.flags:x} says size 0x{n.size:x}, but the prev_size of the chunk it "
                f"leads to, at 0x{n_addr + n.size:x}, is 0x{after_prev:x}"]
    if not _is_linked_free(heap, n):
        return ["its fd and bk do not link it into a free list (fd->bk and bk->fd are not it)"]
    return None


def _test_unlink(heap: Heap, c: HeapChunk, region: Region) -> tuple[list[str], int] | None:
    """Checks ``corrupted size vs. prev_size`` and ``corrupted double-linked list`` met while freeing ``c``: glibc
    unlinks the free neighbour it merges ``c`` with -- the chunk before it (PREV_INUSE clear) or the one after
    it (free by the PREV_INUSE bit of the chunk after that) -- and that neighbour fails the unlink's checks.
    (the inconsistencies, the neighbour's address), or None."""
    if c.size < MINSIZE or c.size & (MALLOC_ALIGNMENT - 1):
        return None
    neighbours = []
    if not c.flags & PREV_INUSE:
        neighbours.append((c.address - c.prev_size, "before"))
    nxt = _chunk(heap, c.address + c.size, region)
    if nxt is not None and nxt.address != region.top and nxt.size >= MINSIZE and not nxt.size & 0xF:
        try:
            after_field = heap.hm.u64(nxt.address + nxt.size + SIZE_SZ)
        except HeapValidationError:
            after_field = PREV_INUSE
        if not after_field & PREV_INUSE:
            neighbours.append((nxt.address, "after"))
    for n_addr, side in neighbours:
        problems = _unlink_problems(heap, n_addr, region)
        if problems:
            return [f"the chunk {side} 0x{c.address:x}, at 0x{n_addr:x}, is free by its flags, so glibc unlinked it "
                    f"to merge the two: " + "; ".join(problems)], n_addr
    return None


def _test(heap: Heap, kind: str, c_addr: int, region: Region | None) -> list[str] | None:
    """The inconsistencies of chunk ``c_addr`` that fail check ``kind``, or None when it passes it."""
    c = _chunk(heap, c_addr, region)
    if c is None:
        return None
    if kind == "munmap":
        return _test_munmap(heap, c, region)
    if region is None:
        return None
    if kind in _OWN_SIZE_TESTS:
        return _test_own_size(heap, kind, c, region)
    if c.size < MINSIZE or c.size & (MALLOC_ALIGNMENT - 1):
        return None
    if kind == "out":
        return _test_out(heap, c, region)
    if kind == "consolidate-prev":
        return _test_consolidate_prev(heap, c, region)
    if kind == "fasttop":
        return _test_fasttop(heap, c, region)
    return _test_next(heap, kind, c, region)


def _arena_name(heap: Heap, arena: int) -> str:
    return f"{'main_arena' if arena == heap.glibc.main_arena else 'thread arena'} 0x{arena:x}"


def free_chunks(heap: Heap) -> list[tuple[int, int, str]]:
    """The chunks glibc holds free in its arenas -- every unsorted, small and large bin (each list up to a
    link that fails its check) and each arena's top chunk -- by address: ``(address, size, where)``.  Read
    once per heap; what it costs is the free chunks', not the heap's size."""
    if heap.free_index is None:
        out: list[tuple[int, int, str]] = []
        layout = heap.layout
        for arena in heap.arenas:
            name = _arena_name(heap, arena.address)
            for i in range(1, layout.nbins):
                where = ("the unsorted bin" if i == 1 else f"the 0x{smallbin_chunk_size(i):x} small bin" if i < 64
                         else f"large bin {i}")
                try:
                    for c in for_each_bin_chunk(heap.hm, layout, arena.address, i, arena.regions):
                        out.append((c.address, c.size, f"{where} of {name}"))
                except HeapValidationError:  # the entries before the break are kept
                    continue
            top_size = arena.top_size
            if arena.top and top_size and top_size <= arena.system_mem and not top_size & (MALLOC_ALIGNMENT - 1):
                # a top chunk whose size the arena cannot have was written over: it proves nothing free
                out.append((arena.top, top_size, f"the top chunk of {name}"))
        out.sort()
        heap.free_index = out
    return heap.free_index


def freed_before(heap: Heap, addr: int) -> str | None:
    """Why the chunk at ``addr`` is one glibc already holds free -- a free chunk of a bin, the top chunk, or
    inside one of them (its first free merged it into the free chunk before it, or into the top) -- or None.

    A chunk freed, merged with the free chunk after it into one on the unsorted list, then freed again reads
    "0x55d0c0a011b0 is already a free chunk (size 0x2010) in the unsorted bin of main_arena 0x7f2c...".
    """
    index = free_chunks(heap)
    i = bisect_right(index, (addr, 1 << 64, "")) - 1
    if i < 0:
        return None
    start, size, where = index[i]
    if not start <= addr < start + size:
        return None
    if where.startswith("the top chunk"):
        if start == addr:
            return f"0x{addr:x} is {where}: its first free merged it into the top chunk"
        return (f"0x{addr:x} lies inside {where} (0x{start:x}, size 0x{size:x}): its first free merged it into "
                "the top chunk")
    if start == addr:
        return f"0x{addr:x} is already a free chunk (size 0x{size:x}) in {where}"
    return (f"0x{addr:x} lies inside the free chunk 0x{start:x} (size 0x{size:x}) in {where}: its first free "
            "merged it into the free chunk before it")


def list_entries(heap: Heap) -> list[int]:
    """The chunks of every thread's tcache and every arena's fastbins, by address (each list followed until it
    ends, loops or leaves the heap; read once): in use to a walk of the heap, and chunk boundaries all the same --
    recent frees, near where a crash's chunks usually are."""
    if heap.list_entries is None:
        from forensics.heap.summary import find_tcaches

        out: set[int] = set()
        for tcache, _arena, _how in find_tcaches(heap, heap.core).values():
            if tcache:
                heap.cached |= tcache_entries(heap.hm, heap.layout, tcache)
        out.update(m - 2 * SIZE_SZ for m in heap.cached)
        layout = heap.layout
        fastbins = layout.arena_fastbins
        for arena in heap.arenas if fastbins is not None else ():
            for i in range(layout.nfastbins):
                try:
                    cur = heap.hm.u64(arena.address + (fastbins or 0) + i * SIZE_SZ)
                    for _ in range(MAX_LIST):
                        if not cur or cur in out or cur & (MALLOC_ALIGNMENT - 1) or heap.region_of(cur) is None:
                            break
                        out.add(cur)
                        cur = reveal(layout, cur + 2 * SIZE_SZ, heap.hm.u64(cur + 2 * SIZE_SZ))
                except HeapValidationError:
                    continue
        heap.list_entries = sorted(out)
    return heap.list_entries


def _anchors(heap: Heap, region: Region) -> list[int]:
    """The addresses of ``region`` known to be chunk boundaries without walking to them, in order: its first
    chunk, the free chunks of the arenas' bins (each a checked member of its list), the top chunk, and the
    chunks of the tcache and fastbin lists."""
    out = {region.first}
    out.update(a for a, _s, _w in free_chunks(heap) if region.first <= a < region.end)
    out.update(a for a in list_entries(heap) if region.first <= a < region.end)
    return sorted(out)


def _start_near(heap: Heap, region: Region, target: int, *, strictly_below: bool = False) -> int:
    """The nearest known chunk boundary at or below ``target`` (strictly below with ``strictly_below``)."""
    anchors = _anchors(heap, region)
    i = (bisect_left(anchors, target) if strictly_below else bisect_right(anchors, target)) - 1
    return anchors[i] if i >= 0 else region.first


def _walk_to(heap: Heap, region: Region, target: int, *, strictly_below: bool = False) -> tuple[int, int, int]:
    """:func:`walk_to` from the nearest known boundary below ``target``, remembered per (start, target).

    :raises HeapValidationError: as :func:`walk_to`
    """
    start = _start_near(heap, region, target, strictly_below=strictly_below)
    key = (start, target)
    found = heap.walks.get(key)
    if found is None:
        found = heap.walks[key] = walk_to(heap.hm, region, start, target)
    return found


def _walk_near(heap: Heap, region: Region, target: int, *, records: bool = True, strictly_below: bool = False):
    """The walk of ``region`` (:func:`for_each_chunk_resyncing`) from the nearest known boundary at or below
    ``target`` (strictly below with ``strictly_below``): only the chunks around ``target`` are visited, not the
    heap from its start, when a free chunk, a tcache entry or the top lies near it."""
    start = _start_near(heap, region, target, strictly_below=strictly_below)
    if start == region.first:
        return for_each_chunk_resyncing(heap.hm, region, records=records)
    sub = Region(start=region.start, first=start, end=region.end, arena=region.arena, top=region.top)
    return for_each_chunk_resyncing(heap.hm, sub, records=records)


def _boundaries(heap: Heap, targets: Sequence[tuple[Region, int]]) -> set[int]:
    """Which ``targets`` are chunk headers on the walk of their heap (a header that broke the walk counts): one
    walk from each nearest known boundary below them, on from each target to the next (the answers kept for
    :func:`find_chunk_before`)."""
    groups: dict[tuple[Region, int], list[int]] = {}
    for region, addr in targets:
        groups.setdefault((region, _start_near(heap, region, addr)), []).append(addr)
    out: set[int] = set()
    for (region, start), addrs in groups.items():
        cursor = start
        try:  # one tight loop; a header broken on the way: the walk that steps over it
            for addr in sorted(set(addrs)):
                if addr == cursor:
                    out.add(addr)
                    continue
                found = heap.walks.get((start, addr)) or walk_to(heap.hm, region, cursor, addr)
                heap.walks[(start, addr)] = found
                at, field, _prev = found
                if at == addr or at + (field & ~FLAG_BITS) == addr:
                    out.add(addr)
                cursor = at
        except HeapValidationError:
            want = set(addrs)
            sub = Region(start=region.start, first=start, end=region.end, arena=region.arena, top=region.top)
            for item in for_each_chunk_resyncing(heap.hm, sub, records=False):
                at = item.address if isinstance(item, HeapValidationError) else item[0]
                if at in want:
                    out.add(at)
                if at >= max(want):
                    break
    return out


def find_rejected_chunk(heap: Heap, kind: str, tid: int | None) -> tuple[HeapChunk, str, list[str]] | None:
    """The chunk a free-path check rejected: (chunk, where its pointer was found, inconsistencies).

    Every value the thread holds is tested against the check first (a few words of the core each); of those
    that fail it, in the thread's order: chunks on the walk of their heap, then (a check a double free fails
    by its neighbour) a chunk glibc holds free, then other addresses inside a heap, then chunks of their own
    mapping (``munmap_chunk()``'s check) -- so a pointer into the middle of a buffer, or into a stack, is
    not taken for a chunk when a real one fails the check.  Only the values that fail are walked to, each
    from the nearest known boundary below it, and the first on the walk ends the search.
    """
    values: list[Candidate] = []
    seen: set[int] = set()
    for cand in candidates(heap, tid):
        if cand.value >= 0x10000 and cand.value not in seen:
            seen.add(cand.value)
            values.append(cand)
    failing = _failing(heap, kind, values)
    on_walk = _boundaries(heap, [(region, c_addr) for _c, c_addr, region, found in failing
                                 if found is not None and region is not None])
    for cand, c_addr, region, found in failing:
        if found is not None and region is not None and c_addr in on_walk:
            return _chunk(heap, c_addr, region, ChunkState.IN_USE) or _never(c_addr), cand.where, found
    if kind in _MERGED_FREE:
        # no chunk on the walk fails the check: a second free of a chunk glibc holds free (merged into a free
        # neighbour on a bin, or into the top) fails it by that neighbour -- before any value that is no
        # chunk boundary is taken for one
        held = _held_free(heap, values)
        if held is not None:
            return held
    return _off_walk(heap, failing)


_Failing = tuple[Candidate, int, "Region | None", "list[str] | None"]


def _failing(heap: Heap, kind: str, values: list[Candidate]) -> list[_Failing]:
    """The values (as a chunk, or a user pointer) whose chunk fails check ``kind``, in order: (candidate, chunk,
    its heap region, the inconsistencies; None for free()'s own pointer misaligned inside a heap)."""
    out: list[_Failing] = []
    for cand in values:
        v = cand.value
        for c_addr in (v - 2 * SIZE_SZ, v):
            region = heap.region_of(c_addr)
            if c_addr & (MALLOC_ALIGNMENT - 1):
                if kind == "invalid-pointer" and c_addr == v - 2 * SIZE_SZ and region is not None \
                        and region.first < v < region.end:
                    out.append((cand, c_addr, region, None))
                continue
            found = _test(heap, kind, c_addr, region)
            if found:
                out.append((cand, c_addr, region, found))
    return out


def _off_walk(heap: Heap, failing: list[_Failing]) -> tuple[HeapChunk, str, list[str]] | None:
    """Of the failing values none on the walk: the first inside a heap, else the first of its own mapping."""
    for cand, c_addr, region, found in failing:
        if region is None:
            continue
        if found is None:  # free()'s pointer itself misaligned
            chunk = _chunk(heap, c_addr & ~(MALLOC_ALIGNMENT - 1), region)
            if chunk is not None:
                return chunk, cand.where, [f"the pointer 0x{cand.value:x} is not 16-byte aligned"]
            continue
        return _chunk(heap, c_addr, region, ChunkState.IN_USE) or _never(c_addr), cand.where, found
    for cand, c_addr, region, found in failing:
        if region is None and found is not None:
            return _chunk(heap, c_addr, None, ChunkState.IN_USE) or _never(c_addr), cand.where, found
    return None


def _never(addr: int) -> HeapChunk:
    """For a chunk the check just read: it is in the core (the check read its header)."""
    raise AssertionError(f"0x{addr:x} was read by the check, yet is not in the core")


def _held_free(heap: Heap, values: list[Candidate]) -> tuple[HeapChunk, str, list[str]] | None:
    """The first value whose chunk glibc holds free (a bin's, or inside one or the top), with the proof."""
    for cand in values:
        for c_addr in (cand.value - 2 * SIZE_SZ, cand.value):
            if c_addr & (MALLOC_ALIGNMENT - 1) or heap.region_of(c_addr) is None:
                continue
            why = freed_before(heap, c_addr)
            chunk = _chunk(heap, c_addr, heap.region_of(c_addr), ChunkState.FREE) if why else None
            if chunk is not None and why is not None:
                return chunk, cand.where, [why]
    return None


#: free-path checks whose failing header a walk of the heap finds by itself
_WALKABLE = {"munmap", "invalid-pointer", "invalid-size", "out", "next-size"}


def _walk_damage(heap: Heap, kind: str) -> tuple[HeapChunk, str, list[str]] | None:
    """For a free-path check whose pointer the thread no longer holds: the first header of a heap that
    fails it (a size the walk cannot follow, or IS_MMAPPED on a chunk inside a heap)."""
    for arena in heap.arenas:
        for region in arena.regions:
            last: HeapChunk | None = None
            for item in for_each_chunk_resyncing(heap.hm, region):
                if isinstance(item, HeapValidationError):
                    bad = _chunk(heap, item.address, region)
                    if bad is None:
                        break
                    if kind == "next-size" and last is not None and last.end == bad.address:
                        return (HeapChunk(address=last.address, size=last.size, flags=last.flags,
                                          prev_size=last.prev_size, state=ChunkState.IN_USE, arena=region.arena),
                                f"the walk of the heap at 0x{region.start:x}",
                                [f"the next chunk at 0x{bad.address:x}: {item.reason}"])
                    if kind != "next-size":
                        return bad, f"the walk of the heap at 0x{region.start:x}", [item.reason]
                    break
                if kind == "munmap" and item.flags & IS_MMAPPED:
                    return item, f"the walk of the heap at 0x{region.start:x}", [
                        f"size field 0x{item.size | item.flags:x} has IS_MMAPPED set on a chunk inside the heap of "
                        f"arena 0x{region.arena:x}: glibc took it for a chunk of its own mapping"]
                last = item
    return None


def _list_damage(heap: Heap, kind: str) -> tuple[HeapChunk, str, list[str]] | None:
    """For checks on free lists: the first entry that fails its check, from walking every list."""
    layout = heap.layout
    for arena in heap.arenas:
        regions = arena.regions
        if kind == "top-size":
            if arena.top_size is not None and arena.top_size > arena.system_mem:
                c = _chunk(heap, arena.top, heap.region_of(arena.top), ChunkState.TOP)
                if c is not None:
                    return c, f"top of arena 0x{arena.address:x}", [
                        f"top chunk size 0x{arena.top_size:x} exceeds the arena's system_mem 0x{arena.system_mem:x}"]
            continue
        bins = []
        if kind == "fast-list" and layout.arena_fastbins is not None:
            bins = [validate_fastbin(heap.hm, layout, arena.address, i, regions) for i in range(layout.nfastbins)]
        elif kind == "bins":
            bins = [validate_bin(heap.hm, layout, arena.address, i, regions) for i in range(1, layout.nbins)]
        for b in bins:
            if b.broken_at is not None:
                addr = b.broken_at
                c = _chunk(heap, addr & ~(MALLOC_ALIGNMENT - 1), heap.region_of(addr))
                if c is not None:
                    return c, f"{b.kind} bin {b.index} of arena 0x{arena.address:x}", [b.problem or "broken link"]
    return None


def _tcache_damage(heap: Heap, tcaches: Sequence[int]) -> tuple[HeapChunk, str, list[str]] | None:
    regions = heap.regions()
    for t in tcaches:
        for i in range(heap.layout.tcache_bins):
            b = validate_tcache_bin(heap.hm, heap.layout, t, i, regions)
            if b.broken_at is not None:
                c = _chunk(heap, (b.broken_at - 2 * SIZE_SZ) & ~(MALLOC_ALIGNMENT - 1), heap.region_of(b.broken_at))
                if c is not None:
                    return c, f"tcache 0x{t:x} bin {i}", [b.problem or "broken link"]
    return None


def describe_header(heap: Heap, c: HeapChunk, before: HeapChunk | None) -> list[str]:
    """Everything inconsistent in a chunk header inside a heap: its size, its flags, its prev_size, and the
    header its size leads to -- each against what glibc keeps true of a chunk there."""
    region = heap.region_of(c.address)
    if region is None:
        return []
    out = []
    field = c.size | c.flags
    arena = heap.arena(region.arena)
    if c.size < MINSIZE or c.size & (MALLOC_ALIGNMENT - 1):
        out.append(f"size: 0x{c.size:x} is not a chunk size (at least 0x20, a multiple of 16)")
    elif c.address + c.size > region.end:
        out.append(f"size: 0x{c.size:x} runs past the end of its heap 0x{region.end:x}")
    elif arena is not None and c.size > arena.system_mem:
        out.append(f"size: 0x{c.size:x} is more than the arena holds (system_mem 0x{arena.system_mem:x})")
    if c.flags & IS_MMAPPED:
        out.append(f"flags: IS_MMAPPED in 0x{field:x} on a chunk inside a heap")
    in_thread_arena = region.arena != heap.glibc.main_arena
    if bool(c.flags & 4) != in_thread_arena:
        out.append(f"flags: NON_MAIN_ARENA is {'clear' if in_thread_arena else 'set'} in 0x{field:x}, but the chunk "
                   f"is in {'thread arena' if in_thread_arena else 'main_arena'} 0x{region.arena:x}")
    if before is not None and before.end == c.address and not c.flags & PREV_INUSE:
        out.append(f"flags: PREV_INUSE is clear in 0x{field:x}, but the chunk before it (0x{before.address:x}) is "
                   "in use")
        if c.prev_size != before.size:
            out.append(f"prev_size: 0x{c.prev_size:x} is not the size 0x{before.size:x} of the chunk before it")
    if c.size >= MINSIZE and not c.size & (MALLOC_ALIGNMENT - 1) and c.address + c.size + 2 * SIZE_SZ <= region.end \
            and c.address != region.top:
        nxt = _chunk(heap, c.address + c.size, region)
        if nxt is not None and (nxt.size < MINSIZE or nxt.size & (MALLOC_ALIGNMENT - 1)
                                or nxt.address + nxt.size > region.end):
            out.append(f"next chunk: the header its size leads to, at 0x{nxt.address:x}, has size field "
                       f"0x{nxt.size | nxt.flags:x}, not a chunk there")
    return out


#: how far below a damaged header a value the thread holds is tried as the start of the chunks that end there
CHAIN_WINDOW = 1 << 20
_CHAIN_STEPS = 4096


def _chain_to(heap: Heap, region: Region, start: int, damaged: int) -> HeapChunk | None:
    """The last chunk of the chain of valid headers from ``start`` when the chain ends exactly at ``damaged``
    (its size leads there), else None."""
    addr = start
    for _ in range(_CHAIN_STEPS):
        try:
            c = validate_chunk(heap.hm, addr, region)
        except HeapValidationError:
            return None
        if c.end == damaged:
            return HeapChunk(address=c.address, size=c.size, flags=c.flags, prev_size=c.prev_size,
                             state=ChunkState.IN_USE, arena=region.arena)
        if c.end > damaged:
            return None
        addr = c.end
    return None


def find_chunk_before(heap: Heap, damaged: int, near: Sequence[int] = ()) -> tuple[HeapChunk | None, str | None]:
    """The chunk whose end is the header at ``damaged``, or why not.

    Glibc keeps no link back from a chunk in use, so the chunks are followed forward to it: from the values in
    ``near`` (what the crashing thread holds: the pointer to the buffer it just wrote, as a chunk) whose chain of
    valid headers lands exactly on ``damaged`` -- the nearest first --, else from the nearest chunk boundary known
    below it (a free chunk of a bin, a tcache or fastbin entry, the heap's start).
    """
    region = heap.region_of(damaged)
    if region is None:
        return None, f"0x{damaged:x} is in no heap of any arena"
    for start in sorted({a for a in near if damaged - CHAIN_WINDOW <= a < damaged and region.first <= a
                         and not a & (MALLOC_ALIGNMENT - 1)}, reverse=True):
        found = _chain_to(heap, region, start, damaged)
        if found is not None:
            return found, None
    try:  # one tight loop from the nearest boundary known; a header broken on the way: the resyncing walk
        address, field, prev_size = _walk_to(heap, region, damaged, strictly_below=True)
        if address < damaged and address + (field & ~FLAG_BITS) == damaged:
            return HeapChunk(address=address, size=field & ~FLAG_BITS, flags=field & FLAG_BITS, prev_size=prev_size,
                             state=ChunkState.IN_USE, arena=region.arena), None
    except HeapValidationError:
        pass
    last: tuple[int, int, int, int, int] | None = None
    earlier_break = None
    for item in _walk_near(heap, region, damaged, records=False, strictly_below=True):
        if isinstance(item, HeapValidationError):
            if item.address == damaged:
                break
            earlier_break = earlier_break or item
            last = None  # what precedes a resynced walk is unknown
            continue
        if item[0] >= damaged:
            break
        last = item
        if item[0] + item[1] >= damaged:
            break
    if last is None:
        if earlier_break is not None:
            return None, (f"the walk of the heap at 0x{region.start:x} broke at 0x{earlier_break.address:x} "
                          f"({earlier_break.reason}) before reaching 0x{damaged:x}")
        return None, f"0x{damaged:x} is the first chunk of its heap"
    address, size, flags, prev_size, _state = last
    if address + size != damaged:
        return None, (f"no chunk ends at 0x{damaged:x}: the chunk at 0x{address:x} (size 0x{size:x}) "
                      "spans it, so that address is not a chunk boundary")
    return HeapChunk(address=address, size=size, flags=flags, prev_size=prev_size, state=ChunkState.IN_USE,
                     arena=region.arena), None


def measure_overflow(heap: Heap, overflowed: HeapChunk, damaged: HeapChunk, *, buffer_size: int | None,
                     zero_filled: bool) -> tuple[int, int | None, int, bool, str, bytes]:
    """How far a write ran past ``overflowed``: (usable size, length past the buffer, past usable, exact, basis,
    the bytes from the buffer's end).

    :param buffer_size: the size of the buffer in the chunk, when its owner says (else the usable size is its end)
    :param zero_filled: whether the buffer's slack was zeroed at allocation (calloc): a non-zero byte there
        was written past the buffer
    """
    mmapped = bool(overflowed.flags & IS_MMAPPED)
    usable = overflowed.size - (heap.layout.mmap_overhead if mmapped else SIZE_SZ)
    usable_end = overflowed.mem + usable  # == damaged.address + 8: the size word comes next
    buf_end = overflowed.mem + buffer_size if buffer_size is not None and buffer_size <= usable else usable_end
    reach = min(usable_end + 8 + 512, damaged.address + damaged.size if damaged.size < 1 << 20 else usable_end + 520)
    data = heap.hm.mem.read_prefix(buf_end, max(0, reach - buf_end))
    basis = []
    written_from = None  # first byte known written
    written_to = usable_end  # one past the last byte known written
    if zero_filled and buf_end < usable_end:
        slack = data[: usable_end - buf_end]
        nz = [i for i, b in enumerate(slack) if b]
        if nz:
            written_from = buf_end + nz[0]
            basis.append(f"{len(slack)} bytes of slack after the {buffer_size}-byte buffer, zeroed by calloc, "
                         f"are not all zero")
    # the size word of the damaged header is past the usable size: written
    written_to = usable_end + 8
    basis.append(f"the size word at 0x{usable_end:x} of the chunk after it is not glibc's")
    if written_from is None:
        written_from = usable_end
    # the run of the same bytes beyond the header (a fill or repeated words) is the rest of the write
    known = heap.hm.mem.read_prefix(written_from, written_to - written_from)
    run_end = written_to
    exact = False
    if known:
        if len(set(known)) == 1:
            unit = known[:1]
        elif len(known) % 8 == 0 and len({known[i:i + 8] for i in range(0, len(known), 8)}) == 1:
            unit = known[:8]
        else:
            unit = None
        if unit is not None:
            step = len(unit)
            while run_end + step <= reach and data[run_end - buf_end:run_end - buf_end + step] == unit:
                run_end += step
            if run_end + step <= reach:
                exact = True
                if run_end > written_to:
                    basis.append(f"the same {'byte' if step == 1 else '8-byte word'} ({unit.hex()}) repeats "
                                 f"{run_end - written_to} bytes further, then stops")
    past_usable = run_end - usable_end
    past_buffer = run_end - buf_end if buffer_size is not None else None
    first = heap.hm.mem.read_prefix(buf_end, min(_FIRST_BYTES, max(run_end - buf_end, 8)))
    return usable, past_buffer, past_usable, exact, "; ".join(basis), first


def decide(owner: BufferOwner | None, call: NativeCall | None, past_buffer: int | None,
           is_python: bool, locals_problem: str | None = None) -> tuple[OverflowVerdict, str]:
    """Who wrote past the end: the native callee, the binding that passed the count, or undetermined (why)."""
    if not is_python:
        return OverflowVerdict.UNDETERMINED, "not a Python process: no binding to hold the buffer or the count"
    if owner is None and locals_problem:
        return OverflowVerdict.UNDETERMINED, locals_problem
    if owner is None:
        return OverflowVerdict.UNDETERMINED, ("no variable of the crashing thread's Python frames holds the buffer "
                                              "that overflowed (no ctypes object's buffer is that chunk), so no "
                                              "native call's buffer and count can be matched to it")
    obj = owner.object
    if call is None:
        what = f"{owner.name} ({obj.type_name})" if owner.function else f"{owner.name} (no frame's local any more)"
        return OverflowVerdict.UNDETERMINED, (
            f"{what} is not an argument of a native call in progress on the crashing thread: the call that "
            "wrote it returned before glibc noticed, and the count it was passed is not in the core")
    if call.count is None:
        return OverflowVerdict.UNDETERMINED, (
            f"{call.function or 'the native call'} was passed {owner.name}, but not exactly one integer argument "
            "that could be its count")
    if obj.length is None:
        return OverflowVerdict.UNDETERMINED, f"{owner.name} ({obj.type_name}) is not an array: no element count"
    count_arg = call.arguments[call.count_argument] if call.count_argument is not None else str(call.count)
    caller = f"{call.caller} ({_base(call.file)}:{call.line})"
    callee = f"{call.function or 'the native call'}" + (f" ({_base(call.library)})" if call.library else "")
    if call.count > obj.length:
        return OverflowVerdict.BINDING, (
            f"{caller} passed count={call.count} to {callee} for the {obj.length}-entry {owner.name} "
            f"({obj.type_name}): the callee wrote the {call.count - obj.length} extra "
            f"{'entry' if call.count - obj.length == 1 else 'entries'} the count asked for "
            f"(the count is the call's one integer argument, {count_arg})")
    over = f"{past_buffer} bytes" if past_buffer is not None else "bytes"
    return OverflowVerdict.DRIVER, (
        f"{callee} wrote {over} past the end of the {obj.length}-entry {owner.name} ({obj.type_name}, {obj.size} "
        f"bytes) that {caller} passed with count={call.count}: the buffer was large enough for the count (the "
        f"call's one integer argument, {count_arg})")


def _base(path: str | None) -> str:
    return (path or "?").rsplit("/", 1)[-1]


def _freed_pointer(heap: Heap, frames: Sequence[FrameRegisters], problems: list[str]) -> FreedPointer | None:
    """The chunk glibc's free path was given, from the crashing thread's frames' registers and libc's DWARF."""
    if not frames:
        return None
    path = heap.glibc.library.path

    def in_libc(pc: int) -> bool:
        m = heap.core.find_mapping(pc)
        return m is not None and m.path == path

    def read_u64(addr: int) -> int | None:
        try:
            return heap.hm.u64(addr)
        except HeapValidationError:
            return None

    return find_freed_pointer(heap.glibc, frames, spec_of(heap.core.arch).dwarf_registers, in_libc=in_libc,
                              read_u64=read_u64, problems=problems)


def _given_chunk(heap: Heap, kind: str, given: FreedPointer,
                 problems: list[str]) -> tuple[HeapChunk, str, list[str], int | None] | None:
    """The chunk free() was given as the one check ``kind`` rejected: when it fails the check, or glibc already
    holds it free (a second free that the check caught by a neighbour); None (said why) when it passes.
    The last item is the neighbour whose header the check read, when it is not the next chunk (unlink's)."""
    region = heap.region_of(given.chunk)
    chunk = _chunk(heap, given.chunk, region)
    if chunk is None:
        problems.append(f"the chunk free() was given, 0x{given.chunk:x} ({given.words}), is not in the core")
        return None
    if kind == "bins":  # a check of unlink_chunk while free() merged the chunk with a free neighbour
        unlink = _test_unlink(heap, chunk, region) if region is not None else None
        if unlink is None:
            return None
        return chunk, given.words, unlink[0], unlink[1]
    found = _test(heap, kind, given.chunk, region)
    why = freed_before(heap, given.chunk) if region is not None and kind in _MERGED_FREE else None
    if not found and why is None:
        problems.append(f"the chunk free() was given, 0x{given.chunk:x} ({given.words}), passes this check as the "
                        "core shows it; the chunk named is one of the values the crashing thread holds")
        return None
    state = ChunkState.FREE if why is not None and not found else ChunkState.IN_USE
    return _chunk(heap, given.chunk, region, state) or chunk, given.words, found or [why or ""], None


def _as4(found: tuple[HeapChunk, str, list[str]] | None) -> tuple[HeapChunk, str, list[str], int | None] | None:
    return (*found, None) if found is not None else None


def _locate(heap: Heap, kind: str, tid: int | None, tcaches: Sequence[int], problems: list[str],
            frames: Sequence[FrameRegisters] = ()) -> tuple[HeapChunk, str, list[str], int | None] | None:
    """The chunk check ``kind`` rejected (chunk, where it was found, inconsistencies, the neighbour whose header
    the check read when not the next chunk), or None: the pointer free() was given, read from the frames'
    registers, else among the values the crashing thread holds."""
    if kind == "tcache-double":
        for t in tcaches:
            heap.cached |= tcache_entries(heap.hm, heap.layout, t)
    if kind == "bins":  # unlink's checks: met by free() merging chunks, else by malloc sorting its lists
        given = _freed_pointer(heap, frames, problems)
        found4 = _given_chunk(heap, kind, given, problems) if given is not None else None
        if found4 is not None:
            return found4
    if kind in ("bins", "fast-list", "top-size"):
        return _as4(_list_damage(heap, kind))
    if kind == "tcache-list":
        return _as4(_tcache_damage(heap, tcaches))
    given = _freed_pointer(heap, frames, problems)
    if given is not None:
        found4 = _given_chunk(heap, kind, given, problems)
        if found4 is not None:
            return found4
    found = find_rejected_chunk(heap, kind, tid)
    if found is not None and found[0].state is ChunkState.FREE:
        problems.append("the pointer free() was given was not read from the frames' registers (no libc debug file, "
                        "or no unwound frame keeps it): the chunk named is the first value the crashing thread "
                        "holds that glibc holds free, and another such value would fail this check alike")
    if found is None and kind in _WALKABLE:
        found = _walk_damage(heap, kind)
        if found is not None:
            problems.append("the pointer glibc was freeing is no longer among the values the crashing thread "
                            "holds; the chunk named is the first header of its heap that fails this check")
    return _as4(found)


def _find_overflowed(heap: Heap, kind: str, rejected: HeapChunk, damaged: HeapChunk, inconsistencies: list[str],
                     problems: list[str], tid: int | None = None,
                     hints: Sequence[int] = ()) -> tuple[HeapChunk | None, bool]:
    """(the chunk whose buffer was written past, or None; whether the check caught a chunk freed twice)."""
    overflowed: HeapChunk | None = None
    why_not = None
    double_free = kind in _DOUBLE_FREE
    if not double_free and kind in _MERGED_FREE and heap.region_of(rejected.address) is not None:
        why = freed_before(heap, rejected.address)
        if why is not None:  # glibc holds the chunk free already: freed twice, whatever neighbour the check read
            double_free = True
            if why not in inconsistencies:
                inconsistencies.append(why)
    if kind == "top":
        arena = heap.arena(rejected.arena) if rejected.arena is not None else None
        if arena is not None and (rejected.size > arena.system_mem or rejected.size & (MALLOC_ALIGNMENT - 1)):
            double_free = False  # a top chunk whose size no arena has: written over, not freed twice
            inconsistencies.append(f"its size 0x{rejected.size:x} exceeds the arena's system_mem "
                                   f"0x{arena.system_mem:x}: the top chunk's header was written over")
    if double_free:
        pass  # the verdict says it (a second free, not a write past a buffer)
    elif damaged.address != rejected.address and rejected.address + rejected.size == damaged.address:
        overflowed = rejected
    else:
        near = [a for v in (*hints, *(cand.value for cand in candidates(heap, tid))) for a in (v - 2 * SIZE_SZ, v)]
        overflowed, why_not = find_chunk_before(heap, damaged.address, near)
    if why_not:
        problems.append(why_not)
    return overflowed, double_free


def _add_header_lines(heap: Heap, damaged: HeapChunk, overflowed: HeapChunk | None,
                      inconsistencies: list[str]) -> None:
    """Append what is wrong with the damaged header, except what the inconsistencies already say."""
    said = " ".join(inconsistencies)
    for line in describe_header(heap, damaged, overflowed):
        topic = next((t for t in ("IS_MMAPPED", "NON_MAIN_ARENA", "PREV_INUSE", "prev_size") if t in line),
                     f"size 0x{damaged.size:x}" if line.startswith("size:") else line)
        if topic not in said:
            inconsistencies.append(line)


def _second_free(heap: Heap, rejected: HeapChunk, inconsistencies: Sequence[str]) -> str:
    """The verdict on a double free: the pointer freed twice, its chunk, and what shows glibc held it free."""
    proof = next((i for i in inconsistencies if i.startswith(f"0x{rejected.address:x} ") and "free" in i),
                 None) or next((i for i in inconsistencies if "free" in i or "top chunk" in i), None)
    region = heap.region_of(rejected.address)
    size = "" if region is not None and region.top == rejected.address else f", size 0x{rejected.size:x}"
    return (f"a second free of 0x{rejected.mem:x} (its chunk at 0x{rejected.address:x}{size}), not a write past a "
            "buffer" + (f": {proof}" if proof else "")
            + "; glibc keeps no record of the first free (who made it is not in the core)")


def own_size_rewritten(overflowed: HeapChunk, damaged: HeapChunk, owner: BufferOwner | None,
                       buffer_size: int | None) -> str | None:
    """Why the chunk holding a buffer has its own size word written over, or None: its size cannot hold the buffer
    its owner says it holds (a write before the buffer, or over its own header).  The "next chunk" glibc checked,
    at the chunk plus that size, then lies inside the buffer: its header is the buffer's own bytes, and nothing
    ran past the buffer's end that the core shows."""
    if owner is None or buffer_size is None or overflowed.flags & IS_MMAPPED:
        return None
    usable = overflowed.size - SIZE_SZ
    if buffer_size <= usable:
        return None
    obj = owner.object
    needed = (buffer_size + SIZE_SZ + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1)
    out = (f"the size word of the chunk at 0x{overflowed.address:x} reads 0x{overflowed.size:x}, too small for the "
           f"{buffer_size}-byte {obj.type_name} it holds (its chunk is at least 0x{max(needed, MINSIZE):x}): that "
           "chunk's own header was written over, not the next chunk's")
    inside = damaged.address - obj.buffer
    if damaged.address != overflowed.address and 0 <= inside < buffer_size:
        out += (f"; the next chunk glibc checked, at 0x{damaged.address:x}, lies {inside} bytes inside the buffer"
                + (f" (entry {inside // obj.element_size}, byte {inside % obj.element_size})" if obj.element_size
                   else ""))
    return out


def _true_size(heap: Heap, chunk: HeapChunk, buffer_size: int) -> int | None:
    """The size of the chunk at ``chunk`` that holds a ``buffer_size``-byte buffer, read from the heap after it when
    its own size word was written over: the first size malloc could have given the buffer (its request's chunk
    size, or up to MINSIZE more, a remainder too small to split) at which the next chunk's header is valid, says
    its chunk before is in use, and leads to another valid header or the top; None when no such size is."""
    region = heap.region_of(chunk.address)
    if region is None:
        return None
    needed = max(MINSIZE, (buffer_size + SIZE_SZ + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1))
    for size in range(needed, needed + MINSIZE, MALLOC_ALIGNMENT):
        at = chunk.address + size
        if at == region.top:
            return size
        try:
            nxt = validate_chunk(heap.hm, at, region)
            if not nxt.flags & PREV_INUSE:
                continue
            if at + nxt.size != region.top:
                validate_chunk(heap.hm, at + nxt.size, region)
        except HeapValidationError:
            continue
        return size
    return None


def _owner_of(overflowed: HeapChunk, owners: Sequence[tuple[BufferOwner, NativeCall | None]],
              owner_lookup: Callable[[int, int], BufferOwner | None] | None,
              ) -> tuple[BufferOwner | None, NativeCall | None]:
    """The object whose buffer is in the overflowed chunk, and the native call it was passed to, if known."""
    for own, c in owners:
        if overflowed.mem <= own.object.buffer < overflowed.mem + overflowed.size:
            return own, c
    if owner_lookup is not None:
        return owner_lookup(overflowed.mem, overflowed.size), None
    return None, None


def find_corruption(heap: Heap, message: str | None, tid: int | None, *, tcaches: Sequence[int] = (),
                    owners: Sequence[tuple[BufferOwner, NativeCall | None]] = (),
                    is_python: bool = False, locals_problem: str | None = None,
                    owner_lookup: Callable[[int, int], BufferOwner | None] | None = None,
                    frames: Sequence[FrameRegisters] = (), hints: Sequence[int] = ()) -> HeapCorruption:
    """The anatomy of the corruption behind glibc's ``message`` in the thread ``tid``.

    :param frames: the registers of the thread's frames, innermost first: the pointer free() was given is read
        from them through libc's DWARF before the thread's other values are searched
    :param hints: addresses the thread's Python side holds (buffers, pointers, int locals): starts of the chunks
        followed to a damaged header, beside the thread's native values
    """
    check = classify_message(message)
    if check is None:
        return HeapCorruption(message=message, check="not one of glibc malloc's checks", rejected=None,
                              rejected_found_by=None, damaged=None, inconsistencies=(), overflowed=None,
                              usable_size=None, buffer_size=None, overflow_length=None, overflow_past_usable=None,
                              overflow_exact=False, overflow_basis="", first_bytes="",
                              verdict_reason="glibc's message does not name a malloc check")
    problems: list[str] = []
    found = _locate(heap, check.kind, tid, tcaches, problems, frames)
    if found is None:
        return HeapCorruption(message=message, check=check.looks_at, rejected=None, rejected_found_by=None,
                              damaged=None, inconsistencies=(), overflowed=None, usable_size=None, buffer_size=None,
                              overflow_length=None, overflow_past_usable=None, overflow_exact=False,
                              overflow_basis="", first_bytes="",
                              verdict_reason="the chunk glibc rejected was not found",
                              problems=(f"no value the crashing thread holds (registers, {STACK_WINDOW >> 10} KiB "
                                        "of stack) and no free list points at a chunk that fails this check",))
    rejected, found_by, inconsistencies, neighbour = found
    if neighbour is not None:  # unlink's check on the free neighbour free() merged the chunk with
        damaged = _chunk(heap, neighbour, heap.region_of(neighbour)) or rejected
    elif check.kind in _OWN_HEADER or check.kind in ("bins", "fast-list", "top-size", "tcache-list"):
        damaged = rejected
    else:
        damaged = _chunk(heap, rejected.address + rejected.size, heap.region_of(rejected.address)) or rejected
    overflowed, double_free = _find_overflowed(heap, check.kind, rejected, damaged, inconsistencies, problems, tid,
                                               hints)
    if not double_free:
        _add_header_lines(heap, damaged, overflowed, inconsistencies)
    owner = call = None
    usable = past_buffer = past_usable = None
    exact = False
    basis = ""
    first = b""
    buffer_size = None
    rewritten = None
    if overflowed is not None:
        owner, call = _owner_of(overflowed, owners, owner_lookup)
        if owner is not None and owner.object.buffer == overflowed.mem:
            buffer_size = owner.object.size
        rewritten = own_size_rewritten(overflowed, damaged, owner, buffer_size)
    if overflowed is not None and rewritten is not None and buffer_size is not None:
        # the chunk's own size word was written over: what glibc took for the next chunk is inside the buffer,
        # and no length past the buffer's end is shown (none is made up); the chunk is sized from the heap after
        # it, never from the word written over
        true = _true_size(heap, overflowed, buffer_size)
        inconsistencies.append(rewritten + (
            f"; the next chunk's header is at 0x{overflowed.address + true:x}: the chunk is 0x{true:x} bytes"
            if true is not None else "; no valid header follows where its true size would end it"))
        damaged = overflowed  # its header as read
        overflowed = dataclasses.replace(overflowed, size=true) if true is not None else overflowed
        usable = true - SIZE_SZ if true is not None else None
        basis = "no write past the buffer's end is shown: the chunk's own size word is what was written over"
        first = heap.hm.mem.read_prefix(overflowed.address + SIZE_SZ, SIZE_SZ)
    elif overflowed is not None:
        usable, past_buffer, past_usable, exact, basis, first = measure_overflow(
            heap, overflowed, damaged, buffer_size=buffer_size, zero_filled=owner is not None)
        if call is not None and call.count is not None and owner is not None and owner.object.length \
                and owner.object.element_size and call.count > owner.object.length:
            implied = (call.count - owner.object.length) * owner.object.element_size
            if past_buffer is None or implied > past_buffer:
                extra = call.count - owner.object.length
                basis += (f"; the count passed ({call.count}) asks for {extra} {'entry' if extra == 1 else 'entries'} "
                          f"of {owner.object.element_size} bytes past the end: {implied} bytes")
                past_usable = (past_usable or 0) + implied - (past_buffer or 0)
                past_buffer = implied
                exact = True
    verdict, reason = decide(owner, call, past_buffer, is_python, locals_problem)
    if double_free:
        reason = _second_free(heap, rejected, inconsistencies)
    kind = HeapFailureKind.DOUBLE_FREE if double_free else \
        HeapFailureKind.OVERFLOW if overflowed is not None else HeapFailureKind.UNDETERMINED
    return HeapCorruption(
        message=message, check=check.looks_at, rejected=rejected, rejected_found_by=found_by,
        damaged=None if double_free else damaged,  # a second free damaged no header
        inconsistencies=tuple(inconsistencies), overflowed=overflowed, usable_size=usable, buffer_size=buffer_size,
        overflow_length=past_buffer if past_buffer is not None else past_usable, overflow_past_usable=past_usable,
        overflow_exact=exact, overflow_basis=basis, first_bytes=first.hex(), owner=owner, call=call,
        verdict=verdict, verdict_reason=reason, problems=tuple(problems), kind=kind)
