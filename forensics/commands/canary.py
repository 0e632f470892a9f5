"""forensics canary: soak a Prometheus endpoint and pass or fail it."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK
from ..options import FrontDoor, SECONDS, force_option, json_option, output_option
from . import emit, emit_json, read_json_object

__all__ = ["canary"]


@click.command("canary", cls=FrontDoor,
               common=("interval", "duration", "pid", "pod", "namespace", "fleet_file", "as_json"))
@click.argument("url")
@click.option("--requests", "n_requests", type=int, default=None,
              help="Scrapes to make at most (default: as many as --duration allows).")
@click.option("--interval", type=float, default=15.0, show_default=True, metavar="SECONDS",
              help="Seconds between the starts of one scraper's scrapes, as Prometheus' scrape_interval "
                   "(0: as fast as the target answers, a load test).")
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="Scrapers at once (Prometheus: one per target and server).")
@click.option("--duration", type=SECONDS, default=60.0, show_default=True,
              help="Seconds the soak runs (less when --requests are made first, or the watched process dies).")
@click.option("--timeout", type=SECONDS, default=None,
              help="Seconds one scrape may take, at most --interval, as Prometheus' scrape_timeout (default: 10, or "
                   "--interval when shorter, as Prometheus lowers an unset scrape_timeout).")
@click.option("--ca-file", type=click.Path(dir_okay=False), default=None, help="With https: the CA of the server.")
@click.option("--insecure-skip-verify", is_flag=True, help="With https: do not verify the server's certificate.")
@click.option("--bearer-token-file", type=click.Path(dir_okay=False), default=None,
              help="Send the token in this file (Prometheus' authorization.credentials_file); to the URL's origin "
                   "only, redirects are not followed.")
@click.option("--pid", type=int, default=None, help="Watch this local process for an exit and new cores in its cwd.")
@click.option("--pod", default=None, help="Watch this pod's restarts and exit codes through kubectl.")
@click.option("-n", "--namespace", default=None, help="Namespace of --pod.")
@click.option("--kubeconfig", default=None, help="kubeconfig for kubectl (with --pod).")
@click.option("--context", "kube_context", default=None, help="kubectl context (with --pod).")
@click.option("--core-dir", "core_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Also watch this directory for new cores.")
@click.option("--min-success", type=float, default=1.0, show_default=True, help="Fail below this success rate.")
@click.option("--max-p99", type=float, default=None, metavar="MS",
              help="Fail when the p99 latency is above MS milliseconds.")
@click.option("--expect", multiple=True, metavar="FAMILY", help="Metric family that must be present (repeatable).")
@click.option("--fleet", "fleet_file", type=click.Path(exists=True, dir_okay=False),
              help="`forensics fleet --json` output: hint when the run is too short for the crash rate seen there.")
@json_option
@output_option
@force_option
def canary(url, n_requests, interval, concurrency, duration, timeout, ca_file, insecure_skip_verify,
           bearer_token_file, pid, pod, namespace, kubeconfig, kube_context, core_dirs,
           min_success, max_p99, expect, fleet_file, as_json, output, force):
    """Soak a Prometheus endpoint and pass or fail it: success, latency, format, families, crashes.

    \b
    Exit codes: 0 PASS; 1 error; 2 usage; 3 FAIL (a threshold was missed or the process crashed);
    130 interrupted (Ctrl-C: the summary of the scrapes made so far is printed first).
    """
    from ..canary import (MAX_REQUESTS, PodWatch, ScrapeOptions, Thresholds, canary_document, fleet_hint,
                          read_pod_state, run_canary, scrape_timeout)
    from ..kubectl import KubeOptions
    from ..text.canary import format_canary

    if pid is not None and pod is not None:
        raise click.UsageError("--pid and --pod are exclusive")
    kube = KubeOptions(namespace=namespace, kubeconfig=kubeconfig, context=kube_context)
    pod_watch = PodWatch(pod, lambda: read_pod_state(pod, kube)) if pod else None
    result = run_canary(url, requests=MAX_REQUESTS if n_requests is None else n_requests, concurrency=concurrency,
                        duration=duration, timeout=scrape_timeout(interval, timeout),
                        pid=pid, core_dirs=tuple(core_dirs), pod_watch=pod_watch,
                        thresholds=Thresholds(min_success=min_success, max_p99=max_p99 / 1000 if max_p99 else None,
                                              expect=tuple(expect)),
                        scrape=ScrapeOptions(interval=interval, ca_file=ca_file,
                                             insecure_skip_verify=insecure_skip_verify,
                                             bearer_token_file=bearer_token_file))
    if fleet_file:
        result.hint = fleet_hint(read_json_object(fleet_file), result.elapsed)
    if as_json:
        emit_json(canary_document(result), output, force)
    else:
        emit(format_canary(result), output, force)
    sys.exit(EXIT_INTERRUPTED if result.interrupted else EXIT_OK if result.verdict == "PASS" else EXIT_FINDINGS)
