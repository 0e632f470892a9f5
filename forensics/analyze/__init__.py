"""core -> snapshot -> analysis: the ``forensics analyze`` pipeline.

:func:`analyze_core` is the one entry point for a single core;
:func:`forensics.analyze.batch.analyze_many` folds many cores into fingerprints.
"""
from __future__ import annotations

import re

from ..core import open_core
from ..errors import GdbError, GdbNotFound
from ..gdb import GdbResult, GdbSession, run_gdb
from ..model import (
    Analysis,
    CoreFile,
    Crash,
    CrashKind,
    Finding,
    LibraryStatus,
    ProcessSnapshot,
    Severity,
    Source,
)
from .classify import classify_crash
from .fingerprint import fingerprint, fingerprint_basis
from .stacks import build_threads

__all__ = ["analyze_core", "build_snapshot", "analyze_snapshot", "check_snapshot", "is_python_process"]

_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)")


def is_python_process(core: CoreFile) -> bool:
    names = [lib.name for lib in core.libraries]
    exe = (core.executable or "").rsplit("/", 1)[-1]
    return exe.startswith("python") or any(n.startswith("libpython") for n in names)


def _python_symbols_hint(core: CoreFile) -> str:
    version = None
    for lib in core.libraries:
        m = _LIBPYTHON.search(lib.name)
        if m:
            version = m.group(1)
            break
    if version is None:
        m = re.search(r"python(\d+\.\d+)", (core.executable or "").rsplit("/", 1)[-1])
        version = m.group(1) if m else "3.X"
    return (
        f"the Python stack needs CPython {version} debug symbols: Debian/Ubuntu python{version}-dbg "
        f"(for the distribution's python{version}), debuginfod (--debuginfod URL), or an interpreter built "
        "with -g (pyenv builds keep them); the native stacks above are complete"
    )


def build_snapshot(core: CoreFile, result: GdbResult | None, *, sysroot: str | None,
                   gdb_problem: str | None = None) -> ProcessSnapshot:
    """Join the core reader's facts with gdb's stacks into one snapshot."""
    warnings: list[str] = []
    python_version = None
    if result is None:
        threads = ()
        status = f"no stacks: {gdb_problem}" if gdb_problem else "no stacks"
        method = "none"
        if gdb_problem:
            warnings.append(gdb_problem)
    else:
        threads = build_threads(core, result.native, result.python)
        method = "gdb"
        py = result.python
        if not is_python_process(core):
            status = "not a Python process"
        elif py is None:
            status = "Python stacks unavailable: the gdb script printed no result"
            warnings.append(status)
        elif py.get("status") == "ok":
            status = "ok"
            python_version = py.get("python_version")
        elif py.get("status") == "no-python-symbols":
            python_version = py.get("python_version")
            status = "no CPython debug symbols: " + _python_symbols_hint(core)
            warnings.append(status)
        else:
            python_version = py.get("python_version")
            status = f"Python stacks unavailable: {py.get('detail') or py.get('status')}"
            warnings.append(status)
    if core.truncated:
        warnings.append(
            f"core is truncated: {core.size} of {core.expected_size} bytes were written "
            "(core size limit or full disk); parts of memory are missing"
        )
    for lib in core.libraries:
        if lib.status is LibraryStatus.MISMATCH:
            warnings.append(
                f"{lib.path}: the file at {lib.file_path} is build {lib.file_build_id}, the core ran build "
                f"{lib.build_id}; it was left out, so its frames are unnamed (pass --sysroot with the original files)"
            )
        elif lib.status is LibraryStatus.MISSING:
            warnings.append(f"{lib.path}: not found{' under the sysroot' if sysroot else ''}; its frames are unnamed")
    return ProcessSnapshot(
        source=Source.CORE,
        core=core,
        threads=threads,
        python_version=python_version,
        python_stack_status=status,
        method=method,
        sysroot=sysroot,
        warnings=tuple(warnings),
    )


def check_snapshot(snapshot: ProcessSnapshot, crash: Crash) -> tuple[Finding, ...]:
    """Findings an on-call engineer should read, each with its evidence."""
    core = snapshot.core
    out: list[Finding] = []
    crashed = snapshot.crashed_thread
    if crash.kind is CrashKind.HEAP_CORRUPTION:
        out.append(
            Finding(
                rule="heap-corruption-detected-late",
                severity=Severity.WARNING,
                summary="glibc found the heap corrupted when this thread freed or allocated memory; "
                "the code that overwrote the heap may have run earlier, elsewhere",
                evidence=tuple(x for x in (crash.abort_message,) if x),
                tid=crash.tid,
            )
        )
    if core.nvml is not None:
        out.append(
            Finding(
                rule="nvml-library",
                severity=Severity.INFO,
                summary=f"libnvidia-ml loaded: {core.nvml.path} (driver {core.nvml.driver_version or 'unknown'})",
                evidence=(f"build-id {core.nvml.build_id or 'unknown'}",),
            )
        )
        if crashed is not None and crashed.inside_nvml:
            out.append(
                Finding(
                    rule="crash-inside-nvml",
                    severity=Severity.WARNING,
                    summary="the crashing thread was inside libnvidia-ml when it died",
                    tid=crashed.tid,
                )
            )
    for lib in core.libraries:
        if lib.status in (LibraryStatus.MISMATCH, LibraryStatus.MISSING):
            out.append(
                Finding(
                    rule=f"library-{lib.status.value}",
                    severity=Severity.WARNING,
                    summary=f"{lib.path}: {lib.status.value}",
                    evidence=(f"core build-id {lib.build_id}", f"file {lib.file_path} build-id {lib.file_build_id}"),
                )
            )
    if core.truncated:
        out.append(
            Finding(
                rule="core-truncated",
                severity=Severity.ERROR,
                summary=f"core truncated at {core.size} of {core.expected_size} bytes",
            )
        )
    return tuple(out)


def analyze_snapshot(snapshot: ProcessSnapshot) -> Analysis:
    crashed = snapshot.crashed_thread
    crash = classify_crash(snapshot.core, crashed)
    basis = fingerprint_basis(crash, crashed)
    return Analysis(
        snapshot=snapshot,
        crash=crash,
        fingerprint=fingerprint(basis),
        fingerprint_basis=basis,
        findings=check_snapshot(snapshot, crash),
    )


def analyze_core(path: str, *, sysroot: str | None = None, exe: str | None = None, gdb: str = "gdb",
                 timeout: float = 120.0, debuginfod: str | None = None,
                 session: GdbSession | None = None) -> Analysis:
    """Analyze one core file.

    :param sysroot: a directory holding the crashed process's files at the paths the core names
    :param exe: the executable, when it is not at the path the core names
    :param session: a running :class:`GdbSession` to reuse (batch mode)
    :raises ForensicsError: when the input is not a readable x86-64 core
    :return: the analysis; when gdb is missing or fails, one without stacks whose
        ``snapshot.method`` is ``"none"`` and whose warnings say why
    """
    core = open_core(path, sysroot=sysroot, exe=exe)
    exe_lib = core.libraries[0] if core.libraries else None
    usable = (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
    exe_file = exe_lib.file_path if exe_lib is not None and exe_lib.status in usable else None
    result = problem = None
    try:
        if session is not None:
            result = session.analyze(core, exe_file)
        else:
            result = run_gdb(core, exe_file, gdb=gdb, timeout=timeout, debuginfod=debuginfod)
    except GdbNotFound as e:
        problem = f"{e}; native and Python stacks need gdb ({e.help_text})"
    except GdbError as e:
        problem = str(e)
    snapshot = build_snapshot(core, result, sysroot=sysroot, gdb_problem=problem)
    return analyze_snapshot(snapshot)
