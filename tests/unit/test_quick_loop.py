"""The quick loop (`pytest -m quick`, docs/testing.md) reaches every package of forensics: each is imported by a
test of the loop, run by a command a test of the loop runs, or imported, when the module is imported, by one
that is (its import-time code runs).  A package added without a quick test fails here."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import QUICK, in_quick_loop
from tests.import_graph import module_files, read_graph, unit_of
from tests.unit.test_import_graph import LAYERS

REPO = Path(__file__).resolve().parents[2]
#: commands a quick test runs by name (through CliRunner or `python -m forensics`): their module runs whole
RUN_BY_NAME = {
    "analyze": "test_cli_analyze.py", "debug": "test_debug.py", "canary": "test_canary.py",
    "demo": "test_user_errors.py", "agent": "test_user_errors.py", "report": "test_report.py",
    "fleet": "test_fleet.py", "verify-imports": "test_verify_imports.py", "capture": "test_user_errors.py",
    "reproduce": "test_user_errors.py", "core-handler": "test_capture_handler.py", "guard": "test_guard_compose.py",
}

#: packages a quick test runs from deep inside a command (a lazy import the import-time walk does not follow)
RUN_INSIDE = {"jsonrecords": "report reads every --json document through it (test_report.py's report --check)"}


def quick_files() -> list[Path]:
    out: set[Path] = set()
    for q in QUICK:
        f = REPO / q.split("::")[0]
        out |= set(f.glob("test_*.py")) if q.endswith("/") else {f}
    return sorted(out)


def test_the_selection_matches_as_documented():
    assert in_quick_loop("tests/unit/test_docs.py::test_every_link_leads_somewhere")
    assert in_quick_loop("tests/integration/test_user_errors.py::test_dash_is_standard_output")
    assert in_quick_loop("tests/integration/test_cli_analyze.py::test_full_paths_name_each_python_file_as_an_editor_"
                         "opens_it[merged]")
    assert not in_quick_loop("tests/integration/test_cli_analyze.py::test_json_document_more")
    assert not in_quick_loop("tests/integration/test_heap.py::test_x")
    assert all((REPO / q.split("::")[0]).exists() for q in QUICK)


def test_every_package_is_reached_by_the_quick_loop():
    modules = module_files()
    texts = {f: f.read_text() for f in quick_files()}
    # GIVEN what the quick tests import, and the command modules of the commands they run
    reached = {m for m in modules for t in texts.values()
               if re.search(rf"^\s*(from {re.escape(m)}\b|import {re.escape(m)}\b)", t, re.M)
               or (m.count(".") == 1 and re.search(rf"^\s*from forensics import .*\b{m.split('.')[1]}\b", t, re.M))}
    for command, test in RUN_BY_NAME.items():
        assert f'"{command}"' in texts[REPO / "tests" / "integration" / test], (command, test)
        reached.add("forensics.commands." + command.replace("-", "_"))
    full = read_graph()  # a command's body runs when the command runs: its lazy imports too
    for m in list(reached):
        if m.startswith("forensics.commands."):
            reached |= full[m]
    # WHEN what they import when imported is followed
    at_import = read_graph(at_import=True)
    todo = list(reached)
    while todo:
        for target in at_import.get(todo.pop(), ()):
            if target not in reached:
                reached.add(target)
                todo.append(target)
    # THEN every package (unit of the import graph's tiers) is reached
    units = {u for layer in LAYERS for u in layer} - {"__main__"}
    assert sorted(units - {unit_of(m) for m in reached} - set(RUN_INSIDE)) == []
