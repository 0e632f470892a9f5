"""Find the file on this machine that stands for an object named in a core.

A core names its objects by their paths on the machine that crashed.  With a
sysroot (the crashed machine's or image's filesystem unpacked here, or
``/proc/PID/root`` of a live container) the path is looked up under it by the one
resolver (:mod:`forensics.rootpath`): symlinks followed *inside* the sysroot only
(absolute targets taken relative to it, ``..`` stopping at its root, a loop ended
after a fixed number of hops), one component at a time on descriptors, and the
build-id read from the file the walk found.  A file missing there falls back to the
same path on this machine only when that file is provably the same build (equal
build-ids).  :func:`classify_library` turns the two build-ids into a
:class:`~forensics.model.LibraryStatus`.

A path the core records that already lies under the sysroot is taken as it is (:func:`paths_in_sysroot`): a
qemu-user guest started as ``qemu-aarch64-static -L ROOT ROOT/usr/bin/python3.11`` records its executable as
``ROOT/usr/bin/python3.11``, which ``--sysroot ROOT`` finds at ``/usr/bin/python3.11`` inside ROOT, never at
``ROOT/ROOT/usr/...``.
"""
from __future__ import annotations

import os
import stat

from forensics import rootpath
from forensics.core.buildid import read_build_id_from_fd, read_build_id_from_file
from forensics.model import LibraryStatus

__all__ = ["resolve_in_sysroot", "real_name_in_sysroot", "resolve_file", "classify_library", "paths_in_sysroot"]

MAX_SYMLINK_HOPS = 40
_DELETED = " (deleted)"


def paths_in_sysroot(sysroot: str, path: str) -> list[str]:
    """The paths to look ``path`` up at inside ``sysroot``: the part under the sysroot first when ``path``
    already lies under it (as the sysroot is named, or by its real path), then ``path`` itself.

    >>> paths_in_sysroot("/roots/arm64", "/roots/arm64/usr/bin/python3.11")
    ['/usr/bin/python3.11', '/roots/arm64/usr/bin/python3.11']
    >>> paths_in_sysroot("/roots/arm64/", "/usr/lib/libc.so.6"), paths_in_sysroot("/roots/arm64", "/roots/arm64x/a")
    (['/usr/lib/libc.so.6'], ['/roots/arm64x/a'])
    """
    out = []
    for root in dict.fromkeys((os.path.abspath(sysroot), os.path.realpath(sysroot))):
        root = root.rstrip("/")
        if root and path.startswith(root + "/"):
            out.append(path[len(root):])
    return [*dict.fromkeys(out), path]


def resolve_in_sysroot(sysroot: str, path: str, max_hops: int = MAX_SYMLINK_HOPS) -> str | None:
    """The regular file that ``path`` names inside ``sysroot``, never leaving the sysroot.

    :param sysroot: a directory on this machine
    :param path: an absolute path as the crashed process saw it
    :param max_hops: how many symlinks to follow before giving up (a loop)
    :return: a path under ``sysroot``, or None when there is no regular file there

    >>> resolve_in_sysroot("/nonexistent-sysroot", "/lib/libc.so.6") is None
    True
    """
    found = _find_in_sysroot(sysroot, path, max_hops)
    if found is None:
        return None
    os.close(found[1])
    return found[0]


def real_name_in_sysroot(sysroot: str, path: str, max_hops: int = MAX_SYMLINK_HOPS) -> str | None:
    """The file's own name for ``path`` inside ``sysroot``: the canonical in-root path of the regular file it
    names, every symlink followed inside the sysroot (the dynamic linker's ``libnvidia-ml.so.1`` is
    ``libnvidia-ml.so.580.126.09``, the name the kernel's NT_FILE would give), or None when there is none.

    >>> real_name_in_sysroot("/nonexistent-sysroot", "/lib/libc.so.6") is None
    True
    """
    for candidate in paths_in_sysroot(sysroot, path):
        try:
            fd, inside = rootpath.open_in_root_as(os.path.abspath(sysroot), candidate, os.O_PATH, max_links=max_hops)
        except (OSError, ValueError):
            continue
        try:
            if inside != "/" and stat.S_ISREG(os.fstat(fd).st_mode):
                return inside
        finally:
            os.close(fd)
    return None


def _find_in_sysroot(sysroot: str, path: str, max_hops: int = MAX_SYMLINK_HOPS) -> tuple[str, int] | None:
    """(the host path of the regular file ``path`` names in ``sysroot``, a descriptor open on it), or None."""
    root = os.path.abspath(sysroot)
    for candidate in paths_in_sysroot(sysroot, path):
        try:
            fd, inside = rootpath.open_in_root_as(root, candidate, max_links=max_hops)
        except (OSError, ValueError):
            continue
        if inside != "/" and stat.S_ISREG(os.fstat(fd).st_mode):
            return root.rstrip("/") + inside, fd
        os.close(fd)
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
        if sysroot is None:
            found = _host_file(path)
            if found is not None:
                return found, read_build_id_from_file(found)
            continue
        in_root = _find_in_sysroot(sysroot, path)
        if in_root is not None:
            found, fd = in_root
            try:
                return found, read_build_id_from_fd(fd)  # the file the walk found, whatever its name means now
            finally:
                os.close(fd)
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
