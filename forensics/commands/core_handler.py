"""forensics core-handler: the program kernel.core_pattern pipes every core to.

Its imports stay lazy: the kernel starts it for every crash on the node.
"""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from ..options import SIZE

__all__ = ["core_handler"]


@click.command("core-handler", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--max-core-size", type=SIZE, default=None, help="Cut cores at this size (overrides DIR/handler.json).")
@click.option("--budget", type=SIZE, default=None, help="Total size of DIR.")
@click.option("--min-free", type=SIZE, default=None, help="Free space to leave.")
@click.option("--loop-limit", type=int, default=None, help="Cores per image and signal per hour.")
def core_handler(args, max_core_size, budget, min_free, loop_limit):
    """The pipe handler the kernel runs: reads the core on stdin (not for interactive use).

    \b
    ARGS: DIR PID TID SIGNAL TIME [RLIMIT_CORE], as the kernel expands
    kernel.core_pattern = |/PATH/TO/forensics core-handler DIR %P %I %s %t %c
    (install it with: forensics capture --install-handler --core-dir DIR).
    Bad arguments are logged to the kernel log and stdin is still drained.
    """
    from ..capture.handler import _parse_limit, drain, load_config, log_kernel, run_core_handler

    try:
        core_dir, pid, tid, signo, timestamp = args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4])
        rlimit_core = _parse_limit(args[5]) if len(args) > 5 else None
    except (IndexError, ValueError):
        log_kernel(f"bad arguments {' '.join(args)!r}: expected DIR PID TID SIGNAL TIME [RLIMIT_CORE]")
        drain(0)
        sys.exit(EXIT_USAGE)
    cfg = load_config(core_dir)
    for k, v in dict(max_core_size=max_core_size, budget=budget, min_free=min_free, loop_limit=loop_limit).items():
        if v is not None:
            setattr(cfg, k, v)
    r = run_core_handler(os.path.abspath(core_dir), pid, tid, signo, timestamp, rlimit_core, config=cfg)
    sys.exit(EXIT_ERROR if r.core_state == "failed" else EXIT_OK)
