"""The ``forensics`` command line: the group, its one error handler, and ``main``.

The commands live one per module in :mod:`forensics.commands` and are imported only
when named (``forensics analyze ...`` loads the analyze command and what it uses; ``--help``
loads the command modules but none of the work behind them).  Each command checks its
arguments, calls one library function and renders the result.  A
:class:`~forensics.errors.ForensicsError` becomes one line on stderr (plus its fix) and its
exit code; no traceback reaches the user.  With :mod:`forensics.commands`, the only code that
prints, prompts or exits.
"""
from __future__ import annotations

import importlib
import os
import sys

import click

from . import __version__
from .errors import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_INTERRUPTED, ForensicsError

__all__ = ["main", "cli", "COMMANDS"]

#: Every command: its name, and the ``module:attribute`` under forensics.commands defining it.
COMMANDS: dict[str, str] = {
    "agent": "agent:agent",
    "analyze": "analyze:analyze",
    "canary": "canary:canary",
    "capture": "capture:capture",
    "core-handler": "core_handler:core_handler",
    "demo": "demo:demo",
    "fleet": "fleet:fleet",
    "guard": "guard:guard",
    "report": "report:report",
    "reproduce": "reproduce:reproduce",
    "verify-imports": "verify_imports:verify_imports",
}


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
        except ForensicsError as e:
            from .output import escape_text

            # one line each, whatever the message quotes (a path, a name from a core or an image)
            click.echo(escape_text(f"forensics: error: {e}"), err=True)
            if e.help_text:
                click.echo(escape_text(f"forensics: hint: {e.help_text}"), err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("forensics: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # the reader went away (`forensics ... | head`): stop quietly, as a pipe tool should
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(EXIT_BROKEN_PIPE)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # the last line of defence: no traceback for users
            if os.environ.get("FORENSICS_DEBUG"):
                raise
            from .output import escape_text

            click.echo(escape_text(f"forensics: internal error: {type(e).__name__}: {e} "
                                      "(set FORENSICS_DEBUG=1 for details)"), err=True)
            ctx.exit(EXIT_ERROR)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="forensics")
def cli() -> None:
    """Crash forensics for native-heap failures in Python processes."""


def main() -> None:
    """The ``forensics`` console script."""
    cli(prog_name="forensics")


if __name__ == "__main__":
    main()
