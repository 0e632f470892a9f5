"""``python -m forensics.core.fetcher FD``: the debuginfod fetcher beside a sandboxed analysis
(:mod:`.fetchproxy` says the protocol). It answers on the unix socket ``FD`` until the analysis closes its end:
one build-id a line asked, the path of the debug file the debuginfod client kept (or nothing) a line answered.
"""
from __future__ import annotations

import os
import socket
import sys

from .debuginfod import fetch_debuginfo
from .fetchproxy import ENV, read_line

__all__ = ["serve"]

_HEX = set("0123456789abcdef")


def serve(fd: int) -> None:
    """Answer the analysis on ``fd`` until it closes its end."""
    with socket.socket(fileno=fd) as sock:
        while True:
            line = read_line(sock)
            if line is None:
                return
            build_id = line.decode("ascii", "replace").lower()
            path = fetch_debuginfo(build_id) if 4 <= len(build_id) <= 128 and set(build_id) <= _HEX else None
            sock.sendall((path or "").encode("utf-8", "surrogateescape") + b"\n")


if __name__ == "__main__":
    os.environ.pop(ENV, None)  # the fetcher fetches itself
    serve(int(sys.argv[1]))
