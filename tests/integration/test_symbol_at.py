"""forensics.core.symtab.symbol_at on a real kernel core: the function a code address lies in, from the
library's .dynsym and the .symtab of its separate debug file (or its own), through a sysroot.

The library has an exported function (in .dynsym) and a static one (only in .symtab); the program prints
both addresses, then faults.  The core is read with the files in place, through a sysroot holding the
library stripped (with and without its debug file where Debian puts it), and through one holding the
debug-only file (``objcopy --only-keep-debug``) as the library: its .dynsym is NOBITS.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from forensics.core import open_core
from forensics.core.debugfiles import build_id_debug_path
from forensics.core.symtab import SHT_SYMTAB, section_headers, symbol_at
from forensics.model import LibraryStatus
from tests.crashers.make_core import crash_for_core

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objcopy") is None,
                                reason="gcc and binutils not installed")

LIB_C = r"""
__attribute__((noinline)) static int hidden_helper(int x) { return x * 3 + 1; }
int exported_entry(int x) { return hidden_helper(x) + 2; }
void *hidden_address(void) { return (void *)hidden_helper; }
"""
MAIN_C = r"""
#include <stdio.h>
int exported_entry(int);
void *hidden_address(void);
int main(void) {
    fprintf(stderr, "%p %p\n", (void *)exported_entry, hidden_address());
    fflush(stderr);
    return *(volatile int *)0 + exported_entry(1);
}
"""


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, core_pattern):
    """(core path, library path, exported function's address, static function's address)."""
    d = tmp_path_factory.mktemp("symbol_at")
    (d / "lib.c").write_text(LIB_C)
    (d / "main.c").write_text(MAIN_C)
    lib = d / "libsymat.so"
    subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-Wl,--build-id", "-o", str(lib), str(d / "lib.c")],
                   check=True, timeout=120)
    exe = d / "main"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(d / "main.c"), str(lib), f"-Wl,-rpath,{d}"],
                   check=True, timeout=120)
    run = d / "run"
    run.mkdir()
    core = crash_for_core([str(exe)], run)
    exported, hidden = (int(x, 16) for x in (run / ".stderr").read_text().split()[:2])
    return core, lib, exported, hidden


def sysroot_with(root: Path, lib: Path, content: Path) -> Path:
    dst = root / str(lib).lstrip("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(content, dst)
    return root


def test_names_from_the_librarys_own_tables(crashed):
    core_path, lib, exported, hidden = crashed
    core = open_core(str(core_path))
    assert next(x for x in core.libraries if x.path == str(lib)).status is LibraryStatus.OK
    assert symbol_at(core, exported) == ("exported_entry", str(lib))
    assert symbol_at(core, exported + 1) == ("exported_entry", str(lib))
    assert symbol_at(core, hidden) == ("hidden_helper", str(lib))  # its own .symtab: not stripped


def test_a_stripped_library_names_only_what_it_exports(crashed, tmp_path):
    core_path, lib, exported, hidden = crashed
    subprocess.run(["strip", "--strip-all", "-o", str(tmp_path / "stripped.so"), str(lib)], check=True)
    root = sysroot_with(tmp_path / "root", lib, tmp_path / "stripped.so")
    core = open_core(str(core_path), sysroot=str(root))
    assert symbol_at(core, exported, sysroot=str(root)) == ("exported_entry", str(lib))
    assert symbol_at(core, hidden, sysroot=str(root)) == (None, str(lib))


def test_a_stripped_library_is_named_from_its_debug_file_in_the_root(crashed, tmp_path):
    # GIVEN the library stripped in a sysroot, and its separate debug file where Debian installs it
    core_path, lib, exported, hidden = crashed
    subprocess.run(["strip", "--strip-all", "-o", str(tmp_path / "stripped.so"), str(lib)], check=True)
    root = sysroot_with(tmp_path / "root", lib, tmp_path / "stripped.so")
    core = open_core(str(core_path), sysroot=str(root))
    build_id = next(x for x in core.libraries if x.path == str(lib)).build_id
    debug = root / build_id_debug_path(build_id).lstrip("/")
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(debug)], check=True)
    # THEN the static function is named from the debug file's .symtab
    assert symbol_at(core, hidden, sysroot=str(root)) == ("hidden_helper", str(lib))
    assert symbol_at(core, exported, sysroot=str(root)) == ("exported_entry", str(lib))


def test_a_debug_only_file_as_the_library_is_read_for_its_symtab(crashed, tmp_path):
    # GIVEN the library's debug-only file (same build-id, so it matches the core) in its place
    core_path, lib, exported, hidden = crashed
    subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(tmp_path / "debug-only.so")], check=True)
    from elftools.elf.elffile import ELFFile

    with open(tmp_path / "debug-only.so", "rb") as f:  # pyelftools, to name the sections
        sections = {s.name: s["sh_type"] for s in ELFFile(f).iter_sections()}
    assert sections[".dynsym"] == "SHT_NOBITS" and sections[".symtab"] == "SHT_SYMTAB", sections
    root = sysroot_with(tmp_path / "root", lib, tmp_path / "debug-only.so")
    core = open_core(str(core_path), sysroot=str(root))
    assert next(x for x in core.libraries if x.path == str(lib)).status is LibraryStatus.OK
    # THEN both functions are named, from the .symtab, and the NOBITS table is no error
    assert symbol_at(core, exported, sysroot=str(root)) == ("exported_entry", str(lib))
    assert symbol_at(core, hidden, sysroot=str(root)) == ("hidden_helper", str(lib))


def test_a_symbol_table_that_lies_about_its_size_names_nothing_from_it(crashed, tmp_path):
    # GIVEN the library with its .symtab's size patched to 1 TiB (past the file)
    core_path, lib, exported, hidden = crashed
    data = bytearray(lib.read_bytes())
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    with open(lib, "rb") as f:
        index = next(i for i, s in enumerate(section_headers(f)) if s[1] == SHT_SYMTAB)
    struct.pack_into("<Q", data, shoff + index * 64 + 0x20, 1 << 40)
    (tmp_path / "lying.so").write_bytes(bytes(data))
    root = sysroot_with(tmp_path / "root", lib, tmp_path / "lying.so")
    core = open_core(str(core_path), sysroot=str(root))
    # THEN the static function is unnamed (never guessed), the exported one still named from .dynsym
    assert symbol_at(core, hidden, sysroot=str(root)) == (None, str(lib))
    assert symbol_at(core, exported, sysroot=str(root)) == ("exported_entry", str(lib))
