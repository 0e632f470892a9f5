"""The committed sample reports (``reports/demo``) are what ``forensics report`` makes of the committed evidence.

``forensics demo --out /tmp/demo-out`` wrote them; regenerated here from their own evidence (the analysis,
the capture bundle, verify-imports and the reproducers, in the demo's order), each report, its claims record and
every attachment -- the reproducers' sources too, attached as the package ships them -- is identical but for the
run values: the minute and version in the footer, where the evidence lies (the runbook keeps local paths) and
how many local paths the footer counts (forensics' own checkout is one of them).  A change to what a report says,
or to a shipped reproducer, fails here until the samples are regenerated: ``FORENSICS_UPDATE_SAMPLES=1`` makes
this test write what ``report`` makes now over the committed reports (``forensics demo --out /tmp/demo-out``, then
copied into ``reports/demo`` without ``work/`` and the core, renews the evidence itself).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
WRITTEN_IN = "/tmp/demo-out"  # where forensics demo wrote them (the paths inside the evidence name it)
UPDATE = os.environ.get("FORENSICS_UPDATE_SAMPLES") == "1"


def _normal(text: str, where: str) -> str:
    text = text.replace(where, WRITTEN_IN)
    # how many local paths the footer counts depends on where forensics runs from (its checkout is a local place)
    text = re.sub(r"\d+ local paths? replaced", "N local paths replaced", text)
    return re.sub(r"Made with forensics \S+ on \d{4}-\d\d-\d\d \d\d:\d\d UTC", "Made with forensics VERSION on DATE",
                  text)


def _files(report: Path) -> dict[str, str]:
    files = {report.name: report.read_text()}
    claims = report.with_name(report.stem + ".claims.json")  # the claims and their evidence, for report --check
    if claims.is_file():
        files[claims.name] = claims.read_text()
    folder = report.with_name(report.stem + ".files")
    if folder.is_dir():
        files.update({f"{folder.name}/{p.name}": p.read_text() for p in sorted(folder.iterdir())})
    return files


def _update(report: Path, again: dict[str, str]) -> None:
    """Write the regenerated report, its claims record and attachments over the committed ones when any differs
    from them but for the run values (a report and its record are written together: the record holds its
    sentences), and remove those report no longer writes."""
    committed = _files(report)
    if sorted(committed) == sorted(again) and all(
            _normal(again[n], str(DEMO)) == _normal(committed[n], WRITTEN_IN) for n in committed):
        return
    for name in committed:
        (DEMO / name).unlink()
    for name, text in again.items():
        (DEMO / name).parent.mkdir(exist_ok=True)
        (DEMO / name).write_text(text.replace(str(DEMO), WRITTEN_IN))


@pytest.mark.parametrize("template", ["nvml", "nvitop", "runbook"])
def test_the_committed_reports_are_what_report_makes_of_the_committed_evidence(template, tmp_path):
    (bundle,) = (DEMO / "capture").iterdir()
    evidence = [DEMO / "analysis.json", bundle, DEMO / "verify-imports.json", DEMO / "reproduce.json"]
    out = tmp_path / f"report-{template}.md"
    r = CliRunner().invoke(cli, ["report", "--template", template, "-o", str(out), *map(str, evidence)],
                           catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    again = _files(out)
    if UPDATE:
        _update(DEMO / out.name, again)
    committed = _files(DEMO / out.name)
    assert sorted(again) == sorted(committed)
    for name in committed:
        assert _normal(again[name], str(DEMO)) == _normal(committed[name], WRITTEN_IN), name
    # and the committed report passes report --check as it is (its claims record, fenced lines and title)
    r = CliRunner().invoke(cli, ["report", "--check", str(DEMO / out.name)], catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stdout
