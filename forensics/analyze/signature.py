"""The one line that says what happened to a crashed process: :func:`signature`.

A datum of the analysis, not a rendering choice: batch triage labels each distinct
crash with it, ``analyze --json`` carries it, the reproducers compare by it.
"""
from __future__ import annotations

from ..model import Analysis, PyFrame, Thread
from .stacks import meaningful_native_frames

__all__ = ["signature", "describe_pyframe", "describe_thread"]


def _short(path: str | None) -> str:
    return (path or "?").rsplit("/", 1)[-1]


def describe_pyframe(p: PyFrame) -> str:
    """A Python frame as ``function (file.py:line)``."""
    return f"{p.function} ({_short(p.file)}:{p.line if p.line is not None else '?'})"


def describe_thread(t: Thread) -> str:
    """A thread as ``"name" tid N``."""
    name = f'"{t.name}" ' if t.name else ""
    return f"{name}tid {t.tid}"


def signature(analysis: Analysis) -> str:
    """The one line that says what happened.

    Signal, abort message or fault, crashing thread, top Python frame, top native
    frame outside libc.
    """
    crash = analysis.crash
    snap = analysis.snapshot
    parts = [crash.signal_name or "no signal"]
    if crash.abort_message:
        parts.append(f'"{crash.abort_message}"')
    elif crash.fault_address is not None:
        fk = crash.fault_kind.value if crash.fault_kind else "?"
        parts.append(f"at 0x{crash.fault_address:x} ({fk})")
    parts.append(f"[{crash.kind.value}]")
    crashed = snap.crashed_thread
    if crashed is not None:
        parts.append(f"in thread {describe_thread(crashed)}")
        if crashed.py_frames:
            parts.append(f"at {describe_pyframe(crashed.py_frames[0])}")
        native = next(
            (f for f in meaningful_native_frames(crashed) if f.symbol and not f.is_libc), None
        )
        if native is not None:
            parts.append(f"via {native.symbol} ({native.library_name or '?'})")
    elif crash.tid is not None:
        parts.append(f"in tid {crash.tid}")
    return " ".join(parts)
