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


def _notes_moved_to_the_end(src, dest, filler_size, filler_head=b""):
    """A copy of ``src`` whose one PT_NOTE segment is moved to the file's end and followed by ``filler_size``
    bytes (``filler_head`` then zeros, left sparse): the real notes come first, so the threads are still there."""
    prof = _layout(str(src))
    ((entry, _, off, _, filesz, _),) = [p for p in prof.phdrs if p[1] == 4]  # PT_NOTE
    shutil.copyfile(src, dest)
    with open(src, "rb") as f:
        f.seek(off)
        notes = f.read(filesz)
    with open(dest, "r+b") as f:
        end = f.seek(0, 2)
        f.write(notes + filler_head)
        f.truncate(end + filesz + filler_size)
        f.seek(entry + 8)  # p_offset, then p_vaddr, p_paddr, p_filesz
        f.write(struct.pack("<Q", end))
        f.seek(entry + 32)
        f.write(struct.pack("<Q", filesz + filler_size))
    return str(dest)


def test_a_pt_note_segment_over_the_size_bound_is_read_to_the_bound(segv_core, tmp_path):
    """PT_NOTE segments were read whole into memory: a core whose note segment says it holds 1 GiB cost 1 GiB,
    then as much again for the one huge note in it."""
    # GIVEN a real core whose notes are followed by one note of a little under 1 GiB (a sparse file)
    from forensics.core.elf import MAX_NOTE_BYTES
    huge = 1 << 30
    head = struct.pack("<III", 5, huge - 20, 0x4E4F5445) + b"CORE\0\0\0\0"
    core = _notes_moved_to_the_end(segv_core, tmp_path / "core", huge, head)
    # WHEN it is analysed
    r = run("analyze", core, "--method", "direct", "--native-method", "none", "--json")
    # THEN the notes within the bound are read (the threads and the signal are there), the result is partial
    # and says which bound cut the notes
    assert r.exit_code == 4 and "internal error" not in r.stderr, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["signal_name"] == "SIGSEGV" and a["snapshot"]["core"]["threads"]
    assert any(f"over the bound of {MAX_NOTE_BYTES}: only the first {MAX_NOTE_BYTES} were read" in p
               for p in a["snapshot"]["core"]["problems"]), a["snapshot"]["core"]["problems"]


def test_a_pt_note_segment_of_more_notes_than_the_bound(segv_core, tmp_path):
    """A note segment of zeros is a run of empty 12-byte notes: one of 4 MiB was 350,000 notes kept in memory."""
    # GIVEN a real core whose notes are followed by 4 MiB of zeros
    from forensics.core.elf import MAX_NOTES
    core = _notes_moved_to_the_end(segv_core, tmp_path / "core", 4 << 20)
    # WHEN it is analysed
    r = run("analyze", core, "--method", "direct", "--native-method", "none", "--json")
    # THEN the real notes are read, the rest is left, the result is partial and says so
    assert r.exit_code == 4 and "internal error" not in r.stderr, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["signal_name"] == "SIGSEGV" and a["snapshot"]["core"]["threads"]
    assert f"more than {MAX_NOTES} notes: the notes past them were not read" in a["snapshot"]["core"]["problems"]
