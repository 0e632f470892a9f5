"""The committed layout table is what gen_layouts reads today from the DWARF of every CPython build here.

This machine's CPython 3.8-3.13 (pyenv keeps -g) and Debian unstable's 3.13, 3.14 and 3.15, release
and debug builds (the -dbg packages carry the release builds' DWARF under /usr/lib/debug): each
equals the table's record of its version in every fact the walker reads.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forensics.pyread.gen_layouts import generate_layout, main, table_key
from tests.conftest import SID_BUILDS, python_params

LAYOUTS = Path(__file__).resolve().parents[2] / "forensics" / "pyread" / "layouts.json"
pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")


def walker_facts(record: dict) -> dict:
    """What the walker reads of a record: each field's offset, size, signedness, kind and bits (not the
    sizes of whole structs, which differ between a release and a debug build), the sizes it uses, the
    enums, and the shape of _Py_DebugOffsets."""
    keep = ("offset", "size", "signed", "kind", "bit", "bits")
    fields = {
        f"{t}.{name}": {k: f[k] for k in keep if k in f} | ({"target_size": f["target_size"]}
                                                             if f.get("kind") == "array" else {})
        for t, rec in record["types"].items() for name, f in rec["fields"].items()
    }
    return {"fields": fields, "sizes": record["sizes"], "enums": record.get("enums", {}),
            "debug_offsets": record.get("debug_offsets_struct"), "ptr_size": record["ptr_size"]}


@pytest.mark.parametrize("key", python_params(sid=SID_BUILDS))
def test_layouts_json_matches_the_dwarf(cores, key):
    # GIVEN one build of CPython (this machine's, or Debian's inside the sid root)
    interp = cores.interpreter(key)
    # WHEN gen_layouts reads its DWARF (the root's files are read, never run)
    fresh = generate_layout(interp.python, sysroot=str(interp.root) if interp.root else None)
    committed = json.loads(LAYOUTS.read_text())["layouts"][interp.version]
    # THEN every fact the walker reads is the table's, field for field
    assert fresh["version"].startswith(interp.version + ".")
    assert table_key(fresh["version"], free_threaded=False, debug=interp.debug_build) == (
        interp.version + ("d" if interp.debug_build else ""))
    assert ("d" in fresh["abiflags"]) == interp.debug_build
    assert walker_facts(fresh) == walker_facts(committed)


def test_main_writes_a_table_that_keeps_other_versions(tmp_path):
    from tests.conftest import PYTHONS

    version = sorted(PYTHONS, key=lambda v: tuple(map(int, v.split("."))))[-1]
    out = tmp_path / "layouts.json"
    out.write_text(json.dumps({"layouts": {"3.7": {"version": "3.7.0", "types": {}}}}))
    assert main(["-o", str(out), PYTHONS[version]]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["layouts"]) == {"3.7", version}
    assert doc["layouts"][version]["build_id"]
