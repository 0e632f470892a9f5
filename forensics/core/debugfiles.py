"""Separate debug files (``objcopy --only-keep-debug``, Debian's ``-dbg``/``-dbgsym``), found by GNU build-id.

Distributions install them as ``/usr/lib/debug/.build-id/xx/rest.debug`` (``xx``: the
first two hex digits of the build-id), and some beside the object's own path as
``/usr/lib/debug/PATH.debug``.  :func:`find_debug_file` looks in both places inside
the crashed machine's root (``--sysroot``, a bundle's sysroot) first, resolving every
component inside it (:mod:`forensics.rootpath`), then on this machine, and keeps a
candidate only when its own build-id note is the one asked for: the build-id names
the build, so a file of that id is that build's debug info wherever it lies, and a
file of another id is never used.  Found nowhere, it is fetched from the debuginfod servers
``DEBUGINFOD_URLS`` names, when it names any (:mod:`forensics.core.debuginfod`).  One lookup for every
reader of debug info (the libdw unwinder, gdb, the heap reader and the Python walker).
"""
from __future__ import annotations

import os

from forensics import rootpath
from forensics.core.buildid import read_build_id_from_file

__all__ = ["DEBUG_DIR", "build_id_debug_path", "path_debug_path", "find_debug_file"]

DEBUG_DIR = "/usr/lib/debug"
_HEX = frozenset("0123456789abcdef")


def build_id_debug_path(build_id: str) -> str | None:
    """Where a distribution installs the debug file of ``build_id``; None for a malformed id.

    >>> build_id_debug_path("93ac61ec5a8eb1396f9fbd350e3169a558528a40")
    '/usr/lib/debug/.build-id/93/ac61ec5a8eb1396f9fbd350e3169a558528a40.debug'
    >>> build_id_debug_path("../../etc/passwd") is None
    True
    """
    build_id = build_id.lower()
    if not 4 <= len(build_id) <= 128 or not set(build_id) <= _HEX:
        return None
    return f"{DEBUG_DIR}/.build-id/{build_id[:2]}/{build_id[2:]}.debug"


def path_debug_path(path: str) -> str | None:
    """Where a distribution installs the debug file of the object at ``path``, beside its own path.

    >>> path_debug_path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    '/usr/lib/debug/usr/lib/x86_64-linux-gnu/libc.so.6.debug'
    >>> path_debug_path("relative/x.so") is None
    True
    """
    if not path.startswith("/") or "\0" in path:
        return None
    return f"{DEBUG_DIR}{path}.debug"


def _in_root(sysroot: str, rel: str, build_id: str) -> str | None:
    """``rel`` resolved inside ``sysroot`` when it is a regular file of ``build_id``; None otherwise."""
    try:
        found = rootpath.resolve_in_root(sysroot, rel)
        fd = rootpath.open_in_root(sysroot, found)
    except (OSError, ValueError):
        return None
    try:
        if read_build_id_from_file(f"/proc/self/fd/{fd}") != build_id:
            return None
    finally:
        os.close(fd)
    return os.path.join(os.path.abspath(sysroot), found.lstrip("/"))


def find_debug_file(build_id: str | None, sysroot: str | None = None, path: str | None = None) -> str | None:
    """The separate debug file of the object with ``build_id``, or None.

    :param build_id: the object's GNU build-id (hex), as read from the core or its file
    :param sysroot: the crashed machine's root here (searched first, every component resolved inside it)
    :param path: the object's path as the core names it, for ``/usr/lib/debug/PATH.debug``
    :return: a path whose build-id note equals ``build_id`` (in the cache when a debuginfod server sent it)
    """
    rel = build_id_debug_path(build_id) if build_id else None
    if rel is None or build_id is None:
        return None
    build_id = build_id.lower()
    rels = [rel] + [r for r in (path_debug_path(path) if path else None,) if r]
    if sysroot is not None:
        for r in rels:
            found = _in_root(sysroot, r, build_id)
            if found is not None:
                return found
    for r in rels:
        if os.path.isfile(r) and read_build_id_from_file(r) == build_id:
            return r
    # the last resort: a debuginfod server (nothing fetched when unset), or in agent serve's sandbox its fetcher
    if os.environ.get("DEBUGINFOD_URLS") or os.environ.get("FORENSICS_DEBUGINFOD_FD"):
        from forensics.core.debuginfod import fetch_debuginfo

        return fetch_debuginfo(build_id)
    return None
