"""click's options made from :mod:`forensics.argspec`'s records: the shared ones (--json, -o/--output, --force,
-v, the object store's) and any command's table (analyze's); parameter types: sizes; coredump_filter."""
from __future__ import annotations

import click

from .argspec import (
    FORCE,
    JSON,
    OUTPUT,
    STORE,
    STORE_DEADLINE,
    VERBOSE,
    ArgumentSpec,
    Kind,
    OptionSpec,
    is_duration,
    parse_size,
)
from .modes import values
from .output import STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

__all__ = ["FrontDoor", "FrontDoorGroup", "common_of", "HELP_LINES", "json_option", "output_option", "force_option",
           "verbose_option", "SIZE", "SECONDS", "parse_coredump_filter", "store_options", "store_read_options",
           "click_option", "click_argument", "click_options"]


#: what a command's default --help fits in: one screen of a terminal (the rest is --help-all's)
HELP_LINES = 25


def common_of(specs: Iterable[OptionSpec]) -> tuple[str, ...]:
    """The parameters a table marks common (:attr:`~forensics.argspec.OptionSpec.common`), for :class:`FrontDoor`."""
    return tuple(spec.dest for spec in specs if spec.common)


def _help_all(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    ctx.meta["forensics.help_all"] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


_HELP_ALL_HELP = "Show every option and the exit codes, and exit."


class FrontDoor(click.Command):
    """A command whose --help is a front door: the first paragraph of its help, its common options (the few a
    newcomer needs, declared by the command: ``common=("sysroot", ...)``) and the names of the others, in one
    screen (:data:`HELP_LINES`); ``--help-all`` shows all of its help and every option."""

    def __init__(self, *args: Any, common: Iterable[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # not declared: every option is common (a command of a few options)
        self.common = tuple(common) if common is not None else tuple(p.name or "" for p in self.params)
        self.help_all_option = click.Option(["--help-all"], is_flag=True, expose_value=False, is_eager=True,
                                            callback=_help_all, help=_HELP_ALL_HELP)
        self.params.append(self.help_all_option)

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get("forensics.help_all") or not self.help:
            super().format_help_text(ctx, formatter)
            return
        import inspect  # (click's own help does the same)

        first = inspect.cleandoc(self.help).split("\n\n", 1)[0]
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(first)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get("forensics.help_all"):
            super().format_options(ctx, formatter)
            return
        shown, others = [], []
        always = (self.get_help_option(ctx), self.help_all_option)
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or isinstance(param, click.Argument):
                continue
            if param.name in self.common or param in always:
                shown.append((record[0], _first_clause(record[1])))
            else:
                others.append(param.opts[0] if param.opts else param.name or "")
        if shown:
            with formatter.section("Options"):
                formatter.write_dl(shown, col_max=_FRONT_COLUMN)
        if others:
            import textwrap  # (an option's name is never cut at its hyphens, as click's wrapping would)

            with formatter.section("More options (--help-all)"):
                width = max(formatter.width - formatter.current_indent, 40)
                for line in textwrap.wrap(", ".join(others), width, break_on_hyphens=False, break_long_words=False):
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if ctx.meta.get("forensics.help_all"):
            super().format_epilog(ctx, formatter)


_FRONT_COLUMN = 24  # an option's names wider than this put its help on the next line


def _first_clause(text: str) -> str:
    """An option's help cut to its first clause for the front door (--help-all has it whole): up to the first
    sentence's end or parenthesis, without click's ``[default: ...]``.

    >>> _first_clause("Write the result to FILE instead of stdout (never overwrites without --force).")
    'Write the result to FILE instead of stdout.'
    >>> _first_clause("Seconds gdb may take per core.  [default: 120.0]")
    'Seconds gdb may take per core.'
    """
    text = text.split("  [", 1)[0].strip()
    cut = len(text)
    for mark in (". ", " (", "; "):
        at = text.find(mark, 12)
        while mark == ". " and at > 0 and text[:at].endswith(("e.g", "i.e", "etc")):
            at = text.find(mark, at + 2)
        if at >= 12:
            cut = min(cut, at)
    short = text[:cut].rstrip(" .,;:")
    return short + "." if short else text


class FrontDoorGroup(click.Group):
    """A group of commands (``forensics agent``) whose commands are :class:`FrontDoor` ones by default."""

    command_class = FrontDoor


def click_option(spec: OptionSpec):
    """click's option for one record of a table: its names, type, default, metavar and help as the record says
    them, and a callback where it has a check (or takes ``-`` for standard output)."""
    kwargs: dict[str, Any] = {"help": spec.help}
    if spec.kind is Kind.FLAG:
        kwargs["is_flag"] = True
    elif spec.kind is Kind.COUNT:
        kwargs["count"] = True
    else:
        kwargs["type"] = _click_type(spec)
        kwargs["default"] = spec.default
    if spec.show_default:
        kwargs["show_default"] = True
    if spec.metavar is not None:
        kwargs["metavar"] = spec.metavar
    if spec.check is not None or spec.allow_dash:
        kwargs["callback"] = _checked(spec)
    return click.option(*spec.names, spec.dest, **kwargs)


def click_argument(spec: ArgumentSpec):
    """click's argument for a table's positional paths: one or more."""
    return click.argument(spec.dest, nargs=-1, required=True,
                          type=click.Path(file_okay=spec.file_okay, dir_okay=spec.dir_okay, readable=spec.readable))


def click_options(specs: Iterable[OptionSpec]):
    """A decorator giving a command a table's options, in the table's order (``--help`` lists them so)."""
    table = tuple(specs)

    def decorate(f):
        for spec in reversed(table):
            f = click_option(spec)(f)
        return f
    return decorate


def _click_type(spec: OptionSpec) -> click.ParamType | None:
    """click's type for a record's kind; None for TEXT (click's STRING, as click infers it from the default)."""
    if spec.kind is Kind.PATH:
        return click.Path(file_okay=spec.file_okay, dir_okay=spec.dir_okay, readable=spec.readable,
                          allow_dash=spec.allow_dash)
    if spec.kind is Kind.CHOICE:
        assert spec.choices is not None
        return click.Choice(values(spec.choices))
    if spec.kind is Kind.INT:
        return click.INT
    if spec.kind is Kind.SECONDS:
        return SECONDS
    return click.FLOAT if spec.kind is Kind.FLOAT else None


def _checked(spec: OptionSpec):
    """The callback of an option with a check, or whose ``-`` is standard output (given as None): run before the
    command works, as :func:`forensics.argspec.parse_args` runs it."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None or (spec.allow_dash and value == STDOUT):
            return None
        if spec.check is not None:
            spec.check(value)
        return value
    return callback


json_option = click_option(JSON)
output_option = click_option(OUTPUT)
force_option = click_option(FORCE)
verbose_option = click_option(VERBOSE)
#: --endpoint-url, --region, --profile: an S3-compatible store (:data:`forensics.argspec.STORE`)
store_options = click_options(STORE)
#: the store's options and --deadline, for the commands that read s3:// inputs (report; analyze has its table)
store_read_options = click_options((*STORE, STORE_DEADLINE))

class _Size(click.ParamType):
    """A byte count as :func:`forensics.argspec.parse_size` reads it: ``4096``, ``512M``, ``20Gi`` (all binary)."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value).strip())
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = _Size()


class _Seconds(click.ParamType):
    """A duration in seconds: a number above 0 (``-1``, ``0``, ``nan`` and ``inf`` are refused, a usage error)."""

    name = "SECONDS"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not is_duration(seconds):
            self.fail(f"{value!r}: a duration is a number of seconds above 0", param, ctx)
        return seconds


SECONDS = _Seconds()


def parse_coredump_filter(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """click callback: ``/proc/PID/coredump_filter`` given in hexadecimal (9 bits)."""
    if value is None:
        return None
    try:
        v = int(value, 16)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not hexadecimal (e.g. 0x33)") from None
    if not 0 <= v <= 0x1FF:
        raise click.BadParameter("coredump_filter has 9 bits (0x0-0x1ff)")
    return v
