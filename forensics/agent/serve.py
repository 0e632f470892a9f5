"""``forensics agent serve``: the DaemonSet's long-running process on each GPU node.

It watches the core handler's directory and, for each new crash with a core, runs ``forensics
analyze --json`` on the crash's bundle once — one at a time, in a child process at the lowest
CPU and I/O priority (SCHED_IDLE, nice 19, the idle I/O class, so the handler the kernel waits on
never waits on it), bounded in time (killed past ``analysis_timeout``) and memory (its address
space) — and writes the result into the bundle (``60-analysis/analysis.json``, or ``failed.json``
with the reason).  It publishes:

- Prometheus metrics on a port (:class:`IndexCollector`; every value computed from the bundles,
  see :mod:`.nodeindex`), with bounded label cardinality: ``forensics_crashes_total`` has at most
  ``max_series`` label sets (default 500); crashes past that are counted in one series whose
  labels are ``_other``.  Labels: ``node``, ``fingerprint`` (12 hex digits or ``unknown``),
  ``previous_fingerprint`` (the key the previous fingerprint definition gives the same crash, or empty
  for an analysis that has none), ``crash_class`` (analyze's crash kinds), ``signal`` (a signal name),
  ``namespace``, ``pod``, ``container``, ``image_digest`` (the pods on one node: a DaemonSet's few), so
  one node's series are (distinct crashes) x (pods and containers that had them).  A core of a process
  another process killed (a signal it was sent: analyze's ``sent-signal``) is no crash: it is counted in
  ``forensics_signals_sent_total`` (``node``, ``signal``, ``sender_uid``, and the pod's labels; the same
  bound), never in ``forensics_crashes_total``.  The other families' labels come
  from closed sets: ``reason`` of :data:`~.nodeindex.NOT_KEPT_REASONS` and analysis failures
  (``timeout``, ``memory``, ``resources``, ``error``, ``interrupted``), ``kind`` of ``cores`` / ``objects``.
- A Kubernetes Event (events.k8s.io/v1) on the crashed pod (type Warning, reason ``NativeCrash``,
  action ``Analyzed``; note: signature, fingerprint, where the first bundle lives), one per (pod,
  fingerprint, note), its ``series`` counting the crashes in the index — set, not incremented, so a
  restarted agent never counts twice — through kubectl with the agent's own service account
  (:class:`~.events.EventSink`).

A restarted agent reads the bundles again: nothing is counted twice, nothing is lost, and it never
deletes anything but, with ``upload``, what a verified upload put in a bucket (:mod:`.shipper`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import platform
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Any

from ..cache import cache_path
from ..redact import redact_document
from ..sandbox import DEFAULT_UID as SANDBOX_UID
from ..subproc import OutputTooLarge, run_bounded
from ..bundle import layout
from .events import EventSink
from .nodeindex import MAX_READ, NOT_KEPT_REASONS, IndexReader

__all__ = ["ServeConfig", "Agent", "HANDLER_REASONS", "NODE_LABEL", "handler_state",
           "IndexCollector", "analysis_failure_reasons", "analyze_crash", "serve",
           "fit_document", "NOT_STARTED"]

ANALYSIS_FAILURES = ("timeout", "memory", "resources", "error", "interrupted")
NOT_STARTED = "not-started"
_TRANSIENT = (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
#: what the analysis child prints when a limit (the pod's pids) stopped it making a thread or process inside
_SHORT_SIGNS = ("can't start new thread", "Resource temporarily unavailable", "BlockingIOError")
MAX_SHORT = 10  # analyses in a row short of threads or processes inside: tried again, then failed "resources"
STORED_EVERY = 60.0  # seconds between counts of the bytes stored when no bundle changed
MAX_ANALYSIS_OUTPUT = 256 << 20  # what an analysis may print by default (--analysis-output-max): the temporary
# file it goes to is cut there (the child killed), and it is read back whole, then fit to MAX_READ
_IOPRIO_SET = 251  # x86-64 syscall number
_IOPRIO_CLASS_IDLE = 3


#: forensics_handler_installed's ``reason`` (a closed set): 1 only with "installed"
# the label naming the agent's node on every family but forensics_build_info: not `node`, the label Prometheus'
# kubernetes_sd relabelling adds to a pod's target (the prometheus-community chart's kubernetes-pods job, as
# kube-state-metrics names a pod's node), whose scrape would rename ours to exported_node
NODE_LABEL = "forensics_node"
HANDLER_REASONS = ("installed", "not-installed", "handler-missing", "replaced-by-systemd-coredump",
                   "replaced-by-apport", "replaced")


def handler_state(core_dir: str, proc: str = "/proc") -> tuple[str, str, str | None]:
    """Is kernel.core_pattern the handler's that ``capture --install-handler`` recorded in ``CORE_DIR/handler.json``?

    :return: (a reason of :data:`HANDLER_REASONS`, the pattern now, the handler's pattern or None when none is
        recorded)
    """
    from ..capture.pattern import read_core_pattern

    wanted = None
    try:
        with open(os.path.join(core_dir, layout.HANDLER_STATE)) as f:
            doc = json.load(f)
        wanted = doc.get("pattern") if isinstance(doc, dict) and isinstance(doc.get("pattern"), str) else None
    except (OSError, ValueError):  # never installed here (or unreadable): nothing to compare with
        pass
    try:
        current = read_core_pattern(proc).strip()
    except OSError:  # no /proc/sys here: the pattern is unknown, so not ours
        current = ""
    if wanted is None:
        return "not-installed", current, None
    if current == wanted.strip():
        program = wanted[1:].split()[0] if wanted.startswith("|") and wanted[1:].split() else ""
        return ("installed" if os.access(program, os.X_OK) else "handler-missing"), current, wanted
    taker = current[1:].split()[0] if current.startswith("|") and current[1:].split() else current
    if "systemd-coredump" in taker:
        return "replaced-by-systemd-coredump", current, wanted
    if "apport" in taker:
        return "replaced-by-apport", current, wanted
    return "replaced", current, wanted


def analysis_failure_reasons() -> tuple[str, ...]:
    return ANALYSIS_FAILURES


class ServeConfig:
    def __init__(self, *, core_dir: str, node: str, metrics_port: int = 9847, metrics_address: str = "127.0.0.1",
                 analysis_timeout: float = 300.0, analysis_memory: int = 1 << 30, poll: float = 1.0,
                 max_series: int = 500, events: bool = True, kube=None, analyze_argv: list[str] | None = None,
                 max_attempts: int = 2, upload=None, version: str = "unknown", reclaim_pattern: bool = False,
                 proc: str = "/proc", analysis_output: int = MAX_ANALYSIS_OUTPUT,
                 sandbox_uid: int | None = SANDBOX_UID, scratch: str | None = None) -> None:
        self.core_dir = os.path.abspath(core_dir)
        self.node = node
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        self.analysis_timeout = analysis_timeout
        self.analysis_memory = analysis_memory
        self.analysis_output = analysis_output  # bytes an analysis may print (its temporary file on disk)
        self.poll = poll
        self.max_series = max_series
        self.events = events
        self.kube = kube  # capture.kube.KubeOptions; None: no API calls
        self.analyze_argv = analyze_argv or [sys.executable, "-m", "forensics", "analyze", "--json"]
        self.max_attempts = max_attempts
        self.upload = upload  # shipper.UploadConfig: each bundle into a bucket once analyzed; None: none
        self.version = version  # forensics_build_info's
        self.reclaim_pattern = reclaim_pattern  # write the handler's pattern back when another program took it
        self.proc = proc  # where kernel.core_pattern is read (and, with reclaim_pattern, written)
        # each analysis runs in the sandbox as this uid and gid (forensics.sandbox); None: as the agent (only a test's
        # stand-in analyzer, which writes its marks where the sandbox may not)
        self.sandbox_uid = sandbox_uid
        self.scratch = scratch or cache_path()  # the analyses' scratch directories are made beneath it


def _lowest_priority(memory: int):
    def setup() -> None:  # (in a session of its own already: run_bounded's)
        # the lowest priorities are a courtesy to the node's workloads: the analysis runs without them too
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with contextlib.suppress(OSError):
            os.nice(19)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).syscall(_IOPRIO_SET, 1, 0, _IOPRIO_CLASS_IDLE << 13)
        except (OSError, AttributeError):  # as above
            pass
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an analysis that crashes must not feed the handler
    return setup


def _write_atomic_json(path: str, doc: dict) -> None:
    from ..bundle.write import write_atomic

    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, (json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n").encode(), mode=0o640)


def _write_analysis(path: str, doc: dict) -> None:
    """Write the analysis within what the index reads back (:data:`~.nodeindex.MAX_READ`): a larger one was read
    as none, so the crash stayed pending, was analyzed again, and ended "interrupted" with no fingerprint."""
    from ..bundle.write import write_atomic

    data, cut = fit_document(doc, MAX_READ)
    if cut:
        print(f"forensics agent serve: {path}: the analysis cut to fit {MAX_READ >> 20} MiB ({cut})", file=sys.stderr)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, data, mode=0o640)


#: what the index reads of an analysis and never cut: the fingerprint, the signature, the crash, libnvidia-ml
_KEEP = (("analysis", "fingerprint"), ("analysis", "signature"), ("analysis", "crash"),
         ("analysis", "snapshot", "core", "nvml"), ("schema_version",), ("command",), ("agent",))


def fit_document(doc: dict, limit: int) -> tuple[bytes, str]:
    """``doc`` as JSON of at most ``limit`` bytes, and what was cut to fit (empty: nothing).

    Past the limit, strings and lists are cut shorter and shorter (everything but :data:`_KEEP`), the cut said
    in ``doc["agent"]["cut"]``; if even that does not fit, only :data:`_KEEP` is left.

    >>> data, cut = fit_document({"analysis": {"fingerprint": "ab", "threads": ["x" * 100] * 100}}, 4000)
    >>> len(data) <= 4000, json.loads(data)["analysis"]["fingerprint"], cut
    (True, 'ab', '11,071 bytes: strings cut at 64 characters, lists and objects at 8 items')
    """
    def dump(d: object) -> bytes:
        return (json.dumps(d, indent=2, sort_keys=True, default=str) + "\n").encode()

    data = dump(doc)
    if len(data) <= limit:
        return data, ""
    size = len(data)
    for longest, most in ((4096, 4096), (1024, 512), (256, 64), (64, 8), (16, 2)):
        cut = f"{size:,} bytes: strings cut at {longest} characters, lists and objects at {most} items"
        small = _shrink(doc, longest, most, ())
        small.setdefault("agent", {})["cut"] = cut
        data = dump(small)
        if len(data) <= limit:
            return data, cut
    cut = f"{size:,} bytes: only the fingerprint, signature, crash and libnvidia-ml kept"
    kept: dict = {}
    for path in _KEEP:
        src: object = doc
        for k in path:
            src = src.get(k) if isinstance(src, dict) else None
        if src is not None:
            dst = kept
            for k in path[:-1]:
                dst = dst.setdefault(k, {})
            dst[path[-1]] = _shrink(src, 4096, 64, ()) if path[-1] != "fingerprint" else src
    kept.setdefault("agent", {})["cut"] = cut
    return dump(kept)[:limit], cut


def _shrink(v: Any, longest: int, most: int, at: tuple) -> Any:
    if at in _KEEP:
        return v
    if isinstance(v, str):
        return v if len(v) <= longest else v[:longest] + f"...[{len(v) - longest} more characters cut]"
    if isinstance(v, list):
        return [_shrink(x, longest, most, (*at, "[]")) for x in v[:most]]
    if isinstance(v, dict):
        return {k: _shrink(x, longest, most, (*at, k)) for k, x in list(v.items())[:most]}
    return v


def analyze_crash(crash_dir: str, cfg: ServeConfig) -> str:
    """Analyze one crash bundle in a bounded, lowest-priority child; write the result into the bundle.

    :return: "done", a failure reason, or :data:`NOT_STARTED` (the analysis could not be started for want of a
        process, memory or a descriptor: not counted as an attempt, tried again later)
    """
    adir = os.path.join(crash_dir, layout.ANALYSIS_DIR)
    os.makedirs(adir, exist_ok=True)
    started = os.path.join(crash_dir, layout.ANALYSIS_ATTEMPTS)
    attempts = short = 0
    try:
        with open(started) as f:
            record = json.load(f)
        attempts, short = int(record.get("attempts", 0)), int(record.get("short_of_resources", 0))
    except (OSError, ValueError, AttributeError, TypeError):  # none yet (or cut by a full disk): counted from 0
        pass
    if attempts >= cfg.max_attempts:  # the agent died (or was killed) during each earlier attempt
        _write_atomic_json(os.path.join(crash_dir, layout.ANALYSIS_FAILED), {
            "reason": "interrupted", "detail": f"{attempts} earlier analyses never finished", "time": time.time()})
        return "interrupted"
    out_path = os.path.join(adir, f".analysis.{os.getpid()}.tmp")
    try:
        out = open(out_path, "wb")  # noqa: SIM115 - closed by the with below, opened first: EMFILE is no attempt
    except OSError as e:
        if e.errno in _TRANSIENT:
            return NOT_STARTED
        raise
    _write_atomic_json(started, {"attempts": attempts + 1, "last_start": time.time()})
    t0 = time.monotonic()
    with out:
        try:
            p, reason, detail = _run_child(crash_dir, cfg, out)
        except OSError as e:  # no process, memory or descriptor now (a pids limit): not this crash's fault
            _write_atomic_json(started, {"attempts": attempts, "last_start": time.time(),
                                         "not_started": f"{e.strerror or e}"})
            with contextlib.suppress(OSError):
                os.unlink(out_path)
            return NOT_STARTED
    if reason == "resources" and short + 1 < MAX_SHORT:  # the pod's limit, not this crash: no attempt spent
        _write_atomic_json(started, {"attempts": attempts, "last_start": time.time(),
                                     "not_started": f"resources: {detail}", "short_of_resources": short + 1})
        with contextlib.suppress(OSError):
            os.unlink(out_path)
        return NOT_STARTED
    if reason == "resources":
        detail = f"{MAX_SHORT} analyses in a row could not make a thread or process (a pids limit?): {detail}"
    try:
        if reason is None and p is not None:
            with open(out_path, "rb") as f:
                data = f.read(cfg.analysis_output + 1)
            if len(data) > cfg.analysis_output:
                raise ValueError(f"more than {cfg.analysis_output:,} bytes")
            doc = json.loads(data)
            del data
            doc["agent"] = {"seconds": round(time.monotonic() - t0, 3), "exit_status": p.returncode,
                            "analyzed_at": time.time(), "node": cfg.node, "sandbox": _sandbox_facts(cfg)}
            doc = redact_document(doc)  # whichever analysis wrote it: the bundle leaves the node (capture --pod)
            _write_analysis(os.path.join(crash_dir, layout.ANALYSIS), doc)
            return "done"
    except (OSError, ValueError) as e:
        reason, detail = "error", f"the analysis wrote no JSON document: {e}"
    finally:
        with contextlib.suppress(OSError):  # our temporary output: absent when the analysis never started
            os.unlink(out_path)
    _write_atomic_json(os.path.join(crash_dir, layout.ANALYSIS_FAILED),
                       {"reason": reason, "detail": detail, "time": time.time()})
    return reason or "error"


def _run_child(crash_dir: str, cfg: ServeConfig, out) -> tuple[subprocess.CompletedProcess | None, str | None,
                                                                  str | None]:
    """Run the analysis child, in its sandbox, its standard output into ``out``: (its result, the failure reason and
    detail, or None, None).

    :raises OSError: it could not be started for want of a process, memory or a descriptor (:data:`_TRANSIENT`)
    """
    argv = [*cfg.analyze_argv, crash_dir]
    uid = cfg.sandbox_uid
    if uid is None:
        return _run_bounded_child(argv, None, cfg, out)
    from .sandboxed import analysis_argv, analysis_env, grant_read, remove_scratch, scratch_root

    try:
        grant_read(crash_dir, cfg.core_dir, uid)
        scratch = os.path.join(scratch_root(cfg.scratch), f"{os.path.basename(crash_dir)}.{time.time_ns()}")
    except OSError as e:
        return None, "error", f"cannot prepare the analysis' sandbox: {e.strerror or e}"
    env, fetcher = analysis_env(scratch), None
    try:
        if os.environ.get("DEBUGINFOD_URLS"):  # fetched beside the analysis, which has no network
            from .sandboxed import Fetcher

            fetcher = Fetcher(uid=uid, root=os.path.dirname(scratch))
            env[fetcher.env_name] = str(fetcher.fd)
        return _run_bounded_child(analysis_argv(argv, uid=uid, scratch=scratch), env, cfg, out,
                                  pass_fds=(fetcher.fd,) if fetcher is not None else ())
    finally:
        if fetcher is not None:
            fetcher.close()
        remove_scratch(scratch, uid=uid)


def _run_bounded_child(argv: list[str], env: dict[str, str] | None, cfg: ServeConfig, out,
                       pass_fds: tuple[int, ...] = ()):
    try:  # its own session (a timeout kills gdb too), the stderr's tail kept, bounded in time and output
        p = run_bounded(argv, timeout=cfg.analysis_timeout, stdout=out, env=env,
                        max_stdout=cfg.analysis_output, max_stderr=2000,
                        preexec_fn=_lowest_priority(cfg.analysis_memory), pass_fds=pass_fds)
    except subprocess.TimeoutExpired:
        return None, "timeout", f"killed after {cfg.analysis_timeout:g}s"
    except OSError as e:
        if e.errno in _TRANSIENT:
            raise
        return None, "error", f"cannot start the analysis: {e}"
    except OutputTooLarge as e:  # its temporary file bounded on disk: cut there, the child killed
        return None, "error", f"{e}: past --analysis-output-max"
    except subprocess.SubprocessError as e:
        return None, "error", f"cannot start the analysis: {e}"
    if p.returncode not in (0, 3, 4):
        return p, *_child_failure(p.returncode, p.stderr)
    return p, None, None


def _sandbox_facts(cfg: ServeConfig) -> dict | None:
    """What confined the analysis (``agent.sandbox`` of the analysis written), None when nothing did."""
    if cfg.sandbox_uid is None:
        return None
    from ..sandbox import landlock_abi

    return {"uid": cfg.sandbox_uid, "gid": cfg.sandbox_uid, "no_new_privs": True, "seccomp": "filter",
            "landlock_abi": landlock_abi()}


def _child_failure(status: int, stderr: str) -> tuple[str, str]:
    """The reason and detail of an analysis child that exited ``status`` (not 0, 3 or 4) having printed
    ``stderr``: ``resources`` when it could not make a thread or process, ``memory``, else ``error``."""
    detail = f"exit status {status}: {stderr.strip().splitlines()[-1] if stderr.strip() else ''}"
    if any(sign in stderr for sign in _SHORT_SIGNS):
        return "resources", detail
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory", detail
    return "error", detail


class IndexCollector:
    """prometheus_client collector: every value from the latest :class:`NodeIndex`."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        idx, cfg = self.agent.index, self.agent.cfg
        node = cfg.node
        labels = [NODE_LABEL, "fingerprint", "previous_fingerprint", "crash_class", "signal", "namespace", "pod",
                  "container", "image_digest"]
        crashes = CounterMetricFamily("forensics_crashes", "Native crashes on this node, by fingerprint (forensics "
                                      "analyze's; previous_fingerprint: the previous definition's key) and where "
                                      "they happened; from the crash bundles", labels=labels)
        sent = CounterMetricFamily("forensics_signals_sent", "Processes that ended with a core on a signal another "
                                   "process sent them (kill(2), tgkill(2), sigqueue(3)): kills, not crashes",
                                   labels=[NODE_LABEL, "signal", "sender_uid", "namespace", "pod", "container",
                                           "image_digest"])
        series: dict[tuple[str, ...], int] = {}
        sent_series: dict[tuple[str, ...], int] = {}
        key: tuple[str, ...]
        for c in idx.crashes:
            where = (c.namespace or "", c.pod or "", c.container or "", c.image_digest or "")
            if c.is_sent:
                key = (node, c.signal_name or "unknown", "" if c.sender_uid is None else str(c.sender_uid), *where)
                if key not in sent_series and len(sent_series) >= cfg.max_series:
                    key = (node, *["_other"] * 6)
                sent_series[key] = sent_series.get(key, 0) + 1
                continue
            key = (node, c.fingerprint or "unknown", c.previous_fingerprint or "", c.crash_class or "unknown",
                   c.signal_name or "unknown", *where)
            if key not in series and len(series) >= cfg.max_series:
                key = (node, *["_other"] * 8)
            series[key] = series.get(key, 0) + 1
        for key, n in sorted(series.items()):
            crashes.add_metric(list(key), n)
        yield crashes
        for key, n in sorted(sent_series.items()):
            sent.add_metric(list(key), n)
        yield sent
        yield _latest_bundles(node, idx, cfg.max_series)
        failures = CounterMetricFamily("forensics_analysis_failures", "On-node analyses that failed, by reason",
                                       labels=[NODE_LABEL, "reason"])
        counts = {r: 0 for r in ANALYSIS_FAILURES}
        for c in idx.crashes:
            if c.analysis == "failed":
                counts[c.analysis_failure if c.analysis_failure in counts else "error"] += 1
        for r, n in counts.items():
            failures.add_metric([node, r], n)
        yield failures
        not_kept = CounterMetricFamily("forensics_cores_not_kept", "Crashes whose core the handler did not keep "
                                       "whole, by reason (budget, loop limit, full disk...)",
                                       labels=[NODE_LABEL, "reason"])
        nk = {r: 0 for r in NOT_KEPT_REASONS}
        for c in idx.crashes:
            for r in c.not_kept:
                nk[r] += 1
        for r, n in nk.items():
            not_kept.add_metric([node, r], n)
        yield not_kept
        pending = GaugeMetricFamily("forensics_analyses_pending", "Crashes waiting for their on-node analysis",
                                    labels=[NODE_LABEL])
        pending.add_metric([node], sum(1 for c in idx.crashes if c.analysis == "pending"))
        yield pending
        stored = GaugeMetricFamily("forensics_stored_bytes", "Bytes the core directory holds",
                                   labels=[NODE_LABEL, "kind"])
        for kind, n in self.agent.stored.items():
            stored.add_metric([node, kind], n)
        yield stored
        # the build running, as Prometheus' own and the exporters' *_build_info: 1, the facts in its labels
        build = GaugeMetricFamily("forensics_build_info", "The forensics agent's version and Python (always 1)",
                                  labels=["version", "python"])
        build.add_metric([self.agent.cfg.version, platform.python_version()], 1)
        yield build
        # kernel.core_pattern read each round: 1 while it is the handler's and its program is there, else 0 and why
        handler = GaugeMetricFamily("forensics_handler_installed", "1 while kernel.core_pattern is the forensics "
                                    "handler's and its program exists; 0 and the reason otherwise",
                                    labels=[NODE_LABEL, "reason"])
        handler.add_metric([node, self.agent.handler_reason], 1 if self.agent.handler_reason == "installed" else 0)
        yield handler
        if self.agent.shipper is not None:
            yield from _upload_families(node, self.agent.shipper.stats)


def _latest_bundles(node: str, idx, max_series: int):
    """Where the newest bundle of each fingerprint lives (its bucket URL once uploaded, else NODE:PATH), valued
    with when it crashed: ``fleet --prometheus`` names the fleet's newest one per fingerprint from it."""
    from prometheus_client.core import GaugeMetricFamily

    latest: dict[str, tuple[float, str]] = {}
    for c in idx.crashes:  # oldest first
        fp = c.fingerprint or "unknown"
        if fp in latest or len(latest) < max_series:
            latest[fp] = (c.time, c.uploaded_to or f"{node}:{c.path}")
    m = GaugeMetricFamily("forensics_latest_bundle_timestamp_seconds", "When the newest crash of each fingerprint on "
                          "this node happened; bundle: where its bundle lives (s3:// URL once uploaded, else "
                          "NODE:PATH)", labels=[NODE_LABEL, "fingerprint", "bundle"])
    for fp, (t, where) in sorted(latest.items()):
        m.add_metric([node, fp, where], t)
    return m


def _upload_families(node: str, s):
    """agent serve --upload's families (shipper.UploadStats): uploads and their bytes counted from the crashes'
    directories, failed attempts since the agent started, the crashes waiting and the oldest one's age."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for family, help_text, value in (
            (CounterMetricFamily, ("forensics_uploads", "Crash bundles uploaded to the bucket and verified"),
             s.uploaded),
            (CounterMetricFamily, ("forensics_uploaded_bytes", "Bytes of the crash bundles uploaded"),
             s.uploaded_bytes),
            (CounterMetricFamily, ("forensics_upload_failures", "Upload attempts that failed since the agent started"),
             s.failures),
            (GaugeMetricFamily, ("forensics_uploads_pending", "Crashes whose bundle is not uploaded yet"), s.pending),
            (GaugeMetricFamily, ("forensics_uploads_pending_bytes",
                                 "Bytes on the node's disk of the crashes whose bundle is not uploaded yet"),
             s.pending_bytes),
            (GaugeMetricFamily, ("forensics_upload_oldest_pending_seconds",
                                 "Age of the oldest crash whose bundle is not uploaded yet"),
             s.oldest_pending_seconds)):
        m = family(*help_text, labels=[NODE_LABEL])
        m.add_metric([node], value)
        yield m
    dropped = CounterMetricFamily("forensics_uploads_dropped", "Crash bundles whose upload was given up, by reason "
                                  "(queue-count, queue-bytes: the queue waiting for the bucket over its bounds; "
                                  "conflict: other bytes in the bucket at the key of a captured file; attempts: "
                                  "--upload-max-attempts failed)", labels=[NODE_LABEL, "reason"])
    for reason, n in s.dropped:
        dropped.add_metric([node, reason], n)
    yield dropped


class Agent:
    """The watch loop: index, analyze the next pending crash, resolve pods, publish."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.reader = IndexReader(cfg.core_dir)
        self.index = self.reader.index
        self.stored = {"cores": 0, "objects": 0}
        self.stored_at = -math.inf
        self.pods: dict[str, dict] = {}  # pod uid -> {"namespace", "name", "containers": {id: (name, digest)}}
        self.pods_read = 0.0
        self.events = EventSink(cfg.kube, cfg.node) if cfg.events and cfg.kube is not None else None
        self.stopping = threading.Event()
        self.beat = time.monotonic()  # when the loop last began a round (health)
        self.handler_reason = handler_state(cfg.core_dir, cfg.proc)[0]  # forensics_handler_installed's
        if cfg.sandbox_uid is not None:
            from .sandboxed import join_group, unreachable, unreachable_installation

            join_group(cfg.sandbox_uid)  # to give each crash's bundle to the sandbox's group (no CAP_CHOWN needed)
            searchable = "make it searchable: chmod o+x"
            blocks = [(what, path, unreachable(path, cfg.sandbox_uid), searchable)
                      for what, path in (("the core directory", cfg.core_dir), ("the scratch directory", cfg.scratch))]
            if (found := unreachable_installation(cfg.sandbox_uid)) is not None:  # the interpreter it runs, its code
                blocks.append(("this installation (the analyses' interpreter, its code)", found[1], found[0],
                               f"{searchable}, or install forensics where every uid may read it: the agent image's "
                               "/opt/forensics"))
            for what, path, blocked, fix in blocks:
                if blocked is not None:
                    print(f"forensics agent serve: the analyses' uid {cfg.sandbox_uid} cannot search {blocked}, on the "
                          f"way to {what} {path}: every analysis will fail ({fix})",
                          file=sys.stderr)
        self.shipper = None
        if cfg.upload is not None:
            from .shipper import Shipper

            self.shipper = Shipper(cfg.upload, cfg.node)

    def refresh(self) -> None:
        """Read the bundles that changed; publish (agent-index.json, Events) when the index did. The bytes stored
        are counted again then, and every :data:`STORED_EVERY` seconds (a walk of every file)."""
        changed = self.reader.refresh()
        self.index = self.reader.index
        if changed or time.monotonic() - self.stored_at > STORED_EVERY:
            from ..capture.store import disk_usage

            crashes = disk_usage(os.path.join(self.cfg.core_dir, layout.CRASHES))
            self.stored = {"cores": crashes, "objects": disk_usage(os.path.join(self.cfg.core_dir, layout.OBJECTS))}
            self.stored_at = time.monotonic()
        if not changed:
            return
        # derived data, rewritten when the index changes, for people reading the node: the records hold the facts
        with contextlib.suppress(OSError):
            _write_atomic_json(os.path.join(self.cfg.core_dir, layout.AGENT_INDEX),
                               {"node": self.cfg.node, "written_at": time.time(), **self.index.as_document()})
        if self.events is not None:
            self.events.offer(self.index)

    def _resolve_pods(self) -> None:
        """Name the pods of crashes that only have a pod UID, from the API (pods on this node), once each."""
        if self.cfg.kube is None:
            return
        unnamed = [c for c in self.index.crashes if c.pod_uid and not c.pod]
        if not unnamed:
            return
        if any(c.pod_uid not in self.pods for c in unnamed) and time.monotonic() - self.pods_read > 10:
            self.pods_read = time.monotonic()
            try:
                from ..kubectl import get_json as _get_json

                doc = _get_json(self.cfg.kube, "list pods", ["get", "pods", "--all-namespaces", "--field-selector",
                                                             f"spec.nodeName={self.cfg.node}"], namespaced=False)
                for p in doc.get("items") or []:
                    meta, status = p.get("metadata") or {}, p.get("status") or {}
                    conts = {}
                    for cs in status.get("containerStatuses") or []:
                        cid = str(cs.get("containerID") or "").split("://")[-1]
                        conts[cid] = (cs.get("name"), str(cs.get("imageID") or "").split("://")[-1])
                    self.pods[str(meta.get("uid"))] = {"namespace": meta.get("namespace"), "name": meta.get("name"),
                                                       "containers": conts,
                                                       "first": next(iter(conts.values()), (None, None))}
            except Exception:  # noqa: BLE001 - no API (no RBAC, no network): crashes keep their pod UID only
                return
        for c in unnamed:
            p = self.pods.get(c.pod_uid or "") or self.pods.get(str(c.pod_uid).replace("_", "-"))
            if p is None:
                continue
            name, digest = p["containers"].get(c.container_id or "", (None, None))
            if name is None:  # an earlier container of the pod: the container name of the pod's first container
                name, digest = p["first"]
            self.reader.touch(c.path)
            with contextlib.suppress(OSError):  # the crash stays unnamed in the index until a later round writes it
                _write_atomic_json(os.path.join(c.path, layout.ANALYSIS_POD), {
                    "namespace": p["namespace"], "name": p["name"], "container": name, "image_digest": digest,
                    "resolved_at": time.time()})

    def watch_pattern(self) -> None:
        """Read kernel.core_pattern: the gauge's reason; a node Event when another program took it (once per
        taking); with ``reclaim_pattern``, the handler's pattern written back."""
        reason, current, wanted = handler_state(self.cfg.core_dir, self.cfg.proc)
        before, self.handler_reason = self.handler_reason, reason
        if not reason.startswith("replaced") or wanted is None:
            return
        action = "Observed"
        if self.cfg.reclaim_pattern:
            try:
                with open(os.path.join(self.cfg.proc, "sys/kernel/core_pattern"), "w") as f:
                    f.write(wanted)
                action = "Reclaimed"
            except OSError as e:  # not root, /proc/sys read-only (not privileged): said, the gauge stays 0
                print(f"forensics agent serve: cannot take kernel.core_pattern back: {e.strerror or e}",
                      file=sys.stderr)
        if before != reason:
            what = " and took it back" if action == "Reclaimed" else ""
            print(f"forensics agent serve: kernel.core_pattern was taken ({reason}): {current!r}{what}",
                  file=sys.stderr)
            if self.events is not None:
                self.events.offer_node_event("CorePatternReplaced", action, f"kernel.core_pattern was taken "
                                             f"({reason}): {current!r}; the forensics handler's is {wanted!r}" +
                                             ("; written back (--reclaim-pattern)" if action == "Reclaimed" else
                                              "; crashes are no longer captured by forensics on this node"))

    def step(self) -> bool:
        """One round: the pattern, re-index, name pods, analyze the oldest pending crash. True when work was done."""
        self.watch_pattern()
        self.refresh()
        self._resolve_pods()
        pending = [c for c in self.index.crashes if c.analysis == "pending" and not c.in_progress]
        if not pending:  # the analyses first; then, with --upload, one bundle into the bucket
            if self.shipper is None:
                return False
            shipped = self.shipper.ship_next(self.index)
            for path in self.shipper.changed:  # read again: the index names where its bundle went
                self.reader.touch(path)
            self.shipper.changed.clear()
            return shipped
        self.reader.touch(pending[0].path)
        return analyze_crash(pending[0].path, self.cfg) != NOT_STARTED  # not started: after a pause

    def health(self) -> str | None:
        """Why the agent is not well (/healthz answers 503 with it), or None: its loop has not come round within
        an analysis' time limit and a minute (a round analyzes at most one crash)."""
        late = time.monotonic() - self.beat - (self.cfg.analysis_timeout + 60.0 + self.cfg.poll)
        return f"the agent's loop has not come round for {late:.0f} s past its limit" if late > 0 else None

    def run(self) -> None:
        if self.events is not None:
            self.events.start()
        while not self.stopping.is_set():
            self.beat = time.monotonic()
            try:
                worked = self.step()
            except Exception as e:  # noqa: BLE001 - a round that failed (no thread, no descriptor): the next retries
                print(f"forensics agent serve: {type(e).__name__}: {e}", file=sys.stderr)
                worked = False
            if not worked:
                self.stopping.wait(self.cfg.poll)
        self.refresh()
        if self.events is not None:
            self.events.flush()


def serve(cfg: ServeConfig) -> None:
    """Run the agent until SIGTERM / SIGINT, serving metrics on ``metrics_address:metrics_port``."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    from .metricsserver import MetricsServer

    _check_core_dir(cfg.core_dir)
    # the agent's own work (reading bundles, serving scrapes) also yields to the handler the kernel waits on (a
    # courtesy: it runs without)
    with contextlib.suppress(OSError):
        os.nice(10)
    agent = Agent(cfg)
    registry = CollectorRegistry()  # only the index's families: no process / platform collectors
    registry.register(IndexCollector(agent))
    agent.refresh()
    if cfg.metrics_port:  # its threads made now, once: a flood of connections makes no more (metricsserver)
        MetricsServer(cfg.metrics_address, cfg.metrics_port, lambda: generate_latest(registry),
                      content_type=CONTENT_TYPE_LATEST, health=agent.health).start()

    interrupted = threading.Event()

    def stop(signum, frame):
        if signum == signal.SIGINT:
            interrupted.set()
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()
    if interrupted.is_set():  # Ctrl-C: stopped as for SIGTERM, then the exit status of an interrupted command (130)
        raise KeyboardInterrupt


def _check_core_dir(core_dir: str) -> None:
    """Refuse a core directory that is not there (a typo watched forever reads as a node that never crashes).

    :raises CoreDirectoryError: when ``core_dir`` is missing, not a directory, or may not be read
    """
    from ..errors import CoreDirectoryError

    try:
        st = os.stat(core_dir)
    except FileNotFoundError:
        e = CoreDirectoryError(core_dir, "no such directory")
        e.help_text = ("Check --core-dir: it is the core handler's directory, made by forensics capture "
                       "--install-handler --core-dir DIR (the agent's DaemonSet mounts it from the node)")
        raise e from None
    except OSError as err:
        raise CoreDirectoryError(core_dir, err.strerror or str(err)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CoreDirectoryError(core_dir, "not a directory")
    if not os.access(core_dir, os.R_OK | os.X_OK):
        raise CoreDirectoryError(core_dir, "permission denied")
