"""ElfImage on real ELF files of this machine, checked against pyelftools."""
from __future__ import annotations

import glob
import os

import pytest
from elftools.elf.elffile import ELFFile

from tests.helpers import pyelftools_build_id

from forensics.core.buildid import read_build_id_from_file
from forensics.core.image import ElfImage, gnu_hash, sysv_hash

LIBC = next((p for p in glob.glob("/lib/x86_64-linux-gnu/libc.so.6") + glob.glob("/lib64/libc.so.6")), None)
needs_libc = pytest.mark.skipif(LIBC is None, reason="no x86-64 libc.so.6 on this machine")




def pyelftools_dynsym(path, name):
    with open(path, "rb") as f:
        found = ELFFile(f).get_section_by_name(".dynsym").get_symbol_by_name(name)
        return found[0]["st_value"] if found else None


def test_hash_functions_match_known_values():
    # values from the ELF gABI / glibc dl-hash.h
    assert gnu_hash(b"") == 5381
    assert sysv_hash(b"printf") == 0x077905A6
    assert gnu_hash(b"printf") == 0x156B2BB8


@needs_libc
def test_build_id_of_libc_matches_pyelftools():
    assert read_build_id_from_file(LIBC) == pyelftools_build_id(LIBC)


@needs_libc
@pytest.mark.parametrize("name", ["__abort_msg", "malloc", "free", "abort", "__libc_start_main"])
def test_dynamic_symbol_lookup_matches_pyelftools(name):
    image = ElfImage.from_file(LIBC)
    assert image is not None
    assert image.find_dynamic_symbol(name) == pyelftools_dynsym(LIBC, name)


@needs_libc
def test_unknown_symbol_is_none():
    assert ElfImage.from_file(LIBC).find_dynamic_symbol("no_such_symbol_in_libc_xyz") is None


def test_non_elf_and_missing_files(tmp_path):
    (tmp_path / "text").write_text("hello")
    assert ElfImage.from_file(str(tmp_path / "text")) is None
    assert ElfImage.from_file(str(tmp_path / "missing")) is None
    assert read_build_id_from_file(str(tmp_path / "missing")) is None
    assert read_build_id_from_file(os.devnull) is None
