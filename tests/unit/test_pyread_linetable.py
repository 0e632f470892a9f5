"""Line-table decoders of forensics.pyread against real code objects and CPython's documented formats."""
from __future__ import annotations

import sys
import textwrap

import pytest

from forensics.pyread.linetable import line_from_linetable_310, line_from_lnotab, line_from_locations

SOURCE = textwrap.dedent(
    '''
    def sample(x):
        y = x + 1

        if y > 2:
            for i in range(3):
                y += i
        else:
            y = [
                a for a in range(x)
            ]
        try:
            z = 1 / y
        except ZeroDivisionError:
            z = None
        return (y,
                z)
    '''
)


def code_objects(code):
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            yield from code_objects(const)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the location table format is 3.11+")
def test_locations_match_co_positions():
    # GIVEN real code objects compiled by this (3.11+) interpreter
    for code in code_objects(compile(SOURCE, "sample.py", "exec")):
        table = code.co_linetable
        # WHEN each code unit's line is decoded
        # THEN it is the line CPython itself reports
        for index, (line, *_cols) in enumerate(code.co_positions()):
            assert line_from_locations(table, code.co_firstlineno, index) == line, (code.co_name, index)


def test_locations_past_the_end_has_no_line():
    code = compile("x = 1\n", "t.py", "exec")
    if sys.version_info >= (3, 11):
        assert line_from_locations(code.co_linetable, 1, 10_000) is None


def test_truncated_location_table_raises_index_error():
    # a long-form entry (code 14) whose varints are cut off
    with pytest.raises(IndexError):
        line_from_locations(bytes([0xF0 | 0, 0x42]), 1, 5)


def test_lnotab_pairs():
    # GIVEN CPython 3.8's example: byte increments and line increments (signed)
    table = bytes([0, 1, 6, 1, 50, 0xFF])  # +1 line at 0, +1 line at 6, -1 line at 56
    # THEN each offset maps to the line in force there
    assert line_from_lnotab(table, 10, 0) == 11
    assert line_from_lnotab(table, 10, 5) == 11
    assert line_from_lnotab(table, 10, 6) == 12
    assert line_from_lnotab(table, 10, 56) == 11


def test_linetable_310_ranges_and_no_line():
    # GIVEN 3.10 (length, line delta) pairs: 4 bytes at +1, 2 bytes without a line, 6 bytes at +2
    table = bytes([4, 1, 2, 0x80, 6, 2])
    assert line_from_linetable_310(table, 1, 0) == 2
    assert line_from_linetable_310(table, 1, 3) == 2
    assert line_from_linetable_310(table, 1, 4) is None
    assert line_from_linetable_310(table, 1, 6) == 4
    assert line_from_linetable_310(table, 1, 12) is None  # past the end
