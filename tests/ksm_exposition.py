"""kube-state-metrics' exposition of a fleet, from `kubectl get -o json` documents (tests/fleetgen.py's).

The metric names, types and labels are kube-state-metrics' own (docs/pod-metrics.md,
docs/node-metrics.md: ``kube_pod_info``, ``kube_pod_labels``, ``kube_pod_start_time``,
``kube_pod_container_info``, ``kube_pod_container_status_restarts_total``,
``kube_pod_container_status_last_terminated_exitcode`` (2.10+), ``..._last_terminated_reason``,
``..._waiting_reason``, ``kube_node_labels`` with allow-listed ``label_*``), so ``fleet --prometheus``
meets what a cluster's Prometheus holds.  ``serve_ksm`` serves it on 127.0.0.1 for a real Prometheus.
"""
from __future__ import annotations

import datetime as dt
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["ksm_text", "serve_ksm"]


def _label(k: str) -> str:
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)


def _fmt(name: str, labels: dict, value: float) -> str:
    inner = ",".join(f'{k}="{str(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value:g}\n"


def ksm_text(pods_doc: dict, nodes_doc: dict) -> str:
    out: dict[str, list[str]] = {}
    types = {"kube_node_labels": "gauge", "kube_pod_info": "gauge", "kube_pod_labels": "gauge",
             "kube_pod_start_time": "gauge", "kube_pod_container_info": "gauge",
             "kube_pod_container_status_restarts_total": "counter",
             "kube_pod_container_status_last_terminated_exitcode": "gauge",
             "kube_pod_container_status_last_terminated_reason": "gauge",
             "kube_pod_container_status_waiting_reason": "gauge"}
    for n in nodes_doc["items"]:
        meta = n["metadata"]
        labels = {_label(k): v for k, v in sorted(meta["labels"].items())}
        out.setdefault("kube_node_labels", []).append(_fmt("kube_node_labels", {"node": meta["name"], **labels}, 1))
    for p in pods_doc["items"]:
        meta, spec, status = p["metadata"], p["spec"], p["status"]
        base = {"namespace": meta["namespace"], "pod": meta["name"], "uid": meta["uid"]}
        out.setdefault("kube_pod_info", []).append(_fmt("kube_pod_info", {
            **base, "host_ip": "", "pod_ip": "", "node": spec.get("nodeName", ""), "created_by_kind": "DaemonSet",
            "created_by_name": "nvitop-exporter", "priority_class": "", "host_network": "false"}, 1))
        out.setdefault("kube_pod_labels", []).append(_fmt("kube_pod_labels", {
            **base, **{_label(k): v for k, v in sorted((meta.get("labels") or {}).items())}}, 1))
        if status.get("startTime"):  # a pod not yet scheduled has none, and kube-state-metrics no series for it
            start = dt.datetime.fromisoformat(status["startTime"].replace("Z", "+00:00")).timestamp()
            out.setdefault("kube_pod_start_time", []).append(_fmt("kube_pod_start_time", base, start))
        for cs in status.get("containerStatuses") or []:
            c = {**base, "container": cs["name"]}
            image_id = cs.get("imageID", "")
            out.setdefault("kube_pod_container_info", []).append(_fmt("kube_pod_container_info", {
                **c, "image_spec": image_id.split("://")[-1].split("@")[0], "image": image_id.split("://")[-1].split("@")[0],
                "image_id": image_id, "container_id": "containerd://" + "0" * 64}, 1))
            out.setdefault("kube_pod_container_status_restarts_total", []).append(
                _fmt("kube_pod_container_status_restarts_total", c, cs.get("restartCount", 0)))
            term = (cs.get("lastState") or {}).get("terminated")
            if term:
                out.setdefault("kube_pod_container_status_last_terminated_exitcode", []).append(
                    _fmt("kube_pod_container_status_last_terminated_exitcode", c, term["exitCode"]))
                reason = {**c, "reason": term.get("reason", "")}
                out.setdefault("kube_pod_container_status_last_terminated_reason", []).append(
                    _fmt("kube_pod_container_status_last_terminated_reason", reason, 1))
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting:
                out.setdefault("kube_pod_container_status_waiting_reason", []).append(
                    _fmt("kube_pod_container_status_waiting_reason", {**c, "reason": waiting["reason"]}, 1))
    text = []
    for name, lines in out.items():
        text.append(f"# HELP {name} kube-state-metrics (test exposition)\n# TYPE {name} {types[name]}\n")
        text.extend(lines)
    return "".join(text)


def serve_ksm(text: str) -> tuple[ThreadingHTTPServer, int]:
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]
