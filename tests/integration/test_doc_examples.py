"""Each example README and docs/ print that can run here, run exactly as printed (tests/doc_examples.py: `Here`).

The line is given to bash as it is, in a directory holding what it names: real kernel cores as ``core.13540`` and
``CORE``, a capture bundle the real core handler wrote as ``BUNDLE``, an image as ``./image:tag`` and
``exporter.tar``, the demo's committed evidence (``analysis.json`` ...; ``...`` in an example stands for them), saved
pods and nodes, a site-packages holding nvitop as ``SITE_PACKAGES``.  Where it names a PID, a port or a node's
directory, it runs in PID, network and mount namespaces of the test's own (``unshare``, as root): process 4242 is
the example's target (the exporter a canary scrapes, the process capture arms), 127.0.0.1:8000 is that
exporter's, and ``/var/lib`` is a tmpfs holding ``/var/lib/forensics/cores``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.doc_examples import EXAMPLES, Here

from .test_verify_imports_helpers import (base_blob, host_python, image_config, make_blob, site_layer, wheel,
                                          write_docker_archive, write_oci)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "reports" / "demo"
BIN = Path(sys.executable).parent
HERE = sorted(e for e, w in EXAMPLES.items() if isinstance(w, Here))
NAMESPACED = {"pid 4242", "core directory", "agent serve", "exporter 4242 dies", "exporter 4242 lives"}
#: the demo's evidence, for `...`
EVIDENCE = "analysis.json verify-imports.json reproduce.json BUNDLE"

#: what each example must do: its exit statuses and a line (part) of its output
EXPECT: dict[str, tuple[tuple[int, ...], str]] = {
    "forensics --help": ((0,), "Commands:"),
    "forensics analyze core.13540": ((0,), 'SIGABRT "double free or corruption (!prev)"'),
    "forensics debug core.13540": ((0,), "[Current thread is "),
    "forensics debug --print core.13540": ((0,), "-c "),
    "forensics debug --sysroot ./rootfs core.13540": ((0,), "[Current thread is "),
    "forensics capture --pid 4242 --core-dir /var/lib/forensics/cores": ((0, 4), "4242"),
    "forensics verify-imports oci:./image:tag": ((0,), "result: OK"),
    'forensics verify-imports docker-archive:exporter.tar --entrypoint "python3 -m nvitop_exporter"':
        ((0,), "result: OK"),
    "forensics reproduce --sim --sim-fault heap": ((3,), "conclusion: both reproducers failed"),
    "forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --out SITE_PACKAGES":
        ((0,), "turns the guard off"),
    "forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --env "
    "FORENSICS_GUARD_NVLINK --out SITE_PACKAGES": ((0,), "FORENSICS_GUARD_NVLINK=0 turns the guard off"),
    "forensics canary http://127.0.0.1:8000/metrics --duration 300 --pid 4242 --fleet baseline.json":
        ((3,), "stopped early: "),
    "forensics canary http://127.0.0.1:8000/metrics --interval 0 --concurrency 4 --duration 20 --pid 4242":
        ((0,), "PASS: http://127.0.0.1:8000/metrics: "),
    "forensics analyze CORE": ((0,), 'SIGABRT "double free or corruption (!prev)"'),
    "forensics analyze --native CORE": ((0,), "(Python) query_nvlink_throughput_counters"),
    "forensics analyze --json CORE | jq .analysis.signature": ((0,), '"SIGABRT \\"double free'),
    "forensics analyze BUNDLE": ((0,), 'SIGABRT "double free or corruption (!prev)"'),
    "forensics analyze --sysroot /proc/4242/root CORE": ((0,), 'SIGABRT "double free or corruption (!prev)"'),
    "forensics analyze --sysroot ./rootfs --exe ./rootfs/usr/local/bin/python3.11 CORE":
        ((0,), 'SIGABRT "double free or corruption (!prev)"'),
    "forensics analyze --method direct CORE": ((0,), "Python by direct"),
    "forensics analyze --native-method gdb CORE": ((0,), "native by gdb"),
    "forensics analyze /var/lib/forensics/cores/": ((0,), "2 cores analyzed"),
    "forensics analyze --heap CORE": ((0,), "Heap"),
    "forensics analyze --full-paths CORE": ((0,), "/tests/crashers/exporter.py:"),
    "forensics agent manifest --scrape podmonitor": ((0,), "kind: PodMonitor"),
    "forensics agent chart -o ./forensics-agent": ((0,), "Wrote ./forensics-agent"),
    "forensics agent serve --core-dir /var/lib/forensics/cores": ((0,), ""),
    "forensics fleet --from pods.json --nodes nodes.json --json > baseline.json": ((0,), ""),
    "forensics report --template nvml -o report-nvml.md analysis.json verify-imports.json reproduce.json BUNDLE":
        ((0,), "Wrote report-nvml.md"),
    "forensics report analysis.json verify-imports.json reproduce.json BUNDLE -o report-nvitop.md":
        ((0,), "Wrote report-nvitop.md"),
    "forensics report --template nvml -o report-nvml.md ...": ((0,), "Wrote report-nvml.md"),
    "forensics report --template binding -o report-binding.md ...": ((0,), "Wrote report-binding.md"),
    "forensics report --template runbook -o runbook.md ...": ((0,), "Wrote runbook.md"),
    "forensics report --check report-nvitop.md report-nvml.md": ((0,), "report-nvml.md: OK"),
    "forensics report --explain --template runbook ...": ((0,), ""),
}


def test_every_example_run_here_has_its_expectation():
    assert sorted(set(HERE) ^ set(EXPECT)) == []


def _copy_core(core: Path, cwd: Path, *names: str) -> None:
    for name in names:
        shutil.copyfile(core, cwd / name)


def _evidence(cwd: Path) -> None:
    for name in ("analysis.json", "verify-imports.json", "reproduce.json"):
        shutil.copyfile(DEMO / name, cwd / name)
    (bundle,) = (DEMO / "capture").iterdir()
    shutil.copytree(bundle, cwd / "BUNDLE", symlinks=True)


def _bundle(core: Path, cwd: Path) -> None:
    """BUNDLE: what the real core handler keeps of the core, fed to it as the kernel does."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(core, "rb") as f:
            p = subprocess.run([str(BIN / "forensics"), "core-handler", str(cwd / "node"), str(sleeper.pid),
                                str(sleeper.pid), "6", str(int(time.time())), "18446744073709551615", "--min-free",
                                "0"], stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=300)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert p.returncode == 0, p.stderr
    (crash,) = (cwd / "node" / "crashes").iterdir()
    (cwd / "BUNDLE").symlink_to(crash)


def _image(cwd: Path) -> None:
    blobs = [base_blob(), make_blob(site_layer().tar_bytes(), cwd / ".blobs"),
             make_blob(_layer_srv(), cwd / ".blobs")]
    config = image_config(blobs, entrypoint=["python3", "-m", "nvitop_exporter"], workdir="/srv")
    write_oci(cwd / "image", blobs, config, tag="tag")
    write_docker_archive(cwd / "exporter.tar", blobs, config)


def _layer_srv() -> bytes:
    from .test_verify_imports_helpers import Layer

    return Layer().dir("/srv").tar_bytes()


def _rootfs(cwd: Path) -> None:
    """./rootfs: the synthetic images' base layer, unpacked: this machine's CPython 3.11 and its libraries."""
    with tarfile.open(base_blob().data_path) as t:
        t.extractall(cwd / "rootfs", filter="tar")


def _fleet_files(cwd: Path) -> None:
    from tests.fleetgen import incident_fleet

    pods, nodes = incident_fleet()
    (cwd / "pods.json").write_text(json.dumps(pods))
    (cwd / "nodes.json").write_text(json.dumps(nodes))


def _site_packages(cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(cwd / "SITE_PACKAGES"), str(wheel("nvitop", "1.7.1"))], check=True, capture_output=True,
                   timeout=300)


def _namespaced(example: str, target: str) -> list[str]:
    """The example run in PID, network and mount namespaces of its own: ``target`` started as process 4242, the
    loopback up (127.0.0.1:8000 is free there), a tmpfs on /var/lib holding /var/lib/forensics/cores."""
    script = "\n".join([
        "set -e", "ip link set lo up", "mount -t tmpfs tmpfs /var/lib", "mkdir -p /var/lib/forensics/cores",
        "cp -a ./cores/. /var/lib/forensics/cores/ 2>/dev/null || true",
        "echo 4241 > /proc/sys/kernel/ns_last_pid",  # the next process made is 4242
        f"{target} &",
        '[ "$!" = 4242 ] || { echo "the target is process $!, not 4242" >&2; exit 99; }',
        "for i in $(seq 100); do [ -e ready ] && break; sleep 0.1; done",
        "set +e", example,
    ])
    return ["unshare", "--pid", "--fork", "--net", "--mount", "--mount-proc", "--propagation", "private",
            "bash", "-c", script]


def _exporter(lives: float) -> str:
    """An exporter on 127.0.0.1:8000 for ``lives`` seconds (then it is gone, as a crashed one is); ready once it
    wrote ./ready."""
    return f"timeout {lives} {sys.executable} -m tests.expo_server ready --port 8000"


@pytest.fixture(scope="module")
def core(cores, newest_python) -> Path:
    return cores.get(newest_python, "heap-prev")


@pytest.mark.parametrize("example", HERE, ids=lambda e: e[:90])
def test_the_example_runs_as_printed(example, core, cores, newest_python, tmp_path):  # noqa: C901 -- one set-up per kind
    how = EXAMPLES[example].how
    cwd = tmp_path
    if how in NAMESPACED and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("needs root and unshare: the example names a PID, a port or a node's directory")
    if "| jq" in example and shutil.which("jq") is None:
        pytest.skip("jq is not installed (the example pipes into it)")
    # GIVEN a directory holding what the example names
    target = "sh -c 'touch ready; exec sleep 120'"
    timeout = 600
    if how in ("core", "pid 4242"):
        _copy_core(core, cwd, "core.13540", "CORE")
        if how == "pid 4242":
            target = f"{host_python() or sys.executable} -c 'import time; open(\"ready\", \"w\"); time.sleep(120)'"
    elif how == "rootfs":
        if host_python() is None:
            pytest.skip("CPython 3.11 (pyenv) not found: ./rootfs holds it")
        _copy_core(cores.get("3.11", "heap-prev"), cwd, "core.13540", "CORE")
        _rootfs(cwd)
    elif how == "bundle":
        _bundle(core, cwd)
    elif how == "core directory":
        (cwd / "cores").mkdir()
        _copy_core(core, cwd / "cores", "core.13540")
        _copy_core(cores.get(newest_python, "segv"), cwd / "cores", "core.4242")
    elif how == "image":
        if host_python() is None:
            pytest.skip("CPython 3.11 (pyenv) not found: the image's interpreter is a copy of it")
        _image(cwd)
    elif how in ("evidence", "reports"):
        _evidence(cwd)
        if how == "reports":
            for p in DEMO.glob("report-*"):
                (shutil.copytree if p.is_dir() else shutil.copyfile)(p, cwd / p.name)
    elif how == "fleet files":
        _fleet_files(cwd)
    elif how == "site-packages":
        _site_packages(cwd)
    elif how.startswith("exporter 4242"):
        _fleet_files(cwd)
        subprocess.run(["bash", "-c", "forensics fleet --from pods.json --nodes nodes.json --json > baseline.json"],
                       cwd=cwd, check=True, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}, timeout=120)
        target = _exporter(4 if how.endswith("dies") else 60)
    line = example.replace("...", EVIDENCE)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    # WHEN it runs exactly as printed
    if how == "agent serve":
        cmd = _namespaced(f"( {line} ) & agent=$!; sleep 8; kill -TERM $agent; wait $agent", target)
    elif how in NAMESPACED:
        cmd = _namespaced(line, target)
    else:
        cmd = ["bash", "-c", line]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    out = p.stdout + p.stderr
    # THEN it does what the page says
    codes, says = EXPECT[example]
    assert p.returncode in codes, out[-3000:]
    assert says in out, out[-3000:]
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    if "--duration 20" in example:
        assert took >= 19, took  # the load test runs for its duration
    if example.endswith("> baseline.json"):
        assert json.loads((cwd / "baseline.json").read_text())["command"] == "fleet"
    if how == "agent serve":
        assert "error" not in p.stderr, p.stderr


def test_namespaced_examples_see_their_own_process_4242(tmp_path):
    # the namespace set-up itself: process 4242 is the target, and nothing of the machine's /var/lib is touched
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    p = subprocess.run(_namespaced("cat /proc/4242/cmdline | tr '\\0' ' '; ls /var/lib",
                                   "sh -c 'touch ready; exec sleep 30'"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("sleep 30"), p.stdout + p.stderr
    assert p.stdout.split()[-1] == "forensics"  # the tmpfs: only what the set-up made
