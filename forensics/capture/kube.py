"""``forensics capture --pod``: capture a pod's container from a workstation, through kubectl.

Steps: read the pod (node, UID, container IDs, restart counts, last terminated state with
exit code and signal), its events and its node (GPU labels, driver, kernel, runtime); start
a short-lived privileged agent pod pinned to that node (``nodeName``, ``hostPID``, the core
directory as a hostPath mounted at the same path), which finds the container's processes by
container ID in ``/proc/*/cgroup`` (never by hostname), runs the node mode for them and
prints its bundle (a base64 tar.gz between markers) to its log; read the log, unpack the
bundle, add the Kubernetes items, write the manifest; delete the agent pod whatever happens
(errors, Ctrl-C, SIGTERM).

Also the DaemonSet that installs the core handler on every GPU node
(:func:`daemonset_manifest`).
"""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import uuid
from dataclasses import dataclass

from ..errors import (
    AgentFailed,
    ContainerNotRunning,
    ForensicsError,
    KubeError,
    KubectlNotFound,
    NodeUnreachable,
    PodNotFound,
)

__all__ = [
    "KubeOptions",
    "capture_pod",
    "agent_pod_manifest",
    "daemonset_manifest",
    "agent_main",
    "plan_inline",
    "LEFT_ON_NODE",
    "to_yaml",
    "summarize_pod",
    "BEGIN",
    "END",
]

BEGIN = "----- FORENSICS BUNDLE BEGIN -----"
_B64_LINE = re.compile(r"[A-Za-z0-9+/=]{1,76}")
END = "----- FORENSICS BUNDLE END -----"
_GPU_LABELS = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/cuda.driver.major",
               "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev", "nvidia.com/cuda.driver-version.full",
               "nvidia.com/gpu.driver-version.full", "nvidia.com/mig.strategy", "nvidia.com/gpu.present")


@dataclass(frozen=True)
class KubeOptions:
    kubectl: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None

    def argv(self, namespaced: bool = True) -> list[str]:
        exe = shutil.which(self.kubectl)
        if exe is None:
            raise KubectlNotFound(self.kubectl)
        out = [exe]
        if self.kubeconfig:
            out += ["--kubeconfig", self.kubeconfig]
        if self.context:
            out += ["--context", self.context]
        if namespaced and self.namespace:
            out += ["--namespace", self.namespace]
        return out


def _run(opts: KubeOptions, action: str, args: list[str], *, stdin: str | None = None, namespaced: bool = True,
         timeout: float = 60.0) -> str:
    cmd = opts.argv(namespaced) + args
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise KubeError(action, f"no answer in {timeout:g}s") from e
    except OSError as e:
        raise KubectlNotFound(opts.kubectl) from e
    if p.returncode != 0:
        raise KubeError(action, (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()[-1])
    return p.stdout


def _get_json(opts: KubeOptions, action: str, args: list[str], **kw) -> dict:
    out = _run(opts, action, args + ["-o", "json"], **kw)
    try:
        return json.loads(out)
    except ValueError as e:
        raise KubeError(action, f"not JSON: {out[:200]!r}") from e


def summarize_pod(pod: dict) -> dict:
    """Identity and scheduling state of a pod: what an on-call engineer reads first."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    owners = [{"kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid")} for o in meta.get("ownerReferences", [])]
    containers = []
    for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
        last = (cs.get("lastState") or {}).get("terminated")
        state = cs.get("state") or {}
        containers.append({
            "name": cs.get("name"), "container_id": cs.get("containerID"), "image": cs.get("image"),
            "image_id": cs.get("imageID"), "restart_count": cs.get("restartCount", 0), "ready": cs.get("ready"),
            "state": next(iter(state), None), "state_detail": next(iter(state.values()), None),
            "last_terminated": None if not last else {
                "exit_code": last.get("exitCode"), "signal": last.get("signal") or (last.get("exitCode", 0) - 128
                                                                                   if last.get("exitCode", 0) > 128 else None),
                "reason": last.get("reason"), "started_at": last.get("startedAt"), "finished_at": last.get("finishedAt")},
        })
    return {
        "name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"), "owners": owners,
        "node": spec.get("nodeName"), "phase": status.get("phase"), "qos_class": status.get("qosClass"),
        "pod_ip": status.get("podIP"), "host_ip": status.get("hostIP"), "start_time": status.get("startTime"),
        "conditions": status.get("conditions", []), "containers": containers,
    }


def summarize_node(node: dict) -> dict:
    meta, status = node.get("metadata", {}), node.get("status", {})
    info = status.get("nodeInfo", {})
    labels = meta.get("labels", {})
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), {})
    return {
        "name": meta.get("name"), "uid": meta.get("uid"),
        "gpu_labels": {k: v for k, v in labels.items() if k in _GPU_LABELS or k.startswith("nvidia.com/")},
        "kernel": info.get("kernelVersion"), "os_image": info.get("osImage"),
        "container_runtime": info.get("containerRuntimeVersion"), "kubelet": info.get("kubeletVersion"),
        "ready": ready.get("status"), "ready_reason": ready.get("reason"), "ready_message": ready.get("message"),
        "allocatable": status.get("allocatable", {}), "taints": node.get("spec", {}).get("taints", []),
    }


def agent_pod_manifest(*, name: str, namespace: str, node: str, container_id: str, core_dir: str, image: str,
                       timeout: float = 300.0, coredump_filter: int | None = None, full: bool = False,
                       pod_uid: str | None = None) -> dict:
    """The short-lived privileged agent pod: pinned to ``node``, hostPID, the core directory as a hostPath."""
    args = ["agent", "run", "--container-id", container_id, "--core-dir", core_dir]
    if pod_uid:  # the crashes of earlier containers of the pod (a restart gets a new container ID)
        args += ["--pod-uid", pod_uid]
    if coredump_filter is not None:
        args += ["--coredump-filter", f"0x{coredump_filter:x}"]
    if full:
        args.append("--full")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "forensics-agent", "app.kubernetes.io/managed-by": "forensics"}},
        "spec": {
            "nodeName": node,  # pinned: no scheduler involved
            "hostPID": True,  # /proc shows the node's processes; /proc/1/root is the node's filesystem
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(timeout),
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "agent",
                "image": image,
                "command": ["forensics"],
                "args": args,
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "cores", "mountPath": core_dir}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
            }],
            "volumes": [{"name": "cores", "hostPath": {"path": core_dir, "type": "DirectoryOrCreate"}}],
        },
    }


def daemonset_manifest(*, core_dir: str, image: str, namespace: str, gpu_label: str, host_prefix: str,
                       bounds: dict[str, int] | None = None) -> str:
    """A DaemonSet that installs ``forensics core-handler`` as kernel.core_pattern on every GPU node.

    The kernel runs the handler on the host, so the init container copies the image's
    self-contained installation (``/opt/forensics``: its interpreter and venv) to the host's
    ``host_prefix``; the container installs the pattern (recording the previous one) and
    restores it when the pod stops (preStop).  ``bounds`` (``max_core_size``, ``budget``, ``min_free``,
    ``loop_limit``) are passed to ``--install-handler``, which records them in the core directory.
    """
    key, _, value = gpu_label.partition("=")
    handler = f"{host_prefix}/bin/forensics"
    install = f"{handler} capture --install-handler --core-dir {core_dir}"
    for name, v in sorted((bounds or {}).items()):
        if v is not None:
            install += f" --{name.replace('_', '-')} {int(v)}"
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "forensics-core-handler", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "forensics-core-handler"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "forensics-core-handler"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "forensics-core-handler"}},
                "spec": {
                    "nodeSelector": {key: value},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute"},
                        {"operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "hostPID": True,
                    "priorityClassName": "system-node-critical",
                    "automountServiceAccountToken": False,
                    "initContainers": [{
                        "name": "install-files",
                        "image": image,
                        "command": ["sh", "-c", f"cp -a /opt/forensics/. /host{host_prefix}/"],
                        "volumeMounts": [{"name": "prefix", "mountPath": f"/host{host_prefix}"}],
                    }],
                    "containers": [{
                        "name": "core-handler",
                        "image": image,
                        "command": ["sh", "-c", f"{install} && exec sleep infinity"],
                        "lifecycle": {"preStop": {"exec": {"command": [handler, "capture", "--uninstall-handler",
                                                                       "--core-dir", core_dir]}}},
                        "securityContext": {"privileged": True},  # writes /proc/sys/kernel/core_pattern
                        "volumeMounts": [{"name": "cores", "mountPath": core_dir},
                                         {"name": "prefix", "mountPath": host_prefix}],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                    }],
                    "volumes": [
                        {"name": "cores", "hostPath": {"path": core_dir, "type": "DirectoryOrCreate"}},
                        {"name": "prefix", "hostPath": {"path": host_prefix, "type": "DirectoryOrCreate"}},
                    ],
                },
            },
        },
    }
    return to_yaml(ds)


def _scalar(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar


def to_yaml(obj, indent: int = 0) -> str:
    """A small YAML emitter for manifests (dicts, lists, scalars)."""
    pad = "  " * indent
    lines = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines.append(to_yaml(v, indent + 1).rstrip("\n"))
            else:
                lines.append(f"{pad}{k}: {_scalar(v) if not isinstance(v, (dict, list)) else ('{}' if isinstance(v, dict) else '[]')}")
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                inner = to_yaml(v, indent + 1).rstrip("\n").split("\n")
                first = inner[0][len("  " * (indent + 1)):]
                lines.append(f"{pad}- {first}")
                lines.extend(inner[1:])
            else:
                lines.append(f"{pad}- {_scalar(v)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines) + "\n"


class _Terminate(BaseException):
    pass


def capture_pod(pod_name: str, *, container: str | None, opts: KubeOptions, core_dir: str, agent_image: str | None,
                dry_run: bool, output: str, timeout: float = 300.0, coredump_filter: int | None = None,
                full: bool = False) -> dict:
    """Capture ``pod_name``'s container through kubectl; see the module docstring.

    :raises KubectlNotFound, PodNotFound, KubeError, ContainerNotRunning, NodeUnreachable, AgentFailed:
    """
    try:
        pod = _get_json(opts, "get pod", ["get", "pod", pod_name])
    except KubeError as e:
        if "NotFound" in e.detail or "not found" in e.detail:
            raise PodNotFound(pod_name, opts.namespace or "(context default)") from e
        raise
    summary = summarize_pod(pod)
    ns = summary["namespace"] or opts.namespace or "default"
    cs = summary["containers"]
    if not cs:
        raise ContainerNotRunning(pod_name, container or "?", f"pod phase {summary['phase']}, no container status")
    chosen = next((c for c in cs if c["name"] == container), None) if container else cs[0]
    if chosen is None:
        raise ForensicsError(f"pod {ns}/{pod_name} has no container {container!r} (it has: {', '.join(c['name'] for c in cs)})",
                             help_text="Pass --container NAME with one of those names.")
    if chosen["state"] != "running" or not chosen["container_id"]:
        detail = chosen["state_detail"] or {}
        raise ContainerNotRunning(pod_name, chosen["name"], f"{chosen['state']}: {detail.get('reason', '')}".strip(": "))
    node_name = summary["node"]
    image = agent_image or "ghcr.io/forensics/forensics:latest"
    agent_name = f"forensics-agent-{uuid.uuid4().hex[:8]}"
    manifest = agent_pod_manifest(name=agent_name, namespace=ns, node=node_name, container_id=chosen["container_id"],
                                  core_dir=core_dir, image=image, timeout=timeout, coredump_filter=coredump_filter, full=full,
                                  pod_uid=summary["uid"])
    if dry_run:
        return {"manifest": to_yaml(manifest)}
    node = _get_json(opts, "get node", ["get", "node", node_name], namespaced=False)
    node_summary = summarize_node(node)
    if node_summary["ready"] != "True":
        raise NodeUnreachable(node_name, f"Ready={node_summary['ready']} ({node_summary['ready_reason'] or 'no reason given'})")
    events = _get_json(opts, "get events", ["get", "events", "--namespace", ns,
                                            "--field-selector", f"involvedObject.uid={summary['uid']}"], namespaced=False)
    log = _run_agent(opts, ns, agent_name, manifest, timeout)
    return _write_pod_bundle(output, pod, summary, node, node_summary, events, chosen, log, agent_name)


def _run_agent(opts: KubeOptions, ns: str, name: str, manifest: dict, timeout: float) -> str:
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
        _run(opts, "create agent pod", ["create", "--validate=false", "-f", "-", *kns], stdin=json.dumps(manifest), namespaced=False)
        deadline = time.monotonic() + timeout
        phase, status = "Pending", {}
        while time.monotonic() < deadline:
            status = _get_json(opts, "get agent pod", ["get", "pod", name, *kns], namespaced=False).get("status", {})
            phase = status.get("phase", "Pending")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        else:
            waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in status.get("containerStatuses", [])]
            if phase == "Pending" and not any(waiting):
                raise NodeUnreachable(manifest["spec"]["nodeName"], f"the agent pod stayed Pending for {timeout:g}s")
            raise AgentFailed(name, f"still {phase} after {timeout:g}s ({', '.join(w for w in waiting if w) or 'no reason'})")
        log = _run(opts, "logs agent pod", ["logs", name, *kns], namespaced=False, timeout=max(60.0, timeout))
        if phase == "Failed":
            tail = "\n".join(line for line in log.splitlines() if not line.startswith(("H4sI",)) and len(line) < 400)[-800:]
            raise AgentFailed(name, tail.strip() or "the agent exited with an error")
        return log
    except _Terminate:
        raise KeyboardInterrupt from None
    finally:
        try:  # always, even when create's answer was lost: --ignore-not-found
            _run(opts, "delete agent pod", ["delete", "pod", name, *kns, "--ignore-not-found", "--wait=false"],
                 namespaced=False, timeout=30)
        except ForensicsError:
            pass
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _decode_bundle(log: str) -> bytes:
    lines = log.splitlines()
    try:
        a, b = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise AgentFailed("agent", "its log holds no bundle") from None
    # the pod log merges stdout and stderr: keep only the base64 lines between the markers
    body = [ln.strip() for ln in lines[a + 1 : b] if _B64_LINE.fullmatch(ln.strip())]
    return base64.b64decode("".join(body))


def _write_pod_bundle(output, pod, summary, node, node_summary, events, chosen, log, agent_name) -> dict:
    from .bundle import BundleWriter, new_bundle_dir

    data = _decode_bundle(log)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bdir = new_bundle_dir(output, f"{stamp}-{summary['namespace']}-{summary['name']}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(bdir, filter="data")
    w = BundleWriter(bdir)
    for dirpath, _, files in os.walk(bdir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), bdir)
            if rel != "MANIFEST.json":
                w.note_file(rel, "from the agent on the node")
    ident_path = os.path.join(bdir, "00-identity.json")
    ident = {}
    if os.path.isfile(ident_path):
        with open(ident_path) as f:
            ident = json.load(f)
    ident.update({"pod": summary["name"], "namespace": summary["namespace"], "pod_uid": summary["uid"],
                  "owners": summary["owners"], "node_uid": node_summary["uid"], "node": summary["node"],
                  "container": chosen["name"], "container_id": chosen["container_id"], "agent_pod": agent_name})
    w.add_json("00-identity.json", ident, "who was captured: pod, owners (job), node and container UIDs, time")
    items = sorted(events.get("items", []), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    w.add_json("10-kubernetes/events.json", [{
        "time": e.get("lastTimestamp") or e.get("eventTime"), "type": e.get("type"), "reason": e.get("reason"),
        "message": e.get("message"), "count": e.get("count"), "source": e.get("source")} for e in items],
        "the pod's events, oldest first")
    w.add_json("10-kubernetes/scheduling.json", {"pod": summary, "node": node_summary},
               "scheduling state: node, phase, containers with restart counts and last exit code / signal, node GPU labels")
    w.add_json("10-kubernetes/pod.json", pod, "the pod object as the API server returned it")
    w.add_json("10-kubernetes/node.json", node, "the node object as the API server returned it")
    w.write_manifest({"pod": f"{summary['namespace']}/{summary['name']}"})
    lines = [f"pod {summary['namespace']}/{summary['name']} (uid {summary['uid']}) on node {summary['node']}",
             f"container {chosen['name']} {chosen['container_id']} restarts {chosen['restart_count']}"
             + (f", last exit {chosen['last_terminated']['exit_code']} signal {chosen['last_terminated']['signal']}"
                if chosen["last_terminated"] else ""),
             f"Wrote {bdir}"]
    left_path = os.path.join(bdir, LEFT_ON_NODE)
    if os.path.isfile(left_path):
        with open(left_path) as f:
            left = json.load(f).get("files") or []
        lines.append(f"{len(left)} file(s), {sum(x.get('size', 0) for x in left):,} bytes, too big for the pod log, "
                     f"stay on node {summary['node']} (listed in {LEFT_ON_NODE})")
    return {"bundle": bdir, "pod": summary, "node": node_summary, "agent_pod": agent_name, "lines": lines}


# -- inside the agent pod ------------------------------------------------------------------------


def _host_root() -> str:
    try:
        os.listdir("/proc/1/root")
        return "/proc/1/root"
    except OSError:
        return "/"


def agent_main(*, container_id: str, core_dir: str, host_root: str | None, coredump_filter: int | None, full: bool,
               max_inline: int, pod_uid: str | None = None) -> int:
    """Arm the container's processes, write the node bundle, print it (base64 tar.gz) between markers.

    The bundle travels through the pod log, which the kubelet rotates (10 MiB by default) and a rotated
    log loses its start: the metadata always goes, then stored objects and cores while they fit in
    ``max_inline`` bytes; what does not fit stays on the node, listed in ``left-on-node.json``.
    """
    import sys

    from .node import arm_process, capture_pid, find_container_pids, DEFAULT_FILTER, FULL_FILTER

    root = host_root if host_root and host_root != "/" else _host_root()
    pids = find_container_pids(container_id)
    if not pids:
        print(f"forensics agent: no process of container {container_id} on this node", file=sys.stderr)
        return 1
    try:
        r = capture_pid(pids[0], core_dir=core_dir, full=full, coredump_filter=coredump_filter, host_root=root)
        filt = coredump_filter if coredump_filter is not None else (FULL_FILTER if full else DEFAULT_FILTER)
        for pid in pids[1:]:
            try:
                arm_process(pid, coredump_filter=filt)
            except ForensicsError as e:
                print(f"forensics agent: pid {pid}: {e}", file=sys.stderr)
    except ForensicsError as e:
        print(f"forensics agent: {e}", file=sys.stderr)
        return 1
    cid = container_id.split("://")[-1]
    _add_earlier_crashes(r.bundle, core_dir, cid, pod_uid)
    take, left = plan_inline(r.bundle, max_inline)
    if left:
        with open(os.path.join(r.bundle, LEFT_ON_NODE), "w") as f:
            json.dump({"node_bundle": r.bundle, "max_inline": max_inline, "files": left}, f, indent=2, sort_keys=True)
        take.append(LEFT_ON_NODE)
        for item in left:
            print(f"forensics agent: {item['path']} ({item['size']} bytes) left on the node at {item['node_path']}",
                  file=sys.stderr)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel in take:
            tar.add(os.path.join(r.bundle, rel), arcname=rel)
    data = base64.b64encode(buf.getvalue()).decode()
    sys.stderr.flush()
    sys.stdout.write("\n".join([BEGIN, *(data[i : i + 76] for i in range(0, len(data), 76)), END]) + "\n")
    sys.stdout.flush()
    print(f"forensics agent: captured pid {r.pid}, bundle {r.bundle} on the node", file=sys.stderr)
    return 0


LEFT_ON_NODE = "left-on-node.json"


def plan_inline(bundle_dir: str, max_inline: int) -> tuple[list[str], list[dict]]:
    """Which files of a node bundle go through the pod log, and which stay on the node.

    Everything but stored objects and cores goes (metadata, logs: small and bounded where they are
    made); then objects, then cores, smallest first, while the running total stays within ``max_inline``.
    :return: (relative paths to send, ``[{path, size, node_path}]`` left on the node)
    """
    files = []
    for dirpath, _, names in os.walk(bundle_dir):
        for f in names:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, bundle_dir)
            if rel == LEFT_ON_NODE:
                continue
            rank = 2 if f.endswith(".zst") and "50-core" in rel.split(os.sep)[0] else 1 if rel.startswith("objects" + os.sep) else 0
            files.append((rank, os.lstat(p).st_size, rel))
    take, left, total = [], [], 0
    for rank, size, rel in sorted(files):
        if rank and total + size > max_inline:
            left.append({"path": rel, "size": size, "node_path": os.path.join(bundle_dir, rel)})
            continue
        total += size
        take.append(rel)
    return sorted(take), left


def _same_pod(a: str | None, b: str | None) -> bool:
    """Pod UIDs as the API server (dashes) and a systemd cgroup path (underscores) write them."""
    return bool(a and b) and a.replace("_", "-").lower() == b.replace("_", "-").lower()


def _add_earlier_crashes(bundle_dir: str, core_dir: str, container_id: str, pod_uid: str | None = None) -> None:
    """Copy the core handler's records of this container, or of any earlier container of the pod, into the bundle."""
    from .budget import read_index

    for e in read_index(core_dir):
        if not e.get("id") or not (e.get("container_id") == container_id or _same_pod(e.get("pod_uid"), pod_uid)):
            continue
        src = os.path.join(core_dir, "crashes", e["id"])
        dest = os.path.join(bundle_dir, "50-core", e["id"])
        if not os.path.isdir(src) or os.path.exists(dest):
            continue
        shutil.copytree(src, dest)
        try:
            with open(os.path.join(src, "metadata.json")) as f:
                keys = (json.load(f).get("objects") or {}).values()
        except (OSError, ValueError):
            keys = ()
        for key in keys:
            s = os.path.join(core_dir, "objects", key[:2], key[2:])
            d = os.path.join(bundle_dir, "objects", key[:2], key[2:])
            if os.path.isfile(s) and not os.path.exists(d):
                os.makedirs(os.path.dirname(d), exist_ok=True)
                shutil.copy2(s, d)
