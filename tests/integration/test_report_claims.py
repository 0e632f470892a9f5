"""``report --check FILE`` checks the conclusion's claims of a written report against the evidence ``report -o``
recorded beside it (``FILE``'s stem + ``.claims.json``: each claim with the evidence items it rests on), issue #26
item 2.  The evidence is the committed demo's (the real nvitop-exporter killed by the simulated driver)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK

DEMO = Path(__file__).resolve().parents[2] / "reports" / "demo"
ADDED = "The GPU firmware is at fault as well."


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def written(template: str, tmp_path: Path) -> Path:
    (bundle,) = (DEMO / "capture").iterdir()
    out = tmp_path / f"report-{template}.md"
    r = run("report", "--template", template, "-o", out, DEMO / "analysis.json", bundle, DEMO / "verify-imports.json",
            DEMO / "reproduce.json")
    assert r.exit_code == EXIT_OK, r.stderr
    return out


@pytest.mark.parametrize("template", ["nvml", "nvitop", "binding", "runbook"])
def test_a_claim_added_by_hand_fails_check_naming_it(template, tmp_path):
    # GIVEN a report written with -o: its claims record lies beside it, each claim with its evidence items
    out = written(template, tmp_path)
    record = json.loads(out.with_name(f"report-{template}.claims.json").read_text())
    assert record["incident"] == "driver-fault" and record["claims"]
    assert all(cl["evidence"] and all(i["fact"] for i in cl["evidence"]) for cl in record["claims"])
    # an intact report passes
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_OK, r.stdout
    # WHEN a sentence is added by hand to the conclusion (every line that states it)
    text = out.read_text()
    first = record["claims"][0]["written"]
    assert first in text
    out.write_text(text.replace(first, f"{first} {ADDED}"))
    # THEN --check fails, one line naming the sentence, for each line that holds it
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS, r.stdout
    lines = [x.strip() for x in r.stdout.splitlines()[1:]]
    assert lines and all(x == f"claim without evidence: {ADDED!r} (not in the claims record)" for x in lines), lines
    assert len(lines) == text.count(first)


@pytest.mark.parametrize("template", ["nvml", "nvitop", "binding", "runbook"])
def test_a_sentence_added_outside_the_conclusion_fails_check_naming_it(template, tmp_path):
    """--check compared only the lines that hold the conclusion: a sentence added anywhere else passed."""
    # GIVEN a report written with -o, its task boxes ticked by hand (what the form asks of whoever files it)
    out = written(template, tmp_path)
    text = out.read_text().replace("- [ ] ", "- [x] ")
    out.write_text(text)
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_OK, r.stdout
    # WHEN a sentence is added by hand to a line far from the conclusion, and another as a paragraph of its own
    lines = text.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("#") and not line.startswith("#!"))
    lines.insert(last + 1, f"\n{ADDED}\n")
    before = next(i for i in range(last - 1, 0, -1) if lines[i].strip() and lines[i][0].isalpha())
    lines[before] += " The fix is already in the next driver."
    out.write_text("\n".join(lines))
    # THEN --check fails, one line naming each sentence
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS, r.stdout
    assert sorted(x.strip() for x in r.stdout.splitlines()[1:]) == sorted(
        f"claim without evidence: {s!r} (not in the report as report -o wrote it)"
        for s in (ADDED, "The fix is already in the next driver.")), r.stdout


def test_a_claim_whose_recorded_evidence_is_gone_fails_check(tmp_path):
    out = written("nvml", tmp_path)
    sidecar = out.with_name("report-nvml.claims.json")
    record = json.loads(sidecar.read_text())
    record["claims"][0]["evidence"] = []
    sidecar.write_text(json.dumps(record))
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS
    assert f"  claim without evidence: {record['claims'][0]['text'][:120]!r}" in r.stdout.splitlines()


def test_a_report_without_its_claims_record_or_its_conclusion_fails_check(tmp_path):
    out = written("runbook", tmp_path)
    sidecar = out.with_name("report-runbook.claims.json")
    record = json.loads(sidecar.read_text())
    # the conclusion rewritten by hand: none of the recorded claims is left
    text = out.read_text()
    for cl in record["claims"]:
        text = text.replace(cl["written"], "Someone says the driver is fine.")
    out.write_text(text)
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS
    assert "  the conclusion is not in the report as written: none of its recorded claims is there" in \
        r.stdout.splitlines()
    sidecar.unlink()
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS
    assert r.stdout.splitlines()[1:] == ["  no claims record report-runbook.claims.json beside it (report -o writes "
                                         "one): its claims cannot be checked"]


@pytest.mark.parametrize("change", [
    {"frame": 5, "sentences": {"a": 1}},  # a number where a list belongs, an object where a list of strings does
    {"claims": ["a claim", 7, {"text": ["x"], "evidence": [{"fact": ""}]}]},
    {"claims": {"text": "x"}},
])
def test_a_claims_record_of_the_wrong_shape_is_problems_not_a_traceback(tmp_path, change):
    # GIVEN a written report whose claims record is changed into values of the wrong type
    out = written("nvml", tmp_path)
    sidecar = out.with_name("report-nvml.claims.json")
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), **change}))
    # WHEN it is checked
    r = run("report", "--check", out)
    # THEN the check says what is wrong, one line each, exit 3, and nothing raises
    assert r.exit_code == EXIT_FINDINGS, r.output
    assert "Traceback" not in r.output and r.stdout.splitlines()[1:], r.output
    said = r.stdout
    if "frame" in change:
        assert "the claims record lists no sentences" in said
    elif isinstance(change["claims"], list):
        assert "  claim without evidence: ''" in said.splitlines() and "  claim without evidence: \"['x']\"" in said
    else:
        assert "the claims record is not one report -o wrote (no claims list)" in said


@pytest.mark.parametrize("line, said", [
    ("attachments: 5", "the front matter's attachments is an int, not a list of file names"),
    ("attachments: {a: 1}", "the front matter's attachments is a dict, not a list of file names"),
    ("title: [1, 2]", "the front matter's title is a list, not a string"),
])
def test_a_front_matter_of_the_wrong_shape_is_a_problem_not_a_traceback(tmp_path, line, said):
    # GIVEN a written report whose front matter gets a value of the wrong type (its last key, which YAML keeps)
    out = written("runbook", tmp_path)
    head, sep, body = out.read_text().partition("\n---\n")
    out.write_text(head + "\n" + line + sep + body)
    # WHEN it is checked
    r = run("report", "--check", out)
    # THEN that is one problem line, exit 3, and nothing raises
    assert r.exit_code == EXIT_FINDINGS, r.output
    assert f"  {said}" in r.stdout.splitlines(), r.output


@pytest.mark.parametrize("template", ["nvml", "nvitop", "binding", "runbook"])
def test_a_title_edited_by_hand_fails_check(template, tmp_path):
    # GIVEN a report written with -o, clean under --check
    out = written(template, tmp_path)
    assert run("report", "--check", out).exit_code == EXIT_OK
    # WHEN its front matter's title is changed by hand (what an outside reader did: 5 of 5 sentence edits were
    # caught, the title's was not)
    text = out.read_text()
    head, sep, body = text.partition("\n---\n")
    title = next(line for line in head.splitlines() if line.startswith("title: "))
    out.write_text(head.replace(title, 'title: "a driver crash observed"') + sep + body)
    # THEN --check fails, naming the title
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS, r.stdout
    assert r.stdout.splitlines()[1:] == ["  the front matter's title is not what report -o wrote: "
                                         "'a driver crash observed'"], r.stdout


@pytest.mark.parametrize("template, edit", [
    ("nvml", ("   # crashed (SIGABRT)", "   # ran clean")),  # a reproducer's outcome comment in Steps to reproduce
    ("nvitop", ("   # crashed (SIGABRT)", "   # ran clean")),
    ("nvitop", ("device.nvlink_throughput()  # nvmlDeviceGetFieldValues", "device.nvlink_throughput()  # nothing")),
    ("nvml", ("malloc_printerr", "nvmlDeviceGetFieldValues")),  # a stack line: the frame that aborted
])
def test_a_fenced_line_edited_by_hand_fails_check(template, edit, tmp_path):
    # GIVEN a report written with -o, clean under --check
    out = written(template, tmp_path)
    assert run("report", "--check", out).exit_code == EXIT_OK
    # WHEN a line inside a fenced block is changed by hand (the first line of the body that holds the text)
    head, sep, body = out.read_text().partition("\n---\n")
    lines = body.split("\n")
    old, new = edit
    i = next(i for i, line in enumerate(lines) if old in line)
    lines[i] = lines[i].replace(old, new)
    out.write_text(head + sep + "\n".join(lines))
    changed = lines[i].strip()
    # THEN --check fails, naming the line
    r = run("report", "--check", out)
    assert r.exit_code == EXIT_FINDINGS, r.stdout
    assert r.stdout.splitlines()[1:] == [
        f"  claim without evidence: {changed!r} (a fenced line report -o did not write)"], r.stdout


def test_a_title_edit_and_a_secret_in_an_attachment_both_fire(tmp_path):
    # GIVEN a written report whose title is edited by hand and one of whose attachments gets a planted token
    out = written("nvml", tmp_path)
    head, sep, body = out.read_text().partition("\n---\n")
    title = next(line for line in head.splitlines() if line.startswith("title: "))
    out.write_text(head.replace(title, 'title: "a driver crash observed"') + sep + body)
    stacks = out.with_name("report-nvml.files") / "crash-stacks.txt"
    stacks.write_text(stacks.read_text() + "token ghp_" + "Q" * 36 + "\n")
    # WHEN it is checked
    r = run("report", "--check", out)
    # THEN the claims pass names the title and the secrets' pass (#37's) the attachment's line: neither hides the other
    assert r.exit_code == EXIT_FINDINGS, r.stdout
    problems = [x.strip() for x in r.stdout.splitlines()[1:]]
    assert "the front matter's title is not what report -o wrote: 'a driver crash observed'" in problems, problems
    n = len(stacks.read_text().splitlines())
    assert any(p.startswith(f"report-nvml.files/crash-stacks.txt:{n}: a secret") for p in problems), problems
