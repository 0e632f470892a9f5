"""A pod container's cgroup (systemd driver, containerd naming) for capture tests, and its removal."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["CGROUP_ROOT", "pod_cgroup", "remove_cgroup", "MemoryCgroup", "memory_cgroup"]

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


class MemoryCgroup:
    """A memory cgroup of the test's own with a limit (v1: ``memory.limit_in_bytes`` and, where swap is
    accounted, ``memory.memsw.limit_in_bytes``; v2: ``memory.max``); :meth:`enter` is a ``preexec_fn`` that
    puts the child in it.  :attr:`oom_kills` and :attr:`peak` read what happened there."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2

    def enter(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    @property
    def oom_kills(self) -> int:
        text = self._read("memory.events" if self.v2 else "memory.oom_control")
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    @property
    def peak(self) -> int | None:
        text = self._read("memory.peak" if self.v2 else "memory.max_usage_in_bytes").strip()
        return int(text) if text.isdigit() else None


@contextlib.contextmanager
def memory_cgroup(limit: int, name: str):
    """A :class:`MemoryCgroup` limited to ``limit`` bytes, removed afterwards (what still runs in it killed);
    None when this machine has no memory controller the test may use (not root, no hierarchy)."""
    v1 = Path("/sys/fs/cgroup/memory")
    unified = Path("/sys/fs/cgroup")
    if v1.is_dir():
        cg, v2 = v1 / f"{name}-{os.getpid()}", False
    elif "memory" in (unified / "cgroup.subtree_control").read_text(errors="replace").split() \
            if (unified / "cgroup.subtree_control").is_file() else False:
        cg, v2 = unified / f"{name}-{os.getpid()}", True
    else:
        yield None
        return
    try:
        cg.mkdir()
    except OSError:
        yield None
        return
    try:
        if v2:
            (cg / "memory.max").write_text(str(limit))
            with contextlib.suppress(OSError):
                (cg / "memory.swap.max").write_text("0")
        else:
            (cg / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(OSError):
                (cg / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield MemoryCgroup(cg, v2)
    finally:
        remove_cgroup(cg)
