"""Views of a thread's frames, read from the analysis record: the first fault's frames (below any handler), the
merged native-and-Python stack, the frames past the abort machinery.

Pure functions over :mod:`forensics.model`'s records: the pipeline (:mod:`forensics.analyze`) uses them while it
builds an analysis, and every reader of one (``analyze``'s text and JSON, ``report`` on a JSON document) uses them
without loading the pipeline or a core reader.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..model import Crash, FrameKind, NativeFrame, PyFrame, Thread

__all__ = ["first_fault_frames", "merge_frames", "meaningful_native_frames", "skip_abort_machinery"]

_ABORT_MACHINERY = frozenset(
    {
        "raise", "abort", "__GI_raise", "__GI_abort", "__pthread_kill_implementation",
        "__pthread_kill_internal", "__pthread_kill", "pthread_kill", "__libc_message",
        "malloc_printerr", "__libc_fatal", "__assert_fail", "__assert_fail_base",
    }
)


def first_fault_frames(thread: Thread, crash: Crash) -> tuple[tuple[NativeFrame, ...], tuple[PyFrame, ...] | None]:
    """The native and Python frames that ran the first fault on its thread: those below any handler (what
    the handler interrupted), or, for a fault inside the handler of a signal that is no fault
    (``crash.handling``), the handler's own frames, above its signal frame.  The Python frames are None
    when the split is unknown (the native stack was not unwound)."""
    if crash.handling is None or not thread.signal_frames:
        return thread.interrupted_native_frames, thread.interrupted_py_frames
    inner = thread.signal_frames[0]
    if inner.native_index is None:
        return thread.native_frames[:1], None
    py = thread.py_frames[:inner.py_index] if inner.py_index is not None else None
    return thread.native_frames[:inner.native_index], py


def merge_frames(thread: Thread) -> Iterator[tuple[FrameKind, NativeFrame | PyFrame]]:
    """The merged view: Python frames stand where their evaluation-loop native frames stand.

    Each ``_PyEval_EvalFrameDefault`` native frame runs one group of Python frames: up to
    and including the next entry frame (CPython 3.11+ runs several Python calls in one C
    call; before 3.11 every frame is an entry frame).  In 3.14's tail-calling interpreter
    the innermost native frame of one evaluation is an opcode handler (``_TAIL_CALL_*``)
    above its ``_PyEval_EvalFrameDefault``: the group stands at the handler, and the
    ``_PyEval_EvalFrameDefault`` under it is shown as a native frame.  Python frames left
    over when the native stack ends early are yielded at the end.
    """
    py = iter(thread.py_frames)
    pending = len(thread.py_frames)
    used = 0
    for nf, takes_group in zip(thread.native_frames, _group_places(thread.native_frames), strict=True):
        if takes_group and used < pending:
            for pf in py:
                used += 1
                yield FrameKind.PYTHON, pf
                if pf.is_entry:
                    break
        else:
            yield FrameKind.NATIVE, nf
    for pf in py:
        yield FrameKind.PYTHON, pf


#: the last native stacks :func:`_group_places` read, by id, each kept with its answer (so no id is reused while
#: it is here): threads stopped at the same pcs share one tuple of frames, and an analysis merges each thread
#: several times (the text, the document, the signature)
_PLACES: dict[int, tuple[tuple[NativeFrame, ...], tuple[bool, ...]]] = {}
_MAX_PLACES = 256


def _group_places(frames: tuple[NativeFrame, ...]) -> tuple[bool, ...]:
    """For each native frame, whether a group of Python frames stands in its place (:func:`merge_frames`)."""
    known = _PLACES.get(id(frames))
    if known is not None and known[0] is frames:
        return known[1]
    places = []
    in_handler = False  # the previous (inner) native frame was a tail-call handler of this evaluation
    for nf in frames:
        handler, evaluates = nf.is_tail_call_handler, nf.is_eval_frame
        places.append(evaluates and not (in_handler and not handler))
        in_handler = handler or (in_handler and not evaluates)
    out = tuple(places)
    if len(_PLACES) >= _MAX_PLACES:
        _PLACES.clear()
    _PLACES[id(frames)] = (frames, out)
    return out


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
