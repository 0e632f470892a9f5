"""`forensics agent chart`: the chart shipped in the package, written out for `helm install` — every file as shipped,
no overwrite without --force, --force replaces the chart's files and nothing else, never writes through a link."""
from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from forensics.deploy.helmchart import CHART_DIR, chart_files
from forensics.cli import cli


def _run(*args: str):
    return CliRunner().invoke(cli, ["agent", "chart", *args])


def test_writes_every_file_of_the_shipped_chart(tmp_path):
    # WHEN the chart is written into a new directory
    dest = tmp_path / "forensics-agent"
    r = _run("-o", str(dest), "--json")
    # THEN it holds the package's chart, byte for byte, and the document lists it
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "agent-chart" and doc["chart"] == str(dest)
    assert doc["files"] == chart_files()
    assert {"Chart.yaml", "values.yaml", "templates/daemonset.yaml", "files/forensics-alerts.yaml",
            "files/forensics-dashboard.json"} <= set(doc["files"])
    for rel in doc["files"]:
        assert (dest / rel).read_bytes() == Path(CHART_DIR, rel).read_bytes(), rel
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".forensics-chart-")]  # no temporary left


def test_an_existing_directory_needs_force_and_keeps_what_is_not_the_charts(tmp_path):
    # GIVEN a written chart whose values the user edited, and a file of the user's beside it
    dest = tmp_path / "chart"
    assert _run("-o", str(dest)).exit_code == 0
    (dest / "values.yaml").write_text("edited: true\n")
    (dest / "my-values.yaml").write_text("mine: true\n")
    # WHEN it is written again without, then with --force
    again = _run("-o", str(dest))
    forced = _run("-o", str(dest), "--force")
    # THEN the first is one clear error (exit 1) that changed nothing; the second restores the chart's files only
    assert again.exit_code == 1 and "already exists (not overwritten)" in again.output
    assert "Traceback" not in again.output
    assert forced.exit_code == 0, forced.output
    assert (dest / "values.yaml").read_bytes() == Path(CHART_DIR, "values.yaml").read_bytes()
    assert (dest / "my-values.yaml").read_text() == "mine: true\n"


def test_force_replaces_a_link_and_never_writes_through_it(tmp_path):
    # GIVEN a written chart whose Chart.yaml is a link to a file outside it, and a templates/ that is a link
    dest = tmp_path / "chart"
    assert _run("-o", str(dest)).exit_code == 0
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    (dest / "Chart.yaml").unlink()
    (dest / "Chart.yaml").symlink_to(outside)
    # WHEN it is written again with --force
    r = _run("-o", str(dest), "--force")
    # THEN the link was replaced by the chart's file; the file outside is untouched
    assert r.exit_code == 0, r.output
    assert not (dest / "Chart.yaml").is_symlink() and outside.read_text() == "keep\n"
    # and a linked directory of the chart's is refused, not followed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(dest / "templates", tmp_path / "old-templates")
    (dest / "templates").symlink_to(elsewhere)
    r = _run("-o", str(dest), "--force")
    assert r.exit_code == 1 and "not a directory" in r.output
    assert list(elsewhere.iterdir()) == []


def test_a_missing_parent_is_one_clear_error(tmp_path):
    r = _run("-o", str(tmp_path / "no" / "chart"))
    assert r.exit_code == 1 and "its directory does not exist" in r.output and "Traceback" not in r.output
