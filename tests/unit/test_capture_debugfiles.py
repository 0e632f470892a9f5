"""capture's debug files of a crash are bounded (forensics.capture.debugfiles.open_debug_files): at most
MAX_DEBUG_BYTES each and MAX_DEBUG_TOTAL together; a file that would pass the total is left out, the ones
after it still kept when they fit.

The files are real debug files (gcc, objcopy --only-keep-debug) with build-ids of our choosing, made large by
extending them sparse (their build-id note stays where it is), laid out in a host root as Debian does.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.capture.debugfiles import MAX_DEBUG_BYTES, MAX_DEBUG_TOTAL, open_debug_files
from forensics.core.buildid import read_build_id_from_file
from forensics.core.debugfiles import build_id_debug_path

MiB = 1 << 20


@pytest.fixture(scope="module")
def host_root(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A root with five debug files: two of 500 MiB, a third of 500 MiB, a small one, one past 512 MiB."""
    if shutil.which("gcc") is None or shutil.which("objcopy") is None:
        pytest.skip("gcc and binutils are not installed")
    d = tmp_path_factory.mktemp("debugroot")
    (d / "x.c").write_text("int forensics_debug_marker(void) { return 7; }\n")
    sizes = {"first": 500 * MiB, "second": 500 * MiB, "third": 500 * MiB, "small": 0, "huge": MAX_DEBUG_BYTES + 1}
    ids = {}
    for i, (name, size) in enumerate(sizes.items()):
        build_id = f"{0xf0 + i:02x}" + "ab" * 19
        so = d / f"{name}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-g", f"-Wl,--build-id=0x{build_id}", "-o", str(so),
                        str(d / "x.c")], check=True, timeout=120)
        debug = d / "root" / build_id_debug_path(build_id).lstrip("/")
        debug.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["objcopy", "--only-keep-debug", str(so), str(debug)], check=True, timeout=120)
        if size:
            os.truncate(debug, size)  # sparse: no disk used
        assert read_build_id_from_file(str(debug)) == build_id
        ids[name] = build_id
    return d / "root", ids


def test_debug_files_past_the_crash_total_are_left_out(host_root):
    root, ids = host_root
    assert 2 * 500 * MiB <= MAX_DEBUG_TOTAL < 3 * 500 * MiB
    # GIVEN a crash whose objects have debug files of 500, 500, 500 MiB, a small one, one past 512 MiB, and
    # the first again (its build-id in capitals)
    objects = [(f"/usr/lib/lib{name}.so", build_id) for name, build_id in ids.items()]
    objects.append(("/usr/lib/again.so", ids["first"].upper()))
    # WHEN capture opens them (the process's own root has none of them: this test's pid is searched first)
    found = open_debug_files(os.getpid(), objects, host_root=str(root))
    try:
        kept = {path: os.fstat(fd).st_size for path, _build_id, fd in found}
    finally:
        for _path, _build_id, fd in found:
            os.close(fd)
    # THEN the first two are kept, the third would pass the 1 GiB total and is left out, the small one after it
    # still fits; the one past 512 MiB is never opened for keeping; the first's build-id once
    assert set(kept) == {"/usr/lib/libfirst.so", "/usr/lib/libsecond.so", "/usr/lib/libsmall.so"}, kept
    assert sum(kept.values()) <= MAX_DEBUG_TOTAL
    assert [b for _p, b, _fd in found] == [ids["first"], ids["second"], ids["small"]]
