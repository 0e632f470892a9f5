"""Render analyses for people (lines of text) and for programs (the ``analysis`` JSON object).

Formatters yield lines and never print; only the CLI writes them out.  The JSON
document (:func:`forensics.output.json_document`) is the contract; the text may change.
"""
from __future__ import annotations

import datetime as _dt
from typing import Iterable, Iterator

from .analyze.signature import describe_later_fault, describe_pyframe, describe_thread, exit_explanation, signature
from .analyze.stacks import merge_frames
from .model import (
    Analysis,
    BatchResult,
    FrameKind,
    HeapArena,
    HeapBin,
    HeapChunk,
    HeapCorruption,
    HeapReport,
    HeapSummary,
    NativeFrame,
    Thread,
)
from .output import escape_text, to_jsonable

__all__ = [
    "format_analysis",
    "format_thread",
    "format_batch",
    "format_heap",
    "format_heap_corruption",
    "format_heap_summary",
    "analysis_payload",
]

_MAX_LINE = 200


def analysis_payload(analysis: Analysis, *, merged: bool = False) -> dict:
    """The ``analysis`` object of ``forensics analyze --json``."""
    data = to_jsonable(analysis)
    data["signature"] = signature(analysis)
    data["crash"]["exit_status"] = analysis.crash.exit_status
    data["exit_explanation"] = exit_explanation(analysis)
    if merged:
        for t_json, thread in zip(data["snapshot"]["threads"], analysis.snapshot.threads):
            t_json["merged"] = [
                {"kind": kind.value, **to_jsonable(frame)} for kind, frame in merge_frames(thread)
            ]
    return data


def _native_line(f: NativeFrame) -> str:
    sym = f.symbol or "??"
    off = f"+{f.offset}" if f.offset else ""
    mark = " [inlined]" if f.inlined else (" [tail call]" if f.tailcall else "")
    where = f" at {f.file}:{f.line}" if f.file and f.line else ""
    return f"#{f.index:<3} 0x{f.pc:016x} {sym}{off}{mark} ({f.library_name or '?'}){where}"


def _signal_line(sf) -> str:
    how = {"siginfo": f"si_code {sf.signal.code}", "registers": "read from the interrupted registers",
           "unknown": "signal unknown"}.get(sf.signal_source, sf.signal_source)
    stack = ", on the alternate signal stack" if sf.alternate_stack else ""
    return f"--- {sf.signal.name} ({how}) delivered here{stack}: above ran its handler, below was interrupted ---"


def format_thread(thread: Thread, *, merged: bool = False, native: bool = True,
                  first_fault: bool = False) -> Iterator[str]:
    """Lines for one thread: its header, its Python stack, then (or merged with) its native stack; each
    signal frame (a handler running on top of what it interrupted) is marked where it splits them."""
    flags = []
    if thread.is_crashed:
        flags.append("crashed")
    if first_fault and not thread.is_crashed:
        flags.append("first fault")
    if thread.holds_gil:
        flags.append("holds the GIL")
    if thread.interpreter_id:
        flags.append(f"in interpreter {thread.interpreter_id}")
    flag = f"  [{', '.join(flags)}]" if flags else ""
    yield f"Thread {describe_thread(thread)}{flag}"
    native_marks = {sf.native_index: sf for sf in thread.signal_frames if sf.native_index is not None}
    py_marks = {sf.py_index: sf for sf in thread.signal_frames if sf.py_index}
    if thread.signal_frames and not native_marks:
        for sf in thread.signal_frames:
            yield (f"  {_signal_line(sf)[4:-4]} (interrupted at 0x{sf.pc:x}; the native stack was not unwound, "
                   "so the handler's frames are not told apart)")
    interp = None if not any(f.interpreter_id for f in thread.py_frames) else -1  # label only with subinterpreters
    if merged:
        for kind, frame in merge_frames(thread):
            if kind is FrameKind.PYTHON:
                if interp is not None and frame.interpreter_id != interp:
                    interp = frame.interpreter_id
                    yield f"    [interpreter {interp}]"
                yield f"    (Python) {describe_pyframe(frame)}"
            else:
                yield f"    {_native_line(frame)}"
                if frame.index in native_marks:
                    yield f"    {_signal_line(native_marks[frame.index])}"
        if thread.python_error:
            yield f"    (Python stack incomplete: {thread.python_error})"
    else:
        if thread.py_frames or thread.python_error:
            yield "  Python stack (most recent call first):"
            for i, p in enumerate(thread.py_frames):
                if i in py_marks:
                    yield f"    {_signal_line(py_marks[i])}"
                if interp is not None and p.interpreter_id != interp:
                    interp = p.interpreter_id
                    yield f"    [interpreter {interp}]"
                yield f"    {describe_pyframe(p)}"
            if thread.python_error:
                yield f"    (Python stack incomplete: {thread.python_error})"
        if native:
            yield "  Native stack:"
            for f in thread.native_frames:
                yield f"    {_native_line(f)}"
                if f.index in native_marks:
                    yield f"    {_signal_line(native_marks[f.index])}"
    if thread.native_error:
        yield f"    ({thread.native_error})"


def format_analysis(analysis: Analysis, *, merged: bool = False, libraries: bool = True) -> Iterator[str]:
    """The human summary: signature first, then the crash, findings, threads and libraries.

    Names, paths and messages come from the crashed process: every line has its control
    characters escaped, so a hostile thread or file name cannot drive the terminal.
    """
    for line in _analysis_lines(analysis, merged=merged, libraries=libraries):
        yield _safe(line)


def _analysis_lines(analysis: Analysis, *, merged: bool, libraries: bool) -> Iterator[str]:
    snap = analysis.snapshot
    core = snap.core
    crash = analysis.crash
    yield signature(analysis)
    yield ""
    yield f"Core:        {core.path} ({core.size:,} bytes{', TRUNCATED' if core.truncated else ''})"
    yield f"Process:     pid {core.pid}, {core.executable or core.command}"
    if core.args:
        yield f"Command:     {core.args[:_MAX_LINE]}"
    same = core.signal is not None and crash.then is None and crash.signal == core.signal.signo
    yield f"Signal:      {crash.signal_name or 'none'}" + (f" (si_code {core.signal.code})" if same else "")
    if crash.abort_message:
        yield f"Abort:       {crash.abort_message}"
    if crash.fault_address is not None:
        fk = crash.fault_kind.value if crash.fault_kind else "?"
        yield f"Fault:       0x{crash.fault_address:x} ({fk})"
    yield f"Crash class: {crash.kind.value}" + (" (a core of a live process: no crash)" if analysis.fingerprint is None
                                                else "")
    if crash.handler is not None:
        label = crash.handler.label
        kind = "" if crash.handler.kind.value == label else f" ({crash.handler.kind.value})"
        yield f"Handler:     {crash.signal_name} handler {label}{kind}"
    if crash.then is not None:
        yield f"Then:        {describe_later_fault(analysis)}"
    explanation = exit_explanation(analysis)
    if explanation:
        yield f"Exit:        {explanation}"
    if analysis.fingerprint is None:
        yield "Fingerprint: none (a snapshot is not a crash)"
    else:
        partial = f" (partial: {analysis.fingerprint_partial})" if analysis.fingerprint_partial else ""
        yield f"Fingerprint: {analysis.fingerprint}{partial}"
    if snap.python_version:
        yield f"Python:      {snap.python_version}"
    layout = f" ({snap.python_layout})" if snap.python_layout and snap.python_method != "none" else ""
    yield (f"Stacks:      native by {snap.native_method}; Python by {snap.python_method}{layout}: "
           f"{snap.python_stack_status}")
    if core.nvml is not None:
        n = core.nvml
        yield f"NVML:        {n.path} driver {n.driver_version or '?'} build-id {n.build_id or '?'}"
    for w in snap.warnings:
        yield f"warning: {w}"
    if analysis.findings:
        yield ""
        yield "Findings:"
        for f in analysis.findings:
            yield f"  [{f.severity.value}] {f.rule}: {f.summary}"
    if analysis.heap is not None:
        yield ""
        yield from format_heap(analysis.heap)
    for thread in snap.threads:
        yield ""
        yield from format_thread(thread, merged=merged, first_fault=thread.tid == crash.tid)
    if libraries:
        yield ""
        yield "Mapped libraries:"
        for lib in core.libraries:
            yield f"  {lib.status.value:<17} {lib.build_id or '-':<40} {lib.path}"


def _safe(text: str) -> str:
    """Text from the crashed process with its control characters escaped (``\\x1b``), for a terminal."""
    return escape_text(text)


def _ascii(raw: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 else "." for b in raw)


def _flag_names(flags: int) -> str:
    names = [n for bit, n in ((1, "PREV_INUSE"), (2, "IS_MMAPPED"), (4, "NON_MAIN_ARENA")) if flags & bit]
    return "|".join(names) or "no flags"


def _chunk(c: HeapChunk) -> str:
    return f"0x{c.address:x}, size 0x{c.size:x} ({_flag_names(c.flags)})"


def format_heap_corruption(c: HeapCorruption) -> Iterator[str]:
    """Lines for the anatomy of a heap corruption: the rejected chunk, the buffer, the overflow, the verdict."""
    yield f"  glibc checked:   {c.check}" + (f' ("{_safe(c.message)}")' if c.message else "")
    if c.rejected is not None:
        yield f"  rejected chunk:  {_chunk(c.rejected)}, state {c.rejected.state.value}" + (
            f"; found in {c.rejected_found_by}" if c.rejected_found_by else "")
    if c.damaged is not None and (c.rejected is None or c.damaged.address != c.rejected.address):
        yield f"  damaged header:  {_chunk(c.damaged)}"
    for i in c.inconsistencies:
        yield f"    - {_safe(i)}"
    if c.overflowed is not None:
        yield (f"  overflowed:      chunk {_chunk(c.overflowed)}: usable size {c.usable_size} bytes "
               f"(0x{c.usable_size or 0:x}), the chunk before the damaged header")
        if c.owner is not None:
            o = c.owner.object
            count = f", {o.length} x {o.element_size} bytes" if o.length is not None and o.element_size else ""
            where = (f"a local of {_safe(c.owner.function)} ({_safe(c.owner.file)}:{c.owner.line})" if c.owner.function
                     else f"no frame's local: held only on the {_safe(c.owner.file)}")
            yield (f"  buffer:          {_safe(c.owner.name)} = {_safe(o.type_name)} ({o.size} bytes{count}) at "
                   f"0x{o.buffer:x}, {where}")
        if c.overflow_length is not None:
            length = f"{'' if c.overflow_exact else 'at least '}{c.overflow_length} bytes"
            if c.buffer_size is not None:
                yield (f"  overflow:        {length} past the {c.buffer_size}-byte buffer's end "
                       f"({c.overflow_past_usable} past the chunk's usable size)")
            else:
                yield f"  overflow:        {length} past the chunk's usable size"
            if c.overflow_basis:
                yield f"    measured by:   {_safe(c.overflow_basis)}"
        if c.first_bytes:
            raw = bytes.fromhex(c.first_bytes)
            yield f"  first bytes:     {raw.hex(' ')}  |{_ascii(raw)}|"
    if c.call is not None:
        call = c.call
        yield (f"  native call:     {_safe(call.function or '?')}({', '.join(_safe(a) for a in call.arguments)}) from "
               f"{_safe(call.caller)} ({_safe(call.file)}:{call.line})")
    yield f"  verdict:         {c.verdict.value}: {_safe(c.verdict_reason)}"
    for p in c.problems:
        yield f"  note: {_safe(p)}"


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
        yield f"    problem: {_safe(p)}"


def format_heap_summary(s: HeapSummary) -> Iterator[str]:
    """Lines for ``analyze --heap``: glibc, every arena and its heaps, bins and the threads' tcaches."""
    yield f"  glibc {s.glibc_version} ({_safe(s.version_source)}); layout: {_safe(s.layout_source)}"
    if s.main_arena is not None:
        yield f"  main_arena 0x{s.main_arena:x} ({_safe(s.main_arena_source)})"
    mm = (f"; {s.mmapped_chunks} mmapped chunk(s), {s.mmapped_bytes:,} bytes"
          if s.mmapped_chunks is not None and s.mmapped_bytes is not None else "")
    if s.sbrk_base is not None or mm:
        yield f"  sbrk_base {'0x%x' % s.sbrk_base if s.sbrk_base is not None else '?'}{mm}"
    for a in s.arenas:
        yield from _arena_lines(a)
    for t in s.tcaches:
        where = f"0x{t.address:x}" if t.address is not None else "not found"
        arena = f", arena 0x{t.arena:x}" if t.arena is not None else ""
        yield f"  tcache of tid {t.tid}: {where}{arena} ({_safe(t.found_by)})"
        for line in _bins(t.bins):
            yield f"      {line}"
    for p in s.problems:
        yield f"  problem: {_safe(p)}"


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
        yield f"  problem: {_safe(p)}"


def _ts(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def format_batch(result: BatchResult) -> Iterable[str]:
    """The fingerprint table of a batch: distinct crashes, most frequent first; then what was partial,
    unreadable, a snapshot, metadata only or skipped -- every input is accounted for.  Control
    characters (in file names, signatures) are escaped."""
    for line in _batch_lines(result):
        yield _safe(line)


def _batch_lines(result: BatchResult) -> Iterable[str]:
    analyzed = sum(g.count for g in result.groups)
    head = [f"{result.total} inputs: {analyzed} cores analyzed ({result.partial} partial)",
            f"{len(result.groups)} distinct crashes", f"{len(result.failed)} unreadable"]
    if result.snapshots:
        head.append(f"{len(result.snapshots)} snapshots (no crash)")
    if result.metadata_only:
        head.append(f"{len(result.metadata_only)} metadata only")
    head.append(f"{len(result.skipped)} files skipped (not cores)")
    yield ", ".join(head)
    yield ""
    yield f"{'COUNT':>5}  {'PARTIAL':>7}  {'FINGERPRINT':<12}  {'FIRST SEEN':<20}  {'LAST SEEN':<20}  SIGNATURE"
    for g in result.groups:
        yield (f"{g.count:>5}  {len(g.partial) or '':>7}  {g.fingerprint:<12}  {_ts(g.first_seen):<20}  "
               f"{_ts(g.last_seen):<20}  {g.signature}")
        yield f"{'':>5}  example: {g.example}"
        for why in g.partial:
            yield f"{'':>5}  partial (its fingerprint may differ): {why}"
    if result.failed:
        yield ""
        yield "Unreadable:"
        for e in result.failed:
            error = e.error or "?"
            yield f"  {error}" if error.startswith(e.path) else f"  {e.path}: {error}"
    if result.snapshots:
        yield ""
        yield "Snapshots of live processes (no crash, no fingerprint):"
        for e in result.snapshots:
            yield f"  {_ts(e.mtime)}  {e.path}"
    if result.metadata_only:
        yield ""
        yield "Metadata only:"
        for e in result.metadata_only:
            yield f"  {_ts(e.mtime)}  {e.path}: metadata only (no core kept: {e.no_core})"
    if result.skipped:
        yield ""
        yield f"Skipped (not cores): {len(result.skipped)} files"
        for path in result.skipped[:20]:
            yield f"  {path}"
        if len(result.skipped) > 20:
            yield f"  ... and {len(result.skipped) - 20} more"
