"""The committed sample reports (``reports/demo``) are what ``forensics report`` makes of the committed evidence.

``forensics demo --out /tmp/demo-out`` wrote them; regenerated here from their own evidence (the analysis,
the capture bundle, verify-imports and the reproducers, in the demo's order), each report and attachment is
identical but for the run values: the minute and version in the footer, where the evidence lies (the
runbook keeps local paths) and how many local paths the footer counts (forensics' own checkout is one of
them); the reproducers' sources, attached as the package ships them, are not compared.  A change to what a
report says fails here until the samples are regenerated (``forensics demo --out /tmp/demo-out``, then copied
into ``reports/demo`` without ``work/`` and the core).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
WRITTEN_IN = "/tmp/demo-out"  # where forensics demo wrote them (the paths inside the evidence name it)
SHIPPED = ("nvml_nvlink_fieldvalues.c", "nvml_nvlink_fieldvalues.py")  # attached from the package, as they are now


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


@pytest.mark.parametrize("template", ["nvml", "nvitop", "runbook"])
def test_the_committed_reports_are_what_report_makes_of_the_committed_evidence(template, tmp_path):
    (bundle,) = (DEMO / "capture").iterdir()
    evidence = [DEMO / "analysis.json", bundle, DEMO / "verify-imports.json", DEMO / "reproduce.json"]
    out = tmp_path / f"report-{template}.md"
    r = CliRunner().invoke(cli, ["report", "--template", template, "-o", str(out), *map(str, evidence)],
                           catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    committed = _files(DEMO / out.name)
    again = _files(out)
    assert sorted(again) == sorted(committed)
    for name in committed:
        if name.rsplit("/", 1)[-1] in SHIPPED:
            continue  # the reproducers' sources are the tool's own files, attached as shipped: not made from evidence
        assert _normal(again[name], str(DEMO)) == _normal(committed[name], WRITTEN_IN), name
