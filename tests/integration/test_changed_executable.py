"""An interpreter that changed since the crash (another build of the same version on the node) or is
missing: the runtime is found in the core's own memory, every Python frame is recovered, and the changed
file is named -- never "install debug symbols" for that case (#12 item 3).  pystack, given the right
files, is the oracle."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.analyze import analyze_core
from forensics.core import open_core
from forensics.core.image import ElfImage
from forensics.model import LibraryStatus, PythonStatus
from tests.conftest import python_params
from tests.oracles import frame_keys, pystack_stacks


def another_build(src: str, dst: Path, *, strip: bool = False) -> str:
    """A copy of ``src`` that is another build of it: the same code, another build-id (a rebuilt binary)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    if strip:
        subprocess.run(["strip", "--strip-all", str(dst)], check=True)
    bid = ElfImage.from_file(str(dst)).build_id()
    data = bytearray(dst.read_bytes())
    at = data.find(bytes.fromhex(bid))
    data[at] ^= 0xFF
    dst.write_bytes(bytes(data))
    new = ElfImage.from_file(str(dst)).build_id()
    assert new != bid
    return new


def runtime_object(core) -> object:
    """The object that holds the interpreter: libpython when shared, else the executable."""
    return next((lib for lib in core.libraries if lib.name.startswith("libpython")),
                next(lib for lib in core.libraries if lib.path == core.executable))


@pytest.mark.parametrize("key", python_params(("3.8", "3.12", "3.13"), sid=("3.14",)))
def test_another_build_of_the_interpreter_recovers_every_frame_and_names_it(cores, key, tmp_path):
    # GIVEN a core, and a sysroot where the interpreter's object (stripped) is another build of it
    interp = cores.interpreter(key)
    path = str(cores.get(key, "heap-prev"))
    real_root = str(interp.root) if interp.root else None
    obj = runtime_object(open_core(path, sysroot=real_root))
    root = tmp_path / "root"
    another_build(obj.file_path, root / obj.path.lstrip("/"), strip=True)
    # WHEN it is analyzed with that sysroot
    a = analyze_core(path, sysroot=str(root), method="direct")
    # THEN the file is judged another build, and the runtime is found in the core's memory
    lib = next(lib for lib in a.snapshot.core.libraries if lib.path == obj.path)
    assert lib.status is LibraryStatus.MISMATCH
    snap = a.snapshot
    assert snap.python_status is PythonStatus.OK, snap.python_stack_status
    assert f"the file at {lib.file_path} is another build than the one that crashed" in snap.python_layout
    # and every Python frame is pystack's with the right files
    threads = [t for t in snap.threads if t.py_frames]
    assert {t.tid: frame_keys(t.py_frames) for t in threads} == pystack_stacks(path, interp.executable,
                                                                                root=real_root)
    assert not any("-dbg" in w or "debug symbols" in w for w in snap.warnings)
    # and gdb, which cannot read another build's DWARF, says that and not "install debug symbols"
    g = analyze_core(path, sysroot=str(root), method="gdb")
    status = g.snapshot.python_stack_status
    assert "another build than the one that crashed" in status and "-dbg" not in status, status


def test_a_missing_executable_still_gives_the_stacks(cores, tmp_path):
    # GIVEN Debian's python3.14 core analyzed against a root that has none of its files
    interp = cores.interpreter("sid-3.14")
    path = str(cores.get("sid-3.14", "heap-prev"))
    (tmp_path / "empty").mkdir()
    a = analyze_core(path, sysroot=str(tmp_path / "empty"), method="direct")
    # THEN the runtime is found in the core's memory and the executable named as missing
    exe = next(lib for lib in a.snapshot.core.libraries if lib.path == "/usr/bin/python3.14")
    assert exe.status is LibraryStatus.MISSING
    assert a.snapshot.python_status is PythonStatus.OK, a.snapshot.python_stack_status
    assert "/usr/bin/python3.14 is missing" in a.snapshot.python_layout
    threads = [t for t in a.snapshot.threads if t.py_frames]
    assert {t.tid: frame_keys(t.py_frames) for t in threads} == pystack_stacks(path, interp.executable,
                                                                                root=str(interp.root))
