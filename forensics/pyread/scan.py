"""The interpreter's runtime found in the core's own memory, when no file can say where it is.

The executable or libpython on the node may have been upgraded since the crash (another build
of the same version: its symbols point elsewhere), or be missing.  The core still holds the
interpreter's writable data, found through the object's ELF header the core keeps:

1. CPython 3.13+: ``_PyRuntime`` starts with its ``_Py_DebugOffsets``, whose cookie
   (``xdebugpy``) and self-consistent fields (:mod:`.debug_offsets`) mark it;
2. before that: the version from the ``sys.version`` text in the object's data, then the
   runtime structure by its own invariants, found from the core's threads: a thread state holds
   its thread's pthread (``fs_base`` in the core's registers) and points back to its
   interpreter, whose thread list holds it; ``_PyRuntime.interpreters.head`` is the first word
   of the object's writable data that points at that interpreter.

Nothing is accepted that does not pass those checks; the scan is bounded
(:data:`MAX_SCAN_BYTES` of an object's data, :data:`MAX_CANDIDATES` deep checks).
"""
from __future__ import annotations

import struct
from dataclasses import replace

from forensics.core import elf
from forensics.core.image import ElfImage
from forensics.core.memory import CoreMemory
from forensics.model import CoreFile
from forensics.pyread.debug_offsets import COOKIE, DebugOffsetsError, parse_debug_offsets, read_size
from forensics.pyread.layouts import LayoutError, build_layout, debug_offset_shapes
from forensics.pyread.locate import PythonBinary, _memory_version, interpreter_objects

__all__ = ["MAX_SCAN_BYTES", "MAX_CANDIDATES", "find_runtime_in_memory"]

MAX_SCAN_BYTES = 64 << 20  # of one object's writable data
MAX_CANDIDATES = 20_000  # words that pass the cheap test and get the deep one


def _writable(image: ElfImage) -> list[tuple[int, int]]:
    return [(image.bias + p.vaddr, p.memsz) for p in image.phdrs if p.type == elf.PT_LOAD and p.flags & elf.PF_W]


def find_runtime_in_memory(core: CoreFile, mem: CoreMemory, *, page: int = 4096) -> PythonBinary | None:
    """The object whose writable data, as the core holds it, contains ``_PyRuntime``; None when none does.

    The binary's ``file_path`` is None (no file's symbols were used) and its ``found_in_memory`` is set.
    """
    shapes = debug_offset_shapes()
    want = max((read_size(s) for s in shapes.values()), default=24)
    for lib in interpreter_objects(core):
        image = ElfImage.from_memory(mem, lib.base, page)
        if image is None:
            continue
        binary = PythonBinary(library=lib, image=image, bias=image.bias, file_path=None, runtime=0)
        ranges = _writable(image)
        budget = MAX_SCAN_BYTES
        for start, size in ranges:  # 1. the debug offsets' cookie
            data = mem.read_prefix(start, min(size, budget))
            budget -= len(data)
            i = data.find(COOKIE)
            while i >= 0:
                if i % 8 == 0:
                    try:
                        if parse_debug_offsets(mem.read_prefix(start + i, want), shapes) is not None:
                            return replace(binary, runtime=start + i)
                    except DebugOffsetsError:
                        pass
                i = data.find(COOKIE, i + 1)
        version = _memory_version(binary, mem)  # 2. older versions: the runtime by its invariants
        if version is None:
            continue
        try:
            layout = build_layout(version.major, version.minor)
        except LayoutError:
            continue
        runtime = _scan_invariants(core, mem, ranges, layout)
        if runtime is not None:
            return replace(binary, runtime=runtime)
    return None


def _scan_invariants(core: CoreFile, mem: CoreMemory, ranges: list[tuple[int, int]], layout) -> int | None:
    """``_PyRuntime``'s address by its invariants, found from the threads: a thread state holds its
    thread's pthread (the thread's ``fs_base``) in ``thread_id``; one found in memory whose
    interpreter's thread list holds it names the interpreter, and the runtime is where the object's
    data first points at that interpreter (``interpreters.head``)."""
    from forensics.pyread.objects import Budget, Limits, Reader, WalkCut

    rd = Reader(mem, Budget(Limits(reads=8 * MAX_CANDIDATES)))
    tid_off = layout.offset("PyThreadState", "thread_id")
    head_off = layout.runtime_head.offset
    anchors = [struct.pack("<Q", t.fs_base) for t in core.threads if t.fs_base]
    budget = MAX_SCAN_BYTES * 4
    checked = 0
    interp = None
    for seg in mem.segments:
        if interp is not None or budget <= 0:
            break
        size = min(seg.present, budget)
        budget -= size
        data = mem.read_prefix(seg.vaddr, size)
        for anchor in anchors:
            i = data.find(anchor)
            while i >= 0 and interp is None:
                if (seg.vaddr + i - tid_off) % 8 == 0:
                    checked += 1
                    if checked > MAX_CANDIDATES:
                        return None
                    try:
                        interp = _interpreter_of(rd, layout, seg.vaddr + i - tid_off)
                    except WalkCut:
                        return None
                i = data.find(anchor, i + 1)
            if interp is not None:
                break
    if interp is None:
        return None
    needle = struct.pack("<Q", interp)
    for start, size in ranges:
        data = mem.read_prefix(start, min(size, MAX_SCAN_BYTES))
        i = data.find(needle)
        while i >= 0:
            if (start + i) % 8 == 0 and start + i - head_off >= start:
                return start + i - head_off
            i = data.find(needle, i + 1)
    return None


def _interpreter_of(rd, layout, tstate: int) -> int | None:
    """The interpreter of the thread state at ``tstate`` when it points back to one whose thread list
    holds it (at most 64 states walked); None otherwise."""
    from forensics.pyread.objects import BadObject

    try:
        ts = rd.struct(layout.tstate, tstate)
        interp = ts.get("interp")
        if not interp or interp & 7:
            return None
        addr = rd.struct(layout.interp, interp)[layout.interp_head]
        for _ in range(64):
            if not addr:
                return None
            if addr == tstate:
                return interp
            addr = rd.struct(layout.tstate, addr)["next"]
    except BadObject:
        return None
    return None
