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

from .evidence import Evidence

__all__ = ["Facts", "Phase", "Query", "read_facts", "parse_os_release", "pretty_os", "smi_facts", "xid_summary",
           "NVLINK_QUERY"]

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
_LIBC_ABORT = ("libc.so", "libc-", "libc_malloc_debug")


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
    caller: str | None = None  # the first Python frame above the binding's wrappers
    query: Query | None = None
    native_frames: tuple[dict, ...] = ()
    py_frames: tuple[dict, ...] = ()
    other_threads: tuple[dict, ...] = ()
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
    smi: dict = field(default_factory=lambda: {"gpus": []})  # nvidia-smi -q parsed once (smi_facts), else the
    # copy inside nvidia-bug-report's log
    image: str | None = None
    # the setup
    installer: str | None = None
    environment_notes: tuple[str, ...] = ()
    distributions: tuple[tuple[str, str], ...] = ()  # (name, version), all of them
    requirement_problems: tuple[str, ...] = ()  # pip check
    version_facts: tuple[dict, ...] = ()  # verify-imports' known issues (knowledge-file hits)
    shadowing: tuple[str, ...] = ()  # modules not OK
    imports_checked: bool = False
    # the reproducers
    repro: dict = field(default_factory=dict)  # the reproduce document (redacted)
    repro_runs: tuple[dict, ...] = ()
    # the core's heap (#21): who wrote past the buffer that overflowed
    # "driver-wrote-past-buffer" | "binding-count-too-large" | "library-own-buffer" | "undetermined"
    heap_verdict: str | None = None
    heap_reason: str | None = None
    heap_freed_in: str | None = None  # the object file whose free() glibc aborted in (its base name)
    # how often
    frequency: tuple[str, ...] = ()
    first_seen: str | None = None
    affected: tuple[str, ...] = ()

    @property
    def python_run(self) -> dict | None:
        return next((r for r in self.repro_runs if r.get("name") == "python"), None)

    @property
    def c_run(self) -> dict | None:
        return next((r for r in self.repro_runs if r.get("name") == "c"), None)


def _get(doc: Any, *path: str, default: Any = None) -> Any:
    cur = doc
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur if cur not in (None, "", [], {}) else default


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


def smi_facts(text: str | None) -> dict:
    """What NVIDIA's bug reports ask for, from ``nvidia-smi -q``: driver, CUDA, and per GPU product, bus id,
    VBIOS, persistence and MIG mode, Fabric state.

    >>> smi_facts("Driver Version : 580.126.09\\nCUDA Version : 13.0\\n\\nGPU 00000000:18:00.0\\n"
    ...           "    Product Name : NVIDIA H20\\n    Persistence Mode : Enabled\\n")["gpus"]
    [{'bus_id': '00000000:18:00.0', 'Product Name': 'NVIDIA H20', 'Persistence Mode': 'Enabled'}]
    """
    out: dict = {"gpus": []}
    if not text:
        return out
    cur: dict | None = None
    section = ""
    for raw in text.splitlines():
        m = _SMI_GPU.match(raw.strip())
        if m:
            cur = {"bus_id": m.group(1)}
            out["gpus"].append(cur)
            section = ""
            continue
        if ":" not in raw:
            if raw.strip():
                section = raw.strip()
            continue
        k, _, v = raw.partition(":")
        k, v = k.strip(), v.strip()
        if cur is None:
            if k in ("Driver Version", "CUDA Version"):
                out[k] = v
            continue
        if k in ("Product Name", "VBIOS Version", "Persistence Mode", "Bus Id") and k not in cur:
            cur[k] = v
        elif k == "Current" and section.startswith("MIG Mode"):
            cur["MIG Mode"] = v
        elif k in ("State", "Status") and section.startswith("Fabric"):
            cur[f"Fabric {k}"] = v
    return out


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


def _analysis(ev: Evidence) -> dict:
    doc = ev.first("analyze")
    if doc:
        return doc.get("analysis") or {}
    return _get(ev.first("capture"), "analysis", default={}) or {}


_BINDING_FILES = ("pynvml.py", "/api/libnvml.py", "libnvml.py")


def _interrupted_frames(thread: dict) -> tuple[list[dict], list[dict]]:
    """A thread's native and Python frames from before any signal handler ran on it (all of them when
    none did): the outermost signal frame splits them (``native_index``, ``py_index``)."""
    native = [f for f in thread.get("native_frames") or [] if isinstance(f, dict)]
    py = [f for f in thread.get("py_frames") or [] if isinstance(f, dict)]
    frames = [sf for sf in thread.get("signal_frames") or [] if isinstance(sf, dict)]
    if frames:
        outer = frames[-1]
        if isinstance(outer.get("native_index"), int):
            native = native[outer["native_index"] + 1:]
        if isinstance(outer.get("py_index"), int):
            py = py[outer["py_index"]:]
    return native, py


def _caller(py_frames: list[dict]) -> str | None:
    """The innermost Python frame above the NVML binding's wrappers: the caller that matters."""
    for f in py_frames:
        if not str(f.get("file") or "").endswith(_BINDING_FILES):
            return f.get("function")
    return None


def _api(native: list[dict], py: list[dict]) -> str | None:
    for f in native:
        sym = str(f.get("symbol") or "")
        if "libnvidia-ml" in str(f.get("library") or "") and sym.startswith("nvml"):
            return sym
    for f in py:
        fn = str(f.get("function") or "")
        if str(f.get("file") or "").endswith("pynvml.py") and fn.startswith("nvml"):
            return fn
    return None


def _inside_nvml(native: list[dict]) -> bool:
    """The crashing thread was in libnvidia-ml: its first frame past libc's abort machinery is NVML's."""
    for f in native:
        lib = str(f.get("library") or "")
        if any(x in lib for x in _LIBC_ABORT):
            continue
        return "libnvidia-ml" in lib
    return False


def _phase(threads: list[dict]) -> Phase:
    if not any(t.get("native_frames") for t in threads):
        return Phase.UNKNOWN
    for t in threads:
        for f in t.get("native_frames") or []:
            if str(f.get("symbol") or "") in _EXIT_FRAMES:
                return Phase.EXIT
    return Phase.RUNNING


def _query(api: str | None, py: list[dict], repro: dict) -> Query | None:
    functions = [str(f.get("function") or "") for f in py]
    nvlink = any("nvlink_throughput" in fn for fn in functions)
    call = _get(repro, "environment", "call")
    if api == "nvmlDeviceGetFieldValues" and (nvlink or (call and not py)):
        links = None  # what the reproducers read (NVML_FI_DEV_NVLINK_LINK_COUNT), else NVML's maximum, 18
        for r in _get(repro, "reproduce", "runs", default=[]) or []:
            m = re.match(r"(\d+) on each", str(_get(r, "environment", "nvlinks") or ""))
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


def _modules(ev: Evidence) -> dict[str, dict]:
    """module -> {version, file, verdict}: verify-imports first, then a capture's live resolution."""
    out: dict[str, dict] = {}
    for doc in ev.all("verify-imports"):
        for m in _get(doc, "result", "modules", default=None) or doc.get("modules") or []:
            if isinstance(m, dict) and m.get("module"):
                out.setdefault(str(m["module"]), {"version": m.get("effective_version") or m.get("version"),
                                                  "file": m.get("file"), "verdict": m.get("verdict")})
    for doc in ev.all("capture"):
        for m in _get(doc, "snapshot", "python", "modules", default=[]) or []:
            if isinstance(m, dict) and m.get("module"):
                out.setdefault(str(m["module"]), {"version": m.get("version"), "file": m.get("path"),
                                                  "verdict": m.get("verdict")})
    return out


def _label_driver(labels: dict) -> str | None:
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
    if all(isinstance(p, str) and p for p in parts):
        return ".".join(str(p) for p in parts)
    full = labels.get("nvidia.com/cuda.driver-version.full")
    return full if isinstance(full, str) else None


def _glibc(repro: dict) -> str | None:
    for src in [_get(repro, "environment", "glibc")] + [_get(r, "environment", "glibc") for r in
                                                         _get(repro, "reproduce", "runs", default=[]) or []]:
        if isinstance(src, str) and src:
            return src.replace("glibc", "").strip()
    return None


def _python_version(snap: dict, repro: dict) -> str | None:
    if snap.get("python_version"):
        return str(snap["python_version"])
    v = _get(repro, "environment", "python")
    m = re.search(r"(\d+\.\d+\.\d+\S*)", v or "")
    return m.group(1) if m else None


def _repro_runs(repro: dict) -> list[dict]:
    """Each run with what report needs: name, status, outcome, verdict, command, seconds, the crash details."""
    detailed = {r.get("name"): r for r in _get(repro, "reproduce", "runs", default=[]) or [] if isinstance(r, dict)}
    out = []
    for r in repro.get("runs") or []:
        if not isinstance(r, dict):
            continue
        d = detailed.get(r.get("name"), {})
        status = r.get("status") or _status_of(r, d)
        out.append({**d, **r, "status": status, "command": r.get("command") or d.get("command") or [],
                    "environment": d.get("environment") or {}})
    return out


def _status_of(r: dict, d: dict) -> str:
    """The status of a run recorded before ``status`` existed (older reproduce documents)."""
    outcome = str(r.get("outcome") or "")
    verdict = str(r.get("verdict") or d.get("verdict") or "")
    if outcome.startswith("crashed"):
        return "crashed"
    if "heap corruption detected" in outcome or verdict.startswith("heap corruption detected"):
        return "heap corruption detected"
    if "could not start" in verdict or "cannot load" in verdict or "initialization failed" in verdict:
        return "could not start"
    return "clean" if outcome == "clean" else "failed"


def _frequency(ev: Evidence) -> list[str]:
    out = []
    for doc in ev.all("analyze-batch"):
        for g in _get(doc, "batch", "groups", default=[]) or []:
            out.append(f"{g.get('count')} cores of this crash in the batch (first {_when(g.get('first_seen'))}, "
                       f"last {_when(g.get('last_seen'))})")
    for doc in ev.all("fleet"):
        for g in _get(doc, "fleet", "groups", default=[]) or []:
            if isinstance(g, dict):
                name = ", ".join(str(kv[1]) for kv in g.get("key") or [] if isinstance(kv, list) and len(kv) == 2)
                codes = g.get("exit_codes") or {}
                codes_text = (", ".join(f"exit {k}: {v}" for k, v in sorted(codes.items()))
                              if isinstance(codes, dict) else str(codes))
                out.append(f"{name or 'all nodes'}: {g.get('pods_with_restarts', '?')} of {g.get('pods', '?')} pods "
                           f"restarted, {g.get('total_restarts', '?')} restarts"
                           + (f" ({codes_text})" if codes_text else ""))
        for b in _get(doc, "fleet", "boundary", default=[]) or []:
            out.append(f"boundary: {b}")
    return out


def _when(t: Any) -> str:
    if isinstance(t, (int, float)):
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return str(t or "?")


def _first_seen(ev: Evidence) -> str | None:
    """The earliest crash the evidence dates: a batch's oldest core, an analysed core's write time, a core
    handler's record, a pod's last terminated container (the source is named)."""
    times: list[tuple[float, str]] = []
    for doc in ev.all("analyze-batch"):
        for g in _get(doc, "batch", "groups", default=[]) or []:
            if isinstance(g.get("first_seen"), (int, float)):
                times.append((float(g["first_seen"]), "oldest core of the batch"))
    for doc in ev.all("analyze"):
        t = _get(doc, "analysis", "snapshot", "core", "mtime")
        if isinstance(t, (int, float)):
            times.append((float(t), "the core file's write time"))
    for doc in ev.all("capture"):
        t = _get(doc, "record", "time")
        if isinstance(t, (int, float)) and _get(doc, "record", "signal"):
            times.append((float(t), "core handler record"))
        for c in _get(doc, "scheduling", "pod", "containers", default=[]) or []:
            finished = _get(c, "last_terminated", "finished_at")
            if isinstance(finished, str):
                try:
                    when = _dt.datetime.fromisoformat(finished.replace("Z", "+00:00"))
                except ValueError:
                    continue
                times.append((when.timestamp(), "the pod's last terminated container (earlier crashes are not dated)"))
    if not times:
        return None
    t, source = min(times)
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") + f" ({source})"


def _affected(ev: Evidence) -> list[str]:
    """Who crashed, as the captures say: node (GPUs), pod and container restarts."""
    out = []
    for doc in ev.all("capture"):
        node = _get(doc, "scheduling", "node", default={}) or {}
        labels = node.get("gpu_labels") or {}
        gpus, count = labels.get("nvidia.com/gpu.product"), labels.get("nvidia.com/gpu.count")
        name = node.get("name") or _get(doc, "identity", "node") or _get(doc, "record", "node")
        where = f"node {name}" if name else ""
        if where and gpus:
            where += f" ({count + ' x ' if count else ''}{gpus})"
        pod = _get(doc, "scheduling", "pod", default={}) or {}
        if pod.get("name"):
            restarts = sum(int(c.get("restart_count") or 0) for c in pod.get("containers") or [] if isinstance(c, dict))
            where += f"{', ' if where else ''}pod {pod.get('namespace')}/{pod['name']} ({restarts} container restarts)"
        elif _get(doc, "identity", "pod_uid"):
            where += f"{', ' if where else ''}pod uid {_get(doc, 'identity', 'pod_uid')}"
        if where and where not in out:
            out.append(where)
    return out


def _image_of(ev: Evidence, cap: dict) -> str | None:
    pod = _get(cap, "scheduling", "pod") or {}
    for c in pod.get("containers") or []:
        if isinstance(c, dict) and c.get("image_id"):
            return str(c["image_id"])
    vi = ev.first("verify-imports")
    return (_get(cap, "record", "image") or _get(cap, "identity", "image") or _get(vi, "result", "image", "digest")
            or (_get(vi, "result", "image", "ref") if _get(vi, "result", "image",
                                                           "transport") not in (None, "pid") else None))


def read_facts(ev: Evidence) -> Facts:
    """The facts of ``ev`` (already redacted / localized by the caller)."""
    a = _analysis(ev)
    snap = a.get("snapshot") or {}
    core = snap.get("core") or {}
    crash = a.get("crash") or {}
    threads = [t for t in snap.get("threads") or [] if isinstance(t, dict)]
    # the first fault's thread, and its frames from before any signal handler ran (a crash reporter's
    # handler that faulted on top is not the crash: analyze puts it in crash.then)
    crashed = (next((t for t in threads if crash.get("tid") is not None and t.get("tid") == crash.get("tid")), None)
               or next((t for t in threads if t.get("is_crashed")), threads[0] if threads else {}))
    native, py = _interrupted_frames(crashed)
    cap = ev.first("capture") or {}
    repro = ev.first("reproduce") or {}
    rh = repro.get("environment") or {}
    mods = _modules(ev)
    cap_nvml = _get(cap, "snapshot", "nvml") or {}
    nvml = core.get("nvml") or {}
    labels = _get(cap, "scheduling", "node", "gpu_labels") or {}
    vi = _get(ev.first("verify-imports"), "result") or {}
    api = _api(native, py)
    pid, tid = core.get("pid"), crashed.get("tid")
    fault = (f"0x{crash['fault_address']:x} ({crash.get('fault_kind')})"
             if isinstance(crash.get("fault_address"), int) else None)
    words: list[str] = []
    for f in native:
        words += [str(f.get("symbol") or ""), str(f.get("library") or "")]
    for f in py:
        words += [str(f.get("file") or ""), str(f.get("function") or "")]
    gpus = rh.get("gpus") or (f"{labels.get('nvidia.com/gpu.count', '?')} x {labels['nvidia.com/gpu.product']}"
                              if labels.get("nvidia.com/gpu.product") else None)
    run_docs = _repro_runs(repro)
    gpu_lines = next((tuple(r.get("gpus") or ()) for r in run_docs if r.get("gpus")), ())
    dists = tuple((str(d.get("name")), str(d.get("version"))) for d in vi.get("distributions") or []
                  if isinstance(d, dict) and d.get("name"))
    installers = sorted({str(d.get("installer")) for d in vi.get("distributions") or []
                         if isinstance(d, dict) and d.get("installer") and str(d.get("name")).lower()
                         in ("nvitop", "nvitop-exporter", "nvidia-ml-py")})
    not_ok = tuple(f"{k}: {v.get('verdict')}" + (f" ({v['file']})" if v.get("file") else "") for k, v in mods.items()
                   if v.get("verdict") and str(v.get("verdict")).upper() != "OK")
    smi = cap.get("nvidia_smi") or _get(repro, "environment", "nvidia_smi")
    smi = smi if isinstance(smi, str) else None
    bug_text = cap.get("bug_report_text") or None
    return Facts(
        has_crash=bool(a) and crash.get("kind") != "snapshot",  # a gcore of a live process is no crash
        signal=crash.get("signal_name"), kind=crash.get("kind"),
        abort_message=crash.get("abort_message"), fault=fault, thread_name=crashed.get("name"), tid=tid,
        is_main_thread=(tid == pid) if isinstance(tid, int) and isinstance(pid, int) else None,
        phase=_phase(threads), inside_nvml=_inside_nvml(native), api=api, caller=_caller(py),
        query=_query(api, py, repro), native_frames=tuple(native), py_frames=tuple(py),
        other_threads=tuple(t for t in threads if t is not crashed),
        process=core.get("args") or core.get("command"), pid=pid, core_time=core.get("mtime"),
        signature=a.get("signature"), fingerprint=a.get("fingerprint"), frame_words=tuple(w for w in words if w),
        exit_status=crash.get("exit_status") if isinstance(crash.get("exit_status"), int) else None,
        exit_explanation=a.get("exit_explanation") if isinstance(a.get("exit_explanation"), str) else None,
        nested=bool(crash.get("then")) or bool(crash.get("handler")),
        nvitop=(mods.get("nvitop") or {}).get("version"), exporter=(mods.get("nvitop_exporter") or {}).get("version"),
        binding=(mods.get("pynvml") or {}).get("version") or _binding_from(rh.get("binding")),
        python=_python_version(snap, repro), glibc=_glibc(repro), nvml=rh.get("nvml"),
        driver=(nvml.get("driver_version") or cap_nvml.get("version") or rh.get("driver") or _label_driver(labels)),
        cuda=rh.get("cuda") or labels.get("nvidia.com/cuda.runtime.major"),
        kernel=(_get(cap, "scheduling", "node", "kernel") or _get(cap, "snapshot", "kernel") or rh.get("kernel")),
        os_image=pretty_os(cap.get("os_release_image")), os_node=pretty_os(cap.get("os_release_node")),
        in_container=_get(cap, "snapshot", "in_container_namespace") if isinstance(
            _get(cap, "snapshot", "in_container_namespace"), bool) else None,
        gpus=gpus, gpu_lines=gpu_lines, nvml_library=nvml.get("path") or cap_nvml.get("path") or rh.get("libnvidia_ml"),
        nvml_build_id=nvml.get("build_id") or cap_nvml.get("build_id"), nvml_origin=cap_nvml.get("origin"),
        nvidia_smi=smi, bug_report=cap.get("bug_report_note"), smi=smi_facts(smi or bug_text),
        bug_report_file=cap.get("bug_report_file"), bug_report_text=bug_text,
        kernel_log=cap.get("kernel_log"), image=_image_of(ev, cap),
        installer=", ".join(installers) or None, environment_notes=tuple(_get(vi, "python", "notes", default=[]) or []),
        distributions=dists,
        requirement_problems=tuple(str(p.get("message")) for p in vi.get("requirement_problems") or []
                                   if isinstance(p, dict) and p.get("message")),
        version_facts=tuple(k for k in vi.get("known_issues") or [] if isinstance(k, dict)),
        shadowing=not_ok, imports_checked=bool(mods),
        repro=repro, repro_runs=tuple(run_docs),
        frequency=tuple(_frequency(ev)), first_seen=_first_seen(ev), affected=tuple(_affected(ev)),
        heap_verdict=_get(a, "heap", "corruption", "verdict"),
        heap_reason=_get(a, "heap", "corruption", "verdict_reason"),
        heap_freed_in=(str(_get(a, "heap", "corruption", "freed_by", "library") or "").rsplit("/", 1)[-1] or None),
    )


def _binding_from(text: str | None) -> str | None:
    m = re.search(r"nvidia-ml-py (\S+)", text or "")
    return m.group(1) if m and m.group(1) != "unknown" else None
