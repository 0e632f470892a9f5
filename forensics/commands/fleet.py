"""forensics fleet: restarts and exit codes of pods compared by node group."""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_OK, ForensicsError
from ..options import force_option, json_option, output_option
from . import emit, read_json_object

__all__ = ["fleet"]


@click.command("fleet")
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
    Exit codes: 0 printed; 1 error (kubectl failed, bad input: files swapped, no pods, no nodes); 2 usage.
    """
    import datetime as dt

    from ..fleet import DEFAULT_GROUP_LABELS, check_documents, format_fleet, read_kubectl, summarize_fleet
    from ..output import json_document

    if bool(pods_file) != bool(nodes_file):
        raise click.UsageError("--from and --nodes go together")
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
    baseline = since_time = None
    if since:
        if os.path.isfile(since):
            baseline = read_json_object(since)
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
        emit([json_document("fleet", {"fleet": summary})], output, force)
    else:
        emit(format_fleet(summary), output, force)
    sys.exit(EXIT_OK)
