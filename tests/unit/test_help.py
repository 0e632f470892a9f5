"""Every command's front door (#41 item 3): its default --help shows the first paragraph of its help and the
options a newcomer needs (each command declares them; analyze's are rows of its table marked ``common``) and fits
one screen; --help-all shows every parameter; no help names an option its command does not have."""
from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.commands.analyze_run import OPTIONS
from forensics.options import HELP_LINES, FrontDoor

#: the kernel runs core-handler with its own arguments: every word is the handler's (no --help to show)
NOT_FOR_PEOPLE = {("core-handler",)}
#: options of other tools a help names, as they are spelled there
FOREIGN = {"--set": "helm's (agent chart)", "--body-file": "gh's (report)", "--title": "gh's (report)"}


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        if cmd is None or cmd.hidden:
            continue
        if isinstance(cmd, click.Group):
            out += commands(cmd, path + (name,))
        elif path + (name,) not in NOT_FOR_PEOPLE:
            out.append((path + (name,), cmd))
    return out


COMMANDS = commands()


def helps(path: tuple[str, ...], *flag: str, width: int = 80) -> str:
    r = CliRunner().invoke(cli, [*path, *flag], terminal_width=width)
    assert r.exit_code == 0, r.output
    return r.output


def test_every_command_has_a_front_door():
    assert len(COMMANDS) >= 14
    assert [" ".join(p) for p, c in COMMANDS if not isinstance(c, FrontDoor)] == []


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_the_default_help_fits_a_screen_and_names_every_option(path, cmd):
    # GIVEN the command's default --help, on an 80-column terminal
    text = helps(path, "--help")
    lines = text.splitlines()
    # THEN it fits one screen, shows its common options with their help first ...
    assert len(lines) <= HELP_LINES, text
    assert isinstance(cmd, FrontDoor), path
    options = text.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    for param in cmd.params:
        if param.name in cmd.common:
            assert param.opts[-1] in options, (param.name, text)
    # ... and names every other one, for --help-all (a common name that is no parameter is a typo)
    assert set(cmd.common) <= {p.name for p in cmd.params}, cmd.common
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[0] in text, (param.name, text)


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_all_lists_every_parameter_and_only_real_options(path, cmd):
    # GIVEN the command's whole help, wide enough that no option's name is cut by a line break
    text = helps(path, "--help-all", width=1000)
    # THEN every parameter is there with its help (an argument in the usage line)
    for param in cmd.params:
        if isinstance(param, click.Argument):
            assert param.make_metavar(click.Context(cmd)) in text.splitlines()[0], (param.name, text)
        elif not param.hidden:
            record = param.get_help_record(click.Context(cmd))
            assert record is not None and record[0] in text, (param.name, text)
    # and every option it names is one of the command's (guard --help named an --output guard does not have)
    own = {o for p in cmd.params for o in p.opts + p.secondary_opts} | {"--help", "--help-all"}
    named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*\w)", text))
    assert sorted(named - own - set(FOREIGN)) == [], text


def test_analyzes_common_options_are_the_rows_its_table_marks():
    text = helps(("analyze",), "--help")
    shown = text.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
    marked = [spec for spec in OPTIONS if spec.common]
    assert {s.dest for s in marked} == {"sysroot", "exe", "merged", "as_json", "output"}
    for spec in OPTIONS:
        assert (spec.names[-1] in shown) == spec.common, (spec.names, shown)
    # the first paragraph of its help, not all of it (the exit codes are --help-all's)
    assert "Exit codes" not in text and "Exit codes" in helps(("analyze",), "--help-all")
