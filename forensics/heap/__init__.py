"""glibc's heap, read from a core: arenas, heaps, bins and tcaches (2.31-2.43), and the anatomy of a corruption.

:func:`read_heap` is the entry point the analysis uses::

    report = read_heap(core, sysroot=None, message="free(): invalid next size (normal)",
                       tid=core.crashed_tid, summary=True)
    report.corruption.overflowed      # the chunk whose buffer ran over the next header
    report.corruption.overflow_length # how far, in bytes
    report.summary.arenas             # every arena, its heaps walked, its bins

Submodules, in the order data flows: :mod:`.debuginfo` (libc's symbols and DWARF),
:mod:`.layout` (struct offsets per version; ``layouts.json`` from :mod:`.gen_layouts`),
:mod:`.locate` (version, ``main_arena``, ``mp_``, TLS), :mod:`.walk` (validating
walkers), :mod:`.arenas` (arenas and their heap regions), :mod:`.summary`
(``analyze --heap``), :mod:`.anatomy` (the corruption).
"""
from __future__ import annotations

from collections.abc import Sequence

from forensics.model import BufferOwner, CoreFile, FrameRegisters, HeapReport, NativeCall

__all__ = ["read_heap"]


def read_heap(core: CoreFile, *, sysroot: str | None = None, message: str | None = None, tid: int | None = None,
              corruption: bool = True, summary: bool = False,
              owners: Sequence[tuple[BufferOwner, NativeCall | None]] = (), is_python: bool = False,
              debug_info: bool = True, locals_problem: str | None = None,
              owner_lookup=None, mem=None, frames: Sequence[FrameRegisters] = (),
              hints: Sequence[int] = ()) -> HeapReport:
    """Read glibc's heap from ``core``: the corruption's anatomy and/or the arena summary.

    Never raises for what the core holds: a heap that cannot be located gives a
    report whose ``problems`` say why.

    :param message: glibc's abort message (the corruption is looked for only with one)
    :param tid: the crashing thread (its registers and stack hold the rejected chunk)
    :param corruption: look for the corruption behind ``message``
    :param summary: walk every arena, heap, bin and tcache (``analyze --heap``)
    :param owners: Python objects of the crashing thread that own heap buffers, with the native
        call each was passed to (from :func:`forensics.pyread.locals.buffer_owners`)
    :param is_python: whether the process is a CPython one (the verdict says so when not)
    :param debug_info: use libc's debug file (symbols, DWARF) when there is one; False reads with
        the layout table and finds ``main_arena`` by searching libc's data
    :param locals_problem: why the crashing thread's Python locals were not read (for the verdict)
    :param owner_lookup: ``(buffer, size) -> BufferOwner | None``: an owner of the overflowed buffer found
        another way when no local holds it (:func:`forensics.pyread.locals.find_stack_owner`)
    :param mem: the core's memory, open (:class:`~forensics.core.CoreMemory`; None: the core is opened here)
    :param frames: the registers of the crashing thread's frames, innermost first (libdw's): the pointer
        glibc's free() was given is read from them through libc's DWARF (:mod:`forensics.heap.freedptr`)
    :param hints: addresses the crashing thread's Python side holds (its ctypes buffers, pointers and int locals):
        where the chunks before a damaged header are followed from, beside the values of its native stack
    """
    from forensics.core.memory import CoreMemory
    from forensics.errors import ForensicsError
    from forensics.heap.locate import HeapUnavailable
    from forensics.heap.walk import HeapMemory

    try:
        if mem is None:
            with CoreMemory.open(core.path) as opened:
                return read_heap(core, sysroot=sysroot, message=message, tid=tid, corruption=corruption,
                                 summary=summary, owners=owners, is_python=is_python, debug_info=debug_info,
                                 locals_problem=locals_problem, owner_lookup=owner_lookup, mem=opened,
                                 frames=frames, hints=hints)
        hm = HeapMemory(mem)
        try:
            return _read(core, mem, hm, sysroot=sysroot, message=message, tid=tid, corruption=corruption,
                         summary=summary, owners=owners, is_python=is_python, debug_info=debug_info,
                         locals_problem=locals_problem, owner_lookup=owner_lookup, frames=frames, hints=hints)
        finally:
            hm.release()
    except HeapUnavailable as e:
        return HeapReport(problems=(str(e),))
    except ForensicsError as e:
        return HeapReport(problems=(f"the core could not be read: {e}",))


def _read(core, mem, hm, *, sysroot, message, tid, corruption, summary, owners, is_python, debug_info,
          locals_problem, owner_lookup, frames, hints) -> HeapReport:
    from forensics.heap.anatomy import find_corruption
    from forensics.heap.arenas import read_arenas
    from forensics.heap.locate import find_glibc

    page = mem.layout.page_size if mem.layout is not None else 4096
    glibc = find_glibc(core, mem, sysroot=sysroot, page_size=page, debug_info=debug_info)
    heap = read_arenas(hm, glibc, core)
    tcaches = None
    found = None
    if corruption and message:
        if "tcache" in message:
            from forensics.heap.summary import find_tcaches

            tcaches = find_tcaches(heap, core)
        cache_addrs = [t for t, _a, _h in (tcaches or {}).values() if t]
        found = find_corruption(heap, message, tid, tcaches=cache_addrs, owners=owners, is_python=is_python,
                                locals_problem=locals_problem, owner_lookup=owner_lookup, frames=frames, hints=hints)
    summ = None
    if summary:  # analyze --heap: the whole heap's summary (the corruption's anatomy needs none of it)
        from forensics.heap.summary import summarize_heap

        summ = summarize_heap(heap, core, tcaches=tcaches)
    return HeapReport(corruption=found, summary=summ, problems=tuple(heap.problems))
