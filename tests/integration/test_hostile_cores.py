"""Cores the fuzz target (tests/fuzz_cores.py) found the reader mishandling, each made here from a real core.

Each is a real kernel core with one field changed, read by the real command line: the outcome must be a
result, a partial result or a clear one-line error -- never "internal error"; a malformed note costs what
it holds, never the rest of the core.
"""
from __future__ import annotations

import json
import shutil
import struct

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fuzz_cores import NT_FILE, NT_PRSTATUS, _layout


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
    r = run("analyze", core, "--method", "direct", "--native-method", "libdw", "--json")
    # THEN the note is read around: the threads and the signal are there, the result is partial and says why
    assert r.exit_code == 4 and "internal error" not in r.stderr, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["signal_name"] == "SIGSEGV" and a["snapshot"]["threads"]
    assert any("malformed NT_FILE note (NT_FILE counts offsets in pages of 18446744073709551615 bytes" in p
               for p in a["snapshot"]["core"]["problems"])
    assert "core-malformed" in {f["rule"] for f in a["findings"]}


def test_one_malformed_thread_note_costs_that_thread_only(segv_core, tmp_path):
    """A malformed NT_PRSTATUS made the whole core unreadable ('cannot read core: malformed note'): every other
    thread, the signal and the memory were lost with it."""
    # GIVEN a real core whose last thread's NT_PRSTATUS is cut to 16 bytes
    prof = _layout(str(segv_core))
    whole = run("analyze", str(segv_core), "--method", "direct", "--json")
    threads = json.loads(whole.stdout)["analysis"]["snapshot"]["core"]["threads"]
    assert len(threads) >= 2
    last = [n for n in prof.notes if n.type == NT_PRSTATUS and n.name == b"CORE"][-1]
    core = _patched(segv_core, tmp_path / "core", [(last.header + 4, struct.pack("<I", 16))])
    # WHEN it is analysed
    r = run("analyze", core, "--method", "direct", "--json")
    # THEN the other threads and the crash are there, the result is partial and names the note
    assert r.exit_code == 4 and "internal error" not in r.stderr, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["snapshot"]["core"]["threads"] == threads[:-1]
    assert a["crash"]["signal_name"] == "SIGSEGV"
    assert any("NT_PRSTATUS has 16 bytes" in p for p in a["snapshot"]["core"]["problems"])


def test_a_mapping_at_an_absurd_file_offset(segv_core, tmp_path):
    """The same failure through one entry: the C library's text mapped at page offset 2**64-1."""
    # GIVEN a real core whose NT_FILE puts the C library's mappings but its first at page 2**64-1 of the file
    prof = _layout(str(segv_core))
    with open(segv_core, "rb") as f:
        data = f.read()
    patches = []
    for entry, (off, length) in zip(prof.file_entries, prof.file_paths, strict=True):
        if b"/libc.so" in data[off:off + length] and struct.unpack_from("<Q", data, entry + 16)[0]:
            patches.append((entry + 16, struct.pack("<Q", (1 << 64) - 1)))
    assert patches
    core = _patched(segv_core, tmp_path / "core", patches)
    # WHEN it is analysed (the signal-frame reader reads the library's text from its file at that offset)
    r = run("analyze", core, "--method", "direct", "--native-method", "libdw")
    # THEN the analysis ends, with no internal error
    assert r.exit_code in (0, 4) and "internal error" not in r.stderr, r.stderr
