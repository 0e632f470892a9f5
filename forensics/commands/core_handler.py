"""forensics core-handler: the program kernel.core_pattern pipes every core to.

Its imports stay lazy: the kernel starts it for every crash on the node.  It never lets click
reject its arguments: the dying process waits until stdin is read to the end, so every problem
with the arguments is logged and the core is still drained (or, when only a number is bad, kept
with the bad value noted).
"""
from __future__ import annotations

import math
import os
import sys
import time

import click

from ..errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE

__all__ = ["core_handler", "parse_handler_args"]

_OPTIONS = ("--max-core-size", "--budget", "--min-free", "--loop-limit")
#: %t later than this (the year 9999) is not a time the kernel sends
_MAX_TIME = 253402300799.0


def parse_handler_args(args: tuple[str, ...]) -> tuple[dict, dict, list[str]]:
    """``DIR PID TID SIGNAL TIME [RLIMIT_CORE]`` and the bound options, as leniently as the crash deserves.

    :return: ``(positional values, options, problems)``; a bad PID, TID or signal becomes 0, a bad
        time the handler's own clock, a bad option is ignored — each named in ``problems``.
    :raises ValueError: when there is no core directory to save anything into
    """
    from ..capture.handler import _parse_limit
    from ..options import SIZE

    problems: list[str] = []
    positional: list[str] = []
    options: dict[str, int] = {}
    it = iter(args)
    for a in it:
        name, eq, given = a.partition("=")
        value: str | None = given
        if name in _OPTIONS:
            if not eq:
                value = next(it, None)
            key = name[2:].replace("-", "_")
            try:
                if value is None:
                    raise ValueError("no value")
                options[key] = int(value) if key == "loop_limit" else SIZE.convert(value, None, None)
            except (ValueError, click.BadParameter) as e:
                problems.append(f"ignored {name} {value!r}: {getattr(e, 'message', e)}")
        elif a.startswith("--"):
            problems.append(f"ignored unknown option {a!r}")
        else:
            positional.append(a)
    if not positional or not positional[0] or positional[0].startswith("-"):
        raise ValueError("no core directory")

    def number(i: int, what: str) -> int:
        raw = positional[i] if len(positional) > i else None
        try:
            return int(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            problems.append(f"{what} {raw!r} is not a number: recorded as 0")
            return 0

    values = {"core_dir": positional[0], "pid": number(1, "PID (%P)"), "tid": number(2, "TID (%I)"),
              "signal": number(3, "signal (%s)")}
    raw_t = positional[4] if len(positional) > 4 else None
    try:
        t = float(raw_t)  # type: ignore[arg-type]
        if not math.isfinite(t) or not 0 <= t <= _MAX_TIME:
            raise ValueError
    except (TypeError, ValueError):
        t = time.time()
        problems.append(f"crash time (%t) {raw_t!r} is not a time: the handler's clock ({t:.0f}) is used")
    values["time"] = t
    values["rlimit_core"] = _parse_limit(positional[5]) if len(positional) > 5 else None
    return values, options, problems


@click.command("core-handler", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def core_handler(args):
    """The pipe handler the kernel runs: reads the core on stdin (not for interactive use).

    \b
    ARGS: DIR PID TID SIGNAL TIME [RLIMIT_CORE] [--max-core-size SIZE] [--budget SIZE]
          [--min-free SIZE] [--loop-limit N], as the kernel expands
    kernel.core_pattern = |/PATH/TO/forensics core-handler DIR %P %I %s %t %c
    (install it with: forensics capture --install-handler --core-dir DIR).
    Bad arguments are logged to the kernel log, and stdin is always drained: a bad number is
    recorded as such with the core kept; without a directory nothing can be kept (exit 2).
    """
    from ..capture.handler import drain, load_config, log_kernel, run_core_handler

    stdin_fd = 0
    if sys.stdin is None:
        # started with no stdin at all: descriptor 0 may since have been reused by the interpreter for one of
        # its own files, which must never be read as "the core"
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
    if args in (("--help",), ("-h",)):
        click.echo(click.get_current_context().get_help())
        return
    try:
        values, options, problems = parse_handler_args(args)
    except ValueError:
        log_kernel(f"bad arguments {' '.join(args)!r}: expected DIR PID TID SIGNAL TIME [RLIMIT_CORE]; core dropped")
        drain(stdin_fd)
        sys.exit(EXIT_USAGE)
    if stdin_fd != 0:
        problems.append("stdin was closed: no pipe from the kernel to read")
    for p in problems:
        log_kernel(f"arguments: {p}", level=4)
    cfg = load_config(values["core_dir"])
    for k, v in options.items():
        setattr(cfg, k, v)
    r = run_core_handler(os.path.abspath(values["core_dir"]), values["pid"], values["tid"], values["signal"],
                         values["time"], values["rlimit_core"], stdin_fd=stdin_fd, config=cfg,
                         argument_problems=problems)
    from ..bundle.record import CoreState

    sys.exit(EXIT_ERROR if r.core_state is CoreState.FAILED else EXIT_OK)
