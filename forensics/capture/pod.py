"""``forensics capture --pod``: capture a pod's container from a workstation, through the one kube client.

Steps: read the pod (node, UID, container IDs, restart counts, last terminated state with
exit code and signal), its events and its node (GPU labels, driver, kernel, runtime); start
a short-lived privileged agent pod pinned to that node (``nodeName``, ``hostPID``, the core
directory as a hostPath mounted at the same path; :mod:`.manifests`), which finds the
container's processes by container ID in ``/proc/*/cgroup`` (never by hostname), runs the
node mode for them and prints its bundle to its log (:mod:`.agent`); read the log, unpack the
bundle, add the Kubernetes items, write the manifest; delete the agent pod whatever happens
(errors, Ctrl-C, SIGTERM), and warn when that delete fails: a privileged pod may be left.
"""
from __future__ import annotations

import io
import json
import os
import signal
import tarfile
import time
import uuid
from collections.abc import Callable

from ..errors import (AgentFailed, ContainerNotRunning, ForensicsError, KubectlNotFound, KubeError, NodeUnreachable,
                      PodNotFound)
from ..kubectl import KubeOptions, as_count, as_dict, as_list, as_str, get_json, run_kubectl
from ..bundle.layout import LEFT_ON_NODE
from .agent import decode_bundle
from ..deploy.manifests import agent_pod_manifest, to_yaml

__all__ = ["capture_pod", "summarize_pod", "summarize_node", "extract_node_bundle", "NODE_BUNDLE_MAX_BYTES",
           "NODE_BUNDLE_MAX_FILES", "NODE_LOG_LIMIT"]

_GPU_LABELS = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory",
               "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev",
               "nvidia.com/cuda.driver-version.full",
               "nvidia.com/gpu.driver-version.full", "nvidia.com/mig.strategy", "nvidia.com/gpu.present")


def summarize_pod(pod: dict) -> dict:
    """Identity and scheduling state of a pod: what an on-call engineer reads first (a field of the wrong type
    in the API's answer is read as absent)."""
    meta, spec, status = (as_dict(pod.get(k)) for k in ("metadata", "spec", "status"))
    owners = [{"kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid")}
              for o in map(as_dict, as_list(meta.get("ownerReferences")))]
    containers = []
    for cs in map(as_dict, as_list(status.get("containerStatuses")) + as_list(status.get("initContainerStatuses"))):
        last = as_dict(as_dict(cs.get("lastState")).get("terminated"))
        state = as_dict(cs.get("state"))
        code = last.get("exitCode") if isinstance(last.get("exitCode"), int) else None
        containers.append({
            "name": as_str(cs.get("name")), "container_id": as_str(cs.get("containerID")), "image": cs.get("image"),
            "image_id": cs.get("imageID"), "restart_count": as_count(cs.get("restartCount")), "ready": cs.get("ready"),
            "state": next(iter(state), None), "state_detail": next(iter(state.values()), None),
            "last_terminated": None if not last else {
                "exit_code": code,
                "signal": last.get("signal") or (code - 128 if code is not None and code > 128 else None),
                "reason": last.get("reason"), "started_at": last.get("startedAt"),
                "finished_at": last.get("finishedAt")},
        })
    return {
        "name": as_str(meta.get("name")), "namespace": as_str(meta.get("namespace")), "uid": as_str(meta.get("uid")),
        "owners": owners, "node": as_str(spec.get("nodeName")), "phase": status.get("phase"),
        "qos_class": status.get("qosClass"),
        "pod_ip": status.get("podIP"), "host_ip": status.get("hostIP"), "start_time": status.get("startTime"),
        "conditions": as_list(status.get("conditions")), "containers": containers,
    }


def summarize_node(node: dict) -> dict:
    meta, status = as_dict(node.get("metadata")), as_dict(node.get("status"))
    info = as_dict(status.get("nodeInfo"))
    labels = as_dict(meta.get("labels"))
    ready = next((c for c in map(as_dict, as_list(status.get("conditions"))) if c.get("type") == "Ready"), {})
    return {
        "name": meta.get("name"), "uid": meta.get("uid"),
        "gpu_labels": {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)
                       and (k in _GPU_LABELS or k.startswith("nvidia.com/"))},
        "kernel": info.get("kernelVersion"), "os_image": info.get("osImage"),
        "container_runtime": info.get("containerRuntimeVersion"), "kubelet": info.get("kubeletVersion"),
        "ready": ready.get("status"), "ready_reason": ready.get("reason"), "ready_message": ready.get("message"),
        "allocatable": as_dict(status.get("allocatable")), "taints": as_list(as_dict(node.get("spec")).get("taints")),
    }


class _Terminate(BaseException):
    pass


def capture_pod(pod_name: str, *, container: str | None, opts: KubeOptions, core_dir: str, agent_image: str,
                dry_run: bool, output: str, warn: Callable[[str], None], timeout: float = 300.0,
                coredump_filter: int | None = None, full: bool = False, agent_namespace: str | None = None) -> dict:
    """Capture ``pod_name``'s container through kubectl; see the module docstring.

    :param warn: told what the user must know even when the capture fails (the agent pod not deleted)
    :param agent_namespace: where the privileged agent pod is made (default: the target pod's namespace; one
        whose Pod Security level is baseline or restricted refuses it)

    :raises KubectlNotFound, PodNotFound, KubeError, ContainerNotRunning, NodeUnreachable, AgentFailed:
    """
    image = agent_image
    agent_name = f"forensics-agent-{uuid.uuid4().hex[:8]}"
    try:
        pod = get_json(opts, "get pod", ["get", "pod", pod_name])
    except (KubeError, KubectlNotFound) as e:
        if isinstance(e, KubeError) and ("NotFound" in e.detail or "not found" in e.detail):
            raise PodNotFound(pod_name, opts.namespace or "(context default)") from e
        if not dry_run:
            raise
        # --dry-run needs no API server: the values only the API knows are shown as placeholders
        ns = opts.namespace or "default"
        manifest = agent_pod_manifest(name=agent_name, namespace=agent_namespace or ns,
                                      node=f"<node of {ns}/{pod_name}>",
                                      container_id=f"<container ID of {container or 'its first container'}>",
                                      core_dir=core_dir, image=image, timeout=timeout, coredump_filter=coredump_filter,
                                      full=full, pod_uid=f"<uid of {ns}/{pod_name}>")
        why = e.detail if isinstance(e, KubeError) else str(e)
        note = (f"# no answer from the API server ({why}):\n# the node, container ID and pod UID are placeholders; "
                "nothing was sent to the API server.\n")
        return {"manifest": note + to_yaml(manifest), "placeholders": True}
    summary = summarize_pod(pod)
    ns = summary["namespace"] or opts.namespace or "default"
    cs = summary["containers"]
    if not cs:
        raise ContainerNotRunning(pod_name, container or "?", f"pod phase {summary['phase']}, no container status")
    chosen = next((c for c in cs if c["name"] == container), None) if container else cs[0]
    if chosen is None:
        raise ForensicsError(f"pod {ns}/{pod_name} has no container {container!r} (it has: "
                             f"{', '.join(str(c['name']) for c in cs)})",
                             help_text="Pass --container NAME with one of those names.")
    node_name = summary["node"]
    if not node_name:
        raise ContainerNotRunning(pod_name, chosen["name"], f"pod phase {summary['phase']}, not scheduled on a node")
    # A container that is not running (CrashLoopBackOff, between restarts) is still worth the trip: its next
    # start inherits the node's core handler, and the cores of its earlier runs are on the node.
    running = chosen["state"] == "running" and bool(chosen["container_id"])
    agent_ns = agent_namespace or ns
    manifest = agent_pod_manifest(name=agent_name, namespace=agent_ns, node=node_name,
                                  container_id=chosen["container_id"] if running else None,
                                  core_dir=core_dir, image=image, timeout=timeout, coredump_filter=coredump_filter,
                                  full=full, pod_uid=summary["uid"])
    if dry_run:
        return {"manifest": to_yaml(manifest), "placeholders": False}
    node = get_json(opts, "get node", ["get", "node", node_name], namespaced=False)
    node_summary = summarize_node(node)
    if node_summary["ready"] != "True":
        raise NodeUnreachable(node_name,
                              f"Ready={node_summary['ready']} ({node_summary['ready_reason'] or 'no reason given'})")
    events = get_json(opts, "get events", ["get", "events", "--namespace", ns,
                                            "--field-selector", f"involvedObject.uid={summary['uid']}"],
                      namespaced=False)
    log = _run_agent(opts, agent_ns, agent_name, manifest, timeout, warn)
    return _write_pod_bundle(output, pod, summary, node, node_summary, events, chosen, log, agent_name, running)


def _run_agent(opts: KubeOptions, ns: str, name: str, manifest: dict, timeout: float,
               warn: Callable[[str], None]) -> str:
    kns = ["--namespace", ns]
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise _Terminate()

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        old_term = None
    try:
        # generated here, not typed: skip the OpenAPI download (MBs) client-side validation needs
        run_kubectl(opts, "create agent pod", ["create", "--validate=false", "-f", "-", *kns],
                    stdin=json.dumps(manifest), namespaced=False)
        deadline = time.monotonic() + timeout
        phase, status = "Pending", {}
        while time.monotonic() < deadline:
            status = get_json(opts, "get agent pod", ["get", "pod", name, *kns], namespaced=False).get("status", {})
            phase = status.get("phase", "Pending")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        else:
            waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason")
                       for c in status.get("containerStatuses", [])]
            if phase == "Pending" and not any(waiting):
                raise NodeUnreachable(manifest["spec"]["nodeName"], f"the agent pod stayed Pending for {timeout:g}s")
            raise AgentFailed(name,
                              f"still {phase} after {timeout:g}s ({', '.join(w for w in waiting if w) or 'no reason'})")
        log = run_kubectl(opts, "logs agent pod", ["logs", name, *kns, f"--limit-bytes={NODE_LOG_LIMIT}"],
                          namespaced=False, timeout=max(60.0, timeout))
        if phase == "Failed":
            # the log's text lines, not the bundle's base64 (gzip starts H4sI)
            text = [line for line in log.splitlines() if not line.startswith("H4sI") and len(line) < 400]
            tail = "\n".join(text)[-800:]
            raise AgentFailed(name, tail.strip() or "the agent exited with an error")
        return log
    except _Terminate:
        raise KeyboardInterrupt from None
    finally:
        try:  # always, even when create's answer was lost: --ignore-not-found
            run_kubectl(opts, "delete agent pod", ["delete", "pod", name, *kns, "--ignore-not-found", "--wait=false"],
                        namespaced=False, timeout=30)
        except ForensicsError as e:
            warn(f"the privileged agent pod {ns}/{name} may still exist: {e}; delete it with "
                 f"`kubectl delete pod {name} -n {ns}`")
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


#: what the workstation unpacks of the node's bundle (the agent sends its node text and at most --max-inline of
#: objects and cores; a compromised node may send anything)
NODE_BUNDLE_MAX_BYTES = 2 << 30
NODE_BUNDLE_MAX_FILES = 100_000
NODE_LOG_LIMIT = 1 << 30  # kubectl logs --limit-bytes: the base64 log read back (held in memory)


def extract_node_bundle(data: bytes, bdir: str, *, max_bytes: int = NODE_BUNDLE_MAX_BYTES,
                        max_files: int = NODE_BUNDLE_MAX_FILES) -> str | None:
    """Unpack the node's bundle (a tar.gz from the agent's log) into ``bdir``: tar's ``data`` filter (no absolute
    path, no ``..``, no link out, no device), as a stream, at most ``max_bytes`` decompressed and ``max_files``
    members; past a bound, or where the stream breaks, it stops and says why (what came before is kept).

    :return: None, or why the bundle was cut
    """
    import gzip
    import zlib

    read = 0

    class _Bounded(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            nonlocal read
            chunk = self.f.read(min(len(b), max_bytes + 1 - read))
            read += len(chunk)
            if read > max_bytes:
                raise _Cut(f"over {max_bytes} bytes decompressed")
            b[: len(chunk)] = chunk
            return len(chunk)

    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz, \
                tarfile.open(fileobj=io.BufferedReader(_Bounded(gz), 1 << 20), mode="r|") as tar:
            for n, member in enumerate(tar):
                if n >= max_files:
                    return f"over {max_files} files"
                tar.extract(member, bdir, filter="data")
    except _Cut as e:
        return str(e)
    except tarfile.FilterError as e:
        return f"a member was refused ({e}); the members after it were not unpacked"
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        return f"its stream breaks after {read} bytes ({e})"
    return None


class _Cut(Exception):
    pass


def _node_json(bdir: str, rel: str) -> dict:
    """A JSON object the node wrote into its bundle; {} when it is absent, not JSON or not an object."""
    try:
        with open(os.path.join(bdir, rel), "rb") as f:
            doc = json.loads(f.read(8 << 20))
    except (OSError, ValueError, RecursionError):
        return {}
    return as_dict(doc)


def _write_pod_bundle(output, pod, summary, node, node_summary, events, chosen, log, agent_name, running=True) -> dict:
    from ..bundle import layout
    from ..bundle.record import Identity
    from ..bundle.write import BundleWriter, new_bundle_dir

    data = decode_bundle(log)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bdir = new_bundle_dir(output, f"{stamp}-{summary['namespace']}-{summary['name']}")
    cut = extract_node_bundle(data, bdir)
    w = BundleWriter(bdir)
    for dirpath, _, files in os.walk(bdir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), bdir)
            if rel != layout.MANIFEST:
                w.note_file(rel, "from the agent on the node" + (f" (the node's bundle was cut: {cut})" if cut else ""))
    ident = Identity.from_json(_node_json(bdir, layout.IDENTITY)) or Identity(kind=None)
    ident = ident.with_pod(pod=summary["name"], namespace=summary["namespace"], pod_uid=summary["uid"],
                           owners=tuple(summary["owners"] or ()), node_uid=node_summary["uid"], node=summary["node"],
                           container=chosen["name"], container_id=chosen["container_id"], agent_pod=agent_name)
    w.add_json(layout.IDENTITY, ident.to_json(), "who was captured: pod, owners (job), node and container UIDs, time")
    items = sorted(events.get("items", []), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    w.add_json(layout.KUBERNETES_EVENTS, [{
        "time": e.get("lastTimestamp") or e.get("eventTime"), "type": e.get("type"), "reason": e.get("reason"),
        "message": e.get("message"), "count": e.get("count"), "source": e.get("source")} for e in items],
        "the pod's events, oldest first")
    w.add_json(layout.KUBERNETES_SCHEDULING, {"pod": summary, "node": node_summary},
               "scheduling state: node, phase, containers with restart counts and last exit code / signal, node GPU "
               "labels")
    w.add_json(layout.KUBERNETES_POD, pod, "the pod object as the API server returned it")
    w.add_json(layout.KUBERNETES_NODE, node, "the node object as the API server returned it")
    w.write_manifest({"pod": f"{summary['namespace']}/{summary['name']}"})
    from .pattern import destination_survives, format_destination

    arming = _node_json(bdir, layout.PROCESS_ARMING)
    dest = as_dict(arming.get("destination"))
    state = chosen["state"] or "unknown"
    detail = (chosen["state_detail"] or {}).get("reason") if isinstance(chosen["state_detail"], dict) else None
    lines = [f"pod {summary['namespace']}/{summary['name']} (uid {summary['uid']}) on node {summary['node']}",
             f"container {chosen['name']} {chosen['container_id'] or '(none running)'} {state}"
             + (f" ({detail})" if detail else "") + f", restarts {chosen['restart_count']}"
             + (f", last exit {chosen['last_terminated']['exit_code']} signal {chosen['last_terminated']['signal']}"
                if chosen["last_terminated"] else "")]
    if running and arming.get("rlimit_core_after"):
        before, after = arming["rlimit_core_before"], arming["rlimit_core_after"]
        lines.append(f"armed on the node: RLIMIT_CORE {before[0]}/{before[1]} -> {after[0]}/{after[1]}, "
                     f"coredump_filter {arming.get('coredump_filter_before')} -> {arming.get('coredump_filter_after')}")
    elif not running:
        for a in arming.get("armed") or ():
            lines.append(f"not running: armed its next start through {a['what'].split(' (')[0]} (pid {a['pid']}): "
                         f"RLIMIT_CORE {a['rlimit_core_before'][0]} -> {a['rlimit_core_after'][0]}")
        if not arming.get("armed"):
            lines.append("not running: nothing to arm now (no runtime shim of the pod found); what its next start "
                         "gets, as the agent found it on the node:")
        for note in arming.get("notes") or ():
            lines.append(f"  - {note}")
    lines.append(f"core_pattern:    {arming.get('core_pattern', '?')}")
    lines += format_destination(dest) if dest else ["core:            unknown (the agent sent no arming.json)"]
    core_sub = os.path.join(bdir, layout.CORE_DIR)
    earlier = sorted(os.listdir(core_sub)) if os.path.isdir(core_sub) else []
    lines.append(f"earlier crashes recorded by the node's core handler for this pod: {len(earlier)}"
                 + (f" (in {core_sub})" if earlier else ""))
    lines.append(f"Wrote {bdir}")
    left_path = os.path.join(bdir, LEFT_ON_NODE)
    if os.path.isfile(left_path):
        with open(left_path) as lf:
            left = json.load(lf).get("files") or []
        lines.append(f"{len(left)} file(s), {sum(x.get('size', 0) for x in left):,} bytes, too big for the pod log, "
                     f"stay on node {summary['node']} (listed in {LEFT_ON_NODE})")
    return {"bundle": bdir, "pod": summary, "node": node_summary, "agent_pod": agent_name, "lines": lines,
            "running": running, "arming": arming, "earlier_crashes": earlier,
            "survives": bool(dest) and destination_survives(dest)}
