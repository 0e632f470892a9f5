"""The committed layout table is what gen_layouts reads from this machine's CPython debug builds today."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forensics.pyread.gen_layouts import generate_layout, main
from tests.conftest import python_params

LAYOUTS = Path(__file__).resolve().parents[2] / "forensics" / "pyread" / "layouts.json"
pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")


@pytest.mark.parametrize("python", python_params())
def test_layouts_json_matches_the_dwarf(python):
    from tests.conftest import PYTHONS

    committed = json.loads(LAYOUTS.read_text())["layouts"][python]
    fresh = generate_layout(PYTHONS[python])
    # the offsets, sizes and bit positions the reader uses are the DWARF's, field for field
    assert fresh["types"] == committed["types"] and fresh["sizes"] == committed["sizes"]
    assert fresh["ptr_size"] == committed["ptr_size"] and fresh["version"].startswith(python)


def test_main_writes_a_table_that_keeps_other_versions(tmp_path):
    from tests.conftest import PYTHONS

    version = sorted(PYTHONS, key=lambda v: tuple(map(int, v.split("."))))[-1]
    out = tmp_path / "layouts.json"
    out.write_text(json.dumps({"layouts": {"3.7": {"version": "3.7.0", "types": {}}}}))
    assert main(["-o", str(out), PYTHONS[version]]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["layouts"]) == {"3.7", version}
    assert doc["layouts"][version]["build_id"]
