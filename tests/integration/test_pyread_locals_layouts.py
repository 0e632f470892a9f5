"""The locals layout table (forensics/pyread/locals.py) against the DWARF of the CPython builds here, through gdb.

pyenv's 3.8-3.13 keep ``-g``; Debian's python3.14/3.15-dbg (the unstable root of tests/roots.py)
carry the DWARF of the release build.  Each offset the table gives is the one gdb's ``ptype/o``
prints for that build.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from forensics.pyread.locals import LOCALS_LAYOUTS
from tests.pythons import discover_pythons

FIELDS = {  # table field -> (struct, member) as gdb names them
    "localsplus": (("PyFrameObject", "f_localsplus"), ("struct _PyInterpreterFrame", "localsplus")),
    "valuestack": (("PyFrameObject", "f_valuestack"),),
    "co_nlocals": (("PyCodeObject", "co_nlocals"),),
    "co_varnames": (("PyCodeObject", "co_varnames"),),
    "co_nlocalsplus": (("PyCodeObject", "co_nlocalsplus"),),
    "co_localsplusnames": (("PyCodeObject", "co_localsplusnames"),),
    "co_localspluskinds": (("PyCodeObject", "co_localspluskinds"),),
    "co_stacksize": (("PyCodeObject", "co_stacksize"),),
    "co_code": (("PyCodeObject", "co_code"),),
    "tuple_items": (("PyTupleObject", "ob_item"),),
}
INSTR = {False: ("PyFrameObject", "f_lasti"), True: ("struct _PyInterpreterFrame", ("prev_instr", "instr_ptr"))}


def _ptype(gdb: str, args: list[str], structs: list[str]) -> dict[str, dict[str, int]]:
    cmd = [gdb, "-nx", "-batch", "-q", *args]
    for s in structs:
        cmd += ["-ex", f"echo @@{s}\\n", "-ex", f"ptype/o {s}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    result: dict[str, dict[str, int]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@@"):
            current = line[2:]
            result[current] = {}
            continue
        m = re.match(r"/\*\s+(\d+)\s+\|\s+\d+\s+\*/\s+.*?(\w+)(\[\d*\])?;\s*$", line)
        if m and current is not None:
            result[current].setdefault(m.group(2), int(m.group(1)))
    return result


def _check(version: tuple[int, int], got: dict[str, dict[str, int]]) -> None:
    lay = LOCALS_LAYOUTS[version]
    for field, places in FIELDS.items():
        want = getattr(lay, field)
        if want is None:
            continue
        found = [got.get(s, {}).get(m) for s, m in places if got.get(s, {}).get(m) is not None]
        if field == "localsplus":
            struct = "struct _PyInterpreterFrame" if lay.interpreter_frames else "PyFrameObject"
            member = "localsplus" if lay.interpreter_frames else "f_localsplus"
            found = [got[struct][member]]
        assert found and found[0] == want, (version, field, found, want)
    struct, members = INSTR[lay.interpreter_frames]
    names = members if isinstance(members, tuple) else (members,)
    assert any(got[struct].get(n) == lay.instr for n in names), (version, "instr")


_STRUCTS = ["PyFrameObject", "struct _PyInterpreterFrame", "PyCodeObject", "PyTupleObject"]


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"])
def test_table_matches_the_dwarf_of_pyenv_builds(minor):
    gdb = shutil.which("gdb")
    pythons = discover_pythons()
    if gdb is None or minor not in pythons:
        pytest.skip(f"gdb or CPython {minor} is not on this machine")
    python = pythons[minor]
    lib = subprocess.run([python, "-c", "import sysconfig,os;d=sysconfig.get_config_var('LIBDIR');"
                          "n=sysconfig.get_config_var('INSTSONAME');p=os.path.join(d,n) if n else '';"
                          "print(p if p and os.path.exists(p) else __import__('sys').executable)"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    got = _ptype(gdb, [lib], _STRUCTS)
    if not got.get("PyCodeObject"):
        pytest.skip(f"{lib} has no DWARF")
    _check(tuple(map(int, minor.split("."))), got)


@pytest.mark.parametrize("minor", ["3.14", "3.15"])
def test_table_matches_the_dwarf_of_debians_builds(minor, sid_root):
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.skip("gdb is not installed")
    got = _ptype(gdb, ["-iex", f"set sysroot {sid_root}", "-iex", f"set debug-file-directory {sid_root}/usr/lib/debug",
                       f"{sid_root}/usr/bin/python{minor}"], _STRUCTS)
    if not got.get("PyCodeObject"):
        pytest.skip(f"no DWARF for python{minor} in {sid_root}")
    _check(tuple(map(int, minor.split("."))), got)
