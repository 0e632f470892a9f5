"""The agent's side of ``capture --pod``, and the protocol between it and the workstation.

Inside the privileged agent pod, :func:`run_agent` arms the container's processes (node mode),
adds the core handler's earlier records of the pod, and frames the bundle (a base64 tar.gz
between :data:`BEGIN` and :data:`END`) for the pod log; :func:`decode_bundle` reads it back
on the workstation.  What does not fit the log stays on the node (:data:`LEFT_ON_NODE`).
Nothing here prints: ``forensics agent run`` says the notes and writes the bundle.
"""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass

from ..bundle.layout import CORE_DIR, CRASHES, LEFT_ON_NODE, OBJECTS
from ..errors import EXIT_ERROR, EXIT_OK, AgentFailed, ForensicsError

__all__ = ["BEGIN", "END", "AgentRun", "frame_bundle", "decode_bundle", "run_agent", "plan_inline"]

BEGIN = "----- FORENSICS BUNDLE BEGIN -----"
END = "----- FORENSICS BUNDLE END -----"
_B64_LINE = re.compile(r"[A-Za-z0-9+/=]{1,76}")


def decode_bundle(log: str) -> bytes:
    """The bundle's bytes from the agent pod's log (stdout and stderr merged).

    :raises AgentFailed: when the log holds no bundle
    """
    lines = log.splitlines()
    try:
        a, b = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise AgentFailed("agent", "its log holds no bundle") from None
    # the pod log merges stdout and stderr: keep only the base64 lines between the markers
    body = [ln.strip() for ln in lines[a + 1 : b] if _B64_LINE.fullmatch(ln.strip())]
    return base64.b64decode("".join(body))


def _host_root() -> str:
    try:
        os.listdir("/proc/1/root")
        return "/proc/1/root"
    except OSError:  # probing: no host PID namespace (or no access to PID 1's root), so this is the node's view
        return "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentRun:
    """What the agent says: notes (stderr, before the bundle), the framed bundle (stdout), a last line."""

    exit_code: int
    notes: tuple[str, ...] = ()
    bundle: str | None = None  # BEGIN, base64 lines, END: what the workstation reads back from the pod log
    done: str | None = None


def frame_bundle(data: bytes) -> str:
    """The bundle's bytes as the pod log carries them: base64 in 76-character lines between markers."""
    text = base64.b64encode(data).decode()
    return "\n".join([BEGIN, *(text[i : i + 76] for i in range(0, len(text), 76)), END]) + "\n"


def run_agent(*, container_id: str | None, core_dir: str, host_root: str | None, coredump_filter: int | None,
              full: bool, max_inline: int, pod_uid: str | None = None) -> AgentRun:
    """Arm the container's processes, write the node bundle, and frame it (base64 tar.gz) between markers.

    The bundle travels through the pod log, which the kubelet rotates (10 MiB by default) and a rotated
    log loses its start: the metadata always goes, then stored objects and cores while they fit in
    ``max_inline`` bytes; what does not fit stays on the node, listed in ``left-on-node.json``.
    """
    from .node import DEFAULT_FILTER, FULL_FILTER, arm_process, capture_pid, find_container_pids

    root = host_root if host_root and host_root != "/" else _host_root()
    if container_id is None:  # not running (CrashLoopBackOff): what can be armed is the node's side
        from .node import capture_waiting_pod

        if not pod_uid:
            return AgentRun(exit_code=EXIT_ERROR, notes=("--waiting needs --pod-uid",))
        try:
            bundle, _ = capture_waiting_pod(pod_uid, core_dir=core_dir, host_root=root)
        except ForensicsError as e:
            return AgentRun(exit_code=EXIT_ERROR, notes=(str(e),))
        _add_earlier_crashes(bundle, core_dir, None, pod_uid)
        notes, framed = _frame_node_bundle(bundle, max_inline)
        return AgentRun(exit_code=EXIT_OK, notes=tuple(notes), bundle=framed,
                        done=f"pod {pod_uid}: not running, its node's side captured, bundle {bundle} on the node")
    pids = find_container_pids(container_id)
    if not pids:
        return AgentRun(exit_code=EXIT_ERROR, notes=(f"no process of container {container_id} on this node",))
    notes = []
    try:
        r = capture_pid(pids[0], core_dir=core_dir, full=full, coredump_filter=coredump_filter, host_root=root)
        filt = coredump_filter if coredump_filter is not None else (FULL_FILTER if full else DEFAULT_FILTER)
        for pid in pids[1:]:
            try:
                arm_process(pid, coredump_filter=filt)
            except ForensicsError as e:
                notes.append(f"pid {pid}: {e}")
    except ForensicsError as e:
        return AgentRun(exit_code=EXIT_ERROR, notes=(*notes, str(e)))
    cid = container_id.split("://")[-1]
    _add_earlier_crashes(r.bundle, core_dir, cid, pod_uid)
    more, framed = _frame_node_bundle(r.bundle, max_inline)
    return AgentRun(exit_code=EXIT_OK, notes=(*notes, *more), bundle=framed,
                    done=f"captured pid {r.pid}, bundle {r.bundle} on the node")


def _frame_node_bundle(bundle: str, max_inline: int) -> tuple[list[str], str]:
    """(notes, framed bundle): what fits the pod log's budget, the rest listed in left-on-node.json."""
    notes = []
    take, left = plan_inline(bundle, max_inline)
    if left:
        with open(os.path.join(bundle, LEFT_ON_NODE), "w") as f:
            json.dump({"node_bundle": bundle, "max_inline": max_inline, "files": left}, f, indent=2, sort_keys=True)
        take.append(LEFT_ON_NODE)
        notes += [f"{item['path']} ({item['size']} bytes) left on the node at {item['node_path']}" for item in left]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel in take:
            tar.add(os.path.join(bundle, rel), arcname=rel)
    return notes, frame_bundle(buf.getvalue())


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
            if f.endswith(".zst") and CORE_DIR in rel.split(os.sep)[0]:
                rank = 2
            else:
                rank = 1 if rel.startswith(OBJECTS + os.sep) else 0
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
    if not a or not b:
        return False
    return a.replace("_", "-").lower() == b.replace("_", "-").lower()


def _add_earlier_crashes(bundle_dir: str, core_dir: str, container_id: str | None, pod_uid: str | None = None) -> None:
    """Copy the core handler's records of this container, or of any earlier container of the pod, into the bundle."""
    from ..bundle.read import read_crash_record
    from ..bundle.record import IndexEntry
    from .budget import read_index

    for e in read_index(core_dir):
        if not isinstance(e, IndexEntry) or not ((container_id and e.container_id == container_id)
                                                 or _same_pod(e.pod_uid, pod_uid)):
            continue
        src = os.path.join(core_dir, CRASHES, e.id)
        dest = os.path.join(bundle_dir, CORE_DIR, e.id)
        if not os.path.isdir(src) or os.path.exists(dest):
            continue
        shutil.copytree(src, dest)
        rec = read_crash_record(src)
        for key in rec.objects.values() if rec is not None else ():
            s = os.path.join(core_dir, OBJECTS, key[:2], key[2:])
            d = os.path.join(bundle_dir, OBJECTS, key[:2], key[2:])
            if os.path.isfile(s) and not os.path.exists(d):
                os.makedirs(os.path.dirname(d), exist_ok=True)
                shutil.copy2(s, d)
