"""forensics agent: the DaemonSet manifest, and the hidden in-pod side of ``capture --pod``."""
from __future__ import annotations

import os
import sys

import click

from ..options import FrontDoorGroup, SIZE, json_option, parse_coredump_filter, store_options
from . import echo, emit_json

__all__ = ["agent", "agent_manifest", "agent_chart", "agent_serve", "agent_keep", "agent_run"]


@click.group("agent", cls=FrontDoorGroup)
def agent():
    """Kubernetes manifests and the in-pod agent."""


@agent.command("manifest", common=("core_dir", "image", "namespace", "upload_url", "as_json"))
@click.option("--core-dir", default="/var/lib/forensics/cores", show_default=True,
              help="hostPath for cores on every node.")
@click.option("--image", "image", default=None,
              help="The agent image (default: the one `python .ci/image/build.py` builds and tags, "
                   "ghcr.io/forensics/forensics-agent:VERSION).")
@click.option("-n", "--namespace", default="forensics", show_default=True,
              help="The namespace of the agent's objects.")
@click.option("--gpu-label", default="nvidia.com/gpu.present=true", show_default=True,
              help="Node selector KEY=VALUE for GPU nodes.")
@click.option("--host-prefix", default="/opt/forensics", show_default=True,
              help="Host directory the DaemonSet copies the forensics installation into (the kernel runs the handler "
                   "from the host).")
@click.option("--max-core-size", type=SIZE, default="8G", show_default=True, help="Cut each core at this size.")
@click.option("--budget", type=SIZE, default="20G", show_default=True,
              help="Total size of the core directory on each node (oldest cores go first; 0: none).")
@click.option("--min-free", type=SIZE, default=None,
              help="Free space to leave on the node's filesystem (handler default 1G).")
@click.option("--loop-limit", type=int, default=None, help="Cores per image and signal per hour (handler default 5).")
@click.option("--scrape", type=click.Choice(["annotations", "podmonitor", "none"]), default="annotations",
              show_default=True, help="How Prometheus finds the metrics port: prometheus.io/* pod annotations, a "
                                      "prometheus-operator PodMonitor, or neither.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=9847, show_default=True)
@click.option("--analysis-timeout", type=click.IntRange(10, 86400), default=300, show_default=True,
              help="Seconds one on-node analysis may take.")
@click.option("--analysis-memory", type=SIZE, default="1G", show_default=True,
              help="Memory one on-node analysis may use (the container's limit is this plus 512Mi).")
@click.option("--analysis-output-max", type=SIZE, default="256M", show_default=True,
              help="Bytes one on-node analysis may print into its bundle (agent serve's bound).")
@click.option("--upload", "upload_url", default=None, metavar="s3://BUCKET/PREFIX",
              help="agent serve --upload: each analyzed crash's bundle into this bucket.")
@click.option("--upload-keep", is_flag=True, help="With --upload: keep the whole bundle on the node too.")
@click.option("--cluster", default="default", show_default=True, help="With --upload: the cluster's name in the keys.")
@click.option("--upload-max-bandwidth", type=SIZE, default="50M", show_default=True,
              help="With --upload: bytes per second an upload may send.")
@click.option("--upload-concurrency", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--upload-max-pending", type=click.IntRange(1, None), default=500, show_default=True,
              help="With --upload: agent serve's bound on the crashes waiting for the bucket.")
@click.option("--upload-max-pending-bytes", type=SIZE, default="10G", show_default=True,
              help="With --upload: agent serve's bound on the bytes of the crashes waiting for the bucket.")
@click.option("--upload-max-attempts", type=click.IntRange(1, None), default=20, show_default=True,
              help="With --upload: agent serve's bound on one crash's failed upload attempts.")
@click.option("--upload-secret", default=None, metavar="SECRET",
              help="With --upload: a Secret in the namespace whose keys become the agent's environment "
                   "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY...); credentials never travel as flags.")
@click.option("--endpoint-url", default=None, metavar="URL", help="With --upload: the S3 endpoint (MinIO, Ceph...).")
@click.option("--region", default=None, help="With --upload: the bucket's region.")
@click.option("--service-account-annotation", "sa_annotations", multiple=True, metavar="KEY=VALUE",
              help="An annotation on the agent's ServiceAccount (a web identity: eks.amazonaws.com/role-arn=ARN).")
@click.option("--image-pull-secret", "pull_secrets", multiple=True, metavar="SECRET",
              help="A Secret the pods pull the image with (a private registry); repeatable.")
@json_option
def agent_manifest(core_dir, image, namespace, gpu_label, host_prefix, max_core_size, budget, min_free, loop_limit,
                   scrape, metrics_port, analysis_timeout, analysis_memory, analysis_output_max, upload_url,
                   upload_keep, cluster, upload_max_bandwidth, upload_concurrency, upload_max_pending,
                   upload_max_pending_bytes, upload_max_attempts, upload_secret, endpoint_url, region, sa_annotations,
                   pull_secrets, as_json):
    """Print the node agent's objects: Namespace, ServiceAccount and RBAC, the DaemonSet (core handler with its
    disk bounds, on-node analysis, metrics port), and a PodMonitor on request.

    \b
    forensics agent manifest | kubectl apply -f -
    forensics agent manifest --json | jq .manifest | kubectl apply -f -     # a v1 List
    """
    from .. import __version__
    from ..deploy.manifests import AgentUpload, agent_image, agent_objects, to_yaml_documents

    if "=" not in gpu_label:
        raise click.BadParameter("KEY=VALUE", param_hint="--gpu-label")
    if any("=" not in a for a in sa_annotations):
        raise click.BadParameter("KEY=VALUE", param_hint="--service-account-annotation")
    upload = None
    if upload_url:
        from ..errors import ForensicsError
        from ..objstore.client import check_endpoint, parse_object_url

        try:
            parse_object_url(upload_url)
        except ForensicsError as e:
            raise click.BadParameter(str(e), param_hint="--upload") from e
        check_endpoint(endpoint_url, "--endpoint-url")  # it would be written into the DaemonSet in clear
        upload = AgentUpload(url=upload_url, cluster=cluster, keep=upload_keep, max_bandwidth=upload_max_bandwidth,
                             concurrency=upload_concurrency, max_pending=upload_max_pending,
                             max_pending_bytes=upload_max_pending_bytes, max_attempts=upload_max_attempts,
                             endpoint_url=endpoint_url, region=region, secret=upload_secret)
    bounds = {"max_core_size": max_core_size, "budget": budget, "min_free": min_free, "loop_limit": loop_limit}
    objects = agent_objects(core_dir=core_dir, image=image or agent_image(__version__), namespace=namespace,
                            gpu_label=gpu_label, host_prefix=host_prefix, bounds=bounds, scrape=scrape,
                            metrics_port=metrics_port, analysis_timeout=analysis_timeout,
                            analysis_memory=analysis_memory, analysis_output_max=analysis_output_max, upload=upload,
                            service_account_annotations=dict(a.partition("=")[::2] for a in sa_annotations),
                            image_pull_secrets=tuple(pull_secrets))
    if as_json:
        from ..output import json_document

        emit_json(json_document("agent-manifest", {"manifest": {"apiVersion": "v1", "kind": "List", "items": objects}},
                                redact=False),  # our own manifests, applied as they are
                  None, False)
    else:
        click.echo(to_yaml_documents(objects), nl=False)  # PyYAML: control characters escaped in quoted strings


@agent.command("chart", common=("output", "force", "as_json"))
@click.option("-o", "--output", default="forensics-agent", show_default=True,
              help="The directory to write the chart into (made here; its parent must exist).")
@click.option("--force", is_flag=True, help="Write into an existing directory, replacing the chart's files there.")
@json_option
def agent_chart(output, force, as_json):
    """Write the node agent's Helm chart (shipped in the package) into a directory: the objects of `agent manifest`,
    with the alert rules as a PrometheusRule and the Grafana dashboard behind values.

    \b
    forensics agent chart -o ./forensics-agent
    helm install forensics ./forensics-agent -n forensics --set metrics.scrape=podmonitor
    """
    from ..deploy.helmchart import write_chart

    files = write_chart(output, force=force)
    if as_json:
        from .. import __version__
        from ..output import json_document

        emit_json(json_document("agent-chart", {"chart": os.path.abspath(output), "files": files,
                                                "version": __version__}), None, False)
    else:
        echo(f"Wrote {output} ({len(files)} files)")


@agent.command("serve", common=("core_dir", "node_name", "metrics_port", "upload_url"))
@click.option("--core-dir", default="/var/lib/forensics/cores", show_default=True, help="The core handler's directory.")
@click.option("--node-name", default=None, help="This node's Kubernetes name (default: the host name).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9847, show_default=True,
              help="Prometheus metrics port (0: none).")
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address to serve metrics on (the DaemonSet passes the pod's IP).")
@click.option("--analysis-timeout", type=click.FloatRange(1, 86400), default=300.0, show_default=True,
              help="Seconds one analysis may take (then killed, recorded as failed: timeout).")
@click.option("--analysis-memory", type=SIZE, default="1G", show_default=True,
              help="Address space one analysis may use (past it: failed: memory).")
@click.option("--analysis-output-max", type=SIZE, default="256M", show_default=True,
              help="Bytes one analysis may print into its temporary file in the bundle (past it: killed, failed: "
                   "error); what is kept is then fit to 8 MiB.")
@click.option("--max-series", type=click.IntRange(1, 100000), default=500, show_default=True,
              help="Label sets of forensics_crashes_total at most; the rest count under '_other'.")
@click.option("--events/--no-events", default=True, show_default=True,
              help="A NativeCrash Event on the crashed pod (needs the API: in-cluster, or --kubeconfig).")
@click.option("--kubeconfig", default=None,
              help="kubeconfig for the API (default: in-cluster, the pod's service account).")
@click.option("--context", "kube_context", default=None, help="kubeconfig context.")
@click.option("--kubectl", default="kubectl", show_default=True, help="kubectl to run.")
@click.option("--upload", "upload_url", default=None, metavar="s3://BUCKET/PREFIX",
              help="Upload each crash's bundle there once analyzed (forensics upload's keys and checks), then keep "
                   "only its record, 60-analysis/ and 70-upload.json on the node.")
@click.option("--upload-keep", is_flag=True, help="With --upload: keep the whole bundle on the node too.")
@click.option("--cluster", envvar="FORENSICS_CLUSTER", default="default", show_default=True,
              help="The cluster's name in the uploaded keys (FORENSICS_CLUSTER).")
@click.option("--upload-max-bandwidth", type=SIZE, default="50M", show_default=True,
              help="Bytes per second an upload may send (a crash storm must not take the node's network).")
@click.option("--upload-concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Parts of one file in flight at once (memory is about this many parts' buffers).")
@click.option("--upload-max-pending", type=click.IntRange(1, None), default=500, show_default=True,
              help="Crashes waiting for the bucket at most; past it the oldest analyzed one is given up (recorded in "
                   "its 70-upload.json, counted in forensics_uploads_dropped_total).")
@click.option("--upload-max-pending-bytes", type=SIZE, default="10G", show_default=True,
              help="Bytes on the node of the crashes waiting for the bucket at most; past it, as --upload-max-pending.")
@click.option("--upload-max-attempts", type=click.IntRange(1, None), default=20, show_default=True,
              help="Failed attempts of one crash's upload at most (30 s doubling to an hour apart); then it is given "
                   "up, the whole bundle kept on the node, as when the bucket holds other bytes at its core's key.")
@click.option("--reclaim-pattern", is_flag=True,
              help="When another program (systemd-coredump, apport) takes kernel.core_pattern, write the handler's "
                   "back (default: only report it: forensics_handler_installed 0 and a node Event).")
@store_options
def agent_serve(core_dir, node_name, metrics_port, metrics_address, analysis_timeout, analysis_memory,
                analysis_output_max, max_series,
                events, kubeconfig, kube_context, kubectl, upload_url, upload_keep, cluster, upload_max_bandwidth,
                upload_concurrency, endpoint_url, region, profile, upload_max_pending, upload_max_pending_bytes,
                upload_max_attempts, reclaim_pattern):
    """On-node analysis of each new crash, a crash index rebuilt from the bundles, Prometheus metrics, Events.

    \b
    Runs until SIGTERM (exit 0; Ctrl-C: 130); --core-dir must exist. Each crash with a core is
    analyzed once, at the lowest CPU and I/O priority, bounded in time and memory; the analysis
    goes into the crash's bundle (60-analysis/). A restart counts nothing twice. With --upload,
    each analyzed crash's bundle goes to the bucket (verified) and the node keeps its record,
    60-analysis/ and 70-upload.json (where it went); nothing else is ever deleted.
    """
    import shutil
    import socket

    from ..kubectl import KubeOptions
    from .. import __version__
    from ..agent.serve import ServeConfig, serve

    kube = None
    if events or kubeconfig:
        if shutil.which(kubectl) is None:
            echo(f"forensics agent serve: {kubectl!r} not found: no Events, pods named by UID only", err=True)
        elif kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube = KubeOptions(kubectl=kubectl, kubeconfig=kubeconfig, context=kube_context)
        else:
            echo("forensics agent serve: no kubeconfig and not in a pod: no Events, pods named by UID only", err=True)
    upload = None
    if upload_url:
        from ..agent.shipper import UploadConfig
        from ..errors import ForensicsError
        from ..objstore.client import StoreOptions, parse_object_url

        try:
            dest = parse_object_url(upload_url)
        except ForensicsError as e:
            raise click.BadParameter(str(e), param_hint="--upload") from e
        upload = UploadConfig(dest=dest, cluster=cluster, keep=upload_keep, max_pending=upload_max_pending,
                              max_pending_bytes=upload_max_pending_bytes, max_attempts=upload_max_attempts,
                              opts=StoreOptions(
            endpoint_url=endpoint_url, region=region, profile=profile, max_bandwidth=upload_max_bandwidth or None,
            concurrency=upload_concurrency))
    serve(ServeConfig(core_dir=core_dir, node=node_name or socket.gethostname(), metrics_port=metrics_port,
                      metrics_address=metrics_address, analysis_timeout=analysis_timeout,
                      analysis_memory=analysis_memory, max_series=max_series, events=events, kube=kube,
                      upload=upload, version=__version__, reclaim_pattern=reclaim_pattern,
                      analysis_output=analysis_output_max))


@agent.command("keep")
@click.option("--core-dir", default="/var/lib/forensics/cores", show_default=True, help="The core handler's directory.")
@click.option("--max-core-size", type=SIZE, default=None, help="Cut each core at this size.")
@click.option("--budget", type=SIZE, default=None, help="Total size of the core directory.")
@click.option("--min-free", type=SIZE, default=None, help="Free space to leave on its filesystem.")
@click.option("--loop-limit", type=int, default=None, help="Cores per image and signal per hour.")
def agent_keep(core_dir, max_core_size, budget, min_free, loop_limit):
    """The DaemonSet's privileged keeper: install the core handler, and restore the previous core_pattern when
    stopped.

    \b
    Runs until SIGTERM (the pod deleted: helm uninstall, the DaemonSet removed, a drain,
    a rolling update), then writes back the kernel.core_pattern it replaced, unless
    another program has set one since. It parses nothing a crash controls; the
    analyses run in agent serve's sandbox.
    """
    from ..capture.keeper import keep

    config = {k: v for k, v in dict(max_core_size=max_core_size, budget=budget, min_free=min_free,
                                     loop_limit=loop_limit).items() if v is not None}
    keep(core_dir, config=config, say=lambda line: echo(line, err=True))


@agent.command("run", hidden=True)
@click.option("--container-id", default=None, help="Container ID (runtime://ID or ID).")
@click.option("--waiting", is_flag=True, help="The container is not running: arm the node's side for its next start.")
@click.option("--core-dir", required=True)
@click.option("--host-root", default=None, help="The host's filesystem in the agent pod (default: /proc/1/root).")
@click.option("--coredump-filter", "coredump_filter", callback=parse_coredump_filter, default=None)
@click.option("--full", is_flag=True)
@click.option("--pod-uid", default=None, help="Also bring the recorded crashes of the pod's earlier containers.")
@click.option("--max-inline", type=SIZE, default="6M", show_default=True,
              help="Most bytes of objects and cores sent back through the pod log (the kubelet rotates logs at 10 MiB "
                   "by default; base64 adds a third); the rest stays on the node, listed in left-on-node.json.")
def agent_run(container_id, waiting, core_dir, host_root, coredump_filter, full, pod_uid, max_inline):
    """Inside the agent pod: arm the container's processes, print the bundle (base64 tar) to stdout."""
    from ..capture.agent import run_agent

    if bool(container_id) == bool(waiting):
        raise click.UsageError("give --container-id, or --waiting with --pod-uid")
    if waiting and not pod_uid:
        raise click.UsageError("--waiting needs --pod-uid")

    run = run_agent(container_id=container_id, core_dir=core_dir, host_root=host_root,
                    coredump_filter=coredump_filter, full=full, max_inline=max_inline, pod_uid=pod_uid)
    for note in run.notes:
        echo(f"forensics agent: {note}", err=True)
    if run.bundle is not None:
        click.echo(run.bundle, nl=False)  # base64 text, read by capture --pod
    if run.done is not None:
        echo(f"forensics agent: {run.done}", err=True)
    sys.exit(run.exit_code)
