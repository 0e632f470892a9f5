"""Build threads from gdb's native frames and the interpreter's Python frames, and merge them.

Pure functions: the dicts come from ``gdb_scripts/`` JSON (see forensics.gdb).
"""
from __future__ import annotations

from typing import Iterator

from ..model import CoreFile, FrameKind, NativeFrame, PyFrame, Thread
from .classify import is_snapshot

__all__ = ["parse_native_frames", "parse_py_frames", "build_threads", "merge_frames", "meaningful_native_frames",
           "skip_abort_machinery"]

_ABORT_MACHINERY = frozenset(
    {
        "raise", "abort", "__GI_raise", "__GI_abort", "__pthread_kill_implementation",
        "__pthread_kill_internal", "__pthread_kill", "pthread_kill", "__libc_message",
        "malloc_printerr", "__libc_fatal", "__assert_fail", "__assert_fail_base",
    }
)


def parse_native_frames(core: CoreFile, frames: list[dict]) -> tuple[NativeFrame, ...]:
    """Native frames from a native-stack document (libdw's or forensics-native's JSON); the library is
    named as the core names it."""
    out = []
    for i, f in enumerate(frames):
        pc = int(f.get("pc") or 0)
        mapping = core.find_mapping(pc - 1 if i and pc else pc)
        library = mapping.path if mapping is not None and mapping.path else f.get("library")
        out.append(
            NativeFrame(
                index=i,
                pc=pc,
                symbol=f.get("function") or None,
                offset=f.get("offset"),
                library=library,
                file=f.get("file"),
                line=f.get("line"),
                inlined=bool(f.get("inlined")),
                tailcall=bool(f.get("tailcall")),
            )
        )
    return tuple(out)


def parse_py_frames(frames: list[dict]) -> tuple[PyFrame, ...]:
    return tuple(
        PyFrame(
            function=str(f.get("function") or "???"),
            file=str(f.get("file") or "???"),
            line=f.get("line"),
            is_entry=bool(f.get("is_entry", True)),
        )
        for f in frames
    )


def build_threads(core: CoreFile, native: dict, python: dict | None) -> tuple:
    """Threads ordered crashed first, then as gdb numbers them; Python threads matched by LWP.

    A Python thread's ``error`` (its stack stopped short) becomes the thread's ``python_error``.
    The thread whose tid is the pid is the main thread; in a snapshot (a core of a live process)
    no thread crashed.
    """
    py_by_tid: dict[int, dict] = {}
    gil_tid = None
    # "error" still carries the threads read before the walk stopped (a corrupted interpreter state)
    if python and python.get("status") in ("ok", "error"):
        for t in python.get("threads", []):
            if t.get("native_thread_id") is not None:
                py_by_tid[int(t["native_thread_id"])] = t
        gil_tid = python.get("gil_holder_native_id")
    crashed = None if is_snapshot(core) else core.crashed_tid
    threads = []
    seen = set()
    for t in native.get("threads", []):
        tid = int(t["lwp"])
        seen.add(tid)
        py = py_by_tid.get(tid, {})
        threads.append(
            Thread(
                tid=tid,
                name=py.get("name"),
                is_crashed=tid == crashed,
                holds_gil=bool(py.get("holds_gil")) or (gil_tid is not None and gil_tid == tid),
                native_frames=parse_native_frames(core, t.get("frames", [])),
                py_frames=parse_py_frames(py.get("frames", [])),
                native_error=t.get("error"),
                native_method=t.get("method"),
                python_error=py.get("error") or None,
                is_main=tid == core.pid,
            )
        )
    # A Python thread state with no native thread (it exited, or gdb lost it) is still shown.
    for tid, py in py_by_tid.items():
        if tid not in seen:
            threads.append(
                Thread(
                    tid=tid, name=py.get("name"), is_crashed=tid == crashed, holds_gil=bool(py.get("holds_gil")),
                    native_frames=(), py_frames=parse_py_frames(py.get("frames", [])),
                    native_error="no native thread with this id in the core",
                    python_error=py.get("error") or None, is_main=tid == core.pid,
                )
            )
    threads.sort(key=lambda th: (not th.is_crashed,))
    return tuple(threads)


def merge_frames(thread: Thread) -> Iterator[tuple[FrameKind, NativeFrame | PyFrame]]:
    """The merged view: Python frames stand where their evaluation-loop native frames stand.

    Each ``_PyEval_EvalFrameDefault`` native frame runs one group of Python frames: up to
    and including the next entry frame (CPython 3.11+ runs several Python calls in one C
    call; before 3.11 every frame is an entry frame).  Python frames left over when the
    native stack ends early are yielded at the end.
    """
    py = iter(thread.py_frames)
    pending = list(thread.py_frames)
    used = 0
    for nf in thread.native_frames:
        if nf.is_eval_frame and used < len(pending):
            for pf in py:
                used += 1
                yield FrameKind.PYTHON, pf
                if pf.is_entry:
                    break
        else:
            yield FrameKind.NATIVE, nf
    for pf in py:
        yield FrameKind.PYTHON, pf


def meaningful_native_frames(thread: Thread) -> list[NativeFrame]:
    """Native frames past the abort/raise machinery, the ones that say where it happened."""
    return skip_abort_machinery(thread.native_frames)


def skip_abort_machinery(native_frames: tuple[NativeFrame, ...]) -> list[NativeFrame]:
    """``native_frames`` from the first one past the abort/raise machinery (raise, abort, malloc_printerr)."""
    frames = list(native_frames)
    i = 0
    while i < len(frames) and frames[i].symbol in _ABORT_MACHINERY:
        i += 1
    return frames[i:]
