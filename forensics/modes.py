"""The modes ``analyze`` runs in, each an enum defined once: the Python stacks' method, the native unwinder,
the heap check.  The library (:mod:`forensics.analyze`) and ``analyze``'s option table
(:mod:`forensics.commands.analyze_run`, which click's options and the click-free fast path both read) take
their choices from here.  Beside
them, what the native unwinding gave: :class:`Unwinder` for one thread's stack, :class:`UnwoundBy` for a
snapshot's.  And the reports ``report`` writes: :class:`ReportTemplate`, one row per template (whether it goes
upstream, where it is filed, whether it follows nvitop's issue form, whom it is for, the fields it needs filled).

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

__all__ = ["StackMethod", "NativeMethod", "HeapMode", "Unwinder", "UnwoundBy", "ReportTemplate", "values",
           "NVITOP_REPO", "NVITOP_WHERE", "NVIDIA_WHERE", "BINDING_WHERE", "INTERNAL_WHERE"]


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


NVITOP_REPO = "XuehaiPan/nvitop"
NVITOP_WHERE = f"nvitop (https://github.com/{NVITOP_REPO}/issues)"
NVIDIA_WHERE = ("NVIDIA: an NVIDIA Enterprise Support case, or the NVIDIA Developer Forums "
                "(https://forums.developer.nvidia.com/) -- with the C reproducer and nvidia-bug-report.log.gz")
BINDING_WHERE = ("NVIDIA, as the maintainer of nvidia-ml-py (https://pypi.org/project/nvidia-ml-py/): an NVIDIA "
                 "Enterprise Support case, or the NVIDIA Developer Forums (https://forums.developer.nvidia.com/)")
INTERNAL_WHERE = "the incident record (internal)"


class ReportTemplate(enum.Enum):
    """``report --template``: which report is written.  Each member is a row of what that report needs: whether it
    is shared outside (``upstream``: local paths and host names replaced by default), where it is filed
    (``where``; nvitop's issue: its form's new-issue URL when the form is read), whether it follows nvitop's issue
    form (``form``), whom it is for (``whom``: an upstream report of an incident not routed to it is titled "not
    for WHOM"), the fields of its context it needs filled (``required``: ``--check`` names each one the evidence
    left unknown) and its ``--template`` help.

    >>> ReportTemplate("nvml").upstream, ReportTemplate.RUNBOOK.where
    (True, 'the incident record (internal)')
    """

    NVITOP = "nvitop"
    NVML = "nvml"
    BINDING = "binding"
    RUNBOOK = "runbook"

    @property
    def upstream(self) -> bool:
        return _TEMPLATE_ROWS[self.value][0]

    @property
    def where(self) -> str:
        return _TEMPLATE_ROWS[self.value][1]

    @property
    def form(self) -> bool:
        return _TEMPLATE_ROWS[self.value][2]

    @property
    def whom(self) -> str:
        return _TEMPLATE_ROWS[self.value][3]

    @property
    def required(self) -> tuple[str, ...]:
        return _TEMPLATE_ROWS[self.value][4]

    @property
    def help(self) -> str:
        return _TEMPLATE_ROWS[self.value][5]


#: each template's row: upstream, where, form, whom, required, help
_TEMPLATE_ROWS: dict[str, tuple[bool, str, bool, str, tuple[str, ...], str]] = {
    "nvitop": (True, NVITOP_WHERE, True, "nvitop",
               ("title", "nvitop_version", "os", "driver", "crash_prose", "traceback"),
               "an issue in nvitop's bug report form"),
    "nvml": (True, NVIDIA_WHERE, False, "the NVIDIA driver",
             ("title", "gpus", "driver", "nvml_library", "call", "native_top"),
             "a defect report for NVIDIA (the driver)"),
    "binding": (True, BINDING_WHERE, False, "nvidia-ml-py", ("title", "driver", "call", "native_top"),
                "one for NVIDIA as nvidia-ml-py's maintainer"),
    "runbook": (False, INTERNAL_WHERE, False, "the team",
                ("title", "signature", "first_seen", "affected", "versions", "reproduction", "diagnostics",
                 "mitigation", "recovery", "conclusion", "recurrence"),
                "an incident record"),
}


def values(mode: type[enum.Enum]) -> tuple[str, ...]:
    """The spellings of a mode's members, in their order: what a command line accepts.

    >>> values(StackMethod)
    ('auto', 'gdb', 'direct', 'both')
    """
    return tuple(m.value for m in mode)
