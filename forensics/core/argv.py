"""The full command line from the initial process stack.

NT_PRPSINFO keeps only the first 80 bytes of the command line (``pr_psargs``),
which a container's long paths and options exceed.  The kernel leaves the whole
argv on the main thread's stack at exec: ``argc, argv[0..argc-1], NULL,
envp[..], NULL, auxv[..]``, with the strings above.  The core's NT_AUXV note is
a copy of that auxv vector, so finding its bytes on the stack finds argv.

:func:`find_argv_pointers` is the pure part (a stack window in, pointers out);
:func:`read_argv` reads the window and the strings from core memory, bounded.
"""
from __future__ import annotations

import struct

from forensics.core.memory import CoreMemory, MemoryNotInCore

__all__ = ["find_argv_pointers", "read_argv"]

# Linux limits: each argument is at most MAX_ARG_STRLEN (32 pages); the whole
# argv+envp at most a quarter of the stack limit.  We read at most this much.
_WINDOW = 4 << 20
_MAX_ARGS = 65536
_MAX_ARG = 128 << 10
_MAX_TOTAL = 1 << 20


def find_argv_pointers(window: bytes, base: int, auxv_raw: bytes) -> list[int] | None:
    """argv's string pointers, from a window of stack memory starting at ``base``.

    ``auxv_raw`` is the NT_AUXV note (up to and including AT_NULL).  Returns
    None when the vector is not in the window or the words below it do not form
    ``argc, argv[], NULL, envp[], NULL``.

    >>> auxv = struct.pack("<4Q", 6, 4096, 0, 0)
    >>> vectors = struct.pack("<6Q", 2, 0x7050, 0x7053, 0, 0x7056, 0) + auxv
    >>> stack = vectors + b"ab\\0cd\\0X=1\\0"  # strings at 0x7050
    >>> [hex(p) for p in find_argv_pointers(stack, 0x7000, auxv)]
    ['0x7050', '0x7053']
    """
    if len(auxv_raw) < 16:
        return None
    at = window.rfind(auxv_raw)
    if at < 0 or at % 8:
        return None
    lo, hi = base, base + len(window)

    def word(i: int) -> int:  # the i-th 8-byte word before the auxv vector
        off = at - 8 * i
        return struct.unpack_from("<Q", window, off)[0] if off >= 0 else -1

    i = 1
    if word(i) != 0:  # envp's terminating NULL
        return None
    i += 1
    while (w := word(i)) != 0:  # envp[] back to argv's NULL
        if w < 0 or not lo <= w < hi or i > _MAX_ARGS:
            return None
        i += 1
    ptrs: list[int] = []
    i += 1
    while len(ptrs) <= _MAX_ARGS:
        w = word(i)
        if w < 0:
            return None
        if w == len(ptrs):  # argc
            return ptrs[::-1]
        if not lo <= w < hi:
            return None
        ptrs.append(w)
        i += 1
    return None


def read_argv(mem: CoreMemory, auxv_raw: bytes, string_addr: int) -> list[str] | None:
    """The process's argv from core memory, or None when the stack does not hold it.

    :param string_addr: an address among the exec strings (AT_EXECFN); the
        vector lies below it in the same segment
    """
    seg = next((s for s in mem.segments if s.vaddr <= string_addr < s.end), None)
    if seg is None:
        return None
    start = max(seg.vaddr, seg.end - _WINDOW)
    try:
        window = mem.read_prefix(start, seg.end - start)
    except MemoryNotInCore:
        return None
    ptrs = find_argv_pointers(window, start, auxv_raw)
    if ptrs is None:
        return None
    out: list[str] = []
    total = 0
    for p in ptrs:
        try:
            raw = mem.read_cstring(p, _MAX_ARG)
        except MemoryNotInCore:
            return None
        total += len(raw) + 1
        if total > _MAX_TOTAL:
            out.append("...")
            break
        out.append(raw.decode("utf-8", errors="backslashreplace"))
    return out
