"""The arenas of a glibc process and the heap regions each one owns.

``main_arena`` owns the brk heap: from ``mp_.sbrk_base`` (else the start of the
core segment holding its top chunk) to the end of its top chunk.  Each thread
arena owns one or more 64 MiB-aligned heaps (``heap_info``) chained through
``prev`` from the heap of its top chunk.  :func:`read_arenas` reads both,
keeping what it read before any link that fails its check.
"""
from __future__ import annotations

from forensics.heap.layout import MALLOC_ALIGNMENT, SIZE_SZ, MallocLayout
from forensics.heap.locate import Glibc
from forensics.heap.walk import (
    HeapMemory,
    HeapValidationError,
    Region,
    for_each_arena,
    for_each_heap_of_arena,
)
from forensics.model import CoreFile

__all__ = ["ArenaInfo", "Heap", "read_arenas", "main_heap_region"]


class ArenaInfo:
    """An arena as read: its fields and its heap regions (mutable while being read).

    A plain class (``dataclass`` compiles its methods at import: a cost of every heap read)."""

    __slots__ = ("address", "kind", "top", "top_size", "system_mem", "attached_threads", "regions", "problems")

    def __init__(self, *, address: int, kind: str, top: int, top_size: int | None, system_mem: int,
                 attached_threads: int, regions: list[Region] | None = None, problems: list[str] | None = None) -> None:
        self.address = address
        self.kind = kind
        self.top = top
        self.top_size = top_size
        self.system_mem = system_mem
        self.attached_threads = attached_threads
        self.regions: list[Region] = [] if regions is None else regions
        self.problems: list[str] = [] if problems is None else problems


class Heap:
    """glibc's heap in one core: where it is, how it is laid out, its arenas."""

    __slots__ = ("glibc", "hm", "core", "arenas", "sbrk_base", "problems", "core_page_size", "cached", "free_index",
                 "list_entries", "walks")

    def __init__(self, *, glibc: Glibc, hm: HeapMemory, core: CoreFile, arenas: list[ArenaInfo], sbrk_base: int | None,
                 problems: list[str], core_page_size: int = 4096, cached: set[int] | None = None) -> None:
        self.glibc = glibc
        self.hm = hm
        self.core = core
        self.arenas = arenas
        self.sbrk_base = sbrk_base
        self.problems = problems
        self.core_page_size = core_page_size
        #: user pointers in tcache lists (filled when a check needs them)
        self.cached: set[int] = set() if cached is None else cached
        #: the free chunks glibc keeps in its arenas' bins, and their top chunks, by address: (address, size, where)
        #: (read once, when a check needs them: :func:`forensics.heap.anatomy.free_chunks`)
        self.free_index: list[tuple[int, int, str]] | None = None
        #: the chunks of every tcache and fastbin list (in use to a walk, yet chunk boundaries), read once when a
        #: walk needs a place to start near its target (:func:`forensics.heap.anatomy.list_entries`)
        self.list_entries: list[int] | None = None
        #: (start, target) -> the chunk whose end reaches target on the walk from start (walk_to's answer): a
        #: second question about the same header walks nowhere
        self.walks: dict[tuple[int, int], tuple[int, int, int]] = {}

    @property
    def layout(self) -> MallocLayout:
        return self.glibc.layout

    def regions(self) -> list[Region]:
        return [r for a in self.arenas for r in a.regions]

    def region_of(self, addr: int) -> Region | None:
        for a in self.arenas:
            for r in a.regions:
                if r.start <= addr < r.end:
                    return r
        return None

    def arena(self, address: int) -> ArenaInfo | None:
        return next((a for a in self.arenas if a.address == address), None)


def main_heap_region(hm: HeapMemory, layout: MallocLayout, core: CoreFile, arena: int, top: int,
                     top_size: int | None, sbrk_base: int | None) -> Region:
    """The main arena's brk heap: from sbrk_base (or its segment's start) to the end of the top chunk."""
    mapping = core.find_mapping(top)
    start = sbrk_base if sbrk_base and sbrk_base <= top else (mapping.start if mapping else top)
    first = start
    misalign = (first + 2 * SIZE_SZ) & (MALLOC_ALIGNMENT - 1)
    if misalign:
        first += MALLOC_ALIGNMENT - misalign
    end = top + (top_size or 0)
    if mapping is not None:
        end = min(end, mapping.end) if top_size else mapping.end
    return Region(start=start, first=first, end=max(end, top + 2 * SIZE_SZ), arena=arena, top=top)


def _arena_info(hm: HeapMemory, layout: MallocLayout, address: int, kind: str) -> ArenaInfo:
    top = hm.u64(address + layout.arena_top)
    try:
        top_size = hm.u64(top + SIZE_SZ) & ~7 if top else None
    except HeapValidationError:
        top_size = None
    return ArenaInfo(address=address, kind=kind, top=top, top_size=top_size,
                     system_mem=hm.u64(address + layout.arena_system_mem),
                     attached_threads=hm.u64(address + layout.arena_attached_threads))


def read_arenas(hm: HeapMemory, glibc: Glibc, core: CoreFile) -> Heap:
    """Every arena and its heap regions; problems say where a chain broke."""
    layout = glibc.layout
    problems: list[str] = []
    sbrk_base = None
    if glibc.mp is not None:
        try:
            sbrk_base = hm.u64(glibc.mp + layout.par_sbrk_base) or None
        except HeapValidationError as e:
            problems.append(f"mp_ at 0x{glibc.mp:x}: {e.reason}")
    addresses: list[int] = []
    try:
        for a in for_each_arena(hm, layout, glibc.main_arena):
            addresses.append(a)
    except HeapValidationError as e:
        problems.append(f"arena list broken at 0x{e.address:x}: {e.reason}")
    arenas: list[ArenaInfo] = []
    for i, address in enumerate(addresses):
        kind = "main" if i == 0 else "thread"
        try:
            info = _arena_info(hm, layout, address, kind)
        except HeapValidationError as e:
            problems.append(f"{kind} arena 0x{address:x}: {e.reason}")
            continue
        if kind == "main":
            if info.top:
                info.regions.append(main_heap_region(hm, layout, core, address, info.top, info.top_size, sbrk_base))
        else:
            try:
                for region in for_each_heap_of_arena(hm, layout, address):
                    info.regions.append(region)
            except HeapValidationError as e:
                info.problems.append(f"heap list broken at 0x{e.address:x}: {e.reason}")
        arenas.append(info)
    return Heap(glibc=glibc, hm=hm, core=core, arenas=arenas, sbrk_base=sbrk_base, problems=problems)
