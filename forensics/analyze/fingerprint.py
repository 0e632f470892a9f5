"""The crash fingerprint: one short, stable hash of what makes two crashes the same bug.

One definition for every place a fingerprint appears: ``analyze`` (whichever methods read the
stacks), batch triage, the core handler's index and whatever publishes it later.  Two crashes
have one fingerprint when they are the same bug, whatever CPython ran it (3.8 or 3.15, release or
debug), whichever venv or image started it, and whether faulthandler or a crash reporter ran as
the process died; two different bugs have two.

The basis, in order (:func:`fingerprint_basis` returns the strings, so a fingerprint can always
be explained; ``analyze --json`` carries them as ``fingerprint_basis``):

``kind:``      the class of the first fault (a crash reporter's handler that faulted afterwards,
               or faulthandler, changes nothing: the fingerprint is the first fault's)
``signal:``    its signal
``handling:``  the signal whose handler the fault happened in, for a fault inside the handler of a signal
               that is no fault (SIGUSR1, SIGTERM); the parts below are then the handler's own frames,
               not the ones it interrupted (the same bug, wherever the signal arrived)
``abort:``     glibc's abort message (when there is one) with what differs between runs of one bug
               blanked: addresses and numbers in hex, the program name glibc puts first (argv[0]'s:
               ``python3.11:``, a venv's ``python:``), an assertion's source directory and line
``fault:``     where the faulting address points (near-null, unmapped, ...) for memory faults
``pc:``        the object holding the faulting instruction (SIGSEGV, SIGBUS, SIGFPE, SIGILL: the
               interrupted instruction of the first fault), by :func:`object_name`: its ``.so``
               version and a C extension's ABI tag dropped (``_ctypes.cpython-312-x86_64-linux-gnu.so``
               and ``-314d-`` are ``_ctypes.so``), CPython itself ``python`` however it is linked
``program:``   the executable's name, for a process that is not CPython
``python:``    the top 5 Python frames of the first fault's thread that ran before any handler, as
               ``path:function``: the path from its import root (``ctypes/__init__.py``,
               ``nvitop/api/device.py``; the file name elsewhere) and the function's own name
               (``co_name``: ``read_label``, never 3.11+'s qualified ``Poller.read_label``, which
               3.8-3.10 do not have); comprehension frames (``<listcomp>``), which 3.12 inlined,
               are left out; no line numbers, so an edit elsewhere in a file does not split one bug
``native:``    only for a thread that ran no Python code (a native library's own thread; a program
               that is not CPython): the faulting function and up to 4 frames below it, outside libc
               and the abort machinery, as ``object:function`` (``object+0xOFFSET`` when unnamed),
               physical frames only (inlined and tail-call frames differ between unwinders)

No addresses, pids, times or interpreter prefixes: ASLR, rebuilds, venvs and images change those.
When a part the definition uses could not be read (Python stacks unavailable or cut short, the
handler/interrupted split unknown, a native thread's stack not unwound), the fingerprint is
computed from the rest and :attr:`Analysis.fingerprint_partial` says why: it may then differ from
the same crash's complete fingerprint, and batch triage marks it.  A snapshot (no crash) has no
fingerprint.

The previous definition (:data:`FINGERPRINT_VERSION` 2: the function as the interpreter names it,
the object's name with its ABI tag, the abort message with only addresses blanked, no native
frames) stays computable (:func:`fingerprint_basis_v2`); ``analyze --json`` carries it as
``fingerprint_v2`` beside the fingerprint, so a fleet can map the keys it stored to the new ones.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..digest import sha256
from ..model import Crash, CrashKind, FaultKind, NativeFrame, ProcessSnapshot, PyFrame, Thread
from ..modes import Unwinder
from ..views.frames import first_fault_frames, skip_abort_machinery
from ..views.pyframes import python_location
from .classify import NEAR_NULL_LIMIT, SEGV_ACCERR, SI_KERNEL, is_python_process, normalize_message

__all__ = ["FINGERPRINT_VERSION", "PYTHON_DEPTH", "NATIVE_DEPTH", "fingerprint_basis", "fingerprint_basis_v2",
           "fingerprint", "crash_python_frames", "object_name", "normalize_abort_message"]

FINGERPRINT_VERSION = 3
PYTHON_DEPTH = 5
NATIVE_DEPTH = 5
_SO_VERSION = re.compile(r"\.so(\.[0-9.]+)?$")
#: a C extension's ABI tag (PEP 3149): ``.cpython-312-x86_64-linux-gnu``, ``.cpython-314d-...``,
#: ``.cpython-38m-...``, ``.cpython-313t-...``, ``.abi3``, PyPy's ``.pypy310-pp73-x86_64-linux-gnu``
_ABI_TAG = re.compile(r"\.(?:cpython-\d+[a-z]*|pypy\d*-pp\d+)(?:-[a-z0-9_]+)*\.so$|\.abi3\.so$")
#: CPython itself: ``python3.12``, ``python3.14d``, ``libpython3.11.so.1.0``, ``libpython3.13t.so``
_CPYTHON = re.compile(r"(?:lib)?python\d*(?:\.\d+)?[dmtu]*(?:\.so)?")
_MEMORY_FAULTS = (CrashKind.SEGV, CrashKind.BUS, CrashKind.FPE, CrashKind.ILL)
_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})
#: glibc's assertion message: ``PROGRAM: FILE:LINE: FUNCTION: Assertion `EXPR' failed.`` (PROGRAM and its
#: ": " are left out when the program has no name)
_ASSERT = re.compile(r"^(?:[^:\n]*: )?([^\n]*?):\d+: ([^\n]*?: Assertion )")
#: __fortify_fail's older form: ``*** stack smashing detected ***: PROGRAM terminated``
_FORTIFY = re.compile(r"(\*\*\*: ).*( terminated)$")


def _lib(name: str | None) -> str:
    """``libnvidia-ml.so.580.126.09`` -> ``libnvidia-ml.so`` (the previous definition's object name).

    >>> _lib("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09"), _lib(None)
    ('libnvidia-ml.so', '?')
    """
    if not name:
        return "?"
    base = name.rsplit("/", 1)[-1]
    return _SO_VERSION.sub(".so", base)


def object_name(path: str | None) -> str:
    """An object's name as the fingerprint has it: no directory, no ``.so`` version, no C extension ABI
    tag; CPython's executable or library ``python``.

    >>> object_name("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09")
    'libnvidia-ml.so'
    >>> object_name("/venv/site-packages/numpy/core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so")
    '_multiarray_umath.so'
    >>> object_name("/usr/lib/python3.14/lib-dynload/_ctypes.cpython-314d-x86_64-linux-gnu.so")
    '_ctypes.so'
    >>> object_name("/usr/lib/libpython3.11.so.1.0"), object_name("/usr/bin/python3.14d"), object_name(None)
    ('python', 'python', '?')
    """
    base = _lib(path)
    if _CPYTHON.fullmatch(base):
        return "python"
    return _ABI_TAG.sub(".so", base)


def normalize_abort_message(message: str | None) -> str:
    """glibc's abort message with what differs between runs of one bug blanked: addresses and hex
    numbers, the program name an assertion or a fortify failure starts with, an assertion's source
    directory and line.

    >>> normalize_abort_message("python3.11: /build/src/nvml.c:212: poll: Assertion `n > 0' failed.")
    "nvml.c:<line>: poll: Assertion `n > 0' failed."
    >>> normalize_abort_message("free(): invalid pointer")
    'free(): invalid pointer'
    """
    text = normalize_message(message)
    m = _ASSERT.match(text)
    if m is not None:
        text = f"{m.group(1).rsplit('/', 1)[-1]}:<line>: {m.group(2)}{text[m.end():]}"
    return _FORTIFY.sub(r"\1<program>\2", text)


def crash_python_frames(snapshot: ProcessSnapshot, crash: Crash) -> tuple[tuple[PyFrame, ...] | None, str | None]:
    """The Python frames of the first fault (its thread's, those that ran before any handler) and, when
    they cannot be known whole, why (None, or a partial list, with the reason)."""
    thread = _crashed(snapshot, crash)
    status = snapshot.python_stack_status
    python_readable = status == "ok" or status.startswith("partial")
    if thread is None:
        if crash.tid is None and crash.then is not None:
            return None, "the thread that aborted is not known (its native stack was not unwound)"
        return None, None
    frames = first_fault_frames(thread, crash)[1]
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


def _crashed(snapshot: ProcessSnapshot, crash: Crash) -> Thread | None:
    if crash.tid is None:
        return None
    return next((t for t in snapshot.threads if t.tid == crash.tid), None)


def _head(snapshot: ProcessSnapshot, crash: Crash, *, v2: bool) -> list[str]:
    """kind, signal, abort, fault, pc and program: the parts read from the core's facts."""
    basis = [f"kind:{crash.kind.value}", f"signal:{crash.signal_name or '-'}"]
    if crash.abort_message and crash.kind in (CrashKind.HEAP_CORRUPTION, CrashKind.ABORT):
        message = normalize_message(crash.abort_message) if v2 else normalize_abort_message(crash.abort_message)
        basis.append(f"abort:{message}")
    core = snapshot.core
    if crash.fault_kind is not None:
        basis.append(f"fault:{_fault_word_v3(snapshot, crash, v2=v2)}")
    name = _lib if v2 else object_name
    if crash.kind in _MEMORY_FAULTS:
        pc = _first_fault_pc(snapshot, crash)
        mapping = core.find_mapping(pc) if pc is not None else None
        basis.append(f"pc:{name(mapping.path if mapping is not None else None)}")
    if not is_python_process(core):
        basis.append(f"program:{name(core.executable or core.command)}")
    return basis


def fingerprint_basis(snapshot: ProcessSnapshot, crash: Crash) -> tuple[tuple[str, ...], str | None]:
    """The exact strings hashed, in order, and why the basis is partial (None when whole).

    See the module docstring for the parts.
    """
    basis = _head(snapshot, crash, v2=False)
    if crash.handling is not None:
        basis.insert(2, f"handling:{crash.handling.signal_name}")
    frames, partial = crash_python_frames(snapshot, crash)
    kept = [p for p in frames or () if p.function not in _COMPREHENSIONS]
    for p in kept[:PYTHON_DEPTH]:
        basis.append(f"python:{python_location(p.file).path}:{p.function.rsplit('.', 1)[-1]}")
    thread = _crashed(snapshot, crash)
    if frames is not None and not frames and thread is not None:
        native, why = _native_parts(snapshot, thread, crash)
        basis += native
        partial = partial or why
    return tuple(basis), partial


def _native_parts(snapshot: ProcessSnapshot, thread: Thread, crash: Crash) -> tuple[list[str], str | None]:
    """``native:`` parts of a thread that ran no Python code, and why they are partial (None: whole)."""
    frames = [f for f in skip_abort_machinery(first_fault_frames(thread, crash)[0])
              if not f.is_libc and not f.inlined and not f.tailcall]
    if thread.native_method in (None, Unwinder.REGISTERS):
        return [], "the native stack of a thread without Python frames was not unwound"
    bases = {lib.path: lib.base for lib in snapshot.core.libraries}
    return [f"native:{_native_frame(f, bases)}" for f in frames[:NATIVE_DEPTH]], None


def _native_frame(f: NativeFrame, bases: dict[str, int]) -> str:
    where = object_name(f.library)
    if f.symbol:
        return f"{where}:{f.symbol}"
    base = bases.get(f.library or "")
    return f"{where}+0x{f.pc - base:x}" if base is not None and f.pc >= base else f"{where}+?"


def fingerprint_basis_v2(snapshot: ProcessSnapshot, crash: Crash) -> tuple[str, ...]:
    """The previous definition's basis (:data:`FINGERPRINT_VERSION` 2; see the module docstring), kept so
    that the keys a fleet stored can be mapped to the new ones."""
    basis = _head(snapshot, crash, v2=True)
    frames, _ = crash_python_frames(snapshot, replace(crash, handling=None))  # v2 knew no handler's own frames
    for p in (frames or ())[:PYTHON_DEPTH]:
        basis.append(f"python:{python_location(p.file).path}:{p.function}")
    return tuple(basis)


def _fault_word_v3(snapshot: ProcessSnapshot, crash: Crash, *, v2: bool) -> str:
    """The fault's kind as versions 2 and 3 judged it, from SIGSEGV's codes whatever the signal: the kinds
    added since (no-access, stack-overflow, past-end-of-file, misaligned, hardware-error) were "not-writable",
    "unmapped" or "mapped" there; version 2 also judged SIGILL's and SIGFPE's address as a data address."""
    addr, code = crash.fault_address, _signal_code(snapshot, crash)
    if crash.fault_kind is FaultKind.INSTRUCTION and not v2:
        return FaultKind.INSTRUCTION.value
    pc = addr if crash.fault_kind is FaultKind.INSTRUCTION else _first_fault_pc(snapshot, crash)
    if addr is None or code == SI_KERNEL:
        return FaultKind.UNKNOWN.value
    if addr < NEAR_NULL_LIMIT:
        return FaultKind.NEAR_NULL.value
    mapping = snapshot.core.find_mapping(addr)
    if mapping is None:
        return FaultKind.UNMAPPED.value
    if pc is not None and addr == pc and "x" not in mapping.perms:
        return FaultKind.NOT_EXECUTABLE.value
    if code == SEGV_ACCERR and "w" not in mapping.perms:
        return FaultKind.NOT_WRITABLE.value
    return FaultKind.MAPPED.value


def _signal_code(snapshot: ProcessSnapshot, crash: Crash) -> int:
    """The si_code of the first fault's signal: its signal frame's, else the core's."""
    thread = _crashed(snapshot, crash)
    frame = next((f for f in reversed(thread.signal_frames) if f.signal.signo == crash.signal), None) \
        if thread is not None else None
    if frame is not None:
        return frame.signal.code
    sig = snapshot.core.signal
    return sig.code if sig is not None and sig.signo == crash.signal else 0


def _first_fault_pc(snapshot: ProcessSnapshot, crash: Crash) -> int | None:
    """The instruction of the first fault: the interrupted one under a handler, else the thread's pc."""
    thread = _crashed(snapshot, crash)
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
