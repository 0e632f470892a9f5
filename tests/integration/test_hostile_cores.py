"""Cores the fuzz target (tests/fuzz_cores.py) found the reader mishandling, each made here from a real core.

Each is a real kernel core with one field changed, read by the real command line: the outcome must be a
result, a partial result or a clear one-line error -- never "internal error".
"""
from __future__ import annotations

import shutil
import struct

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fuzz_cores import NT_FILE, _layout


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def segv_core(cores, newest_python):
    return cores.get(newest_python, "segv")


def _patched(src, dest, patches):
    shutil.copyfile(src, dest)
    with open(dest, "r+b") as f:
        for offset, data in patches:
            f.seek(offset)
            f.write(data)
    return str(dest)


def _nt_file(prof):
    return next(n for n in prof.notes if n.type == NT_FILE and n.name == b"CORE")


def test_an_nt_file_page_size_that_is_no_page_size(segv_core, tmp_path):
    """The fuzz's seed 1062: NT_FILE's page size 2**64-1 made every file offset absurd; reading the C library's
    text at one ended in "internal error: ValueError: cannot fit 'int' into an offset-sized integer"."""
    # GIVEN a real core whose NT_FILE says its offsets count pages of 2**64-1 bytes
    prof = _layout(str(segv_core))
    core = _patched(segv_core, tmp_path / "core", [(_nt_file(prof).desc + 8, struct.pack("<Q", (1 << 64) - 1))])
    # WHEN it is analysed
    r = run("analyze", core, "--method", "direct", "--native-method", "libdw")
    # THEN a clear one-line error names the note
    assert r.exit_code == 1 and "internal error" not in r.stderr, r.stderr
    assert "malformed NT_FILE note: NT_FILE counts offsets in pages of 18446744073709551615 bytes" in r.stderr


def test_a_mapping_at_an_absurd_file_offset(segv_core, tmp_path):
    """The same failure through one entry: the C library's text mapped at page offset 2**64-1."""
    # GIVEN a real core whose NT_FILE puts the C library's mappings but its first at page 2**64-1 of the file
    prof = _layout(str(segv_core))
    with open(segv_core, "rb") as f:
        data = f.read()
    patches = []
    for entry, (off, length) in zip(prof.file_entries, prof.file_paths):
        if b"/libc.so" in data[off:off + length] and struct.unpack_from("<Q", data, entry + 16)[0]:
            patches.append((entry + 16, struct.pack("<Q", (1 << 64) - 1)))
    assert patches
    core = _patched(segv_core, tmp_path / "core", patches)
    # WHEN it is analysed (the signal-frame reader reads the library's text from its file at that offset)
    r = run("analyze", core, "--method", "direct", "--native-method", "libdw")
    # THEN the analysis ends, with no internal error
    assert r.exit_code in (0, 4) and "internal error" not in r.stderr, r.stderr
