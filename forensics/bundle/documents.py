"""A capture bundle's documents as ``report`` reads them, read once into records: the process snapshot
(``40-process/snapshot.json``: its command line, the libnvidia-ml.so it mapped, the Python modules it
resolved), the pod's scheduling state (``10-kubernetes/scheduling.json``: the node and its GPU labels, the
pod and its containers), the identity and the core handler's record (:mod:`.record`), and the bundle's texts.

A bundle is data from a node, and what a report picks out of it is read here, nowhere else: a value of the
wrong type is read as absent and said (``problems``: the document's item name, the field, what it was),
a list is read to MAX_ITEMS entries and the rest said to be left out; nothing here raises on a document's
shape.  The report lists the problems as its own (the evidence was read in part).

>>> b = CaptureDocuments.from_json({"_bundle_dir": "/b", "scheduling": {"pod": {"name": "p", "containers": "x"}}})
>>> b.scheduling.pod.name, b.scheduling.pod.containers, b.problems
('p', (), ('10-kubernetes/scheduling.json: pod.containers is a str, not a list (not read)',))
"""
from __future__ import annotations

from dataclasses import field

from ..records import record
from .layout import IDENTITY, KUBERNETES_EVENTS, KUBERNETES_POD, KUBERNETES_SCHEDULING, PROCESS_SNAPSHOT, RECORD
from .record import CrashRecord, Identity

__all__ = ["CaptureDocuments", "ProcessSnapshot", "ModuleFact", "NvmlFact", "Scheduling", "NodeSummary",
           "PodSummary", "PodContainer", "PodEvent", "PodSpec", "ContainerSpec", "ProbeSpec", "MAX_ITEMS",
           "DOCUMENT_KEYS", "TEXT_KEYS"]

MAX_ITEMS = 4096  # entries of one list of a bundle document read (modules, containers, command-line words)

#: the capture's documents as ``report`` gathers them: its key, the bundle item, the JSON value it holds (capture
#: --pod writes the pod's events as a list)
DOCUMENT_KEYS: tuple[tuple[str, str, type], ...] = (
    ("identity", IDENTITY, dict), ("scheduling", KUBERNETES_SCHEDULING, dict), ("events", KUBERNETES_EVENTS, list),
    ("pod", KUBERNETES_POD, dict), ("snapshot", PROCESS_SNAPSHOT, dict), ("record", RECORD, dict))
TEXT_KEYS = ("kernel_log", "nvidia_smi", "os_release_node", "os_release_image", "bug_report_note",
             "bug_report_file", "bug_report_text")


class _Reader:
    """Typed reads of one document's values, each wrong one said once in ``problems`` and read as absent."""

    def __init__(self, item: str, problems: list[str]) -> None:
        self.item = item
        self.problems = problems

    def _wrong(self, where: str, value: object, want: str) -> None:
        name = type(value).__name__
        self.problems.append(f"{self.item}: {where} is {'an' if name[0] in 'aeiou' else 'a'} {name}, not {want} "
                             "(not read)")

    def obj(self, doc: object, where: str) -> dict:
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            self._wrong(where, doc, "an object")
            return {}
        return doc

    def text(self, doc: dict, key: str, where: str = "") -> str | None:
        v = doc.get(key)
        if v is None or isinstance(v, str):
            return v
        self._wrong(f"{where}{key}", v, "a string")
        return None

    def count(self, doc: dict, key: str, where: str = "") -> int | None:
        v = doc.get(key)
        if v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32):
            return v
        self._wrong(f"{where}{key}", v, "a count")
        return None

    def flag(self, doc: dict, key: str) -> bool | None:
        v = doc.get(key)
        if v is None or isinstance(v, bool):
            return v
        self._wrong(key, v, "true or false")
        return None

    def items(self, doc: dict, key: str, where: str = "") -> list:
        v = doc.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self._wrong(f"{where}{key}", v, "a list")
            return []
        if len(v) > MAX_ITEMS:
            self.problems.append(f"{self.item}: {where}{key} has {len(v)} entries; the first {MAX_ITEMS} read")
            return v[:MAX_ITEMS]
        return v

    def str_map(self, doc: dict, key: str, where: str = "") -> dict[str, str]:
        v = self.obj(doc.get(key), f"{where}{key}")
        out = {k: x for k, x in list(v.items())[:MAX_ITEMS] if isinstance(k, str) and isinstance(x, str)}
        if len(out) != len(v):
            self.problems.append(f"{self.item}: {where}{key} has {len(v) - len(out)} entries that are not "
                                 "strings or past the bound (not read)")
        return out


@record
class ModuleFact:
    """A Python module the process resolved (nvitop, nvitop_exporter, pynvml): its version, file and verdict."""

    module: str
    version: str | None = None
    path: str | None = None
    verdict: str | None = None  # "OK", or what is wrong (shadowed, another version...)

    @property
    def not_ok(self) -> bool:
        return bool(self.verdict) and str(self.verdict).upper() != "OK"


@record
class NvmlFact:
    """The libnvidia-ml.so the process mapped, as the snapshot saw it."""

    path: str | None = None
    version: str | None = None
    build_id: str | None = None
    origin: str | None = None  # "injected-from-host", "image", "host"


@record
class ProcessSnapshot:
    """What ``report`` reads of ``40-process/snapshot.json`` (written by capture's ``snapshot_payload``)."""

    cmdline: str = ""  # the command line, its words joined by spaces
    kernel: str | None = None
    in_container_namespace: bool | None = None
    nvml: NvmlFact | None = None
    modules: tuple[ModuleFact, ...] = ()

    @classmethod
    def from_json(cls, doc: object, problems: list[str]) -> ProcessSnapshot:
        r = _Reader(PROCESS_SNAPSHOT, problems)
        d = r.obj(doc, "the document")
        cmd = d.get("cmdline")
        words = r.items(d, "cmdline") if isinstance(cmd, list) else []
        cmdline = " ".join(map(str, words)) if isinstance(cmd, list) else r.text(d, "cmdline") or ""
        nvml_doc = r.obj(d.get("nvml"), "nvml")
        nvml = NvmlFact(path=r.text(nvml_doc, "path", "nvml."), version=r.text(nvml_doc, "version", "nvml."),
                        build_id=r.text(nvml_doc, "build_id", "nvml."),
                        origin=r.text(nvml_doc, "origin", "nvml.")) if nvml_doc else None
        python = r.obj(d.get("python"), "python")
        modules = []
        for i, m in enumerate(r.items(python, "modules", "python.")):
            m = r.obj(m, f"python.modules[{i}]")
            name = r.text(m, "module", f"python.modules[{i}].")
            if name:
                modules.append(ModuleFact(module=name, version=r.text(m, "version", f"python.modules[{i}]."),
                                          path=r.text(m, "path", f"python.modules[{i}]."),
                                          verdict=r.text(m, "verdict", f"python.modules[{i}].")))
        return cls(cmdline=cmdline, kernel=r.text(d, "kernel"), nvml=nvml, modules=tuple(modules),
                   in_container_namespace=r.flag(d, "in_container_namespace"))


@record
class NodeSummary:
    """The node of ``10-kubernetes/scheduling.json``: its name, kernel and GPU labels."""

    name: str | None = None
    kernel: str | None = None
    gpu_labels: dict[str, str] = field(default_factory=dict)

    @property
    def gpu_product(self) -> str | None:
        return self.gpu_labels.get("nvidia.com/gpu.product")

    @property
    def gpu_count(self) -> str | None:
        return self.gpu_labels.get("nvidia.com/gpu.count")

    @property
    def cuda_runtime_major(self) -> str | None:
        return self.gpu_labels.get("nvidia.com/cuda.runtime.major")

    @property
    def driver(self) -> str | None:
        """The driver version the GPU operator's labels name: major.minor.rev, else the full version label."""
        parts = [self.gpu_labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
        if all(parts):
            return ".".join(str(p) for p in parts)
        return self.gpu_labels.get("nvidia.com/cuda.driver-version.full")


@record
class PodContainer:
    """One container status of the pod: its name, image digest, restarts, and how and when it last ended."""

    image_id: str | None = None
    restart_count: int | None = None
    finished_at: str | None = None  # its last termination's, RFC 3339 as the API wrote it
    name: str | None = None
    last_exit_code: int | None = None  # its last termination's exit code (137: SIGKILL, 143: SIGTERM)
    last_reason: str | None = None  # "OOMKilled", "Error", "Completed"...


@record
class PodSummary:
    name: str | None = None
    namespace: str | None = None
    containers: tuple[PodContainer, ...] = ()

    @property
    def restarts(self) -> int:
        return sum(c.restart_count or 0 for c in self.containers)


@record
class Scheduling:
    """What ``report`` reads of ``10-kubernetes/scheduling.json`` (capture --pod's summaries)."""

    node: NodeSummary = field(default_factory=NodeSummary)
    pod: PodSummary = field(default_factory=PodSummary)

    @classmethod
    def from_json(cls, doc: object, problems: list[str]) -> Scheduling:
        r = _Reader(KUBERNETES_SCHEDULING, problems)
        d = r.obj(doc, "the document")
        n = r.obj(d.get("node"), "node")
        node = NodeSummary(name=r.text(n, "name", "node."), kernel=r.text(n, "kernel", "node."),
                           gpu_labels=r.str_map(n, "gpu_labels", "node."))
        p = r.obj(d.get("pod"), "pod")
        containers = []
        for i, c in enumerate(r.items(p, "containers", "pod.")):
            c = r.obj(c, f"pod.containers[{i}]")
            last = r.obj(c.get("last_terminated"), f"pod.containers[{i}].last_terminated")
            at = f"pod.containers[{i}].last_terminated."
            containers.append(PodContainer(image_id=r.text(c, "image_id", f"pod.containers[{i}]."),
                                           restart_count=r.count(c, "restart_count", f"pod.containers[{i}]."),
                                           finished_at=r.text(last, "finished_at", at),
                                           name=r.text(c, "name", f"pod.containers[{i}]."),
                                           last_exit_code=r.count(last, "exit_code", at),
                                           last_reason=r.text(last, "reason", at)))
        pod = PodSummary(name=r.text(p, "name", "pod."), namespace=r.text(p, "namespace", "pod."),
                         containers=tuple(containers))
        return cls(node=node, pod=pod)


@record
class PodEvent:
    """One of the pod's events (``10-kubernetes/events.json``, oldest first): ``Killing``, ``Unhealthy``
    (a probe failed), ``Evicted``, ``OOMKilling``, ``BackOff``..."""

    reason: str | None = None
    message: str | None = None
    time: str | None = None
    count: int | None = None

    @classmethod
    def read(cls, doc: object, problems: list[str]) -> tuple[PodEvent, ...]:
        r = _Reader(KUBERNETES_EVENTS, problems)
        if doc is None:
            return ()
        items = r.items({"events": doc}, "events") if isinstance(doc, list) else []
        out = []
        for i, e in enumerate(items):
            e = r.obj(e, f"[{i}]")
            if not e:
                continue
            out.append(cls(reason=r.text(e, "reason", f"[{i}]."), message=r.text(e, "message", f"[{i}]."),
                           time=r.text(e, "time", f"[{i}]."), count=r.count(e, "count", f"[{i}].")))
        return tuple(out)


@record
class ProbeSpec:
    """A container's liveness probe, as its spec says it: what it does and its timings (seconds)."""

    action: str  # "HTTP GET /healthz on port metrics", "TCP port 9400", "exec: cat /tmp/ok", "gRPC port 9400"
    period: int | None = None  # periodSeconds (the kubelet's default: 10)
    timeout: int | None = None  # timeoutSeconds (1)
    failures: int | None = None  # failureThreshold (3)
    initial_delay: int | None = None  # initialDelaySeconds (0)


@record
class ContainerSpec:
    """A container of the pod's spec: its memory limit and request (as written: ``256Mi``) and liveness probe."""

    name: str | None = None
    memory_limit: str | None = None
    memory_request: str | None = None
    liveness: ProbeSpec | None = None


@record
class PodSpec:
    """What ``report`` reads of the pod object (``10-kubernetes/pod.json``): who owns it (``daemonset/exporter``),
    why it stopped (``status.reason``: ``Evicted``; ``status.message``), and its containers' specs."""

    owner: str | None = None
    reason: str | None = None
    message: str | None = None
    containers: tuple[ContainerSpec, ...] = ()

    @classmethod
    def from_json(cls, doc: object, problems: list[str]) -> PodSpec:
        r = _Reader(KUBERNETES_POD, problems)
        d = r.obj(doc, "the document")
        meta, spec, status = (r.obj(d.get(k), k) for k in ("metadata", "spec", "status"))
        owner = next((r.obj(o, "metadata.ownerReferences[0]") for o in r.items(meta, "ownerReferences", "metadata.")),
                     {})
        kind, name = r.text(owner, "kind", "ownerReferences[0]."), r.text(owner, "name", "ownerReferences[0].")
        containers = tuple(_container_spec(r, c, i) for i, c in enumerate(r.items(spec, "containers", "spec.")))
        return cls(owner=f"{kind.lower()}/{name}" if kind and name else None,
                   reason=r.text(status, "reason", "status."), message=r.text(status, "message", "status."),
                   containers=containers)


def _quantity(r: _Reader, d: dict, key: str, where: str) -> str | None:
    """A resource quantity as written (``256Mi``; a number the API kept as one is read as its text)."""
    v = d.get(key)
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else r.text(d, key, where)


def _probe_action(r: _Reader, p: dict, where: str) -> str:
    http, tcp, ex, grpc = (r.obj(p.get(k), f"{where}{k}") for k in ("httpGet", "tcpSocket", "exec", "grpc"))
    if http:
        return f"HTTP GET {r.text(http, 'path', where) or '/'} on port {http.get('port')}"
    if tcp:
        return f"TCP port {tcp.get('port')}"
    if ex:
        return "exec: " + " ".join(str(x) for x in r.items(ex, "command", where))
    if grpc:
        return f"gRPC port {grpc.get('port')}"
    return "a probe of no known kind"


def _container_spec(r: _Reader, c: object, i: int) -> ContainerSpec:
    at = f"spec.containers[{i}]."
    c = r.obj(c, at.rstrip("."))
    res = r.obj(c.get("resources"), f"{at}resources")
    limits, requests = r.obj(res.get("limits"), f"{at}resources.limits"), r.obj(res.get("requests"),
                                                                               f"{at}resources.requests")
    p = r.obj(c.get("livenessProbe"), f"{at}livenessProbe")
    where = f"{at}livenessProbe."
    probe = ProbeSpec(action=_probe_action(r, p, where), period=r.count(p, "periodSeconds", where),
                      timeout=r.count(p, "timeoutSeconds", where), failures=r.count(p, "failureThreshold", where),
                      initial_delay=r.count(p, "initialDelaySeconds", where)) if p else None
    return ContainerSpec(name=r.text(c, "name", at), memory_limit=_quantity(r, limits, "memory", at),
                         memory_request=_quantity(r, requests, "memory", at), liveness=probe)


@record
class CaptureDocuments:
    """One capture bundle as ``report`` reads it: where it is, its documents as records, its texts, the files
    that do not match its manifest, and what of its documents could not be read (``problems``)."""

    bundle_dir: str | None
    identity: Identity | None = None
    record: CrashRecord | None = None
    scheduling: Scheduling = field(default_factory=Scheduling)
    events: tuple[PodEvent, ...] = ()
    pod: PodSpec = field(default_factory=PodSpec)
    snapshot: ProcessSnapshot = field(default_factory=ProcessSnapshot)
    kernel_log: str | None = None  # the kernel's NVIDIA lines (Xid, NVRM)
    nvidia_smi: str | None = None  # nvidia-smi -q
    os_release_node: str | None = None
    os_release_image: str | None = None  # the process's (its image's) os-release
    bug_report_note: str | None = None  # why there is no nvidia-bug-report, or what it is
    bug_report_file: str | None = None  # NVIDIA's bug report: where it is ...
    bug_report_text: str | None = None  # ... and its start, decompressed
    manifest_problems: tuple[str, ...] = ()  # "PATH: why" for each file its manifest does not vouch for
    problems: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: object) -> CaptureDocuments:
        """The bundle ``report``'s evidence reader gathered into ``doc`` (its ``_bundle_dir``, a key per document
        of DOCUMENT_KEYS, a key per text of TEXT_KEYS, ``manifest_problems``)."""
        problems: list[str] = []
        r = _Reader("the bundle", problems)
        d = r.obj(doc, "the bundle")
        ident = d.get("identity")
        crash = d.get("record")
        for rel, v in ((IDENTITY, ident), (RECORD, crash)):
            if v is not None and not isinstance(v, dict):
                problems.append(f"{rel}: the document is a {type(v).__name__}, not an object (not read)")
        texts = {k: v for k in TEXT_KEYS if isinstance(v := d.get(k), str)}  # the reader's own: str or absent
        return cls(bundle_dir=r.text(d, "_bundle_dir"), identity=Identity.from_json(ident),
                   record=CrashRecord.from_json(crash), scheduling=Scheduling.from_json(d.get("scheduling"), problems),
                   events=PodEvent.read(d.get("events"), problems), pod=PodSpec.from_json(d.get("pod"), problems),
                   snapshot=ProcessSnapshot.from_json(d.get("snapshot"), problems), **texts,
                   manifest_problems=tuple(str(p) for p in r.items(d, "manifest_problems")),
                   problems=tuple(problems))

    @property
    def node_name(self) -> str | None:
        """The node the crash was on: the scheduling state's, else the identity's, else the handler record's."""
        return (self.scheduling.node.name or (self.identity.node if self.identity else None)
                or (self.record.node if self.record else None))

    @property
    def host_names(self) -> tuple[tuple[str, str], ...]:
        """(name, kind) for every node, pod and host name the bundle's documents give, kind node/pod/host."""
        ident = self.identity
        pairs = ((self.scheduling.node.name, "node"), (self.scheduling.pod.name, "pod"),
                 (self.record.node if self.record else None, "node"), (ident.node if ident else None, "node"),
                 (ident.pod if ident else None, "pod"), (ident.agent_pod if ident else None, "pod"),
                 (_extra_str(ident.extra, "hostname") if ident else None, "host"))
        return tuple((name, kind) for name, kind in pairs if name)

    @property
    def image(self) -> str | None:
        """The container image: a container's digest, else the handler record's, else the identity's."""
        for c in self.scheduling.pod.containers:
            if c.image_id:
                return c.image_id
        return ((_extra_str(self.record.extra, "image") if self.record else None)
                or (self.identity.image if self.identity else None))

    @property
    def crash_time(self) -> float | None:
        """When the core handler recorded a crash (a record with a signal); None for a capture of a live one."""
        if self.record is not None and self.record.signal and self.record.time is not None:
            return self.record.time
        return None


def _extra_str(extra: dict, key: str) -> str | None:
    v = extra.get(key)
    return v if isinstance(v, str) and v else None
