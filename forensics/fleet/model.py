"""The fleet table's model, shared by ``fleet`` from pod objects (:mod:`forensics.fleet`) and ``fleet --prometheus``
(:mod:`forensics.fleet.prom`): the group and summary records, the group key of a node, the boundary rule (which
node label's values separate the crashing nodes from the clean ones) and how a summary is finished from its groups.

Both readers count what they read into the same shapes and call the same rule, so the two tables agree by
construction wherever their inputs agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "BOUNDARY_SKIP",
    "CRASHY_SHARE",
    "CrashPlace",
    "DEFAULT_GROUP_LABELS",
    "DRIVER_FULL",
    "DRIVER_PARTS",
    "FALLBACK_LABELS",
    "MAX_BOUNDARY_VALUES",
    "FleetGroup",
    "FleetSummary",
    "boundary_lines",
    "finish_summary",
    "group_key",
    "key_labels",
]

# GPU feature discovery labels, then the cloud instance type when those are absent.
DEFAULT_GROUP_LABELS = ("nvidia.com/gpu.product", "nvidia.com/cuda.driver-version.full")
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
FALLBACK_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
CRASHY_SHARE = 0.2  # a group with at least this share of pods restarting is where crashes concentrate
BOUNDARY_SKIP = ("kubernetes.io/hostname", "feature.node.kubernetes.io/")  # per-node or too many to be a boundary
MAX_BOUNDARY_VALUES = 16  # a label with more values over the nodes with pods is per node (serials, names)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashPlace:
    """One crash's bundle as ``fleet --bundles`` reads it: its fingerprint, the node it crashed on, when, and where the
    bundle lives (a local path, or the ``s3://`` URL of its prefix once uploaded)."""

    fingerprint: str
    node: str | None
    time: float
    location: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetGroup:
    key: tuple[tuple[str, str], ...]  # (label, value) pairs that define the group
    nodes: int
    pods: int
    pods_with_restarts: int
    total_restarts: int
    max_restarts: int
    exit_codes: dict[str, int]  # "139", "134", "137", "other" -> pods whose last exit had it
    reasons: dict[str, int]
    crash_loop: int
    images: dict[str, int]  # image digest -> pods running it
    fingerprints: dict[str, int] = field(default_factory=dict)  # forensics fingerprint -> crashes (agents' metrics)

    @property
    def name(self) -> str:
        return ", ".join(f"{v}" for _, v in self.key) or "(no labels)"

    @property
    def failing_pods(self) -> int:
        """Pods restarting in the window, or crash-looping now (at least): right after a baseline, a pod in
        CrashLoopBackOff has no restart counted yet -- it waits out its back-off -- and is no clean pod."""
        return max(self.pods_with_restarts, self.crash_loop)

    @property
    def crash_share(self) -> float:
        return self.failing_pods / self.pods if self.pods else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSummary:
    group_by: tuple[str, ...]
    groups: tuple[FleetGroup, ...]
    pods: int
    nodes: int
    crashing_groups: tuple[str, ...]
    clean_groups: tuple[str, ...]
    boundary: tuple[str, ...]  # "label: values crashing vs values clean" lines
    baseline: str | None = None
    mixed_images: bool = False
    taken_at: str = ""  # when this summary was made (ISO, UTC)
    observed_hours: float | None = None  # mean hours each pod was watched (since start, or the baseline)
    pod_restarts: dict[str, int] = field(default_factory=dict)  # uid -> restarts (a snapshot for --since)
    source: str | None = None  # where the figures came from: None (pod objects), or the Prometheus URL
    # fingerprint -> where the fleet's newest bundle of it lives (an s3:// URL once uploaded, else NODE:PATH): the
    # agents' forensics_latest_bundle_timestamp_seconds (Prometheus), or the bundles read (fleet --bundles: a local
    # path, or the s3:// URL of a bundle in a bucket)
    latest_bundles: dict[str, str] = field(default_factory=dict)
    bundles: tuple[str, ...] = ()  # fleet --bundles: where the crashes were read (core directories, s3:// prefixes)
    # fleet --bundles: what a bucket did not let be read (a listing cut short, a record late or malformed): the
    # crash counts are partial when any
    bundle_problems: tuple[str, ...] = ()


def key_labels(group_by: tuple[str, ...]) -> tuple[str, ...]:
    """Every node label :func:`group_key` may read for ``group_by`` (the driver's parts, the fallbacks).

    >>> key_labels(("nvidia.com/gpu.product",))
    ('nvidia.com/gpu.product',)
    """
    out = list(group_by)
    if DRIVER_FULL in group_by:
        out += DRIVER_PARTS
    if group_by == DEFAULT_GROUP_LABELS:
        out += FALLBACK_LABELS
    return tuple(dict.fromkeys(out))


def group_key(labels: dict[str, str], group_by: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The group of a node with ``labels``: its values of ``group_by`` (the driver version from its major, minor
    and rev where the full one is absent); with the default labels all absent, its instance type.

    >>> group_key({"nvidia.com/gpu.product": "H20", "nvidia.com/cuda.driver.major": "580",
    ...            "nvidia.com/cuda.driver.minor": "126", "nvidia.com/cuda.driver.rev": "09"}, DEFAULT_GROUP_LABELS)
    (('nvidia.com/gpu.product', 'H20'), ('nvidia.com/cuda.driver-version.full', '580.126.09'))
    >>> group_key({"node.kubernetes.io/instance-type": "g5"}, DEFAULT_GROUP_LABELS)
    (('node.kubernetes.io/instance-type', 'g5'),)
    """
    key = []
    for label in group_by:
        value = labels.get(label)
        if value is None and label == DRIVER_FULL and all(p in labels for p in DRIVER_PARTS):
            value = ".".join(labels[p] for p in DRIVER_PARTS)
        if value is not None:
            key.append((label, value))
    if not key and group_by == DEFAULT_GROUP_LABELS:
        for label in FALLBACK_LABELS:
            if label in labels:
                return ((label, labels[label]),)
    return tuple(key)


def boundary_lines(per_label: dict[str, dict[str, tuple[int, int]]], *, nodes: int, crashing: int) -> list[str]:
    """Label values whose nodes mostly crash, against values of the same label whose nodes never do.

    ``per_label``: label -> value -> (nodes with pods that have it, of them the nodes where a pod restarted);
    ``nodes`` and ``crashing``: the nodes with pods, and of them the crashing ones (nodes without a label count
    here and in no value of it). A label is a boundary when some of its values have at least half their nodes
    crashing, all its other values none, and the crashing values cover at least 90% of all crashing nodes; a
    label with more than :data:`MAX_BOUNDARY_VALUES` values, or one of :data:`BOUNDARY_SKIP`, is per node. One
    line per boundary label, by label name.

    >>> boundary_lines({"gpu": {"H20": (4, 3), "Ada": (5, 0)}, "zone": {"a": (5, 2), "b": (4, 1)}},
    ...                nodes=9, crashing=3)
    ['gpu: H20 (3 of 4 nodes crashing) vs Ada (5 nodes, none crashing)']
    """
    if not crashing or crashing == nodes:
        return []
    out = []
    for label in sorted(per_label):
        values = per_label[label]
        if len(values) > MAX_BOUNDARY_VALUES or label.startswith(BOUNDARY_SKIP):
            continue
        hot = {v: c for v, c in values.items() if c[1] * 2 >= c[0]}
        cold = {v: c for v, c in values.items() if c[1] == 0}
        if not hot or not cold or len(hot) + len(cold) != len(values):
            continue
        if sum(c[1] for c in hot.values()) * 10 < crashing * 9:
            continue
        hot_s = ", ".join(f"{v} ({c[1]} of {c[0]} nodes crashing)" for v, c in sorted(hot.items()))
        cold_s = ", ".join(f"{v} ({c[0]} nodes, none crashing)" for v, c in sorted(cold.items()))
        out.append(f"{label}: {hot_s} vs {cold_s}")
    return out


def finish_summary(groups: list[FleetGroup], *, group_by: tuple[str, ...], nodes: int, boundary: list[str],
                   **rest) -> FleetSummary:
    """The summary of ``groups``: sorted by restarts then pods, the groups where crashes concentrate (a share of
    :data:`CRASHY_SHARE` of their pods restarting or crash-looping) and the clean ones (neither); ``rest``: the
    other fields of :class:`FleetSummary` as the reader knows them."""
    rows = sorted(groups, key=lambda g: (-g.total_restarts, -g.pods, g.name))
    return FleetSummary(
        group_by=group_by, groups=tuple(rows), pods=sum(g.pods for g in rows), nodes=nodes,
        crashing_groups=tuple(g.name for g in rows if g.crash_share >= CRASHY_SHARE),
        clean_groups=tuple(g.name for g in rows if g.failing_pods == 0),
        boundary=tuple(boundary), **rest)
