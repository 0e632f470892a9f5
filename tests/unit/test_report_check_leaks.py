"""report --check's pass over what a written report would leak (#37 item 5): a secret or a raw control character in
the report file or any attachment, named by file and line, exit 3; beside the claims pass, which still fires.

The reports are the committed demo samples (reports/demo/), copied and edited as a person would between
``report -o`` and filing the issue."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYCheckKey37"
PLANTED = {  # what an attachment gains, and the kind of finding each is
    "crash-stacks.txt": f"aws_secret_access_key: {AWS_SECRET}",
    "reproducer-output.txt": "DATABASE_URL=postgresql://app:DbPassw0rd37@db.internal:5432/metrics",
    "nvml_nvlink_fieldvalues.py": "# HF_TOKEN hf_CheckLeakToken37abcdefghijkl",
    "nvml_nvlink_fieldvalues.c": "/* curl -H 'Authorization: Bearer CheckBearer37abcdefgh' */",
}


@pytest.fixture
def report(tmp_path) -> Path:
    for p in DEMO.iterdir():
        if p.name.startswith("report-nvitop"):
            (shutil.copytree if p.is_dir() else shutil.copy)(p, tmp_path / p.name)
    return tmp_path / "report-nvitop.md"


def check(path: Path) -> tuple[int, list[str]]:
    r = CliRunner().invoke(cli, ["report", "--check", "--json", str(path)], catch_exceptions=False)
    (doc,) = json.loads(r.stdout)["reports"]
    return r.exit_code, doc["problems"]


def _append(path: Path, line: str) -> int:
    """Append ``line``; the line number it is at."""
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + line + "\n")
    return text.count("\n") + 1


def test_the_sample_is_clean(report):
    assert check(report) == (0, [])


def test_a_secret_in_each_attachment_is_named_by_file_and_line(report):
    files = report.parent / "report-nvitop.files"
    where = {name: _append(files / name, line) for name, line in PLANTED.items()}
    code, problems = check(report)
    assert code == 3
    for name, n in where.items():
        assert any(p.startswith(f"report-nvitop.files/{name}:{n}: a secret (") for p in problems), (name, problems)
    # AND the finding does not repeat the secret it found
    assert not any(AWS_SECRET in p or "DbPassw0rd37" in p for p in problems)


@pytest.mark.parametrize(("sequence", "named"), [
    ("\x1b]8;;https://evil.example/\x07see the logs\x1b]8;;\x07", "OSC 8 hyperlink"),
    ("innocent\x1b[2K\rrm -rf /", "erase-line"),
    ("file \u202egnp.exe", "bidirectional control (U+202E"),
    ("a C1 control \x9b31m", "raw control character (U+009B)"),
], ids=["osc8", "erase-line", "bidi", "c1"])
def test_a_raw_control_character_in_an_attachment_is_named(report, sequence, named):
    n = _append(report.parent / "report-nvitop.files" / "reproducer-output.txt", sequence)
    code, problems = check(report)
    assert code == 3 and any(p.startswith(f"report-nvitop.files/reproducer-output.txt:{n}: ") and named in p
                             for p in problems), problems


def test_a_secret_in_the_body_and_a_claim_edited_both_fire(report):
    # GIVEN a report whose body gains a token in a fenced block and a sentence report -o never wrote
    text = report.read_text()
    text = text.replace("### Operating system and version",
                        "The driver is not at fault here.\n\n### Operating system and version", 1)
    report.write_text(text)
    n = _append(report, "```\nexport GH_PAT=ghp_CheckBodyToken37abcdefghijklmnopqrstu\n```") + 1
    code, problems = check(report)
    # THEN both passes fire: the secret named by file and line, the sentence as a claim without evidence
    assert code == 3
    assert f"report-nvitop.md:{n}: a secret (access tokens)" in problems, problems
    assert any("claim without evidence" in p and "not at fault" in p for p in problems), problems


def test_an_attachment_outside_the_report_directory_is_not_read(report, tmp_path):
    # GIVEN a front matter that lists a file outside the report's directory, holding a secret
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("password=OutsideSecret37\n")
    try:
        text = report.read_text().replace('attachments:\n', f'attachments:\n  - "../{outside.name}"\n', 1)
        report.write_text(text)
        _code, problems = check(report)
        # THEN it is not read (resolved inside the report's directory): no finding names it
        assert not any(outside.name in p and "secret" in p for p in problems), problems
    finally:
        outside.unlink()
