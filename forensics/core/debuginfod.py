"""Debug files fetched by build-id from the debuginfod servers ``DEBUGINFOD_URLS`` names, into the cache.

The variable eu-stack, gdb and drgn honour: a space-separated list of server URLs, each asked in turn
``GET URL/buildid/BUILDID/debuginfo`` (the debuginfod protocol).  Unset or empty, nothing is fetched and
no address is contacted (offline behaviour unchanged).  :func:`fetch_debuginfo` is the last resort of
:func:`forensics.core.debugfiles.find_debug_file`, so every reader of debug info (the libdw unwinder, gdb,
the heap reader, the Python walker) gets what a server has.

Bounded as libdebuginfod bounds it, with the same variables: ``DEBUGINFOD_TIMEOUT`` seconds to connect
and between bytes (default 10), ``DEBUGINFOD_MAXTIME`` seconds for one file (default 120),
``DEBUGINFOD_MAXSIZE`` bytes of one file (default 2 GiB; a larger one is refused); 1 GiB stays free in the
cache.  A file is kept (``CACHE/debuginfod/BUILDID/debuginfo``, mode 0600, written to a temporary file of
its own and renamed) only when its own build-id note is the one asked for; a build-id no server has is not
asked again by this process.  One fetch at a time in a process: the libdw unwinder (in a thread of its own)
and the Python reader ask for the executable's debug file at the same moment, and the second then finds the
first's file.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

from forensics.cache import cache_path
from forensics.core.buildid import read_build_id_from_file

__all__ = ["debuginfod_urls", "fetch_debuginfo", "DEFAULT_TIMEOUT", "DEFAULT_MAXTIME", "DEFAULT_MAXSIZE"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAXTIME = 120.0
DEFAULT_MAXSIZE = 2 << 30
MAX_URLS = 16
_FREE_RESERVE = 1 << 30
_CHUNK = 1 << 20
_HEX = frozenset("0123456789abcdef")
_missed: set[str] = set()  # build-ids no server had, in this process
_fetching = threading.Lock()  # one fetch at a time in this process


def debuginfod_urls() -> list[str]:
    """The http(s) servers of ``DEBUGINFOD_URLS``, in order (others, e.g. ``file://``, left out).

    >>> os.environ["DEBUGINFOD_URLS"] = "http://127.0.0.1:8002/ ftp://x https://127.0.0.1/d"
    >>> debuginfod_urls()
    ['http://127.0.0.1:8002', 'https://127.0.0.1/d']
    >>> del os.environ["DEBUGINFOD_URLS"]
    """
    urls = (os.environ.get("DEBUGINFOD_URLS") or "").split()
    return [u.rstrip("/") for u in urls if u.startswith(("http://", "https://"))][:MAX_URLS]


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def fetch_debuginfo(build_id: str) -> str | None:
    """The debug file of ``build_id`` from the first server that has it, kept in the cache; None when no
    server is named, none has it, or what one sent is not that build's (never an exception: a missing debug
    file leaves frames unnamed, it does not end an analysis)."""
    build_id = build_id.lower()
    if not 4 <= len(build_id) <= 128 or not set(build_id) <= _HEX or build_id in _missed:
        return None
    urls = debuginfod_urls()
    if not urls:
        return None
    with _fetching:
        return None if build_id in _missed else _fetch(build_id, urls)


def _fetch(build_id: str, urls: list[str]) -> str | None:
    entry = cache_path("debuginfod", build_id)
    dest = os.path.join(entry, "debuginfo")
    if os.path.isfile(dest) and read_build_id_from_file(dest) == build_id:
        return dest
    try:
        os.makedirs(entry, mode=0o700, exist_ok=True)
    except OSError:
        return None
    for url in urls:
        if _download(f"{url}/buildid/{build_id}/debuginfo", dest):
            if read_build_id_from_file(dest) == build_id:
                return dest
            with contextlib.suppress(OSError):
                os.unlink(dest)  # another build's file: not this build's debug info
    _missed.add(build_id)
    return None


def _download(url: str, dest: str) -> bool:
    """Stream ``url`` into ``dest`` within the time and size bounds; False on any failure (nothing left)."""
    import http.client
    import urllib.error
    import urllib.request

    timeout = _env_number("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT)
    maxtime = _env_number("DEBUGINFOD_MAXTIME", DEFAULT_MAXTIME)
    maxsize = int(_env_number("DEBUGINFOD_MAXSIZE", DEFAULT_MAXSIZE))
    tmp = None
    started = time.monotonic()
    try:
        st = os.statvfs(os.path.dirname(dest))
        room = min(maxsize, st.f_bavail * st.f_frsize - _FREE_RESERVE)
        req = urllib.request.Request(url, headers={"User-Agent": "forensics"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # http(s) only: debuginfod_urls
            said = resp.headers.get("Content-Length")
            if said is not None and said.isdigit() and int(said) > room:
                return False
            import tempfile

            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".debuginfo.", suffix=".tmp")  # 0600
            n = 0
            with os.fdopen(fd, "wb") as out:
                while chunk := resp.read(_CHUNK):
                    n += len(chunk)
                    if n > room or time.monotonic() - started > maxtime:
                        raise OSError("past DEBUGINFOD_MAXSIZE, the cache's room or DEBUGINFOD_MAXTIME")
                    out.write(chunk)
        os.rename(tmp, dest)
        return True
    # HTTPError (404) is a URLError, a timeout an OSError, a cut transfer an HTTPException
    except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException):
        if tmp is not None:  # ours only: never another fetch's file
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
