"""Python frame locals and the ctypes call in progress, read from cores of CPython 3.8-3.15.

tests/crashers/ctypes_overflow.py: a 36-entry ctypes array of 40-byte records, 24 bytes written past
its end, and glibc aborting inside ``libc.free(nxt)`` called through ctypes from the same frame.
pyenv's 3.8-3.13 here; Debian's 3.14 and 3.15 in the unstable root (tests/roots.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.analyze import analyze_core
from tests.conftest import python_params
from tests.crashers.make_core import crash_for_core
from tests.pythons import discover_pythons

SCRIPT = Path(__file__).resolve().parent.parent / "crashers" / "ctypes_overflow.py"


def _check(core: Path, oracle: dict, sysroot: str | None = None) -> None:
    a = analyze_core(str(core), method="direct", native_method="none", sysroot=sysroot)
    c = a.heap.corruption
    # the buffer that overflowed is the array local of query(), named, typed and counted
    assert c.overflowed.mem == oracle["buffer"] and c.usable_size == oracle["usable"]
    assert c.owner is not None and c.owner.name == "values" and c.owner.function.endswith("query")
    o = c.owner.object
    assert (o.type_name, o.kind, o.length, o.element_size, o.size, o.buffer) == (
        "Record_Array_36", "array", 36, 40, 1440, oracle["buffer"])
    assert c.overflow_length == 24 and c.buffer_size == 1440
    # the call in progress is libc's free of the chunk after it -- not passed the array: undetermined
    assert c.call is None and "not an argument of a native call in progress" in c.verdict_reason
    crashed = a.snapshot.crashed_thread
    assert crashed.py_frames[0].function.endswith("query")


@pytest.mark.parametrize("version", python_params())
def test_locals_of_pyenv_pythons(version, tmp_path, core_pattern):
    python = discover_pythons()[version]
    run = tmp_path / "run"
    run.mkdir()
    core = crash_for_core([python, str(SCRIPT), str(run / "oracle.json")], run, outputs=("oracle.json",))
    _check(core, json.loads((run / "oracle.json").read_text()))


@pytest.mark.parametrize("minor", ["3.14", "3.15"])
def test_locals_of_debian_pythons(minor, sid_root, tmp_path, core_pattern):
    run = tmp_path / "run"
    run.mkdir()
    core = crash_for_core([f"/usr/bin/python{minor}", str(SCRIPT), str(run / "oracle.json")], run,
                          root=sid_root, binds=(SCRIPT,), outputs=("oracle.json",))
    _check(core, json.loads((run / "oracle.json").read_text()), sysroot=str(sid_root))
