"""A pod container's cgroup (systemd driver, containerd naming) for capture tests, and its removal."""
from __future__ import annotations

from pathlib import Path

__all__ = ["CGROUP_ROOT", "pod_cgroup", "remove_cgroup"]

def _root() -> Path:
    """cgroup v1's pids hierarchy, else the unified (v2) hierarchy; a path that does not exist when neither."""
    v1 = Path("/sys/fs/cgroup/pids")
    if v1.is_dir():
        return v1
    if (Path("/sys/fs/cgroup") / "cgroup.controllers").is_file():  # cgroup2 mounted at /sys/fs/cgroup
        return Path("/sys/fs/cgroup")
    return v1


CGROUP_ROOT = _root()


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
