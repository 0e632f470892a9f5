"""forensics demo: the incident end to end on a simulated 8-GPU node."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK
from ..options import FrontDoor, json_option
from . import echo, emit, emit_json

__all__ = ["demo"]


@click.command("demo", cls=FrontDoor,
               common=("out", "fault_after", "no_reproduce", "as_json"))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory (empty or absent); default: a new one under ./forensics-demo.")
@click.option("--work", type=click.Path(file_okay=False), default=None, help="Scratch directory (default: OUT/work).")
@click.option("--fault-after", type=int, default=120, show_default=True,
              help="NVLink queries before the heap corruption.")
@click.option("--no-reproduce", is_flag=True, help="Skip running the minimal reproducers.")
@json_option
def demo(out, work, fault_after, no_reproduce, as_json):
    """The incident end to end: real nvitop-exporter on a simulated 8-GPU node crashes; forensics takes it apart.

    \b
    Exit codes: 0 the crash was caught and analysed; 1 error; 3 the crash was caught but
    the NVLink query is not on the crashing Python stack.
    """
    from ..demo import run_demo
    from ..output import json_document

    result = run_demo(out=out, work=work, fault_after=fault_after, reproduce=not no_reproduce,
                      log=(lambda s: echo(s, err=True)) if as_json else echo)
    if as_json:
        emit_json(json_document("demo", {"demo": result}), None, False)
    else:
        emit(["", "Wrote:"] + [f"  {what:<34} {path}" for what, path in result.files.items()], None, False)
    sys.exit(EXIT_OK if result.ok else EXIT_FINDINGS)
