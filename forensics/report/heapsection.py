"""The report's heap section (#21): which buffer overflowed, by how much, who wrote past it, and the facts that
rests on, worded from an analysis's heap reading (:class:`~forensics.model.HeapReport`)."""
from __future__ import annotations

from typing import Any

from ..model import HeapChunk, HeapCorruption, HeapFailureKind, HeapReport

__all__ = ["heap_section"]


def _hexaddr(v: int | None) -> str:
    return f"0x{v:x}" if v is not None else "?"


def _buffer_phrase(c: HeapCorruption, over: HeapChunk) -> str:
    """The buffer that overflowed: the Python object holding it and the call it was passed to, or the chunk."""
    chunk = (f"the chunk at {_hexaddr(over.address)} (size {_hexaddr(over.size)}, {c.usable_size} usable bytes)"
             if c.usable_size is not None else
             f"the chunk at {_hexaddr(over.address)} (its size word written over, its size not found)")
    owner, call = c.owner, c.call
    if owner is None:
        same = c.rejected is not None and c.rejected.address == over.address
        return chunk + (", the chunk glibc was freeing" if same else "")
    obj = owner.object
    entries = f"{obj.length} entries of {obj.element_size} bytes, " if obj.length is not None and obj.element_size \
        else ""
    where = owner.file.rsplit("/", 1)[-1]
    buffer = (f"`{owner.name}`, a {obj.type_name} ({entries}{obj.size} bytes)"
              + (f", a local of {owner.function} ({where}:{owner.line})" if owner.function else "") + f", in {chunk}")
    if call is not None:
        args = call.arguments
        bi, ci = call.buffer_argument, call.count_argument
        passed = args[bi] if 0 <= bi < len(args) else owner.name
        count = (f" with count={call.count}" + (f" ({args[ci]})" if ci is not None and 0 <= ci < len(args) else "")
                 if call.count is not None else "")
        lib = (call.library or "").rsplit("/", 1)[-1]
        buffer += (f", passed as {passed}{count} to {call.function or 'a native function'}"
                   + (f" in {lib}" if lib else ""))
    return buffer


def _overflow_summary(c: HeapCorruption, over: HeapChunk, *, brief: bool = False) -> str:
    """The heap section's paragraph, conclusion first: who wrote past the buffer (or why the heap cannot
    say), then the chunk, the Python object and the call it was passed to, the overflow and its first bytes."""
    out = [f"Conclusion: {c.verdict_words}: {c.verdict_reason}.", f"The buffer: {_buffer_phrase(c, over)}."]
    if c.overflow_length is None:  # the chunk's own header was written over: no length past the end is shown
        own = next((i for i in c.inconsistencies if "own header was written over" in i), c.overflow_basis)
        out.append(f"No write past the buffer's end is shown: {own}" + (
            "." if brief else f"; glibc aborted with \"{c.message}\" ({c.check})."))
        return " ".join(out)
    length = f"{'' if c.overflow_exact else 'at least '}{c.overflow_length} bytes"
    past = (f"{length} past the {c.buffer_size}-byte buffer's end ({c.overflow_past_usable} past "
            "the chunk's usable size)" if c.buffer_size is not None else f"{length} past its usable size")
    if brief:
        out.append(f"Overflow: {past}.")
        return " ".join(out)
    damaged = c.damaged.address if c.damaged else None
    out.append(f"Overflow: {past}, over the header of the chunk at {_hexaddr(damaged)}; glibc aborted with "
               f"\"{c.message}\" ({c.check}).")
    raw = bytes.fromhex(c.first_bytes or "")
    if raw:
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in raw)
        out.append(f"First bytes past the end: {raw.hex(' ')} ({shown}).")
    return " ".join(out)


def _corruption_lines(c: HeapCorruption) -> list[str]:
    """The facts the heap section's paragraph rests on, one each."""
    lines = []
    if c.rejected is not None:
        lines.append(f"rejected chunk {_hexaddr(c.rejected.address)}, size {_hexaddr(c.rejected.size)}, "
                     f"found in {c.rejected_found_by}")
    lines += [f"inconsistent: {i}" for i in c.inconsistencies]
    if c.overflowed is not None and c.overflow_basis:  # the chunk, the length and the first bytes are in the summary
        lines.append(f"overflow measured by: {c.overflow_basis}")
    if c.call is not None:
        lines.append(f"native call in progress: {c.call.function}({', '.join(c.call.arguments)}) "
                     f"from {c.call.caller} ({c.call.file}:{c.call.line})")
    freed = c.freed_by
    if freed is not None:
        lines.append(f"glibc aborted in {freed.entry}() called by {freed.function} ({c.freed_in or '?'})"
                     + (f" inside {freed.call}" if freed.call else "")
                     + (f"; the Python frame making the call: {freed.python_caller}" if freed.python_caller else ""))
    return lines + [f"note: {p}" for p in c.problems]


def heap_section(heap: HeapReport) -> dict[str, Any] | None:
    """The report's heap section from an analysis's heap reading (#21), None when it has nothing to say:
    {"summary", "brief", "lines"}.

    ``summary`` is one paragraph (which buffer overflowed, by how much, who wrote past it);
    ``brief`` the same without glibc's check and the bytes (for a line in the nvitop issue and the
    runbook); ``lines`` are the facts it rests on, one each.

    >>> from forensics.model import HeapReport
    >>> heap_section(HeapReport(problems=("no libc mapped",)))["summary"]
    "The core's heap could not be read: no libc mapped."
    """
    c = heap.corruption
    if c is None and heap.summary is None and not heap.problems:
        return None
    lines: list[str] = []
    brief = None
    if c is None:
        summary = ("The core's heap could not be read: " + "; ".join(heap.problems) + "." if heap.problems
                   else "The crash is not a heap corruption glibc detected.")
    else:
        if c.overflowed is not None:
            summary = _overflow_summary(c, c.overflowed)
            brief = _overflow_summary(c, c.overflowed, brief=True)
        elif c.kind is HeapFailureKind.DOUBLE_FREE:
            summary = f"Conclusion: {c.verdict_reason}; glibc aborted with \"{c.message}\" ({c.check})."
        elif c.rejected is not None:
            found = "; ".join(c.inconsistencies) or "the overflowing buffer was not found"
            summary = f"glibc rejected the chunk at {_hexaddr(c.rejected.address)} ({c.check}); {found}."
        else:
            summary = f"glibc's check ({c.check}) names no chunk found in the core: " + \
                "; ".join(c.problems or (c.verdict_reason,))
        lines += _corruption_lines(c)
    s = heap.summary
    if s is not None:
        heaps = sum(len(a.heaps) for a in s.arenas)
        broken = [p for a in s.arenas for p in a.problems]
        lines.append(f"glibc {s.glibc_version}: {len(s.arenas)} arena(s), {heaps} heap(s)"
                     + (f"; {len(broken)} problem(s): " + "; ".join(broken[:3]) if broken else ", every chain whole"))
    return {"summary": summary, "brief": brief or summary, "lines": lines}
