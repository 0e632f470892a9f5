"""forensics analyze's work and its options, behind its click command (:mod:`.analyze`) and without click.

:func:`run` is the command's body; :data:`OPTIONS` its options, the one table click's command is made
from.  :func:`parse_argv` reads ``forensics analyze``'s arguments with that table the way click reads
them, for the forms click accepts as they are, so that
:func:`forensics.cli.main` can run an analysis without importing click (a third of what an
analysis of a small core cost); for anything else -- help, a usage error, an option written
another way -- it says None and click parses, so click's help, messages and exit codes stay
the only ones.  ``tests/unit/test_analyze_argv.py`` holds it to click's own parse.
"""
from __future__ import annotations

import os
import sys

from ..argspec import FORCE, INPUT, JSON, OUTPUT, STORE, STORE_DEADLINE, VERBOSE, Kind, OptionSpec, parse_args
from ..errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, CoreNotFound, ForensicsError, check_input_exists
from ..modes import NativeMethod, StackMethod
from . import emit, emit_json, warn

__all__ = ["run", "parse_argv", "OPTIONS"]


def run(inputs, *, sysroot, exe, merged, method, native_method, gdb_path, debuginfod, timeout, heap, jobs, as_json,
        output, force, verbose, full_paths=False, endpoint_url=None, region=None, profile=None, deadline=None,
        sandbox=False):
    """Analyze one core or bundle, or a batch; exits with the analysis' exit code."""
    batch = False  # a prefix of bundles in a bucket is a batch, as a directory of them is
    fetch_problems: list[str] = []  # bundles of a bucket's prefix not read: said, and the batch is partial
    if any(i.startswith("s3://") for i in inputs):  # objects: fetched into the cache first (boto3 only then)
        from ..objstore.client import StoreOptions
        from ..objstore.fetch import fetch_inputs

        inputs, batch = fetch_inputs(inputs, StoreOptions(endpoint_url=endpoint_url, region=region, profile=profile,
                                                          deadline=deadline), problems=fetch_problems)
        for p in fetch_problems:
            warn(p)
    if sandbox:  # the inputs are local now (a fetch needs the network: done here, outside the parser)
        _run_sandboxed(inputs, dict(sysroot=sysroot, exe=exe, merged=merged, method=method,
                                    native_method=native_method, gdb_path=gdb_path, debuginfod=debuginfod,
                                    timeout=timeout, heap=heap, jobs=jobs, as_json=as_json, verbose=verbose,
                                    full_paths=full_paths),
                       output, force)
    if len(inputs) == 1 and not os.path.isdir(inputs[0]) and not batch:
        # one core (not a bundle, not a directory): what find_cores would say of it, without loading the batch
        # and bundle readers it does not need
        check_input_exists(inputs[0], CoreNotFound)
        paths, single = [inputs[0]], True
        skipped: list[str] = []
    else:
        from ..analyze.batch import find_cores
        from ..bundle import has_manifest

        paths, skipped = find_cores(inputs)
        single = len(inputs) == 1 and has_manifest(inputs[0]) and not batch
    journal = [] if single or batch else _journal_only(inputs)
    options = dict(sysroot=sysroot, exe=exe, gdb=gdb_path, timeout=timeout, debuginfod=debuginfod, method=method,
                   native_method=native_method, heap="full" if heap else "auto")
    if single:
        from ..analyze import analyze_core

        analysis = analyze_core(paths[0], **options)
        for w in analysis.snapshot.warnings:
            if verbose or as_json or output:
                warn(w)
        if as_json:
            from ..format import analysis_payload
            from ..output import json_document

            emit_json(json_document("analyze", {"analysis": analysis_payload(analysis, merged=merged)}), output, force)
        else:
            from ..format import analysis_payload
            from ..redact import redact_lines
            from ..text.analysis import format_analysis

            # what the secrets are learned from (plain already): the document --json writes, but for its merged
            # view, which holds the frames' own strings again beside its kind ("native", "python": shorter than any
            # secret learned, so no fact that could keep one)
            doc = analysis_payload(analysis)
            emit(redact_lines(format_analysis(analysis, merged=merged, full_paths=full_paths), doc), output, force)
        sys.exit(EXIT_OK if analysis.snapshot.is_complete else EXIT_PARTIAL)
    # a heap abort's fingerprint needs its anatomy (which corruption it was); the table shows no more of the heap
    options["heap"] = "full" if heap else "auto"
    _analyze_batch(paths, skipped, options, jobs, as_json, output, force, journal,
                   partial_input=bool(fetch_problems))


def _journal_only(inputs) -> list:
    """The crashes systemd-coredump's journal holds without a core, for each input that is its store
    (:func:`forensics.coredumpd.is_store`): [(the store, its crashes, why its journal was not read or None)]."""
    from ..coredumpd import is_store, journal_only_crashes

    return [(i, *journal_only_crashes(i)) for i in inputs if is_store(i)]


def _run_sandboxed(inputs: list[str], params: dict, output: str | None, force: bool) -> None:
    """``analyze`` again, without --sandbox, contained (:mod:`forensics.sandbox.contain`): the inputs read-only,
    its result printed to this process, which writes it out."""
    from ..sandbox.contain import run_contained

    argv = [sys.executable, "-m", "forensics", "analyze"]
    for spec in OPTIONS:
        value = params.get(spec.dest)
        if spec.dest in ("output", "force", "sandbox") or value is None or value is False or value == 0:
            continue
        if spec.kind is Kind.FLAG:
            argv.append(spec.names[-1])
        elif spec.kind is Kind.COUNT:
            argv += [spec.names[-1]] * int(value)
        elif value != spec.default:
            argv += [spec.names[-1], str(value)]
    argv += ["--", *inputs]
    read = [*inputs, *(p for p in (params.get("sysroot"), params.get("exe")) if p)]
    # a node's crash directory keeps its objects two levels up (the core directory's store): that store too
    read += [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(i))), "objects") for i in inputs]
    status, out = run_contained(argv, read=read, timeout=params["timeout"] * 4 + 600)
    if out:
        from . import _write

        _write(out.decode("utf-8", "surrogateescape"), output, force)  # escaped and redacted by the analysis
    sys.exit(status)


def _analyze_batch(paths, skipped, options, jobs, as_json, output, force, journal=(), partial_input=False):
    from ..analyze.batch import analyze_many
    from ..views.signature import signature
    from ..text.analysis import format_batch
    from ..output import json_document, to_jsonable

    listed = [e for _store, crashes, _why in journal for e in crashes]
    unread = [(store, why) for store, _crashes, why in journal if why is not None]
    if not paths and not listed:
        e = ForensicsError("no cores or capture bundles found in the given directories"
                           + (f" ({len(skipped)} other files skipped, e.g. {skipped[0]})" if skipped else "")
                           + "".join(f"; {store}: systemd-coredump's journal not read ({why})"
                                     for store, why in unread))
        e.help_text = ("analyze DIR takes ELF core files (the kernel names them by kernel.core_pattern: cat "
                       "/proc/sys/kernel/core_pattern) and capture bundles (directories with a MANIFEST.json, as the "
                       "core handler keeps them under its directory's crashes/); a compressed core is one bundle's "
                       "core.zst, not a loose file")
        raise e
    for store, why in unread:  # one line: the crashes whose core systemd-coredump did not store are not listed
        warn(f"{store}: systemd-coredump's journal not read ({why}): crashes it kept no core of are not listed")
    show_bar = sys.stderr.isatty() and not as_json
    if show_bar:
        import click  # the progress bar of a batch on a terminal: the one use of click here

        with click.progressbar(length=len(paths), label="Analyzing cores", file=sys.stderr) as bar:
            result, entries = analyze_many(paths, jobs=jobs, progress=lambda e: bar.update(1), skipped=skipped,
                                           listed=listed, **options)
    else:
        result, entries = analyze_many(paths, jobs=jobs, skipped=skipped, listed=listed, **options)
    # the signatures name threads: their secrets are learned from each core's command line (not shown), the crashed
    # threads' frames are facts (a value equal to one is not masked there)
    seen = [{"args": e.analysis.snapshot.core.args, "signature": signature(e.analysis),
             "frames": [{"function": f.function} for t in e.analysis.snapshot.threads if t.is_crashed
                        for f in t.py_frames]
             + [{"symbol": f.symbol, "library": f.library} for t in e.analysis.snapshot.threads if t.is_crashed
                for f in t.native_frames]}
            for e in entries if e.analysis]
    if as_json:
        payload = {
            "batch": result,
            # what the batch found: its bugs (distinct fingerprints) and the previous definition's keys for them
            "found": {"bugs": result.bugs, "fingerprints_v3": result.fingerprints_v3, "sent_signals": len(result.sent)},
            "cores": [
                {
                    "path": e.path,
                    # a bundle's directory is named by its crash id (the core handler's index.jsonl "id")
                    "crash_id": os.path.basename(os.path.normpath(e.path)) if os.path.isdir(e.path) else None,
                    "mtime": e.mtime,
                    "error": e.error,
                    "fingerprint": e.analysis.fingerprint if e.analysis else None,
                    "fingerprint_v3": e.analysis.fingerprint_v3 if e.analysis else None,
                    "signature": signature(e.analysis) if e.analysis else None,
                    "complete": e.analysis.snapshot.is_complete if e.analysis else False,
                    "partial": e.partial,
                    "no_core": e.no_core,
                    # a core from systemd-coredump's store: its file, compression and journal fields (a crash its
                    # journal holds without a core: those fields, the crashed thread's stack, no_core why)
                    "store": to_jsonable(e.store or (e.analysis.store if e.analysis else None)),
                }
                for e in entries
            ],
        }
        emit_json(json_document("analyze-batch", payload, learn_from=seen), output, force)
    else:
        from ..redact import redact_lines

        emit(redact_lines(format_batch(result), seen), output, force)
    sys.exit(EXIT_FINDINGS if result.failed else EXIT_PARTIAL if result.partial or partial_input else EXIT_OK)


#: analyze's options, in the order --help lists them: click's command is made from this table
#: (:mod:`.analyze`), and :func:`parse_argv` reads the command line with it
OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(names=("--sysroot",), dest="sysroot", kind=Kind.PATH, file_okay=False, readable=False, common=True,
               help="Directory holding the crashed process's files at the paths the core names (an unpacked image, "
                    "/proc/PID/root)."),
    OptionSpec(names=("--exe",), dest="exe", kind=Kind.PATH, dir_okay=False, readable=False, common=True,
               help="The executable, when it is not at the path the core names."),
    OptionSpec(names=("--native",), dest="merged", kind=Kind.FLAG, common=True,
               help="Merged view: Python frames placed where their evaluation-loop native frames stand."),
    OptionSpec(names=("--method",), dest="method", kind=Kind.CHOICE, choices=StackMethod,
               default=StackMethod.AUTO.value, show_default=True,
               help="Python stacks, one walker; its struct layout from: direct (the core's _Py_DebugOffsets and the "
                    "table: no gdb, no debug symbols), gdb (CPython's DWARF, read by gdb), both (both layouts and "
                    "their stacks compared), auto (direct, gdb's DWARF layout as fallback)."),
    OptionSpec(names=("--native-method",), dest="native_method", kind=Kind.CHOICE, choices=NativeMethod,
               default=NativeMethod.AUTO.value, show_default=True,
               help="Native stacks: libdw (elfutils, no gdb; gdb only for a thread libdw cannot unwind), gdb, "
                    "both (compared frame for frame), none (program counters only), auto (libdw; none with "
                    "--method direct; gdb with --debuginfod)."),
    OptionSpec(names=("--gdb",), dest="gdb_path", kind=Kind.TEXT, default="gdb", show_default=True,
               help="gdb to run."),
    OptionSpec(names=("--debuginfod",), dest="debuginfod", kind=Kind.TEXT, metavar="URL",
               help="Let gdb fetch debug info from this debuginfod server (off by default)."),
    OptionSpec(names=("--timeout",), dest="timeout", kind=Kind.SECONDS, default=120.0, show_default=True,
               help="Seconds gdb may take per core."),
    OptionSpec(names=("--heap",), dest="heap", kind=Kind.FLAG,
               help="Walk glibc's heap whatever the crash: every arena, heap, bin and tcache (a heap-corruption "
                    "crash always gets the anatomy of the overflow; other crashes pay nothing without this)."),
    OptionSpec(names=("-j", "--jobs"), dest="jobs", kind=Kind.INT, default=0,
               help="Worker processes for several cores (0: one per CPU)."),
    OptionSpec(names=("--sandbox",), dest="sandbox", kind=Kind.FLAG,
               help="Analyze in a sandbox (bubblewrap's namespaces, no network, the inputs read-only, a seccomp "
                    "filter): for a core or bundle someone else made, analyzed as root."),
    OptionSpec(names=("--full-paths",), dest="full_paths", kind=Kind.FLAG,
               help="Name each Python frame's file by its whole path, as the process loaded it (path:line, what an "
                    "editor opens), not by its path below its sys.path entry."),
    *STORE, STORE_DEADLINE, JSON, OUTPUT, FORCE, VERBOSE,
)


def parse_argv(args: list[str]) -> dict | None:
    """``run()``'s keyword arguments for ``forensics analyze ARGS``, exactly as click would pass them; None for
    anything click should read itself (help, an unknown or repeated option, a bundled short option,
    ``--``, a missing input, a value click would refuse): :func:`forensics.argspec.parse_args` over
    :data:`OPTIONS`.

    >>> parse_argv(["--method", "direct", "--sysroot=/", "core"])["method"]
    'direct'
    >>> parse_argv(["--help"]) is None, parse_argv(["--method", "fast", "core"]) is None
    (True, True)
    """
    return parse_args(INPUT, OPTIONS, args)
