"""Native function names as people and fingerprints read them: C++ names demangled (the C++ runtime's own
``__cxa_demangle``), without their parameter lists, libc's CPU-specific variants by their generic name, and
the C and C++ runtimes' frames told apart (:func:`is_runtime_frame`).

libdw names a C++ frame by its linkage name (``_ZN3app12parse_headerEPKc``), gdb by its demangled name with
its parameters (``app::parse_header(char const*)``); both are ``app::parse_header`` here.  glibc picks a
``memmove`` for the CPU at start-up (IFUNC): ``__memmove_avx_unaligned_erms`` on one machine,
``__memmove_evex_unaligned_erms`` on another -- ``memmove`` for both.
"""
from __future__ import annotations

import functools
import re

from ..model import NativeFrame

__all__ = ["MAX_MANGLED", "RUNTIME_OBJECTS", "demangle", "function_name", "is_mangled", "is_runtime_frame"]

#: a longer name is not demangled (the demangler's work grows with it; a crashed process wrote it)
MAX_MANGLED = 4096
#: the C and C++ runtimes: their abort, assert, terminate and unwind machinery is never the culprit of an abort
RUNTIME_OBJECTS = ("libc.so", "libc-", "libstdc++.so", "libgcc_s.so", "libc++abi.so", "libc++.so", "libunwind.so",
                   "libc_malloc_debug.so", "ld-linux")
_IFUNC = re.compile(r"^__((?:mem|str|stp|wmem|wcs|raw|rawmem)[a-z0-9]*?)_(?:sse2|ssse3|sse4_1|sse4_2|sse42|avx2|"
                    r"avx512[a-z0-9]*|avx|evex512|evex|erms|unaligned|aligned|rtm|generic|nocacheline|chk)"
                    r"(?:_[a-z0-9]+)*$")
_TRAILING = re.compile(r"(?:\s+(?:const|volatile|&&|&|noexcept))+$")


@functools.lru_cache(maxsize=1)
def _cxa_demangle():
    import ctypes
    import ctypes.util

    for name in ("libstdc++.so.6", ctypes.util.find_library("stdc++")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.__cxa_demangle
        fn.restype = ctypes.c_void_p
        fn.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_int))
        libc = ctypes.CDLL(None)
        libc.free.argtypes = (ctypes.c_void_p,)
        return fn, libc.free
    return None


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> str | None:
    """A C++ symbol (``_Z...``) or type name (``St12out_of_range``) demangled; None when it is not one, is
    longer than :data:`MAX_MANGLED`, or no C++ runtime is here to demangle it.

    >>> demangle("_ZN3app12parse_headerEPKc"), demangle("St12out_of_range")
    ('app::parse_header(char const*)', 'std::out_of_range')
    """
    import ctypes

    if not name or len(name) > MAX_MANGLED or not name.isascii():
        return None
    found = _cxa_demangle()
    if found is None:
        return None
    fn, free = found
    status = ctypes.c_int(1)
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if not out or status.value != 0:
        return None
    try:
        return ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        free(out)


def _strip_parameters(name: str) -> str:
    """``app::parse_header(char const*)`` -> ``app::parse_header``; ``F::operator()(int) const`` ->
    ``F::operator()``."""
    text = _TRAILING.sub("", name)
    if not text.endswith(")"):
        return name
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return text[:i] if i else name
    return name


def function_name(symbol: str | None) -> str | None:
    """A frame's function as a fingerprint and a signature name it: a C++ name demangled without its
    parameters, glibc's internal alias (``__GI_``) and its CPU-specific variants (IFUNC) by the generic name.

    >>> function_name("_ZN3app12parse_headerEPKc"), function_name("app::parse_header(char const*)")
    ('app::parse_header', 'app::parse_header')
    >>> function_name("__memmove_avx_unaligned_erms"), function_name("__GI_raise"), function_name("forensics_bus")
    ('memmove', 'raise', 'forensics_bus')
    """
    if not symbol:
        return None
    name = symbol
    if name.startswith("_Z"):
        name = demangle(name) or name
    name = _strip_parameters(name)
    name = name.removeprefix("__GI_")
    m = _IFUNC.match(name)
    return m.group(1) if m else name


def is_mangled(symbol: str | None) -> bool:
    """A C++ linkage name this machine could not demangle."""
    return symbol is not None and symbol.startswith("_Z") and demangle(symbol) is None


def is_runtime_frame(frame: NativeFrame) -> bool:
    """The frame runs in the C or C++ runtime (libc, libstdc++, libgcc_s, libc++abi): its abort, assert,
    terminate and unwind machinery, never the culprit of an abort."""
    name = frame.library_name or ""
    return any(name.startswith(r) for r in RUNTIME_OBJECTS)
