"""A pod container's cgroup (systemd driver, containerd naming) for capture tests, and its removal."""
from __future__ import annotations

from pathlib import Path

__all__ = ["CGROUP_ROOT", "pod_cgroup", "remove_cgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup/pids")


def pod_cgroup(pod_uid: str, container_id: str) -> Path:
    """Where the kubelet (systemd cgroup driver) and containerd put a burstable pod's container."""
    return (CGROUP_ROOT / "kubepods.slice" / "kubepods-burstable.slice" /
            f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice" / f"cri-containerd-{container_id}.scope")


def remove_cgroup(cg: Path) -> None:
    """Remove ``cg`` and its now-empty parents below CGROUP_ROOT (its processes must be gone)."""
    for d in [cg, *cg.parents]:
        if d == CGROUP_ROOT:
            break
        try:
            d.rmdir()
        except OSError:
            pass
