"""forensics analyze: one core or bundle in detail, or many cores folded into distinct crashes."""
from __future__ import annotations

import click

from ..options import force_option, json_option, output_option, store_options, verbose_option
from .analyze_run import METHOD_CHOICES, NATIVE_METHOD_CHOICES, run

__all__ = ["analyze"]


@click.command("analyze")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--sysroot", type=click.Path(file_okay=False, readable=False),
              help="Directory holding the crashed process's files at the paths the core names (an unpacked image, "
                   "/proc/PID/root).")
@click.option("--exe", type=click.Path(dir_okay=False, readable=False),
              help="The executable, when it is not at the path the core names.")
@click.option("--native", "merged", is_flag=True,
              help="Merged view: Python frames placed where their evaluation-loop native frames stand.")
@click.option("--method", type=click.Choice(METHOD_CHOICES), default="auto", show_default=True,
              help="Python stacks, one walker; its struct layout from: direct (the core's _Py_DebugOffsets and the "
                   "table: no gdb, no debug symbols), gdb (CPython's DWARF, read by gdb), both (both layouts and "
                   "their stacks compared), auto (direct, gdb's DWARF layout as fallback).")
@click.option("--native-method", type=click.Choice(NATIVE_METHOD_CHOICES), default="auto",
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
@store_options
@json_option
@output_option
@force_option
@verbose_option
def analyze(inputs, sysroot, exe, merged, method, native_method, gdb_path, debuginfod, timeout, heap, jobs, as_json,
            output, force, verbose, endpoint_url, region, profile):
    """Analyze a core: signal, abort message, every thread's native and Python stack.

    INPUTS is one core or capture bundle, or several cores / bundles / directories of
    them (a core handler's directory) for batch triage: a table of distinct crashes by
    fingerprint.  An s3://BUCKET/KEY input is a bundle, a core or a prefix of bundles (a
    batch) in a bucket, fetched into the forensics cache first.

    \b
    Exit codes: 0 analysed; 1 error (bad input, see the message; a bundle
    that kept no core); 2 usage; 3 batch with unreadable cores; 4 partial
    result (no native unwinder, no Python stacks, a truncated core, or
    --method / --native-method both found a disagreement; in a batch: any
    core's analysis partial).
    """
    run(inputs, sysroot=sysroot, exe=exe, merged=merged, method=method, native_method=native_method,
        gdb_path=gdb_path, debuginfod=debuginfod, timeout=timeout, heap=heap, jobs=jobs, as_json=as_json,
        output=output, force=force, verbose=verbose, endpoint_url=endpoint_url,
        region=region, profile=profile)
