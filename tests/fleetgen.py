"""Synthetic `kubectl get -o json` documents shaped like the incident's fleet.

207 pods of one DaemonSet: 99 on RTX 6000 Ada nodes with the 570 driver, none restarting;
108 on H20 nodes with the 580 driver, 106 of them restarting, 11,648 restarts in all.
Deterministic (no randomness), so tests can assert exact figures.
"""
from __future__ import annotations

__all__ = ["incident_fleet", "big_fleet"]

ADA = {"nvidia.com/gpu.product": "NVIDIA-RTX-6000-Ada-Generation", "nvidia.com/cuda.driver.major": "570",
       "nvidia.com/cuda.driver.minor": "172", "nvidia.com/cuda.driver.rev": "08",
       "node.kubernetes.io/instance-type": "gpu-ada-8x"}
H20 = {"nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/cuda.driver.major": "580",
       "nvidia.com/cuda.driver.minor": "126", "nvidia.com/cuda.driver.rev": "09",
       "node.kubernetes.io/instance-type": "gpu-h20-8x"}
IMAGE_OLD = "registry.local/monitoring/nvitop-exporter@sha256:" + "a" * 64
IMAGE_NEW = "registry.local/monitoring/nvitop-exporter@sha256:" + "b" * 64


def _node(name: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name}}}


def _pod(i: int, node: str, restarts: int, code: int | None, image: str, loop: bool) -> dict:
    state = {"waiting": {"reason": "CrashLoopBackOff"}} if loop else {"running": {"startedAt": "2026-11-20T10:00:00Z"}}
    cs = {"name": "exporter", "restartCount": restarts, "imageID": "docker-pullable://" + image,
          "state": state, "lastState": {}}
    if code is not None:
        cs["lastState"] = {"terminated": {"exitCode": code, "reason": "Error",
                                          "finishedAt": f"2026-11-20T{10 + i % 10:02d}:00:00Z",
                                          "signal": {134: 6, 139: 11}.get(code)}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"nvitop-exporter-{i:05d}", "namespace": "monitoring", "uid": f"uid-{i:05d}",
                         "labels": {"app": "nvitop-exporter"}},
            "spec": {"nodeName": node}, "status": {"startTime": "2026-11-19T00:00:00Z", "containerStatuses": [cs]}}


def incident_fleet() -> tuple[dict, dict]:
    nodes, pods = [], []
    for i in range(99):
        nodes.append(_node(f"ada-{i:03d}", ADA))
        pods.append(_pod(i, f"ada-{i:03d}", 0, None, IMAGE_OLD, False))
    restarts = [110] * 106  # 106 restarting pods, 11,660 restarts: then trim to 11,648
    restarts[-1] -= 12
    for j in range(108):
        i = 99 + j
        r = restarts[j] if j < 106 else 0
        code = (134 if j % 4 else 139) if r else None
        image = IMAGE_NEW if j % 10 == 0 else IMAGE_OLD
        pods.append(_pod(i, f"h20-{j:03d}", r, code, image, loop=bool(r) and j % 3 == 0))
        nodes.append(_node(f"h20-{j:03d}", H20))
    return {"kind": "List", "items": pods}, {"kind": "List", "items": nodes}


def big_fleet(n: int = 10_000) -> tuple[dict, dict]:
    nodes, pods = [], []
    for i in range(n):
        labels = H20 if i % 2 else ADA
        name = f"node-{i:05d}"
        nodes.append(_node(name, labels))
        r = (i % 7) if labels is H20 else 0
        pods.append(_pod(i, name, r, 134 if r else None, IMAGE_OLD, False))
    return {"kind": "List", "items": pods}, {"kind": "List", "items": nodes}
