"""Text of ``forensics analyze``'s heap report: a corruption's anatomy, arenas, bins and tcaches.

Strings from the crashed process (type names, file names, glibc's message) are escaped with the
whole line (:func:`forensics.text.analysis.format_analysis`, then :func:`forensics.commands.emit`).
"""
from __future__ import annotations

from collections.abc import Iterator

from ..model import HeapArena, HeapBin, HeapChunk, HeapCorruption, HeapFailureKind, HeapReport, HeapSummary

__all__ = ["format_heap", "format_heap_corruption", "format_heap_summary"]


def _ascii(raw: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 else "." for b in raw)


def _flag_names(flags: int) -> str:
    names = [n for bit, n in ((1, "PREV_INUSE"), (2, "IS_MMAPPED"), (4, "NON_MAIN_ARENA")) if flags & bit]
    return "|".join(names) or "no flags"


def _chunk(c: HeapChunk) -> str:
    return f"0x{c.address:x}, size 0x{c.size:x} ({_flag_names(c.flags)})"


def format_heap_corruption(c: HeapCorruption) -> Iterator[str]:
    """Lines for a heap corruption, the verdict first: who wrote past the buffer (or why the heap cannot
    say), then the rejected chunk, the buffer, the overflow and the native call."""
    if c.kind is HeapFailureKind.DOUBLE_FREE:  # who wrote past a buffer does not apply: none was
        yield f"  verdict:         {c.kind.value}: {c.verdict_reason}"
    else:
        yield f"  verdict:         {c.verdict.value} ({c.verdict_words}): {c.verdict_reason}"
    yield f"  glibc checked:   {c.check}" + (f' ("{c.message}")' if c.message else "")
    if c.rejected is not None:
        yield f"  rejected chunk:  {_chunk(c.rejected)}, state {c.rejected.state.value}" + (
            f"; found in {c.rejected_found_by}" if c.rejected_found_by else "")
    if c.damaged is not None and (c.rejected is None or c.damaged.address != c.rejected.address):
        yield f"  damaged header:  {_chunk(c.damaged)}"
    for i in c.inconsistencies:
        yield f"    - {i}"
    if c.overflowed is not None:
        own = c.damaged is not None and c.damaged.address == c.overflowed.address and c.overflow_length is None
        usable = f"usable size {c.usable_size} bytes (0x{c.usable_size:x})" if c.usable_size is not None else \
            "its size not found (its size word was written over)"
        yield (f"  overflowed:      chunk {_chunk(c.overflowed)}: {usable}, "
               + ("the chunk whose own header was written over" if own else "the chunk before the damaged header"))
        if c.owner is not None:
            o = c.owner.object
            count = f", {o.length} x {o.element_size} bytes" if o.length is not None and o.element_size else ""
            where = (f"a local of {c.owner.function} ({c.owner.file}:{c.owner.line})" if c.owner.function
                     else f"no frame's local: held only on the {c.owner.file}")
            yield (f"  buffer:          {c.owner.name} = {o.type_name} ({o.size} bytes{count}) at "
                   f"0x{o.buffer:x}, {where}")
        if c.overflow_length is not None:
            length = f"{'' if c.overflow_exact else 'at least '}{c.overflow_length} bytes"
            if c.buffer_size is not None:
                yield (f"  overflow:        {length} past the {c.buffer_size}-byte buffer's end "
                       f"({c.overflow_past_usable} past the chunk's usable size)")
            else:
                yield f"  overflow:        {length} past the chunk's usable size"
            if c.overflow_basis:
                yield f"    measured by:   {c.overflow_basis}"
        if c.first_bytes:
            raw = bytes.fromhex(c.first_bytes)
            label = "its size word: " if own else "first bytes:    "
            yield f"  {label} {raw.hex(' ')}  |{_ascii(raw)}|"
    if c.call is not None:
        call = c.call
        yield (f"  native call:     {call.function or '?'}({', '.join(call.arguments)}) from "
               f"{call.caller} ({call.file}:{call.line})")
    if c.freed_by is not None:
        f = c.freed_by
        lib = (f.library or "?").rsplit("/", 1)[-1]
        yield (f"  freed by:        {f.entry}() called by {f.function} ({lib})"
               + (f" during {f.call}" if f.call else "")
               + (f", Python frame {f.python_caller}" if f.python_caller else ""))
    for p in c.problems:
        yield f"  note: {p}"


def _bins(bins: tuple[HeapBin, ...], per_line: int = 8) -> Iterator[str]:
    """The bins, a few per line: ``small 0x30 x7``, ``large #64 x2``, a broken one with its address."""
    parts = []
    for b in bins:
        size = f" 0x{b.chunk_size:x}" if b.chunk_size else ("" if b.kind == "unsorted" else f" #{b.index}")
        parts.append(f"{b.kind}{size} x{b.count}" + (f" (broken at 0x{b.broken_at:x})" if b.broken_at else ""))
    if not parts:
        yield "all empty"
    for i in range(0, len(parts), per_line):
        yield ", ".join(parts[i:i + per_line])


def _arena_lines(a: HeapArena) -> Iterator[str]:
    top = f"top 0x{a.top:x}" + (f" (0x{a.top_size:x} bytes)" if a.top_size is not None else "")
    yield f"  arena 0x{a.address:x} ({a.kind}): {top}, system_mem 0x{a.system_mem:x}, {a.attached_threads} thread(s)"
    for h in a.heaps:
        yield (f"    heap 0x{h.start:x}-0x{h.end:x}: {h.chunks_in_use:,} chunks in use ({h.bytes_in_use:,} bytes), "
               f"{h.chunks_free:,} free ({h.bytes_free:,} bytes)")
    for i, line in enumerate(_bins(a.bins)):
        yield f"    {'bins: ' if i == 0 else '      '}{line}"
    for p in a.problems:
        yield f"    problem: {p}"


def format_heap_summary(s: HeapSummary) -> Iterator[str]:
    """Lines for ``analyze --heap``: glibc, every arena and its heaps, bins and the threads' tcaches."""
    yield f"  glibc {s.glibc_version} ({s.version_source}); layout: {s.layout_source}"
    if s.main_arena is not None:
        yield f"  main_arena 0x{s.main_arena:x} ({s.main_arena_source})"
    mm = (f"; {s.mmapped_chunks} mmapped chunk(s), {s.mmapped_bytes:,} bytes"
          if s.mmapped_chunks is not None and s.mmapped_bytes is not None else "")
    if s.sbrk_base is not None or mm:
        yield f"  sbrk_base {f'0x{s.sbrk_base:x}' if s.sbrk_base is not None else '?'}{mm}"
    for a in s.arenas:
        yield from _arena_lines(a)
    for t in s.tcaches:
        where = f"0x{t.address:x}" if t.address is not None else "not found"
        arena = f", arena 0x{t.arena:x}" if t.arena is not None else ""
        yield f"  tcache of tid {t.tid}: {where}{arena} ({t.found_by})"
        for line in _bins(t.bins):
            yield f"      {line}"
    for p in s.problems:
        yield f"  problem: {p}"


def format_heap(report: HeapReport) -> Iterator[str]:
    """The heap section of ``analyze``: the corruption's anatomy, then (``--heap``) the summary."""
    if report.corruption is not None:
        yield "Heap corruption:"
        yield from format_heap_corruption(report.corruption)
    if report.summary is not None:
        if report.corruption is not None:
            yield ""
        yield "Heap:"
        yield from format_heap_summary(report.summary)
    if report.corruption is None and report.summary is None:
        yield "Heap: not read"
    for p in report.problems:
        yield f"  problem: {p}"
