"""forensics capture: arm a process (or a pod's container) for a useful core; install the core handler."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_PARTIAL
from ..options import FrontDoor, SECONDS, SIZE, json_option, parse_coredump_filter
from . import emit, emit_json, warn

__all__ = ["capture"]


@click.command("capture", cls=FrontDoor,
               common=("pid", "pod", "namespace", "core_dir", "install_handler", "output", "as_json"))
@click.option("--pid", type=int, help="Node mode (root): arm this process on this machine.")
@click.option("--core-dir", type=click.Path(file_okay=False), default="/var/lib/forensics/cores", show_default=True,
              help="Where cores, objects and bundles go.")
@click.option("--full", is_flag=True, help="coredump_filter also dumps file-backed mappings (0x3f).")
@click.option("--coredump-filter", "coredump_filter", callback=parse_coredump_filter, metavar="HEX",
              help="Set /proc/PID/coredump_filter to this value (default 0x33, the kernel's).")
@click.option("--install-handler", is_flag=True,
              help="Point kernel.core_pattern at forensics core-handler (records the previous pattern).")
@click.option("--uninstall-handler", is_flag=True, help="Restore the core_pattern recorded by --install-handler.")
@click.option("--max-core-size", type=SIZE, default=None, help="With --install-handler: cut cores at this size.")
@click.option("--budget", type=SIZE, default=None, help="With --install-handler: total size of the core directory.")
@click.option("--min-free", type=SIZE, default=None,
              help="With --install-handler: free space to leave on its filesystem.")
@click.option("--loop-limit", type=int, default=None,
              help="With --install-handler: cores per image and signal per hour.")
@click.option("--pod", help="Workstation mode: capture this pod's container through kubectl.")
@click.option("-n", "--namespace", default=None, help="The pod's namespace (default: the context's).")
@click.option("--container", default=None, help="The pod's container (default: the only / first one).")
@click.option("--context", default=None, help="kubeconfig context.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="kubeconfig file.")
@click.option("--kubectl", "kubectl", default="kubectl", show_default=True, help="kubectl to run.")
@click.option("--agent-image", default=None,
              help="Image of the agent pod (forensics installed, with its 'forensics' on PATH).")
@click.option("--agent-namespace", default=None, metavar="NS",
              help="With --pod: create the privileged agent pod in NS (a namespace that allows privileged pods, "
                   "e.g. one labelled pod-security.kubernetes.io/enforce=privileged) instead of the target's, which "
                   "Pod Security baseline/restricted rejects it in.")
@click.option("--dry-run", is_flag=True,
              help="With --pod: print the agent pod manifest and create nothing (no API server needed: what only it "
                   "knows is then a placeholder).")
@click.option("--timeout", type=SECONDS, default=300.0, show_default=True, help="Seconds the agent pod may take.")
@click.option("-o", "--output", "output", type=click.Path(file_okay=False), default=None,
              help="Directory to create the bundle in (pod mode: default ./forensics-bundles).")
@json_option
def capture(pid, core_dir, full, coredump_filter, install_handler, uninstall_handler, max_core_size, budget,
                    min_free, loop_limit, pod, namespace, container, context, kubeconfig, kubectl, agent_image,
                    agent_namespace, dry_run, timeout, output, as_json):
    """Arm a process for a useful core and collect the evidence around it.

    \b
    forensics capture --pid 4242 --core-dir /var/lib/forensics/cores     # node mode, as root
    forensics capture --install-handler --core-dir /var/lib/forensics/cores
    forensics capture --uninstall-handler --core-dir /var/lib/forensics/cores
    forensics capture --pod exporter-abc -n monitoring [--container exporter]
    forensics capture --pod exporter-abc --dry-run                         # print the agent pod

    \b
    A pod whose container is not running (CrashLoopBackOff) is captured too: nothing
    runs to arm, so the agent says what its next start gets from the node (the core
    handler, the RLIMIT_CORE of the pod's sandbox) and brings the crashes the core
    handler recorded for the pod.

    \b
    Exit codes: 0 armed / done, and the core will survive; 1 error; 2 usage;
    4 done, but the kernel will not write the (next) core where it survives,
    whole (see the reasons: read-only or full destination, a container's own
    filesystem, a handler that keeps metadata only).
    """
    modes = [bool(pid is not None), bool(install_handler), bool(uninstall_handler), bool(pod)]
    if sum(modes) != 1:
        raise click.UsageError("give exactly one of --pid, --pod, --install-handler, --uninstall-handler")
    if dry_run and not pod:
        raise click.UsageError("--dry-run goes with --pod")
    from ..text import capture as text

    if install_handler:
        from ..capture.pattern import install_handler as install

        config = {k: v for k, v in dict(max_core_size=max_core_size, budget=budget, min_free=min_free,
                                         loop_limit=loop_limit).items() if v is not None}
        r = install(core_dir, config=config)
        _render("capture-install-handler", r, as_json, text.format_installed(r))
        return
    if uninstall_handler:
        from ..capture.pattern import uninstall_handler as uninstall

        r = uninstall(core_dir)
        _render("capture-uninstall-handler", r, as_json, text.format_uninstalled(r))
        return
    if pod:
        from .. import __version__
        from ..deploy.manifests import agent_image as default_agent_image
        from ..capture.pod import capture_pod
        from ..kubectl import KubeOptions

        opts = KubeOptions(kubectl=kubectl, kubeconfig=kubeconfig, context=context, namespace=namespace)
        r = capture_pod(pod, container=container, opts=opts, core_dir=core_dir,
                        agent_image=agent_image or default_agent_image(__version__), agent_namespace=agent_namespace,
                        dry_run=dry_run, output=output or "forensics-bundles", timeout=timeout,
                        coredump_filter=coredump_filter, full=full,
                        warn=warn)
        if dry_run:
            click.echo(r["manifest"], nl=False)  # PyYAML: control characters escaped in quoted strings
            return
        _render("capture-pod", {k: v for k, v in r.items() if k != "lines"}, as_json, r.get("lines", []))
        if not r["survives"]:
            sys.exit(4)
        return
    from ..capture.node import capture_pid
    from ..capture.pattern import destination_payload

    armed = capture_pid(pid, core_dir=core_dir, full=full, coredump_filter=coredump_filter, bundle_parent=output)
    dest = armed.destination
    payload = {"pid": armed.pid, "rlimit_core_before": armed.rlimit_core_before,
               "rlimit_core_after": armed.rlimit_core_after, "coredump_filter_before": armed.coredump_filter_before,
               "coredump_filter_after": armed.coredump_filter_after, "core_pattern": armed.core_pattern,
               "destination": destination_payload(dest), "snapshot": armed.snapshot, "bundle": armed.bundle}
    _render("capture", payload, as_json, text.format_armed(armed))
    if not dest.survives:
        sys.exit(EXIT_PARTIAL)


def _render(command: str, payload: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        from ..output import json_document

        emit_json(json_document(command, payload), None, False)
    else:
        emit(lines, None, False)
