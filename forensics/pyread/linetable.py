"""Line numbers from CPython's line tables, one decoder per format (pure functions).

- 3.8, 3.9: ``co_lnotab``, (byte offset increment, signed line increment) pairs,
  indexed by the instruction's byte offset;
- 3.10: ``co_linetable``, (byte length, signed line delta or -128 for "no line") pairs;
- 3.11+: the location table of PEP 657 (varint-coded entries), indexed in code units.

``gdb_scripts/forensics_python.py`` loads this very module (by path, inside gdb), so the
gdb walker and the direct reader decode lines with the same code.
"""
from __future__ import annotations

__all__ = ["line_from_lnotab", "line_from_linetable_310", "line_from_locations"]


def line_from_lnotab(table: bytes, firstlineno: int, lasti_bytes: int) -> int:
    """3.8/3.9: the line of the instruction at byte offset ``lasti_bytes``.

    >>> line_from_lnotab(bytes([0, 1, 6, 1]), 10, 6)
    12
    """
    line = firstlineno
    addr = 0
    for i in range(0, len(table) - 1, 2):
        addr += table[i]
        if addr > lasti_bytes:
            break
        delta = table[i + 1]
        line += delta - 256 if delta >= 128 else delta
    return line


def line_from_linetable_310(table: bytes, firstlineno: int, addrq: int) -> int | None:
    """3.10: the line of the instruction at byte offset ``addrq``; None for a range without a line.

    >>> line_from_linetable_310(bytes([2, 0, 4, 1]), 5, 2)
    6
    """
    line = firstlineno
    start = 0
    for i in range(0, len(table) - 1, 2):
        end = start + table[i]
        ldelta = table[i + 1]
        if ldelta == 128:  # -128: no line for this range
            cur = None
        else:
            line += ldelta - 256 if ldelta > 128 else ldelta
            cur = line
        if start <= addrq < end:
            return cur
        start = end
    return None


def _varint(table: bytes, i: int) -> tuple[int, int]:
    byte = table[i]
    i += 1
    val = byte & 63
    shift = 0
    while byte & 64:
        byte = table[i]
        i += 1
        shift += 6
        val |= (byte & 63) << shift
    return val, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    val, i = _varint(table, i)
    return (-(val >> 1) if val & 1 else val >> 1), i


def line_from_locations(table: bytes, firstlineno: int, index: int) -> int | None:
    """3.11+: the line of code unit ``index`` from a PEP 657 location table; None when it has none.

    A truncated table (a corrupted object) raises :class:`IndexError`.

    >>> line_from_locations(bytes([0xE8 | 0, 0x02, 0, 0, 0]), 7, 0)  # long form, line delta +1
    8
    """
    line = firstlineno
    addr = 0
    i = 0
    n = len(table)
    while i < n:
        first = table[i]
        i += 1
        code = (first >> 3) & 15
        length = (first & 7) + 1
        if code == 15:  # no location
            cur = None
        elif code == 14:  # long form
            delta, i = _svarint(table, i)
            _, i = _varint(table, i)  # end line delta
            _, i = _varint(table, i)  # column
            _, i = _varint(table, i)  # end column
            line += delta
            cur = line
        elif code == 13:  # no column
            delta, i = _svarint(table, i)
            line += delta
            cur = line
        elif code >= 10:  # one-line forms
            line += code - 10
            i += 2
            cur = line
        else:  # short forms
            i += 1
            cur = line
        if addr <= index < addr + length:
            return cur
        addr += length
    return None
