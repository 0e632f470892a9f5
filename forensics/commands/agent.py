"""forensics agent: the DaemonSet manifest, and the hidden in-pod side of ``capture --pod``."""
from __future__ import annotations

import sys

import click

from ..options import SIZE, parse_coredump_filter

__all__ = ["agent", "agent_manifest", "agent_run"]


@click.group("agent")
def agent():
    """Kubernetes manifests and the in-pod agent."""


@agent.command("manifest")
@click.option("--core-dir", default="/var/lib/forensics/cores", show_default=True, help="hostPath for cores on every node.")
@click.option("--image", "image", default="ghcr.io/forensics/forensics:latest", show_default=True, help="Image with forensics installed.")
@click.option("-n", "--namespace", default="forensics", show_default=True)
@click.option("--gpu-label", default="nvidia.com/gpu.present=true", show_default=True, help="Node selector KEY=VALUE for GPU nodes.")
@click.option("--host-prefix", default="/opt/forensics", show_default=True,
              help="Host directory the DaemonSet copies the forensics installation into (the kernel runs the handler from the host).")
@click.option("--max-core-size", type=SIZE, default="8G", show_default=True, help="Cut each core at this size.")
@click.option("--budget", type=SIZE, default="20G", show_default=True,
              help="Total size of the core directory on each node (oldest cores go first; 0: none).")
@click.option("--min-free", type=SIZE, default=None, help="Free space to leave on the node's filesystem (handler default 1G).")
@click.option("--loop-limit", type=int, default=None, help="Cores per image and signal per hour (handler default 5).")
def agent_manifest(core_dir, image, namespace, gpu_label, host_prefix, max_core_size, budget, min_free, loop_limit):
    """Print a DaemonSet that installs the core handler on every GPU node, with its disk bounds."""
    from ..capture.manifests import daemonset_manifest

    if "=" not in gpu_label:
        raise click.BadParameter("KEY=VALUE", param_hint="--gpu-label")
    bounds = {"max_core_size": max_core_size, "budget": budget, "min_free": min_free, "loop_limit": loop_limit}
    click.echo(daemonset_manifest(core_dir=core_dir, image=image, namespace=namespace, gpu_label=gpu_label,
                                  host_prefix=host_prefix, bounds=bounds), nl=False)


@agent.command("run", hidden=True)
@click.option("--container-id", required=True, help="Container ID (runtime://ID or ID).")
@click.option("--core-dir", required=True)
@click.option("--host-root", default=None, help="The host's filesystem in the agent pod (default: /proc/1/root).")
@click.option("--coredump-filter", "coredump_filter", callback=parse_coredump_filter, default=None)
@click.option("--full", is_flag=True)
@click.option("--pod-uid", default=None, help="Also bring the recorded crashes of the pod's earlier containers.")
@click.option("--max-inline", type=SIZE, default="6M", show_default=True,
              help="Most bytes of objects and cores sent back through the pod log (the kubelet rotates logs at 10 MiB "
                   "by default; base64 adds a third); the rest stays on the node, listed in left-on-node.json.")
def agent_run(container_id, core_dir, host_root, coredump_filter, full, pod_uid, max_inline):
    """Inside the agent pod: arm the container's processes, print the bundle (base64 tar) to stdout."""
    from ..capture.agent import run_agent

    run = run_agent(container_id=container_id, core_dir=core_dir, host_root=host_root,
                    coredump_filter=coredump_filter, full=full, max_inline=max_inline, pod_uid=pod_uid)
    for note in run.notes:
        click.echo(f"forensics agent: {note}", err=True)
    if run.bundle is not None:
        click.echo(run.bundle, nl=False)
    if run.done is not None:
        click.echo(f"forensics agent: {run.done}", err=True)
    sys.exit(run.exit_code)
