"""Debug files' compressed sections stored plain in the cache (forensics.unwind.debugcache).

Real ELF files: a library built here with -g and compressed with objcopy
--compress-debug-sections (zlib, zstd), and glibc's own debug file from Debian's libc6-dbg;
pyelftools and objcopy --decompress-debug-sections are the oracles for section contents.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.core.buildid import read_build_id_from_file
from forensics.core.debugfiles import build_id_debug_path
from forensics.unwind.debugcache import decompressed_debug_file, has_compressed_sections, write_decompressed
from tests.crashers.make_core import build_libcrash

pytestmark = pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils (objcopy) not installed")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return build_libcrash(tmp_path_factory.mktemp("lib"))


def objcopy(*args: str) -> None:
    subprocess.run(["objcopy", *args], check=True, capture_output=True)


def sections(path: Path) -> dict[str, tuple[int, bytes]]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as f:
        elf = ELFFile(f)
        return {s.name: (s["sh_flags"], s.data()) for s in elf.iter_sections() if s["sh_type"] != "SHT_NOBITS"}


# -- storing them plain ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["zlib", "zstd"])
def test_compressed_sections_are_stored_plain(library, tmp_path, kind):
    # GIVEN the library with its DWARF compressed
    packed = tmp_path / f"libcrash.{kind}.so"
    objcopy(f"--compress-debug-sections={kind}", str(library), str(packed))
    assert has_compressed_sections(str(packed)) and not has_compressed_sections(str(library))
    # WHEN it is rewritten
    plain = tmp_path / "plain.so"
    write_decompressed(str(packed), str(plain))
    # THEN every section holds what the uncompressed original holds, flagged plain, and the build-id note is kept
    want, got = sections(library), sections(plain)
    assert set(got) == set(want)
    for name, (_flags, data) in want.items():
        assert got[name][1] == data, name
        assert not got[name][0] & 0x800, name
    assert not has_compressed_sections(str(plain))
    assert read_build_id_from_file(str(plain)) == read_build_id_from_file(str(library))


def test_glibc_debug_file_as_debian_ships_it(tmp_path):
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    src = build_id_debug_path(read_build_id_from_file(str(libc)))
    if not os.path.isfile(src) or not has_compressed_sections(src):
        pytest.skip(f"no compressed glibc debug file at {src} (Debian libc6-dbg)")
    plain = tmp_path / "libc.debug"
    write_decompressed(src, str(plain))
    # objcopy's own decompression is the oracle
    oracle = tmp_path / "oracle.debug"
    objcopy("--decompress-debug-sections", src, str(oracle))
    want, got = sections(oracle), sections(plain)
    assert {k: v[1] for k, v in got.items()} == {k: v[1] for k, v in want.items()}


def test_a_section_that_lies_about_its_size_is_refused(library, tmp_path):
    # GIVEN a compressed section whose header promises more bytes than its stream holds
    packed = tmp_path / "packed.so"
    objcopy("--compress-debug-sections=zlib", str(library), str(packed))
    from elftools.elf.elffile import ELFFile

    with open(packed, "rb") as f:
        info = ELFFile(f).get_section_by_name(".debug_info")
        offset = info["sh_offset"]
    data = bytearray(packed.read_bytes())
    size = int.from_bytes(data[offset + 8:offset + 16], "little")
    data[offset + 8:offset + 16] = (size * 1000).to_bytes(8, "little")
    packed.write_bytes(bytes(data))
    # THEN it is refused, and the cache hands back the original file
    with pytest.raises(ValueError):
        write_decompressed(str(packed), str(tmp_path / "out.so"))


def test_cache_entries_are_per_file_not_per_build_id(library, tmp_path, monkeypatch):
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path / "cache"))
    build_id = read_build_id_from_file(str(library))
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    objcopy("--compress-debug-sections=zlib", str(library), str(a))
    objcopy("--compress-debug-sections=zlib", str(library), str(b))
    # WHEN the same build-id's file is asked for twice, and then another file claiming that build-id
    first = decompressed_debug_file(str(a), build_id)
    again = decompressed_debug_file(str(a), build_id)
    other = decompressed_debug_file(str(b), build_id)
    # THEN the first copy is made once and kept; the other file gets its own entry
    assert first == again and first.startswith(str(tmp_path / "cache")) and not has_compressed_sections(first)
    assert other != first
    # a file with nothing compressed is used as it is
    assert decompressed_debug_file(str(library), build_id) == str(library)
    # and one the cache cannot rewrite is used as it is too
    broken = tmp_path / "broken.so"
    broken.write_bytes(a.read_bytes()[:4096])
    assert decompressed_debug_file(str(broken), build_id) == str(broken)

