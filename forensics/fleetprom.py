"""``forensics fleet --prometheus URL``: the fleet table from PromQL over kube-state-metrics and the agents' crashes.

The same :class:`~forensics.fleet.FleetSummary` as ``fleet --from`` (groups by node labels, pods,
restarting pods, restarts, exit codes, CrashLoopBackOff, images, the boundary), built from
instant queries that aggregate in Prometheus (``count by`` / ``sum by`` / ``max by`` over the
group labels), so what travels grows with the number of groups, never with the number of pods:

- pods and their nodes: ``kube_pod_info`` (``namespace``, ``pod``, ``node``); ``-l`` selects on
  ``kube_pod_labels`` (``label_KEY``, which kube-state-metrics exports for allow-listed labels);
- node groups: ``kube_node_labels`` (``label_nvidia_com_gpu_product``...; kube-state-metrics
  exports node labels only when allow-listed: ``--metric-labels-allowlist=nodes=[nvidia.com/gpu.product,...]``);
  the driver version is joined from GPU feature discovery's major/minor/rev when the full one is absent;
- restarts: ``kube_pod_container_status_restarts_total`` (its value, or ``increase`` over ``--window``);
- last exit codes and reasons: ``kube_pod_container_status_last_terminated_exitcode`` (kube-state-metrics
  2.10+) and ``..._last_terminated_reason``; CrashLoopBackOff: ``kube_pod_container_status_waiting_reason``;
- images: ``kube_pod_container_info`` (``image_id``);
- crashes by fingerprint: the agents' ``forensics_crashes_total`` (``node``, ``fingerprint``), joined to the
  node groups.

Authentication as Prometheus clients take it: a bearer token file, basic auth, a CA file.
"""
from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import json
import math
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .errors import ForensicsError
from .fleetmodel import (BOUNDARY_SKIP, DEFAULT_GROUP_LABELS, DRIVER_FULL, DRIVER_PARTS, FALLBACK_LABELS,
                         MAX_BOUNDARY_VALUES, FleetGroup, FleetSummary, boundary_lines, finish_summary)

__all__ = ["PrometheusError", "PromAuth", "PromClient", "prom_label", "parse_window", "summarize_fleet_prometheus"]

MAX_RESPONSE = 64 << 20
_FIGURE, _VALUE = "forensics_figure", "forensics_value"  # labels of the per-pod counts


class PrometheusError(ForensicsError, RuntimeError):
    help_text = ("Check the Prometheus URL, its authentication (--bearer-token-file, --basic-auth, --ca-file), "
                 "and that it scrapes kube-state-metrics.")

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"prometheus: {what}: {detail}", what=what, detail=detail)


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
    """Instant queries against Prometheus' HTTP API (``/api/v1/query``), bounded in time and size."""

    def __init__(self, url: str, auth: PromAuth = PromAuth(), *, timeout: float = 30.0) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise PrometheusError(url, "not an http:// or https:// URL")
        self.base = url.rstrip("/")
        self.timeout = timeout
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

    def _get(self, path: str, params: dict) -> dict:
        data = urllib.parse.urlencode(params, doseq=True).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={
            **self.headers, "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ctx) as r:
                body = r.read(MAX_RESPONSE + 1)
        except urllib.error.HTTPError as e:
            detail = e.read(4096).decode(errors="replace")
            with contextlib.suppress(ValueError):  # not Prometheus's JSON: the body itself is the detail
                detail = json.loads(detail).get("error") or detail
            raise PrometheusError(path, f"HTTP {e.code}: {str(detail).strip()[:300]}") from e
        except (urllib.error.URLError, OSError) as e:
            raise PrometheusError(self.base, f"cannot reach it: {getattr(e, 'reason', e)}") from e
        if len(body) > MAX_RESPONSE:
            raise PrometheusError(path, f"answer over {MAX_RESPONSE} bytes")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise PrometheusError(path, "the answer is not JSON (is this Prometheus' URL?)") from e
        if not isinstance(doc, dict) or "status" not in doc:
            raise PrometheusError(path, "the answer is not a Prometheus API response (is this Prometheus' URL?)")
        if doc.get("status") != "success":
            raise PrometheusError(path, f"{str(doc.get('errorType'))[:100]}: {str(doc.get('error'))[:300]}")
        if "data" not in doc:
            raise PrometheusError(path, "a successful answer without data")
        self.queries += 1
        return doc["data"]

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

    def query_many(self, exprs: dict[str, str], *, at: float | None = None, workers: int = 8) -> dict[str, list]:
        """Several instant queries at once (Prometheus evaluates them in parallel); results by key."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(exprs)))) as pool:
            futures = {k: pool.submit(self.query, e, at=at) for k, e in exprs.items()}
            return {k: f.result() for k, f in futures.items()}

    def label_names(self, match: str) -> list[str]:
        names: object = self._get("/api/v1/labels", {"match[]": match}) or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise PrometheusError("/api/v1/labels", "the label names are not a list of strings")
        return names


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


def _matchers(namespace: str | None) -> str:
    return f'{{namespace="{_esc(namespace)}"}}' if namespace else ""


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def summarize_fleet_prometheus(client: PromClient, *, group_by: tuple[str, ...] = DEFAULT_GROUP_LABELS,
                               namespace: str | None = None, selector: str | None = None, window: int | None = None,
                               now: _dt.datetime | None = None, baseline_label: str | None = None) -> FleetSummary:
    """The fleet table from Prometheus (see the module docstring).

    :param window: count restarts and crashes over the last ``window`` seconds (``increase``); None: all
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    at = now.timestamp()
    names = {prom_label(x): x for x in (*group_by, *DRIVER_PARTS, *FALLBACK_LABELS, *DEFAULT_GROUP_LABELS)}
    g = [prom_label(x) for x in group_by]
    by = ", ".join(g)
    ns = _matchers(namespace)
    # node -> group labels (the driver version joined from its parts where the full label is absent)
    node_groups = f"max by (node, {by}) (kube_node_labels)"
    if DRIVER_FULL in group_by:
        full, parts = prom_label(DRIVER_FULL), [prom_label(p) for p in DRIVER_PARTS]
        node_groups = (f'max by (node, {by}) (kube_node_labels{{{full}!=""}} or '
                       f'label_join(kube_node_labels{{{full}=""}}, '
                       f'"{full}", ".", "{parts[0]}", "{parts[1]}", "{parts[2]}"))')
    pods = f"max by (namespace, pod, node) (kube_pod_info{ns})"
    if selector:
        sel = []
        for clause in selector.split(","):
            k, sep, v = clause.partition("=")
            if not sep or not k.strip():
                raise PrometheusError("-l",
                                      f"{clause!r}: only equality selectors (key=value) can be asked of Prometheus")
            sel.append(f'{prom_label(k.strip())}="{_esc(v.lstrip("=").strip())}"')
        pods = (f"({pods} * on (namespace, pod) group_left () "
                f"max by (namespace, pod) (kube_pod_labels{{{', '.join(sel)}}}))")
    podg = f"({pods} * on (node) group_left ({by}) {node_groups})"
    restarts = (f"round(sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total{ns}[{window}s])))"
                if window else f"sum by (namespace, pod) (kube_pod_container_status_restarts_total{ns})")
    # the restarting pods with their group (only they count for restarts: the join is over the pods that restarted)
    restarting = f"(({restarts}) > 0) * on (namespace, pod) group_left ({by}) {podg}"
    started = f"(({restarts}) > 0)"
    exitcode = f"max by (namespace, pod) (kube_pod_container_status_last_terminated_exitcode{ns})"

    crashes = (f"increase(forensics_crashes_total[{window}s])" if window else "forensics_crashes_total")
    wait = f'namespace="{_esc(namespace)}", ' if namespace else ""

    def of_pods(expr: str) -> str:
        """expr's series of the pods asked about: all of the namespace's without -l (no join to evaluate)."""
        return f"({expr} * on (namespace, pod) group_left () {pods})" if selector else expr

    def figure(name: str, expr: str) -> str:
        return f'label_replace({expr}, "{_FIGURE}", "{name}", "", "")'

    # Prometheus shares nothing between queries: each evaluates its pod -> node -> group join again. So the
    # per-pod figures that are counts go into one query: each pod's facts, tagged by figure, joined with the
    # groups once and counted by value (count_values: a fact's value is 1, 0/1 whether the pod restarted, or the
    # exit code of a restarting pod's last termination)
    per_pod = " or ".join((
        figure("pods", pods),
        figure("restarting", f"({restarts}) > bool 0"),
        figure("exit_code", f"{exitcode} and on (namespace, pod) {started}"),
        figure("reason", f"max by (namespace, pod, reason) (kube_pod_container_status_last_terminated_reason{ns} == 1) "
                         f"and on (namespace, pod) {started}"),
        figure("crash_loop", f"max by (namespace, pod) (kube_pod_container_status_waiting_reason{{{wait}"
                             f'reason="CrashLoopBackOff"}} == 1)'),
        figure("image", f"max by (namespace, pod, image_id) (kube_pod_container_info{ns})")))
    exprs = {
        "counts": (f'count_values by ({by}, {_FIGURE}, reason, image_id) ("{_VALUE}", ({per_pod}) '
                   f"* on (namespace, pod) group_left ({by}) {podg})"),
        "nodes": f"count by ({by}) (count by (node, {by}) ({podg}))",
        "total": f"sum by ({by}) ({restarting})",
        "max": f"max by ({by}) ({restarting})",
        "fingerprints": f"sum by ({by}, fingerprint) ({crashes} * on (node) group_left ({by}) {node_groups})",
        "mixed": (f"count by (container) (count by (container, image_id) "
                  f"({of_pods(f'kube_pod_container_info{ns}')})) > 1"),
        "hours": f"avg({at:.3f} - {of_pods(f'max by (namespace, pod) (kube_pod_start_time{ns})')}) / 3600",
    }
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:  # the boundary's few dependent queries, beside the table's
        boundary_f = pool.submit(_boundary, client, at, pods, restarts, names)
        res = client.query_many(exprs, at=at)
        boundary, all_nodes = boundary_f.result()

    def key_of(labels: dict) -> tuple:
        return tuple((names.get(k, k), labels[k]) for k in g if labels.get(k))

    def per_group(name: str) -> dict[tuple, float]:
        return {key_of(labels): v for labels, v in res[name]}

    def per_group_by(name: str, label: str, strip=lambda x: x) -> dict[tuple, dict[str, int]]:
        out: dict[tuple, dict[str, int]] = {}
        for labels, v in res[name]:
            sub = strip(str(labels.get(label, "")))
            if sub and round(v):
                d = out.setdefault(key_of(labels), {})
                d[sub] = d.get(sub, 0) + int(round(v))
        return out

    pods_n, with_r, loop, codes, reasons, images = _per_pod_counts(res["counts"], key_of)
    nodes_n, total, maxr = per_group("nodes"), per_group("total"), per_group("max")
    fingerprints = per_group_by("fingerprints", "fingerprint")
    mixed, hours = res["mixed"], res["hours"]
    rows = [FleetGroup(
        key=key, nodes=int(nodes_n.get(key, 0)), pods=int(n), pods_with_restarts=int(with_r.get(key, 0)),
        total_restarts=int(round(total.get(key, 0))), max_restarts=int(round(maxr.get(key, 0))),
        exit_codes={b: int(c[key]) for b, c in codes.items() if c.get(key)}, reasons=reasons.get(key, {}),
        crash_loop=int(loop.get(key, 0)), images=images.get(key, {}), fingerprints=fingerprints.get(key, {}))
        for key, n in pods_n.items()]
    return finish_summary(
        rows, group_by=group_by, nodes=all_nodes, boundary=boundary,
        baseline=baseline_label or (f"the last {window}s" if window else None), mixed_images=bool(mixed),
        taken_at=now.isoformat(),
        observed_hours=(window / 3600 if window else (hours[0][1] if hours else None)),
        source=client.base)


def _per_pod_counts(series: list[tuple[dict[str, str], float]], key_of) -> tuple:
    """pods, restarting pods, CrashLoopBackOff, exit codes, reasons and images per group, from the one
    count_values query over the per-pod facts (see :func:`summarize_fleet_prometheus`)."""
    pods: dict[tuple, int] = {}
    restarting: dict[tuple, int] = {}
    loop: dict[tuple, int] = {}
    codes: dict[str, dict[tuple, int]] = {"139": {}, "134": {}, "137": {}, "other": {}}
    reasons: dict[tuple, dict[str, int]] = {}
    images: dict[tuple, dict[str, int]] = {}
    for labels, v in series:
        key, what, value, n = key_of(labels), labels.get(_FIGURE), _count_value(labels, _VALUE), int(round(v))
        if what == "pods":
            pods[key] = pods.get(key, 0) + n
        elif what == "restarting" and value:
            restarting[key] = restarting.get(key, 0) + n
        elif what == "crash_loop":
            loop[key] = loop.get(key, 0) + n
        elif what == "exit_code":
            c = codes[str(value) if value in (139, 134, 137) else "other"]
            c[key] = c.get(key, 0) + n
        elif what in ("reason", "image") and n:
            sub = labels.get("reason", "") if what == "reason" else labels.get("image_id", "").split("://", 1)[-1]
            if sub:
                d = (reasons if what == "reason" else images).setdefault(key, {})
                d[sub] = d.get(sub, 0) + n
    return pods, restarting, loop, codes, reasons, images


def _count_value(labels: dict[str, str], label: str) -> int:
    """The value count_values put in ``label`` (an integer count or exit code)."""
    try:
        value = float(labels.get(label, ""))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise PrometheusError("/api/v1/query", f"count_values gave {label}={str(labels.get(label))[:40]!r}, "
                                               "not an integer")
    return int(value)


_LABEL_NAME = re.compile(r"label_[a-zA-Z0-9_]*")


def _boundary(client: PromClient, at: float, pods: str, restarts: str,
              names: dict[str, str]) -> tuple[list[str], int]:
    """The boundary (by :func:`forensics.fleetmodel.boundary_lines`, the rule fleet --from uses) and the number of
    nodes with pods.

    Three rounds, whatever the number of node labels: the label names; each label's number of values over
    all nodes (no join) with, beside it, the nodes with pods by whether one of their pods restarted; then one
    query counting nodes with pods by the values of every label with few values and by that state. A label
    with more values over all nodes than a boundary can have is asked on its own, over the nodes with pods.
    """
    # per node with pods: 1 when one of its pods restarted, else 0
    state = (f"max by (node) ((({restarts}) > bool 0) * on (namespace, pod) group_left (node) {pods} "
             f"or on (namespace, pod) 0 * {pods})")
    skip = tuple(prom_label(p.rstrip("/")) for p in BOUNDARY_SKIP)
    labels = [x for x in sorted(set(client.label_names("kube_node_labels")))
              if _LABEL_NAME.fullmatch(x) and not x.startswith(skip)]
    exprs = {"state": f'count_values ("restarted", {state})'}
    if labels:
        exprs["card"] = " or ".join(f'label_replace(count(count by ({x}) (kube_node_labels{{{x}!=""}})), '
                                    f'"node_label", "{x}", "", "")' for x in labels)
    res = client.query_many(exprs, at=at)
    per_state = {_count_value(lab, "restarted"): int(v) for lab, v in res["state"]}
    total, total_bad = sum(per_state.values()), per_state.get(1, 0)
    if not total_bad or total_bad == total or not labels:
        return [], total
    card = {lab.get("node_label"): v for lab, v in res.get("card", [])}
    many = [x for x in labels if card.get(x, 0) > MAX_BOUNDARY_VALUES]
    if many:  # many values over all nodes: maybe few over the nodes with pods
        with_pods = f"count by (node) ({pods})"
        res = client.query_many({x: f'count(count by ({x}) (kube_node_labels{{{x}!=""}} * on (node) group_left () '
                                    f"{with_pods}))" for x in many}, at=at)
        many = [x for x in many if not res[x] or res[x][0][1] > MAX_BOUNDARY_VALUES]
    few = [x for x in labels if card.get(x) and x not in many]
    if not few:
        return [], total
    joint = client.query(f'count_values by ({", ".join(few)}) ("restarted", max by (node, {", ".join(few)}) '
                         f"(kube_node_labels) * on (node) group_left () {state})", at=at)
    per: dict[str, dict[str, tuple[int, int]]] = {names.get(x, x[len("label_"):]): {} for x in few}
    for lab, v in joint:
        bad = _count_value(lab, "restarted")
        for x in few:
            value = lab.get(x)
            if value:
                counts = per[names.get(x, x[len("label_"):])]
                n, b = counts.get(value, (0, 0))
                counts[value] = (n + int(v), b + (int(v) if bad else 0))
    return boundary_lines(per, nodes=total, crashing=total_bad), total
