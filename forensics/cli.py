"""The ``forensics`` command line: the only module that prints, prompts or exits.

Each command checks its arguments, calls one library function and renders the
result.  A :class:`~forensics.errors.ForensicsError` becomes one line on stderr
(plus its fix) and its exit code; no traceback reaches the user.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable

import click

from . import __version__
from .errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, ForensicsError, OutputExists
from .options import force_option, json_option, output_option, verbose_option

__all__ = ["main", "cli", "analyze", "report", "fleet"]


class _Group(click.Group):
    """Turns ForensicsError (and unexpected errors) into one line and an exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ForensicsError as e:
            click.echo(f"forensics: error: {e}", err=True)
            if e.help_text:
                click.echo(f"forensics: hint: {e.help_text}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("forensics: interrupted", err=True)
            ctx.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback for users
            if os.environ.get("FORENSICS_DEBUG"):
                raise
            click.echo(f"forensics: internal error: {type(e).__name__}: {e} (set FORENSICS_DEBUG=1 for details)",
                       err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="forensics")
def cli() -> None:
    """Crash forensics for native-heap failures in Python processes."""


def _emit(lines: Iterable[str], output: str | None, force: bool) -> None:
    text = "\n".join(lines) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    _write_new(output, text, force)
    click.echo(f"Wrote {output}", err=True)


def _write_new(path: str, text: str, force: bool) -> None:
    """Write a file; without ``force`` never replace an existing one (O_EXCL, no race)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError as e:
        raise OutputExists(path) from e
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--sysroot", type=click.Path(file_okay=False), help="Directory holding the crashed process's files at the paths the core names (an unpacked image, /proc/PID/root).")
@click.option("--exe", type=click.Path(dir_okay=False), help="The executable, when it is not at the path the core names.")
@click.option("--native", "merged", is_flag=True, help="Merged view: Python frames placed where their evaluation-loop native frames stand.")
@click.option("--gdb", "gdb_path", default="gdb", show_default=True, help="gdb to run.")
@click.option("--debuginfod", metavar="URL", default=None, help="Let gdb fetch debug info from this debuginfod server (off by default).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds gdb may take per core.")
@click.option("-j", "--jobs", type=int, default=0, help="Worker processes for several cores (0: one per CPU).")
@json_option
@output_option
@force_option
@verbose_option
def analyze(inputs, sysroot, exe, merged, gdb_path, debuginfod, timeout, jobs, as_json, output, force, verbose):
    """Analyze a core: signal, abort message, every thread's native and Python stack.

    INPUTS is one core, or several cores / directories of cores for batch triage
    (a table of distinct crashes by fingerprint).

    \b
    Exit codes: 0 analysed; 1 error (bad input, see the message); 2 usage;
    3 batch with unreadable cores; 4 partial result (no gdb, no CPython
    debug symbols, or a truncated core).
    """
    from .analyze.batch import find_cores

    paths = find_cores(inputs)
    single = len(inputs) == 1 and not os.path.isdir(inputs[0])
    options = dict(sysroot=sysroot, exe=exe, gdb=gdb_path, timeout=timeout, debuginfod=debuginfod)
    if single:
        from .analyze import analyze_core
        from .format import analysis_payload, format_analysis, json_document

        analysis = analyze_core(paths[0], **options)
        for w in analysis.snapshot.warnings:
            if verbose or as_json or output:
                click.echo(f"forensics: warning: {w}", err=True)
        if as_json:
            _emit([json_document("analyze", {"analysis": analysis_payload(analysis, merged=merged)})], output, force)
        else:
            _emit(format_analysis(analysis, merged=merged), output, force)
        sys.exit(EXIT_OK if analysis.snapshot.is_complete else EXIT_PARTIAL)
    _analyze_batch(paths, options, jobs, as_json, output, force)


def _analyze_batch(paths, options, jobs, as_json, output, force):
    from .analyze.batch import analyze_many
    from .format import format_batch, json_document, signature

    if not paths:
        raise ForensicsError("no core files found in the given directories")
    show_bar = sys.stderr.isatty() and not as_json
    if show_bar:
        with click.progressbar(length=len(paths), label="Analyzing cores", file=sys.stderr) as bar:
            result, entries = analyze_many(paths, jobs=jobs, progress=lambda e: bar.update(1), **options)
    else:
        result, entries = analyze_many(paths, jobs=jobs, **options)
    if as_json:
        payload = {
            "batch": result,
            "cores": [
                {
                    "path": e.path,
                    "mtime": e.mtime,
                    "error": e.error,
                    "fingerprint": e.analysis.fingerprint if e.analysis else None,
                    "signature": signature(e.analysis) if e.analysis else None,
                    "complete": e.analysis.snapshot.is_complete if e.analysis else False,
                }
                for e in entries
            ],
        }
        _emit([json_document("analyze-batch", payload)], output, force)
    else:
        _emit(format_batch(result), output, force)
    sys.exit(EXIT_FINDINGS if result.failed else EXIT_OK)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--template", type=click.Choice(["nvitop", "nvml", "runbook"]), default="nvitop", show_default=True,
              help="nvitop: a GitHub issue for nvitop/nvitop-exporter; nvml: a report for NVIDIA; runbook: an incident record.")
@click.option("--redact-hosts", is_flag=True, help="Also replace host names, IPs, node and pod names (consistently: node-1, node-2...).")
@click.option("--check", is_flag=True, help="Exit 3 when a required field is unfilled or the Markdown would render wrong.")
@json_option
@output_option
@force_option
def report(inputs, template, redact_hosts, check, as_json, output, force):
    """Write an upstream-ready defect report (Markdown) from forensics evidence.

    INPUTS: any mix of `analyze --json`, `verify-imports --json`, `reproduce --json` and
    `fleet --json` documents and capture bundle directories. Secrets are always redacted.

    \b
    Exit codes: 0 written; 1 error; 2 usage; 3 --check found problems.
    """
    from . import __version__ as version
    from .format import json_document
    from .report import make_report

    rep = make_report(list(inputs), template=template, redact_hosts=redact_hosts, tool_version=version,
                      reproducer_sources=_reproducer_sources())
    attachment_path = None
    if rep.attachment is not None:
        base = output or f"forensics-report-{template}"
        attachment_path = f"{base}.full.md"
        _write_new(attachment_path, rep.attachment, force)
        click.echo(f"Wrote {attachment_path} (the whole report; the issue body is shortened)", err=True)
    if as_json:
        payload = {"report": {"template": template, "title": rep.context.title, "markdown": rep.markdown,
                              "attachment": attachment_path, "problems": list(rep.problems),
                              "missing_fields": rep.context.missing, "redactions": rep.context.redactions,
                              "known_issues": rep.context.known_issues}}
        _emit([json_document("report", payload)], output, force)
    else:
        _emit([rep.markdown.rstrip("\n")], output, force)
    for p in rep.problems:
        click.echo(f"forensics: check: {p}", err=True)
    sys.exit(EXIT_FINDINGS if check and rep.problems else EXIT_OK)


@cli.command()
@click.option("-n", "--namespace", default=None, help="Namespace of the pods (default: all namespaces).")
@click.option("-l", "--selector", default=None, help="Label selector of the pods, e.g. app=nvitop-exporter.")
@click.option("--group-by", "group_by", multiple=True, metavar="LABEL",
              help="Node label to group by (repeatable; default: GPU product and driver version, else instance type).")
@click.option("--from", "pods_file", type=click.Path(exists=True, dir_okay=False), help="Saved `kubectl get pods -o json`.")
@click.option("--nodes", "nodes_file", type=click.Path(exists=True, dir_okay=False), help="Saved `kubectl get nodes -o json`.")
@click.option("--since", default=None, metavar="TIME|SNAPSHOT",
              help="Count restarts since an ISO time, or since a saved `forensics fleet --json` snapshot.")
@click.option("--kubeconfig", default=None, help="kubeconfig for kubectl.")
@click.option("--context", "kube_context", default=None, help="kubectl context.")
@json_option
@output_option
@force_option
def fleet(namespace, selector, group_by, pods_file, nodes_file, since, kubeconfig, kube_context, as_json, output, force):
    """Cross-compare restarts and exit codes of pods by node group, and name the boundary.

    \b
    Exit codes: 0 printed; 1 error (kubectl failed, bad input); 2 usage.
    """
    import datetime as dt
    import json as _json

    from .fleet import DEFAULT_GROUP_LABELS, format_fleet, read_kubectl, summarize_fleet
    from .format import json_document

    if bool(pods_file) != bool(nodes_file):
        raise click.UsageError("--from and --nodes go together")
    if pods_file:
        pods_doc, nodes_doc = _load_json(pods_file), _load_json(nodes_file)
    else:
        kw = dict(kubeconfig=kubeconfig, context=kube_context)
        pods_doc = read_kubectl("pods", namespace=namespace, selector=selector, **kw)
        nodes_doc = read_kubectl("nodes", **kw)
    baseline = since_time = None
    if since:
        if os.path.isfile(since):
            baseline = _load_json(since)
            if baseline.get("command") != "fleet":
                raise ForensicsError(f"{since}: not a `forensics fleet --json` snapshot")
        else:
            try:
                since_time = dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
            except ValueError as e:
                raise click.BadParameter(f"{since!r} is neither a file nor an ISO time", param_hint="--since") from e
            if since_time.tzinfo is None:
                since_time = since_time.replace(tzinfo=dt.timezone.utc)
    summary = summarize_fleet(pods_doc, nodes_doc, group_by=tuple(group_by) or DEFAULT_GROUP_LABELS,
                              baseline=baseline, since=since_time)
    if as_json:
        _emit([json_document("fleet", {"fleet": summary})], output, force)
    else:
        _emit(format_fleet(summary), output, force)
    sys.exit(EXIT_OK)


def _load_json(path: str) -> dict:
    import json as _json

    try:
        with open(path, "rb") as f:
            doc = _json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ForensicsError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ForensicsError(f"{path}: expected a JSON object")
    return doc


def _reproducer_sources() -> dict[str, str] | None:
    try:
        from .simnvml import find_reproducers
    except ImportError:
        return None
    try:
        root = find_reproducers()
    except ForensicsError:
        return None
    out = {}
    for lang, name in (("python", "nvml_nvlink_fieldvalues.py"), ("c", "nvml_nvlink_fieldvalues.c")):
        f = root / name
        if f.is_file():
            out[lang] = f.read_text(errors="replace")[:200_000]
    return out or None


def main() -> None:
    cli(prog_name="forensics")


if __name__ == "__main__":
    main()
