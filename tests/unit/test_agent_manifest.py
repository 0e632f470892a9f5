"""`forensics agent manifest`: every object it emits validates against the Kubernetes schemas (kubernetes-validate),
in an order `kubectl apply` accepts on a fresh cluster; YAML and --json say the same."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from forensics.cli import cli

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate")
yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate depends on it)")


def _objects(*args: str) -> list[dict]:
    r = CliRunner().invoke(cli, ["agent", "manifest", "--json", *args])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["command"] == "agent-manifest" and doc["manifest"]["kind"] == "List"
    return doc["manifest"]["items"]


@pytest.mark.parametrize("scrape", ["annotations", "podmonitor", "none"])
def test_every_object_validates_against_the_kubernetes_schemas(scrape):
    objects = _objects("--scrape", scrape)
    version = kubernetes_validate.latest_version()
    for obj in objects:
        if obj["kind"] == "PodMonitor":
            continue  # a prometheus-operator CRD: no Kubernetes schema; checked below
        kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError
    kinds = [o["kind"] for o in objects]
    # a fresh cluster: the namespace first, the account before the pods that use it
    assert kinds[:5] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]
    assert ("PodMonitor" in kinds) == (scrape == "podmonitor")


def test_yaml_and_json_are_the_same_objects():
    r = CliRunner().invoke(cli, ["agent", "manifest", "--scrape", "podmonitor"])
    assert r.exit_code == 0
    assert [d for d in yaml.safe_load_all(r.stdout) if d] == _objects("--scrape", "podmonitor")


def test_rbac_metrics_port_and_resources():
    objects = {o["kind"]: o for o in _objects("--metrics-port", "9999", "--scrape", "podmonitor")}
    rules = {r["resources"][0]: set(r["verbs"]) for r in objects["ClusterRole"]["rules"]}
    assert rules == {"events": {"create", "patch", "get"}, "pods": {"get", "list"}}
    binding = objects["ClusterRoleBinding"]["subjects"][0]
    assert (binding["name"], binding["namespace"]) == (objects["ServiceAccount"]["metadata"]["name"], "forensics")
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == binding["name"] and pod["automountServiceAccountToken"] is True
    agent, _keeper = pod["containers"]
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9999, "protocol": "TCP"}]
    assert agent["resources"]["requests"] and agent["resources"]["limits"]["memory"] == "1536Mi"
    assert agent["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the PodMonitor (prometheus-operator's CRD, required: spec.selector; each endpoint a port name and an
    # interval in its Duration format) selects these pods by their labels and scrapes the named port
    pm = objects["PodMonitor"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["metadata"]["namespace"] == "forensics"
    labels = objects["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics"
    assert ep["honorLabels"] is True  # a crash's namespace/pod/container over the agent pod's target labels
    assert re.fullmatch(r"(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)",
                        ep["interval"])
    annotated = {o["kind"]: o for o in _objects("--scrape", "annotations")}
    ann = annotated["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    assert ann == {"prometheus.io/scrape": "true", "prometheus.io/port": "9847", "prometheus.io/path": "/metrics"}


def _containers(objects: dict) -> dict[str, dict]:
    return {c["name"]: c for c in objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]}


def test_the_containers_run_commands_forensics_accepts():
    """The keeper installs the handler with the bounds asked for; the agent runs `agent serve`: both parse."""
    from forensics.commands.agent import agent

    containers = _containers({o["kind"]: o for o in _objects("--budget", "50G", "--loop-limit", "3",
                                                             "--analysis-output-max", "64M")})
    keep = containers["keeper"]["command"]
    assert keep[1:3] == ["agent", "keep"]
    kctx = agent.get_command(agent.make_context("agent", keep[2:], resilient_parsing=True), "keep").make_context(
        "keep", keep[3:])
    assert kctx.params["core_dir"] == "/var/lib/forensics/cores"
    assert (kctx.params["budget"], kctx.params["max_core_size"], kctx.params["loop_limit"]) == (50 << 30, 8 << 30, 3)
    assert kctx.params["min_free"] is None  # not asked: the handler's default
    sargv = containers["agent"]["command"]
    assert sargv[1:3] == ["agent", "serve"]
    ctx = agent.make_context("agent", sargv[2:], resilient_parsing=True)
    sub = agent.get_command(ctx, "serve")
    sctx = sub.make_context("serve", sargv[3:])
    assert sctx.params["metrics_port"] == 9847 and sctx.params["node_name"] == "$(NODE_NAME)"
    assert sctx.params["analysis_output_max"] == 64 << 20
    # agent serve's default, written out when not asked for
    sargv = _containers({o["kind"]: o for o in _objects()})["agent"]["command"]
    assert sargv[sargv.index("--analysis-output-max") + 1] == str(256 << 20)


@pytest.mark.parametrize("args", [(), ("--upload", "s3://crash-bundles/gpu", "--upload-secret", "s3", "--scrape",
                                        "podmonitor")], ids=["defaults", "upload"])
def test_privilege_only_in_the_keeper_which_parses_nothing(args):
    """#37: `privileged: true` on no container but the keeper; the agent that analyzes runs unprivileged, with only
    the capabilities its analyses' drop needs, and nothing in the pod shares the node's processes."""
    objects = {o["kind"]: o for o in _objects(*args)}
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    every = pod["containers"] + pod["initContainers"]
    assert [c["name"] for c in every if (c.get("securityContext") or {}).get("privileged")] == ["keeper"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    sc = _containers(objects)["agent"]["securityContext"]
    assert sc == {"privileged": False, "allowPrivilegeEscalation": False, "runAsUser": 0,
                  "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}, "readOnlyRootFilesystem": True,
                  "seccompProfile": {"type": "RuntimeDefault"}}
    # writable only where it writes: the core directory and its scratch; the installation the kernel runs read-only
    mounts = {m["name"]: m for m in _containers(objects)["agent"]["volumeMounts"]}
    assert [n for n, m in mounts.items() if not m.get("readOnly")] == ["cores", "scratch"]
    assert mounts["prefix"]["readOnly"] is True
    assert {"name": "scratch", "emptyDir": {}} in pod["volumes"]
    # the keeper runs the host's copy of forensics (the pattern names that path) and needs no write to it either
    assert {m["name"]: m.get("readOnly", False) for m in _containers(objects)["keeper"]["volumeMounts"]} == {
        "cores": False, "prefix": True}


def test_upload_settings_reach_agent_serve_and_credentials_never_travel_as_flags():
    """--upload and its settings become `agent serve` flags it parses back to the same values; the credentials come
    from a Secret (envFrom) or the service account's web identity, never a flag."""
    from forensics.commands.agent import agent

    role_key, role = "eks.amazonaws.com/role-arn", "arn:aws:iam::1:role/f"
    # GIVEN an upload to a MinIO bucket with a Secret of keys, and an EKS role on the service account
    objects = {o["kind"]: o for o in _objects(
        "--upload", "s3://crash-bundles/gpu", "--upload-keep", "--cluster", "prod-eu", "--upload-max-bandwidth", "10M",
        "--upload-concurrency", "2", "--upload-max-pending", "40", "--upload-max-pending-bytes", "3G",
        "--endpoint-url", "http://127.0.0.1:9000", "--region", "eu-west-1",
        "--upload-secret", "s3-creds", "--service-account-annotation", f"{role_key}={role}")}
    agent_c = _containers(objects)["agent"]
    serve = agent_c["command"]
    # WHEN agent serve parses its command line
    sub = agent.get_command(agent.make_context("agent", serve[2:], resilient_parsing=True), "serve")
    params = sub.make_context("serve", serve[3:]).params
    # THEN it uploads as asked
    assert (params["upload_url"], params["upload_keep"]) == ("s3://crash-bundles/gpu", True)
    assert params["cluster"] == "prod-eu"
    assert (params["upload_max_bandwidth"], params["upload_concurrency"]) == (10 << 20, 2)
    assert (params["upload_max_pending"], params["upload_max_pending_bytes"]) == (40, 3 << 30)
    assert (params["endpoint_url"], params["region"]) == ("http://127.0.0.1:9000", "eu-west-1")
    assert agent_c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert objects["ServiceAccount"]["metadata"]["annotations"] == {role_key: role}
    version = kubernetes_validate.latest_version()
    for kind in ("DaemonSet", "ServiceAccount"):
        kubernetes_validate.validate(objects[kind], version, strict=True)
    # and a URL that is no bucket is a usage error, not a manifest
    r = CliRunner().invoke(cli, ["agent", "manifest", "--upload", "http://127.0.0.1/x"])
    assert r.exit_code == 2 and "not an object URL" in r.output


def test_the_yaml_is_pyyamls_and_reads_back_to_the_json_objects():
    # GIVEN the manifest of an image whose name carries a terminal escape and a bidi override
    import yaml

    image = "registry.local/forensics\x1b[31m\u202e:1"
    r = CliRunner().invoke(cli, ["agent", "manifest", "--image", image])
    assert r.exit_code == 0, r.output
    # THEN nothing raw reaches the terminal, and the YAML reads back to the objects --json gives
    assert "\x1b" not in r.output and "\u202e" not in r.output and "\\e[31m" in r.output
    assert list(yaml.safe_load_all(r.output)) == _objects("--image", image)


def test_sizes_are_binary_in_every_form_and_a_bad_one_is_a_usage_error():
    # GIVEN the same budget written three ways, and a pull secret
    def keeper_budget(*args: str) -> str:
        ds = next(o for o in _objects(*args) if o["kind"] == "DaemonSet")
        keep = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "keeper")["command"]
        return keep[keep.index("--budget") + 1]

    # THEN 2G, 2Gi and 2GiB are 2 << 30 bytes, as the chart renders them (test_helm_chart)
    assert {keeper_budget("--budget", form) for form in ("2G", "2Gi", "2GiB")} == {str(2 << 30)}
    ds = next(o for o in _objects("--image-pull-secret", "regcred") if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    # AND a size of another form is click's usage error, naming the forms
    r = CliRunner().invoke(cli, ["agent", "manifest", "--budget", "50X"])
    assert r.exit_code == 2 and "'50X' is not a size" in r.output and "Ki, Mi, Gi, Ti" in r.output, r.output
