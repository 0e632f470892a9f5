"""Find glibc's heap in a core: libc's version, its layout, ``main_arena``, ``mp_`` and each thread's tcache.

In order of preference, each fact from:

* the version: the banner in the libc file the core names (``GNU C Library ...
  release version 2.36.``, matched by build-id), else the file name
  (``libc-2.31.so``);
* the layout and the addresses of ``main_arena`` / ``mp_``: libc's debug file
  (:mod:`.debuginfo`: ``.symtab`` and DWARF), else the layout table and a search
  of libc's writable data for the one arena whose empty bins point at
  themselves, and for the ``malloc_par`` whose ``sbrk_base`` starts the heap;
* a thread's tcache and arena: its static TLS block, found below the thread
  pointer (``fs_base``; above it on AArch64, TLS variant I): at the offsets of
  libc's ``tcache`` / ``thread_arena`` TLS symbols when the debug file gives them (the block's place is the one
  offset that fits every thread), else as the one word in that area that points
  at a valid ``tcache_perthread_struct`` / arena.

Each result says how it was found; nothing here raises for what the core holds.
"""
from __future__ import annotations

import os
import re
import struct

from forensics.core.image import ElfImage
from forensics.core.libc import find_libc
from forensics.core.memory import CoreMemory
from forensics.core.symtab import read_symbols
from forensics.heap.debuginfo import DebugInfoError, cached_struct_layouts, find_libc_debug_file
from forensics.heap.layout import (
    MALLOC_ALIGNMENT,
    NEWEST,
    OLDEST,
    SIZE_SZ,
    LayoutError,
    MallocLayout,
    known_versions,
    layout_for_version,
    layout_from_structs,
    parse_version,
)
from forensics.heap.walk import HeapMemory, HeapValidationError
from forensics.records import record
from forensics.model import CoreFile, Library, LibraryStatus

__all__ = ["Glibc", "HeapUnavailable", "read_glibc_version_file", "find_glibc", "find_thread_tls",
           "TLS_WINDOW"]

_BANNER = re.compile(rb"GNU C Library [^\n\0]{0,200}? version (\d+\.\d+)")
_FILE_VERSION = re.compile(r"libc-(\d+\.\d+)\.so")
_MAX_LIBC = 32 << 20
_SYMBOLS = ("main_arena", "mp_", "tcache", "thread_arena", "_int_malloc")
#: bytes below a thread's fs_base searched for libc's TLS block (static TLS of the executable and libraries)
TLS_WINDOW = 64 << 10


class HeapUnavailable(Exception):
    """The heap cannot be read from this core; the message says why (internal to forensics.heap)."""


@record
class Glibc:
    """glibc in the crashed process, and where its heap bookkeeping is."""

    library: Library
    bias: int
    version: tuple[int, int] | None
    version_source: str
    layout: MallocLayout
    debug_file: str | None
    main_arena: int
    main_arena_source: str
    mp: int | None  # &mp_
    mp_source: str
    tcache_tls: int | None  # offset of the ``tcache`` TLS variable in libc's TLS block (debug symbols)
    arena_tls: int | None  # offset of ``thread_arena``
    build_id: str | None = None  # libc's, as the debug file was found by
    malloc_anchor: int | None = None  # ``_int_malloc``'s link-time address in the debug file: malloc.c's unit

    @property
    def version_text(self) -> str | None:
        return f"{self.version[0]}.{self.version[1]}" if self.version else None


def read_glibc_version_file(path: str) -> tuple[tuple[int, int], str] | None:
    """The version and banner line of a libc file (``GNU C Library ... release version 2.36.``), or None."""
    try:
        with open(path, "rb") as f:
            tail = b""
            read = 0
            while read < _MAX_LIBC:
                block = f.read(1 << 20)
                if not block:
                    break
                read += len(block)
                m = _BANNER.search(tail + block)
                if m:
                    version = parse_version(m.group(1).decode())
                    if version is not None:
                        return version, m.group(0).decode("latin-1")
                tail = block[-300:]
    except OSError:
        return None
    return None


def _version(libc: Library) -> tuple[tuple[int, int] | None, str]:
    if libc.file_path is not None and libc.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED):
        found = read_glibc_version_file(libc.file_path)
        if found is not None:
            return found[0], f"the banner of {libc.file_path}"
    m = _FILE_VERSION.search(libc.path)
    if m:
        return parse_version(m.group(1)), f"the file name {os.path.basename(libc.path)}"
    return None, "unknown (no libc file matching the core's build-id; pass --sysroot)"


def _bias(mem: CoreMemory, libc: Library, page_size: int) -> int:
    image = ElfImage.from_memory(mem, libc.base, page_size)
    if image is not None:
        return image.bias
    if libc.file_path:
        on_disk = ElfImage.from_file(libc.file_path)
        if on_disk is not None:
            loads = [p.vaddr for p in on_disk.phdrs if p.type == 1]
            return libc.base - ((loads[0] if loads else 0) & ~(page_size - 1))
    return libc.base


def _guess_version_from_structs(structs: dict) -> tuple[int, int]:
    """For DWARF of a libc whose banner was not readable: the oldest version with that shape."""
    if "fastbinsY" not in structs.get("malloc_state", {}).get("members", {}):
        return (2, 43)
    if "num_slots" in structs.get("tcache_perthread_struct", {}).get("members", {}):
        return (2, 42)
    if structs.get("_heap_info", {}).get("size") == 48:
        return (2, 35)
    return (2, 31)


def _writable_ranges(core: CoreFile, libc: Library) -> list[tuple[int, int]]:
    """libc's writable mappings and the anonymous one right after them (its .bss)."""
    out = []
    maps = sorted(core.mappings, key=lambda m: m.start)
    for i, m in enumerate(maps):
        if m.path == libc.path and "w" in m.perms:
            out.append((m.start, m.end))
            if i + 1 < len(maps) and maps[i + 1].path is None and maps[i + 1].start == m.end:
                out.append((maps[i + 1].start, maps[i + 1].end))
    return out


def _self_pointing_slots(hm: HeapMemory, ranges: list[tuple[int, int]]) -> list[int]:
    """Addresses p in ``ranges`` where the word at p equals p - 16 (an empty bin's fd) and so does the next (bk)."""
    out = []
    for start, end in ranges:
        try:
            data = hm.mem.read_prefix(start, min(end - start, 1 << 20))
        except Exception:  # noqa: BLE001 - a range the core lacks is simply skipped
            continue
        words = struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])
        for i in range(len(words) - 1):
            p = start + 8 * i
            if words[i] == p - 16 and words[i + 1] == p - 16:
                out.append(p)
    return out


def _arena_score(hm: HeapMemory, layout: MallocLayout, arena: int) -> int:
    """How much the struct at ``arena`` looks like an initialised malloc_state (0: not at all)."""
    try:
        raw = hm.read(arena + layout.arena_bins, (layout.nbins - 1) * 2 * SIZE_SZ)
        top = hm.u64(arena + layout.arena_top)
        nxt = hm.u64(arena + layout.arena_next)
        system_mem = hm.u64(arena + layout.arena_system_mem)
    except HeapValidationError:
        return 0
    if top == 0 or top & (MALLOC_ALIGNMENT - 1) or not hm.readable(top, 16):
        return 0
    if nxt & 7 or system_mem > 1 << 46:
        return 0
    score = 0
    for i in range(1, layout.nbins):
        fd, bk = struct.unpack_from("<QQ", raw, (i - 1) * 16)
        head = layout.bin_address(arena, i)
        if fd == head and bk == head:
            score += 1
        elif fd & (MALLOC_ALIGNMENT - 1) or bk & (MALLOC_ALIGNMENT - 1):
            return 0
    return score


def _search_main_arena(hm: HeapMemory, layouts: list[MallocLayout],
                       ranges: list[tuple[int, int]]) -> tuple[int, MallocLayout] | None:
    slots = _self_pointing_slots(hm, ranges)
    if not slots:
        return None
    best: tuple[int, int, MallocLayout] | None = None
    first = slots[0]
    for layout in layouts:
        for k in range(layout.nbins - 1):
            arena = first - layout.arena_bins - 16 * k
            score = _arena_score(hm, layout, arena)
            if score and (best is None or score > best[0]):
                best = (score, arena, layout)
    if best is None or best[0] < (best[2].nbins - 1) // 4:
        return None
    return best[1], best[2]


def _search_mp(hm: HeapMemory, layout: MallocLayout, ranges: list[tuple[int, int]], core: CoreFile,
               main_arena: int) -> int | None:
    """The ``malloc_par`` whose sbrk_base starts the main heap, with a sane tcache setup: the start of the
    mapping holding the top chunk, or a page boundary inside it below the top (qemu-user's brk follows the
    program's .bss in one mapping; a kernel's brk is a mapping of its own)."""
    try:
        top = hm.u64(main_arena + layout.arena_top)
    except HeapValidationError:
        return None
    heap_map = core.find_mapping(top)
    if heap_map is None:
        return None
    for start, end in ranges:
        data = hm.mem.read_prefix(start, min(end - start, 1 << 20))
        for off in range(0, len(data) - layout.par_size + 1, 8):
            sbrk = struct.unpack_from("<Q", data, off + layout.par_sbrk_base)[0]
            if sbrk != heap_map.start and not (heap_map.start < sbrk <= top and not sbrk & 0xFFF):
                continue
            bins, count = struct.unpack_from("<QQ", data, off + layout.par_tcache_bins)[0], \
                struct.unpack_from("<Q", data, off + layout.par_tcache_count)[0]
            threshold = struct.unpack_from("<Q", data, off + layout.par_mmap_threshold)[0]
            if 0 < bins <= 128 and count <= 0xFFFF and threshold <= 1 << 32:
                return start + off
    return None


def _candidate_layouts(layout: MallocLayout | None, version: tuple[int, int] | None) -> list[MallocLayout]:
    """The layouts to try: the debug file's, else the table's of the version, else (unknown version) every
    distinct shape the table holds, newest first."""
    if layout is not None:
        return [layout]
    if version is not None:
        return [layout_for_version(version)]
    seen_shapes = set()
    candidates = []
    for v in reversed(known_versions()):
        cand = layout_for_version(v)
        shape = (cand.arena_bins, cand.arena_size, cand.heap_info_size, cand.tcache_size)
        if shape not in seen_shapes:
            seen_shapes.add(shape)
            candidates.append(cand)
    return candidates


def find_glibc(core: CoreFile, mem: CoreMemory, *, sysroot: str | None = None,
               page_size: int = 4096, debug_info: bool = True) -> Glibc:
    """Where glibc's heap bookkeeping is in this core.

    :param debug_info: use libc's debug file when there is one (False: the table and the searches only)

    :raises HeapUnavailable: when the process has no libc, its version is outside
        2.31-2.43 with no debug file, or no arena can be found
    """
    libc = find_libc(core.libraries)
    if libc is None:
        raise HeapUnavailable("no libc mapped (a static program or not glibc): the heap cannot be located")
    hm = HeapMemory(mem)
    bias = _bias(mem, libc, page_size)
    version, version_source = _version(libc)
    usable = libc.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
    # the build-id the core holds; else (its first page not dumped: qemu-user's cores) the one of the file the
    # core reader took for it, unverified as that file is
    build_id = libc.build_id or (libc.file_build_id if usable else None)
    debug = find_libc_debug_file(build_id, sysroot=sysroot, library_file=libc.file_path if usable else None) \
        if debug_info else None
    symbols = {}
    layout: MallocLayout | None = None
    problems = []
    if debug is not None:
        try:
            symbols = read_symbols(debug, _SYMBOLS)
            anchor = symbols.get("_int_malloc")
            if anchor is not None:
                structs = cached_struct_layouts(debug, build_id or "unknown", anchor.value)
                layout = layout_from_structs(version or _guess_version_from_structs(structs), structs,
                                             f"DWARF of {debug}")
        except (OSError, DebugInfoError, LayoutError) as e:
            problems.append(f"{debug}: {e}")
            layout = None
    if version is not None and not OLDEST <= version <= NEWEST and layout is None:
        raise HeapUnavailable(
            f"glibc {version[0]}.{version[1]} is outside the versions the layout table knows "
            f"({OLDEST[0]}.{OLDEST[1]}-{NEWEST[0]}.{NEWEST[1]}) and no debug file for it was found "
            "(install libc6-dbg where --sysroot points)")
    candidates = _candidate_layouts(layout, version)
    ranges = _writable_ranges(core, libc)
    main_arena = None
    source = ""
    if "main_arena" in symbols:
        main_arena = bias + symbols["main_arena"].value
        source = f"symbol main_arena in {debug}"
        layout = candidates[0]
    else:
        found = _search_main_arena(hm, candidates, ranges)
        if found is not None:
            main_arena, layout = found
            source = "search of libc's writable data (the arena whose empty bins point at themselves)"
    if main_arena is None or layout is None:
        why = "; ".join(problems) if problems else "no initialised malloc_state in libc's writable data"
        raise HeapUnavailable(f"main_arena not found ({why})")
    if version is None:
        version_source += f"; layout of glibc {layout.version_text} fits"
    mp = None
    mp_source = "not found"
    if "mp_" in symbols:
        mp, mp_source = bias + symbols["mp_"].value, f"symbol mp_ in {debug}"
    else:
        mp = _search_mp(hm, layout, ranges, core, main_arena)
        if mp is not None:
            mp_source = "search of libc's writable data (the malloc_par whose sbrk_base starts the heap)"
    tls = {k: symbols[k].value for k in ("tcache", "thread_arena") if k in symbols and symbols[k].type == 6}
    return Glibc(library=libc, bias=bias, version=version, version_source=version_source, layout=layout,
                 debug_file=debug, main_arena=main_arena, main_arena_source=source, mp=mp, mp_source=mp_source,
                 tcache_tls=tls.get("tcache"), arena_tls=tls.get("thread_arena"), build_id=build_id,
                 malloc_anchor=symbols["_int_malloc"].value if "_int_malloc" in symbols else None)


def _tls_windows(hm: HeapMemory, fs_bases: list[int], above: bool) -> dict[int, tuple[int, list[int]]]:
    """``{thread pointer: (lowest address, words)}``: the :data:`TLS_WINDOW` bytes below each thread pointer
    (above it for TLS variant I), or what the core holds of them next to it."""
    windows: dict[int, tuple[int, list[int]]] = {}
    for fs in fs_bases:
        if not fs:
            continue
        if above:
            data = hm.mem.read_prefix(fs, TLS_WINDOW)
            windows[fs] = (fs, list(struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])))
            continue
        lo = max(0, fs - TLS_WINDOW)
        data = hm.mem.read_prefix(lo, fs - lo)
        if len(data) < fs - lo:  # the window starts in memory the core lacks: take what ends at fs
            for shift in range(1, 16):
                lo2 = fs - (TLS_WINDOW >> shift)
                data = hm.mem.read_prefix(lo2, fs - lo2)
                if len(data) == fs - lo2:
                    lo = lo2
                    break
            else:
                continue
        windows[fs] = (lo, list(struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])))
    return windows


def find_thread_tls(hm: HeapMemory, glibc: Glibc, fs_bases: list[int], is_tcache, is_arena, *,
                    above: bool = False) -> dict[int, tuple]:
    """``{fs_base: (tcache, arena, how)}`` for each thread, from its static TLS area.

    :param fs_bases: each thread's thread pointer (x86-64's fs_base, AArch64's TPIDR_EL0)
    :param is_tcache: predicate on an address: a valid ``tcache_perthread_struct``
    :param is_arena: predicate on an address: a known arena
    :param above: TLS variant I (AArch64): the static TLS blocks lie above the thread pointer (after the
        16-byte TCB it points at), not below it as in variant II (x86-64)
    """
    windows = _tls_windows(hm, fs_bases, above)
    out: dict[int, tuple] = {}
    if glibc.tcache_tls is not None and glibc.arena_tls is not None:
        # libc's TLS block is at the same offset below every thread pointer: the offset that fits most threads
        votes: dict[int, int] = {}
        for fs, (lo, words) in windows.items():
            for i, w in enumerate(words):
                if w and is_arena(w):
                    block = lo + 8 * i - glibc.arena_tls
                    tc_index = (block + glibc.tcache_tls - lo) // 8
                    if 0 <= tc_index < len(words) and (words[tc_index] == 0 or is_tcache(words[tc_index])):
                        votes[fs - block] = votes.get(fs - block, 0) + 1
        if votes:
            offset = max(votes, key=lambda k: votes[k])
            for fs, (lo, words) in windows.items():
                block = fs - offset
                vals = []
                for sym in (glibc.tcache_tls, glibc.arena_tls):
                    idx = (block + sym - lo) // 8
                    vals.append(words[idx] if 0 <= idx < len(words) else None)
                where = f"thread pointer+0x{-offset:x}" if offset < 0 else f"fs_base-0x{offset:x}"
                out[fs] = (vals[0] or None, vals[1] or None,
                           f"libc's TLS block at {where} (tcache and thread_arena symbols)")
            return out
    side = "above the thread pointer" if above else "below fs_base"
    for fs, (_lo, words) in windows.items():
        tcaches = {w for w in words if w and is_tcache(w)}
        arenas = {w for w in words if w and is_arena(w)}
        out[fs] = (next(iter(tcaches)) if len(tcaches) == 1 else None,
                   next(iter(arenas)) if len(arenas) == 1 else None,
                   f"the one pointer to a tcache {side}" if len(tcaches) == 1 else
                   f"{len(tcaches)} candidate tcache pointers {side}")
    return out
