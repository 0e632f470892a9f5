"""glibc's heap symbols read from its debug file (forensics.core.symtab.read_symbols), against pyelftools."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from forensics.core.buildid import read_build_id_from_file
from forensics.core.debugfiles import build_id_debug_path


def test_heap_symbols_are_read_as_a_walk_of_every_symbol_reads_them(tmp_path):
    # forensics.core.symtab.read_symbols finds names without looping over the symbol table in Python;
    # the oracle is pyelftools' walk of every symbol of glibc's own debug file (first definition wins)
    from elftools.elf.elffile import ELFFile

    from forensics.core.symtab import read_symbols

    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    src = build_id_debug_path(read_build_id_from_file(str(libc)))
    if not os.path.isfile(src):
        pytest.skip(f"libc6-dbg is not installed ({src} missing): apt-get install -y libc6-dbg")
    names = ["main_arena", "mp_", "tcache", "__libc_single_threaded", "malloc", "free", "no_such_symbol_here"]
    got = read_symbols(src, names)
    want = {}
    with open(src, "rb") as f:
        for sym in ELFFile(f).get_section_by_name(".symtab").iter_symbols():
            if sym.name in names and sym.name not in want and sym["st_shndx"] != "SHN_UNDEF":
                want[sym.name] = (sym["st_value"], sym["st_size"])
    assert {k: (v.value, v.size) for k, v in got.items()} == want
    assert "main_arena" in got and "no_such_symbol_here" not in got
