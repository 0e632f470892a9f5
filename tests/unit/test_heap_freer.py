"""Who freed the chunk glibc aborted on, and the library's own-buffer verdict (forensics.heap.freer, pure).

The frames are the crashing thread's native frames as an unwinder names them; the real cores of the
simulated NVML's fault are in tests/integration/test_heap_simnvml.py.
"""
from __future__ import annotations

import pytest

from forensics.heap.freer import library_verdict, who_freed
from forensics.model import BufferOwner, CtypesObject, HeapChunk, HeapCorruption, NativeFrame, OverflowVerdict, PyFrame

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
NVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09"
CHUNK = HeapChunk(address=0x5000, size=0x510, flags=1, prev_size=0)
PY = (PyFrame(function="nvmlDeviceGetFieldValues", file="/venv/site-packages/pynvml.py", line=4475),)
GENERIC = "no variable of the crashing thread's Python frames holds the buffer that overflowed"


def frames(*callers: tuple[str | None, str | None], entry: str = "__GI___libc_free") -> list[NativeFrame]:
    """abort's frames in libc, the allocator, then ``callers`` (symbol, library), innermost first."""
    names = [("__GI_abort", LIBC), ("malloc_printerr", LIBC), ("_int_free", LIBC), (entry, LIBC), *callers]
    return [NativeFrame(index=i, pc=0x7000 + i, symbol=s, offset=0, library=lib) for i, (s, lib) in enumerate(names)]


def corruption(**kw) -> HeapCorruption:
    base = dict(message="double free or corruption (!prev)", check="the PREV_INUSE bit", rejected=CHUNK,
                rejected_found_by="register rdi", damaged=CHUNK, inconsistencies=(), overflowed=CHUNK,
                usable_size=1288, buffer_size=None, overflow_length=8, overflow_past_usable=8, overflow_exact=True,
                overflow_basis="", first_bytes="1005000000000000", verdict_reason=GENERIC)
    return HeapCorruption(**{**base, **kw})


IN_NVML = (("nvlink_scratch_overflow", NVML), ("nvmlDeviceGetFieldValues", NVML), ("ffi_call", "/usr/lib/libffi.so.8"))


def test_a_library_freeing_its_own_buffer_points_at_it():
    c = library_verdict(corruption(), frames(*IN_NVML), PY, pointers=[("values", 0x9000, 0x9000 + 1440)])
    assert c.verdict is OverflowVerdict.LIBRARY
    assert c.freed_by.function == "nvlink_scratch_overflow" and c.freed_by.call == "nvmlDeviceGetFieldValues"
    assert c.freed_by.entry == "free" and c.freed_by.python_caller == "nvmlDeviceGetFieldValues (pynvml.py:4475)"
    assert c.verdict_reason.startswith(
        "the buffer that overflowed is libnvidia-ml.so.580.126.09's own allocation (chunk 0x5000, size 0x510, 1288 "
        "usable bytes), freed by nvlink_scratch_overflow inside libnvidia-ml.so.580.126.09 during "
        "nvmlDeviceGetFieldValues, called from nvmlDeviceGetFieldValues (pynvml.py:4475)")
    assert c.verdict_reason.endswith("so no binding count was involved")


def test_operator_delete_is_the_allocator_not_the_freer():
    f = frames(("_ZdlPvm", "/usr/lib/libstdc++.so.6"), *IN_NVML)
    c = library_verdict(corruption(), f, PY, pointers=[])
    assert c.verdict is OverflowVerdict.LIBRARY and c.freed_by.function == "nvlink_scratch_overflow"


@pytest.mark.parametrize("caller, what", [
    (("_PyObject_Free", "/usr/lib/libpython3.11.so.1.0"), "the Python interpreter"),
    (("PyCData_dealloc", "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so"), "ctypes"),
    (("fclose", LIBC), "the C library"),
    ((None, None), "code in no mapped file"),
], ids=["python", "ctypes", "libc", "unknown"])
def test_a_free_outside_a_native_library_stays_undetermined(caller, what):
    c = library_verdict(corruption(), frames(caller, *IN_NVML), PY, pointers=[])
    assert c.verdict is OverflowVerdict.UNDETERMINED
    assert f"which is {what}, not a native library freeing its own allocation; {GENERIC}" in c.verdict_reason
    assert c.freed_by is not None and c.freed_by.call is None


def test_a_python_pointer_into_the_chunk_keeps_it_undetermined():
    inside = ("argument 3 of the native call in progress (byref(buf))", CHUNK.mem + 0x40, CHUNK.mem + 0x41)
    c = library_verdict(corruption(), frames(*IN_NVML), PY, pointers=[inside])
    assert c.verdict is OverflowVerdict.UNDETERMINED
    assert "the Python side points into that chunk: argument 3 of the native call in progress" in c.verdict_reason


def test_a_buffer_that_ends_at_the_chunk_does_not_cover_it():
    # the caller's array in the chunk before: its 1440 bytes end at this chunk's header (its prev_size word)
    c = library_verdict(corruption(), frames(*IN_NVML), PY, pointers=[("values", CHUNK.address - 1440, CHUNK.address)])
    assert c.verdict is OverflowVerdict.LIBRARY


def test_unread_python_variables_keep_it_undetermined():
    c = library_verdict(corruption(), frames(*IN_NVML), PY, pointers=None, locals_problem="CPython 3.7: no layout")
    assert c.verdict is OverflowVerdict.UNDETERMINED and c.verdict_reason.endswith(
        "whether the Python side holds a pointer into the chunk is not known (CPython 3.7: no layout)")


def test_a_python_owner_or_a_crash_in_malloc_decides_nothing_here():
    owner = BufferOwner(name="values", function="f", file="x.py", line=1, object=CtypesObject(
        address=0x100, type_name="c_int_Array_4", kind="array", buffer=CHUNK.mem, size=16, length=4))
    c = library_verdict(corruption(owner=owner), frames(*IN_NVML), PY, pointers=[])
    assert c.verdict is OverflowVerdict.UNDETERMINED and c.verdict_reason == GENERIC and c.freed_by is not None
    assert who_freed(frames(*IN_NVML, entry="__libc_malloc"), PY) is None
    assert who_freed(frames()[:4], PY) is None  # nothing above the allocator


def test_free_tail_called_into_its_worker_is_still_free():
    # GIVEN glibc 2.43's free(), which ends in a tail call of _int_free_chunk (x86-64 and AArch64 builds of
    # Debian's 2.43 alike): no frame of free() itself, its worker's frame right below the library's
    names = [("__GI_abort", LIBC), ("malloc_printerr", LIBC), ("_int_free_merge_chunk", LIBC),
             ("_int_free_chunk", LIBC), *IN_NVML]
    f = [NativeFrame(index=i, pc=0x7000 + i, symbol=s, offset=0, library=lib) for i, (s, lib) in enumerate(names)]
    # WHEN who freed the chunk is asked
    c = library_verdict(corruption(), f, PY, pointers=[])
    # THEN it is the library's free(), and the verdict the library's own buffer
    assert c.freed_by.entry == "free" and c.freed_by.function == "nvlink_scratch_overflow"
    assert c.verdict is OverflowVerdict.LIBRARY


def test_malloc_internals_without_an_entry_are_no_free():
    # _int_malloc's own frames (no free(), no tail call of its workers) say nothing of who freed
    names = [("__GI_abort", LIBC), ("malloc_printerr", LIBC), ("_int_malloc", LIBC), *IN_NVML]
    f = [NativeFrame(index=i, pc=0x7000 + i, symbol=s, offset=0, library=lib) for i, (s, lib) in enumerate(names)]
    assert who_freed(f, PY) is None
