"""Hints that point the right way (issue #20 item 8): each failure's one-line error and its hint are
about the input that failed, run as a user would run the command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def error_and_hint(result) -> tuple[str, str]:
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("forensics: error:")]
    hints = [ln for ln in result.stderr.splitlines() if ln.startswith("forensics: hint:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0], (hints[0] if hints else "")


def test_report_of_a_missing_file_is_no_core_pattern_matter(tmp_path):
    r = run("report", str(tmp_path / "nosuch.json"))
    assert r.exit_code == EXIT_ERROR
    error, hint = error_and_hint(r)
    assert "nosuch.json: no such file or directory" in error
    # and its hint is what report reads (the --json of analyze and the other commands, capture bundles; exactly
    # which, test_report_inputs' test_the_hint_names_exactly_what_report_reads), not where the kernel writes cores
    assert "core_pattern" not in hint
    assert "`forensics analyze|" in hint and " --json`" in hint
    assert "capture bundle" in hint


def test_reproduce_with_a_missing_nvml_names_the_option(tmp_path):
    r = run("reproduce", "--nvml", str(tmp_path / "missing"), "--workdir", str(tmp_path / "w"))
    assert r.exit_code == EXIT_ERROR
    error, hint = error_and_hint(r)
    assert "missing: no such file or directory" in error
    assert "core_pattern" not in hint and "--nvml" in hint


def test_analyze_of_a_missing_core_keeps_the_core_pattern_hint(tmp_path):
    r = run("analyze", str(tmp_path / "core"))
    assert r.exit_code == EXIT_ERROR
    _, hint = error_and_hint(r)
    assert "core_pattern" in hint


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) runs the command as another user")
def test_sysroot_denied_is_said_as_denied_not_missing(cores, newest_python, tmp_path):
    # GIVEN a sysroot this user may not enter (as /proc/1/root is without ptrace rights) and a readable core
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    shared = Path(subprocess.run(["mktemp", "-d", "/tmp/forensics-hint-XXXXXX"], capture_output=True, text=True,
                                 check=True).stdout.strip())
    try:
        os.chmod(shared, 0o755)
        core = shared / "core"
        shutil.copy(cores.get(newest_python, "segv"), core)
        os.chmod(core, 0o644)
        private = shared / "private"
        (private / "root").mkdir(parents=True)
        os.chmod(private, 0o700)
        # WHEN an unprivileged user analyzes the core with that sysroot
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "forensics", "analyze", "--sysroot", str(private / "root"), str(core)],
                           capture_output=True, text=True, timeout=120, cwd="/")
        # THEN the error says permission denied, and the hint is about rights, not core_pattern
        assert p.returncode == EXIT_ERROR, p.stderr
        assert f"forensics: error: {private / 'root'}: permission denied" in p.stderr
        assert "no such file" not in p.stderr and "core_pattern" not in p.stderr
        assert "ptrace" in p.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_guard_names_its_own_out_option(tmp_path):
    args = ["guard", "--target", "nvitop.api.device:Device.nvlink_throughput", "--returns", "[]",
            "--env", "NVITOP_GUARD", "--out", str(tmp_path)]
    assert run(*args).exit_code == 0
    r = run(*args)
    assert r.exit_code == EXIT_ERROR
    _, hint = error_and_hint(r)
    assert "Choose another --out path" in hint and "--output" not in hint


def test_gdb_failure_hint_names_no_option_demo_lacks():
    # a gdb failure inside the demo (or report) reaches the user with GdbError's hint: it used to say
    # "Re-run with -v", which demo does not take
    from forensics.errors import GdbError

    demo_help = run("demo", "--help").stdout
    assert "-v," not in demo_help and "--verbose" not in demo_help
    hint = GdbError("reading native stacks", "x").help_text
    assert "-v" not in hint and "--native-method libdw" in hint
