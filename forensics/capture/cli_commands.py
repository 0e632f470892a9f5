"""Click commands of capture: ``capture``, ``core-handler`` and ``agent manifest``.

Registered on the ``forensics`` group by :mod:`forensics.cli`.  Imports stay lazy: the
kernel starts ``forensics core-handler`` for every crash.
"""
from __future__ import annotations

import os
import sys

import click

from ..errors import EXIT_OK
from ..options import json_option

__all__ = ["capture_command", "core_handler_command", "agent_group", "agent_manifest", "agent_run"]

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _Size(click.ParamType):
    """A byte count: ``4096``, ``512M``, ``20G``."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        s = str(value).strip().lower()
        for suffix in ("ib", "b"):
            if s.endswith(suffix) and len(s) > len(suffix):
                s = s[: -len(suffix)]
                break
        unit = s[-1] if s and s[-1] in _SIZE_UNITS else ""
        num = s[:-1] if unit else s
        try:
            return int(float(num) * _SIZE_UNITS[unit])
        except ValueError:
            self.fail(f"{value!r} is not a size (e.g. 4096, 512M, 20G)", param, ctx)


SIZE = _Size()


def _hex(ctx, param, value):
    if value is None:
        return None
    try:
        v = int(value, 16)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not hexadecimal (e.g. 0x33)") from None
    if not 0 <= v <= 0x1FF:
        raise click.BadParameter("coredump_filter has 9 bits (0x0-0x1ff)")
    return v


@click.command("capture")
@click.option("--pid", type=int, help="Node mode (root): arm this process on this machine.")
@click.option("--core-dir", type=click.Path(file_okay=False), default="/var/lib/forensics/cores", show_default=True,
              help="Where cores, objects and bundles go.")
@click.option("--full", is_flag=True, help="coredump_filter also dumps file-backed mappings (0x3f).")
@click.option("--coredump-filter", "coredump_filter", callback=_hex, metavar="HEX",
              help="Set /proc/PID/coredump_filter to this value (default 0x33, the kernel's).")
@click.option("--install-handler", is_flag=True, help="Point kernel.core_pattern at forensics core-handler (records the previous pattern).")
@click.option("--uninstall-handler", is_flag=True, help="Restore the core_pattern recorded by --install-handler.")
@click.option("--max-core-size", type=SIZE, default=None, help="With --install-handler: cut cores at this size.")
@click.option("--budget", type=SIZE, default=None, help="With --install-handler: total size of the core directory.")
@click.option("--min-free", type=SIZE, default=None, help="With --install-handler: free space to leave on its filesystem.")
@click.option("--loop-limit", type=int, default=None, help="With --install-handler: cores per image and signal per hour.")
@click.option("--pod", help="Workstation mode: capture this pod's container through kubectl.")
@click.option("-n", "--namespace", default=None, help="The pod's namespace (default: the context's).")
@click.option("--container", default=None, help="The pod's container (default: the only / first one).")
@click.option("--context", default=None, help="kubeconfig context.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="kubeconfig file.")
@click.option("--kubectl", "kubectl", default="kubectl", show_default=True, help="kubectl to run.")
@click.option("--agent-image", default=None, help="Image of the agent pod (forensics installed, with its 'forensics' on PATH).")
@click.option("--dry-run", is_flag=True, help="With --pod: print the agent pod manifest and do nothing.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds the agent pod may take.")
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), default=None,
              help="Directory to create the bundle in (pod mode: default ./forensics-bundles).")
@json_option
def capture_command(pid, core_dir, full, coredump_filter, install_handler, uninstall_handler, max_core_size, budget,
                    min_free, loop_limit, pod, namespace, container, context, kubeconfig, kubectl, agent_image, dry_run,
                    timeout, output, as_json):
    """Arm a process for a useful core and collect the evidence around it.

    \b
    forensics capture --pid 4242 --core-dir /var/lib/forensics/cores     # node mode, as root
    forensics capture --install-handler --core-dir /var/lib/forensics/cores
    forensics capture --uninstall-handler --core-dir /var/lib/forensics/cores
    forensics capture --pod exporter-abc -n monitoring [--container exporter]
    forensics capture --pod exporter-abc --dry-run                         # print the agent pod

    \b
    Exit codes: 0 armed / done; 1 error; 2 usage; 4 armed, but the kernel
    will not write this process's core where it survives (see the reasons).
    """
    modes = [bool(pid is not None), bool(install_handler), bool(uninstall_handler), bool(pod)]
    if sum(modes) != 1:
        raise click.UsageError("give exactly one of --pid, --pod, --install-handler, --uninstall-handler")
    if dry_run and not pod:
        raise click.UsageError("--dry-run goes with --pod")
    if install_handler:
        from .pattern import install_handler as install

        config = {k: v for k, v in dict(max_core_size=max_core_size, budget=budget, min_free=min_free,
                                         loop_limit=loop_limit).items() if v is not None}
        r = install(core_dir, config=config)
        _render("capture-install-handler", r, as_json,
                [f"core_pattern: {r['pattern']}", f"previous:     {r['previous']}", f"recorded in:  {r['state']}"])
        return
    if uninstall_handler:
        from .pattern import uninstall_handler as uninstall

        r = uninstall(core_dir)
        _render("capture-uninstall-handler", r, as_json, [f"core_pattern restored: {r['restored']}"])
        return
    if pod:
        from .kube import KubeOptions, capture_pod

        opts = KubeOptions(kubectl=kubectl, kubeconfig=kubeconfig, context=context, namespace=namespace)
        r = capture_pod(pod, container=container, opts=opts, core_dir=core_dir, agent_image=agent_image,
                        dry_run=dry_run, output=output or "forensics-bundles", timeout=timeout,
                        coredump_filter=coredump_filter, full=full)
        if dry_run:
            click.echo(r["manifest"], nl=False)
            return
        _render("capture-pod", r, as_json, r.get("lines", []))
        return
    from .node import capture_pid

    r = capture_pid(pid, core_dir=core_dir, full=full, coredump_filter=coredump_filter, bundle_parent=output)
    dest = r.destination
    lines = [
        f"process {r.pid} ({r.snapshot.comm}) armed",
        f"RLIMIT_CORE:     {r.rlimit_core_before[0]}/{r.rlimit_core_before[1]} -> {r.rlimit_core_after[0]}/{r.rlimit_core_after[1]} (read back from /proc/{r.pid}/limits)",
        f"coredump_filter: {r.coredump_filter_before} -> {r.coredump_filter_after}",
        f"core_pattern:    {r.core_pattern}",
        f"core:            {'WILL' if dest.will_dump else 'will NOT'} be written"
        + (f" to {dest.path_in_process}" if dest.path_in_process else "")
        + (f" (host: {dest.host_path})" if dest.host_path and dest.host_path != dest.path_in_process else "")
        + ("" if dest.persistent is not False else " -- LOST with the container"),
    ]
    lines += [f"  - {x}" for x in dest.reasons]
    ident = r.snapshot.identity
    if ident.container_id:
        lines.append(f"container:       {ident.container_id[:12]} ({ident.runtime or 'runtime ?'}) pod {ident.pod_uid or '-'}")
    if r.snapshot.nvml:
        n = r.snapshot.nvml
        lines.append(f"NVML:            {n.path} (inode {n.inode}, build-id {n.build_id or '?'}, version {n.version or '?'})")
        lines.append(f"                 {n.verdict}")
    lines.append(f"Wrote {r.bundle}")
    payload = {"pid": r.pid, "rlimit_core_before": r.rlimit_core_before, "rlimit_core_after": r.rlimit_core_after,
               "coredump_filter_before": r.coredump_filter_before, "coredump_filter_after": r.coredump_filter_after,
               "core_pattern": r.core_pattern, "destination": dest, "snapshot": r.snapshot, "bundle": r.bundle}
    _render("capture", payload, as_json, lines)
    ok = dest.will_dump and dest.persistent is not False
    if not ok:
        sys.exit(4)


def _render(command: str, payload: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        from ..output import json_document

        click.echo(json_document(command, payload))
    else:
        for line in lines:
            click.echo(line)


@click.command("core-handler", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--max-core-size", type=SIZE, default=None, help="Cut cores at this size (overrides DIR/handler.json).")
@click.option("--budget", type=SIZE, default=None, help="Total size of DIR.")
@click.option("--min-free", type=SIZE, default=None, help="Free space to leave.")
@click.option("--loop-limit", type=int, default=None, help="Cores per image and signal per hour.")
def core_handler_command(args, max_core_size, budget, min_free, loop_limit):
    """The pipe handler the kernel runs: reads the core on stdin (not for interactive use).

    \b
    ARGS: DIR PID TID SIGNAL TIME [RLIMIT_CORE], as the kernel expands
    kernel.core_pattern = |/PATH/TO/forensics core-handler DIR %P %I %s %t %c
    (install it with: forensics capture --install-handler --core-dir DIR).
    Bad arguments are logged to the kernel log and stdin is still drained.
    """
    from .handler import _parse_limit, drain, load_config, log_kernel, run_core_handler

    try:
        core_dir, pid, tid, signo, timestamp = args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4])
        rlimit_core = _parse_limit(args[5]) if len(args) > 5 else None
    except (IndexError, ValueError):
        log_kernel(f"bad arguments {' '.join(args)!r}: expected DIR PID TID SIGNAL TIME [RLIMIT_CORE]")
        drain(0)
        sys.exit(2)
    cfg = load_config(core_dir)
    for k, v in dict(max_core_size=max_core_size, budget=budget, min_free=min_free, loop_limit=loop_limit).items():
        if v is not None:
            setattr(cfg, k, v)
    r = run_core_handler(os.path.abspath(core_dir), pid, tid, signo, timestamp, rlimit_core, config=cfg)
    sys.exit(1 if r.core_state == "failed" else EXIT_OK)


@click.group("agent")
def agent_group():
    """Kubernetes manifests and the in-pod agent."""


@agent_group.command("manifest")
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
    from .kube import daemonset_manifest

    if "=" not in gpu_label:
        raise click.BadParameter("KEY=VALUE", param_hint="--gpu-label")
    bounds = {"max_core_size": max_core_size, "budget": budget, "min_free": min_free, "loop_limit": loop_limit}
    click.echo(daemonset_manifest(core_dir=core_dir, image=image, namespace=namespace, gpu_label=gpu_label,
                                  host_prefix=host_prefix, bounds=bounds), nl=False)


@agent_group.command("run", hidden=True)
@click.option("--container-id", required=True, help="Container ID (runtime://ID or ID).")
@click.option("--core-dir", required=True)
@click.option("--host-root", default=None, help="The host's filesystem in the agent pod (default: /proc/1/root).")
@click.option("--coredump-filter", "coredump_filter", callback=_hex, default=None)
@click.option("--full", is_flag=True)
@click.option("--pod-uid", default=None, help="Also bring the recorded crashes of the pod's earlier containers.")
@click.option("--max-inline", type=SIZE, default="6M", show_default=True,
              help="Most bytes of objects and cores sent back through the pod log (the kubelet rotates logs at 10 MiB "
                   "by default; base64 adds a third); the rest stays on the node, listed in left-on-node.json.")
def agent_run(container_id, core_dir, host_root, coredump_filter, full, pod_uid, max_inline):
    """Inside the agent pod: arm the container's processes, print the bundle (base64 tar) to stdout."""
    from .kube import agent_main

    sys.exit(agent_main(container_id=container_id, core_dir=core_dir, host_root=host_root,
                        coredump_filter=coredump_filter, full=full, max_inline=max_inline, pod_uid=pod_uid))
