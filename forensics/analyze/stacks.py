"""Build threads from the native frames and the walker's Python stacks, and merge them.

Pure functions: the native stacks arrive as records from an unwinder (:mod:`forensics.unwind`'s libdw,
or gdb's ``forensics-native`` parsed by :mod:`forensics.gdb`); the Python stacks arrive as
records (:class:`~forensics.model.PythonStacks`, from :mod:`forensics.pyread`).
"""
from __future__ import annotations

from dataclasses import replace

from ..model import (CoreFile, NativeFrame, NativeStack, PythonMethod, PythonStacks, PythonStatus,
                     PyThreadStack,
                     Thread)
from .classify import is_snapshot

__all__ = ["with_core_libraries", "build_threads", "join_thread_states", "choose_python_stacks",
           "compare_python_stacks", "python_stacks_problem", "python_status_line"]

def with_core_libraries(core: CoreFile, frames: tuple[NativeFrame, ...]) -> tuple[NativeFrame, ...]:
    """An unwinder's frames with each library named as the core names it (a caller frame by its call
    instruction, ``pc - 1``); the unwinder's name where the core maps nothing there.

    A call instruction is code: where ``pc - 1`` is not executable, or ``pc`` starts an executable mapping no
    file backs, the frame was returned to without a call -- qemu-user's AArch64 sigreturn trampoline, an
    anonymous page that may lie just above an object's data -- and is named by ``pc`` itself."""
    out = []
    for i, f in enumerate(frames):
        mapping = core.find_mapping(f.pc)
        if i and f.pc and not (mapping is not None and mapping.path is None and "x" in mapping.perms
                               and mapping.start == f.pc):
            caller = core.find_mapping(f.pc - 1)
            mapping = caller if caller is not None and "x" in caller.perms else mapping
        library = mapping.path if mapping is not None and mapping.path else f.library
        out.append(f if f.index == i and f.library == library else replace(f, index=i, library=library))
    return tuple(out)


def build_threads(core: CoreFile, native: tuple[NativeStack, ...], python: PythonStacks | None) -> tuple[Thread, ...]:
    """Threads ordered crashed first, then as the unwinder numbers them; Python threads matched by LWP.

    A Python thread's ``error`` (its stack stopped short) becomes the thread's ``python_error``.
    The thread whose tid is the pid is the main thread; in a snapshot (a core of a live process)
    no thread crashed.
    """
    py_by_tid: dict[int, PyThreadStack] = {}
    gil_tid = None
    # a partial record still carries the threads read before the walk stopped
    if python is not None and python.status in (PythonStatus.OK, PythonStatus.PARTIAL):
        states: dict[int, list[PyThreadStack]] = {}
        for t in python.threads:
            if t.native_thread_id is not None:
                states.setdefault(t.native_thread_id, []).append(t)
        py_by_tid = {tid: join_thread_states(ts) for tid, ts in states.items()}
        gil_tid = python.gil_holder
    crashed = None if is_snapshot(core) else core.crashed_tid
    threads = []
    seen = set()
    named: dict[int, tuple[NativeFrame, ...]] = {}  # id(an unwinder's frames) -> them named: threads share stacks
    for stack in native:
        tid = stack.tid
        seen.add(tid)
        py = py_by_tid.get(tid)
        frames = named.get(id(stack.frames))
        if frames is None:
            frames = named[id(stack.frames)] = with_core_libraries(core, stack.frames)
        threads.append(
            Thread(
                tid=tid,
                name=py.name if py else None,
                is_crashed=tid == crashed,
                holds_gil=bool(py and py.holds_gil) or (gil_tid is not None and gil_tid == tid),
                native_frames=frames,
                py_frames=py.frames if py else (),
                native_error=stack.error,
                native_method=stack.method,
                python_error=py.error if py else None,
                interpreter_id=py.interpreter_id if py else None,
                is_main=tid == core.pid,
            )
        )
    # A Python thread state with no native thread (it exited, or the unwinder lost it) is still shown.
    for tid, py in py_by_tid.items():
        if tid not in seen:
            threads.append(
                Thread(
                    tid=tid, name=py.name, is_crashed=tid == crashed, holds_gil=py.holds_gil,
                    native_frames=(), py_frames=py.frames,
                    native_error="no native thread with this id in the core",
                    python_error=py.error, interpreter_id=py.interpreter_id, is_main=tid == core.pid,
                )
            )
    threads.sort(key=lambda th: (not th.is_crashed,))
    return tuple(threads)


def join_thread_states(states: list[PyThreadStack]) -> PyThreadStack:
    """One OS thread's thread states (one per interpreter it entered) as one stack, innermost first.

    A thread that calls into a subinterpreter (``concurrent.interpreters``' ``exec``) keeps its state
    in the main interpreter, whose frames made that call, and runs the subinterpreter's frames on
    top: the states of later (higher-id) interpreters come first.  Its name is the one the main
    interpreter's ``threading`` gave it (a subinterpreter sees a foreign thread as ``Dummy-N``).

    >>> from forensics.model import PyFrame
    >>> a = PyThreadStack(native_thread_id=7, thread_id=1, name="Dummy-1", holds_gil=False, interpreter_id=1,
    ...                   frames=(PyFrame(function="sub", file="<script>", line=3, interpreter_id=1),))
    >>> b = PyThreadStack(native_thread_id=7, thread_id=1, name="runner", holds_gil=False, interpreter_id=0,
    ...                   frames=(PyFrame(function="exec", file="i.py", line=9, interpreter_id=0),))
    >>> t = join_thread_states([b, a])
    >>> t.name, [f.function for f in t.frames], t.interpreter_id
    ('runner', ['sub', 'exec'], 1)
    """
    if len(states) == 1:
        return states[0]
    ordered = sorted(states, key=lambda s: -(s.interpreter_id or 0))
    names = [s.name for s in sorted(states, key=lambda s: s.interpreter_id or 0) if s.name]
    name = next((n for n in names if not n.startswith("Dummy-")), names[0] if names else None)
    errors = [f"interpreter {s.interpreter_id}: {s.error}" for s in ordered if s.error]
    return replace(ordered[0], name=name, holds_gil=any(s.holds_gil for s in states),
                   frames=tuple(f for s in ordered for f in s.frames), error="; ".join(errors) or None)


# -- the two methods' Python stacks: choose, compare, say why -------------------------------------


def choose_python_stacks(direct: PythonStacks | None,
                         gdb: PythonStacks | None) -> tuple[PythonStacks | None, PythonMethod]:
    """The Python stacks ``auto`` (and ``both``) shows, and the method whose layout gave them.

    The direct reader's when whole; else gdb's (DWARF layout) when whole; else the
    direct reader's partial stacks; else gdb's partial ones; else the direct reader's
    record (its reason), or gdb's when the direct reader gave none.

    >>> from forensics.model import PythonStacks, PythonStatus
    >>> ok, part = PythonStacks(status=PythonStatus.OK), PythonStacks(status=PythonStatus.PARTIAL)
    >>> choose_python_stacks(ok, None)[1].value, choose_python_stacks(part, ok)[1].value
    ('direct', 'gdb')
    """
    for stacks, method in ((direct, PythonMethod.DIRECT), (gdb, PythonMethod.GDB)):
        if stacks is not None and stacks.is_whole:
            return stacks, method
    for stacks, method in ((direct, PythonMethod.DIRECT), (gdb, PythonMethod.GDB)):
        if stacks is not None and stacks.status is PythonStatus.PARTIAL and stacks.threads:
            return stacks, method
    if direct is not None:
        return direct, PythonMethod.DIRECT
    return gdb, PythonMethod.GDB


def compare_python_stacks(gdb: PythonStacks | None, direct: PythonStacks | None) -> list[str]:
    """Where the stacks walked with gdb's DWARF layout and with the direct reader's layout disagree.

    Thread by thread (matched by LWP): its name, whether it holds the GIL, whether its
    stack was cut short, and its frames (function, file, line), frame for frame; a
    differing status is said and the threads are still compared.

    >>> from forensics.model import PyFrame, PyThreadStack, PythonStacks, PythonStatus
    >>> t = PyThreadStack(native_thread_id=7, thread_id=1, name="MainThread", holds_gil=True,
    ...                   frames=(PyFrame(function="main", file="a.py", line=3),))
    >>> one = PythonStacks(status=PythonStatus.OK, threads=(t,))
    >>> compare_python_stacks(one, one)
    []
    """
    if gdb is None or direct is None:
        return ["one method gave no result"]
    out = []
    if gdb.status is not direct.status:  # said, and the threads are still compared
        out.append(f"status {gdb.status.value} (gdb) vs {direct.status.value} (direct)")
    for side, stacks in (("gdb", gdb), ("direct", direct)):
        if not stacks.threads and stacks.status is not PythonStatus.OK:
            return out + [f"{side} gave no stacks: {stacks.detail}"]  # nothing to compare thread by thread
    # a thread has one state per interpreter it entered: matched by (LWP, interpreter)
    ta = {(t.native_thread_id, t.interpreter_id): t for t in gdb.threads}
    tb = {(t.native_thread_id, t.interpreter_id): t for t in direct.threads}
    for key in sorted(set(ta) | set(tb), key=lambda k: (k[0] is None, k[0] or 0, k[1] or 0)):
        tid = key[0] if not key[1] else f"{key[0]} (interpreter {key[1]})"
        if key not in ta or key not in tb:
            out.append(f"thread {tid} only in {'gdb' if key in ta else 'direct'}")
            continue
        a, b = ta[key], tb[key]
        if a.name != b.name:
            out.append(f"thread {tid}: name {a.name!r} (gdb) vs {b.name!r} (direct)")
        if a.holds_gil != b.holds_gil:
            out.append(f"thread {tid}: holds the GIL {a.holds_gil} (gdb) vs {b.holds_gil} (direct)")
        if bool(a.error) != bool(b.error):
            side, err = ("gdb", a.error) if a.error else ("direct", b.error)
            out.append(f"thread {tid}: stack cut short by {side} only ({err})")
        fa = [(f.function, f.file, f.line) for f in a.frames]
        fb = [(f.function, f.file, f.line) for f in b.frames]
        for i, (x, y) in enumerate(zip(fa, fb, strict=False)):  # the common part; a longer stack is said below
            if x != y:
                out.append(f"thread {tid} frame {i}: {x} (gdb) vs {y} (direct)")
                break
        if len(fa) != len(fb):
            out.append(f"thread {tid}: {len(fa)} frames (gdb) vs {len(fb)} (direct)")
    return out


def python_stacks_problem(stacks: PythonStacks | None, method: str) -> str | None:
    """Why a method gave no stacks to compare (it could not run, or read nothing); None when it gave some.

    >>> from forensics.model import PythonStacks, PythonStatus
    >>> python_stacks_problem(PythonStacks(status=PythonStatus.UNSUPPORTED, detail="gdb: no DWARF"), "gdb")
    'gdb could not read Python stacks: unsupported (gdb: no DWARF)'
    >>> python_stacks_problem(PythonStacks(status=PythonStatus.OK), "direct") is None
    True
    """
    if stacks is None:
        return f"{method} gave no result"
    if stacks.status is PythonStatus.OK or (stacks.status is PythonStatus.PARTIAL and stacks.threads):
        return None
    return f"{method} could not read Python stacks: {stacks.status.value}" + (
        f" ({stacks.detail})" if stacks.detail else "")


def python_status_line(stacks: PythonStacks | None, *, python_process: bool) -> str:
    """The snapshot's one line about the Python stacks: ``ok``, or what is missing and why (said once).

    >>> from forensics.model import PythonStacks, PythonStatus
    >>> python_status_line(PythonStacks(status=PythonStatus.PARTIAL, detail="tid 7: frame cycle at 0x10"),
    ...                    python_process=True)
    'partial: tid 7: frame cycle at 0x10'
    """
    if stacks is None:
        return "unavailable: no method gave a result" if python_process else "not a Python process"
    if stacks.status is PythonStatus.OK:
        return "ok"
    if stacks.status is PythonStatus.NOT_PYTHON or (not python_process and not stacks.threads):
        return "not a Python process"
    if stacks.status is PythonStatus.PARTIAL:
        return f"partial: {stacks.detail}"
    if stacks.status is PythonStatus.NO_INTERPRETER:
        return f"no interpreter: {stacks.detail}"
    return f"unavailable: {stacks.detail or stacks.status.value}"
