"""Sysroot resolution on real directory trees, and library classification."""
from __future__ import annotations

import os

import pytest

from forensics.core.files import classify_library, real_name_in_sysroot, resolve_file, resolve_in_sysroot
from forensics.model import LibraryStatus


@pytest.fixture
def sysroot(tmp_path):
    root = tmp_path / "sysroot"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "opt/real").mkdir(parents=True)
    (root / "opt/real/libfoo.so.1.2").write_bytes(b"\x7fELF in sysroot")
    (root / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"libc")
    os.symlink("usr/lib", root / "lib")  # a relative directory link, like merged /usr
    os.symlink("/opt/real/libfoo.so.1.2", root / "usr/lib/libfoo.so.1")  # absolute: sysroot-relative
    os.symlink("../../../../../../../../etc/hostname", root / "usr/lib/escape-dots")
    os.symlink("/etc", root / "etc")  # absolute link to a host directory
    os.symlink("loop-b", root / "usr/lib/loop-a")
    os.symlink("loop-a", root / "usr/lib/loop-b")
    return root


def test_plain_path(sysroot):
    assert resolve_in_sysroot(str(sysroot), "/usr/lib/x86_64-linux-gnu/libc.so.6") == str(
        sysroot / "usr/lib/x86_64-linux-gnu/libc.so.6"
    )


def test_relative_directory_link(sysroot):
    assert resolve_in_sysroot(str(sysroot), "/lib/x86_64-linux-gnu/libc.so.6") == str(
        sysroot / "usr/lib/x86_64-linux-gnu/libc.so.6"
    )


def test_absolute_link_target_is_sysroot_relative(sysroot):
    assert resolve_in_sysroot(str(sysroot), "/lib/libfoo.so.1") == str(sysroot / "opt/real/libfoo.so.1.2")


def test_dotdot_stops_at_the_sysroot_root(sysroot):
    # ../../etc/hostname from inside the sysroot: the host's /etc/hostname must not be reached
    assert resolve_in_sysroot(str(sysroot), "/usr/lib/escape-dots") is None
    inside = str(sysroot / "opt/real/libfoo.so.1.2")
    assert resolve_in_sysroot(str(sysroot), "/../../../opt/real/libfoo.so.1.2") == inside


def test_absolute_link_to_host_path_stays_inside(sysroot):
    # sysroot/etc -> /etc means sysroot/etc -> sysroot/etc: a loop, never the host's /etc
    assert resolve_in_sysroot(str(sysroot), "/etc/hostname") is None


def test_symlink_loop_ends(sysroot):
    assert resolve_in_sysroot(str(sysroot), "/usr/lib/loop-a") is None


def test_missing_and_non_files(sysroot):
    assert resolve_in_sysroot(str(sysroot), "/usr/lib/nothing.so") is None
    assert resolve_in_sysroot(str(sysroot), "/usr/lib") is None  # a directory
    assert resolve_in_sysroot(str(sysroot), "/usr/lib/x86_64-linux-gnu/libc.so.6/x") is None
    assert resolve_in_sysroot(str(sysroot), "/") is None


def test_resolve_file_without_sysroot_uses_the_path(tmp_path):
    f = tmp_path / "lib.so"
    f.write_bytes(b"not elf")
    assert resolve_file(str(f), None, "abcd") == (str(f), None)
    assert resolve_file(str(tmp_path / "gone.so"), None, "abcd") == (None, None)


def test_resolve_file_in_sysroot_not_on_host(sysroot):
    # a non-ELF file has no build-id; a missing one is (None, None)
    assert resolve_file("/lib/libfoo.so.1", str(sysroot), None) == (str(sysroot / "opt/real/libfoo.so.1.2"), None)
    assert resolve_file("/nope/lib.so", str(sysroot), "ab") == (None, None)


@pytest.mark.parametrize(
    "core_id,file_path,file_id,status",
    [
        ("aa", "/x", "aa", LibraryStatus.OK),
        ("aa", "/x", "bb", LibraryStatus.MISMATCH),
        ("aa", None, None, LibraryStatus.MISSING),
        (None, None, None, LibraryStatus.MISSING),
        (None, "/x", "bb", LibraryStatus.UNVERIFIED),
        ("aa", "/x", None, LibraryStatus.UNVERIFIED),
    ],
)
def test_classify_library(core_id, file_path, file_id, status):
    assert classify_library(core_id, file_path, file_id) is status


def test_real_name_is_the_files_own_name_inside_the_sysroot(sysroot):
    # GIVEN the names a dynamic linker loads by: a soname link (absolute, so sysroot-relative), a merged-/usr path
    root = str(sysroot)
    # THEN each is named by the file it reaches inside the sysroot, never by one outside it
    assert real_name_in_sysroot(root, "/lib/libfoo.so.1") == "/opt/real/libfoo.so.1.2"
    assert real_name_in_sysroot(root, "/lib/x86_64-linux-gnu/libc.so.6") == "/usr/lib/x86_64-linux-gnu/libc.so.6"
    assert real_name_in_sysroot(root, "/usr/lib/escape-dots") is None  # ".." stops at the root: no /etc/hostname
    assert real_name_in_sysroot(root, "/usr/lib/loop-a") is None
    assert real_name_in_sysroot(root, "/usr/lib") is None  # a directory is no object's file
    assert real_name_in_sysroot(root, "/opt/real/missing.so") is None
