"""The modes ``analyze`` runs in, each an enum defined once: the Python stacks' method, the native unwinder,
the heap check.  The library (:mod:`forensics.analyze`) and ``analyze``'s option table
(:mod:`forensics.commands.analyze_run`, which click's options and the click-free fast path both read) take
their choices from here.  Beside
them, what the native unwinding gave: :class:`Unwinder` for one thread's stack, :class:`UnwoundBy` for a
snapshot's.

Imports nothing but :mod:`enum` (already loaded on ``analyze``'s start-up path): ``forensics analyze --help``
and an analysis start no slower for it.

>>> values(HeapMode)
('auto', 'full', 'off')
"""
from __future__ import annotations

import enum

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["StackMethod", "NativeMethod", "HeapMode", "Unwinder", "UnwoundBy", "values"]


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


class Unwinder(enum.Enum):
    """What gave one thread's native stack (``NativeStack.method``, ``Thread.native_method``)."""

    LIBDW = "libdw"
    GDB = "gdb"
    REGISTERS = "registers"  # its program counter only: not unwound


class UnwoundBy(enum.Enum):
    """What gave a snapshot's native stacks: its threads' :class:`Unwinder` members, joined by ``+`` in
    :class:`Unwinder`'s order (``libdw+gdb``: gdb for the threads libdw could not unwind; ``libdw+registers``:
    some threads unwound, the rest at their program counter).

    >>> UnwoundBy.of({Unwinder.GDB, Unwinder.LIBDW}), UnwoundBy.LIBDW_REGISTERS.unwound
    (<UnwoundBy.LIBDW_GDB: 'libdw+gdb'>, True)
    """

    LIBDW = "libdw"
    GDB = "gdb"
    LIBDW_GDB = "libdw+gdb"
    REGISTERS = "registers"  # no thread unwound: program counters only
    LIBDW_REGISTERS = "libdw+registers"
    GDB_REGISTERS = "gdb+registers"
    LIBDW_GDB_REGISTERS = "libdw+gdb+registers"

    @classmethod
    def of(cls, unwinders: Iterable[Unwinder]) -> UnwoundBy:
        """The member naming these unwinders (at least one)."""
        present = set(unwinders)
        return cls("+".join(u.value for u in Unwinder if u in present))

    @property
    def unwinders(self) -> tuple[Unwinder, ...]:
        return tuple(Unwinder(v) for v in self.value.split("+"))

    @property
    def unwound(self) -> bool:
        """Some thread's stack was unwound (not only program counters)."""
        return self is not UnwoundBy.REGISTERS


def values(mode: type[enum.Enum]) -> tuple[str, ...]:
    """The spellings of a mode's members, in their order: what a command line accepts.

    >>> values(StackMethod)
    ('auto', 'gdb', 'direct', 'both')
    """
    return tuple(m.value for m in mode)
