"""Batch triage: many cores -> a handful of distinct crashes (fingerprints).

A crash-looping DaemonSet leaves hundreds of cores.  :func:`analyze_many`
analyzes each with a gdb session kept per worker process, and folds them into
:class:`BatchGroup` rows: count, first and last seen, one example each.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Iterable, Sequence

from ..bundle import bundle_crash_time, bundle_no_core_reason, find_core_in_bundle, has_manifest
from ..bundle.layout import OBJECTS
from ..errors import CoreNotFound, ForensicsError, GdbError, GdbNotFound, InputUnreadable, check_input_exists
from ..model import Analysis, BatchEntry, BatchGroup, BatchResult
from ..views.signature import signature

__all__ = ["find_cores", "crash_time", "analyze_many", "group_entries", "MAX_INPUTS"]

MAX_INPUTS = 100_000
_ELF_CORE_HEAD = b"\x7fELF"


def find_cores(inputs: Iterable[str]) -> tuple[list[str], list[str]]:
    """Expand files and directories into cores and capture bundles: ``(inputs, skipped)``, sorted.

    Files named explicitly are kept whatever they are, so a bad one gets its own error row.
    A directory that is itself a bundle (with a core, or metadata only) stands for its crash;
    inside a directory, ELF cores and bundles (a core handler's ``crashes/<id>``) are found.  A
    symlink to a regular file is followed (a directory of links to cores); a symlink to a
    directory is not, and a bundle's own files are never separate inputs (nor is anything a
    link inside it points at).  Every other file is ``skipped``, and counted as such.
    """
    out: list[str] = []
    skipped: list[str] = []
    for item in inputs:
        check_input_exists(item, CoreNotFound)
        if has_manifest(item):
            out.append(item)
        elif os.path.isdir(item):
            found: list[str] = []
            refused: list[str] = []  # directories this user may not read: each an error row, never passed over
            for root, dirs, files in os.walk(item, followlinks=False, onerror=_refused_to(refused)):
                if has_manifest(root):
                    found.append(root)
                    dirs[:] = []  # the bundle's own files (its core, its objects) are not separate inputs
                    continue
                linked = [d for d in dirs if os.path.islink(os.path.join(root, d))]
                skipped.extend(os.path.join(root, d) for d in sorted(linked))  # a link to a directory: not followed
                dirs[:] = sorted(d for d in dirs if d not in (OBJECTS, ".sysroot") and d not in linked)
                for name in sorted(files):
                    path = os.path.join(root, name)
                    (found if _is_core(path) else skipped).append(path)
                if len(out) + len(found) >= MAX_INPUTS:
                    break
            if refused and refused[0] == item:  # the directory itself: one error line and its hint, not "no cores"
                raise InputUnreadable(item)
            out.extend(found + refused)
        else:
            out.append(item)
        if len(out) >= MAX_INPUTS:
            break
    return out[:MAX_INPUTS], skipped[:MAX_INPUTS]


def _refused_to(refused: list[str]) -> Callable[[OSError], None]:
    """os.walk's onerror: the directories it could not list, kept in ``refused``."""
    return lambda e: refused.append(str(e.filename))


def _is_core(path: str) -> bool:
    """An ELF core file: a regular file, or a symlink to one (followed), whose header says ET_CORE; or one
    compressed as systemd-coredump keeps them (zstd, lz4, xz)."""
    if path.endswith((".zst", ".lz4", ".xz")):
        from ..coredumpd import find_codec

        return find_codec(path) is not None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except PermissionError:
        return True  # it may be one: analyzed, it is an error row saying "permission denied", not a file passed over
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, 18)
    except OSError:
        return False
    finally:
        os.close(fd)
    # e_ident[EI_DATA] == little endian; e_type (offset 16) == ET_CORE (4)
    return len(head) == 18 and head[:4] == _ELF_CORE_HEAD and head[16:18] == b"\x04\x00"


def crash_time(path: str) -> float:
    """When the crash of an input happened: a bundle's recorded time, else the core file's modification
    time (the kernel writes a core as the process dies; a link is followed to its core); 0 if unknown."""
    if os.path.isdir(path):
        t = bundle_crash_time(path)
        if t is not None:
            return t
        core = find_core_in_bundle(path)
        path = core if core is not None else path
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


# -- worker side -------------------------------------------------------------------------------

_SESSION = None
_OPTIONS: dict = {}


def _init_worker(options: dict) -> None:
    global _OPTIONS
    _OPTIONS = options


def _analyze_one(path: str) -> BatchEntry:
    from ..gdb import GdbSession
    from .pipeline import analyze_core

    global _SESSION
    if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
        return BatchEntry(path=path, mtime=0.0, analysis=None, error=str(InputUnreadable(path)))
    when = crash_time(path)
    if os.path.isdir(path):
        reason = bundle_no_core_reason(path)
        if reason is not None:
            return BatchEntry(path=path, mtime=when, analysis=None, error=None, no_core=reason)
    try:
        if _SESSION is None or _SESSION.closed:
            try:  # gdb starts only when a core needs it
                _SESSION = GdbSession(_OPTIONS.get("gdb", "gdb"), timeout=_OPTIONS.get("timeout", 120.0),
                                      debuginfod=_OPTIONS.get("debuginfod"))
            except (GdbError, GdbNotFound):
                _SESSION = None  # analyze_core reports the gdb problem in the analysis
        analysis = analyze_core(
            path, sysroot=_OPTIONS.get("sysroot"), exe=_OPTIONS.get("exe"), gdb=_OPTIONS.get("gdb", "gdb"),
            timeout=_OPTIONS.get("timeout", 120.0), debuginfod=_OPTIONS.get("debuginfod"), session=_SESSION,
            method=_OPTIONS.get("method", "auto"), native_method=_OPTIONS.get("native_method", "auto"),
            # a heap abort's fingerprint needs the anatomy of its corruption (a double free is one bug whatever
            # glibc's message); the rest of the heap only when asked
            heap=_OPTIONS.get("heap", "auto"),
        )
        return BatchEntry(path=path, mtime=when, analysis=analysis, error=None)
    except ForensicsError as e:
        return BatchEntry(path=path, mtime=when, analysis=None, error=str(e))


def analyze_many(paths: list[str], *, jobs: int = 0, progress: Callable[[BatchEntry], None] | None = None,
                 skipped: Sequence[str] = (), listed: Sequence[BatchEntry] = (),
                 **options: object) -> tuple[BatchResult, list[BatchEntry]]:
    """Analyze every core in ``paths``; ``options`` are :func:`analyze_core`'s keyword arguments.

    :param jobs: worker processes (0: one per CPU, at most len(paths))
    :param skipped: the files :func:`find_cores` passed over, carried into the result
    :param listed: entries with nothing to analyze, counted in the result as they are (crashes systemd-coredump's
        journal holds without a core)
    :return: the grouped result and every entry in input order
    """
    jobs = jobs or min(os.cpu_count() or 1, 8)
    jobs = max(1, min(jobs, len(paths) or 1))
    entries: list[BatchEntry] = []
    if jobs == 1:
        _init_worker(options)
        try:
            for p in paths:
                e = _analyze_one(p)
                entries.append(e)
                if progress:
                    progress(e)
        finally:
            _close_session()
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(options,)) as pool:
            for e in pool.map(_analyze_one, paths, chunksize=1):
                entries.append(e)
                if progress:
                    progress(e)
    entries.extend(listed)
    return dataclasses.replace(group_entries(entries), skipped=tuple(skipped)), entries


def _close_session() -> None:
    global _SESSION
    if _SESSION is not None:
        _SESSION.close()
        _SESSION = None


def group_entries(entries: list[BatchEntry]) -> BatchResult:
    """Fold analyzed cores by fingerprint, most frequent first (ties: earliest first seen).

    Snapshots (no crash), kills (a signal another process sent: no crash) and bundles without a core
    are listed apart; a core whose analysis is partial stays in its group and is named there (its
    fingerprint may differ from the whole one).
    """
    groups: dict[str, list[tuple[BatchEntry, Analysis]]] = {}
    failed, snapshots, metadata_only, sent = [], [], [], []
    for e in entries:
        if e.no_core is not None:
            metadata_only.append(e)
        elif e.analysis is None:
            failed.append(e)
        elif e.analysis.crash.is_sent:
            sent.append(e)
        elif e.analysis.fingerprint is None:
            snapshots.append(e)
        else:
            groups.setdefault(e.analysis.fingerprint, []).append((e, e.analysis))
    rows = []
    for fp, members in groups.items():
        members.sort(key=lambda m: (m[0].mtime, m[0].path))
        whole = [m for m in members if m[0].partial is None]
        rows.append(
            BatchGroup(
                fingerprint=fp,
                signature=signature((whole or members)[-1][1]),
                count=len(members),
                first_seen=members[0][0].mtime,
                last_seen=members[-1][0].mtime,
                example=(whole or members)[-1][0].path,
                paths=tuple(m[0].path for m in members),
                partial=tuple(f"{m[0].path}: {m[0].partial}" for m in members if m[0].partial is not None),
                fingerprints_v3=tuple(sorted({m[1].fingerprint_v3 for m in members if m[1].fingerprint_v3})),
            )
        )
    rows.sort(key=lambda g: (-g.count, g.first_seen, g.fingerprint))
    return BatchResult(groups=tuple(rows), failed=tuple(failed), total=len(entries), snapshots=tuple(snapshots),
                       metadata_only=tuple(metadata_only), sent=tuple(sent))
