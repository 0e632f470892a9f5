"""Kubernetes manifests of capture, as dicts and YAML (PyYAML's; pure: no I/O).

The short-lived agent pod of ``capture --pod`` (:func:`agent_pod_manifest`), and the node agent's
objects (``forensics agent manifest``, :func:`agent_objects`), in the order ``kubectl apply``
needs them on a fresh cluster:

- the ``Namespace`` (labelled for the privileged pod security level the agent needs: the keeper is a privileged
  container, the only way to write ``kernel.core_pattern``);
- the agent's ``ServiceAccount``, a ``ClusterRole`` with what it uses and nothing more (events.k8s.io
  events: create, patch, get — one ``NativeCrash`` Event per crash on a pod, its series counting repeats; pods:
  get, list — the pod a crash's UID names, on its own node) and its ``ClusterRoleBinding``;
- the ``DaemonSet`` on every GPU node, split by privilege (docs/security.md): an init container copies the
  image's self-contained installation to the host (the kernel runs the core handler there); the ``keeper``
  container, the only privileged one, installs the handler with its disk bounds and restores the previous
  ``core_pattern`` when the pod stops (``forensics agent keep``); the ``agent`` container runs ``forensics agent
  serve`` (on-node analysis, each in a sandbox; the metrics port; Events) unprivileged: no privilege escalation,
  every capability dropped but CAP_SETUID and CAP_SETGID (each analysis drops to an unprivileged uid), a
  read-only root filesystem, writable only in the core directory and an emptyDir of scratch; no hostPID;
- on request, a prometheus-operator ``PodMonitor`` for the metrics port (``--scrape podmonitor``),
  or the ``prometheus.io/*`` scrape annotations on the pods (``--scrape annotations``).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AGENT_NAME", "AGENT_IMAGE", "METRICS_PORT", "AgentUpload", "agent_image", "agent_objects",
           "agent_pod_manifest", "to_yaml", "to_yaml_documents"]


def agent_pod_manifest(*, name: str, namespace: str, node: str, container_id: str | None, core_dir: str, image: str,
                       timeout: float = 300.0, coredump_filter: int | None = None, full: bool = False,
                       pod_uid: str | None = None) -> dict:
    """The short-lived privileged agent pod: pinned to ``node``, hostPID, the core directory as a hostPath.

    Without ``container_id`` (the container is not running: CrashLoopBackOff) the agent arms nothing
    live; it says what the next start of the pod's container will get and brings the recorded crashes.
    """
    args = ["agent", "run", "--core-dir", core_dir]
    args += ["--container-id", container_id] if container_id else ["--waiting"]
    if pod_uid:  # the crashes of earlier containers of the pod (a restart gets a new container ID)
        args += ["--pod-uid", pod_uid]
    if coredump_filter is not None:
        args += ["--coredump-filter", f"0x{coredump_filter:x}"]
    if full:
        args.append("--full")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "forensics-agent",
                                "app.kubernetes.io/managed-by": "forensics"}},
        "spec": {
            "nodeName": node,  # pinned: no scheduler involved
            "hostPID": True,  # /proc shows the node's processes; /proc/1/root is the node's filesystem
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(timeout),
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "agent",
                "image": image,
                "command": ["forensics"],
                "args": args,
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "cores", "mountPath": core_dir}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
            }],
            "volumes": [{"name": "cores", "hostPath": {"path": core_dir, "type": "DirectoryOrCreate"}}],
        },
    }


AGENT_NAME = "forensics-agent"
#: the repository the agent image recipe (``python .ci/image/build.py``) tags its image in; the tag is the version
AGENT_IMAGE = "ghcr.io/forensics/forensics-agent"
METRICS_PORT = 9847
_LABELS = {"app.kubernetes.io/name": AGENT_NAME, "app.kubernetes.io/part-of": "forensics"}


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentUpload:
    """``agent serve --upload``'s settings in the DaemonSet: each analyzed crash's bundle into a bucket.

    Credentials never travel as flags: ``secret`` names a Secret whose keys become the container's environment
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``...), or the service account's annotations give a web
    identity (EKS: ``eks.amazonaws.com/role-arn``).
    """

    url: str  # s3://BUCKET/PREFIX
    cluster: str = "default"
    keep: bool = False
    max_bandwidth: int = 50 << 20  # bytes per second (agent serve's 50M)
    concurrency: int = 4
    max_pending: int = 500  # crashes waiting for the bucket at most (agent serve's --upload-max-pending)
    max_pending_bytes: int = 10 << 30  # their bytes on the node at most (--upload-max-pending-bytes, 10G)
    max_attempts: int = 20  # failed attempts of one crash's upload at most (--upload-max-attempts)
    endpoint_url: str | None = None
    region: str | None = None
    secret: str | None = None

    def serve_args(self) -> list[str]:
        args = ["--upload", self.url, "--cluster", self.cluster, "--upload-max-bandwidth", str(self.max_bandwidth),
                "--upload-concurrency", str(self.concurrency), "--upload-max-pending", str(self.max_pending),
                "--upload-max-pending-bytes", str(self.max_pending_bytes), "--upload-max-attempts",
                str(self.max_attempts)]
        if self.keep:
            args.append("--upload-keep")
        if self.endpoint_url:
            args += ["--endpoint-url", self.endpoint_url]
        if self.region:
            args += ["--region", self.region]
        return args


def agent_image(version: str) -> str:
    """The agent image of forensics ``version``, as the image recipe tags it.

    >>> agent_image("0.1.0")
    'ghcr.io/forensics/forensics-agent:0.1.0'
    """
    return f"{AGENT_IMAGE}:{version}"


def agent_objects(*, core_dir: str, image: str, namespace: str, gpu_label: str, host_prefix: str,
                  bounds: dict[str, int | None] | None = None, scrape: str = "annotations",
                  metrics_port: int = METRICS_PORT, analysis_timeout: int = 300,
                  analysis_memory: int = 1 << 30, analysis_output_max: int = 256 << 20,
                  upload: AgentUpload | None = None,
                  service_account_annotations: dict[str, str] | None = None,
                  image_pull_secrets: tuple[str, ...] = ()) -> list[dict]:
    """Every object the node agent needs, in apply order.

    :param gpu_label: ``KEY=VALUE`` node selector of the GPU nodes
    :param bounds: ``max_core_size``, ``budget``, ``min_free``, ``loop_limit`` for ``--install-handler``
    :param scrape: ``annotations`` (prometheus.io/* on the pods), ``podmonitor`` (a PodMonitor object)
        or ``none``
    :param analysis_memory: bytes one on-node analysis may use (its address space); the container's
        memory limit leaves room above it for the agent itself
    :param analysis_output_max: bytes one on-node analysis may print into its bundle (``agent serve
        --analysis-output-max``; written out, agent serve's default 256M)
    :param upload: each analyzed crash's bundle into a bucket (``agent serve --upload``); None: none
    :param service_account_annotations: on the ServiceAccount (a web identity: EKS's role-arn, GKE's
        workload identity)
    :param image_pull_secrets: Secrets the pods pull the image with (a private registry)

    The namespaced objects are named ``forensics-agent``; the cluster-scoped ones (ClusterRole, ClusterRoleBinding)
    ``NAMESPACE:forensics-agent``, as the chart names them, so that agents in two namespaces never share one.
    """
    if scrape not in ("annotations", "podmonitor", "none"):
        raise ValueError(f"scrape must be annotations, podmonitor or none, not {scrape!r}")
    keep, serve = _agent_commands(core_dir=core_dir, host_prefix=host_prefix, bounds=bounds,
                                  metrics_port=metrics_port, analysis_timeout=analysis_timeout,
                                  analysis_memory=analysis_memory, analysis_output_max=analysis_output_max,
                                  upload=upload)
    pod_meta: dict = {"labels": dict(_LABELS)}
    if scrape == "annotations":
        pod_meta["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port),
                                   "prometheus.io/path": "/metrics"}
    pod_spec = _pod_spec(gpu_label=gpu_label, image=image, host_prefix=host_prefix, core_dir=core_dir,
                         image_pull_secrets=image_pull_secrets, containers=[  # the agent first: `kubectl logs`'s
                             _agent_container(image=image, command=serve, core_dir=core_dir, host_prefix=host_prefix,
                                              metrics_port=metrics_port,
                                              memory_limit=analysis_memory + (512 << 20), upload=upload),
                             _keeper_container(image=image, command=keep, core_dir=core_dir,
                                               host_prefix=host_prefix)])
    objects: list[dict] = [
        *_account_objects(namespace, service_account_annotations),
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": dict(_LABELS)},
         "spec": {"selector": {"matchLabels": dict(_LABELS)}, "updateStrategy": {"type": "RollingUpdate"},
                  "template": {"metadata": pod_meta, "spec": pod_spec}}},
    ]
    if scrape == "podmonitor":
        objects.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": dict(_LABELS)},
            "spec": {"selector": {"matchLabels": dict(_LABELS)},
                     # honorLabels (as kube-state-metrics' own monitor): a crash's namespace/pod/container are the
                     # crashed pod's, never renamed exported_* by the agent pod's target labels
                     "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s",
                                              "honorLabels": True}]},
        })
    return objects


def _agent_commands(*, core_dir: str, host_prefix: str, bounds: dict[str, int | None] | None, metrics_port: int,
                    analysis_timeout: int, analysis_memory: int, analysis_output_max: int,
                    upload: AgentUpload | None) -> tuple[list[str], list[str]]:
    """The keeper's command (``agent keep`` with the handler's bounds) and the agent's (``agent serve``)."""
    handler = f"{host_prefix}/bin/forensics"
    keep = [handler, "agent", "keep", "--core-dir", core_dir]
    for name, v in sorted((bounds or {}).items()):
        if v is not None:
            keep += [f"--{name.replace('_', '-')}", str(int(v))]
    serve = [handler, "agent", "serve", "--core-dir", core_dir, "--metrics-port", str(metrics_port),
             "--metrics-address", "$(POD_IP)", "--node-name", "$(NODE_NAME)", "--analysis-timeout",
             str(analysis_timeout), "--analysis-memory", str(analysis_memory), "--analysis-output-max",
             str(analysis_output_max)]
    if upload is not None:
        serve += upload.serve_args()
    return keep, serve


def _account_objects(namespace: str, service_account_annotations: dict[str, str] | None) -> list[dict]:
    """The Namespace, the agent's ServiceAccount, its ClusterRole (``NAMESPACE:forensics-agent``) and binding."""
    cluster_name = f"{namespace}:{AGENT_NAME}"
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {**_LABELS, "pod-security.kubernetes.io/enforce": "privileged"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": dict(_LABELS),
                      **({"annotations": dict(service_account_annotations)} if service_account_annotations else {})}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": cluster_name, "labels": dict(_LABELS)},
         "rules": [
             {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "get"]},
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_name, "labels": dict(_LABELS)},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
         "subjects": [{"kind": "ServiceAccount", "name": AGENT_NAME, "namespace": namespace}]},
    ]


def _pod_spec(*, gpu_label: str, image: str, host_prefix: str, core_dir: str, image_pull_secrets: tuple[str, ...],
              containers: list[dict]) -> dict:
    """The DaemonSet's pod: on the GPU nodes, the init container that copies the installation to the host, the
    ``containers``, the host's core directory and installation prefix."""
    key, _, value = gpu_label.partition("=")
    return {
        "serviceAccountName": AGENT_NAME,
        **({"imagePullSecrets": [{"name": n} for n in image_pull_secrets]} if image_pull_secrets else {}),
        "automountServiceAccountToken": True,  # Events and pod lookups with its own account
        "nodeSelector": {key: value},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute"},
            {"operator": "Exists", "effect": "NoSchedule"},
        ],
        "priorityClassName": "system-node-critical",
        "terminationGracePeriodSeconds": 30,
        "initContainers": [{
            "name": "install-files",
            "image": image,
            "command": ["sh", "-c", f"cp -a /opt/forensics/. /host{host_prefix}/"],
            "volumeMounts": [{"name": "prefix", "mountPath": f"/host{host_prefix}"}],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        }],
        "containers": containers,
        "volumes": [
            {"name": "cores", "hostPath": {"path": core_dir, "type": "DirectoryOrCreate"}},
            {"name": "prefix", "hostPath": {"path": host_prefix, "type": "DirectoryOrCreate"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }


#: where the agent container may write besides the core directory: its home (kubectl's cache, the analyses' scratch)
AGENT_HOME = "/var/cache/forensics"


def _keeper_container(*, image: str, command: list[str], core_dir: str, host_prefix: str) -> dict:
    """The DaemonSet's one privileged container: ``agent keep`` installs the handler and restores the previous
    core_pattern when the pod stops. It parses nothing a crash controls."""
    return {
        "name": "keeper",
        "image": image,
        "command": command,
        # a privileged container is the one way to write /proc/sys/kernel/core_pattern (the runtime mounts
        # /proc/sys read-only in any other, and its AppArmor profile denies the write)
        "securityContext": {"privileged": True},
        "volumeMounts": [{"name": "cores", "mountPath": core_dir},
                         {"name": "prefix", "mountPath": host_prefix, "readOnly": True}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
    }


def _agent_container(*, image: str, command: list[str], core_dir: str, host_prefix: str, metrics_port: int,
                     memory_limit: int, upload: AgentUpload | None) -> dict:
    """The DaemonSet's unprivileged container: ``agent serve``, each analysis in its sandbox (docs/security.md)."""
    return {
        "name": "agent",
        "image": image,
        "command": command,  # $(NODE_NAME) and $(POD_IP) are the kubelet's expansions
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOME", "value": AGENT_HOME}],
        **({"envFrom": [{"secretRef": {"name": upload.secret}}]}
           if upload is not None and upload.secret else {}),
        "ports": [{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}],
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,  # no_new_privs
            # uid 0 owns the core directory's files (the kernel-run handler writes them); with no capability but
            # these two it reads and writes them by their owner bits only, and drops each analysis to another uid
            "runAsUser": 0,
            "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "cores", "mountPath": core_dir},
                         {"name": "prefix", "mountPath": host_prefix, "readOnly": True},
                         {"name": "scratch", "mountPath": AGENT_HOME}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                      "limits": {"memory": f"{memory_limit >> 20}Mi"}},
        # the process's health (its loop comes round), never a scrape of the metrics (metricsserver.HEALTH_PATH)
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                           "periodSeconds": 30},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                          "periodSeconds": 30, "failureThreshold": 3},
    }


def to_yaml(obj) -> str:
    """``obj`` (dicts, lists, scalars) as YAML through PyYAML's safe dumper: keys in the order given, block style, a
    string quoted wherever YAML would read it as something else (``'true'``, ``'0'``), every control character and
    non-ASCII one escaped in a double-quoted string (nothing raw reaches a terminal), no line folded."""
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, allow_unicode=False, width=1 << 30)


def to_yaml_documents(objects: list[dict]) -> str:
    """Several objects as one multi-document YAML stream (``kubectl apply -f -`` reads them in order)."""
    return "".join("---\n" + to_yaml(o) for o in objects)
