"""forensics guard: a startup guard (.pth + module) that makes one callable return a fixed value."""
from __future__ import annotations

import dataclasses
import sys

import click

from ..errors import EXIT_OK, GuardError
from ..argspec import FORCE
from ..options import FrontDoor, click_option, json_option
from . import emit, emit_json, warn

__all__ = ["guard"]


@click.command("guard", cls=FrontDoor,
               common=("target", "returns", "out_dir", "env", "force"))
@click.option("--target", required=True, metavar="MODULE:ATTR",
              help="The callable to switch off, e.g. nvitop.api.device:Device.nvlink_throughput.")
@click.option("--returns", "returns", required=True, metavar="JSON",
              help="What it returns instead, as JSON, e.g. '[]'.")
@click.option("--env", "env", default=None, metavar="NAME",
              help="Environment switch: NAME=0 turns the guard off (it is on by default). "
                   "Default: FORENSICS_GUARD_ and the attribute, e.g. FORENSICS_GUARD_DEVICE_NVLINK_THROUGHPUT.")
@click.option("--removes", default=None, help="What the guard's start-up log line says is removed.")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Directory to write the guard into: the site-packages the target's package is installed in "
                   "(the target is checked there), or an image layer's.")
@json_option
@click_option(dataclasses.replace(FORCE, help="Replace the guard's files where they exist in --out."))
def guard(target, returns, env, removes, out_dir, as_json, force):
    """Generate a startup guard (.pth + module) that makes one callable return a fixed value.

    The target is looked for in --out without running it: a package that is there without the module,
    or a module whose source has no such attribute, is refused; a package that is not there is written
    with a warning (not checked).

    \b
    Exit codes: 0 written; 1 error (bad target/JSON, target not in its package, files exist); 2 usage.
    """
    from ..guard import TargetState, check_target, parse_target, write_guard
    from ..output import json_document

    spec = parse_target(target, returns, env, removes)
    check = check_target(spec, out_dir)
    if check.state is TargetState.MISSING:
        raise GuardError(f"--target {spec.target}: {check.detail}: the guard would never act",
                         hint=f"Check the spelling against the installed source ({check.file or out_dir}); "
                              "--out must be the site-packages the package is installed in.")
    if check.state is TargetState.UNCHECKED:
        warn(f"{check.detail}; a guard acts only when {spec.module} is imported and has {spec.attr}")
    written = write_guard(spec, out_dir, force=force)
    if as_json:
        emit_json(json_document("guard", {"guard": spec, "files": written, "target_check": check}, redact=False),
                  None, False)  # our own spec
    else:
        emit([f"Wrote {w}" for w in written]
             + [f"Drop both files into site-packages; {spec.env}=0 turns the guard off."], None, False)
    sys.exit(EXIT_OK)
