"""``python -m forensics.sandbox [--uid N [--gid N]] [--write DIR]... [--scratch DIR] [--network] -- COMMAND...``

Confine this process as the policy says (:func:`forensics.sandbox.confine`), then exec COMMAND in its place. A
sandbox that cannot be set up runs nothing: one line on standard error, exit 126 (as a shell says of a command it
cannot run).
"""
from __future__ import annotations

import os
import sys

from . import ConfineError, Policy, confine

EXIT_CANNOT_RUN = 126


def _parse(argv: list[str]) -> tuple[Policy, list[str]]:
    uid = gid = scratch = None
    writable: list[str] = []
    network = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag = argv[i]
        if flag == "--network":
            network, i = True, i + 1
            continue
        if flag not in ("--uid", "--gid", "--write", "--scratch") or i + 1 >= len(argv):
            raise ValueError(f"unknown or incomplete option {flag!r}")
        value, i = argv[i + 1], i + 2
        if flag == "--write":
            writable.append(os.path.abspath(value))
        elif flag == "--scratch":
            scratch = os.path.abspath(value)
        elif flag == "--uid":
            uid = int(value)
        else:
            gid = int(value)
    command = argv[i + 1:]
    if not command:
        raise ValueError("no command after --")
    return Policy(uid=uid, gid=gid, writable=tuple(writable), scratch=scratch, network=network), command


def main(argv: list[str]) -> int:
    try:
        policy, command = _parse(argv)
    except ValueError as e:
        print(f"forensics sandbox: error: {e}", file=sys.stderr)
        return 2
    try:
        confine(policy)
    except ConfineError as e:
        print(f"forensics sandbox: error: cannot confine {command[0]}: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"forensics sandbox: error: cannot run {command[0]}: {e.strerror or e}", file=sys.stderr)
    return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
