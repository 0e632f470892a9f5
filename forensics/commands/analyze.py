"""forensics analyze: one core or bundle in detail, or many cores folded into distinct crashes."""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, ForensicsError
from ..options import force_option, json_option, output_option, verbose_option
from . import emit, emit_json, warn

__all__ = ["analyze"]


@click.command("analyze")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--sysroot", type=click.Path(file_okay=False),
              help="Directory holding the crashed process's files at the paths the core names (an unpacked image, "
                   "/proc/PID/root).")
@click.option("--exe", type=click.Path(dir_okay=False),
              help="The executable, when it is not at the path the core names.")
@click.option("--native", "merged", is_flag=True,
              help="Merged view: Python frames placed where their evaluation-loop native frames stand.")
@click.option("--method", type=click.Choice(["auto", "gdb", "direct", "both"]), default="auto", show_default=True,
              help="Python stacks, one walker; its struct layout from: direct (the core's _Py_DebugOffsets and the "
                   "table: no gdb, no debug symbols), gdb (CPython's DWARF, read by gdb), both (both layouts and "
                   "their stacks compared), auto (direct, gdb's DWARF layout as fallback).")
@click.option("--native-method", type=click.Choice(["auto", "libdw", "gdb", "both", "none"]), default="auto",
              show_default=True,
              help="Native stacks: libdw (elfutils, no gdb; gdb only for a thread libdw cannot unwind), gdb, "
                   "both (compared frame for frame), none (program counters only), auto (libdw; none with "
                   "--method direct; gdb with --debuginfod).")
@click.option("--gdb", "gdb_path", default="gdb", show_default=True, help="gdb to run.")
@click.option("--debuginfod", metavar="URL", default=None,
              help="Let gdb fetch debug info from this debuginfod server (off by default).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds gdb may take per core.")
@click.option("--heap", "heap", is_flag=True,
              help="Walk glibc's heap whatever the crash: every arena, heap, bin and tcache (a heap-corruption "
                   "crash always gets the anatomy of the overflow; other crashes pay nothing without this).")
@click.option("-j", "--jobs", type=int, default=0, help="Worker processes for several cores (0: one per CPU).")
@json_option
@output_option
@force_option
@verbose_option
def analyze(inputs, sysroot, exe, merged, method, native_method, gdb_path, debuginfod, timeout, heap, jobs, as_json,
            output, force, verbose):
    """Analyze a core: signal, abort message, every thread's native and Python stack.

    INPUTS is one core or capture bundle, or several cores / bundles / directories of
    them (a core handler's directory) for batch triage: a table of distinct crashes by
    fingerprint.

    \b
    Exit codes: 0 analysed; 1 error (bad input, see the message; a bundle
    that kept no core); 2 usage; 3 batch with unreadable cores; 4 partial
    result (no native unwinder, no Python stacks, a truncated core, or
    --method / --native-method both found a disagreement; in a batch: any
    core's analysis partial).
    """
    from ..analyze.batch import find_cores
    from ..bundle import has_manifest

    paths, skipped = find_cores(inputs)
    single = len(inputs) == 1 and (not os.path.isdir(inputs[0]) or has_manifest(inputs[0]))
    options = dict(sysroot=sysroot, exe=exe, gdb=gdb_path, timeout=timeout, debuginfod=debuginfod, method=method,
                   native_method=native_method, heap="full" if heap else "auto")
    if single:
        from ..analyze import analyze_core
        from ..format import analysis_payload
        from ..text.analysis import format_analysis
        from ..output import json_document

        analysis = analyze_core(paths[0], **options)
        for w in analysis.snapshot.warnings:
            if verbose or as_json or output:
                warn(w)
        if as_json:
            emit_json(json_document("analyze", {"analysis": analysis_payload(analysis, merged=merged)}), output, force)
        else:
            emit(format_analysis(analysis, merged=merged), output, force)
        sys.exit(EXIT_OK if analysis.snapshot.is_complete else EXIT_PARTIAL)
    options["heap"] = "full" if heap else "off"  # a fingerprint table shows no heap
    _analyze_batch(paths, skipped, options, jobs, as_json, output, force)


def _analyze_batch(paths, skipped, options, jobs, as_json, output, force):
    from ..analyze.batch import analyze_many
    from ..analyze.signature import signature
    from ..text.analysis import format_batch
    from ..output import json_document

    if not paths:
        raise ForensicsError("no cores or capture bundles found in the given directories"
                             + (f" ({len(skipped)} other files skipped, e.g. {skipped[0]})" if skipped else ""))
    show_bar = sys.stderr.isatty() and not as_json
    if show_bar:
        with click.progressbar(length=len(paths), label="Analyzing cores", file=sys.stderr) as bar:
            result, entries = analyze_many(paths, jobs=jobs, progress=lambda e: bar.update(1), skipped=skipped,
                                           **options)
    else:
        result, entries = analyze_many(paths, jobs=jobs, skipped=skipped, **options)
    if as_json:
        payload = {
            "batch": result,
            "cores": [
                {
                    "path": e.path,
                    # a bundle's directory is named by its crash id (the core handler's index.jsonl "id")
                    "crash_id": os.path.basename(os.path.normpath(e.path)) if os.path.isdir(e.path) else None,
                    "mtime": e.mtime,
                    "error": e.error,
                    "fingerprint": e.analysis.fingerprint if e.analysis else None,
                    "signature": signature(e.analysis) if e.analysis else None,
                    "complete": e.analysis.snapshot.is_complete if e.analysis else False,
                    "partial": e.partial,
                    "no_core": e.no_core,
                }
                for e in entries
            ],
        }
        emit_json(json_document("analyze-batch", payload), output, force)
    else:
        emit(format_batch(result), output, force)
    sys.exit(EXIT_FINDINGS if result.failed else EXIT_PARTIAL if result.partial else EXIT_OK)
