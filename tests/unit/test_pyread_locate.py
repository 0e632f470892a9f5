"""Version text matching of forensics.pyread.locate (pure: bytes in, version out)."""
from __future__ import annotations

import pytest

from forensics.pyread.locate import _RODATA_VERSION, _SYS_VERSION, _first_version


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"\x00\x013.10.13 (main, May  9 2026, 07:34:36) [GCC 12.2.0]\x00", "3.10.13"),
        (b"junk3.8.18 (default, May  9 2026, 07:32:38) \n[GCC 12.2.0]", None),  # inside a word
        (b"\x00\x003.13.0rc2 (main, Oct  1 2024, 10:00:00) [Clang 18]\x00", "3.13.0rc2"),
        (b"version 3.12.1 is great\x00", None),  # not the Py_GetVersion shape
        (b"GLIBC_2.3.4 (x) [y]\x00" + b"\x003.9.18 (default, Jan 1 2024, 00:00:00) \n[GCC 9]", "3.9.18"),
    ],
)
def test_sys_version_text(data, expected):
    assert _first_version(_SYS_VERSION, data, 0, len(data)) == expected


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"\x003.11.7\x00", "3.11.7"),
        (b"/usr/local/3.8.18\x00", "3.8.18"),  # the linker merged PY_VERSION into a longer string's tail
        (b"/usr/lib/python3.8.18\x00", None),  # part of a word
        (b"libfoo.so.3.1.2\x00", None),
    ],
)
def test_rodata_version_text(data, expected):
    assert _first_version(_RODATA_VERSION, data, 0, len(data)) == expected
