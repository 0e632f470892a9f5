"""``forensics fleet``: restarts and exit codes of a DaemonSet's pods, cross-compared by node group.

Pure functions over ``kubectl get -o json`` documents (:func:`summarize_fleet`);
:func:`read_kubectl` is the only I/O (the one kube client, :mod:`forensics.kubectl`:
the real kubectl, honouring kubeconfig, context and namespace).  It names the boundary: the node groups where crashes
concentrate and the node label values that separate them from clean groups.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from ..errors import FleetInputError
from .model import (DEFAULT_GROUP_LABELS, CrashPlace, FleetGroup, FleetSummary, boundary_lines, finish_summary,
                    group_key)
from ..kubectl import KubeOptions, as_count, as_dict, as_list, as_str, get_json

__all__ = [
    "DEFAULT_GROUP_LABELS",
    "CrashPlace",
    "FleetGroup",
    "FleetSummary",
    "PodRecord",
    "FleetInputError",
    "read_kubectl",
    "check_documents",
    "parse_pods",
    "summarize_fleet",
    "crash_fingerprints",
    "load_fleet",
]

MAX_PODS = 1_000_000




@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str | None
    restarts: int
    last_exit_code: int | None
    last_reason: str | None
    last_finished: str | None
    waiting_reason: str | None
    image_ids: tuple[str, ...]
    started: str | None
    container_images: tuple[tuple[str, str], ...] = ()  # (container name, image digest)

    @property
    def crash_looping(self) -> bool:
        return self.waiting_reason == "CrashLoopBackOff"


def read_kubectl(kind: str, *, namespace: str | None = None, selector: str | None = None,
                 kubeconfig: str | None = None, context: str | None = None, kubectl: str = "kubectl",
                 timeout: float = 60.0) -> dict:
    """``kubectl get KIND -o json`` through the one kube client (pods: all namespaces unless one is given).

    :raises KubectlNotFound, KubeError: see :mod:`forensics.kubectl`
    """
    opts = KubeOptions(kubectl=kubectl, kubeconfig=kubeconfig, context=context, namespace=namespace)
    args = ["get", kind]
    if kind == "pods":
        if not namespace:
            args.append("--all-namespaces")
        if selector:
            args += ["-l", selector]
    return get_json(opts, f"get {kind}", args, namespaced=kind != "nodes", timeout=timeout)


def _item_kind(item) -> str | None:
    """``Pod`` / ``Node`` / another kind of one list item; by its fields when ``kind`` is missing."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("kind"), str):
        return item["kind"]
    spec, status = item.get("spec") or {}, item.get("status") or {}
    if not isinstance(spec, dict) or not isinstance(status, dict):
        return None
    if "containers" in spec or "nodeName" in spec or "containerStatuses" in status:
        return "Pod"
    if "nodeInfo" in status or "podCIDR" in spec or "providerID" in spec:
        return "Node"
    return None


def _kinds(doc: dict) -> dict[str, int]:
    listed = doc.get("items")
    items = listed if isinstance(listed, list) else [doc]
    out: dict[str, int] = {}
    for item in items[:MAX_PODS]:
        k = _item_kind(item) or "unknown"
        out[k] = out.get(k, 0) + 1
    return out


def check_documents(pods_doc: dict, nodes_doc: dict, *, pods_from: str = "the pods",
                    nodes_from: str = "the nodes") -> None:
    """Refuse pod and node documents that cannot be what they claim (swapped files, another kind, empty).

    A fleet table of "0 pods on 0 nodes" from swapped ``--from`` / ``--nodes`` files says nothing; this
    says which file holds what.

    :raises FleetInputError: when ``pods_doc`` holds no pods, or ``nodes_doc`` holds pods or no nodes
    """
    pk, nk = _kinds(pods_doc), _kinds(nodes_doc)
    if not pk.get("Pod") and nk.get("Pod") and pk.get("Node"):
        raise FleetInputError(f"{pods_from} holds {pk['Node']} Node objects and {nodes_from} holds {nk['Pod']} pods: "
                              "the two files are swapped",
                              help_text="Pass the pods with --from and the nodes with --nodes.")
    if not pk.get("Pod"):
        what = ", ".join(f"{n} {k}" for k, n in sorted(pk.items()) if n) or "nothing"
        raise FleetInputError(f"{pods_from} holds no pods ({what})",
                              help_text="Save the pods with `kubectl get pods -n NS -l SELECTOR -o json`; check -n/-l.")
    if nk.get("Pod") or not nk.get("Node"):
        what = ", ".join(f"{n} {k}" for k, n in sorted(nk.items()) if n) or "nothing"
        raise FleetInputError(f"{nodes_from} holds no nodes ({what})",
                              help_text="Save the nodes with `kubectl get nodes -o json`.")


def parse_pods(doc: dict) -> list[PodRecord]:
    """Pod records from a ``kubectl get pods -o json`` document (a List or a single Pod)."""
    listed = doc.get("items")
    items = listed if isinstance(listed, list) else [doc]
    out = []
    for pod in items[:MAX_PODS]:
        if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
            continue
        # an API answer (or a saved file) may hold anything where an object is due: read as absent
        meta, spec, status = as_dict(pod.get("metadata")), as_dict(pod.get("spec")), as_dict(pod.get("status"))
        restarts = 0
        exit_code = reason = finished = waiting = None
        images, named = [], []
        for cs in as_list(status.get("containerStatuses")):
            cs = as_dict(cs)
            restarts += as_count(cs.get("restartCount"))
            term = as_dict(as_dict(cs.get("lastState")).get("terminated"))
            if term and (finished is None or str(term.get("finishedAt") or "") > finished):
                exit_code = term.get("exitCode")
                reason = as_str(term.get("reason")) or (f"signal {term['signal']}" if term.get("signal") else None)
                finished = str(term.get("finishedAt") or "")
            w = as_dict(as_dict(cs.get("state")).get("waiting"))
            if w.get("reason"):
                waiting = as_str(w["reason"])
            if cs.get("imageID"):
                images.append(str(cs["imageID"]).split("://", 1)[-1])
                named.append((str(cs.get("name") or ""), images[-1]))
        out.append(
            PodRecord(
                uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""),
                node=as_str(spec.get("nodeName")),
                restarts=restarts,
                last_exit_code=exit_code if isinstance(exit_code, int) else None,
                last_reason=reason,
                last_finished=finished or None,
                waiting_reason=waiting,
                image_ids=tuple(images),
                started=as_str(status.get("startTime")),
                container_images=tuple(named),
            )
        )
    return out


def _node_labels(nodes_doc: dict) -> dict[str, dict[str, str]]:
    out = {}
    for n in as_list(nodes_doc.get("items"))[:MAX_PODS]:
        meta = as_dict(as_dict(n).get("metadata"))
        if isinstance(meta.get("name"), str) and meta["name"]:
            out[meta["name"]] = {k: v for k, v in as_dict(meta.get("labels")).items()
                                 if isinstance(k, str) and isinstance(v, str)}
    return out


def _exit_bucket(code: int | None) -> str | None:
    if code is None:
        return None
    return str(code) if code in (139, 134, 137) else "other"


def summarize_fleet(pods_doc: dict, nodes_doc: dict, *, group_by: tuple[str, ...] = DEFAULT_GROUP_LABELS,
                    baseline: dict | None = None, since: _dt.datetime | None = None,
                    now: _dt.datetime | None = None, places: tuple[CrashPlace, ...] = (),
                    bundles: tuple[str, ...] = ()) -> FleetSummary:
    """Cross-compare restarts by node group.

    :param baseline: a previous ``forensics fleet --json`` document: restarts are counted since it
    :param since: count only restarts after this time (pods started before it count their last
        termination after it as one restart: a lower bound)
    :param places: crashes' bundles (``fleet --bundles``, read from ``bundles``): each group's crashes by
        fingerprint, and where the newest bundle of each fingerprint lives
    """
    pods = parse_pods(pods_doc)
    labels = _node_labels(nodes_doc)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = (baseline or {}).get("fleet", {}).get("pod_restarts") if baseline else None
    base_time = _parse_time((baseline or {}).get("fleet", {}).get("taken_at")) if baseline else None
    watched: list[float] = []
    groups: dict[tuple, dict] = {}
    node_is_crashy: dict[str, bool] = {}
    pod_restarts = {}
    for p in pods:
        pod_restarts[p.uid] = p.restarts
        restarts = p.restarts
        if base is not None:
            restarts = max(0, p.restarts - int(base.get(p.uid, 0)))
        elif since is not None:
            started = _parse_time(p.started)
            if started is None or started < since:
                finished = _parse_time(p.last_finished)
                restarts = 1 if (finished is not None and finished >= since and p.restarts) else 0
        start = base_time or since or _parse_time(p.started)
        if start is not None:
            watched.append(max(0.0, (now - start).total_seconds() / 3600))
        key = group_key(labels.get(p.node or "", {}), group_by)
        g = groups.setdefault(key, {"nodes": set(), "pods": 0, "with": 0, "total": 0, "max": 0, "codes": {},
                                    "reasons": {}, "loop": 0, "images": {}})
        if p.node:
            g["nodes"].add(p.node)
            node_is_crashy[p.node] = node_is_crashy.get(p.node, False) or restarts > 0 or p.crash_looping
        g["pods"] += 1
        g["with"] += restarts > 0
        g["total"] += restarts
        g["max"] = max(g["max"], restarts)
        b = _exit_bucket(p.last_exit_code) if restarts or p.crash_looping else None
        if b:
            g["codes"][b] = g["codes"].get(b, 0) + 1
        if restarts and p.last_reason:
            g["reasons"][p.last_reason] = g["reasons"].get(p.last_reason, 0) + 1
        g["loop"] += p.crash_looping
        for img in set(p.image_ids):
            g["images"][img] = g["images"].get(img, 0) + 1
    fingerprints, latest = crash_fingerprints(places, labels, {p.node for p in pods if p.node}, group_by)
    rows = [
        FleetGroup(key=k, nodes=len(v["nodes"]), pods=v["pods"], pods_with_restarts=v["with"],
                   total_restarts=v["total"], max_restarts=v["max"], exit_codes=v["codes"], reasons=v["reasons"],
                   crash_loop=v["loop"], images=v["images"], fingerprints=fingerprints.get(k, {}))
        for k, v in groups.items()
    ]
    # a rollout is mixed when one container (by name) runs more than one digest; a sidecar's image is not a mix
    per_container: dict[str, set[str]] = {}
    for p in pods:
        for cname, img in p.container_images:
            per_container.setdefault(cname, set()).add(img)
    return finish_summary(
        rows, group_by=group_by, nodes=len({p.node for p in pods if p.node}),
        boundary=boundary_lines(_per_label(labels, node_is_crashy), nodes=len(node_is_crashy),
                                crashing=sum(node_is_crashy.values())),
        baseline="snapshot" if base is not None else (since.isoformat() if since else None),
        mixed_images=any(len(v) > 1 for v in per_container.values()), pod_restarts=pod_restarts,
        taken_at=now.isoformat(), observed_hours=(sum(watched) / len(watched)) if watched else None,
        latest_bundles=latest, bundles=bundles,
    )


def crash_fingerprints(places: tuple[CrashPlace, ...], labels: dict[str, dict[str, str]], pod_nodes: set[str],
                       group_by: tuple[str, ...]) -> tuple[dict[tuple, dict[str, int]], dict[str, str]]:
    """Crashes by group and fingerprint, and where the newest bundle of each fingerprint counted lives.

    A crash counts in its node's group (``labels``: the nodes' labels), as ``fleet --prometheus`` joins the agents'
    crashes: a node without labels there but with pods is in the group "(no labels)"; a crash on a node of
    neither is not counted (nor is it on a pod row there). Of two bundles of a fingerprint, the later crash's is the
    newest (then the greater location, so the choice never depends on the order read).

    >>> p = CrashPlace(fingerprint="fp", node="n1", time=2.0, location="s3://b/k/")
    >>> crash_fingerprints((p, CrashPlace(fingerprint="fp", node="gone", time=3.0, location="/c")),
    ...                    {"n1": {"nvidia.com/gpu.product": "H20"}}, {"n1"}, ("nvidia.com/gpu.product",))
    ({(('nvidia.com/gpu.product', 'H20'),): {'fp': 1}}, {'fp': '/c'})
    """
    per_group: dict[tuple, dict[str, int]] = {}
    for c in places:
        if c.node in labels:
            key = group_key(labels[c.node], group_by)
        elif c.node in pod_nodes:
            key = ()
        else:
            continue
        d = per_group.setdefault(key, {})
        d[c.fingerprint] = d.get(c.fingerprint, 0) + 1
    counted = {fp for d in per_group.values() for fp in d}
    newest: dict[str, tuple[float, str]] = {}
    for c in places:  # every bundle of a counted fingerprint, as fleet --prometheus takes every agent's newest
        if c.fingerprint in counted and (c.time, c.location) > newest.get(c.fingerprint, (float("-inf"), "")):
            newest[c.fingerprint] = (c.time, c.location)
    return per_group, {fp: loc for fp, (_, loc) in sorted(newest.items())}


def _per_label(labels: dict[str, dict[str, str]], crashy: dict[str, bool]) -> dict[str, dict[str, tuple[int, int]]]:
    """label -> value -> (nodes with pods, crashing nodes): what :func:`~forensics.fleet.model.boundary_lines` reads."""
    per: dict[str, dict[str, tuple[int, int]]] = {}
    for node, bad in crashy.items():
        for k, v in labels.get(node, {}).items():
            n, b = per.setdefault(k, {}).get(v, (0, 0))
            per[k][v] = (n + 1, b + bad)
    return per


def _parse_time(s: str | None) -> _dt.datetime | None:
    if not s:
        return None
    try:
        return _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def load_fleet(doc: object) -> FleetSummary:
    """The :class:`FleetSummary` a ``forensics fleet --json`` document holds (what ``forensics report`` reads).

    :raises ArtifactFormatError: not a ``fleet`` document of this schema version, or a value of the wrong type
    """
    from ..jsonrecords import load_document

    return load_document(doc, "fleet", "fleet", FleetSummary)
