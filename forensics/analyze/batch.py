"""Batch triage: many cores -> a handful of distinct crashes (fingerprints).

A crash-looping DaemonSet leaves hundreds of cores.  :func:`analyze_many`
analyzes each with a gdb session kept per worker process, and folds them into
:class:`BatchGroup` rows: count, first and last seen, one example each.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable

from ..bundle import is_bundle
from ..errors import ForensicsError, GdbError, GdbNotFound, InputNotFound
from ..model import Analysis, BatchEntry, BatchGroup, BatchResult
from .signature import signature

__all__ = ["find_cores", "analyze_many", "group_entries", "MAX_INPUTS"]

MAX_INPUTS = 100_000
_ELF_CORE_HEAD = b"\x7fELF"


def _is_core(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(18)
    except OSError:
        return False
    # e_ident[EI_DATA] == little endian; e_type (offset 16) == ET_CORE (4)
    return len(head) == 18 and head[:4] == _ELF_CORE_HEAD and head[16:18] == b"\x04\x00"


def find_cores(inputs: Iterable[str]) -> list[str]:
    """Expand files and directories into cores and capture bundles (sorted; symlinks not followed).

    Files named explicitly are kept whatever they are, so a bad one gets its own error row.
    A directory that is itself a bundle stands for its core; inside a directory, ELF cores
    and bundles (a core handler's ``crashes/<id>``) are found.
    """
    out: list[str] = []
    for item in inputs:
        if not os.path.lexists(item):
            raise InputNotFound(item)
        if is_bundle(item):
            out.append(item)
        elif os.path.isdir(item):
            found = []
            for root, dirs, files in os.walk(item, followlinks=False):
                if is_bundle(root):
                    found.append(root)
                    dirs[:] = []  # the bundle's own files (its decompressed core) are not separate inputs
                    continue
                dirs[:] = sorted(d for d in dirs if d not in ("objects", ".sysroot"))
                for name in sorted(files):
                    p = os.path.join(root, name)
                    if not os.path.islink(p) and _is_core(p):
                        found.append(p)
                if len(out) + len(found) >= MAX_INPUTS:
                    break
            out.extend(found)
        else:
            out.append(item)
        if len(out) >= MAX_INPUTS:
            break
    return out[:MAX_INPUTS]


# -- worker side -------------------------------------------------------------------------------

_SESSION = None
_OPTIONS: dict = {}


def _init_worker(options: dict) -> None:
    global _OPTIONS
    _OPTIONS = options


def _analyze_one(path: str) -> BatchEntry:
    from ..gdb import GdbSession
    from . import analyze_core

    global _SESSION
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
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
            heap=_OPTIONS.get("heap", "off"),  # a fingerprint table shows no heap: read it only when asked
        )
        return BatchEntry(path=path, mtime=mtime, analysis=analysis, error=None)
    except ForensicsError as e:
        return BatchEntry(path=path, mtime=mtime, analysis=None, error=str(e))


def analyze_many(paths: list[str], *, jobs: int = 0, progress: Callable[[BatchEntry], None] | None = None,
                 **options: object) -> tuple[BatchResult, list[BatchEntry]]:
    """Analyze every core in ``paths``; ``options`` are :func:`analyze_core`'s keyword arguments.

    :param jobs: worker processes (0: one per CPU, at most len(paths))
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
        with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(options,)) as pool:
            for e in pool.map(_analyze_one, paths, chunksize=1):
                entries.append(e)
                if progress:
                    progress(e)
    return group_entries(entries), entries


def _close_session() -> None:
    global _SESSION
    if _SESSION is not None:
        _SESSION.close()
        _SESSION = None


def group_entries(entries: list[BatchEntry]) -> BatchResult:
    """Fold analyzed cores by fingerprint, most frequent first (ties: earliest first seen)."""
    groups: dict[str, list[tuple[BatchEntry, Analysis]]] = {}
    failed = []
    for e in entries:
        if e.analysis is None:
            failed.append(e)
        else:
            groups.setdefault(e.analysis.fingerprint, []).append((e, e.analysis))
    rows = []
    for fp, members in groups.items():
        members.sort(key=lambda m: (m[0].mtime, m[0].path))
        rows.append(
            BatchGroup(
                fingerprint=fp,
                signature=signature(members[-1][1]),
                count=len(members),
                first_seen=members[0][0].mtime,
                last_seen=members[-1][0].mtime,
                example=members[-1][0].path,
                paths=tuple(m[0].path for m in members),
            )
        )
    rows.sort(key=lambda g: (-g.count, g.first_seen, g.fingerprint))
    return BatchResult(groups=tuple(rows), failed=tuple(failed), total=len(entries))
