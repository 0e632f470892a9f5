"""glibc's heap on arm64 nodes: the layout table (generated from x86-64 DWARF and the model of glibc's
sources) is what the DWARF of Debian's arm64 libc6-dbg says, the symbols the heap reader takes are in it,
and the arm64 libc really allocates with MALLOC_ALIGNMENT 16, SIZE_SZ 8 and MINSIZE 32.

The roots are tests/arm64.py's (bookworm: glibc 2.36; sid: 2.43, no fastbins, tcache num_slots); the
allocation facts come from a program cross-compiled here and run under qemu-user in each root, asking
glibc itself (its chunk headers and malloc_usable_size).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.core.symtab import read_symbols
from forensics.heap.debuginfo import find_libc_debug_file
from forensics.heap.gen_layouts import _comparable, read_dwarf_entry
from forensics.heap.layout import MALLOC_ALIGNMENT, MINSIZE, SIZE_SZ, _table, layout_for_version, layout_from_structs
from forensics.core.buildid import read_build_id_from_file
from tests.arm64 import CROSS_CC, SUITES, guest_problem, guest_root
from tests.roots import RootUnavailable

PROBE = r"""
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int main(void)
{
    size_t worst = 0, bad_size = 0;
    for (size_t n = 0; n <= 4096; n += 1) {
        unsigned char *p = malloc(n);
        size_t header = ((size_t *)p)[-1];
        size_t chunk = header & ~(size_t)7;
        size_t want = n + 8 + 15 < 32 ? 32 : (n + 8 + 15) & ~(size_t)15;
        worst |= (uintptr_t)p & 15;
        if (chunk != want || malloc_usable_size(p) != chunk - 8)
            bad_size++;
        free(p);
    }
    printf("{\"misaligned\": %zu, \"bad_sizes\": %zu, \"min_chunk\": %zu}\n", worst, bad_size,
           ((size_t *)malloc(0))[-1] & ~(size_t)7);
    return 0;
}
"""


@pytest.fixture(scope="module", params=sorted(SUITES), ids=lambda s: f"suite={s}")
def root(request) -> Path:
    problem = guest_problem()
    if problem:
        pytest.skip(problem)
    try:
        return guest_root(request.param)
    except RootUnavailable as e:
        pytest.skip(f"no arm64 {request.param} root: {e}")


def libc_of(root: Path) -> Path:
    return root / "lib" / "aarch64-linux-gnu" / "libc.so.6"


def test_the_table_is_the_arm64_libc6_dbg_dwarf(root):
    # GIVEN the arm64 libc of the root and its libc6-dbg DWARF
    version, structs, source = read_dwarf_entry(str(libc_of(root)))
    key = f"{version[0]}.{version[1]}"
    entry = _table()["layouts"][key]
    # THEN every struct the heap reader reads has the table's size and member offsets
    dwarf = _comparable({k: v for k, v in structs.items() if k in entry["structs"]})
    assert dwarf == _comparable(entry["structs"]), source
    # and the layout made from that DWARF is the table's, field for field (the source aside)
    from_dwarf = layout_from_structs(version, structs, "dwarf")
    from_table = layout_for_version(version)
    assert {f: getattr(from_dwarf, f) for f in from_dwarf.__dataclass_fields__ if f != "source"} == \
        {f: getattr(from_table, f) for f in from_table.__dataclass_fields__ if f != "source"}
    if version < (2, 42):  # 64 bins of 2-byte counts and 8-byte entries (2.43: 76 bins, small and large)
        assert (from_table.tcache_bins, from_table.tcache_chunk_size) == (64, 0x290)


def test_the_arm64_debug_file_names_the_arenas_and_tls(root):
    libc = libc_of(root)
    debug = find_libc_debug_file(read_build_id_from_file(str(libc)), sysroot=str(root))
    assert debug is not None and debug.startswith(str(root))
    syms = read_symbols(debug, ("main_arena", "mp_", "tcache", "thread_arena"))
    # main_arena and mp_ are objects in libc's data; tcache and thread_arena are TLS (STT_TLS: offsets)
    assert syms["main_arena"].type == 1 and syms["mp_"].type == 1
    assert syms["tcache"].type == 6 and syms["thread_arena"].type == 6


def test_the_arm64_libc_allocates_as_the_reader_assumes(root, tmp_path):
    # GIVEN a probe cross-compiled for arm64, run under qemu-user against the root's own libc
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run([CROSS_CC, "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    qemu = shutil.which("qemu-aarch64-static") or "qemu-aarch64-static"
    proc = subprocess.run([qemu, "-L", str(root), str(exe)], capture_output=True, text=True, timeout=120, check=True)
    facts = json.loads(proc.stdout)
    # THEN every pointer is MALLOC_ALIGNMENT-aligned, every chunk is request + SIZE_SZ rounded to it (at least
    # MINSIZE), and the usable size is the chunk less SIZE_SZ: the x86-64 constants hold on arm64
    assert (MALLOC_ALIGNMENT, SIZE_SZ, MINSIZE) == (16, 8, 32)
    assert facts == {"misaligned": 0, "bad_sizes": 0, "min_chunk": MINSIZE}
