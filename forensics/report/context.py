"""Shape evidence into the context a report template renders.

Pure: evidence documents in, :class:`ReportContext` out.  Templates only loop
and branch over this context; every value here is already redacted.  A value
the evidence does not hold is :data:`UNKNOWN`, never an empty cell.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from .evidence import Evidence
from ..redact import Redactor, redact_tree

__all__ = ["UNKNOWN", "ReportContext", "build_context", "TEMPLATES", "REQUIRED_FIELDS"]

UNKNOWN = "unknown (not in the evidence)"
OPEN = "OPEN: not determined yet"
TEMPLATES = ("nvitop", "nvml", "runbook")
NATIVE_SHOWN = 12

# The fields each template must have filled (or explicitly unknown) for --check.
REQUIRED_FIELDS = {
    "nvitop": ("title", "nvitop_version", "os", "driver", "python_env", "description", "reproduce", "traceback"),
    "nvml": ("title", "gpus", "driver", "nvml_library", "description", "reproduce", "native_top"),
    "runbook": ("title", "signature", "first_seen", "affected", "versions", "reproduction", "diagnostics",
                "mitigation", "recovery", "conclusion", "recurrence"),
}


@dataclass
class ReportContext:
    """Everything a template may show; built by :func:`build_context`."""

    template: str
    title: str
    generated_at: str
    tool_version: str
    signature: str
    crash: dict[str, str]
    environment: list[tuple[str, str]]
    nvitop_version: str
    os: str
    driver: str
    cuda: str
    nvidia_smi: str
    gpus: str
    nvml_library: str
    python_env: str
    description: str
    traceback: str
    native_top: list[str]
    native_rest: list[str]
    other_threads: list[tuple[str, str]]
    frequency: list[str]
    ruled_out: list[str]
    reproduce: dict[str, Any]
    workaround: list[str]
    known_issues: list[dict[str, str]]
    evidence: list[dict[str, str]]
    redactions: list[str]
    runbook: dict[str, str]
    missing: list[str] = field(default_factory=list)

    # attribute-style access for the runbook's fields in REQUIRED_FIELDS
    def value(self, name: str) -> Any:
        if hasattr(self, name):
            return getattr(self, name)
        return self.runbook.get(name)


def _get(doc: Any, *path: str, default: Any = None) -> Any:
    cur = doc
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return default
        cur = cur[p]
    return cur if cur not in (None, "", [], {}) else default


def _analysis(ev: Evidence) -> dict | None:
    doc = ev.first("analyze")
    if doc:
        return doc.get("analysis")
    cap = ev.first("capture")
    return _get(cap, "analysis")


def _pytb(py_frames: list[dict]) -> str:
    """The crashing thread's Python stack in traceback form (most recent call last)."""
    if not py_frames:
        return ""
    lines = ["Traceback (most recent call last):"]
    for f in reversed(py_frames):
        lines.append(f'  File "{f.get("file")}", line {f.get("line") if f.get("line") is not None else "?"}, in {f.get("function")}')
    return "\n".join(lines)


def _native_line(f: dict) -> str:
    lib = (f.get("library") or "?").rsplit("/", 1)[-1]
    where = f" at {f['file']}:{f['line']}" if f.get("file") and f.get("line") else ""
    off = f"+{f['offset']}" if f.get("offset") else ""
    return f"#{f.get('index', 0):<3} {f.get('symbol') or '??'}{off} ({lib}){where}"


def _label_driver(labels: dict) -> str | None:
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}") for p in ("major", "minor", "rev")]
    return ".".join(parts) if all(parts) else labels.get("nvidia.com/cuda.driver-version.full")


def _image_of(cap: dict) -> str | None:
    pod = _get(cap, "scheduling", "pod") or {}
    for c in pod.get("containers") or []:
        if isinstance(c, dict) and c.get("image_id"):
            return str(c["image_id"])
    return _get(cap, "record", "image") or _get(cap, "identity", "image")


def _imports(ev: Evidence) -> dict[str, dict]:
    """module -> what verify-imports (first) or a capture's live resolution found for it (version, file, verdict)."""
    out: dict[str, dict] = {}
    for doc in ev.all("verify-imports"):
        for m in _get(doc, "result", "modules", default=None) or doc.get("modules") or []:
            if isinstance(m, dict) and m.get("module"):
                out.setdefault(str(m["module"]), m)
    for doc in ev.all("capture"):
        for m in _get(doc, "snapshot", "python", "modules", default=[]) or []:
            if isinstance(m, dict) and m.get("module"):
                out.setdefault(str(m["module"]), {"module": m["module"], "version": m.get("version"),
                                                  "file": m.get("path"), "verdict": "resolved at capture"})
    return out


def _module_line(mods: dict[str, dict], name: str, dist: str) -> str:
    m = mods.get(name)
    if not m:
        return f"{dist}: {UNKNOWN} (run forensics verify-imports on the image)"
    version = m.get("version") or m.get("module_version") or m.get("dist_version") or "?"
    file = m.get("file") or m.get("resolved") or "?"
    verdict = m.get("verdict") or m.get("status") or "?"
    return f"{dist} {version} imported from {file} ({verdict})"


def build_context(ev: Evidence, template: str, redactor: Redactor, *, tool_version: str,
                  now: _dt.datetime | None = None, reproducer_sources: dict[str, str] | None = None) -> ReportContext:
    """Build the redacted context for ``template`` from the evidence.

    :param reproducer_sources: ``{"python": source, "c": source}`` of the minimal reproducers
    """
    if template not in TEMPLATES:
        raise ValueError(template)
    # Redact the whole evidence tree once, before anything is picked out of it; first learn every
    # secret value in it (and in the evidence paths), so that each is masked wherever it appears.
    paths = [i.path for i in ev.items]
    redactor.learn({"docs": ev.docs, "paths": paths})
    docs = {k: [redact_tree(d, redactor) for d in v] for k, v in ev.docs.items()}
    ev = Evidence(docs=docs, items=ev.items)
    a = _analysis(ev) or {}
    snap = a.get("snapshot") or {}
    core = snap.get("core") or {}
    crash = a.get("crash") or {}
    threads = snap.get("threads") or []
    crashed = next((t for t in threads if t.get("is_crashed")), threads[0] if threads else {})
    nvml = core.get("nvml") or {}
    cap = ev.first("capture") or {}
    repro = ev.first("reproduce") or {}
    mods = _imports(ev)

    cap_nvml = _get(cap, "snapshot", "nvml") or {}
    gpu_labels = _get(cap, "scheduling", "node", "gpu_labels") or {}
    driver = (nvml.get("driver_version") or cap_nvml.get("version") or _get(repro, "environment", "driver")
              or _label_driver(gpu_labels) or UNKNOWN)
    cuda = _get(repro, "environment", "cuda") or gpu_labels.get("nvidia.com/cuda.runtime.major") or UNKNOWN
    gpu_names = (_get(repro, "environment", "gpus")  # "8 x NVIDIA H20"
                 or (f"{gpu_labels.get('nvidia.com/gpu.count', '?')} x {gpu_labels['nvidia.com/gpu.product']}"
                     if gpu_labels.get("nvidia.com/gpu.product") else None))
    gpus = (", ".join(f"{n}x {name}" for name, n in _count(gpu_names).items()) if isinstance(gpu_names, list)
            else (str(gpu_names) if gpu_names else UNKNOWN))
    origin = cap_nvml.get("origin")
    if origin and cap_nvml.get("bind_source"):
        origin += f", bind source {cap_nvml['bind_source']}"
    nvml_path = nvml.get("path") or cap_nvml.get("path")
    nvml_library = (f"{nvml_path} (build-id {nvml.get('build_id') or cap_nvml.get('build_id') or '?'}, driver "
                    f"{nvml.get('driver_version') or cap_nvml.get('version') or '?'}"
                    + (f"; {origin}" if origin else "") + ")") if nvml_path else UNKNOWN
    kernel = (_get(cap, "scheduling", "node", "kernel") or _get(cap, "snapshot", "kernel")
              or _get(repro, "environment", "kernel") or UNKNOWN)
    python_version = snap.get("python_version") or _get(repro, "environment", "python") or UNKNOWN
    nvitop_line = _module_line(mods, "nvitop", "nvitop")
    exporter_line = _module_line(mods, "nvitop_exporter", "nvitop-exporter")
    pynvml_line = _module_line(mods, "pynvml", "nvidia-ml-py")
    image = (_image_of(cap) or _get(ev.first("verify-imports"), "result", "image", "digest")
             or _get(ev.first("verify-imports"), "image", "digest") or UNKNOWN)

    signature = a.get("signature") or UNKNOWN
    thread_name = crashed.get("name") or "unnamed"
    top_py = _title_frame(crashed.get("py_frames") or [])
    msg = crash.get("abort_message")
    what = f'aborts with "{msg}"' if msg else f"dies of {crash.get('signal_name') or 'a signal'}"
    title_core = f"exporter {what}" + (f" in {top_py}" if top_py else "") + (f" on driver {driver}" if driver != UNKNOWN else "")
    title = ("[BUG] " if template == "nvitop" else "") + title_core

    native = crashed.get("native_frames") or []
    fault = (f"0x{crash['fault_address']:x} ({crash.get('fault_kind')})" if isinstance(crash.get("fault_address"), int) else "none")
    crash_rows = {
        "signal": crash.get("signal_name") or UNKNOWN,
        "class": crash.get("kind") or UNKNOWN,
        "abort message": msg or "none",
        "fault address": fault,
        "crashing thread": f"{thread_name} (tid {crashed.get('tid', '?')})" if crashed else UNKNOWN,
        "fingerprint": a.get("fingerprint") or UNKNOWN,
    }
    description = (
        f"The process {core.get('args') or core.get('command') or '?'} (pid {core.get('pid', '?')}) died: {signature}."
        if a else UNKNOWN
    )
    frequency = _frequency(ev)
    ruled_out = _ruled_out(ev, mods, cap)
    environment = [
        ("GPUs", gpus), ("NVIDIA driver", driver), ("CUDA", str(cuda)), ("libnvidia-ml.so", nvml_library),
        ("Kernel", str(kernel)), ("Container image", str(image)), ("Python", str(python_version)),
        ("nvitop", nvitop_line), ("nvitop-exporter", exporter_line), ("nvidia-ml-py", pynvml_line),
    ]
    reproduce = {
        "sources": reproducer_sources or {},
        "observed": _reproduce_observed(repro),
    }
    workaround = [
        "Turn off the NVLink throughput query until fixed: `forensics guard --target "
        "nvitop.api.device:Device.nvlink_throughput --returns '[]' --env FORENSICS_GUARD_NVLINK`",
        "or pin the node group to a driver branch without the crash (see how often and where).",
    ] if top_py and "nvlink" in top_py.lower() else ["None known yet."]
    # bundle directory names embed the pod name (<stamp>-<namespace>-<pod>): paths are evidence text too
    evidence = [{"path": redactor.text(i.path), "kind": i.kind, "sha256": i.sha256, "size": str(i.size)} for i in ev.items]
    other = [
        (f"{t.get('name') or 'unnamed'} (tid {t.get('tid')})", _pytb(t.get("py_frames") or []) or "\n".join(_native_line(f) for f in (t.get("native_frames") or [])[:8]))
        for t in threads if t is not crashed
    ]
    runbook = {
        "signature": signature,
        "first_seen": _first_seen(ev) or UNKNOWN,
        "affected": "; ".join(_affected(ev) + frequency) or UNKNOWN,
        "versions": f"driver {driver}, CUDA {cuda}, GPUs {gpus}; {nvitop_line}; {pynvml_line}",
        "reproduction": reproduce["observed"] or OPEN,
        "diagnostics": "; ".join(sorted({f"forensics {i.kind}" for i in ev.items})),
        "mitigation": workaround[0] if workaround[0] != "None known yet." else OPEN,
        "recovery": OPEN + " (verify with forensics canary after the mitigation)",
        "conclusion": OPEN,
        "recurrence": OPEN + " (suggested: any new core with fingerprint " + (a.get("fingerprint") or "?") + ")",
    }
    ctx = ReportContext(
        template=template, title=title, generated_at=(now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        tool_version=tool_version, signature=signature, crash=crash_rows, environment=environment,
        nvitop_version=nvitop_line, os=str(kernel), driver=driver, cuda=str(cuda), gpus=gpus, nvml_library=nvml_library,
        nvidia_smi=str(cap.get("nvidia_smi") or _get(repro, "environment", "nvidia_smi")
                       or "not captured: no nvidia-smi output in the evidence"),
        python_env=f"Python {python_version}; {nvitop_line}; {exporter_line}; {pynvml_line}",
        description=description, traceback=_pytb(crashed.get("py_frames") or []) or UNKNOWN,
        native_top=[_native_line(f) for f in native[:NATIVE_SHOWN]] or [UNKNOWN],
        native_rest=[_native_line(f) for f in native[NATIVE_SHOWN:]], other_threads=other,
        frequency=frequency, ruled_out=ruled_out, reproduce=reproduce, workaround=workaround,
        known_issues=[], evidence=evidence, redactions=redactor.summary(), runbook=runbook,
    )
    ctx.missing = [f for f in REQUIRED_FIELDS[template] if _is_unknown(ctx.value(f))]
    return ctx


_BINDING_FILES = ("pynvml.py", "/api/libnvml.py")


def _title_frame(py_frames: list[dict]) -> str | None:
    """The innermost Python frame above the NVML binding's wrappers: the caller that matters."""
    for f in py_frames:
        if not str(f.get("file") or "").endswith(_BINDING_FILES):
            return f.get("function")
    return py_frames[0].get("function") if py_frames else None


def _is_unknown(v: Any) -> bool:
    if isinstance(v, list):
        return not v or v == [UNKNOWN]
    if isinstance(v, dict):
        return not any(v.values())
    return v in (None, "", UNKNOWN)


def _count(names: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[str(n)] = out.get(str(n), 0) + 1
    return out


def _frequency(ev: Evidence) -> list[str]:
    out = []
    for doc in ev.all("analyze-batch"):
        for g in _get(doc, "batch", "groups", default=[]) or []:
            out.append(f"{g.get('count')} cores with fingerprint {g.get('fingerprint')}: {g.get('signature')}")
    for doc in ev.all("fleet"):
        for g in _get(doc, "fleet", "groups", default=[]) or []:
            if isinstance(g, dict):
                name = ", ".join(str(kv[1]) for kv in g.get("key") or [] if isinstance(kv, list) and len(kv) == 2)
                out.append(
                    f"{name or '(no labels)'}: {g.get('pods_with_restarts', '?')} of {g.get('pods', '?')} pods "
                    f"restarted, {g.get('total_restarts', '?')} restarts, exit codes {g.get('exit_codes') or {}}"
                )
        for b in _get(doc, "fleet", "boundary", default=[]) or []:
            out.append(f"boundary: {b}")
    return out


def _affected(ev: Evidence) -> list[str]:
    """Who crashed, as the captures say: node (GPUs), pod and container restarts, the handler's crash records."""
    out = []
    for doc in ev.all("capture"):
        node = _get(doc, "scheduling", "node", default={}) or {}
        labels = node.get("gpu_labels") or {}
        gpus = labels.get("nvidia.com/gpu.product")
        count = labels.get("nvidia.com/gpu.count")
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


def _ruled_out(ev: Evidence, mods: dict[str, dict], cap: dict) -> list[str]:
    out = []
    if mods:
        bad = {k: v for k, v in mods.items() if str(v.get("verdict", "")).upper() not in ("OK",)}
        if bad:
            out.append("Source shadowing: NOT ruled out — " + "; ".join(f"{k}: {v.get('verdict')}" for k, v in bad.items()))
        else:
            out.append("Source shadowing: ruled out (forensics verify-imports: every module OK)")
    else:
        out.append("Source shadowing: not checked (run forensics verify-imports on the image)")
    nv = _get(cap, "snapshot", "nvml") or {}
    host = nv.get("matches_host")
    if host is True:
        out.append("Stale libnvidia-ml.so in the image: ruled out (the mapped library is the host driver's)")
    elif host is False:
        out.append("Stale libnvidia-ml.so: NOT ruled out — the mapped library is not the host driver's")
    elif nv.get("verdict"):
        out.append(f"Which libnvidia-ml.so: {nv['verdict']}")
    else:
        out.append("Stale libnvidia-ml.so: not checked (capture the pod with forensics capture)")
    return out


def _reproduce_observed(repro: dict) -> str:
    if not repro:
        return ""
    parts = []
    for r in repro.get("runs") or []:
        if isinstance(r, dict):
            parts.append(f"{r.get('name')}: {r.get('outcome')}" + (f" ({r.get('signature')})" if r.get("signature") else ""))
    return "; ".join(parts)
