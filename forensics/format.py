"""Render analyses for people (lines of text) and for programs (the ``analysis`` JSON object).

Formatters yield lines and never print; only the CLI writes them out.  The JSON
document (:func:`forensics.output.json_document`) is the contract; the text may change.
"""
from __future__ import annotations

import datetime as _dt
from typing import Iterable, Iterator

from .analyze.signature import describe_pyframe, describe_thread, signature
from .analyze.stacks import merge_frames
from .model import Analysis, BatchResult, FrameKind, NativeFrame, Thread
from .output import to_jsonable

__all__ = [
    "format_analysis",
    "format_thread",
    "format_batch",
    "analysis_payload",
]

_MAX_LINE = 200


def analysis_payload(analysis: Analysis, *, merged: bool = False) -> dict:
    """The ``analysis`` object of ``forensics analyze --json``."""
    data = to_jsonable(analysis)
    data["signature"] = signature(analysis)
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


def format_thread(thread: Thread, *, merged: bool = False, native: bool = True) -> Iterator[str]:
    """Lines for one thread: its header, its Python stack, then (or merged with) its native stack."""
    flags = []
    if thread.is_crashed:
        flags.append("crashed")
    if thread.holds_gil:
        flags.append("holds the GIL")
    flag = f"  [{', '.join(flags)}]" if flags else ""
    yield f"Thread {describe_thread(thread)}{flag}"
    if merged:
        for kind, frame in merge_frames(thread):
            if kind is FrameKind.PYTHON:
                yield f"    (Python) {describe_pyframe(frame)}"
            else:
                yield f"    {_native_line(frame)}"
        if thread.python_error:
            yield f"    (Python stack incomplete: {thread.python_error})"
    else:
        if thread.py_frames or thread.python_error:
            yield "  Python stack (most recent call first):"
            for p in thread.py_frames:
                yield f"    {describe_pyframe(p)}"
            if thread.python_error:
                yield f"    (Python stack incomplete: {thread.python_error})"
        if native:
            yield "  Native stack:"
            for f in thread.native_frames:
                yield f"    {_native_line(f)}"
    if thread.native_error:
        yield f"    ({thread.native_error})"


def format_analysis(analysis: Analysis, *, merged: bool = False, libraries: bool = True) -> Iterator[str]:
    """The human summary: signature first, then the crash, findings, threads and libraries."""
    snap = analysis.snapshot
    core = snap.core
    crash = analysis.crash
    yield signature(analysis)
    yield ""
    yield f"Core:        {core.path} ({core.size:,} bytes{', TRUNCATED' if core.truncated else ''})"
    yield f"Process:     pid {core.pid}, {core.executable or core.command}"
    if core.args:
        yield f"Command:     {core.args[:_MAX_LINE]}"
    yield f"Signal:      {crash.signal_name or 'none'}" + (
        f" (si_code {core.signal.code})" if core.signal else ""
    )
    if crash.abort_message:
        yield f"Abort:       {crash.abort_message}"
    if crash.fault_address is not None:
        fk = crash.fault_kind.value if crash.fault_kind else "?"
        yield f"Fault:       0x{crash.fault_address:x} ({fk})"
    yield f"Crash class: {crash.kind.value}"
    yield f"Fingerprint: {analysis.fingerprint}"
    if snap.python_version:
        yield f"Python:      {snap.python_version}"
    yield (f"Stacks:      native by {snap.native_method}; Python by {snap.python_method}: "
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
    for thread in snap.threads:
        yield ""
        yield from format_thread(thread, merged=merged)
    if libraries:
        yield ""
        yield "Mapped libraries:"
        for lib in core.libraries:
            yield f"  {lib.status.value:<17} {lib.build_id or '-':<40} {lib.path}"


def _ts(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def format_batch(result: BatchResult) -> Iterable[str]:
    """The fingerprint table of a batch: distinct crashes, most frequent first."""
    yield f"{result.total} cores, {len(result.groups)} distinct crashes, {len(result.failed)} unreadable"
    yield ""
    yield f"{'COUNT':>5}  {'FINGERPRINT':<12}  {'FIRST SEEN':<20}  {'LAST SEEN':<20}  SIGNATURE"
    for g in result.groups:
        yield f"{g.count:>5}  {g.fingerprint:<12}  {_ts(g.first_seen):<20}  {_ts(g.last_seen):<20}  {g.signature}"
        yield f"{'':>5}  example: {g.example}"
    if result.failed:
        yield ""
        yield "Unreadable:"
        for e in result.failed:
            yield f"  {e.path}: {e.error}"
