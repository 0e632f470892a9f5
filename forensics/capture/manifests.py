"""Kubernetes manifests of capture: the short-lived agent pod of ``capture --pod``, and the DaemonSet
that installs the core handler on every GPU node (``forensics agent manifest``), as YAML.

Pure: dicts and text, no I/O.
"""
from __future__ import annotations

import json

__all__ = ["agent_pod_manifest", "daemonset_manifest", "to_yaml"]


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
