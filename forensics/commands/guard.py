"""forensics guard: a startup guard (.pth + module) that makes one callable return a fixed value."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_OK
from ..options import force_option, json_option
from . import emit, emit_json

__all__ = ["guard"]


@click.command("guard")
@click.option("--target", required=True, metavar="MODULE:ATTR",
              help="The callable to switch off, e.g. nvitop.api.device:Device.nvlink_throughput.")
@click.option("--returns", "returns", required=True, metavar="JSON",
              help="What it returns instead, as JSON, e.g. '[]'.")
@click.option("--env", "env", required=True, metavar="NAME",
              help="Environment switch: NAME=0 turns the guard off (it is on by default).")
@click.option("--removes", default=None, help="What the guard's start-up log line says is removed.")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Directory to write the guard into (site-packages, or an image layer's).")
@json_option
@force_option
def guard(target, returns, env, removes, out_dir, as_json, force):
    """Generate a startup guard (.pth + module) that makes one callable return a fixed value.

    \b
    Exit codes: 0 written; 1 error (bad target/JSON, files exist); 2 usage.
    """
    from ..guard import parse_target, write_guard
    from ..output import json_document

    spec = parse_target(target, returns, env, removes)
    written = write_guard(spec, out_dir, force=force)
    if as_json:
        emit_json(json_document("guard", {"guard": spec, "files": written}), None, False)
    else:
        emit([f"Wrote {w}" for w in written] + [f"Drop both files into site-packages; {env}=0 turns the guard off."],
             None, False)
    sys.exit(EXIT_OK)
