"""The ``forensics`` command line: the group, its one error handler, and ``main``.

The commands live one per module in :mod:`forensics.commands` and are imported only
when named (``forensics analyze ...`` loads the analyze command and what it uses; ``--help``
loads the command modules but none of the work behind them).  Each command checks its
arguments, calls one library function and renders the result.  A
:class:`~forensics.errors.ForensicsError` becomes one line on stderr (plus its fix) and its
exit code; no traceback reaches the user.  With :mod:`forensics.commands`, the only code that
prints, prompts or exits.

click itself is imported when the group is built (:data:`cli`, on first use), not by
importing this module: ``forensics analyze`` with arguments that click would accept as they
are (:func:`forensics.commands.analyze_run.parse_argv`) runs without it -- click and what it
imports were a third of the start-up of every analysis.  Anything else (help, a usage
error, an option written another way) goes to click, which says what it always said.
"""
from __future__ import annotations

import importlib
import os
import sys

from . import __version__
from .errors import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, ForensicsError, Terminated

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every command)
if TYPE_CHECKING:
    import click

    cli: click.Group

__all__ = ["main", "cli", "COMMANDS", "failure_exit_code"]

#: Every command: its name, and the ``module:attribute`` under forensics.commands defining it.
COMMANDS: dict[str, str] = {
    "agent": "agent:agent",
    "analyze": "analyze:analyze",
    "canary": "canary:canary",
    "capture": "capture:capture",
    "core-handler": "core_handler:core_handler",
    "debug": "debug:debug",
    "demo": "demo:demo",
    "fleet": "fleet:fleet",
    "guard": "guard:guard",
    "report": "report:report",
    "reproduce": "reproduce:reproduce",
    "upload": "upload:upload",
    "verify-imports": "verify_imports:verify_imports",
}

#: the variable click's shell completion is asked through (``_{PROG}_COMPLETE``): click's business
_COMPLETE_VAR = "_FORENSICS_COMPLETE"


def failure_exit_code(e: BaseException) -> int | None:
    """What the group does with an error a command raised: the message said on stderr (one line, escaped)
    and the exit code; None for an error it lets through (it is not one of ours to say)."""
    from .commands import echo

    if isinstance(e, ForensicsError):
        # one line each, whatever the message quotes (a path, a name from a core or an image)
        echo(f"forensics: error: {e}", err=True)
        if e.help_text:
            echo(f"forensics: hint: {e.help_text}", err=True)
        return e.exit_code
    if isinstance(e, KeyboardInterrupt):
        echo("forensics: interrupted", err=True)
        return EXIT_INTERRUPTED
    if isinstance(e, Terminated):
        echo("forensics: terminated (SIGTERM)", err=True)
        return EXIT_TERMINATED
    if isinstance(e, BrokenPipeError):
        # the reader went away (`forensics ... | head`): stop quietly, as a pipe tool should
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    if isinstance(e, Exception):  # the last line of defence: no traceback for users
        if os.environ.get("FORENSICS_DEBUG"):
            return None
        from .redact import Redactor  # whatever it quotes (an SDK's message, a URL) may hold a secret

        echo(f"forensics: internal error: {type(e).__name__}: {Redactor().text(str(e))} (set FORENSICS_DEBUG=1 for "
             "details)", err=True)
        return EXIT_ERROR
    return None


def _build_cli() -> click.Group:
    import click

    class _Group(click.Group):
        """Loads a command's module when the command is named; turns ForensicsError (and
        unexpected errors) into one line and an exit code."""

        def list_commands(self, ctx: click.Context) -> list[str]:
            return sorted(set(COMMANDS) | set(self.commands))

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            if cmd_name not in self.commands and cmd_name in COMMANDS:
                module, _, attr = COMMANDS[cmd_name].partition(":")
                command = getattr(importlib.import_module(f"{__package__}.commands.{module}"), attr)
                self.add_command(command, cmd_name)
            return self.commands.get(cmd_name)

        def invoke(self, ctx: click.Context):
            try:
                return super().invoke(ctx)
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise
            except (Exception, KeyboardInterrupt, Terminated) as e:
                code = failure_exit_code(e)
                if code is None:
                    raise
                ctx.exit(code)

    @click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="forensics")
    def cli() -> None:
        """Crash forensics for native-heap failures in Python processes."""

    return cli


_CLI: list[click.Group] = []


def __getattr__(name: str) -> click.Group:
    """:data:`cli`, the click group, built (and click imported) on first use."""
    if name != "cli":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _CLI:
        _CLI.append(_build_cli())
    return _CLI[0]


def _signals():
    """signal's C half: ``signal.py`` imports enum, a start-up cost of every command."""
    import _signal  # type: ignore[import-not-found]

    return _signal


def _raise_on_sigterm(signum, frame) -> None:
    _signals().signal(_signals().SIGTERM, _signals().SIG_IGN)  # one is enough: a second must not cut clean-up short
    raise Terminated()


def main() -> None:
    """The ``forensics`` console script.  SIGTERM becomes :class:`~forensics.errors.Terminated` (its
    default would end the process where it stands, its children and temporary files left behind); an
    interrupted or terminated command kills what it started before it exits (130, 143)."""
    _signals().signal(_signals().SIGTERM, _raise_on_sigterm)
    try:
        _main()
    except SystemExit as e:
        if e.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            from .subproc import kill_children

            kill_children()
        raise


def _main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["analyze"] and _COMPLETE_VAR not in os.environ:
        from .commands.analyze_run import parse_argv, run

        params = parse_argv(args[1:])
        if params is not None:  # what click would accept, read as click reads it: run as the group would
            try:
                run(**params)
            except (Exception, KeyboardInterrupt, Terminated) as e:
                code = failure_exit_code(e)
                if code is None:
                    raise
                sys.exit(code)
            sys.exit(0)
    __getattr__("cli")(prog_name="forensics")


if __name__ == "__main__":
    main()
