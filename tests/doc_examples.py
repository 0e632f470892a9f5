"""Every command example README and docs/ print, and where each is run (#41: "tests that run each example of the
README and docs exactly as printed").

An example is a line of a fenced block that starts with ``forensics`` (or ``sudo forensics``), its trailing
``# comment`` dropped.  Each is one of:

* :class:`Here` -- run as printed by ``tests/integration/test_doc_examples.py``: the exact line, by bash, in a
  directory holding what it names (``core.13540``, ``CORE``, ``BUNDLE``, ``./image``, ``pods.json``...: real
  cores, bundles, images and files made by the test), and where it names a PID, a port or a node's directory
  (``--pid 4242``, ``127.0.0.1:8000``, ``/var/lib/forensics/cores``), inside namespaces of the test's own where
  they are the process's, the port's and the directory's: a PID namespace whose process 4242 is the example's
  target, a network namespace, a mount namespace with a tmpfs on ``/var/lib``;
* :class:`Elsewhere` -- the same command, with that test's own inputs, is run by another test (named);
* :class:`Cannot` -- it cannot run here, and why (a cluster, a bucket at a real endpoint, a GPU, the
  machine-wide ``kernel.core_pattern``); docs/testing.md's table lists them, and ``tests/unit/test_docs.py``
  keeps that table equal to this one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

__all__ = ["Here", "Elsewhere", "Cannot", "EXAMPLES", "printed_examples", "REPO"]


@dataclass(frozen=True)
class Here:
    """Run as printed by test_doc_examples.py; ``how`` names its set-up there."""

    how: str


@dataclass(frozen=True)
class Elsewhere:
    """Run (the same command, with that test's inputs) by ``test``, which spells ``spelled``."""

    test: str
    spelled: str


@dataclass(frozen=True)
class Cannot:
    """Not run here: ``why``."""

    why: str


_CLUSTER = "a Kubernetes cluster (kubectl apply); the objects are checked by tests/unit/test_agent_manifest.py"
_BUCKET = ("a bucket at a real S3 endpoint (s3://crash-bundles); tests/integration/test_objstore.py runs the same "
           "commands against a local SeaweedFS bucket")
_GPU = "a GPU node's libnvidia-ml.so.1 (no --sim); --sim runs the same reproducers here"
_PATTERN = ("the machine-wide kernel.core_pattern, shared with every other test session and CI; "
            "tests/integration/test_agent_pattern.py sets it under the suite's exclusive lock")

EXAMPLES: dict[str, Here | Elsewhere | Cannot] = {
    # README
    "forensics --help": Here("plain"),
    "forensics demo": Elsewhere("tests/integration/test_demo_samples.py", '"demo"'),
    "forensics analyze core.13540": Here("core"),
    "forensics debug core.13540": Here("core"),
    "forensics capture --pid 4242 --core-dir /var/lib/forensics/cores": Here("pid 4242"),
    "forensics agent manifest --core-dir /var/lib/forensics/cores | kubectl apply -f -": Cannot(_CLUSTER),
    "forensics upload --cluster prod /var/lib/forensics/cores/crashes/20261201T162024Z-10620-SIGABRT "
    "s3://crash-bundles/fleet": Cannot(_BUCKET),
    "forensics verify-imports oci:./image:tag": Here("image"),
    "forensics reproduce --sim --sim-fault heap": Here("plain"),
    "forensics report --template nvml -o report-nvml.md analysis.json verify-imports.json reproduce.json BUNDLE":
        Here("evidence"),
    "forensics fleet -n monitoring -l app=nvitop-exporter": Cannot("a Kubernetes cluster's API (kubectl get pods); "
                                                                   "tests/integration/test_fleet.py reads saved "
                                                                   "pods and nodes"),
    "forensics fleet -n monitoring --bundles s3://crash-bundles/fleet": Cannot("a cluster and " + _BUCKET),
    "forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --out SITE_PACKAGES":
        Here("site-packages"),
    "forensics canary http://127.0.0.1:8000/metrics --duration 300 --pid 4242 --fleet baseline.json":
        Here("exporter 4242 dies"),
    # docs/analyze.md
    "forensics analyze CORE": Here("core"),
    "forensics analyze --native CORE": Here("core"),
    "forensics analyze --json CORE | jq .analysis.signature": Here("core"),
    "forensics analyze BUNDLE": Here("bundle"),
    "forensics analyze --sysroot /proc/4242/root CORE": Here("pid 4242"),
    "forensics analyze --sysroot ./rootfs --exe ./rootfs/usr/local/bin/python3.11 CORE": Here("rootfs"),
    "forensics analyze --method direct CORE": Here("core"),
    "forensics analyze --native-method gdb CORE": Here("core"),
    "forensics analyze /var/lib/forensics/cores/": Here("core directory"),
    "forensics analyze /var/lib/systemd/coredump/": Elsewhere("tests/integration/test_coredumpd.py",
                                                              '"analyze"'),
    "forensics analyze --heap CORE": Here("core"),
    "sudo forensics analyze --sandbox BUNDLE": Elsewhere("tests/integration/test_sandbox.py", '"--sandbox"'),
    "forensics analyze --full-paths CORE": Here("core"),
    "forensics debug --sysroot ./rootfs core.13540": Here("rootfs"),
    "forensics debug --print core.13540": Here("core"),
    # docs/capture.md
    "forensics capture --install-handler --core-dir /var/lib/forensics/cores [--max-core-size 8G --budget 100G]":
        Cannot(_PATTERN),
    "forensics capture --uninstall-handler --core-dir /var/lib/forensics/cores": Cannot(_PATTERN),
    "forensics capture --pod exporter-abc -n monitoring [--container exporter] [--dry-run]":
        Elsewhere("tests/integration/test_capture_kube.py", '"--pod"'),
    "forensics capture --pod exporter-abc -n monitoring --agent-namespace forensics":
        Elsewhere("tests/integration/test_capture_kube.py", '"--agent-namespace"'),
    "forensics agent manifest --core-dir /var/lib/forensics/cores [--budget 20G --max-core-size 8G] | "
    "kubectl apply -f -": Cannot(_CLUSTER),
    "forensics agent manifest --json | jq .manifest | kubectl apply -f -": Cannot(_CLUSTER),
    "forensics agent manifest --scrape podmonitor": Here("plain"),
    "forensics agent chart -o ./forensics-agent": Here("plain"),
    "forensics agent serve --core-dir /var/lib/forensics/cores": Here("agent serve"),
    "forensics agent keep --core-dir /var/lib/forensics/cores [--budget 20G]": Cannot(_PATTERN),
    "forensics verify-imports registry.example/forensics-agent:0.1.0 --platform linux/arm64":
        Cannot("an image in a registry on the network (registry.example); "
               "tests/integration/test_verify_imports_platforms.py reads an index with --platform"),
    # docs/fleet-guard-canary.md
    "forensics fleet -n monitoring -l app=nvitop-exporter [--group-by LABEL] [--since baseline.json]":
        Cannot("a Kubernetes cluster's API (kubectl get pods); tests/integration/test_fleet.py runs --group-by "
               "and --since on saved pods and nodes"),
    "forensics fleet --from pods.json --nodes nodes.json --json > baseline.json": Here("fleet files"),
    "forensics fleet --from pods.json --nodes nodes.json --bundles s3://crash-bundles/fleet --bundles "
    "/var/lib/forensics/cores": Cannot(_BUCKET),
    "forensics fleet --prometheus http://prometheus.monitoring:9090 --window 6h [--bearer-token-file F | "
    "--basic-auth U:P] [--ca-file CA] [--deadline 60]":
        Cannot("a cluster's Prometheus (prometheus.monitoring); tests/integration/test_fleet_prometheus.py runs "
               "fleet --prometheus against a real Prometheus here"),
    "forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --env "
    "FORENSICS_GUARD_NVLINK --out SITE_PACKAGES": Here("site-packages"),
    "forensics canary https://10.1.0.7:9400/metrics --ca-file ca.crt --bearer-token-file token --duration 300 "
    "--pod exporter-x1 -n monitoring [--kubeconfig KC --context C]":
        Cannot("a pod of a cluster at its IP; tests/integration/test_canary_prometheus.py runs --ca-file and "
               "--bearer-token-file against a TLS server here"),
    "forensics canary http://127.0.0.1:8000/metrics --interval 0 --concurrency 4 --duration 20 --pid 4242":
        Here("exporter 4242 lives"),
    # docs/report.md
    "forensics report analysis.json verify-imports.json reproduce.json BUNDLE -o report-nvitop.md":
        Here("evidence"),
    "forensics report --template nvml -o report-nvml.md ...": Here("evidence"),
    "forensics report --template binding -o report-binding.md ...": Here("evidence"),
    "forensics report --template runbook -o runbook.md ...": Here("evidence"),
    "forensics report --nvidia-link URL --issue-form bug-report.yaml ...":
        Elsewhere("tests/integration/test_report_upstream.py", '"--nvidia-link"'),
    "forensics report --check report-nvitop.md report-nvml.md": Here("reports"),
    "forensics report --explain --template runbook ...": Here("evidence"),
    # docs/reproduce.md
    "forensics reproduce": Cannot(_GPU),
    "forensics reproduce --nvml /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09": Cannot(_GPU),
    "forensics reproduce --sim --sim-fault heap --sim-fault-thread non-main":
        Elsewhere("tests/integration/test_reproduce_demo.py", '"--sim-fault-thread"'),
    "forensics reproduce --malloc-check": Cannot(_GPU),
    "forensics reproduce --sim --sim-fault heap --arch arm64 --sysroot ROOT":
        Elsewhere("tests/integration/test_simnvml_arm64.py", '"--arch"'),
    # docs/upload.md
    "forensics analyze s3://crash-bundles/fleet/prod/vm/_/_/20261201T162024Z-unknown-10620-SIGABRT/":
        Cannot(_BUCKET),
    "forensics report --template nvml s3://crash-bundles/fleet/prod/vm/_/_/20261201T162024Z-unknown-10620-SIGABRT/":
        Cannot(_BUCKET),
    "forensics analyze s3://crash-bundles/fleet/prod/vm/": Cannot(_BUCKET),
    # docs/verify-imports.md
    'forensics verify-imports docker-archive:exporter.tar --entrypoint "python3 -m nvitop_exporter"':
        Here("image"),
    "forensics verify-imports 127.0.0.1:5000/monitoring/exporter:1.7.1 --creds user:pass --tls-verify=false":
        Elsewhere("tests/integration/test_verify_imports_registry.py", '"--creds"'),
    "forensics verify-imports --pid 4242 [--execute]": Elsewhere("tests/integration/test_verify_imports_pid.py",
                                                                 '"--pid"'),
    "forensics verify-imports 127.0.0.1:5000/forensics-agent:1.7.1 --platform linux/arm64":
        Elsewhere("tests/integration/test_verify_imports_platforms.py", '"--platform"'),
    "forensics verify-imports dir:./bundle": Elsewhere("tests/integration/test_verify_imports.py", '"dir:'),
    'forensics verify-imports dir:./rootfs --entrypoint "python3 -m nvitop_exporter" --workdir /app':
        Elsewhere("tests/integration/test_verify_imports.py", '"dir:'),
}


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def printed_examples() -> dict[str, list[str]]:
    """``{example: [pages printing it]}``: each line of a fenced block that runs forensics, its comment dropped."""
    out: dict[str, list[str]] = {}
    for page in pages():
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                text = re.sub(r"\s+#\s.*$", "", line).strip()
                if re.match(r"(sudo )?forensics( |$)", text):
                    out.setdefault(text, []).append(page.name)
    return out
