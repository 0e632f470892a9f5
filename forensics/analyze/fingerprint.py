"""The crash fingerprint: one short, stable hash of what makes two crashes the same bug.

One definition for every place a fingerprint appears: ``analyze`` (whichever methods read the
stacks), batch triage, the core handler's index and whatever publishes it later.  It is computed
only from what every analysis method yields — the core reader's facts and the Python stacks,
which the direct and the DWARF layouts read alike — and never from native frames, because
``--method direct`` (and a machine without an unwinder) has only each thread's program counter.

The basis, in order (:func:`fingerprint_basis` returns the strings, so a fingerprint can always
be explained; ``analyze --json`` carries them as ``fingerprint_basis``):

``kind:``      the class of the first fault (a crash reporter's handler that faulted afterwards,
               or faulthandler, changes nothing: the fingerprint is the first fault's)
``signal:``    its signal
``abort:``     glibc's abort message, addresses blanked (when there is one)
``fault:``     where the faulting address points (near-null, unmapped, ...) for memory faults
``pc:``        the object holding the faulting instruction, its ``.so`` version dropped (SIGSEGV,
               SIGBUS, SIGFPE, SIGILL: the interrupted instruction of the first fault)
``program:``   the executable's name, for a process that is not CPython (no Python frames to tell
               its crashes apart)
``python:``    the top 5 Python frames of the first fault's thread that ran before any handler, as
               ``path:function`` with the path from its import root (``ctypes/__init__.py``,
               ``nvitop/api/device.py``; the file name elsewhere); no line numbers, so an edit
               elsewhere in a file does not split one bug in two

No addresses, offsets, pids, times or interpreter prefixes: ASLR, rebuilds, venvs and images
change those.  When a part the definition uses could not be read (Python stacks unavailable or
cut short, the handler/interrupted split unknown), the fingerprint is computed from the rest and
:attr:`Analysis.fingerprint_partial` says why: it may then differ from the same crash's complete
fingerprint, and batch triage marks it.  A snapshot (no crash) has no fingerprint.
"""
from __future__ import annotations

import re

from ..digest import sha256
from ..model import Crash, CrashKind, ProcessSnapshot, PyFrame
from .classify import is_python_process, normalize_message
from .pyframes import python_location

__all__ = ["FINGERPRINT_VERSION", "PYTHON_DEPTH", "fingerprint_basis", "fingerprint", "crash_python_frames"]

FINGERPRINT_VERSION = 2
PYTHON_DEPTH = 5
_SO_VERSION = re.compile(r"\.so(\.[0-9.]+)?$")
_MEMORY_FAULTS = (CrashKind.SEGV, CrashKind.BUS, CrashKind.FPE, CrashKind.ILL)


def _lib(name: str | None) -> str:
    """``libnvidia-ml.so.580.126.09`` -> ``libnvidia-ml.so``.

    >>> _lib("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09"), _lib(None)
    ('libnvidia-ml.so', '?')
    """
    if not name:
        return "?"
    base = name.rsplit("/", 1)[-1]
    return _SO_VERSION.sub(".so", base)


def crash_python_frames(snapshot: ProcessSnapshot, crash: Crash) -> tuple[tuple[PyFrame, ...] | None, str | None]:
    """The Python frames of the first fault (its thread's, those that ran before any handler) and, when
    they cannot be known whole, why (None, or a partial list, with the reason)."""
    thread = next((t for t in snapshot.threads if t.tid == crash.tid), None) if crash.tid is not None else None
    status = snapshot.python_stack_status
    python_readable = status == "ok" or status.startswith("partial")
    if thread is None:
        if crash.tid is None and crash.then is not None:
            return None, "the thread that aborted is not known (its native stack was not unwound)"
        return None, None
    frames = thread.interrupted_py_frames
    if frames is None:
        return None, "the handler's and the interrupted Python frames cannot be told apart without native stacks"
    if status == "not a Python process":
        return frames, None
    if not python_readable:
        why = "the core is truncated" if snapshot.core.truncated else status.split(":", 1)[0]
        return None, f"Python stacks unavailable ({why})"
    if thread.python_error and len(frames) < PYTHON_DEPTH:
        return frames, f"the Python stack was cut short ({thread.python_error})"
    return frames, None


def fingerprint_basis(snapshot: ProcessSnapshot, crash: Crash) -> tuple[tuple[str, ...], str | None]:
    """The exact strings hashed, in order, and why the basis is partial (None when whole).

    See the module docstring for the parts.
    """
    basis = [f"kind:{crash.kind.value}", f"signal:{crash.signal_name or '-'}"]
    if crash.abort_message and crash.kind in (CrashKind.HEAP_CORRUPTION, CrashKind.ABORT):
        basis.append(f"abort:{normalize_message(crash.abort_message)}")
    if crash.fault_kind is not None:
        basis.append(f"fault:{crash.fault_kind.value}")
    core = snapshot.core
    if crash.kind in _MEMORY_FAULTS:
        pc = _first_fault_pc(snapshot, crash)
        mapping = core.find_mapping(pc) if pc is not None else None
        basis.append(f"pc:{_lib(mapping.path if mapping is not None else None)}")
    if not is_python_process(core):
        basis.append(f"program:{_lib(core.executable or core.command)}")
    frames, partial = crash_python_frames(snapshot, crash)
    for p in (frames or ())[:PYTHON_DEPTH]:
        basis.append(f"python:{python_location(p.file).path}:{p.function}")
    return tuple(basis), partial


def _first_fault_pc(snapshot: ProcessSnapshot, crash: Crash) -> int | None:
    """The instruction of the first fault: the interrupted one under a handler, else the thread's pc."""
    thread = next((t for t in snapshot.threads if t.tid == crash.tid), None)
    if thread is not None and thread.signal_frames:
        first = next((f for f in reversed(thread.signal_frames) if f.signal.signo == crash.signal), None)
        if first is not None:
            return first.pc
    regs = next((t for t in snapshot.core.threads if t.tid == crash.tid), None)
    return regs.pc if regs is not None else None


def fingerprint(basis: tuple[str, ...]) -> str:
    """12 hex digits of the SHA-256 of the basis.

    >>> fingerprint(("kind:segv", "signal:SIGSEGV"))
    'a605487ec8c3'
    """
    return sha256("\n".join(basis).encode()).hexdigest()[:12]
