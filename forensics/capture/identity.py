"""Pod and container identity from a process's cgroup path, and its image from the runtime's state.

Kubernetes puts every container in a cgroup named after the pod UID and the container ID.
The names differ by cgroup driver and runtime; all of these are read (cgroup v1 and v2):

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<64-hex id>``
- systemd driver:
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/<runtime>-<id>.scope``
  where ``<runtime>`` is ``cri-containerd`` (containerd), ``crio`` (CRI-O) or ``docker``
- plain Docker: ``/docker/<id>`` or ``/system.slice/docker-<id>.scope``

The container ID is never taken from the hostname (which a pod may set to anything).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

__all__ = ["ContainerIdentity", "parse_cgroup", "find_container_identity", "read_image_name"]

_ID = r"[0-9a-f]{64}"
_SCOPE = re.compile(rf"(?:^|/)(?P<rt>cri-containerd|crio|docker|containerd)-(?P<id>{_ID})\.scope$")
_PLAIN_ID = re.compile(rf"(?:^|/)(?P<id>{_ID})$")
_DOCKER_DIR = re.compile(rf"/docker/(?P<id>{_ID})$")
_POD = re.compile(r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?(?:/|$)")
_QOS = re.compile(r"kubepods[-/.](?:slice/kubepods-)?(?P<qos>burstable|besteffort)")
_RUNTIME_NAMES = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerIdentity:
    """Who a process is, as far as its cgroup says."""

    cgroup_path: str
    cgroup_version: int  # 1 or 2 (the line the identity was read from)
    container_id: str | None
    runtime: str | None  # "containerd", "cri-o", "docker"; None when the name does not say
    pod_uid: str | None
    qos_class: str | None  # "guaranteed", "burstable", "besteffort" (kubepods only)

    @property
    def in_container(self) -> bool:
        return self.container_id is not None


def _identity_of_path(path: str, version: int) -> ContainerIdentity | None:
    rt = cid = None
    m = _SCOPE.search(path)
    if m:
        rt, cid = _RUNTIME_NAMES[m.group("rt")], m.group("id")
    else:
        m = _DOCKER_DIR.search(path)
        if m:
            rt, cid = "docker", m.group("id")
        else:
            m = _PLAIN_ID.search(path)
            if m:
                cid = m.group("id")
    pod = _POD.search(path)
    if cid is None and pod is None:
        return None
    qos = None
    if "kubepods" in path:
        q = _QOS.search(path)
        qos = q.group("qos") if q else "guaranteed"
    return ContainerIdentity(
        cgroup_path=path,
        cgroup_version=version,
        container_id=cid,
        runtime=rt,
        pod_uid=pod.group("uid").replace("_", "-") if pod else None,
        qos_class=qos,
    )


def parse_cgroup(text: str) -> ContainerIdentity:
    """Read ``/proc/PID/cgroup`` text: the container and pod, or an identity with none of them.

    The v2 line (``0::``) is preferred; on v1 the first line that names a container is used.

    >>> pod = "kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice"
    >>> parse_cgroup(f"0::/kubepods.slice/kubepods-burstable.slice/{pod}/cri-containerd-{'ab' * 32}.scope\\n").pod_uid
    '0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b'
    """
    v1_found = None
    v2_path = None
    first_path = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if first_path is None:
            first_path = path
        if hid == "0" and controllers == "":
            v2_path = path
            found = _identity_of_path(path, 2)
            if found:
                return found
        elif v1_found is None:
            v1_found = _identity_of_path(path, 1)
    if v1_found:
        return v1_found
    path = v2_path if v2_path is not None else (first_path or "/")
    return ContainerIdentity(cgroup_path=path, cgroup_version=2 if v2_path is not None else 1,
                             container_id=None, runtime=None, pod_uid=None, qos_class=None)


def find_container_identity(pid: int) -> ContainerIdentity:
    """:func:`parse_cgroup` of ``/proc/PID/cgroup``."""
    from ..procfs import read_proc_text

    return parse_cgroup(read_proc_text(pid, "cgroup"))


# Where each runtime keeps a container's OCI config / its own record, by container ID.
_RUNTIME_STATE = (
    ("/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
     ("annotations", "io.kubernetes.cri.image-name")),
    ("/run/containerd/io.containerd.runtime.v2.task/moby/{id}/config.json",
     ("annotations", "org.opencontainers.image.ref.name")),
    ("/run/containers/storage/overlay-containers/{id}/userdata/config.json",
     ("annotations", "io.kubernetes.cri-o.ImageName")),
    ("/var/lib/containers/storage/overlay-containers/{id}/userdata/config.json",
     ("annotations", "io.kubernetes.cri-o.ImageName")),
    ("/var/lib/docker/containers/{id}/config.v2.json", ("Config", "Image")),
)


def read_image_name(container_id: str, host_root: str = "/") -> str | None:
    """The container's image name from its runtime's state on this host, or None.

    :param host_root: the host's filesystem (``/`` on the node, ``/host`` in an agent pod)
    """
    if not re.fullmatch(_ID, container_id or ""):
        return None
    for template, (outer, inner) in _RUNTIME_STATE:
        path = os.path.join(host_root, template.format(id=container_id).lstrip("/"))
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read(4 << 20))
        except (OSError, ValueError):  # probing: each runtime keeps its state in its own place
            continue
        value = (data.get(outer) or {}).get(inner) if isinstance(data, dict) else None
        if isinstance(value, str) and value:
            return value
    return None
