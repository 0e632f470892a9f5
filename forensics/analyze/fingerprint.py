"""The crash fingerprint: one short, stable hash of what makes two crashes the same bug.

One definition for every place a fingerprint appears: ``analyze`` (whichever methods read the
stacks), batch triage, the core handler's index and whatever publishes it later.  Two crashes
have one fingerprint when they are the same bug, whatever CPython ran it (3.8 or 3.15, release or
debug), whichever venv or image started it, and whether faulthandler or a crash reporter ran as
the process died; two different bugs have two.

The basis of version 4 (:data:`FINGERPRINT_VERSION`), in order (:func:`fingerprint_basis` returns the
strings, so a fingerprint can always be explained; ``analyze --json`` carries them as ``fingerprint_basis``):

``kind:``      the class of the first fault (a crash reporter's handler that faulted afterwards,
               or faulthandler, changes nothing: the fingerprint is the first fault's)
``signal:``    its signal
``handling:``  the signal whose handler the fault happened in, for a fault inside the handler of a signal
               that is no fault (SIGUSR1, SIGTERM); the parts below are then the handler's own frames,
               not the ones it interrupted (the same bug, wherever the signal arrived)
``heap:``      ``double-free`` for a heap abort that was one, whichever of glibc's checks caught it: every
               double-free message (tcache's, ``(top)``, ``(!prev)``, ``(fasttop)``) is one
               ``heap:double-free`` -- by the heap's anatomy, or by a message only a double free writes
               (tcache's, ``(fasttop)``).  Any other heap abort keeps ``abort:``
``abort:``     glibc's abort message (when there is one) with what differs between runs of one bug
               blanked: addresses and numbers in hex, the program name glibc puts first (argv[0]'s:
               ``python3.11:``, a venv's ``python:``), an assertion's source directory and line
``exception:`` the C++ exception ``std::terminate`` was called for, by its type_info's name
               (``St12out_of_range``: the ABI's spelling), read from the runtime's exception header
``fault:``     where the faulting address points (near-null, unmapped, no-access, stack-overflow,
               past-end-of-file, ...) for memory faults, read with the signal's own si_code
``pc:``        the object holding the faulting instruction (SIGSEGV, SIGBUS, SIGFPE, SIGILL: the
               interrupted instruction of the first fault), by :func:`object_name`: its ``.so``
               version and a C extension's ABI tag dropped (``_ctypes.cpython-312-x86_64-linux-gnu.so``
               and ``-314d-`` are ``_ctypes.so``), CPython itself ``python`` however it is linked
``function:``  whether or not Python frames are present, by :func:`frame_name` (``object:function``: a
               C++ name demangled without its parameters, glibc's IFUNC variants by their generic name,
               the object alone where the function has no name -- a stripped object's frame is named by
               its nearest exported symbol -- never an offset; CPython's and its standard library
               extensions' frames by the object alone): for a memory fault the function holding the
               faulting instruction; for an abort the first physical frame outside the C and C++
               runtimes' abort, assert, terminate and unwind machinery (libc, libstdc++, libgcc_s,
               libc++abi): the assertion's function, the code that threw, the caller of the ``free``
               glibc rejected -- found on the stack past the runtime's frames when the unwinder stops in
               them (the crashed C library's file not here).  Where no unwinder ran (``--native-method
               none``, gdb asked for and missing) a memory fault's function is still its program
               counter's, named from the object's symbols; an abort's is not known (the basis is partial)
``caller:``    for a memory fault in the C or C++ runtime (``memcpy`` given a bad pointer), the first frame
               outside them
``program:``   the executable's name, for a process that is not CPython
``python:``    the top 5 Python frames of the first fault's thread that ran before any handler, as
               ``path:function``: the path from its import root (``ctypes/__init__.py``,
               ``nvitop/api/device.py``; the file name elsewhere) and the function's own name
               (``co_name``: ``read_label``, never 3.11+'s qualified ``Poller.read_label``, which
               3.8-3.10 do not have); comprehension frames (``<listcomp>``), which 3.12 inlined,
               are left out; no line numbers, so an edit elsewhere in a file does not split one bug
``native:``    only for a thread that ran no Python code (a native library's own thread; a program
               that is not CPython): up to 5 frames past the abort machinery, outside libc, by
               :func:`frame_name`, physical frames only (inlined and tail-call frames differ between
               unwinders)

No addresses, offsets, pids, times or interpreter prefixes: ASLR, rebuilds, point releases, venvs and images
change those.  When a part the definition uses could not be read (Python stacks unavailable or cut short, the
handler/interrupted split unknown, a native stack not unwound or stopped inside the C runtime, an object whose
file is not here, a C++ name not demangled), the fingerprint is computed from the rest and
:attr:`Analysis.fingerprint_partial` says why: it may then differ from the same crash's complete fingerprint,
and batch triage marks it.  A snapshot (no crash) and a signal another process sent have no fingerprint.

The previous definition (version 3: no faulting function, an unnamed native frame by its offset, glibc's
message whatever the heap said, the fault's kind read with SIGSEGV's codes whatever the signal) stays
computable (:func:`fingerprint_basis_v3`); ``analyze --json`` carries it as ``fingerprint_v3`` beside the
fingerprint (and ``fingerprint_version``), so a fleet maps the keys it stored to the new ones.  Version 2 is
retired: no longer computed; its key stays in the documents written while it was the previous one (their
``fingerprint_v2``, read back as it was), where each version 3 key has its version 2 key beside it.
"""
from __future__ import annotations

import re

from ..digest import sha256
from ..model import (
    Crash,
    CrashKind,
    FaultKind,
    HeapFailureKind,
    HeapReport,
    LibraryStatus,
    NativeFrame,
    ProcessSnapshot,
    PyFrame,
    Thread,
)
from ..modes import Unwinder
from ..views.frames import first_fault_frames, skip_abort_machinery
from ..views.names import function_name, is_mangled, is_runtime_frame
from ..views.pyframes import python_location
from .cxx import sound_frames
from .classify import NEAR_NULL_LIMIT, SEGV_ACCERR, SI_KERNEL, is_python_process, normalize_message

__all__ = ["FINGERPRINT_VERSION", "PYTHON_DEPTH", "NATIVE_DEPTH", "fingerprint_basis", "fingerprint_basis_v3",
           "fingerprint", "crash_python_frames", "frame_name", "object_name", "normalize_abort_message"]

FINGERPRINT_VERSION = 4
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
#: glibc's messages only a double free writes ("(top)", "(!prev)" and "(out)" are also an overflow's)
_DOUBLE_FREE_ONLY = ("free(): double free detected in tcache", "double free or corruption (fasttop)")
#: glibc's assertion message: ``PROGRAM: FILE:LINE: FUNCTION: Assertion `EXPR' failed.`` (PROGRAM and its
#: ": " are left out when the program has no name)
_ASSERT = re.compile(r"^(?:[^:\n]*: )?([^\n]*?):\d+: ([^\n]*?: Assertion )")
#: __fortify_fail's older form: ``*** stack smashing detected ***: PROGRAM terminated``
_FORTIFY = re.compile(r"(\*\*\*: ).*( terminated)$")


def _lib(name: str | None) -> str:
    """``libnvidia-ml.so.580.126.09`` -> ``libnvidia-ml.so``: the file name without its ``.so`` version.

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


def _head(snapshot: ProcessSnapshot, crash: Crash) -> list[str]:
    """Version 3's kind, signal, abort, fault, pc and program: the parts read from the core's facts."""
    basis = [f"kind:{crash.kind.value}", f"signal:{crash.signal_name or '-'}"]
    if crash.abort_message and crash.kind in (CrashKind.HEAP_CORRUPTION, CrashKind.ABORT):
        basis.append(f"abort:{normalize_abort_message(crash.abort_message)}")
    core = snapshot.core
    if crash.fault_kind is not None:
        basis.append(f"fault:{_fault_word_v3(snapshot, crash)}")
    name = object_name
    if crash.kind in _MEMORY_FAULTS:
        pc = _first_fault_pc(snapshot, crash)
        mapping = core.find_mapping(pc) if pc is not None else None
        basis.append(f"pc:{name(mapping.path if mapping is not None else None)}")
    if not is_python_process(core):
        basis.append(f"program:{name(core.executable or core.command)}")
    return basis


def fingerprint_basis(snapshot: ProcessSnapshot, crash: Crash,
                      heap: HeapReport | None = None) -> tuple[tuple[str, ...], str | None]:
    """The exact strings hashed, in order, and why the basis is partial (None when whole): version 4, see the
    module docstring for the parts.

    :param heap: glibc's heap as read for the crash (its anatomy says which corruption a heap abort was)
    """
    basis = [f"kind:{crash.kind.value}", f"signal:{crash.signal_name or '-'}"]
    if crash.handling is not None:
        basis.append(f"handling:{crash.handling.signal_name}")
    partial: str | None = None
    heap_class = _heap_class(crash, heap)
    if heap_class is not None:
        basis.append(f"heap:{heap_class}")
    elif crash.abort_message and crash.kind in (CrashKind.HEAP_CORRUPTION, CrashKind.ABORT):
        basis.append(f"abort:{normalize_abort_message(crash.abort_message)}")
        if crash.kind is CrashKind.HEAP_CORRUPTION and heap is not None and heap.problems:
            partial = f"the heap's anatomy could not say which corruption it was ({heap.problems[0]})"
    thread = _crashed(snapshot, crash)
    exc = thread.cxx_exception if thread is not None else None
    if exc is not None and crash.kind is CrashKind.ABORT:
        basis.append(f"exception:{exc.mangled}")
    core = snapshot.core
    if crash.fault_kind is not None:
        basis.append(f"fault:{crash.fault_kind.value}")
    if crash.kind in _MEMORY_FAULTS:
        pc = _first_fault_pc(snapshot, crash)
        mapping = core.find_mapping(pc) if pc is not None else None
        basis.append(f"pc:{object_name(mapping.path if mapping is not None else None)}")
    function_why = None
    if thread is not None and crash.kind in (*_MEMORY_FAULTS, CrashKind.ABORT, CrashKind.HEAP_CORRUPTION):
        parts, function_why = _function_parts(snapshot, thread, crash)
        basis += parts
    if not is_python_process(core):
        basis.append(f"program:{object_name(core.executable or core.command)}")
    frames, why = crash_python_frames(snapshot, crash)
    partial = why or partial or function_why  # the Python frames' reason first: it says the most
    kept = [p for p in frames or () if p.function not in _COMPREHENSIONS]
    for p in kept[:PYTHON_DEPTH]:
        basis.append(f"python:{python_location(p.file).path}:{p.function.rsplit('.', 1)[-1]}")
    if frames is not None and not frames and thread is not None:
        native, why = _native_parts_v4(thread, crash)
        basis += native
        partial = partial or why
    return tuple(basis), partial


def _heap_class(crash: Crash, heap: HeapReport | None) -> str | None:
    """``double-free`` for a heap abort that was one, whichever of glibc's checks caught it: by the heap's
    anatomy, or by a message only a double free writes (tcache's, ``(fasttop)``); None otherwise (the
    message is kept: an overflow's, a double free the anatomy could not tell from one)."""
    if crash.kind is not CrashKind.HEAP_CORRUPTION:
        return None
    if heap is not None and heap.corruption is not None and heap.corruption.kind is HeapFailureKind.DOUBLE_FREE:
        return "double-free"
    if (crash.abort_message or "").startswith(_DOUBLE_FREE_ONLY):
        return "double-free"
    return None


def frame_name(f: NativeFrame) -> str:
    """A frame as version 4 names it: ``object:function`` (:func:`object_name`; the function by
    :func:`~forensics.views.names.function_name`: demangled, without parameters, glibc's IFUNC variants by their
    generic name), the object alone where the function has no name, and CPython's own frames ``python`` and
    its standard library's extension modules (``lib-dynload/_ctypes...so``) by the object alone: their internal
    functions differ between versions and builds (ctypes' ``c_int`` getter is ``i_get`` up to 3.13,
    ``i32_get`` since 3.14), and the Python frames say where.

    >>> frame_name(NativeFrame(index=0, pc=1, symbol="_ZN3app12parse_headerEPKc", offset=8,
    ...                        library="/opt/lib/libthrower.so"))
    'libthrower.so:app::parse_header'
    >>> frame_name(NativeFrame(index=0, pc=1, symbol=None, offset=None, library="/usr/lib/libnvidia-ml.so.580.1"))
    'libnvidia-ml.so'
    """
    where = object_name(f.library)
    name = function_name(f.symbol)
    if where == "python" or not name or "/lib-dynload/" in (f.library or ""):
        return where
    return f"{where}:{name}"


def _physical(frames) -> list[NativeFrame]:
    return [f for f in frames if not f.inlined and not f.tailcall]



def _function_parts(snapshot: ProcessSnapshot, thread: Thread, crash: Crash) -> tuple[list[str], str | None]:
    """``function:`` (and ``caller:``) of a native fault or an abort, and why they are partial.

    A memory fault's function is the one holding the faulting instruction; one in the C or C++ runtime
    (``memcpy`` given a bad pointer) is followed by its caller outside them.  An abort's is the first frame
    outside the runtimes' abort, assert, terminate and unwind machinery: the assertion's function, the code
    that threw the C++ exception, the caller of the ``free`` glibc rejected.

    Where no unwinder ran (``--native-method none``, gdb asked for and missing), the thread's program counter is
    still a memory fault's faulting instruction (the analysis names its function: :func:`.enrich.with_named_pc`),
    so its function is what an unwinder gives; an abort's culprit and a runtime function's caller lie further
    down the stack, which only an unwinder walks: not known then, and said."""
    not_unwound = "the faulting thread's native stack was not unwound (its function is not known)"
    unwound = thread.native_method not in (None, Unwinder.REGISTERS) or len(thread.native_frames) > 1
    if not unwound and crash.kind not in _MEMORY_FAULTS:
        return [], not_unwound
    frames = _physical(first_fault_frames(thread, crash)[0])
    if not frames:
        return [], None if unwound else not_unwound
    out: list[str] = []
    if crash.kind in _MEMORY_FAULTS:
        out.append(f"function:{frame_name(frames[0])}")
        if not is_runtime_frame(frames[0]):
            return out, _why_unnamed(snapshot, frames[0])
        if not unwound:
            return out, ("the faulting thread's native stack was not unwound (the caller of the C runtime's "
                         "function is not known)")
    culprit = next((f for f in sound_frames(frames, snapshot.core) if not is_runtime_frame(f)), None) \
        or thread.scanned_caller
    if culprit is None:
        return out, (f"the native stack stops inside the C runtime ({thread.native_error}): the "
                     f"{'abort' if crash.kind is not CrashKind.SEGV else 'fault'}'s caller is not known"
                     if thread.native_error else None)
    out.append(f"{'caller' if out else 'function'}:{frame_name(culprit)}")
    return out, _why_unnamed(snapshot, culprit)


def _why_unnamed(snapshot: ProcessSnapshot, f: NativeFrame) -> str | None:
    """Why a frame the basis names is not named as it would be with the crashed process's own files."""
    if f.symbol and is_mangled(f.symbol):
        return f"C++ names are not demangled here (no libstdc++.so.6 to do it): {f.symbol[:80]}"
    if f.symbol:
        return None
    lib = next((lib for lib in snapshot.core.libraries if lib.path == f.library), None)
    if lib is not None and lib.status in (LibraryStatus.MISSING, LibraryStatus.MISMATCH):
        return f"the file of {lib.path} is {lib.status.value} here: its functions are not named"
    return None


def _native_parts_v4(thread: Thread, crash: Crash) -> tuple[list[str], str | None]:
    """``native:`` parts of a thread that ran no Python code: its frames past the abort machinery, outside libc."""
    if thread.native_method in (None, Unwinder.REGISTERS):
        return [], "the native stack of a thread without Python frames was not unwound"
    frames = [f for f in _physical(skip_abort_machinery(first_fault_frames(thread, crash)[0])) if not f.is_libc]
    return [f"native:{frame_name(f)}" for f in frames[:NATIVE_DEPTH]], None


def fingerprint_basis_v3(snapshot: ProcessSnapshot, crash: Crash) -> tuple[tuple[str, ...], str | None]:
    """The previous definition's basis (version 3, see the module docstring) and why it is partial, kept so that
    the keys a fleet stored can be mapped to the new ones."""
    basis = _head(snapshot, crash)
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
    return [f"native:{_native_frame_v3(f, bases)}" for f in frames[:NATIVE_DEPTH]], None


def _native_frame_v3(f: NativeFrame, bases: dict[str, int]) -> str:
    where = object_name(f.library)
    if f.symbol:
        return f"{where}:{f.symbol}"
    base = bases.get(f.library or "")
    return f"{where}+0x{f.pc - base:x}" if base is not None and f.pc >= base else f"{where}+?"


def _fault_word_v3(snapshot: ProcessSnapshot, crash: Crash) -> str:
    """The fault's kind as version 3 judged it, from SIGSEGV's codes whatever the signal: the kinds added
    since (no-access, stack-overflow, past-end-of-file, misaligned, hardware-error) were "not-writable",
    "unmapped" or "mapped" there."""
    addr, code = crash.fault_address, _signal_code(snapshot, crash)
    if crash.fault_kind is FaultKind.INSTRUCTION:
        return FaultKind.INSTRUCTION.value
    pc = _first_fault_pc(snapshot, crash)
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
