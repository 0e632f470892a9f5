"""Stage 1 of a report: the facts, typed, out of the (already redacted) evidence documents.

Pure: :class:`~.evidence.Evidence` in, :class:`Facts` out.  Everything a template or the
conclusion needs is read here once: the crash (signal, thread, phase, the failing NVML call
and the query it made), the versions (nvitop, nvitop-exporter, nvidia-ml-py, Python, glibc,
NVML, driver, CUDA), the platform (OS of the image and of the node, kernel, GPUs, nvidia-smi,
nvidia-bug-report), the setup (install method, declared-requirement conflicts), the
reproducer runs and how often it crashes.  A fact the evidence does not hold is None.
"""
from __future__ import annotations

import datetime as _dt
import enum
import re
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..bundle.documents import CaptureDocuments, ModuleFact, NvmlFact
from ..fleet import load_fleet
from ..fleet.model import FleetSummary
from ..format import load_analysis, load_batch
from ..imports.format import load_import_report
from ..imports.model import ImportReport, KnownIssueHit
from ..model import (Analysis, BatchResult, HeapCorruption, NativeFrame, NvmlLibrary, OverflowVerdict, PyFrame,
                     Thread)
from ..records import record
from ..reproduce import ReproduceResult, ReproHeader, ReproRun, gpu_lines_of, load_reproduce
from ..views.signature import exit_explanation, signature
from .evidence import Evidence
from .kills import Kill, read_kill

__all__ = ["Facts", "Phase", "Query", "read_facts", "parse_os_release", "pretty_os", "smi_facts", "SmiFacts", "SmiGpu",
           "xid_summary", "NVLINK_QUERY"]

# How nvitop's NVLink throughput query is made (nvitop/api/device.py, Device.nvlink_throughput and
# nvlink_link_count; the same in the nvitop 1.5.0 - 1.7.2 wheels from PyPI).
class NvlinkQuery(TypedDict):
    caller: str
    fields: tuple[int, int]
    field_names: tuple[str, str]
    link_count_field: int


NVLINK_QUERY: NvlinkQuery = {
    "caller": "Device.nvlink_throughput",
    "fields": (138, 139),
    "field_names": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    "link_count_field": 91,
}
_EXIT_FRAMES = ("Py_FinalizeEx", "Py_Exit", "_PyAtExit_Call", "atexit_callfuncs", "__run_exit_handlers")


class Phase(enum.Enum):
    RUNNING = "running"
    EXIT = "exit"  # a thread is finalizing the interpreter or running exit handlers
    UNKNOWN = "unknown"  # no native stacks to tell


@dataclass(frozen=True, slots=True, kw_only=True)
class Query:
    """The NVML query that failed, as the caller made it."""

    api: str  # nvmlDeviceGetFieldValues
    what: str  # "NVLink throughput"
    fields: tuple[int, ...]  # NVML field ids
    detail: str  # the arguments in words


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    # the crash
    analysis: Analysis | None = None  # the analysis, as load_analysis read it
    has_crash: bool = False
    signal: str | None = None
    kind: str | None = None
    abort_message: str | None = None
    fault: str | None = None
    thread_name: str | None = None
    tid: int | None = None
    is_main_thread: bool | None = None
    phase: Phase = Phase.UNKNOWN
    inside_nvml: bool = False
    api: str | None = None  # the NVML entry point on the crashing stack
    # the NVML call the evidence ties the damage to when it is not on the crashing stack (glibc noticed later):
    # the native call the heap reading names, else the call of the C reproducer that crashed too
    earlier_api: str | None = None
    caller: str | None = None  # the first Python frame above the binding's wrappers
    query: Query | None = None
    native_frames: tuple[NativeFrame, ...] = ()  # the first fault's thread's, from before any handler ran
    py_frames: tuple[PyFrame, ...] = ()
    other_threads: tuple[Thread, ...] = ()
    process: str | None = None  # the command line
    pid: int | None = None
    core_time: float | None = None
    signature: str | None = None
    fingerprint: str | None = None
    exit_status: int | None = None  # 128 + the signal the process died of (139 SIGSEGV, 134 SIGABRT)
    exit_explanation: str | None = None  # why that status (a crash reporter's handler that faulted: 139, not 134)
    nested: bool = False  # a signal handler ran on the first fault (faulted itself, or re-raised it)
    frame_words: tuple[str, ...] = ()  # symbols, libraries, Python files and functions of the crashing thread
    # versions
    nvitop: str | None = None
    exporter: str | None = None
    binding: str | None = None  # nvidia-ml-py
    python: str | None = None
    glibc: str | None = None
    nvml: str | None = None
    driver: str | None = None
    cuda: str | None = None
    kernel: str | None = None
    # the platform
    os_image: str | None = None
    os_node: str | None = None
    in_container: bool | None = None  # the process ran in its own mount namespace (a container)
    gpus: str | None = None
    gpu_lines: tuple[str, ...] = ()  # "GPU 0: NVIDIA H20, GPU-<uuid>, PCI bus 00000000:18:00.0"
    nvml_library: str | None = None  # path
    nvml_build_id: str | None = None
    nvml_origin: str | None = None
    nvidia_smi: str | None = None  # nvidia-smi -q text
    bug_report: str | None = None  # what nvidia-bug-report.sh did (the .gz stays in the bundle)
    bug_report_file: str | None = None
    bug_report_text: str | None = None  # its first megabytes: nvidia-smi -q and kernel log sections
    kernel_log: str | None = None  # the driver's kernel log lines
    smi: SmiFacts = field(default_factory=lambda: SmiFacts())  # nvidia-smi -q parsed once (smi_facts), else the
    # copy inside nvidia-bug-report's log
    image: str | None = None
    # the setup
    installer: str | None = None
    environment_notes: tuple[str, ...] = ()
    distributions: tuple[tuple[str, str], ...] = ()  # (name, version), all of them
    requirement_problems: tuple[str, ...] = ()  # pip check
    version_facts: tuple[KnownIssueHit, ...] = ()  # verify-imports' known issues (knowledge-file hits)
    shadowing: tuple[str, ...] = ()  # modules not OK
    imports_checked: bool = False
    imports: tuple[ImportReport, ...] = ()  # verify-imports' results, as load_import_report read them
    # the reproducers
    repro: ReproduceResult | None = None  # the reproducers' result, as load_reproduce read it
    repro_runs: tuple[ReproRun, ...] = ()
    fleets: tuple[FleetSummary, ...] = ()
    # the core's heap (#21): who wrote past the buffer that overflowed
    heap: HeapCorruption | None = None
    # a kill: the process stopped from outside (an OOM kill, an eviction, a failed liveness probe, a sent signal)
    kill: Kill | None = None
    # how often
    frequency: tuple[str, ...] = ()
    first_seen: str | None = None
    affected: tuple[str, ...] = ()

    @property
    def python_run(self) -> ReproRun | None:
        return next((r for r in self.repro_runs if r.name == "python"), None)

    @property
    def c_run(self) -> ReproRun | None:
        return next((r for r in self.repro_runs if r.name == "c"), None)

    @property
    def main_thread_run(self) -> ReproRun | None:
        """The C reproducer's same calls from the main thread (run when its calls from worker threads crashed)."""
        return self.repro.main_thread if self.repro else None

    @property
    def thread_only(self) -> bool | None:
        """Whether the fault fires only in calls from threads other than the main one (None: not learned)."""
        return self.repro.thread_only if self.repro else None

    @property
    def heap_verdict(self) -> OverflowVerdict | None:
        return self.heap.verdict if self.heap else None

    @property
    def heap_reason(self) -> str | None:
        return self.heap.verdict_reason if self.heap else None


def parse_os_release(text: str) -> dict[str, str]:
    """os-release(5) ``KEY=value`` lines (quotes and escapes removed).

    >>> parse_os_release('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\\nID=debian\\n# c\\n')['PRETTY_NAME']
    'Debian GNU/Linux 12 (bookworm)'
    """
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, _, v = line.partition("=")
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = re.sub(r"\\(.)", r"\1", v[1:-1])
        out[k.strip()] = v
    return out


def pretty_os(text: str | None) -> str | None:
    """The distribution and version an os-release names: PRETTY_NAME, else NAME VERSION."""
    if not text:
        return None
    d = parse_os_release(text)
    name_version = " ".join(x for x in (d.get("NAME"), d.get("VERSION") or d.get("VERSION_ID")) if x)
    return d.get("PRETTY_NAME") or name_version or None


_SMI_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


@record
class SmiGpu:
    """One GPU of ``nvidia-smi -q``: the values NVIDIA's bug reports ask for (None: not in the output)."""

    bus_id: str  # its section's, "00000000:18:00.0"
    product_name: str | None = None
    vbios_version: str | None = None
    persistence_mode: str | None = None
    pci_bus_id: str | None = None  # the "Bus Id" line of its PCI section
    mig_mode: str | None = None  # MIG Mode's Current
    fabric_state: str | None = None
    fabric_status: str | None = None


@record
class SmiFacts:
    """``nvidia-smi -q`` parsed: the driver and CUDA versions of its header, and each GPU."""

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[SmiGpu, ...] = ()


# nvidia-smi -q's line -> SmiGpu's field (the first such line of a GPU's section counts)
_SMI_GPU_KEYS = {"Product Name": "product_name", "VBIOS Version": "vbios_version",
                 "Persistence Mode": "persistence_mode", "Bus Id": "pci_bus_id"}
_SMI_HEADER_KEYS = {"Driver Version": "driver_version", "CUDA Version": "cuda_version"}


def smi_facts(text: str | None) -> SmiFacts:
    """What NVIDIA's bug reports ask for, from ``nvidia-smi -q``: driver, CUDA, and per GPU product, bus id,
    VBIOS, persistence and MIG mode, Fabric state.

    >>> smi_facts("Driver Version : 580.126.09\\nCUDA Version : 13.0\\n\\nGPU 00000000:18:00.0\\n"
    ...           "    Product Name : NVIDIA H20\\n    Persistence Mode : Enabled\\n").gpus
    (SmiGpu(bus_id='00000000:18:00.0', product_name='NVIDIA H20', vbios_version=None, persistence_mode='Enabled', \
pci_bus_id=None, mig_mode=None, fabric_state=None, fabric_status=None),)
    """
    if not text:
        return SmiFacts()
    header: dict[str, str] = {}
    gpus: list[dict[str, str]] = []
    section = ""
    for raw in text.splitlines():
        m = _SMI_GPU.match(raw.strip())
        if m:
            gpus.append({"bus_id": m.group(1)})
            section = ""
            continue
        if ":" not in raw:
            if raw.strip():
                section = raw.strip()
            continue
        k, _, v = raw.partition(":")
        k, v = k.strip(), v.strip()
        if not gpus:
            if k in _SMI_HEADER_KEYS:
                header[_SMI_HEADER_KEYS[k]] = v
            continue
        cur = gpus[-1]
        if k in _SMI_GPU_KEYS:
            cur.setdefault(_SMI_GPU_KEYS[k], v)
        elif k == "Current" and section.startswith("MIG Mode"):
            cur["mig_mode"] = v
        elif k in ("State", "Status") and section.startswith("Fabric"):
            cur[f"fabric_{k.lower()}"] = v
    return SmiFacts(**header, gpus=tuple(SmiGpu(**g) for g in gpus))


_XID = re.compile(r"\bS?Xid \((?:PCI:)?([^)]*)\):\s*(\d+)")
_BUS = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?$")


def _bus_key(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI id as the kernel log (``0000:3b:00``) or NVML (``00000000:3B:00.0``) writes it."""
    m = _BUS.search(bus_id.strip())
    if not m:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


def xid_summary(kernel_log: str | None, gpu_bus_ids: tuple[str, ...] = ()) -> list[str]:
    """``Xid 79 on 0000:3b:00: 2 times`` per (Xid, device), from the driver's kernel log lines.

    With the bus ids of the GPUs the evidence lists, a device that is none of them is said so:
    the kernel log is the node's, and its Xids may concern another GPU than the process's.

    >>> xid_summary("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\\n")
    ['Xid 79 on 0000:3b:00: 1 time']
    >>> xid_summary("NVRM: Xid (PCI:0000:3b:00): 79, pid=1\\n", ("00000000:3B:00.0",))
    ['Xid 79 on 0000:3b:00: 1 time']
    >>> xid_summary("NVRM: Xid (PCI:0000:3b:00): 79, pid=1\\n", ("00000000:18:00.0",))
    ['Xid 79 on 0000:3b:00: 1 time (not one of the GPUs in the evidence)']
    """
    known = {k for k in (_bus_key(b) for b in gpu_bus_ids) if k is not None}
    counts: dict[tuple[str, str], int] = {}
    for line in (kernel_log or "").splitlines():
        m = _XID.search(line)
        if m:
            key = (m.group(2), m.group(1))
            counts[key] = counts.get(key, 0) + 1
    out = []
    for (x, dev), n in sorted(counts.items()):
        line = f"Xid {x} on {dev}: {n} time{'s' if n != 1 else ''}"
        if known and _bus_key(dev) not in known:
            line += " (not one of the GPUs in the evidence)"
        out.append(line)
    return out


def _phase(threads: tuple[Thread, ...]) -> Phase:
    if not any(t.native_frames for t in threads):
        return Phase.UNKNOWN
    for t in threads:
        if any((f.symbol or "") in _EXIT_FRAMES for f in t.native_frames):
            return Phase.EXIT
    return Phase.RUNNING


def _query(api: str | None, py: tuple[PyFrame, ...], repro: ReproduceResult | None) -> Query | None:
    nvlink = any("nvlink_throughput" in f.function for f in py)
    call = repro.header.call if repro else None
    if api == "nvmlDeviceGetFieldValues" and (nvlink or (call and not py)):
        links = None  # what the reproducers read (NVML_FI_DEV_NVLINK_LINK_COUNT), else NVML's maximum, 18
        for r in repro.runs if repro else ():
            m = re.match(r"(\d+) on each", r.header.nvlinks or "")
            if m:
                links = int(m.group(1))
                break
        tx, rx = NVLINK_QUERY["fields"]
        return Query(api=api, what="NVLink throughput", fields=NVLINK_QUERY["fields"],
                     detail=(f"nvmlDeviceGetFieldValues(device, 2 x links, values) on each GPU: fieldId {tx} "
                             f"({NVLINK_QUERY['field_names'][0]}) x scopeId 0..links-1, then fieldId {rx} "
                             f"({NVLINK_QUERY['field_names'][1]}) x scopeId 0..links-1; "
                             + (f"with {links} NVLinks, {2 * links} field values" if links else
                                "up to 36 field values (18 NVLinks)")
                             + f" in one call per GPU, after one field {NVLINK_QUERY['link_count_field']} "
                             "(NVML_FI_DEV_NVLINK_LINK_COUNT) query per GPU"))
    if api:
        return Query(api=api, what="", fields=(), detail=f"{api}(...)")
    return None


def _modules(reports: list[ImportReport], caps: list[CaptureDocuments]) -> dict[str, ModuleFact]:
    """module -> its version, file and verdict: verify-imports first, then a capture's live resolution."""
    out: dict[str, ModuleFact] = {}
    for rep in reports:
        for m in rep.modules:
            out.setdefault(m.module, ModuleFact(module=m.module, version=m.effective_version,
                                                path=m.resolved.file if m.resolved else None, verdict=m.verdict.value))
    for cap in caps:
        for c in cap.snapshot.modules:
            out.setdefault(c.module, c)
    return out


def _version(mods: dict[str, ModuleFact], module: str) -> str | None:
    m = mods.get(module)
    return m.version if m else None


def _glibc(repro: ReproduceResult | None) -> str | None:
    if repro is None:
        return None
    for src in [repro.header.glibc] + [r.header.glibc for r in repro.runs]:
        if src:
            return src.replace("glibc", "").strip()
    return None


def _python_version(a: Analysis | None, repro: ReproduceResult | None) -> str | None:
    if a is not None and a.snapshot.python_version:
        return a.snapshot.python_version
    m = re.search(r"(\d+\.\d+\.\d+\S*)", (repro.header.python if repro else None) or "")
    return m.group(1) if m else None


def _frequency(batches: list[BatchResult], fleets: list[FleetSummary]) -> list[str]:
    out = []
    for batch in batches:
        for g in batch.groups:
            out.append(f"{g.count} cores of this crash in the batch (first {_when(g.first_seen)}, "
                       f"last {_when(g.last_seen)})")
    for fleet in fleets:
        for fg in fleet.groups:
            name = ", ".join(value for _, value in fg.key)
            codes = ", ".join(f"exit {k}: {v}" for k, v in sorted(fg.exit_codes.items()))
            out.append(f"{name or 'all nodes'}: {fg.pods_with_restarts} of {fg.pods} pods restarted, "
                       f"{fg.total_restarts} restarts" + (f" ({codes})" if codes else ""))
        out += [f"boundary: {b}" for b in fleet.boundary]
    return out


def _when(t: Any) -> str:
    if isinstance(t, (int, float)):
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return str(t or "?")


def _first_seen(caps: list[CaptureDocuments], batches: list[BatchResult], a: Analysis | None) -> str | None:
    """The earliest crash the evidence dates: a batch's oldest core, an analysed core's write time, a core
    handler's record, a pod's last terminated container (the source is named)."""
    times: list[tuple[float, str]] = [(g.first_seen, "oldest core of the batch") for b in batches for g in b.groups]
    if a is not None and a.snapshot.core.mtime is not None:
        times.append((a.snapshot.core.mtime, "the core file's write time"))
    for cap in caps:
        if cap.crash_time is not None:
            times.append((float(cap.crash_time), "core handler record"))
        for c in cap.scheduling.pod.containers:
            if c.finished_at:
                try:
                    when = _dt.datetime.fromisoformat(c.finished_at.replace("Z", "+00:00"))
                except ValueError:
                    continue
                times.append((when.timestamp(), "the pod's last terminated container (earlier crashes are not dated)"))
    if not times:
        return None
    t, source = min(times)
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") + f" ({source})"


def _affected(caps: list[CaptureDocuments]) -> list[str]:
    """Who crashed, as the captures say: node (GPUs), pod and container restarts."""
    out = []
    for cap in caps:
        node, pod = cap.scheduling.node, cap.scheduling.pod
        gpus, count = node.gpu_product, node.gpu_count
        name = cap.node_name
        where = f"node {name}" if name else ""
        if where and gpus:
            where += f" ({count + ' x ' if count else ''}{gpus})"
        pod_uid = cap.identity.pod_uid if cap.identity else None
        if pod.name:
            where += f"{', ' if where else ''}pod {pod.namespace}/{pod.name} ({pod.restarts} container restarts)"
        elif pod_uid:
            where += f"{', ' if where else ''}pod uid {pod_uid}"
        if where and where not in out:
            out.append(where)
    return out


def _image_of(cap: CaptureDocuments, imports: list[ImportReport]) -> str | None:
    image = imports[0].image if imports else None
    return (cap.image
            or (image.manifest_digest if image else None)
            or (image.ref if image and image.transport.value != "pid" else None))


def read_facts(ev: Evidence) -> Facts:
    """The facts of ``ev`` (already redacted / localized by the caller): the analysis, the reproducers' result,
    verify-imports' and fleet's read back into their records first (:func:`_records`), then each group of facts
    read by its own function (the crash, the versions, the platform, the setup, how often)."""
    a, repro, imports, fleets = _records(ev)
    batches = [load_batch(d) for d in ev.all("analyze-batch")]
    caps = ev.captures()
    cap = caps[0] if caps else CaptureDocuments(bundle_dir=None)  # the first bundle's facts; none: all absent
    mods = _modules(imports, caps)
    nvml = a.snapshot.core.nvml if a is not None else None
    return Facts(
        **_crash_facts(a), **_thread_facts(a, repro),
        **_version_facts(a, repro, mods, cap, nvml), **_platform_facts(cap, repro, imports, nvml),
        **_setup_facts(imports, mods),
        repro=repro, repro_runs=repro.runs if repro else (), fleets=tuple(fleets),
        frequency=tuple(_frequency(batches, fleets)), first_seen=_first_seen(caps, batches, a),
        affected=tuple(_affected(caps)), kill=read_kill(a, caps, fleets),
    )


def _crash_facts(a: Analysis | None) -> dict[str, Any]:
    """The crash as the analysis read it (none without one)."""
    if a is None:
        return {}
    core, crash = a.snapshot.core, a.crash
    return {
        "analysis": a, "has_crash": a.is_crash,  # a gcore of a live process is no crash
        "signal": crash.signal_name, "kind": crash.kind.value, "abort_message": crash.abort_message,
        "fault": (f"0x{crash.fault_address:x} ({crash.fault_kind.value if crash.fault_kind else '?'})"
                  if crash.fault_address is not None else None),
        "phase": _phase(a.snapshot.threads), "process": core.args or core.command, "pid": core.pid,
        "core_time": core.mtime, "signature": signature(a) if a.is_crash else None, "fingerprint": a.fingerprint,
        "exit_status": crash.exit_status, "exit_explanation": exit_explanation(a),
        "nested": bool(crash.then or crash.handler),
        "heap": a.heap.corruption if a.heap is not None else None,
    }


def _thread_facts(a: Analysis | None, repro: ReproduceResult | None) -> dict[str, Any]:
    """The first fault's thread, and its frames from before any signal handler ran (a crash reporter's handler
    that faulted on top is not the crash: analyze puts it in crash.then); the call it made."""
    crashed = a.fault_thread if a is not None else None
    if a is None or crashed is None:
        return {"earlier_api": _earlier_api(a, repro),
                "other_threads": a.snapshot.threads if a is not None else ()}
    native = crashed.interrupted_native_frames
    py = crashed.interrupted_py_frames or ()
    api = crashed.nvml_api
    words: list[str] = []
    for f in native:
        words += [f.symbol or "", f.library or ""]
    for p in py:
        words += [p.file, p.function]
    return {
        "thread_name": crashed.name, "tid": crashed.tid, "is_main_thread": crashed.tid == a.snapshot.core.pid,
        "inside_nvml": crashed.inside_nvml, "api": api, "earlier_api": None if api else _earlier_api(a, repro),
        "caller": crashed.binding_caller, "query": _query(api, py, repro), "native_frames": native, "py_frames": py,
        "other_threads": tuple(t for t in a.snapshot.threads if t is not crashed),
        "frame_words": tuple(w for w in words if w),
    }


def _version_facts(a: Analysis | None, repro: ReproduceResult | None, mods: dict[str, ModuleFact],
                   cap: CaptureDocuments, nvml: NvmlLibrary | None) -> dict[str, Any]:
    """The versions: of the Python stack (as imported), the interpreter, glibc, NVML, the driver, CUDA, the
    kernel -- each from the first source that has it."""
    rh = repro.header if repro else ReproHeader()
    node = cap.scheduling.node
    return {
        "nvitop": _version(mods, "nvitop"), "exporter": _version(mods, "nvitop_exporter"),
        "binding": _version(mods, "pynvml") or _binding_from(rh.binding),
        "python": _python_version(a, repro), "glibc": _glibc(repro), "nvml": rh.nvml,
        "driver": (nvml.driver_version if nvml else None) or (cap.snapshot.nvml or NvmlFact()).version or rh.driver
        or node.driver,
        "cuda": rh.cuda_driver or node.cuda_runtime_major,
        "kernel": node.kernel or cap.snapshot.kernel or rh.kernel,
    }


def _platform_facts(cap: CaptureDocuments, repro: ReproduceResult | None, imports: list[ImportReport],
                    nvml: NvmlLibrary | None) -> dict[str, Any]:
    """The platform: the OS of the image and of the node, the GPUs, the libnvidia-ml.so mapped, nvidia-smi and
    NVIDIA's bug report, the driver's kernel log, the image."""
    rh = repro.header if repro else ReproHeader()
    node = cap.scheduling.node
    cap_nvml = cap.snapshot.nvml or NvmlFact()
    runs = repro.runs if repro else ()
    smi = cap.nvidia_smi or rh.nvidia_smi
    smi = smi if isinstance(smi, str) else None
    bug_text = cap.bug_report_text or None
    return {
        "os_image": pretty_os(cap.os_release_image), "os_node": pretty_os(cap.os_release_node),
        "in_container": cap.snapshot.in_container_namespace,
        "gpus": rh.gpu or (f"{'?' if node.gpu_count is None else node.gpu_count} x {node.gpu_product}"
                           if node.gpu_product else None),
        "gpu_lines": next((tuple(gpu_lines_of(r.environment)) for r in runs if gpu_lines_of(r.environment)), ()),
        "nvml_library": (nvml.path if nvml else None) or cap_nvml.path or rh.libnvidia_ml,
        "nvml_build_id": (nvml.build_id if nvml else None) or cap_nvml.build_id, "nvml_origin": cap_nvml.origin,
        "nvidia_smi": smi, "bug_report": cap.bug_report_note, "smi": smi_facts(smi or bug_text),
        "bug_report_file": cap.bug_report_file, "bug_report_text": bug_text, "kernel_log": cap.kernel_log,
        "image": _image_of(cap, imports),
    }


def _setup_facts(imports: list[ImportReport], mods: dict[str, ModuleFact]) -> dict[str, Any]:
    """The setup as verify-imports read it: how the stack was installed, the distributions, pip check, the known
    version facts, the modules whose code is not the installed distribution's."""
    not_ok = tuple(f"{k}: {v.verdict}" + (f" ({v.path})" if v.path else "") for k, v in mods.items() if v.not_ok)
    out: dict[str, Any] = {"shadowing": not_ok, "imports_checked": bool(mods), "imports": tuple(imports)}
    if not imports:
        return out
    vi = imports[0]
    installers = sorted({d.installer for d in vi.distributions if d.installer
                         and d.name.lower() in ("nvitop", "nvitop-exporter", "nvidia-ml-py")})
    return out | {
        "installer": ", ".join(installers) or None,
        "environment_notes": vi.python.notes if vi.python else (),
        "distributions": tuple((d.name, d.version) for d in vi.distributions),
        "requirement_problems": tuple(p.message for p in vi.requirement_problems if p.message),
        "version_facts": vi.known_issues,
    }


def _records(ev: Evidence) -> tuple[Analysis | None, ReproduceResult | None, list[ImportReport], list[FleetSummary]]:
    """The documents of the other commands as the records they were written from: the first analysis (through
    :func:`~forensics.format.load_analysis`, the one way report reads one), the first reproduce result, every
    verify-imports result and fleet summary."""
    doc = ev.first("analyze")
    a = load_analysis(doc) if doc is not None else None
    doc = ev.first("reproduce")
    repro = load_reproduce(doc) if doc is not None else None
    return (a, repro, [load_import_report(d) for d in ev.all("verify-imports")],
            [load_fleet(d) for d in ev.all("fleet")])


def _earlier_api(a: Analysis | None, repro: ReproduceResult | None) -> str | None:
    heap = a.heap.corruption if a is not None and a.heap is not None else None
    if heap is not None and heap.call is not None and (heap.call.function or "").startswith("nvml"):
        return heap.call.function
    c = next((r for r in repro.runs if r.name == "c"), None) if repro else None
    call = (repro.header.call or "") if repro else ""
    if c is not None and c.failed and call.startswith("nvml"):
        return call.split("(", 1)[0]
    return None


def _binding_from(text: str | None) -> str | None:
    m = re.search(r"nvidia-ml-py (\S+)", text or "")
    return m.group(1) if m and m.group(1) != "unknown" else None
