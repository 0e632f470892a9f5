"""`forensics report` on a capture bundle whose MANIFEST.json names what is no file, or one file many times
(#33: other readers).

The report hashes every manifest item to state only hashes it verified.  An item that is a directory was an
"internal error" (IsADirectoryError from the read); 20,000 items naming one file hashed it 20,000 times, and
those bytes counted against no bound (the inputs' budget, FORENSICS_MAX_REPORT_BYTES, counted only what was
parsed).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK

from .test_report_inputs import demo_bundle


def _with_items(bundle: Path, items: list[dict]) -> None:
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    manifest["items"] += items
    (bundle / "MANIFEST.json").write_text(json.dumps(manifest))


def _item(rel: str, data: bytes) -> dict:
    return {"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "what": "test"}


def test_items_that_are_no_regular_file_are_one_clear_line_each(tmp_path):
    # GIVEN the demo's bundle whose manifest names a directory of it, and a FIFO in it
    bundle = demo_bundle(tmp_path)
    os.mkfifo(bundle / "40-process" / "fifo")
    _with_items(bundle, [_item("40-process", b""), _item("40-process/fifo", b"")])
    # WHEN the runbook is made and checked
    r = CliRunner().invoke(cli, ["report", "--template", "runbook", "--check", str(bundle)])
    # THEN each is a manifest problem named in one line, not an internal error, and --check exits 3
    assert r.exit_code == EXIT_FINDINGS, r.output
    assert "internal error" not in r.output and "Traceback" not in r.output
    assert ("2 file(s) do not match its MANIFEST.json: 40-process: not a regular file; "
            "40-process/fifo: not a regular file") in r.stderr


def _report_reads(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, str, int]:
    """``forensics report ARGS`` as a process: (exit status, stderr, bytes it read: /proc/self/io's rchar at exit)."""
    io = tmp_path / "io"
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: open({str(io)!r}, 'w').write(open('/proc/self/io').read()))\n"
            "sys.argv = ['forensics', *sys.argv[1:]]\n"
            "from forensics.cli import main\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code, "report", *args, "-o", str(tmp_path / "r.md")],
                       capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    rchar = next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("rchar:"))
    return p.returncode, p.stderr, rchar


def test_twenty_thousand_items_naming_one_file_hash_it_once(tmp_path):
    # GIVEN the demo's bundle with a 1 MiB file under 20,000 names (hard links), each a manifest item
    bundle = demo_bundle(tmp_path)
    data = os.urandom(1 << 20)
    (bundle / "50-core").mkdir()
    (bundle / "50-core" / "core").write_bytes(data)
    names = ["50-core/core"]
    for i in range(1, 20_000):
        os.link(bundle / "50-core" / "core", bundle / "50-core" / f"core.{i}")
        names.append(f"50-core/core.{i}")
    _with_items(bundle, [_item(rel, data) for rel in names])
    # WHEN the report is made from it
    rc, stderr, rchar = _report_reads(tmp_path, "--template", "runbook", str(bundle))
    # THEN the file was read once, not 20,000 times (20 GiB), and every name of it is verified
    assert rc == EXIT_OK, stderr
    assert rchar < 200 << 20, f"{rchar:,} bytes read"
    full = (tmp_path / "r.files" / "full-report.md").read_text()
    assert full.count(hashlib.sha256(data).hexdigest()) >= 20_000


def test_the_hashed_files_count_against_the_inputs_budget(tmp_path):
    # GIVEN the demo's bundle with a 32 MiB file in its manifest, and a budget of 16 MiB for the report's inputs
    bundle = demo_bundle(tmp_path)
    data = b"\0" * (32 << 20)
    (bundle / "50-core").mkdir()
    (bundle / "50-core" / "core").write_bytes(data)
    _with_items(bundle, [_item("50-core/core", data)])
    # WHEN the report is made from it
    r = CliRunner().invoke(cli, ["report", str(bundle)], env={"FORENSICS_MAX_REPORT_BYTES": str(16 << 20)})
    # THEN the budget stops it before the file is hashed: one line, exit 1
    assert r.exit_code == EXIT_ERROR, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("forensics: error:")]
    assert len(errors) == 1 and "50-core/core" in errors[0] and "more than 16777216 bytes" in errors[0], r.stderr
