"""Who freed the chunk glibc aborted on, and what that says when no Python object owns the buffer.

glibc checks a chunk when it is freed; the crashing thread's native frames show who called
``free()``.  When that caller is a native library (not libc, not the interpreter, not ctypes or
libffi) and nothing the Python side holds -- no ctypes buffer or pointer among the crashing
thread's frame locals, no argument of the native call in progress -- points into the chunk, the
buffer that overflowed is that library's own allocation, freed by the library inside the call:
no buffer the binding passed and no count it gave was involved
(:attr:`~forensics.model.OverflowVerdict.LIBRARY`).  Otherwise the verdict stays undetermined and
the reason says which of these did not hold.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from forensics.model import HeapCorruption, NativeFree, NativeFrame, OverflowVerdict, PyFrame

__all__ = ["ALLOCATOR", "who_freed", "library_verdict"]

#: glibc's allocator entry points and internals, innermost frames of a crash in one of them
ALLOCATOR = ("free", "__libc_free", "__GI___libc_free", "cfree", "_int_free", "_int_free_chunk",
             "_int_free_merge_chunk", "_int_free_create_chunk", "_int_free_maybe_consolidate", "malloc",
             "__libc_malloc", "_int_malloc", "realloc", "__libc_realloc", "__GI___libc_realloc", "_int_realloc",
             "calloc", "__libc_calloc")
#: the entry points that free a chunk (after ``__GI___libc_`` / ``__libc_`` are cut off)
_FREES = ("free", "cfree", "realloc")
#: free()'s workers, which it may tail-call and so leave no frame of its own: the outermost allocator frame
#: below a caller outside the allocator is then free()'s (glibc 2.43 on AArch64 ends free() in
#: ``b _int_free_chunk``)
_TAIL_CALLED_BY_FREE = ("_int_free", "_int_free_chunk")
#: C++'s operator delete (libstdc++, libc++): a wrapper of free(), the code above it freed the memory
_DELETE = ("_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t")
#: object files whose free() is on behalf of Python or its ctypes (the buffer may be the binding's)
_PYTHON_SIDE = ("_ctypes", "libffi")
#: language runtimes: they free for the code that called them
_RUNTIMES = ("ld-linux", "libstdc++", "libc++", "libgcc_s")


def _name(frame: NativeFrame) -> str:
    return frame.symbol or f"0x{frame.pc:x}"


def _is_allocator(frame: NativeFrame) -> bool:
    return (frame.is_libc and frame.symbol in ALLOCATOR) or (frame.symbol or "").startswith(_DELETE)


def _kind(frame: NativeFrame) -> str | None:
    """Why ``frame``'s free() is not a native library's own, or None when it is one."""
    lib = frame.library_name
    if not lib:
        return "code in no mapped file"
    if frame.is_libc:
        return "the C library"
    if frame.is_python_runtime:
        return "the Python interpreter"
    if lib.startswith(_PYTHON_SIDE):
        return "ctypes"
    if lib.startswith(_RUNTIMES):
        return "a language runtime"
    return None


def who_freed(frames: Sequence[NativeFrame],
              py_frames: Sequence[PyFrame] = ()) -> tuple[NativeFree, NativeFrame] | None:
    """The free() (or realloc()) glibc aborted in, and its caller's frame; None when the crashing thread's
    native frames show none (not unwound, not a crash in the allocator, or one in malloc())."""
    frames = list(frames)
    for i, f in enumerate(frames):
        if not (f.is_libc and f.symbol in ALLOCATOR):
            continue
        j = i
        while j + 1 < len(frames) and _is_allocator(frames[j + 1]):
            j += 1
        if j + 1 >= len(frames):
            return None
        entry = next((g.symbol for g in reversed(frames[i:j + 1]) if g.is_libc), f.symbol) or "free"
        entry = entry.replace("__GI___libc_", "").replace("__libc_", "")
        if entry in _TAIL_CALLED_BY_FREE:
            entry = "free"
        if entry not in _FREES:
            return None
        caller = frames[j + 1]
        call = None
        if _kind(caller) is None:  # a native library: the outermost of its frames is the call it was inside
            k = j + 1
            while k + 1 < len(frames) and frames[k + 1].library == caller.library:
                k += 1
            call = _name(frames[k])
        py = py_frames[0] if py_frames else None
        return NativeFree(entry=entry, function=_name(caller), library=caller.library, call=call,
                          python_caller=f"{py.function} ({(py.file or '?').rsplit('/', 1)[-1]}:{py.line})"
                          if py is not None else None), caller
    return None


def library_verdict(c: HeapCorruption, frames: Sequence[NativeFrame], py_frames: Sequence[PyFrame],
                    pointers: Sequence[tuple[str, int, int]] | None, locals_problem: str | None = None,
                    ) -> HeapCorruption:
    """``c`` with who freed the chunk, and -- when its buffer no Python object owns and a native library
    freed it inside the call, with nothing of the Python side pointing into it -- the library's verdict.

    :param pointers: ``(what, start, end)`` the Python side holds
        (:func:`forensics.pyread.locals.python_pointers`); None when the frames' locals were not read
    :param locals_problem: why the crashing thread's Python locals could not be read
    """
    found = who_freed(frames, py_frames)
    if found is None:
        return c
    freed, caller = found
    c = dataclasses.replace(c, freed_by=freed)
    if c.owner is not None or c.overflowed is None or c.verdict is not OverflowVerdict.UNDETERMINED:
        return c
    lib = caller.library_name
    who = f"glibc aborted in {freed.entry}() called by {freed.function}" + (f" ({lib})" if lib else "")
    not_own = _kind(caller)
    if not_own is not None:
        return dataclasses.replace(c, verdict_reason=(
            f"{who}, which is {not_own}, not a native library freeing its own allocation; " + c.verdict_reason))
    if pointers is None or locals_problem:
        why = locals_problem or "the crashing thread's Python variables were not read"
        return dataclasses.replace(c, verdict_reason=(
            f"{who}, but whether the Python side holds a pointer into the chunk is not known ({why})"))
    start = c.overflowed.mem
    end = start + (c.usable_size or max(c.overflowed.size - 16, 0))
    into = [what for what, lo, hi in pointers if lo < end and hi > start]
    if into:
        return dataclasses.replace(c, verdict_reason=(
            f"{who}, but the Python side points into that chunk: " + "; ".join(into[:3])
            + ": the buffer may be one the binding passed"))
    during = f" during {freed.call}" + (f", called from {freed.python_caller}" if freed.python_caller else "")
    return dataclasses.replace(c, verdict=OverflowVerdict.LIBRARY, verdict_reason=(
        f"the buffer that overflowed is {lib}'s own allocation (chunk 0x{c.overflowed.address:x}, size "
        f"0x{c.overflowed.size:x}, {c.usable_size} usable bytes), freed by {freed.function} inside {lib}{during}, "
        f"and glibc aborted in that {freed.entry}(); the Python side passed no pointer into it (none of the crashing "
        "thread's ctypes buffers, pointers and call arguments points into the chunk), so no binding count was "
        "involved"))
