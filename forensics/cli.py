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
from .errors import EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL, ForensicsError
from .options import force_option, json_option, output_option, verbose_option
from .output import write_new

__all__ = ["main", "cli", "analyze", "report", "fleet", "guard", "canary", "reproduce", "demo"]


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
        except BrokenPipeError:
            # the reader went away (`forensics ... | head`): stop quietly, as a pipe tool should
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(141)
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
    write_new(output, text, force)
    click.echo(f"Wrote {output}", err=True)


@cli.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--sysroot", type=click.Path(file_okay=False), help="Directory holding the crashed process's files at the paths the core names (an unpacked image, /proc/PID/root).")
@click.option("--exe", type=click.Path(dir_okay=False), help="The executable, when it is not at the path the core names.")
@click.option("--native", "merged", is_flag=True, help="Merged view: Python frames placed where their evaluation-loop native frames stand.")
@click.option("--method", type=click.Choice(["auto", "gdb", "direct", "both"]), default="auto", show_default=True,
              help="Python stacks: direct (our reader: no gdb, no debug symbols), gdb (CPython debug symbols), "
                   "both (compared frame for frame), auto (native by gdb, Python by direct, gdb as fallback).")
@click.option("--gdb", "gdb_path", default="gdb", show_default=True, help="gdb to run.")
@click.option("--debuginfod", metavar="URL", default=None, help="Let gdb fetch debug info from this debuginfod server (off by default).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds gdb may take per core.")
@click.option("-j", "--jobs", type=int, default=0, help="Worker processes for several cores (0: one per CPU).")
@json_option
@output_option
@force_option
@verbose_option
def analyze(inputs, sysroot, exe, merged, method, gdb_path, debuginfod, timeout, jobs, as_json, output, force, verbose):
    """Analyze a core: signal, abort message, every thread's native and Python stack.

    INPUTS is one core or capture bundle, or several cores / bundles / directories of
    them (a core handler's directory) for batch triage: a table of distinct crashes by
    fingerprint.

    \b
    Exit codes: 0 analysed; 1 error (bad input, see the message); 2 usage;
    3 batch with unreadable cores; 4 partial result (no gdb, no Python
    stacks, a truncated core, or --method both found a disagreement).
    """
    from .analyze.batch import find_cores
    from .bundle import is_bundle

    paths = find_cores(inputs)
    single = len(inputs) == 1 and (not os.path.isdir(inputs[0]) or is_bundle(inputs[0]))
    options = dict(sysroot=sysroot, exe=exe, gdb=gdb_path, timeout=timeout, debuginfod=debuginfod, method=method)
    if single:
        from .analyze import analyze_core
        from .format import analysis_payload, format_analysis
        from .output import json_document

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
    from .analyze.signature import signature
    from .format import format_batch
    from .output import json_document

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
    from .output import json_document
    from .report import make_report

    rep = make_report(list(inputs), template=template, redact_hosts=redact_hosts, tool_version=version)
    attachment_path = None
    if rep.attachment is not None:
        base = output or f"forensics-report-{template}"
        attachment_path = f"{base}.full.md"
        write_new(attachment_path, rep.attachment, force)
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

    from .fleet import DEFAULT_GROUP_LABELS, format_fleet, read_kubectl, summarize_fleet
    from .output import json_document

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


@cli.command()
@click.option("--target", required=True, metavar="MODULE:ATTR", help="The callable to switch off, e.g. nvitop.api.device:Device.nvlink_throughput.")
@click.option("--returns", "returns", required=True, metavar="JSON", help="What it returns instead, as JSON, e.g. '[]'.")
@click.option("--env", "env", required=True, metavar="NAME", help="Environment switch: NAME=0 turns the guard off (it is on by default).")
@click.option("--removes", default=None, help="What the guard's start-up log line says is removed.")
@click.option("--out", "out_dir", default=".", show_default=True, type=click.Path(file_okay=False), help="Directory to write the guard into (site-packages, or an image layer's).")
@json_option
@force_option
def guard(target, returns, env, removes, out_dir, as_json, force):
    """Generate a startup guard (.pth + module) that makes one callable return a fixed value.

    \b
    Exit codes: 0 written; 1 error (bad target/JSON, files exist); 2 usage.
    """
    from .output import json_document
    from .guard import parse_target, write_guard

    spec = parse_target(target, returns, env, removes)
    written = write_guard(spec, out_dir, force=force)
    if as_json:
        click.echo(json_document("guard", {"guard": spec, "files": written}))
    else:
        for w in written:
            click.echo(f"Wrote {w}")
        click.echo(f"Drop both files into site-packages; {env}=0 turns the guard off.")
    sys.exit(EXIT_OK)


@cli.command()
@click.argument("url")
@click.option("--requests", "n_requests", type=int, default=1000, show_default=True, help="Scrapes to make (at most).")
@click.option("--concurrency", type=int, default=10, show_default=True, help="Scrapes in flight at once.")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Seconds the soak may run (at most).")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds one scrape may take.")
@click.option("--pid", type=int, default=None, help="Watch this local process for an exit and new cores in its cwd.")
@click.option("--pod", default=None, help="Watch this pod's restarts and exit codes through kubectl.")
@click.option("-n", "--namespace", default=None, help="Namespace of --pod.")
@click.option("--kubeconfig", default=None, help="kubeconfig for kubectl (with --pod).")
@click.option("--context", "kube_context", default=None, help="kubectl context (with --pod).")
@click.option("--core-dir", "core_dirs", multiple=True, type=click.Path(file_okay=False), help="Also watch this directory for new cores.")
@click.option("--min-success", type=float, default=1.0, show_default=True, help="Fail below this success rate.")
@click.option("--max-p99", type=float, default=None, metavar="MS", help="Fail when the p99 latency is above MS milliseconds.")
@click.option("--expect", multiple=True, metavar="FAMILY", help="Metric family that must be present (repeatable).")
@click.option("--fleet", "fleet_file", type=click.Path(exists=True, dir_okay=False), help="`forensics fleet --json` output: hint when the run is too short for the crash rate seen there.")
@json_option
@output_option
@force_option
def canary(url, n_requests, concurrency, duration, timeout, pid, pod, namespace, kubeconfig, kube_context, core_dirs,
           min_success, max_p99, expect, fleet_file, as_json, output, force):
    """Soak a Prometheus endpoint and pass or fail it: success, latency, format, families, crashes.

    \b
    Exit codes: 0 PASS; 1 error; 2 usage; 3 FAIL (a threshold was missed or the process crashed).
    """
    from .canary import Thresholds, canary_document, expected_crashes, run_canary

    if pid is not None and pod is not None:
        raise click.UsageError("--pid and --pod are exclusive")
    kube = dict(namespace=namespace, kubeconfig=kubeconfig, context=kube_context)
    before = _pod_state(pod, **kube) if pod else None
    result = run_canary(url, requests=n_requests, concurrency=concurrency, duration=duration, timeout=timeout,
                        pid=pid, core_dirs=tuple(core_dirs),
                        thresholds=Thresholds(min_success=min_success, max_p99=max_p99 / 1000 if max_p99 else None,
                                              expect=tuple(expect)))
    if pod:
        after = _pod_state(pod, **kube)
        if after["restarts"] > before["restarts"]:
            result.process_events.append(
                f"pod {pod} restarted {after['restarts'] - before['restarts']} times during the run "
                f"(last exit code {after['exit_code']}, {after['reason']})")
            from .canary import Thresholds as _T, judge
            judge(result, _T(min_success=min_success, max_p99=max_p99 / 1000 if max_p99 else None, expect=tuple(expect)))
    if fleet_file:
        exp = expected_crashes(_load_json(fleet_file), result.elapsed)
        if exp is not None:
            rate, n = exp
            if n < 3:
                need = 3 / rate * 3600 if rate else float("inf")
                result.hint = (f"the fleet crashes {rate:.2f} times per pod-hour; this {result.elapsed:.0f}s run expected "
                               f"{n:.2f} crashes of one pod: run at least {need / 60:.0f} minutes to expect 3")
    if as_json:
        _emit([canary_document(result)], output, force)
    else:
        _emit(_format_canary(result), output, force)
    sys.exit(EXIT_OK if result.verdict == "PASS" else EXIT_FINDINGS)


def _pod_state(pod: str, *, namespace: str | None, kubeconfig: str | None, context: str | None) -> dict:
    from .fleet import parse_pods, read_kubectl

    recs = parse_pods(read_kubectl(f"pod/{pod}", namespace=namespace, kubeconfig=kubeconfig, context=context))
    if not recs:
        raise ForensicsError(f"pod {pod} not found")
    r = recs[0]
    return {"restarts": r.restarts, "exit_code": r.last_exit_code, "reason": r.last_reason}


def _format_canary(r) -> list[str]:
    def ms(x):
        return "-" if x is None else f"{x * 1000:.1f} ms"

    lines = [
        f"{r.verdict}: {r.url}: {r.requests} scrapes in {r.elapsed:.1f}s ({r.rate:.0f}/s, concurrency {r.concurrency}), "
        f"success {r.success_rate:.2%}",
        f"latency p50 {ms(r.percentile(50))}, p95 {ms(r.percentile(95))}, p99 {ms(r.percentile(99))}, "
        f"max {ms(max(r.latencies) if r.latencies else None)}",
        f"body {r.body_min}-{r.body_max} bytes; {r.parsed_bodies} distinct bodies parsed, {r.invalid_bodies} invalid; "
        f"{len(r.families)} metric families",
    ]
    if r.errors:
        lines.append("errors: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())))
    if r.nan_samples:
        lines.append("NaN samples: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.nan_samples.items())))
    for reason in r.reasons:
        lines.append(f"FAIL because {reason}")
    if r.hint:
        lines.append(f"hint: {r.hint}")
    return lines


@cli.command()
@click.option("--nvml", "nvml_path", type=click.Path(), default=None, help="libnvidia-ml.so.1 to use (a file or its directory); default: the loader's.")
@click.option("--sim", is_flag=True, help="Use the simulated NVML (built from reproducers/simnvml).")
@click.option("--sim-fault", type=click.Choice(["none", "heap", "heap-delayed", "segv", "use-after-shutdown"]), default="none", show_default=True)
@click.option("--sim-fault-after", type=int, default=0, show_default=True, help="Field-value calls that succeed before the fault.")
@click.option("--sim-heap-message", type=click.Choice(["prev", "next-size"]), default="prev", show_default=True)
@click.option("--sim-fault-thread", type=click.Choice(["any", "non-main"]), default="any", show_default=True)
@click.option("--python", "python_path", default=None, help="Interpreter with nvidia-ml-py for the Python reproducer.")
@click.option("--stack", type=click.Choice(["incident", "current"]), default="current", show_default=True,
              help="Without --python: a cached venv with this PyPI stack (incident: nvitop 1.5.0 + nvidia-ml-py 12.575.51).")
@click.option("--iterations", type=int, default=1000, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True, help="Querying threads of the Python reproducer (0: main thread).")
@click.option("--duration", type=float, default=None, help="Stop each reproducer after S seconds.")
@click.option("--shutdown-race", is_flag=True, help="Call nvmlShutdown while threads still query (Python reproducer).")
@click.option("--malloc-check", is_flag=True, help="Both reproducers under glibc's checking allocator: they stop at the culprit call.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Where runs go (default: ./forensics-reproduce).")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds each reproducer may run.")
@json_option
@output_option
@force_option
def reproduce(nvml_path, sim, sim_fault, sim_fault_after, sim_heap_message, sim_fault_thread, python_path, stack,
              iterations, threads, duration, shutdown_race, malloc_check, workdir, timeout, as_json, output, force):
    """Run the Python and the C NVML reproducers with cores on, and say which crashed.

    \b
    Exit codes: 0 neither failed; 1 error, or a reproducer could not start (no
    libnvidia-ml.so.1 to load: use --nvml FILE or --sim); 2 usage; 3 at least one
    reproducer crashed or detected heap corruption.
    """
    from pathlib import Path

    from .output import json_document
    from .reproduce import ReproducerNotStarted, nvml_dir_for, reproduce_payload, run_reproducers
    from .simnvml import build_simnvml, ensure_stack_venv, sim_environment

    if nvml_path and sim:
        raise click.UsageError("--nvml and --sim are exclusive")
    wd = Path(workdir or "forensics-reproduce").resolve()
    wd.mkdir(parents=True, exist_ok=True)
    env = None
    sim_settings = {}
    if sim:
        lib_dir = build_simnvml(wd / "simnvml")
        env = sim_environment(lib_dir, fault=sim_fault, fault_after=sim_fault_after, heap_message=sim_heap_message,
                              fault_thread=sim_fault_thread)
        nvml_dir = None  # sim_environment already put it first on LD_LIBRARY_PATH
        sim_settings = {k: v for k, v in env.items() if k.startswith("FORENSICS_SIMNVML_")}
        nvml_label = str(lib_dir)
    else:
        nvml_dir = nvml_dir_for(nvml_path, wd) if nvml_path else None
        nvml_label = nvml_dir
    python = python_path or str(ensure_stack_venv(stack))
    result = run_reproducers(workdir=wd, python=python, nvml_dir=nvml_dir, env=env, iterations=iterations,
                             threads=threads, duration=duration, shutdown_race=shutdown_race,
                             malloc_check=malloc_check, timeout=timeout, sim=sim_settings)
    if sim:
        import dataclasses

        result = dataclasses.replace(result, nvml=nvml_label)
    if as_json:
        payload = reproduce_payload(result)
        _emit([json_document("reproduce", payload)], output, force)
    else:
        lines = []
        for r in result.runs:
            lines.append(f"{r.name:>6}: {r.outcome} in {r.seconds:.1f}s  ({r.run_dir})")
            if r.verdict and r.verdict != r.outcome:
                lines.append(f"        VERDICT: {r.verdict}")
            if r.signature:
                lines.append(f"        core {r.core}: {r.signature}")
            elif r.core_note:
                lines.append(f"        {r.core_note}")
        h = result.environment
        if h.get("driver"):
            lines.insert(0, f"NVML {h.get('nvml', '?')}, driver {h.get('driver', '?')}, {h.get('gpu', '?')} "
                            f"({h.get('libnvidia-ml', nvml_label or 'loader default')})")
        lines.append(f"conclusion: {result.conclusion}")
        _emit(lines, output, force)
    if result.not_started:
        raise ReproducerNotStarted([f"the {'Python' if r.name == 'python' else 'C'} reproducer {r.outcome}"
                                    for r in result.not_started])
    sys.exit(EXIT_FINDINGS if any(r.failed for r in result.runs) else EXIT_OK)


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory (empty or absent); default: a new one under ./forensics-demo.")
@click.option("--work", type=click.Path(file_okay=False), default=None, help="Scratch directory (default: OUT/work).")
@click.option("--fault-after", type=int, default=40, show_default=True, help="NVLink queries before the heap corruption.")
@click.option("--no-reproduce", is_flag=True, help="Skip running the minimal reproducers.")
@json_option
def demo(out, work, fault_after, no_reproduce, as_json):
    """The incident end to end: real nvitop-exporter on a simulated 8-GPU node crashes; forensics takes it apart.

    \b
    Exit codes: 0 the crash was caught and analysed; 1 error; 3 the crash was caught but
    the NVLink query is not on the crashing Python stack.
    """
    from .demo import run_demo
    from .output import json_document

    result = run_demo(out=out, work=work, fault_after=fault_after, reproduce=not no_reproduce,
                      log=(lambda s: click.echo(s, err=True)) if as_json else click.echo)
    if as_json:
        click.echo(json_document("demo", {"demo": result}))
    else:
        click.echo("")
        click.echo("Wrote:")
        for what, path in result.files.items():
            click.echo(f"  {what:<34} {path}")
    sys.exit(EXIT_OK if result.ok else EXIT_FINDINGS)


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


def _register_subpackage_commands() -> None:
    from .capture.cli_commands import agent_group, capture_command, core_handler_command
    from .imports.cli_command import verify_imports_command

    for command in (capture_command, core_handler_command, agent_group, verify_imports_command):
        cli.add_command(command)


_register_subpackage_commands()


def main() -> None:
    cli(prog_name="forensics")


if __name__ == "__main__":
    main()
