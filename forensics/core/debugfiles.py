"""Separate debug files (``objcopy --only-keep-debug``, Debian's ``-dbg``/``-dbgsym``), found by GNU build-id.

Distributions install them as ``/usr/lib/debug/.build-id/xx/rest.debug`` (``xx``: the
first two hex digits of the build-id).  :func:`find_debug_file` looks there inside
the crashed machine's root (``--sysroot``, a bundle's sysroot) first, then on this
machine, and keeps a candidate only when its own build-id note is the one asked
for: the build-id names the build, so a file of that id is that build's debug
info wherever it lies, and a file of another id is never used.  One lookup for
every reader of debug info (the libdw unwinder; gdb and the Python walker build
on it).
"""
from __future__ import annotations

import os

from forensics.core.buildid import read_build_id_from_file
from forensics.core.files import resolve_in_sysroot

__all__ = ["DEBUG_DIR", "build_id_debug_path", "find_debug_file"]

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


def find_debug_file(build_id: str | None, sysroot: str | None = None) -> str | None:
    """The separate debug file of the object with ``build_id``, or None.

    :param build_id: the object's GNU build-id (hex), as read from the core or its file
    :param sysroot: the crashed machine's root here (searched first, symlinks kept inside it)
    :return: a path whose build-id note equals ``build_id``
    """
    rel = build_id_debug_path(build_id) if build_id else None
    if rel is None:
        return None
    candidates = []
    if sysroot is not None:
        candidates.append(resolve_in_sysroot(sysroot, rel))
    candidates.append(rel if os.path.isfile(rel) else None)
    for path in candidates:
        if path is not None and read_build_id_from_file(path) == build_id.lower():
            return path
    return None
