"""A pod container's cgroup (systemd driver, containerd naming) for capture tests, and its removal."""
from __future__ import annotations

import contextlib
import os
import signal
import time
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


def _procs(cg: Path) -> list[int]:
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_cgroup(cg: Path, *, timeout: float = 10.0) -> None:
    """Remove the test cgroup ``cg`` and its now-empty parents below CGROUP_ROOT.

    Whatever still runs in it is killed first: a process whose parent the test killed (the PID 1
    of an ``unshare --fork`` namespace outlives ``unshare``) kept the cgroup busy, and it was left
    behind, empty, once that process ended.
    """
    deadline = time.monotonic() + timeout
    while cg.is_dir():
        for pid in _procs(cg):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            cg.rmdir()
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    for d in cg.parents:
        if d == CGROUP_ROOT or not str(d).startswith(str(CGROUP_ROOT)):
            break
        try:
            d.rmdir()
        except OSError:
            break  # another pod (or another test session's) is still there
