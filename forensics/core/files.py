"""Find the file on this machine that stands for an object named in a core.

A core names its objects by their paths on the machine that crashed.  With a
sysroot (the crashed machine's or image's filesystem unpacked here) the path is
looked up under it, following symlinks *inside* the sysroot only: absolute link
targets are taken relative to the sysroot, ``..`` stops at its root, and a loop
ends after a fixed number of hops.  A file missing there falls back to the same
path on this machine only when that file is provably the same build (equal
build-ids).  :func:`classify_library` turns the two build-ids into a
:class:`~forensics.model.LibraryStatus`.
"""
from __future__ import annotations

import os
import stat
from collections import deque

from forensics.core.buildid import read_build_id_from_file
from forensics.model import LibraryStatus

__all__ = ["resolve_in_sysroot", "resolve_file", "classify_library"]

MAX_SYMLINK_HOPS = 40
_DELETED = " (deleted)"


def resolve_in_sysroot(sysroot: str, path: str, max_hops: int = MAX_SYMLINK_HOPS) -> str | None:
    """The regular file that ``path`` names inside ``sysroot``, never leaving the sysroot.

    :param sysroot: a directory on this machine
    :param path: an absolute path as the crashed process saw it
    :param max_hops: how many symlinks to follow before giving up (a loop)
    :return: a path under ``sysroot``, or None when there is no regular file there

    >>> resolve_in_sysroot("/nonexistent-sysroot", "/lib/libc.so.6") is None
    True
    """
    root = os.path.abspath(sysroot)
    todo = deque(c for c in path.split("/") if c)
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.popleft()
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > max_hops:
                return None
            try:
                target = os.readlink(here)
            except OSError:
                return None
            if target.startswith("/"):
                done = []
            todo.extendleft(reversed([c for c in target.split("/") if c]))
            continue
        done.append(part)
        if todo and not stat.S_ISDIR(st.st_mode):
            return None
    final = os.path.join(root, *done)
    try:
        return final if done and stat.S_ISREG(os.lstat(final).st_mode) else None
    except OSError:
        return None


def _host_file(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def resolve_file(
    core_path_of_object: str, sysroot: str | None, expected_build_id: str | None
) -> tuple[str | None, str | None]:
    """Find the file for an object the core names, and read its build-id.

    Without a sysroot the path itself is used.  With one, the path under the
    sysroot (symlinks resolved inside it); when it is not there, the same path
    on this machine, but only if its build-id equals ``expected_build_id``.  A
    path the kernel marked `` (deleted)`` is looked up without that suffix.

    :param core_path_of_object: the path as the core names it (NT_FILE)
    :param sysroot: the crashed machine's filesystem root here, or None
    :param expected_build_id: the build-id read from the core's memory, if known
    :return: ``(file path, its build-id)``; ``(None, None)`` when no usable file exists
    """
    candidates = [core_path_of_object]
    if core_path_of_object.endswith(_DELETED):
        candidates.append(core_path_of_object[: -len(_DELETED)])
    for path in candidates:
        found = resolve_in_sysroot(sysroot, path) if sysroot is not None else _host_file(path)
        if found is not None:
            return found, read_build_id_from_file(found)
    if sysroot is not None and expected_build_id is not None:
        for path in candidates:
            if _host_file(path) is not None:
                host_id = read_build_id_from_file(path)
                if host_id == expected_build_id:
                    return path, host_id
    return None, None


def classify_library(build_id: str | None, file_path: str | None, file_build_id: str | None) -> LibraryStatus:
    """Judge a library from its build-id in the core and the file found for it.

    >>> classify_library("ab", "/lib/x.so", "cd").value
    'build-id-mismatch'
    """
    if file_path is None:
        return LibraryStatus.MISSING
    if build_id is None or file_build_id is None:
        return LibraryStatus.UNVERIFIED
    return LibraryStatus.OK if build_id == file_build_id else LibraryStatus.MISMATCH
