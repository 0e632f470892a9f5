"""forensics debug: gdb on a core with the crashed machine's files, CPython's gdb helper and the crashed thread."""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_OK, GdbNotFound
from ..options import FrontDoor, click_options
from . import echo, warn
from .analyze_run import OPTIONS

__all__ = ["debug"]

# the options analyze names the same way, from its table: one spelling, one help
_SHARED = tuple(spec for spec in OPTIONS if spec.dest in ("sysroot", "exe", "gdb_path"))


@click.command("debug", cls=FrontDoor,
               common=("sysroot", "exe", "print_only"))
@click.argument("core", type=click.Path(dir_okay=True, readable=False))
@click_options(_SHARED)
@click.option("--print", "print_only", is_flag=True, help="Print the gdb command instead of running it.")
def debug(core, sysroot, exe, gdb_path, print_only):
    """Open gdb on a core, ready: the crashed machine's files (--sysroot, a bundle's own objects), the debug
    directories, CPython's gdb helper for that interpreter (py-bt, py-list, py-locals) and the crashed thread
    selected -- what coredumpctl debug does, plus Python.

    CORE is a core file, a capture bundle or a systemd-coredump store file.

    \b
    Exit codes: gdb's own (0 with --print); 1 error (bad input, no gdb); 2 usage.
    """
    import shutil

    from ..debugger import plan_debug

    plan = plan_debug(core, sysroot=sysroot, exe=exe, gdb=gdb_path)
    for note in plan.notes:
        warn(note)
    if print_only:
        echo(plan.command())
        sys.exit(EXIT_OK)
    found = shutil.which(plan.gdb)
    if found is None:
        raise GdbNotFound(plan.gdb)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(found, plan.argv())  # the terminal is gdb's now: no process of ours stays around it
