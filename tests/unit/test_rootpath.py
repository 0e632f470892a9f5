"""The one resolver inside a root, on real directory trees with planted links."""
from __future__ import annotations

import errno
import os

import pytest

from forensics import rootpath


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "usr/lib").mkdir(parents=True)
    (r / "usr/lib/libc.so.6").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(b"host secret")
    os.symlink("/", r / "slash")  # absolute: the root itself
    os.symlink("usr/lib", r / "lib")  # relative, like merged /usr
    os.symlink("../../../../../../../..", r / "usr/up")  # .. stops at the root
    os.symlink(str(tmp_path), r / "host")  # a host path: means <root><tmp_path>, which is not there
    os.symlink("b", r / "a")
    os.symlink("a", r / "b")
    os.mkfifo(r / "fifo")
    return r


@pytest.mark.parametrize("path", ["/usr/lib/libc.so.6", "lib/libc.so.6", "/slash/slash/lib/libc.so.6",
                                  "/usr/up/usr/up/lib/libc.so.6", "/../../usr/lib/../lib/./libc.so.6"])
def test_every_way_in_ends_at_the_same_file(root, path):
    assert rootpath.resolve_in_root(str(root), path) == "/usr/lib/libc.so.6"
    assert rootpath.read_in_root(str(root), path, 100) == b"inside"


@pytest.mark.parametrize("path,err", [
    ("/host/secret", errno.ENOENT),  # an absolute link to a host directory stays inside
    ("/usr/up/secret", errno.ENOENT),
    ("/a", errno.ELOOP),
    ("/usr/lib/libc.so.6/x", errno.ENOTDIR),
])
def test_no_way_out(root, path, err):
    with pytest.raises(OSError) as e:
        rootpath.open_in_root(str(root), path)
    assert e.value.errno == err and e.value.filename == path


def test_root_by_descriptor_and_the_root_itself(root):
    fd = rootpath.open_root(str(root))
    try:
        assert rootpath.listdir_in_root(fd, "/usr/up") == sorted(os.listdir(root))
        assert rootpath.resolve_in_root(fd, "/slash/..") == "/"
    finally:
        os.close(fd)


def test_links_themselves_and_special_files(root):
    assert rootpath.readlink_in_root(str(root), "/slash/lib") == "usr/lib"
    assert rootpath.lstat_in_root(str(root), "/lib").st_size == len("usr/lib")
    with pytest.raises(OSError) as e:
        rootpath.open_in_root(str(root), "/lib", follow_last=False)  # a link is opened only as O_PATH
    assert e.value.errno == errno.ELOOP
    with pytest.raises(OSError) as e:
        rootpath.open_in_root(str(root), "/fifo")  # would block: refused, not opened
    assert e.value.errno == errno.EINVAL
    os.close(rootpath.open_in_root(str(root), "/fifo", os.O_PATH))


def test_makedirs_never_goes_through_a_link(root, tmp_path):
    fd = rootpath.makedirs_in_root(str(root), "/.sysroot/usr/lib")
    os.close(fd)
    assert (root / ".sysroot/usr/lib").is_dir()
    for bad in ("/slash/x", "/lib/x", "/usr/../x"):
        with pytest.raises(OSError):
            rootpath.makedirs_in_root(str(root), bad)
    assert not (tmp_path / "x").exists() and not (root / "x").exists() and not (root / "usr/lib/x").exists()


def test_a_trace_names_each_link_where_it_lies(root):
    # GIVEN links through links, one back up with ..; THEN each link followed, at its canonical path, in order
    assert rootpath.trace_in_root(str(root), "/slash/slash/lib/libc.so.6") == (
        [("/slash", "/"), ("/slash", "/"), ("/lib", "usr/lib")], "/usr/lib/libc.so.6")
    assert rootpath.trace_in_root(str(root), "/usr/up/lib/../lib/libc.so.6") == (
        [("/usr/up", "../../../../../../../.."), ("/lib", "usr/lib")], "/usr/lib/libc.so.6")
    assert rootpath.trace_in_root(str(root), "/usr/lib") == ([], "/usr/lib")
    with pytest.raises(OSError) as e:
        rootpath.trace_in_root(str(root), "/a")
    assert e.value.errno == errno.ELOOP
