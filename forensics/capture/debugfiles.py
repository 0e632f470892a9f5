"""The separate debug files of a crashing process's mapped objects, opened while it still exists.

A capture bundle keeps the debug files the node or the container has for the objects the
process mapped (Debian's ``-dbg``/``-dbgsym``: ``/usr/lib/debug/.build-id/xx/rest.debug``,
or ``/usr/lib/debug/PATH.debug``), stored by build-id in the object store
(``<build-id>.debug``), so the bundle analyzes the same anywhere: ``analyze BUNDLE`` lays
them out where :func:`forensics.core.debugfiles.find_debug_file` looks.  They are looked for
in the process's own root (``/proc/PID/root``) first, then the node's, each path resolved
inside its root one component at a time (:mod:`forensics.rootpath`: a container cannot point
a link at the node's files), and kept only when the file's build-id is the object's.
Bounded: at most :data:`MAX_DEBUG_FILES` files, none larger than :data:`MAX_DEBUG_BYTES`, and
:data:`MAX_DEBUG_TOTAL` bytes for one crash (a file that would pass it is left out).
"""
from __future__ import annotations

import os
import stat

from .. import rootpath
from ..core.buildid import read_build_id_from_fd
from ..core.debugfiles import build_id_debug_path, path_debug_path

__all__ = ["MAX_DEBUG_FILES", "MAX_DEBUG_BYTES", "MAX_DEBUG_TOTAL", "open_debug_files"]

MAX_DEBUG_FILES = 64
MAX_DEBUG_BYTES = 512 << 20
MAX_DEBUG_TOTAL = 1 << 30  # one crash's debug files together: libc's and libpython's are tens of MB


def _open_verified(root: str, rel: str, build_id: str) -> int | None:
    try:
        fd = rootpath.open_in_root(root, rel)
    except (OSError, ValueError):  # no such candidate in the root: the next one is tried
        return None
    try:
        st = os.fstat(fd)
        if (stat.S_ISREG(st.st_mode) and 0 < st.st_size <= MAX_DEBUG_BYTES
                and read_build_id_from_fd(fd) == build_id):
            return fd
    except OSError:  # unreadable: not the debug file (the object's record says none was found)
        pass
    os.close(fd)
    return None


def open_debug_files(pid: int, objects: list[tuple[str, str | None]],
                     host_root: str = "/", *, process_root: str | None = None) -> list[tuple[str, str, int]]:
    """``[(object path, build-id, descriptor)]`` of the debug files found for ``objects``.

    :param objects: ``(path, build-id)`` of each mapped object, as the process saw them
    :param host_root: the node's root (``/`` on the node; the host mount in the agent pod)
    :param process_root: where the process's root is read (default ``/proc/PID/root``): the core handler passes
        ``/proc/self/fd/N`` of a descriptor of it held with its mount namespace, to look after the core is
        written, the process gone; ``""``: the node's root only
    """
    out: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    total = 0
    proc_root = f"/proc/{pid}/root" if process_root is None else process_root
    roots = (proc_root, host_root) if proc_root else (host_root,)
    for path, build_id in objects:
        build_id = (build_id or "").lower()
        if not build_id or build_id in seen or len(out) >= MAX_DEBUG_FILES:
            continue
        seen.add(build_id)
        rels = [r for r in (build_id_debug_path(build_id), path_debug_path(path)) if r]
        for root in roots:
            fd = next((fd for rel in rels if (fd := _open_verified(root, rel, build_id)) is not None), None)
            if fd is None:
                continue
            size = os.fstat(fd).st_size
            if total + size > MAX_DEBUG_TOTAL:
                os.close(fd)  # past the crash's bound: the object's record says no debug file was kept
            else:
                total += size
                out.append((path, build_id, fd))
            break
    return out
