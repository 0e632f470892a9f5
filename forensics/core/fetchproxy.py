"""Debug files by build-id from a process that is not the parser: the sandboxed analysis asks, a fetcher fetches.

An on-node analysis runs in the sandbox, which has no network (:mod:`forensics.sandbox`). When the agent is given
``DEBUGINFOD_URLS`` it starts, beside each analysis, a fetcher in a sandbox of its own (the same uid; sockets
allowed; writing only its cache) and gives both ends of a unix socket pair: the analysis' debug-file lookup
(:func:`forensics.core.debuginfod.fetch_debuginfo`) sends a build-id (one line) and reads back the path of the
file the fetcher kept, or an empty line; the fetcher (``python -m forensics.core.fetcher FD``) fetches with the
debuginfod client, which checks that what a server sent is that build's. The analysis never opens a TCP socket; the
fetcher never parses a core.
"""
from __future__ import annotations

import os
import socket

__all__ = ["ENV", "ask", "read_line"]

#: the analysis' environment names its end of the socket pair here
ENV = "FORENSICS_DEBUGINFOD_FD"
_MAX_LINE = 4096  # a build-id asked, a path answered


def read_line(sock: socket.socket) -> bytes | None:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(_MAX_LINE + 1 - len(buf))
        if not chunk or len(buf) + len(chunk) > _MAX_LINE:
            return None
        buf += chunk
    return buf[:-1]


def ask(build_id: str, timeout: float) -> str | None:
    """The debug file of ``build_id`` the fetcher kept (a path it may read), or None: none, or no fetcher."""
    try:
        fd = int(os.environ.get(ENV, ""))
    except ValueError:
        return None
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:  # not a socket (the environment lies): no fetcher
        return None
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(build_id.encode() + b"\n")
            line = read_line(sock)
        except OSError:  # the fetcher is gone, or took longer than its own deadline
            return None
    path = line.decode("utf-8", "surrogateescape") if line else ""
    return path if path.startswith("/") and os.path.isfile(path) else None
