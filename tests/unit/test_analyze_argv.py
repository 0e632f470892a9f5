"""`forensics analyze` without click: the arguments the console script reads itself are read as click reads
them (click's own parser is the oracle), everything else is left to click, and the process that runs
that way prints, exits and fails as the click command does -- without importing click."""
from __future__ import annotations

import inspect
import itertools
import os
import subprocess
import sys

import click
import pytest

from forensics.argspec import INPUT, Kind, OptionSpec
from forensics.commands.analyze import analyze
from forensics.commands.analyze_run import OPTIONS, parse_argv, run
from forensics.errors import ForensicsError
from forensics.modes import values


def click_params(args: list[str]) -> dict | None:
    """What click passes to the command for ``analyze ARGS``; None when click refuses them (a usage error, or an
    option's check: ``-o`` in a missing directory) or prints help."""
    try:
        with analyze.make_context("analyze", list(args)) as ctx:
            return dict(ctx.params)
    except (click.exceptions.Exit, click.ClickException, ForensicsError):
        return None


def test_every_parameter_of_the_click_command_is_a_row_of_the_table():
    # GIVEN the click command's parameters; THEN they are the table's rows, in its order, under its names (an
    # option added to the command beside the table, or a row click is not given, is a difference here)
    params = [(p.name, tuple(p.opts)) for p in analyze.params if p.name not in ("help", "help_all")]
    assert params == [(INPUT.dest, (INPUT.dest,))] + [(spec.dest, spec.names) for spec in OPTIONS]
    # and run() takes exactly those parameters
    assert set(inspect.signature(run).parameters) == {INPUT.dest} | {spec.dest for spec in OPTIONS}
    # and each row's value when not given is click's
    assert click_params(["core"]) == {"inputs": ("core",), **{spec.dest: spec.initial for spec in OPTIONS}}


def _samples(spec: OptionSpec, paths: dict[str, str]) -> list[str | None]:
    """Values a row takes (None: a flag's)."""
    if spec.kind in (Kind.FLAG, Kind.COUNT):
        return [None]
    if spec.kind is Kind.CHOICE:
        assert spec.choices is not None
        return list(values(spec.choices))
    if spec.kind is Kind.PATH:
        return [paths["file"] if spec.file_okay else paths["dir"]]
    return {Kind.TEXT: ["x"], Kind.INT: ["3"], Kind.FLOAT: ["2.5"], Kind.SECONDS: ["2.5", "1e3"]}[spec.kind]


def test_the_fast_path_reads_every_row_of_the_table_as_click_does(paths):
    # GIVEN each option of the table, under each of its names, with each kind of value it takes
    read = 0
    for spec in OPTIONS:
        for name in spec.names:
            for value in _samples(spec, paths):
                forms = [[name]] if value is None else [[name, value]] + (
                    [[f"{name}={value}"]] if name.startswith("--") else [])
                for form in forms:
                    args = form + [paths["file"]]
                    # THEN the fast path reads it, and reads it as click does
                    mine = parse_argv(args)
                    assert mine is not None, args
                    assert _same(mine, click_params(args) or {}), args
                    read += 1
    assert read > len(OPTIONS)
    # and an option that is no row is left to click
    assert parse_argv(["--no-such-option", paths["file"]]) is None


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("argv")
    (d / "file").write_bytes(b"x")
    (d / "dir").mkdir()
    return {"file": str(d / "file"), "dir": str(d / "dir"), "missing": str(d / "missing")}


def _cases(paths: dict[str, str]) -> list[list[str]]:
    f, dr, missing = paths["file"], paths["dir"], paths["missing"]
    options = [
        [], ["--method", "direct"], ["--method=gdb"], ["--method", "fast"], ["--method"], ["--method", "-v"],
        ["--native-method", "none"], ["--native-method=libdw"], ["--sysroot", dr], [f"--sysroot={dr}"],
        ["--sysroot", f], ["--sysroot", missing], ["--sysroot="], ["--exe", f], ["--exe", dr], ["--exe", missing],
        ["--gdb", "/usr/bin/gdb"], ["--debuginfod", "http://127.0.0.1:1"], ["--timeout", "2.5"],
        ["--timeout", "1e3"], ["--timeout", " 7 "], ["--timeout", "x"], ["--timeout=nan"], ["--timeout", "0"],
        ["--timeout=-1"], ["--timeout", "inf"], ["-j", "2"],
        ["-j2"], ["-j=2"], ["--jobs", "3"], ["--jobs", "two"], ["--jobs=1_0"], ["--heap"], ["--heap=1"],
        ["--native"], ["--json"], ["--force"], ["-o", missing], ["-o", dr], ["--output", f], ["-o"],
        ["-o", os.path.join(missing, "out")],
        ["-v"], ["-v", "--verbose"], ["-vv"], ["--verb"], ["-h"], ["--help"], ["--"], ["-"], ["--unknown"],
        ["--method", "direct", "--method", "gdb"], ["--heap", "--heap"],
    ]
    inputs = [[], [missing], [f], [dr], [f, missing], ["--", f]]
    cases = []
    for opt, inp in itertools.product(options, inputs):
        cases.append(opt + inp)
        if inp:
            cases.append(inp + opt)  # options after the inputs: click reads them there too
    for a, b in itertools.combinations(options[:30], 2):
        cases.append(a + [f] + b)
    return cases


def test_parse_argv_is_clicks_parse_or_none(paths):
    accepted = 0
    for args in _cases(paths):
        mine = parse_argv(args)
        if mine is None:
            continue  # click reads these itself
        accepted += 1
        theirs = click_params(args)
        assert theirs is not None and _same(mine, theirs), args
    # it does read the ordinary forms itself (not only None)
    assert accepted > 300
    assert parse_argv(["--method", "direct", "--sysroot", paths["dir"], paths["file"]]) is not None


def _same(a: dict, b: dict) -> bool:
    """Equal dicts, a NaN equal to a NaN (``--timeout nan``)."""
    return sorted(a) == sorted(b) and all(repr(a[k]) == repr(b[k]) and type(a[k]) is type(b[k]) for k in a)


def _forensics(args: list[str], *, via_click: bool) -> subprocess.CompletedProcess:
    """``forensics ARGS`` through the console script's main (its fast path), or through the click group."""
    code = ("import sys\nfrom forensics.cli import cli\ncli(sys.argv[1:], prog_name='forensics')" if via_click else
            "import sys\nsys.argv[0] = 'forensics'\nfrom forensics.cli import main\n"
            "try:\n    main()\nfinally:\n    print('click imported' if 'click' in sys.modules else 'no click',"
            " file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FORENSICS_DEBUG": ""})


@pytest.mark.parametrize("case", ["not-a-core", "missing", "directory-of-nothing", "json-not-a-core"])
def test_the_fast_path_fails_as_the_click_command_does(paths, case):
    # GIVEN inputs analyze refuses with a ForensicsError: a file that is no core, a missing path, an empty directory
    args = {"not-a-core": [paths["file"]], "missing": [paths["missing"]], "directory-of-nothing": [paths["dir"]],
            "json-not-a-core": ["--json", "--method", "direct", paths["file"]]}[case]
    fast, slow = _forensics(["analyze", *args], via_click=False), _forensics(["analyze", *args], via_click=True)
    # THEN the same one-line error and exit code come out, and click was never imported on the fast path
    assert fast.stderr.splitlines()[-1] == "no click"
    assert (fast.returncode, fast.stdout, fast.stderr.splitlines()[:-1]) == \
        (slow.returncode, slow.stdout, slow.stderr.splitlines())
    assert fast.returncode == 1 and fast.stderr.startswith("forensics: error: ")


def test_what_the_fast_path_does_not_read_goes_to_click(paths):
    for args in (["analyze", "--help"], ["analyze"], ["analyze", "--method", "fast", paths["file"]],
                 ["analyze", "-j=2", paths["file"]]):
        fast, slow = _forensics(args, via_click=False), _forensics(args, via_click=True)
        assert fast.stderr.splitlines()[-1] == "click imported", args
        assert (fast.returncode, fast.stdout, fast.stderr.splitlines()[:-1]) == \
            (slow.returncode, slow.stdout, slow.stderr.splitlines()), args
