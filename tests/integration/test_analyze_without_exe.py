"""Native stacks when the crashed executable cannot be used (another build, or not at hand).

gdb finds shared libraries through the executable's dynamic section; without it, the
libraries whose build-ids checked out are loaded at the addresses the core maps them.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK

pytestmark = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")


def analyze(*args: str) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["analyze", "--json", "--method", "gdb", *args], catch_exceptions=False)
    return r.exit_code, json.loads(r.stdout)["analysis"]


def crashed(doc: dict) -> dict:
    return next(t for t in doc["snapshot"]["threads"] if t["is_crashed"])


@pytest.mark.parametrize("scenario", ["heap-prev", "segv"])
def test_another_build_of_the_executable_keeps_the_library_frames(cores, newest_python, scenario):
    core = cores.get(newest_python, scenario)
    code, good = analyze(str(core))
    # WHEN --exe names a different program than the one that crashed
    code_other, doc = analyze("--exe", shutil.which("gdb"), str(core))
    # THEN it is flagged and left out, and the libraries' frames are still named and walked
    assert doc["snapshot"]["core"]["libraries"][0]["status"] == "build-id-mismatch"
    assert code_other == code == EXIT_OK
    names = [f["symbol"] for f in crashed(doc)["native_frames"]]
    exe = good["snapshot"]["core"]["executable"]
    want = [f["symbol"] for f in crashed(good)["native_frames"] if f["library"] != exe]
    assert any((n or "").startswith("forensics_") for n in names), names  # libcrash.so's culprit function
    # every frame gdb named with the right executable in a library is named the same without it
    assert [n for n in want if n][:8] == [n for n in names if n][:8]
    assert doc["crash"]["kind"] == good["crash"]["kind"] and doc["fingerprint"] == good["fingerprint"]
    # the Python stack does not need the executable
    assert [f["function"] for f in crashed(doc)["py_frames"]] == [f["function"] for f in crashed(good)["py_frames"]]


def test_a_batch_without_executables_does_not_mix_library_symbols(cores, newest_python, tmp_path):
    """One gdb session for several cores: each core's libraries are loaded at its own addresses, then dropped."""
    a, b = cores.get(newest_python, "heap-prev"), cores.get(newest_python, "segv")
    for core in (a, b):
        Path(tmp_path / core.parent.name).mkdir()
        shutil.copy(core, tmp_path / core.parent.name / "core")
    r = CliRunner().invoke(cli, ["analyze", "--json", "--method", "gdb", "--exe", shutil.which("gdb"), "-j", "1",
                                 str(tmp_path)], catch_exceptions=False)
    doc = json.loads(r.stdout)
    results = {Path(x["path"]).parent.name: x for x in doc["cores"]}
    assert len(results) == 2
    for core in (a, b):
        _, alone = analyze(str(core))
        assert results[core.parent.name]["fingerprint"] == alone["fingerprint"]
