"""A small stand-in for the Kubernetes API server (and one kubelet), for the real kubectl.

It serves, on 127.0.0.1 over plain HTTP, only what ``forensics capture --pod`` reads and
writes, and what ``forensics fleet`` lists: legacy discovery (``/api``, ``/apis``, ``/api/v1``),
pods (get, list with an equality label selector or a ``spec.nodeName`` field selector, create,
delete, log), nodes (get, list), apps/v1 DaemonSets (get, and the strategic merge patch ``kubectl set
resources`` sends: what a report's runbook changes) and events: core/v1's (list, with an ``involvedObject.uid`` field
selector; get, create, JSON merge patch) and events.k8s.io/v1's (create, get, list, JSON merge patch: the
agent's), one store seen through both, converted as the API server converts them; a write through
events.k8s.io/v1 is validated by the API server's rules for that version (k8s.io/kubernetes
pkg/apis/core/validation/events.go: ValidateEventCreate / ValidateEventUpdate, ported below: the
required fields, the limits, series.count of at least 2, the deprecated fields unset, the immutable
fields), and refused with its 422 ``Invalid`` Status.  Objects
are the JSON the real API returns (fields kept to those read).  A created pod is "run" the
way a kubelet on this machine would: its container's command is executed here (the image
is taken to be this machine's filesystem, with the given ``PATH``), its phase follows the
process, and its log is the process's output.  Unknown paths answer 404 ``Status`` objects
like the real server. A pod with init containers or more than one container is run whole
(:meth:`StandIn._run_pod`): its init containers one after the other, then its containers, each through
``runtime`` (tests/podruntime.py: its securityContext and volumes) when one is set; deleting it stops it as a
kubelet does: each container's preStop hook, then SIGTERM, then SIGKILL past terminationGracePeriodSeconds.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

__all__ = ["StandIn", "make_pod", "make_node", "make_event", "make_daemonset", "write_kubeconfig", "core_view",
           "group_view", "validate_group_event"]

RESOURCES = [
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",  # list: fleet
     "verbs": ["create", "delete", "get", "list"], "shortNames": ["po"]},
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "verbs": ["get", "list"],
     "shortNames": ["no"]},
    {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
     "verbs": ["create", "get", "list", "patch"], "shortNames": ["ev"]},
]
EVENTS_GROUP = "events.k8s.io"
APPS_RESOURCES = [{"name": "daemonsets", "singularName": "daemonset", "namespaced": True, "kind": "DaemonSet",
                   "verbs": ["get", "list", "patch"], "shortNames": ["ds"]}]
GROUP_RESOURCES = [{"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
                    "verbs": ["create", "get", "list", "patch"], "shortNames": ["ev"]}]
# events.k8s.io/v1 field -> core/v1 field of the same stored Event (the API server's conversion)
_TO_CORE = {"regarding": "involvedObject", "note": "message", "deprecatedCount": "count",
            "deprecatedFirstTimestamp": "firstTimestamp", "deprecatedLastTimestamp": "lastTimestamp",
            "deprecatedSource": "source", "reportingController": "reportingComponent"}
_TO_GROUP = {v: k for k, v in _TO_CORE.items()}
# immutable on update through events.k8s.io/v1 (ValidateEventUpdate), by their events.k8s.io/v1 names
_IMMUTABLE = ("regarding", "reason", "note", "deprecatedSource", "deprecatedFirstTimestamp", "deprecatedLastTimestamp",
              "deprecatedCount", "type", "eventTime", "action", "related", "reportingController", "reportingInstance")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def core_view(event: dict) -> dict:
    """A stored Event as core/v1 shows it."""
    if event.get("apiVersion") != f"{EVENTS_GROUP}/v1":
        return event
    return {**{_TO_CORE.get(k, k): v for k, v in event.items()}, "apiVersion": "v1"}


def group_view(event: dict) -> dict:
    """A stored Event as events.k8s.io/v1 shows it."""
    if event.get("apiVersion") == f"{EVENTS_GROUP}/v1":
        return event
    return {**{_TO_GROUP.get(k, k): v for k, v in event.items()}, "apiVersion": f"{EVENTS_GROUP}/v1"}


def validate_group_event(event: dict, old: dict | None = None) -> list[str]:
    """What the API server refuses in an Event written through events.k8s.io/v1 (create, or update of ``old``)."""
    errs = []
    series = event.get("series")
    if series is not None and (old is None or series != old.get("series")):
        if not isinstance(series.get("count"), int) or series["count"] < 2:
            errs.append("series.count: Invalid value: should be at least 2")
        if not series.get("lastObservedTime"):
            errs.append("series.lastObservedTime: Required value")
    ns, regarding = event["metadata"].get("namespace"), event.get("regarding") or {}
    if not regarding.get("namespace") and ns not in ("default", "kube-system"):
        errs.append("involvedObject.namespace: Invalid value: does not match event.namespace")
    controller = event.get("reportingController") or ""
    if not controller or not _QUALIFIED.match(controller):
        errs.append("reportingController: Invalid value: a qualified name is required")
    for name, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
        if not event.get(name) or len(event[name]) > limit:
            errs.append(f"{name}: Required value, at most {limit} characters")
    if len(event.get("note") or "") > 1024:
        errs.append("note: Invalid value: can have at most 1024 characters")
    if old is None:
        if not event.get("eventTime"):
            errs.append("eventTime: Required value")
        if event.get("type") not in ("Normal", "Warning"):
            errs.append(f"type: Invalid value: has invalid value: {event.get('type')}")
        errs += [f"{k}: Invalid value: needs to be unset" for k in ("deprecatedFirstTimestamp",
                 "deprecatedLastTimestamp", "deprecatedCount", "deprecatedSource") if event.get(k)]
    else:
        errs += [f"{k}: Invalid value: field is immutable" for k in _IMMUTABLE if event.get(k) != old.get(k)]
    return errs


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class StandIn:
    def __init__(self, *, path_env: str) -> None:
        self.pods: dict[tuple[str, str], dict] = {}
        self.daemonsets: dict[tuple[str, str], dict] = {}
        self.daemonset_patches: list[tuple[str, str]] = []
        self.nodes: dict[str, dict] = {}
        self.events: list[dict] = []
        self.event_writes: list[tuple[str, str]] = []
        self.procs: dict[tuple[str, str], tuple[subprocess.Popen, list[bytes]]] = {}
        self.created: list[str] = []
        self.created_in: list[tuple[str, str]] = []  # (namespace, name) of each pod created
        self.deleted: list[str] = []
        self.refuse_delete = False  # answer DELETE as an RBAC that allows create but not delete would
        self.runtime = None  # (pod, container, argv) -> the command line that runs the container here
        self.running: dict[tuple[str, str], dict[str, tuple[subprocess.Popen, list[bytes]]]] = {}
        self.stopped: dict[tuple[str, str], dict[str, int]] = {}  # containers' exit statuses of a deleted pod
        self.path_env = path_env
        self.lock = threading.Lock()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, obj, ctype="application/json"):
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                standin._get(self)

            def do_POST(self):
                standin._post(self)

            def do_DELETE(self):
                standin._delete(self)

            def do_PATCH(self):
                standin._patch(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        for p, _ in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for containers in self.running.values():  # a pod run whole and never deleted: its sessions killed
            for p, _ in containers.values():
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

    # -- routes ----------------------------------------------------------------------------------

    def _get(self, h):
        u = urlparse(h.path)
        parts = [p for p in u.path.split("/") if p]
        q = parse_qs(u.query)
        listing = self._discovery(parts)
        if listing is not None:
            return h._send(200, listing)
        in_namespace = len(parts) >= 5 and parts[:3] == ["api", "v1", "namespaces"]
        if parts == ["api", "v1", "pods"] or (in_namespace and len(parts) == 5 and parts[4] == "pods"):
            return h._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                 "items": self._select_pods(parts, q)})
        if len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"]:
            node = self.nodes.get(parts[3])
            if not node:
                return h._send(404, _status(404, "NotFound", f'nodes "{parts[3]}" not found'))
            return h._send(200, node)
        group = len(parts) >= 6 and parts[:4] == ["apis", EVENTS_GROUP, "v1", "namespaces"]
        if group:
            parts = ["api", "v1", *parts[3:]]  # the same store, the group's view
            in_namespace = True
        view = group_view if group else core_view
        if in_namespace and len(parts) == 6 and parts[4] == "events":
            with self.lock:
                ev = self._event(parts[3], parts[5])
            return h._send(200, view(ev)) if ev else h._send(404, _status(404, "NotFound",
                                                                          f'events "{parts[5]}" not found'))
        if in_namespace and len(parts) == 5 and parts[4] == "events":
            return h._send(200, {"kind": "EventList", "apiVersion": f"{EVENTS_GROUP}/v1" if group else "v1",
                                 "metadata": {}, "items": [view(e) for e in self._select_events(parts[3], q)]})
        if in_namespace and len(parts) >= 6 and parts[4] == "pods":
            return self._get_pod(h, parts)
        if len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"] and parts[5] == "daemonsets":
            ds = self.daemonsets.get((parts[4], parts[6]))
            return h._send(200, ds) if ds else h._send(404, _status(404, "NotFound",
                                                                    f'daemonsets.apps "{parts[6]}" not found'))
        return h._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def _discovery(self, parts):
        """The answer to a fixed route (API discovery, the version, the node list), or None."""
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if parts == ["apis"]:
            version = {"groupVersion": f"{EVENTS_GROUP}/v1", "version": "v1"}
            apps = {"groupVersion": "apps/v1", "version": "v1"}
            return {"kind": "APIGroupList", "apiVersion": "v1",
                    "groups": [{"name": EVENTS_GROUP, "versions": [version], "preferredVersion": version},
                               {"name": "apps", "versions": [apps], "preferredVersion": apps}]}
        if parts == ["apis", "apps", "v1"]:
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
                    "resources": APPS_RESOURCES}
        if parts == ["apis", EVENTS_GROUP, "v1"]:
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{EVENTS_GROUP}/v1",
                    "resources": GROUP_RESOURCES}
        if parts == ["api", "v1"]:
            return {"kind": "APIResourceList", "groupVersion": "v1", "resources": RESOURCES}
        if parts == ["version"]:
            return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-standin"}
        if parts == ["api", "v1", "nodes"]:
            return {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": list(self.nodes.values())}
        return None

    def _select_pods(self, parts, q):
        """The pods of all namespaces (``/api/v1/pods``) or of one, by label and node selectors."""
        with self.lock:
            items = [p for (ns, _), p in self.pods.items() if len(parts) == 3 or ns == parts[3]]
        for sel in q.get("labelSelector", []):
            for clause in sel.split(","):
                k, _, v = clause.partition("=")
                items = [p for p in items if (p["metadata"].get("labels") or {}).get(k) == v.lstrip("=")]
        for sel in q.get("fieldSelector", []):
            for clause in sel.split(","):
                k, _, v = clause.partition("=")
                if k == "spec.nodeName":
                    items = [p for p in items if p.get("spec", {}).get("nodeName") == v.lstrip("=")]
        return items

    def _select_events(self, namespace, q):
        """The events of ``namespace``, by the involved object's uid or name."""
        items = [core_view(e) for e in self.events if e["metadata"]["namespace"] == namespace]
        for sel in q.get("fieldSelector", []):
            for clause in sel.split(","):
                k, _, v = clause.partition("=")
                if k == "involvedObject.uid":
                    items = [e for e in items if e["involvedObject"].get("uid") == v]
                elif k == "involvedObject.name":
                    items = [e for e in items if e["involvedObject"].get("name") == v]
        return items

    def _get_pod(self, h, parts):
        """One pod (``.../pods/NAME``) or its log (``.../pods/NAME/log``)."""
        key = (parts[3], parts[5])
        with self.lock:
            pod = self.pods.get(key)
            if pod is None:
                return h._send(404, _status(404, "NotFound", f'pods "{parts[5]}" not found'))
            self._refresh(key)
            if len(parts) == 7 and parts[6] == "log":
                out = b"".join(self.procs[key][1]) if key in self.procs else b""
                return h._send(200, out, "text/plain")
            return h._send(200, pod)

    def _post(self, h):
        u = urlparse(h.path)
        parts = [p for p in u.path.split("/") if p]
        body = json.loads(h.rfile.read(int(h.headers.get("Content-Length", 0))) or b"{}")
        group = len(parts) == 6 and parts[:4] == ["apis", EVENTS_GROUP, "v1", "namespaces"] and parts[5] == "events"
        if group:
            body["metadata"]["namespace"] = parts[4]
            errs = validate_group_event(body)
            if errs:
                return h._send(422, _status(422, "Invalid", f'Event.{EVENTS_GROUP} "{body["metadata"].get("name")}" '
                                                            f"is invalid: {'; '.join(errs)}"))
            parts = ["api", "v1", *parts[3:]]
        if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "events":
            ns, name = parts[3], body["metadata"]["name"]
            body["metadata"].update({"namespace": ns, "uid": f"event-{len(self.events)}",
                                     "resourceVersion": str(len(self.events) + 1)})
            with self.lock:
                if any(e["metadata"]["namespace"] == ns and e["metadata"]["name"] == name for e in self.events):
                    return h._send(409, _status(409, "AlreadyExists", f'events "{name}" already exists'))
                self.events.append(body)
                self.event_writes.append(("create", name))
            return h._send(201, body)
        if len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            ns, name = parts[3], body["metadata"]["name"]
            body["metadata"].update({"namespace": ns, "uid": f"agent-{name}"})
            body["status"] = {"phase": "Pending"}
            with self.lock:
                if (ns, name) in self.pods:
                    return h._send(409, _status(409, "AlreadyExists", f'pods "{name}" already exists'))
                self.pods[(ns, name)] = body
                self.created.append(name)
                self.created_in.append((ns, name))
                if body["spec"].get("nodeName") in self.nodes:
                    self._start(ns, name, body)
            return h._send(201, body)
        return h._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def _patch(self, h):
        """A JSON merge patch of an event (what ``kubectl patch --type merge`` sends), or a strategic merge patch of
        a DaemonSet (what ``kubectl set resources`` sends)."""
        parts = [p for p in urlparse(h.path).path.split("/") if p]
        body = json.loads(h.rfile.read(int(h.headers.get("Content-Length", 0))) or b"{}")
        if len(parts) == 7 and parts[:4] == ["apis", "apps", "v1", "namespaces"] and parts[5] == "daemonsets":
            with self.lock:
                key = (parts[4], parts[6])
                if key not in self.daemonsets:
                    return h._send(404, _status(404, "NotFound", f'daemonsets.apps "{parts[6]}" not found'))
                if "strategic-merge-patch" not in h.headers.get("Content-Type", ""):
                    return h._send(415, _status(415, "UnsupportedMediaType", "the stand-in takes a strategic merge "
                                                                              "patch of a DaemonSet"))
                self.daemonsets[key] = _strategic_merge(self.daemonsets[key], body)
                self.daemonset_patches.append(key)
                return h._send(200, self.daemonsets[key])
        group = len(parts) == 7 and parts[:4] == ["apis", EVENTS_GROUP, "v1", "namespaces"]
        if group:
            parts = ["api", "v1", *parts[3:]]
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "events":
            with self.lock:
                ev = self._event(parts[3], parts[5])
                if ev is None:
                    return h._send(404, _status(404, "NotFound", f'events "{parts[5]}" not found'))
                view = group_view if group else core_view
                new = _merge(view(ev), body)
                errs = validate_group_event(new, view(ev)) if group else []
                if errs:
                    return h._send(422, _status(422, "Invalid", f'Event.{EVENTS_GROUP} "{parts[5]}" is invalid: '
                                                                f"{'; '.join(errs)}"))
                stored = new if ev.get("apiVersion") == new.get("apiVersion") else \
                    (core_view(new) if group else group_view(new))
                ev.clear()
                ev.update(stored)
                self.event_writes.append(("patch", parts[5]))
            return h._send(200, view(ev))
        return h._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def _event(self, namespace: str, name: str) -> dict | None:
        return next((e for e in self.events if e["metadata"]["namespace"] == namespace
                     and e["metadata"]["name"] == name), None)

    def _delete(self, h):
        parts = [p for p in urlparse(h.path).path.split("/") if p]
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            key = (parts[3], parts[5])
            if self.refuse_delete:
                return h._send(403, _status(403, "Forbidden", f'pods "{parts[5]}" is forbidden: cannot delete'))
            with self.lock:
                pod = self.pods.pop(key, None)
                if pod is None:
                    return h._send(404, _status(404, "NotFound", f'pods "{parts[5]}" not found'))
                self.deleted.append(parts[5])
                if key in self.procs and self.procs[key][0].poll() is None:
                    self.procs[key][0].kill()
                if key in self.running:
                    threading.Thread(target=self._stop_pod, args=(key, pod), daemon=True).start()
            return h._send(200, pod)
        return h._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    # -- the kubelet stand-in ------------------------------------------------------------------

    def _start(self, ns, name, pod):
        if pod["spec"].get("initContainers") or len(pod["spec"]["containers"]) > 1:
            self.running[(ns, name)] = {}
            pod["status"] = {"phase": "Pending"}
            threading.Thread(target=self._run_pod, args=(ns, name, pod), daemon=True).start()
            return
        c = pod["spec"]["containers"][0]
        argv = list(c.get("command", [])) + list(c.get("args", []))
        env = {"PATH": self.path_env, "HOME": "/root"}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/")
        out: list[bytes] = []

        def pump():
            for chunk in iter(lambda: proc.stdout.read(65536), b""):
                out.append(chunk)

        threading.Thread(target=pump, daemon=True).start()
        self.procs[(ns, name)] = (proc, out)
        pod["status"] = {"phase": "Running", "containerStatuses": [{"name": c["name"], "state": {"running": {}}}]}

    def _refresh(self, key):
        pod = self.pods[key]
        if key not in self.procs:
            return
        proc = self.procs[key][0]
        rc = proc.poll()
        if rc is not None:
            proc.wait()
            phase = "Succeeded" if rc == 0 else "Failed"
            pod["status"] = {"phase": phase, "containerStatuses": [
                {"name": pod["spec"]["containers"][0]["name"], "state": {"terminated": {"exitCode": rc}}}]}


    def _container(self, pod: dict, c: dict, argv: list[str] | None = None) -> subprocess.Popen:
        """Start container ``c`` of ``pod`` (or ``argv`` in it: a hook), in a session of its own."""
        env = {"PATH": self.path_env, "HOME": "/root"}
        for e in c.get("env", []):
            ref = (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = e.get("value", {"spec.nodeName": pod["spec"].get("nodeName"),
                                             "status.podIP": "127.0.0.1"}.get(ref, ""))
        if argv is None:  # $(VAR) of the container's environment, as the kubelet expands them
            argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
                    for a in list(c.get("command", [])) + list(c.get("args", []))]
        if self.runtime is not None:
            argv = self.runtime(pod, c, argv)
        # SIGTERM ignored by what wraps the container (bwrap, setpriv exec away): what stops it is the command's own
        # handler, as in a container, where the kernel drops a signal its PID 1 does not handle
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
                                start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGTERM,
                                                                                         signal.SIG_IGN))

    def _run_pod(self, ns, name, pod):
        key, logs = (ns, name), {}
        for c in pod["spec"].get("initContainers", []):
            proc = self._container(pod, c)
            logs[c["name"]] = proc.communicate()[0]
            if proc.returncode:
                pod["status"] = {"phase": "Failed", "initContainerStatuses": [
                    {"name": c["name"], "state": {"terminated": {"exitCode": proc.returncode}}}], "logs": logs}
                return
        statuses = []
        for c in pod["spec"]["containers"]:
            proc, out = self._container(pod, c), []
            threading.Thread(target=lambda p=proc, o=out: o.extend(iter(lambda: p.stdout.read(65536), b"")),
                             daemon=True).start()
            self.running[key][c["name"]] = (proc, out)
            statuses.append({"name": c["name"], "state": {"running": {}}})
        pod["status"] = {"phase": "Running", "containerStatuses": statuses}

    def _stop_pod(self, key, pod):
        """Each container's preStop hook, then SIGTERM to its process group; SIGKILL past the grace period."""
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        running = self.running.get(key, {})
        for c in pod["spec"]["containers"]:
            hook = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec")
            if hook and c["name"] in running:
                subprocess.run(self.runtime(pod, c, hook["command"]) if self.runtime else hook["command"],
                               capture_output=True, timeout=grace)
        for proc, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc, _ in running.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.stopped[key] = {n: p.returncode for n, (p, _) in running.items()}

    def logs(self, ns: str, name: str, container: str) -> str:
        """What a container of a pod run whole has printed so far."""
        return b"".join(self.running[(ns, name)][container][1]).decode(errors="replace")

    def wait_stopped(self, ns: str, name: str, timeout: float = 60) -> dict[str, int]:
        """The exit statuses of a deleted pod's containers, once all have ended."""
        deadline = time.monotonic() + timeout
        while (ns, name) not in self.stopped:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {ns}/{name} not stopped within {timeout} s")
            time.sleep(0.1)
        return self.stopped[(ns, name)]


def _strategic_merge(target, patch):
    """A strategic merge patch, as far as a pod template needs it: objects merged key by key (null removes), lists
    of named objects (containers) merged by name, ``$``-directives ($setElementOrder, $patch) left out."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and all(isinstance(x, dict) and "name" in x for x in v) and \
                isinstance(out.get(k), list):
            merged = {x.get("name"): x for x in out[k] if isinstance(x, dict)}
            for x in v:
                merged[x["name"]] = _strategic_merge(merged.get(x["name"], {}), x)
            out[k] = list(merged.values())
        else:
            out[k] = _strategic_merge(out.get(k), v)
    return out


def _merge(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def make_pod(*, name, namespace, uid, node, container_id, running=True, restarts=0, last_exit=None) -> dict:
    cs = {"name": "exporter", "containerID": f"containerd://{container_id}", "image": "nvcr.io/nvidia/exporter:1.5.0",
          "imageID": "sha256:" + "ab" * 32, "restartCount": restarts, "ready": running,
          "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}} if running else
          {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}}}
    if last_exit is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error",
                                          "startedAt": "2025-01-01T00:00:00Z", "finishedAt": "2025-01-01T00:01:00Z"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "ownerReferences": [{"kind": "DaemonSet", "name": "exporter", "uid": "ds-uid-1"}]},
            "spec": {"nodeName": node, "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/exporter:1.5.0"}]},
            "status": {"phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.5", "podIP": "10.1.0.7",
                       "containerStatuses": [cs]}}


def make_daemonset(*, name: str, namespace: str, container: dict) -> dict:
    """A DaemonSet whose pod template has ``container`` (what a pod's ownerReference names)."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "uid": f"ds-uid-{name}"},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}}}


def make_node(name: str, *, ready: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"node-uid-{name}",
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/gpu.present": "true",
                                    "nvidia.com/cuda.driver-version.full": "580.126.09",
                                    "kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"nodeInfo": {"kernelVersion": "6.8.0-1017-nvidia", "containerRuntimeVersion": "containerd://1.7.22",
                                    "kubeletVersion": "v1.32.0", "osImage": "Ubuntu 24.04.1 LTS"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                       "reason": "KubeletReady" if ready else "NodeStatusUnknown"}],
                       "allocatable": {"nvidia.com/gpu": "8"}}}


def make_event(*, namespace, pod, uid, reason, message, time, kind="Warning") -> dict:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod}.{reason}", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": uid},
            "reason": reason, "message": message, "type": kind, "count": 1, "lastTimestamp": time,
            "source": {"component": "kubelet"}}


def write_kubeconfig(path: str, url: str, *, namespace: str = "default", context: str = "standin") -> str:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": context,
           "clusters": [{"name": "standin", "cluster": {"server": url}}],
           "users": [{"name": "standin", "user": {"token": "standin-token"}}],
           "contexts": [{"name": context,
                         "context": {"cluster": "standin", "user": "standin", "namespace": namespace}}]}
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path
