"""The modes ``analyze`` runs in, each an enum defined once: the Python stacks' method, the native unwinder,
the heap check.  The library (:mod:`forensics.analyze`) and both of ``analyze``'s parsers (click's options
and the click-free fast path, :mod:`forensics.commands.analyze_run`) take their choices from here.

Imports nothing but :mod:`enum` (already loaded on ``analyze``'s start-up path): ``forensics analyze --help``
and an analysis start no slower for it.

>>> values(HeapMode)
('auto', 'full', 'off')
"""
from __future__ import annotations

import enum

__all__ = ["StackMethod", "NativeMethod", "HeapMode", "values"]


class StackMethod(enum.Enum):
    """``--method``: where the Python stacks' struct layout comes from."""

    AUTO = "auto"  # direct, gdb's DWARF layout as fallback
    GDB = "gdb"  # CPython's DWARF, read by gdb
    DIRECT = "direct"  # the core's _Py_DebugOffsets and the table: no gdb, no debug symbols
    BOTH = "both"  # both layouts and their stacks compared


class NativeMethod(enum.Enum):
    """``--native-method``: who unwinds the native stacks."""

    AUTO = "auto"  # libdw, except with --method direct (none) or --debuginfod (gdb)
    LIBDW = "libdw"  # elfutils, in-process; gdb for the threads it cannot unwind
    GDB = "gdb"
    BOTH = "both"  # both, compared frame for frame
    NONE = "none"  # program counters only


class HeapMode(enum.Enum):
    """How much of the glibc heap is checked."""

    AUTO = "auto"  # where the crash points at the heap
    FULL = "full"  # every chunk (--heap)
    OFF = "off"  # not at all (a batch's fingerprint table)


def values(mode: type[enum.Enum]) -> tuple[str, ...]:
    """The spellings of a mode's members, in their order: what a command line accepts.

    >>> values(StackMethod)
    ('auto', 'gdb', 'direct', 'both')
    """
    return tuple(m.value for m in mode)
