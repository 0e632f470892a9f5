"""libc's debug file read for malloc's layouts and _int_free's pointer locations: a truncated or lying file is one
DebugInfoError (the heap anatomy then falls back to its layout table), never pyelftools' own exception.

The file is a real one built here: a small shared object with DWARF for a ``malloc_chunk`` and an ``_int_free``, cut
at several points."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from forensics.heap.debuginfo import DebugInfoError, read_free_pointer_locations, read_struct_layouts

SOURCE = """struct malloc_chunk { unsigned long mchunk_prev_size, mchunk_size; struct malloc_chunk *fd, *bk; };
int _int_free(struct malloc_chunk *p) { return p ? (int)p->mchunk_size : 0; }
"""


@pytest.fixture(scope="module")
def malloc_object(tmp_path_factory):
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and nm build the DWARF object (apt-get install gcc binutils)")
    d = tmp_path_factory.mktemp("malloc-dwarf")
    (d / "m.c").write_text(SOURCE)
    subprocess.run(["gcc", "-g", "-gdwarf-4", "-shared", "-fPIC", "-o", str(d / "m.so"), str(d / "m.c")], check=True)
    symbols = subprocess.run(["nm", str(d / "m.so")], capture_output=True, text=True, check=True).stdout
    (addr,) = [int(line.split()[0], 16) for line in symbols.splitlines() if line.endswith(" _int_free")]
    return d / "m.so", addr


def test_the_whole_file_gives_the_layout(malloc_object):
    path, anchor = malloc_object
    layouts = read_struct_layouts(str(path), anchor)
    assert layouts["malloc_chunk"]["members"]["mchunk_size"]["offset"] == 8


@pytest.mark.parametrize("keep", [0.0, 0.004, 0.5, 0.98], ids=["empty", "header-only", "half", "tail-cut"])
@pytest.mark.parametrize("read", [read_struct_layouts, read_free_pointer_locations],
                         ids=["struct-layouts", "free-pointer-locations"])
def test_a_truncated_file_is_one_debug_info_error(malloc_object, tmp_path, keep, read):
    path, anchor = malloc_object
    data = path.read_bytes()
    cut = tmp_path / "cut.so"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(DebugInfoError, match="DWARF"):
        read(str(cut), anchor)
