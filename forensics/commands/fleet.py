"""forensics fleet: restarts and exit codes of pods compared by node group."""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_OK, EXIT_PARTIAL, ForensicsError, PrometheusError
from ..options import FrontDoor, force_option, json_option, output_option, store_options
from . import emit, emit_json, read_json_object, warn

__all__ = ["fleet"]


@click.command("fleet", cls=FrontDoor,
               common=("namespace", "selector", "prometheus", "bundle_sources", "as_json", "output"))
@click.option("-n", "--namespace", default=None, help="Namespace of the pods (default: all namespaces).")
@click.option("-l", "--selector", default=None, help="Label selector of the pods, e.g. app=nvitop-exporter.")
@click.option("--group-by", "group_by", multiple=True, metavar="LABEL",
              help="Node label to group by (repeatable; default: GPU product and driver version, else instance type).")
@click.option("--from", "pods_file", type=click.Path(exists=True, dir_okay=False),
              help="Saved `kubectl get pods -o json`.")
@click.option("--nodes", "nodes_file", type=click.Path(exists=True, dir_okay=False),
              help="Saved `kubectl get nodes -o json`.")
@click.option("--since", default=None, metavar="TIME|SNAPSHOT",
              help="Count restarts since an ISO time, or since a saved `forensics fleet --json` snapshot.")
@click.option("--prometheus", "prometheus", default=None, metavar="URL",
              help="Build the table from Prometheus (kube-state-metrics and the agents' crash series) instead of pod "
                   "objects.")
@click.option("--window", default=None, metavar="DURATION",
              help="With --prometheus: restarts and crashes over the last DURATION (6h, 90m).")
@click.option("--bearer-token-file", type=click.Path(dir_okay=False), default=None,
              help="With --prometheus: bearer token.")
@click.option("--basic-auth", default=None, metavar="USER:PASSWORD", envvar="FORENSICS_PROMETHEUS_BASIC_AUTH",
              help="With --prometheus: basic auth (or FORENSICS_PROMETHEUS_BASIC_AUTH, kept out of the process list).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --prometheus: CA for https.")
@click.option("--deadline", type=click.FloatRange(1, 86400), default=None, metavar="SECONDS",
              help="Seconds all the requests to Prometheus (default 60), or to the object store of s3:// --bundles "
                   "(default 3600), may take together.")
@click.option("--bundles", "bundle_sources", multiple=True, metavar="DIR|BUNDLE|s3://PREFIX",
              help="Crash bundles to count by fingerprint in each group, naming where each fingerprint's newest "
                   "bundle lives: a core directory, one crash bundle, or an s3:// prefix of uploaded bundles "
                   "(repeatable; not with --prometheus, whose agents' series say it).")
@store_options
@click.option("--kubeconfig", default=None, help="kubeconfig for kubectl.")
@click.option("--context", "kube_context", default=None, help="kubectl context.")
@json_option
@output_option
@force_option
def fleet(namespace, selector, group_by, pods_file, nodes_file, since, prometheus, window, bearer_token_file,
          basic_auth, ca_file, deadline, bundle_sources, endpoint_url, region, profile, kubeconfig, kube_context,
          as_json, output, force):
    """Cross-compare restarts and exit codes of pods by node group, and name the boundary.

    \b
    \b
    forensics fleet -n monitoring -l app=nvitop-exporter
    forensics fleet --from pods.json --nodes nodes.json
    forensics fleet --from pods.json --nodes nodes.json --bundles s3://crash-bundles/fleet
    forensics fleet --prometheus http://prometheus:9090 --window 6h [--bearer-token-file F] [--deadline S]

    \b
    Exit codes: 0 printed; 1 error (kubectl or Prometheus failed, bad input: files swapped, no pods,
    no nodes); 2 usage (with --prometheus: a -l selector PromQL cannot ask exactly); 4 printed, but
    s3:// --bundles were read in part (a listing cut short, a record late or malformed: one warning each).
    """

    from ..fleet import DEFAULT_GROUP_LABELS, check_documents, read_kubectl, summarize_fleet
    from ..text.fleet import format_fleet
    from ..output import json_document

    if bool(pods_file) != bool(nodes_file):
        raise click.UsageError("--from and --nodes go together")
    if prometheus:
        if pods_file:
            raise click.UsageError("--prometheus and --from are exclusive")
        if bundle_sources:
            raise click.UsageError("--prometheus and --bundles are exclusive (the agents' series name the bundles)")
        _fleet_prometheus(prometheus, window, since, bearer_token_file, basic_auth, ca_file, deadline, namespace,
                          selector, tuple(group_by) or DEFAULT_GROUP_LABELS, as_json, output, force)
        return
    if window or bearer_token_file or basic_auth or ca_file:
        raise click.UsageError("--window, --bearer-token-file, --basic-auth and --ca-file go with --prometheus")
    if deadline and not any(b.startswith("s3://") for b in bundle_sources):
        raise click.UsageError("--deadline goes with --prometheus or s3:// --bundles")
    if pods_file:
        pods_doc, nodes_doc = read_json_object(pods_file), read_json_object(nodes_file)
        check_documents(pods_doc, nodes_doc, pods_from=f"--from {pods_file}", nodes_from=f"--nodes {nodes_file}")
    else:
        kw = dict(kubeconfig=kubeconfig, context=kube_context)
        pods_doc = read_kubectl("pods", namespace=namespace, selector=selector, **kw)
        nodes_doc = read_kubectl("nodes", **kw)
        where = " ".join(x for x in (f"-n {namespace}" if namespace else "--all-namespaces",
                                     f"-l {selector}" if selector else "") if x)
        check_documents(pods_doc, nodes_doc, pods_from=f"kubectl get pods {where}", nodes_from="kubectl get nodes")
    baseline, since_time = _since(since) if since else (None, None)
    problems: list[str] = []
    places = _crash_places(tuple(bundle_sources), endpoint_url, region, profile, deadline, problems)
    summary = summarize_fleet(pods_doc, nodes_doc, group_by=tuple(group_by) or DEFAULT_GROUP_LABELS,
                              baseline=baseline, since=since_time, places=places, bundles=tuple(bundle_sources))
    if problems:
        import dataclasses

        summary = dataclasses.replace(summary, bundle_problems=tuple(problems))
        for p in problems:
            warn(p)
    if as_json:
        emit_json(json_document("fleet", {"fleet": summary}), output, force)
    else:
        emit(format_fleet(summary), output, force)
    sys.exit(EXIT_PARTIAL if problems else EXIT_OK)


def _since(since: str):
    """--since: (a saved fleet snapshot, None) or (None, an aware time)."""
    import datetime as dt

    if os.path.isfile(since):
        baseline = read_json_object(since)
        if baseline.get("command") != "fleet":
            raise ForensicsError(f"{since}: not a `forensics fleet --json` snapshot")
        return baseline, None
    try:
        since_time = dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError as e:
        raise click.BadParameter(f"{since!r} is neither a file nor an ISO time", param_hint="--since") from e
    return None, since_time if since_time.tzinfo else since_time.replace(tzinfo=dt.timezone.utc)


def _crash_places(sources: tuple[str, ...], endpoint_url, region, profile, deadline, problems: list[str]) -> tuple:
    """fleet --bundles: where each crash's bundle lives (what a bucket did not let be read said in ``problems``)."""
    if not sources:
        return ()
    from ..agent.crashplaces import read_crash_places
    from ..objstore.client import StoreOptions

    return read_crash_places(sources, StoreOptions(endpoint_url=endpoint_url, region=region, profile=profile,
                                                   deadline=deadline), problems=problems)


def _fleet_prometheus(url, window, since, bearer_token_file, basic_auth, ca_file, deadline, namespace, selector,
                      group_by, as_json, output, force) -> None:
    import datetime as dt

    from ..text.fleet import format_fleet
    from ..fleet.prom import (DEFAULT_DEADLINE, PromAuth, PromClient, parse_window,
                             summarize_fleet_prometheus)
    from ..output import json_document

    now = dt.datetime.now(dt.timezone.utc)
    seconds, label = None, None
    if window:
        try:
            seconds = parse_window(window)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--window") from e
    if since:  # a time, or a saved snapshot's time: the window starts there
        if window:
            raise click.UsageError("--since and --window are exclusive")
        if os.path.isfile(since):
            doc = read_json_object(since)
            if doc.get("command") != "fleet":
                raise ForensicsError(f"{since}: not a `forensics fleet --json` snapshot")
            start = (doc.get("fleet") or {}).get("taken_at")
            label = f"the snapshot {since}"
        else:
            start, label = since, since
        try:
            t0 = dt.datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        except ValueError as e:
            raise click.BadParameter(f"{since!r} is neither a fleet snapshot nor an ISO time",
                                     param_hint="--since") from e
        if t0.tzinfo is None:
            t0 = t0.replace(tzinfo=dt.timezone.utc)
        seconds = max(1, int((now - t0).total_seconds()))
    client = PromClient(url, PromAuth(bearer_token_file=bearer_token_file, basic_auth=basic_auth, ca_file=ca_file),
                        deadline=deadline or DEFAULT_DEADLINE)
    summary = summarize_fleet_prometheus(client, group_by=group_by, namespace=namespace, selector=selector,
                                         window=seconds, now=now, baseline_label=label)
    if not summary.pods:
        raise PrometheusError("kube_pod_info", "no pods" + (f" in namespace {namespace}" if namespace else "")
                              + (f" matching {selector}" if selector else "")
                              + ": is kube-state-metrics scraped (and its pod labels allow-listed for -l)?")
    if as_json:
        emit_json(json_document("fleet", {"fleet": summary}), output, force)
    else:
        emit(format_fleet(summary), output, force)
    sys.exit(EXIT_OK)
