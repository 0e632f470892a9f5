"""forensics.core.symtab on ELF files that lie: a cut-short, a huge or an out-of-range section header
table, tables outside the file, a string table link past the table count.  Each is a clear SymtabError
(or "no symbol table"), never an exception of another kind and never a read past what is bounded.

The files are real: a copy of an unstripped object this machine built (gcc -g), then one field rewritten.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from forensics.core.symtab import SHT_SYMTAB, SymtabError, has_symtab, read_symbols, section_headers


@pytest.fixture(scope="module")
def unstripped(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("symtab")
    (d / "x.c").write_text("int forensics_marker = 7;\nint main(void) { return forensics_marker; }\n")
    subprocess.run(["gcc", "-g", "-O0", "-o", str(d / "x"), str(d / "x.c")], check=True)
    return d / "x"


def _shdrs(path: Path) -> tuple[int, int, int]:
    head = path.read_bytes()[:64]
    return struct.unpack_from("<Q", head, 0x28)[0], *struct.unpack_from("<HH", head, 0x3A)


def _patched(src: Path, dst: Path, edits: list[tuple[int, bytes]], cut: int | None = None) -> Path:
    data = bytearray(src.read_bytes())
    for off, raw in edits:
        data[off:off + len(raw)] = raw
    dst.write_bytes(bytes(data[:cut] if cut is not None else data))
    return dst


def _symtab_index(path: Path) -> int:
    with open(path, "rb") as f:
        return next(i for i, s in enumerate(section_headers(f)) if s[1] == SHT_SYMTAB)


def test_the_unchanged_file_is_read(unstripped):
    assert has_symtab(str(unstripped))
    assert read_symbols(str(unstripped), ["forensics_marker"])["forensics_marker"].size == 4


def test_a_section_header_table_cut_short(unstripped, tmp_path):
    shoff, _, _ = _shdrs(unstripped)
    bad = _patched(unstripped, tmp_path / "cut", [], cut=shoff + 100)
    with pytest.raises(SymtabError, match="cut short"):
        read_symbols(str(bad), ["forensics_marker"])
    assert not has_symtab(str(bad))


@pytest.mark.parametrize("shnum", [0, 4097, 0xFFFF])
def test_a_section_count_of_none_or_past_the_cap(unstripped, tmp_path, shnum):
    bad = _patched(unstripped, tmp_path / "n", [(0x3C, struct.pack("<H", shnum))])
    with pytest.raises(SymtabError, match="no usable section header table"):
        read_symbols(str(bad), ["forensics_marker"])


def test_a_symbol_table_outside_the_file_or_huge(unstripped, tmp_path):
    shoff, shentsize, _ = _shdrs(unstripped)
    at = shoff + _symtab_index(unstripped) * shentsize
    for name, (offset, size) in {"outside": (1 << 40, 4096), "huge": (0, 1 << 40)}.items():
        bad = _patched(unstripped, tmp_path / name, [(at + 0x18, struct.pack("<QQ", offset, size))])
        with pytest.raises(SymtabError, match="outside the file or is too large"):
            read_symbols(str(bad), ["forensics_marker"])


def test_a_string_table_link_past_the_sections_is_no_symbol_table(unstripped, tmp_path):
    shoff, shentsize, _ = _shdrs(unstripped)
    at = shoff + _symtab_index(unstripped) * shentsize
    bad = _patched(unstripped, tmp_path / "link", [(at + 0x28, struct.pack("<I", 0xFFFF))])
    assert read_symbols(str(bad), ["forensics_marker"]) == {}


def test_not_an_elf64_file(tmp_path):
    (tmp_path / "t").write_bytes(b"\x7fELF\x01\x01" + bytes(58))
    with pytest.raises(SymtabError, match="not an ELF64"):
        read_symbols(str(tmp_path / "t"), ["x"])


def test_a_file_rewritten_in_place_is_read_again(unstripped, tmp_path):
    # the section headers are parsed once per file, kept by its identity (device, inode, size, times):
    # a file changed in place after it was read is read again, never answered from what it was
    f = tmp_path / "in-place"
    shutil.copy(unstripped, f)
    assert has_symtab(str(f)) and read_symbols(str(f), ["forensics_marker"])
    shoff, shentsize, _ = _shdrs(f)
    with open(f, "r+b") as out:  # same inode, same size: the .symtab's type becomes PROGBITS
        out.seek(shoff + _symtab_index(f) * shentsize + 4)
        out.write(struct.pack("<I", 1))
    assert not has_symtab(str(f)) and read_symbols(str(f), ["forensics_marker"]) == {}
