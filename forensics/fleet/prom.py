"""``forensics fleet --prometheus URL``: the fleet table from PromQL over kube-state-metrics and the agents' crashes.

The same :class:`~forensics.fleet.model.FleetSummary` as ``fleet --from`` (groups by node labels, pods,
restarting pods, restarts, exit codes, CrashLoopBackOff, images, the boundary), built from
instant queries that aggregate in Prometheus (``count_values`` / ``count by`` / ``sum by`` over the
group labels), so what travels grows with the number of groups (times the distinct restart counts of
one group's pods, for the restarts' histogram), never with the number of pods. One round: the table's
queries and the nodes' chain (node label names, their number of values, then one query) at once.

- pods and their nodes: ``kube_pod_info`` (``namespace``, ``pod``, ``node``); ``-l`` selects on
  ``kube_pod_labels`` (``label_KEY``, which kube-state-metrics exports for allow-listed labels), Kubernetes'
  selector syntax translated exactly (:func:`selector_matchers`);
- node groups: ``kube_node_labels`` (``label_nvidia_com_gpu_product``...; kube-state-metrics
  exports node labels only when allow-listed: ``--metric-labels-allowlist=nodes=[nvidia.com/gpu.product,...]``);
  the group key is made here from them by ``fleet --from``'s rule (:func:`forensics.fleet.model.group_key`: the
  driver version from GPU feature discovery's major/minor/rev when the full one is absent, the instance type
  when the GPU labels are); a pod on no node (``node=""``: unscheduled) or on a node without a ``kube_node_labels``
  series is in the group "(no labels)", as ``fleet --from`` counts it;
- restarts: ``kube_pod_container_status_restarts_total`` (its value, or ``increase`` over ``--window``);
- last exit codes and reasons: ``kube_pod_container_status_last_terminated_exitcode`` (kube-state-metrics
  2.10+) and ``..._last_terminated_reason``; CrashLoopBackOff: ``kube_pod_container_status_waiting_reason``;
- images: ``kube_pod_container_info`` (``image_id``);
- crashes by fingerprint: the agents' ``forensics_crashes_total`` (``forensics_node``, ``fingerprint``), joined
  to the node groups on ``node`` (kube-state-metrics' name): ``forensics_node`` copied into ``node``
  (:func:`agent_node`); a series of an agent older than that label, which exported ``node`` itself, joins as it is.

Authentication as Prometheus clients take it: a bearer token file, basic auth, a CA file.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import http.client
import json
import math
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import PrometheusError, SelectorError
from .model import (BOUNDARY_SKIP, DEFAULT_GROUP_LABELS, DRIVER_PARTS, FALLBACK_LABELS, MAX_BOUNDARY_VALUES,
                         FleetGroup, FleetSummary, boundary_lines, finish_summary, group_key, key_labels)

__all__ = ["PromAuth", "PromClient", "prom_label", "parse_window",
           "selector_matchers", "summarize_fleet_prometheus", "DEFAULT_DEADLINE", "MAX_ANSWERS", "AGENT_NODE",
           "agent_node"]

MAX_ANSWERS = 32 << 20  # all the answers of one run together (a 10,000-node fleet's are ~1 MiB)
DEFAULT_DEADLINE = 60.0  # seconds for all the requests of one run (a 10,000-node fleet's take ~2 s)
MAX_REDIRECTS = 5
LATEST_BUNDLE = "forensics_latest_bundle_timestamp_seconds"  # agent serve's: where each fingerprint's bundle is
_FIGURE, _VALUE = "forensics_figure", "forensics_value"  # labels of the per-pod counts
AGENT_NODE = "forensics_node"  # agent serve's NODE_LABEL: the agent's node on its series


def agent_node(expr: str) -> str:
    """``expr`` (the agents' series) with ``node`` set from the agent's own ``forensics_node`` where it has one, to
    join kube-state-metrics' series on ``node``. A series without it (an agent from before the label was renamed,
    which exported ``node``) keeps its ``node``: old and new agents join alike during a rollout.

    >>> agent_node("forensics_crashes_total")
    'label_replace(forensics_crashes_total, "node", "$1", "forensics_node", "(.+)")'
    """
    return f'label_replace({expr}, "node", "$1", "{AGENT_NODE}", "(.+)")'






def prom_label(label: str) -> str:
    """kube-state-metrics' name for a Kubernetes label (``label_`` + the name with every other character ``_``).

    >>> prom_label("nvidia.com/gpu.product")
    'label_nvidia_com_gpu_product'
    """
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def parse_window(text: str) -> int:
    """Seconds of a Prometheus duration (``6h``, ``90m``, ``1d12h``).

    >>> parse_window("6h"), parse_window("1d12h"), parse_window("90s")
    (21600, 129600, 90)
    """
    m = re.fullmatch(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not text.strip() or not m:
        raise ValueError(f"{text!r} is not a duration like 6h, 90m, 1d12h")
    w, d, h, mi, s = (int(x or 0) for x in m.groups())
    total = (((w * 7 + d) * 24 + h) * 60 + mi) * 60 + s
    if total <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class PromAuth:
    bearer_token_file: str | None = None
    basic_auth: str | None = None  # USER:PASSWORD
    ca_file: str | None = None
    insecure: bool = False


class PromClient:
    """Instant queries against Prometheus' HTTP API (``/api/v1/query``), bounded in time and size.

    - time: ``timeout`` seconds per socket operation, and ``deadline`` seconds for all the client's requests
      together (a watchdog shuts a request's socket down when it passes: a server that drips its headers or its
      answer a byte at a time cannot hold the run past it);
    - size: ``max_bytes`` for all the client's answers together (the queries run in parallel and their answers
      are kept until the table is built), each answer parsed one at a time;
    - redirects: followed within the URL's origin (scheme, host, port), the request repeated as it was; one to
      another origin is refused, so that the credentials go nowhere else.
    """

    def __init__(self, url: str, auth: PromAuth = PromAuth(), *, timeout: float = 30.0,
                 deadline: float = DEFAULT_DEADLINE, max_bytes: int = MAX_ANSWERS) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise PrometheusError(url, "not an http:// or https:// URL")
        try:
            self.origin = _origin(url)
        except ValueError as e:
            raise PrometheusError(url, f"not a URL: {e}") from e
        self.base = url.rstrip("/")
        self.timeout = timeout
        self.deadline = deadline
        self._ends = time.monotonic() + deadline
        self._left = max_bytes
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # the byte budget's, and the open requests'
        self._open: set[Callable[[], None]] = set()  # each open request's wake-up (its watchdog's)
        self._aborted = False
        self._parsing = threading.Lock()  # answers are parsed one at a time
        self.headers = {"Accept": "application/json", "User-Agent": "forensics-fleet"}
        if auth.bearer_token_file:
            try:
                with open(auth.bearer_token_file) as f:
                    self.headers["Authorization"] = "Bearer " + f.read(65536).strip()
            except OSError as e:
                raise PrometheusError(auth.bearer_token_file, f"cannot read the bearer token: {e.strerror or e}") from e
        elif auth.basic_auth:
            self.headers["Authorization"] = "Basic " + base64.b64encode(auth.basic_auth.encode()).decode()
        self.ctx = None
        if u.scheme == "https":
            try:
                self.ctx = ssl.create_default_context(cafile=auth.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise PrometheusError(auth.ca_file or "CA", f"cannot load the CA file: {e}") from e
            if auth.insecure:
                self.ctx.check_hostname = False
                self.ctx.verify_mode = ssl.CERT_NONE
        self.queries = 0

    def _get(self, path: str, params: dict) -> Any:
        data = urllib.parse.urlencode(params, doseq=True).encode()
        url = self.base + path
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = self._post(url, path, data)
            if status not in (301, 302, 303, 307, 308) or location is None:
                break
            target = urllib.parse.urljoin(url, location)
            try:
                same = _origin(target) == self.origin
            except ValueError:
                same = False
            if not same:
                raise PrometheusError(path, f"redirected to another origin ({_shown_origin(target)}): not followed, "
                                            f"the credentials go only to {_shown_origin(self.base)}; give "
                                            "Prometheus' own URL")
            url = target
        else:
            raise PrometheusError(path, f"more than {MAX_REDIRECTS} redirects")
        if status >= 300 or status < 200:
            detail = body.decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):  # not Prometheus's JSON: the body is the detail
                detail = json.loads(detail).get("error") or detail
            raise PrometheusError(path, f"HTTP {status}: {str(detail).strip()[:300]}")
        with self._parsing:
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise PrometheusError(path, "the answer is not JSON (is this Prometheus' URL?)") from e
            finally:
                del body
        if not isinstance(doc, dict) or "status" not in doc:
            raise PrometheusError(path, "the answer is not a Prometheus API response (is this Prometheus' URL?)")
        if doc.get("status") != "success":
            raise PrometheusError(path, f"{str(doc.get('errorType'))[:100]}: {str(doc.get('error'))[:300]}")
        if "data" not in doc:
            raise PrometheusError(path, "a successful answer without data")
        self.queries += 1
        return doc["data"]

    def _post(self, url: str, path: str, data: bytes) -> tuple[int, str | None, bytes]:
        """(status, Location, body) of one POST of ``data`` to ``url``: an error body read up to 4 KiB, a success's
        whole within the byte budget, all of it before the deadline."""
        u = urllib.parse.urlsplit(url)
        remaining = self._ends - time.monotonic()
        if remaining <= 0 or self._aborted:
            raise self._late(path)
        conn: http.client.HTTPConnection
        if u.scheme == "https":
            conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=min(self.timeout, remaining),
                                               context=self.ctx)
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=min(self.timeout, remaining))
        expired = threading.Event()
        sockets: list[socket.socket] = []  # the connection's (it forgets it once an answer says it ends at close)

        def expire() -> None:  # wakes a read blocked on a server that drips
            expired.set()
            for sock in sockets or [s for s in (conn.sock,) if s is not None]:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(remaining, expire)
        watchdog.daemon = True
        watchdog.start()
        with self._lock:
            self._open.add(expire)
        try:
            conn.connect()
            sockets.append(conn.sock)
            conn.request("POST", (u.path or "/") + (f"?{u.query}" if u.query else ""), body=data, headers={
                **self.headers, "Content-Type": "application/x-www-form-urlencoded"})
            r = conn.getresponse()
            if not 200 <= r.status < 300:
                return r.status, r.getheader("Location"), r.read(4096)
            return r.status, None, self._read_body(r, path)
        except (OSError, http.client.HTTPException) as e:
            if expired.is_set():
                raise self._late(path) from e
            raise PrometheusError(self.base, f"cannot reach it: {getattr(e, 'strerror', None) or e!r}") from e
        finally:
            watchdog.cancel()
            with self._lock:
                self._open.discard(expire)
            conn.close()
            if expired.is_set():
                raise self._late(path)

    def abort(self) -> None:
        """End every request at once (Ctrl-C, SIGTERM): each open one's socket shut down, as its watchdog does at
        the deadline, and no new one sent; the threads of :meth:`query_many` then end without waiting out their
        socket timeouts (``--deadline``'s and ``timeout``'s)."""
        with self._lock:
            self._aborted = True
            wakes = list(self._open)
        for wake in wakes:
            wake()

    def _read_body(self, r: http.client.HTTPResponse, path: str) -> bytes:
        """The answer's bytes, each piece taken from the budget of all answers before it is kept."""
        parts: list[bytes] = []
        declared = r.getheader("Content-Length") or ""
        if declared.isdigit() and int(declared) > self._left:
            raise PrometheusError(path, f"answers over {self.max_bytes >> 20} MiB in all")
        while True:
            chunk = r.read(1 << 20)
            if not chunk:
                return b"".join(parts)
            with self._lock:
                self._left -= len(chunk)
                over = self._left < 0
            if over:
                raise PrometheusError(path, f"answers over {self.max_bytes >> 20} MiB in all")
            parts.append(chunk)

    def _late(self, path: str) -> PrometheusError:
        return PrometheusError(path, f"no complete answer within {self.deadline:g} s (--deadline)")

    def query(self, expr: str, *, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of each series of an instant vector (a scalar answer is one series with no labels)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        # the answer is checked where it enters (a proxy, another server or a broken one may say anything)
        if not isinstance(data, dict):
            raise PrometheusError("/api/v1/query", "the query's data is not an object")
        result = data.get("result")
        if data.get("resultType") == "scalar":
            return [({}, _sample_value(expr, result))]
        if data.get("resultType") != "vector" or not isinstance(result, list):
            raise PrometheusError("/api/v1/query",
                                  f"expected an instant vector, got {str(data.get('resultType'))[:40]!r}")
        out = []
        for r in result:
            metric = r.get("metric") if isinstance(r, dict) else None
            if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in metric.items()):
                raise PrometheusError("/api/v1/query", "a series whose labels are not strings")
            out.append((metric, _sample_value(expr, r.get("value"))))
        return out

    def query_many(self, jobs: dict[str, str | Callable[[], Any]], *, at: float | None = None,
                   workers: int = 8) -> dict[str, Any]:
        """Several instant queries at once (Prometheus evaluates them in parallel); results by key.

        A job is a query, or a function run beside them (a chain of queries that depend on each other);
        the first error raised by any job is raised, once all have ended. Interrupted (Ctrl-C, SIGTERM), the
        requests in flight are aborted, so that the interruption ends the run at once and not after the slowest
        request's socket timeout.
        """
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(jobs)))) as pool:
            futures = {k: pool.submit(j) if callable(j) else pool.submit(self.query, j, at=at)
                       for k, j in jobs.items()}
            try:
                return {k: f.result() for k, f in futures.items()}
            except BaseException as e:
                if not isinstance(e, Exception):  # KeyboardInterrupt, errors.Terminated: not a job's error
                    self.abort()
                raise

    def label_names(self, match: str) -> list[str]:
        names: object = self._get("/api/v1/labels", {"match[]": match}) or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise PrometheusError("/api/v1/labels", "the label names are not a list of strings")
        return names


def _origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``: where a request may go with the credentials.

    >>> _origin("http://Prometheus:80/x"), _origin("https://[::1]/")
    (('http', 'prometheus', 80), ('https', '::1', 443))
    """
    u = urllib.parse.urlsplit(url)
    return u.scheme.lower(), (u.hostname or "").lower(), u.port or (443 if u.scheme.lower() == "https" else 80)


def _shown_origin(url: str) -> str:
    """``url``'s origin as text (its path and query, which may carry a token, left out), escaped."""
    try:
        scheme, host, port = _origin(url)
    except ValueError:
        return "an unreadable URL"
    return ascii(f"{scheme}://{host}:{port}")[1:-1][:200]


def _sample_value(expr: str, sample: object) -> float:
    """The value of a ``[time, "value"]`` sample; a clear error for anything else (every query here counts, sums
    or takes a maximum: NaN and infinities are not answers to them)."""
    if isinstance(sample, list) and len(sample) == 2 and isinstance(sample[1], str):
        try:
            value = float(sample[1])
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    raise PrometheusError("/api/v1/query", f"a sample that is not [time, \"finite value\"]: {json.dumps(sample)[:80]} "
                                           f"(for {expr[:80]})")


def _esc(v: str) -> str:
    r"""``v`` inside a PromQL double-quoted string (its backslashes, quotes and newlines escaped).

    >>> _esc('a"b\\c')
    'a\\"b\\\\c'
    """
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Kubernetes' label selector grammar (apimachinery labels.Parse): a qualified key, an optional value
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE_RE = re.compile(rf"(?:{_NAME})?")
_REQUIREMENT = re.compile(r"\s*(?P<not>!)?\s*(?P<key>[^\s!=<>(),]+)\s*"
                          r"(?:(?P<op>==|=|!=|<|>)\s*(?P<value>[^\s,()]*)|(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?\s*")


def selector_matchers(selector: str) -> list[tuple[str, str]]:
    r"""The label selector ``selector`` (``kubectl -l``'s syntax) as PromQL matchers on ``kube_pod_labels``:
    (label, matcher) pairs, each exact: ``=``/``==``, ``!=``, ``in``, ``notin``, ``key`` and ``!key``.

    Prometheus holds no empty label value (kube-state-metrics' ``label_app=""`` is no ``label_app``), so a
    requirement on an empty value, and ``<`` / ``>`` (numeric), cannot be asked exactly: a :class:`SelectorError`.
    ``key`` and ``!key`` treat a label with an empty value as absent, as Prometheus does.

    >>> selector_matchers("app=nvitop-exporter, tier!=db")
    [('label_app', '="nvitop-exporter"'), ('label_tier', '!="db"')]
    >>> selector_matchers("env in (prod, pre.prod),!canary")
    [('label_env', '=~"prod|pre\\\\.prod"'), ('label_canary', '=""')]
    """
    out: list[tuple[str, str]] = []
    pos = 0
    text = selector.strip()
    if not text:
        raise SelectorError(selector, "an empty selector")
    while True:
        m = _REQUIREMENT.match(text, pos)
        if not m or m.end() == pos:
            raise SelectorError(selector, f"cannot read it at {text[pos:pos + 40]!r}" if text[pos:].strip()
                                else "a requirement missing after the last comma")
        key, op, setop = m["key"], m["op"], m["set"]
        if not _KEY.fullmatch(key):
            raise SelectorError(selector, f"{key[:80]!r} is not a label key")
        label = prom_label(key)
        if m["not"] and (op or setop):
            raise SelectorError(selector, f"'!' goes only before a bare key (!{key})")
        if op in ("<", ">"):
            raise SelectorError(selector, f"{key}{op}{m['value']}: Prometheus cannot compare label values as "
                                          "numbers")
        if op:
            value = m["value"]
            if not value:
                raise SelectorError(selector, f"{key}{op}: an empty value is no label to Prometheus (it cannot "
                                              "tell it from a missing one)")
            if not _VALUE_RE.fullmatch(value):
                raise SelectorError(selector, f"{value[:80]!r} is not a label value")
            out.append((label, f'{"!=" if op == "!=" else "="}"{_esc(value)}"'))
        elif setop:
            values = [v.strip() for v in m["values"].split(",")]
            if not all(values):
                raise SelectorError(selector, f"{key} {setop} (...): an empty value is no label to Prometheus")
            bad = [v for v in values if not _VALUE_RE.fullmatch(v)]
            if bad:
                raise SelectorError(selector, f"{bad[0][:80]!r} is not a label value")
            regex = "|".join(v.replace(".", "\\.") for v in values)
            out.append((label, f'{"=~" if setop == "in" else "!~"}"{_esc(regex)}"'))
        else:
            out.append((label, '=""' if m["not"] else '!=""'))
        pos = m.end()
        if pos == len(text):
            return out
        if text[pos] != ",":
            raise SelectorError(selector, f"cannot read it at {text[pos:pos + 40]!r}")
        pos += 1


def summarize_fleet_prometheus(client: PromClient, *, group_by: tuple[str, ...] = DEFAULT_GROUP_LABELS,
                               namespace: str | None = None, selector: str | None = None, window: int | None = None,
                               now: _dt.datetime | None = None, baseline_label: str | None = None) -> FleetSummary:
    """The fleet table from Prometheus (see the module docstring).

    One round of queries, all at once: the per-pod figures counted by group in one query, the agents' crashes, the
    mixed rollout and the hours observed; beside them, the chain that finds the boundary (the node label names,
    their number of values, then the nodes with pods counted by group, crashing or not, and by every label of few
    values: the node column and the boundary from one query). Three stages: the queries
    (:func:`_fleet_queries`), their answers checked (:func:`_check_pod_labels`), the answers folded into the table
    (:func:`_fleet_rows`).

    :param window: count restarts and crashes over the last ``window`` seconds (``increase``); None: all
    :raises SelectorError: a ``selector`` Prometheus cannot be asked exactly
    :raises PrometheusError: Prometheus could not answer, or answered what no Prometheus would
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    at = now.timestamp()
    matchers = selector_matchers(selector) if selector else []
    # the node labels a group's key reads, asked as they are (the driver's parts and the fallbacks beside the
    # asked labels): the key is made here, by the rule fleet --from uses
    raw = key_labels(group_by)
    names = {prom_label(x): x for x in (*raw, *DEFAULT_GROUP_LABELS, *DRIVER_PARTS, *FALLBACK_LABELS)}
    g = list(dict.fromkeys(prom_label(x) for x in raw))
    jobs = _fleet_queries(client, g, namespace=namespace, matchers=matchers, window=window, at=at)
    res = client.query_many(jobs, at=at)
    _check_pod_labels(res, matchers)
    rows, latest, all_nodes, shown, crashing = _fleet_rows(res, g, names, group_by)
    hours = res["hours"]
    return finish_summary(
        rows, group_by=group_by, nodes=all_nodes, boundary=boundary_lines(shown, nodes=all_nodes, crashing=crashing),
        baseline=baseline_label or (f"the last {window}s" if window else None), mixed_images=bool(res["mixed"]),
        taken_at=now.isoformat(), observed_hours=(window / 3600 if window else (hours[0][1] if hours else None)),
        source=client.base, latest_bundles=dict(sorted(latest.items())))


def _fleet_queries(client: PromClient, g: list[str], *, namespace: str | None, matchers: list[tuple[str, str]],
                   window: int | None, at: float) -> dict[str, str | Callable[[], Any]]:
    """The queries of :func:`summarize_fleet_prometheus`, by name: PromQL, or a call that asks its own chain (the
    nodes and the boundary; the pod labels kube-state-metrics has)."""
    by = ", ".join(g)
    ns = f'namespace="{_esc(namespace)}"' if namespace else ""
    # each node's group labels; none for a node of the pods asked about without a kube_node_labels series, nor for
    # their series of no node (the unscheduled pods'): the group "(no labels)", as fleet --from counts their pods
    unlabelled = f"group by (node) (kube_pod_info{{{ns}}})"
    node_groups = f"(max by (node, {by}) (kube_node_labels) or on (node) {unlabelled})"

    def pods_where(match: str) -> str:
        """The pods asked about (namespace, -l) whose kube_pod_info matches ``match`` too."""
        out = f"group by (namespace, pod, node) (kube_pod_info{{{', '.join(x for x in (ns, match) if x)}}})"
        if matchers:
            out = (f"({out} * on (namespace, pod) group_left () "
                   f"group by (namespace, pod) (kube_pod_labels{{{', '.join(k + v for k, v in matchers)}}}))")
        return out

    pods = pods_where("")
    # each pod with its group's labels
    podg = f"({pods} * on (node) group_left ({by}) {node_groups})"
    restarts_total = f"kube_pod_container_status_restarts_total{{{ns}}}"
    restarts = (f"round(sum by (namespace, pod) (increase({restarts_total}[{window}s])))" if window
                else f"sum by (namespace, pod) ({restarts_total})")
    started = f"(({restarts}) > 0)"
    wait = f'{ns}, ' if namespace else ""
    looping = (f"group by (namespace, pod) (kube_pod_container_status_waiting_reason{{{wait}"
               f'reason="CrashLoopBackOff"}} == 1)')
    # failing as fleet --from counts it: restarting in the window, or in CrashLoopBackOff now (after a fresh
    # baseline such a pod waits out its back-off with no restart counted yet); its last exit code and its node count
    failing = f"({started} or {looping})"
    crashes = agent_node(f"increase(forensics_crashes_total[{window}s])" if window else "forensics_crashes_total")

    def of_pods(expr: str) -> str:
        """expr's series of the pods asked about: all of the namespace's without -l (no join to evaluate)."""
        return f"({expr} * on (namespace, pod) group_left () {pods})" if matchers else expr

    last = "kube_pod_container_status_last_terminated"

    def figure(name: str, expr: str) -> str:
        return f'label_replace({expr}, "{_FIGURE}", "{name}", "", "")'

    # Prometheus shares nothing between queries, nor between the parts of one: each evaluates its pod -> node ->
    # group join again. So every per-pod figure goes into one query: each pod's facts, tagged by figure, joined with
    # the groups once and counted by value (count_values): a pod is 1; a restarting pod's restarts (their
    # histogram per group gives the restarting pods, the restarts and the most of one pod); the exit code and
    # last exit code of a failing pod; the reason of a restarting pod's last termination; CrashLoopBackOff; the
    # images it runs
    per_pod = " or ".join((
        figure("pods", pods),
        figure("restarts", started),
        f"{figure('exit_code', f'max by (namespace, pod) ({last}_exitcode{{{ns}}})')} "
        f"and on (namespace, pod) {failing}",
        f"{figure('reason', f'group by (namespace, pod, reason) ({last}_reason{{{ns}}} == 1)')} "
        f"and on (namespace, pod) {started}",
        figure("crash_loop", looping),
        figure("image", f"group by (namespace, pod, image_id) (kube_pod_container_info{{{ns}}})")))
    jobs: dict[str, str | Callable[[], Any]] = {
        "counts": (f'count_values by ({by}, {_FIGURE}, reason, image_id) ("{_VALUE}", ({per_pod}) '
                   f"* on (namespace, pod) group_left ({by}) {podg})"),
        "fingerprints": f"sum by ({by}, fingerprint) ({crashes} * on (node) group_left ({by}) {node_groups})",
        "mixed": (f"count by (container) (count by (container, image_id) "
                  f"({of_pods(f'kube_pod_container_info{{{ns}}}')})) > 1"),
        "hours": f"avg({at:.3f} - {of_pods(f'max by (namespace, pod) (kube_pod_start_time{{{ns}}})')}) / 3600",
        "nodes": lambda: _nodes(client, at, pods_where('node!=""'), failing, g, unlabelled),
        # where the newest bundle of each fingerprint lives, of all the agents'
        "bundles": f"topk by (fingerprint) (1, max by (fingerprint, bundle) ({LATEST_BUNDLE}))",
    }
    if matchers:  # a label no pod series has: not allow-listed in kube-state-metrics, or a typo; never "all pods"
        jobs["pod_labels"] = lambda: client.label_names("kube_pod_labels")
    return jobs


def _check_pod_labels(res: dict, matchers: list[tuple[str, str]]) -> None:
    """:raises PrometheusError: when a label of ``-l`` is on no pod's kube_pod_labels series."""
    missing = sorted({k for k, _ in matchers} - set(res.get("pod_labels", ())))
    if missing:
        raise PrometheusError("kube_pod_labels", f"no pod has {', '.join(missing)[:200]}: kube-state-metrics exports "
                                                 "pod labels only when allow-listed (--metric-labels-allowlist)")


def _fleet_rows(res: dict, g: list[str], names: dict[str, str], group_by: tuple[str, ...]) -> tuple:
    """The answers of :func:`_fleet_queries` folded into the table: (its rows, where the newest bundle of each
    fingerprint shown lives, the nodes, the boundary's label values, the crashing nodes)."""

    def key_of(labels: dict) -> tuple:
        return group_key({names.get(k, k): labels[k] for k in g if labels.get(k)}, group_by)

    pods_n, with_r, total, maxr, loop, codes, reasons, images = _per_pod_counts(res["counts"], key_of)
    fingerprints: dict[tuple, dict[str, int]] = {}
    for labels, v in res["fingerprints"]:
        fp, n = str(labels.get("fingerprint", "")), int(round(v))
        if fp and n:
            d = fingerprints.setdefault(key_of(labels), {})
            d[fp] = d.get(fp, 0) + n
    shown_fps = {fp for d in fingerprints.values() for fp in d}
    latest = {str(labels.get("fingerprint")): str(labels.get("bundle")) for labels, _ in res["bundles"]
              if labels.get("fingerprint") in shown_fps and labels.get("bundle")}
    nodes_per_group, all_nodes, per_label, crashing = res["nodes"]
    per_key: dict[tuple, int] = {}
    for labels, n in nodes_per_group:
        per_key[key_of(labels)] = per_key.get(key_of(labels), 0) + n
    shown = {names.get(x, x[len("label_"):]): v for x, v in per_label.items()}
    rows = [FleetGroup(
        key=key, nodes=per_key.get(key, 0), pods=n, pods_with_restarts=with_r.get(key, 0),
        total_restarts=total.get(key, 0), max_restarts=maxr.get(key, 0),
        exit_codes={b: c[key] for b, c in codes.items() if c.get(key)}, reasons=reasons.get(key, {}),
        crash_loop=loop.get(key, 0), images=images.get(key, {}), fingerprints=fingerprints.get(key, {}))
        for key, n in pods_n.items()]
    return rows, latest, all_nodes, shown, crashing


def _per_pod_counts(series: list[tuple[dict[str, str], float]], key_of: Callable[[dict], tuple]) -> tuple:
    """pods, restarting pods, restarts, the most restarts of one pod, CrashLoopBackOff, exit codes, reasons and
    images per group, from the one count_values query over the per-pod facts (see
    :func:`summarize_fleet_prometheus`)."""
    pods: dict[tuple, int] = {}
    restarting: dict[tuple, int] = {}
    total: dict[tuple, int] = {}
    most: dict[tuple, int] = {}
    loop: dict[tuple, int] = {}
    codes: dict[str, dict[tuple, int]] = {"139": {}, "134": {}, "137": {}, "other": {}}
    reasons: dict[tuple, dict[str, int]] = {}
    images: dict[tuple, dict[str, int]] = {}

    def add(d: dict, k: Any, n: int) -> None:
        d[k] = d.get(k, 0) + n

    for labels, v in series:
        key, what, value, n = key_of(labels), labels.get(_FIGURE), _count_value(labels, _VALUE), _count(v)
        if what == "pods":
            add(pods, key, n)
        elif what == "restarts" and value > 0 and n:  # n pods restarted `value` times each
            add(restarting, key, n)
            add(total, key, n * value)
            most[key] = max(most.get(key, 0), value)
        elif what == "crash_loop":
            add(loop, key, n)
        elif what == "exit_code":
            add(codes[str(value) if value in (139, 134, 137) else "other"], key, n)
        elif what in ("reason", "image") and n:
            sub = labels.get("reason", "") if what == "reason" else labels.get("image_id", "").split("://", 1)[-1]
            if sub:
                add((reasons if what == "reason" else images).setdefault(key, {}), sub, n)
    return pods, restarting, total, most, loop, codes, reasons, images


def _count(v: float) -> int:
    """A count Prometheus gave (count, count_values): a whole number, not negative."""
    if v < 0 or v != int(v):
        raise PrometheusError("/api/v1/query", f"a count of {v!r}, not a whole number")
    return int(v)


def _count_value(labels: dict[str, str], label: str) -> int:
    """The value count_values put in ``label`` (an integer count or exit code).

    >>> _count_value({"v": "139"}, "v"), _count_value({"v": "-1"}, "v")
    (139, -1)
    """
    try:
        value = float(labels.get(label, ""))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise PrometheusError("/api/v1/query", f"count_values gave {label}={str(labels.get(label))[:40]!r}, "
                                               "not an integer")
    return int(value)


_LABEL_NAME = re.compile(r"label_[a-zA-Z0-9_]*")


def _nodes(client: PromClient, at: float, pods: str, failing: str, g: list[str],
           unlabelled: str) -> tuple[list[tuple[dict[str, str], int]], int, dict[str, dict[str, tuple[int, int]]], int]:
    """The nodes with ``pods`` (those on a node): by group labels ``g``, in all, by each node label of few values
    (value -> (nodes, crashing nodes)), and the crashing ones: the Nodes column and what the boundary rule reads.

    A chain of two to four requests, whatever the number of node labels: the label names (an index lookup);
    each other label's number of values over all nodes (no join); then one query counting the nodes with pods by
    whether one of their pods restarted, by the group labels and by every label of few values. A label with more
    values over all nodes than a boundary can have is first asked on its own, over the nodes with pods.
    """
    # per node with pods: 1 when one of its pods is failing (restarted, or crash-looping now), else 0
    state = (f"(group by (node) ({pods} * on (namespace, pod) group_left () {failing}) "
             f"or 0 * group by (node) ({pods}))")
    skip = tuple(prom_label(p.rstrip("/")) for p in BOUNDARY_SKIP)
    labels = [x for x in sorted(set(client.label_names("kube_node_labels")))
              if _LABEL_NAME.fullmatch(x) and not x.startswith(skip) and x not in g]
    card: dict[str | None, float] = {}
    if labels:
        card = {lab.get("node_label"): v for lab, v in client.query(" or ".join(
            f'label_replace(count(count by ({x}) (kube_node_labels{{{x}!=""}})), "node_label", "{x}", "", "")'
            for x in labels), at=at)}
    many = [x for x in labels if card.get(x, 0) > MAX_BOUNDARY_VALUES]
    if many:  # many values over all nodes: maybe few over the nodes with pods
        with_pods = f"group by (node) ({pods})"
        res = client.query_many({x: f'count(count by ({x}) (kube_node_labels{{{x}!=""}} * on (node) group_left () '
                                    f"{with_pods}))" for x in many}, at=at)
        many = [x for x in many if not res[x] or res[x][0][1] > MAX_BOUNDARY_VALUES]
    few = [x for x in labels if card.get(x) and x not in many]
    joint = [*g, *few]
    by = ", ".join(joint)
    # every node with pods, with its labels: none for a node without a kube_node_labels series (``unlabelled``: the
    # nodes of the pods asked about, or a superset, as one series each), which counts as "(no labels)" does in
    # fleet --from: in the Nodes column and in the boundary's number of nodes, in no label's values
    series = client.query(f'count_values by ({by}) ("restarted", (max by (node, {by}) (kube_node_labels) '
                          f"or on (node) {unlabelled}) * on (node) group_left () {state})", at=at)
    per_group: list[tuple[dict[str, str], int]] = []
    per_label: dict[str, dict[str, tuple[int, int]]] = {x: {} for x in [*g, *few]}
    total = crashing = 0
    for lab, v in series:
        bad, n = _count_value(lab, "restarted"), _count(v)
        total += n
        crashing += n if bad else 0
        per_group.append((lab, n))
        for x in joint:
            value = lab.get(x)
            if value:
                nodes, b = per_label[x].get(value, (0, 0))
                per_label[x][value] = (nodes + n, b + (n if bad else 0))
    return per_group, total, per_label, crashing
