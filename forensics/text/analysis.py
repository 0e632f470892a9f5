"""Text of ``forensics analyze``: one analysis (signature first, then crash, findings, threads,
libraries, the heap), one thread, and the batch table of every input."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..analyze.sigframe_aarch64 import describe_esr
from ..views.frames import merge_frames
from ..views.pyframes import describe_pyframe
from ..views.signature import describe_later_fault, describe_thread, exit_explanation, signature
from ..model import (
    Analysis,
    BatchEntry,
    BatchResult,
    CrashKind,
    NativeFrame,
    PyFrame,
    PythonMethod,
    SignalFrame,
    StoreEntry,
    Thread,
)
from .heap import format_heap

__all__ = ["format_analysis", "format_thread", "format_batch"]

_MAX_LINE = 200


def _native_line(f: NativeFrame) -> str:
    return f.describe()


def _signal_line(sf) -> str:
    how = {"siginfo": f"si_code {sf.signal.code}", "registers": "read from the interrupted registers",
           "unknown": "signal unknown"}.get(sf.signal_source, sf.signal_source)
    stack = ", on the alternate signal stack" if sf.alternate_stack else ""
    if sf.esr is not None:  # AArch64: the fault's syndrome the kernel put in the frame
        how += f", ESR 0x{sf.esr:x}: {describe_esr(sf.esr)}"
    if sf.fault_address is not None and sf.signal.addr != sf.fault_address:
        how += f", fault address 0x{sf.fault_address:x}"
    return f"--- {sf.signal.name} ({how}) delivered here{stack}: above ran its handler, below was interrupted ---"


def format_thread(thread: Thread, *, merged: bool = False, native: bool = True,
                  first_fault: bool = False, full_paths: bool = False) -> Iterator[str]:
    """Lines for one thread: its header, its Python stack, then (or merged with) its native stack; each
    signal frame (a handler running on top of what it interrupted) is marked where it splits them.
    ``full_paths``: each Python frame's file by its whole path (an editor opens ``path:line``)."""
    yield f"Thread {describe_thread(thread)}{_thread_flags(thread, first_fault=first_fault)}"
    native_marks = {sf.native_index: sf for sf in thread.signal_frames if sf.native_index is not None}
    if thread.signal_frames and not native_marks:
        for sf in thread.signal_frames:
            yield (f"  {_signal_line(sf)[4:-4]} (interrupted at 0x{sf.pc:x}; the native stack was not unwound, "
                   "so the handler's frames are not told apart)")
    if merged:
        yield from _merged_lines(thread, native_marks, full_paths)
    else:
        yield from _separate_lines(thread, native_marks, native=native, full_paths=full_paths)
    if thread.native_error:
        yield f"    ({thread.native_error})"
    if thread.signal_frames_cut:
        yield f"    ({thread.signal_frames_cut})"


def _thread_flags(thread: Thread, *, first_fault: bool) -> str:
    flags = []
    if thread.is_crashed:
        flags.append("crashed")
    if first_fault and not thread.is_crashed:
        flags.append("first fault")
    if thread.holds_gil:
        flags.append("holds the GIL")
    if thread.interpreter_id:
        flags.append(f"in interpreter {thread.interpreter_id}")
    return f"  [{', '.join(flags)}]" if flags else ""


def _first_interpreter(thread: Thread) -> int | None:
    """-1 (no interpreter labelled yet) when the stack runs in subinterpreters, else None: no labels."""
    return None if not any(f.interpreter_id for f in thread.py_frames) else -1


def _merged_lines(thread: Thread, native_marks: dict[int, SignalFrame], full_paths: bool) -> Iterator[str]:
    interp = _first_interpreter(thread)
    for _, frame in merge_frames(thread):
        if isinstance(frame, PyFrame):
            if interp is not None and frame.interpreter_id != interp:
                interp = frame.interpreter_id
                yield f"    [interpreter {interp}]"
            yield f"    (Python) {describe_pyframe(frame, full=full_paths)}"
        else:
            yield f"    {_native_line(frame)}"
            if frame.index in native_marks:
                yield f"    {_signal_line(native_marks[frame.index])}"
    if thread.python_error:
        yield f"    (Python stack incomplete: {thread.python_error})"


def _separate_lines(thread: Thread, native_marks: dict[int, SignalFrame], *, native: bool,
                    full_paths: bool) -> Iterator[str]:
    py_marks = {sf.py_index: sf for sf in thread.signal_frames if sf.py_index}
    interp = _first_interpreter(thread)
    if thread.py_frames or thread.python_error:
        yield "  Python stack (most recent call first):"
        for i, p in enumerate(thread.py_frames):
            if i in py_marks:
                yield f"    {_signal_line(py_marks[i])}"
            if interp is not None and p.interpreter_id != interp:
                interp = p.interpreter_id
                yield f"    [interpreter {interp}]"
            yield f"    {describe_pyframe(p, full=full_paths)}"
        if thread.python_error:
            yield f"    (Python stack incomplete: {thread.python_error})"
    if native:
        yield "  Native stack:"
        for f in thread.native_frames:
            yield f"    {_native_line(f)}"
            if f.index in native_marks:
                yield f"    {_signal_line(native_marks[f.index])}"


def format_analysis(analysis: Analysis, *, merged: bool = False, libraries: bool = True,
                    full_paths: bool = False) -> Iterator[str]:
    """The human summary: signature first, then the crash, findings, threads and libraries.

    Names, paths and messages come from the crashed process: the lines are raw, and are escaped
    where they are printed or written (:func:`forensics.output.text_lines`, through
    :func:`forensics.commands.emit`), so a hostile thread or file name cannot drive the terminal.
    """
    snap = analysis.snapshot
    core = snap.core
    crash = analysis.crash
    yield signature(analysis)
    yield ""
    yield f"Core:        {core.path} ({core.size:,} bytes{', TRUNCATED' if core.truncated else ''})"
    if analysis.store is not None:
        yield from _store_lines(analysis.store)
    yield f"Process:     pid {core.pid}, {core.executable or core.command}"
    if core.args:
        cut = ("... (cut: the core's process record keeps 80 bytes, and the stack that holds the whole line "
               "is not in the core)") if core.args_cut else ""
        yield f"Command:     {core.args[:_MAX_LINE]}{cut}"
    same = core.signal is not None and crash.then is None and crash.signal == core.signal.signo
    code = f" (si_code {core.signal.code})" if same and core.signal is not None else ""
    yield f"Signal:      {crash.signal_name or 'none'}{code}"
    yield from _crash_lines(analysis)
    if snap.python_version:
        yield f"Python:      {snap.python_version}"
    layout = f" ({snap.python_layout})" if snap.python_layout and snap.python_method is not PythonMethod.NONE else ""
    yield (f"Stacks:      native by {snap.native_method.value}; Python by {snap.python_method.value}{layout}: "
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
        yield from format_thread(thread, merged=merged, first_fault=thread.tid == crash.tid, full_paths=full_paths)
    if libraries:
        yield ""
        yield "Mapped libraries:"
        for lib in core.libraries:
            yield f"  {lib.status.value:<17} {lib.build_id or '-':<40} {lib.path}"


def _count(n: int, one: str, many: str) -> str:
    """``1 bug``, ``2 bugs``, ``0 bugs``.

    >>> _count(1, "bug", "bugs"), _count(2, "distinct crash", "distinct crashes")
    ('1 bug', '2 distinct crashes')
    """
    return f"{n:,} {one if n == 1 else many}"


def _ts(t: float) -> str:
    import datetime as _dt  # here: a batch's table shows times, one analysis' text none

    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


#: the journal's fields shown, in this order (the JSON has every one kept)
_JOURNAL_SHOWN = ("unit", "user_unit", "container_cmdline", "cmdline", "signal_name", "timestamp", "hostname")


def _store_lines(store: StoreEntry) -> Iterator[str]:
    """Where a core from systemd-coredump's store came from, and what its journal entry says."""
    yield f"From:        {store.path} ({store.compression}, systemd-coredump's store; read decompressed in the cache)"
    fields = dict(store.journal)
    if not fields:
        yield f"Journal:     none ({store.journal_missing or 'no entry'})"
        return
    shown = [f"{k}={fields[k][:_MAX_LINE]}" for k in _JOURNAL_SHOWN if fields.get(k)]
    yield "Journal:     " + ("; ".join(shown) or "an entry without a unit, command line or signal")


_JOURNAL_STACK_SHOWN = 8  # frames of a journal-only crash's stack in the text (--json has those kept)
_JOURNAL_STACKS_SHOWN = 20  # the newest crashes whose stack the text shows (the journal lists up to 500)


def _journal_crash_lines(e: BatchEntry, *, stack: bool = True) -> Iterator[str]:
    """A crash systemd-coredump's journal holds without a core: when, the process, its signal, why no core, and
    (``stack``) the first frames of the crashed thread's stack as systemd-coredump logged them."""
    assert e.store is not None
    f = dict(e.store.journal)
    who = f"PID {f.get('pid', '?')} ({f.get('comm', '?')})"
    signal = f.get("signal_name") or (f"signal {f['signal']}" if f.get("signal") else "signal ?")
    yield f"  {_ts(e.mtime)}  {who} {signal}  {(f.get('exe') or f.get('cmdline') or '?')[:_MAX_LINE]}"
    if f.get("unit") or f.get("container_cmdline"):
        yield f"    unit: {f.get('unit') or '-'}" + (f"; container: {f['container_cmdline'][:_MAX_LINE]}"
                                                    if f.get("container_cmdline") else "")
    yield f"    no core: {e.no_core}"
    if not stack:
        return
    for frame in e.store.stack[:_JOURNAL_STACK_SHOWN]:
        yield f"    {frame}"
    if len(e.store.stack) > _JOURNAL_STACK_SHOWN:
        yield f"    ... {len(e.store.stack) - _JOURNAL_STACK_SHOWN} more frames (--json)"
    if not e.store.stack:
        yield "    (no stack in the journal: systemd-coredump logs one only when it could read the core)"


def format_batch(result: BatchResult) -> Iterable[str]:
    """The fingerprint table of a batch: distinct crashes, most frequent first; then what was partial,
    unreadable, a kill, a snapshot, metadata only or skipped -- every input is accounted for.  Raw lines: control
    characters (in file names, signatures) are escaped where they are printed (:func:`forensics.commands.emit`)."""
    yield from _batch_head(result)
    yield ""
    yield f"{'COUNT':>5}  {'PARTIAL':>7}  {'FINGERPRINT':<12}  {'FIRST SEEN':<20}  {'LAST SEEN':<20}  SIGNATURE"
    for g in result.groups:
        yield (f"{g.count:>5}  {len(g.partial) or '':>7}  {g.fingerprint:<12}  {_ts(g.first_seen):<20}  "
               f"{_ts(g.last_seen):<20}  {g.signature}")
        yield f"{'':>5}  example: {g.example}"
        for why in g.partial:
            yield f"{'':>5}  partial (its fingerprint may differ): {why}"
    yield from _batch_apart(result)


def _batch_head(result: BatchResult) -> Iterator[str]:
    """The batch's two first lines: what every input was, and how many bugs it found."""
    analyzed = sum(g.count for g in result.groups)
    head = [f"{_count(result.total, 'input', 'inputs')}: {_count(analyzed, 'core', 'cores')} analyzed "
            f"({result.partial} partial)",
            _count(len(result.groups), "distinct crash", "distinct crashes"), f"{len(result.failed)} unreadable"]
    if result.sent:
        head.append(_count(len(result.sent), "signal", "signals") + " sent by other processes (no crash)")
    if result.snapshots:
        head.append(_count(len(result.snapshots), "snapshot", "snapshots") + " (no crash)")
    if result.metadata_bundles:
        head.append(f"{len(result.metadata_bundles)} metadata only")
    if result.journal_only:
        head.append(f"{len(result.journal_only)} in systemd-coredump's journal only (no core)")
    head.append(_count(len(result.skipped), "file", "files") + " skipped (not cores)")
    yield ", ".join(head)
    yield (f"Found {_count(result.bugs, 'bug', 'bugs')} (distinct fingerprints); the previous fingerprint definition "
           f"gives them {_count(result.fingerprints_v3, 'fingerprint', 'fingerprints')} (fingerprint_v3)")


def _batch_apart(result: BatchResult) -> Iterator[str]:
    """What is listed apart from the table: unreadable inputs, kills, snapshots, metadata-only bundles, skipped
    files."""
    if result.failed:
        yield ""
        yield "Unreadable:"
        for e in result.failed:
            error = e.error or "?"
            yield f"  {error}" if error.startswith(e.path) else f"  {e.path}: {error}"
    if result.sent:
        yield ""
        yield "Signals sent by other processes (killed, no crash, no fingerprint):"
        for e in result.sent:
            a = e.analysis
            who = (f"{a.crash.signal_name} sent by {a.crash.sender.label} with {a.crash.sender.call}"
                   if a is not None and a.crash.sender is not None else
                   f"{a.crash.signal_name if a is not None else 'a signal'} sent by another process")
            yield f"  {_ts(e.mtime)}  {e.path}: {who}"
    if result.snapshots:
        yield ""
        yield "Snapshots of live processes (no crash, no fingerprint):"
        for e in result.snapshots:
            yield f"  {_ts(e.mtime)}  {e.path}"
    if result.metadata_bundles:
        yield ""
        yield "Metadata only:"
        for e in result.metadata_bundles:
            yield f"  {_ts(e.mtime)}  {e.path}: metadata only (no core kept: {e.no_core})"
    if result.journal_only:
        yield ""
        yield "Crashes systemd-coredump logged without a core to read (its journal; coredumpctl info PID shows them):"
        for i, e in enumerate(sorted(result.journal_only, key=lambda e: -e.mtime)):
            yield from _journal_crash_lines(e, stack=i < _JOURNAL_STACKS_SHOWN)
    if result.skipped:
        yield ""
        yield f"Skipped (not cores): {len(result.skipped)} files"
        for path in result.skipped[:20]:
            yield f"  {path}"
        if len(result.skipped) > 20:
            yield f"  ... and {len(result.skipped) - 20} more"


def _crash_lines(analysis: Analysis) -> Iterator[str]:
    """The crash's lines: abort message, fault, class, handler, a later fault, exit, fingerprint."""
    crash = analysis.crash
    if crash.abort_message:
        yield f"Abort:       {crash.abort_message}"
    if crash.fault_address is not None:
        fk = crash.fault_kind.value if crash.fault_kind else "?"
        yield f"Fault:       0x{crash.fault_address:x} ({fk})"
    if crash.is_sent and crash.sender is not None:
        yield f"Sent by:     {crash.sender.label} with {crash.sender.call}"
    no_crash = {CrashKind.SNAPSHOT: " (a core of a live process: no crash)",
                CrashKind.SENT_SIGNAL: " (a signal another process sent: no crash)"}
    yield f"Crash class: {crash.kind.value}{no_crash.get(crash.kind, '')}"
    if crash.handler is not None:
        label = crash.handler.label
        kind = "" if crash.handler.kind.value == label else f" ({crash.handler.kind.value})"
        yield f"Handler:     {crash.signal_name} handler {label}{kind}"
    thread = analysis.fault_thread
    if thread is not None and thread.cxx_exception is not None and crash.kind is CrashKind.ABORT:
        exc = thread.cxx_exception
        yield (f"Exception:   {exc.type} (a C++ exception no handler caught, or thrown through a noexcept function: "
               f"std::terminate; {exc.runtime}, object at 0x{exc.address:x})")
    if crash.then is not None:
        yield f"Then:        {describe_later_fault(analysis)}"
    explanation = exit_explanation(analysis)
    if explanation:
        yield f"Exit:        {explanation}"
    if analysis.fingerprint is None:
        yield ("Fingerprint: none (a signal another process sent is not a crash)" if crash.is_sent else
               "Fingerprint: none (a snapshot is not a crash)")
    else:
        partial = f" (partial: {analysis.fingerprint_partial})" if analysis.fingerprint_partial else ""
        yield f"Fingerprint: {analysis.fingerprint}{partial}"
