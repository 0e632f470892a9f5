"""The one line that says what happened to a crashed process: :func:`signature`.

A datum of the analysis, not a rendering choice: batch triage labels each distinct
crash with it, ``analyze --json`` carries it, the reproducers compare by it.

The first fault comes first — its signal, glibc's message or the faulting address, its class,
its thread, where it happened in Python (the innermost frame, and the first frame outside the
standard library when those differ) and natively (the first frame past the abort machinery and
libc; an unnamed frame is shown by its library and offset, never skipped for its caller).  A
fault that came after it — in a crash reporter's handler, or in another thread — follows
``; then``.  A snapshot of a live process says so, and so does a signal another process sent (a kill:
``SIGSEGV sent by pid 4242 (uid 0) with kill(2) [sent-signal]: not a crash; ...``), naming the sender.
"""
from __future__ import annotations

from ..model import Analysis, CoreFile, CrashKind, FaultKind, NativeFrame, PyFrame, Thread
from ..modes import Unwinder
from .frames import first_fault_frames, skip_abort_machinery
from .names import function_name, is_runtime_frame
from .pyframes import describe_pyframe, first_outside_stdlib, python_location

__all__ = ["signature", "describe_thread", "describe_native_culprit", "describe_location",
           "describe_later_fault", "exit_explanation"]


def describe_thread(t: Thread) -> str:
    """A thread as ``"name" tid N``; the unnamed main thread (``threading`` never imported) as
    ``main thread tid N``."""
    if t.name:
        return f'"{t.name}" tid {t.tid}'
    if t.is_main:
        return f"main thread tid {t.tid}"
    return f"tid {t.tid}"


def _in_thread(t: Thread) -> str:
    return f"in the main thread tid {t.tid}" if t.is_main and not t.name else f"in thread {describe_thread(t)}"


def describe_native_culprit(frames: tuple[NativeFrame, ...], libraries_base: dict[str, int], *,
                            unwound: bool = True, runtimes: bool = False) -> str | None:
    """The first native frame past the abort machinery and outside libc: ``function (library)`` (a C++ name
    demangled, without its parameters), or for an unnamed one ``library+0xOFFSET`` (never its named caller);
    None when no frame qualifies.

    :param unwound: whether an unwinder made the frames (else the one frame is the program counter,
        never symbolized: said so, not "no symbol")
    :param runtimes: an abort's: past the C and C++ runtimes' frames too (libstdc++'s terminate machinery,
        libgcc_s' unwinder), and the physical function (the code that threw, not what it inlined)
    """
    for f in skip_abort_machinery(frames):
        if f.is_libc or (runtimes and (is_runtime_frame(f) or f.inlined)):
            continue
        if f.symbol:
            return f"{function_name(f.symbol)} ({f.library_name or '?'})"
        if f.library:
            base = libraries_base.get(f.library)
            off = f"+0x{f.pc - base:x}" if base is not None and f.pc >= base else f" at 0x{f.pc:x}"
            return f"{f.library_name}{off} ({'no symbol' if unwound else 'program counter only: not unwound'})"
        return f"0x{f.pc:x} (in no mapped object)"
    return None


def describe_location(py_frames: tuple[PyFrame, ...] | None, native: tuple[NativeFrame, ...],
                      libraries_base: dict[str, int], *, unwound: bool = True, runtimes: bool = False,
                      via: str = "via") -> list[str]:
    """``at PYFRAME [from CALLER]`` and ``via NATIVE`` for one part of a stack (``runtimes``: an abort's,
    :func:`describe_native_culprit`; ``via``: the word before the native culprit)."""
    out = []
    if py_frames:
        top = py_frames[0]
        out.append(f"at {describe_pyframe(top)}")
        if python_location(top.file).stdlib:
            caller = first_outside_stdlib(py_frames)
            if caller is not None:
                out.append(f"from {describe_pyframe(caller)}")
    culprit = describe_native_culprit(native, libraries_base, unwound=unwound, runtimes=runtimes)
    if culprit is not None:
        out.append(f"{via} {culprit}")
    return out


def _unwound(t: Thread) -> bool:
    """Whether an unwinder made the thread's native frames (not just its program counter)."""
    return t.native_method not in (None, Unwinder.REGISTERS) or len(t.native_frames) > 1


def _fault(signal_name: str | None, abort_message: str | None, address: int | None, kind,
           core: CoreFile | None = None) -> list[str]:
    parts = [signal_name or "no signal"]
    if abort_message:
        parts.append(f'"{abort_message}"')
    elif address is not None:
        what = kind.value if kind else "?"
        mapping = core.find_mapping(address) if core is not None and kind is FaultKind.PAST_END_OF_FILE else None
        if mapping is not None and mapping.path:  # name the file whose end the access ran past
            what = f"{what}: byte {mapping.offset + address - mapping.start:#x} of {mapping.path}"
        parts.append(f"at 0x{address:x} ({what})")
    return parts


def _snapshot(analysis: Analysis, bases: dict[str, int]) -> str:
    snap = analysis.snapshot
    crash = analysis.crash
    why = crash.signal_name or "no signal"
    head = f"snapshot of a live process ({why}, as gdb's gcore leaves it): no crash, {len(snap.threads)} threads"
    main = next((t for t in snap.threads if t.is_main), None)
    if main is None:
        return head
    parts = [f"main thread {describe_thread(main)}" if main.name else describe_thread(main)]
    parts += describe_location(main.py_frames, main.native_frames, bases, unwound=_unwound(main))
    return f"{head}; " + " ".join(parts)


def _sent(analysis: Analysis, bases: dict[str, int]) -> str:
    """A signal another process sent: who sent it, and where the thread that received it was."""
    crash = analysis.crash
    sender = crash.sender
    who = f" sent by {sender.label} with {sender.call}" if sender is not None else \
        f" sent by another process{_unnamed_sender(analysis)}"
    head = f"{crash.signal_name or 'no signal'}{who} [{crash.kind.value}]: not a crash"
    thread = next((t for t in analysis.snapshot.threads if t.tid == crash.tid), None) if crash.tid is not None else None
    if thread is None:
        return head
    where = describe_location(thread.py_frames, thread.native_frames, bases, unwound=_unwound(thread))
    return f"{head}; {_in_thread(thread).removeprefix('in ')} was " + " ".join(where) if where else head


def _unnamed_sender(analysis: Analysis) -> str:
    handler = analysis.crash.handler
    took = f"its handler {handler.label} took no siginfo" if handler is not None else "no siginfo"
    return f" (which one the core cannot say: {took})"


def signature(analysis: Analysis) -> str:
    """The one line that says what happened (see the module docstring).

    Signal, abort message or fault, class, thread, top Python frame (and its first caller outside
    the standard library), top native frame outside libc; then the later fault, if any.
    """
    crash = analysis.crash
    snap = analysis.snapshot
    bases = {lib.path: lib.base for lib in snap.core.libraries}
    if crash.kind is CrashKind.SNAPSHOT:
        return _snapshot(analysis, bases)
    if crash.is_sent:
        return _sent(analysis, bases)
    parts = _fault(crash.signal_name, crash.abort_message, crash.fault_address, crash.fault_kind, snap.core)
    parts.append(f"[{crash.kind.value}]")
    thread = next((t for t in snap.threads if t.tid == crash.tid), None) if crash.tid is not None else None
    exc = thread.cxx_exception if thread is not None and crash.kind is CrashKind.ABORT else None
    if exc is not None:  # std::terminate: the exception no handler caught (or that left a noexcept function)
        parts.append(f"std::terminate on an uncaught {exc.type}")
    if thread is not None:
        parts.append(_in_thread(thread))
        native, py = first_fault_frames(thread, crash)
        aborted = crash.kind in (CrashKind.ABORT, CrashKind.HEAP_CORRUPTION)
        where = describe_location(py, native, bases, unwound=_unwound(thread), runtimes=aborted,
                                  via="thrown by" if exc is not None else "via")
        if crash.handling is not None:  # a fault inside a handler: which signal, whose handler, its own frames
            parts.append(f"in its {crash.handling.signal_name} handler {crash.handling.label}")
            if crash.handling.name:
                where = [w for w in where if not w.startswith(f"via {crash.handling.name} ")]
            if thread.interrupted_py_frames:
                where.append(f"(the signal came at {describe_pyframe(thread.interrupted_py_frames[0])})")
        parts += where
    elif crash.tid is not None:
        parts.append(f"in tid {crash.tid}")
    else:
        parts.append("in a thread the core does not name")
    if crash.then is None:
        return " ".join(parts)
    return " ".join(parts) + "; then " + describe_later_fault(analysis, bases)


def describe_later_fault(analysis: Analysis, bases: dict[str, int] | None = None) -> str:
    """The fault that killed the process after the first one: ``SIGSEGV at 0x10 (near-null) in the
    SIGABRT handler on_abort (exporter.py:87) at ...``; empty when there is none."""
    then = analysis.crash.then
    if then is None:
        return ""
    snap = analysis.snapshot
    if bases is None:
        bases = {lib.path: lib.base for lib in snap.core.libraries}
    later = _fault(then.signal_name, None, then.fault_address, then.fault_kind)
    late_thread = next((t for t in snap.threads if t.tid == then.tid), None)
    if then.handler is not None:
        later.append(f"in the {then.handler.signal_name} handler {then.handler.label}")
        if late_thread is not None and late_thread.signal_frames:
            first = next((f for f in reversed(late_thread.signal_frames) if f.signal.name == then.handler.signal_name),
                         late_thread.signal_frames[-1])
            native = late_thread.native_frames[: first.native_index] if first.native_index is not None else ()
            py = late_thread.py_frames[: first.py_index] if first.py_index else ()
            where = describe_location(py, native, bases)
            if then.handler.name:  # the handler's own frame is named once
                where = [w for w in where if not w.startswith((f"via {then.handler.name} ",
                                                               f"from {then.handler.label}"))]
            later += where
    elif late_thread is not None:
        later.append(_in_thread(late_thread))
        later += describe_location(late_thread.interrupted_py_frames, late_thread.interrupted_native_frames, bases,
                                   unwound=_unwound(late_thread))
    return " ".join(later)


_KIND_PHRASE = {
    CrashKind.HEAP_CORRUPTION: "glibc's abort on a corrupted heap",
    CrashKind.ABORT: "an abort()",
    CrashKind.SEGV: "a segmentation fault",
    CrashKind.BUS: "a bus error",
    CrashKind.FPE: "an arithmetic fault",
    CrashKind.ILL: "an illegal instruction",
}


def exit_explanation(analysis: Analysis) -> str | None:
    """Why the process exited with the status it did (139 vs 134), in one sentence; None for a snapshot.

    A crash reporter's handler that faults turns glibc's heap abort (134 = 128 + SIGABRT) into a
    139 (128 + SIGSEGV): the status alone then points at the wrong crash.
    """
    crash = analysis.crash
    status = crash.exit_status
    if status is None or crash.signal is None:
        return None
    if crash.is_sent:
        who = (f"{crash.sender.label} sent it with {crash.sender.call}" if crash.sender else
               f"another process sent it{_unnamed_sender(analysis)}, while the thread was in a system call")
        return (f"exit status {status} ({crash.signal_name}): killed, not crashed -- {who}; the process did not "
                f"fault (the signal's default action ends it with a core)")
    first = f"{128 + crash.signal} ({crash.signal_name})"
    what = _KIND_PHRASE.get(crash.kind, f"a {crash.signal_name}")
    then = crash.then
    if then is not None and then.handler is not None:
        return (f"exit status {status} ({then.signal_name}), not {first}: while the process was dying of {what}, "
                f"its {crash.signal_name} handler {then.handler.label} itself faulted ({then.signal_name}); "
                f"the first fault is the crash, the handler's fault only changed the exit status")
    if then is not None:
        who = f"thread tid {then.tid}" if then.tid is not None else "another thread"
        where = f" in thread tid {crash.tid}" if crash.tid is not None else ""
        return (f"exit status {status} ({then.signal_name}), not {first}: {who} faulted ({then.signal_name}) while "
                f"the process was dying of {what}{where}; glibc had written its message first")
    if crash.handler is not None and crash.handler.kind.value == "faulthandler":
        return (f"exit status {status} ({crash.signal_name}): faulthandler printed the Python tracebacks to stderr "
                f"and raised {crash.signal_name} again; the crash is unchanged")
    return f"exit status {status} ({crash.signal_name}): {what}"
