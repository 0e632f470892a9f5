"""Shared click options: --json, -o/--output, --force, -v."""
from __future__ import annotations

import click

__all__ = ["json_option", "output_option", "force_option", "verbose_option"]

json_option = click.option("--json", "as_json", is_flag=True, help="Write one JSON document to stdout (logs go to stderr).")
output_option = click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default=None,
    help="Write the result to FILE instead of stdout (never overwrites without --force).",
)
force_option = click.option("--force", is_flag=True, help="Allow --output to replace an existing file.")
verbose_option = click.option("-v", "--verbose", count=True, help="More detail on stderr (gdb's messages with -vv).")
