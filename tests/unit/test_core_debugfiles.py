"""Separate debug files found by build-id, in a root and on this machine (forensics.core.debugfiles).

Real ELF files: a library built here with -g and split with objcopy --only-keep-debug, and glibc's own
debug file from Debian's libc6-dbg.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.core.buildid import read_build_id_from_file
from forensics.core.debugfiles import build_id_debug_path, find_debug_file
from tests.crashers.make_core import build_libcrash

pytestmark = pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils (objcopy) not installed")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return build_libcrash(tmp_path_factory.mktemp("lib"))


def objcopy(*args: str) -> None:
    subprocess.run(["objcopy", *args], check=True, capture_output=True)


def plant(root: Path, build_id: str, src: Path) -> Path:
    dest = root / build_id_debug_path(build_id).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dest)
    return dest


# -- finding them ---------------------------------------------------------------------------------


def test_debug_file_found_by_build_id_inside_the_root(library, tmp_path):
    # GIVEN a root holding the library's debug file where a distribution installs it
    build_id = read_build_id_from_file(str(library))
    debug = tmp_path / "libcrash.debug"
    objcopy("--only-keep-debug", str(library), str(debug))
    planted = plant(tmp_path / "root", build_id, debug)
    # THEN it is found there, and only there
    assert find_debug_file(build_id, str(tmp_path / "root")) == str(planted)
    assert find_debug_file(build_id, None) is None
    assert find_debug_file(build_id.upper(), str(tmp_path / "root")) == str(planted)


def test_a_file_of_another_build_at_that_path_is_not_used(library, tmp_path):
    # GIVEN a root whose debug file for the library's build-id is some other object's
    build_id = read_build_id_from_file(str(library))
    plant(tmp_path / "root", build_id, Path("/bin/true").resolve())
    # THEN nothing is found: the build-id inside the file decides, not its name
    assert find_debug_file(build_id, str(tmp_path / "root")) is None


def test_a_link_out_of_the_root_is_not_followed(library, tmp_path):
    build_id = read_build_id_from_file(str(library))
    debug = tmp_path / "outside.debug"
    objcopy("--only-keep-debug", str(library), str(debug))
    link = tmp_path / "root" / build_id_debug_path(build_id).lstrip("/")
    link.parent.mkdir(parents=True)
    link.symlink_to(debug)  # absolute: taken relative to the root, where nothing is
    assert find_debug_file(build_id, str(tmp_path / "root")) is None


@pytest.mark.parametrize("bad", ["", "ab", "../../../../etc/passwd", "xyz0123456789", "a" * 200])
def test_malformed_build_ids_find_nothing(bad, tmp_path):
    assert build_id_debug_path(bad) is None and find_debug_file(bad, str(tmp_path)) is None


def test_this_machines_debug_files_by_build_id(tmp_path):
    # glibc's debug file (Debian libc6-dbg, installed by .ci/setup) for this machine's libc
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    build_id = read_build_id_from_file(str(libc))
    expected = build_id_debug_path(build_id)
    if not os.path.isfile(expected):
        pytest.skip(f"libc6-dbg is not installed ({expected} missing): apt-get install -y libc6-dbg")
    # an empty root: the machine's own file of that build-id stands in
    assert find_debug_file(build_id, str(tmp_path)) == expected
