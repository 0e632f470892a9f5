"""The agent image (.ci/image/build.py): built here with mmdebstrap and umoci, then used as the DaemonSet uses it.

The image index (linux/amd64 and linux/arm64) is built once per input into the forensics cache
(tests/agent_image.py). This machine's image is unpacked with umoci and run with bubblewrap as the
container's root (forensics, gdb, zstd, kubectl there); its /opt/forensics is copied out, as the
init container copies it to the host, and its core handler takes a real kernel core from there,
run as the kernel runs it (no environment, no image root).  The arm64 image: test_agent_image_arm64.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from forensics import __version__
from forensics.imports.sources import host_platform
from tests.agent_image import agent_image, unpack

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root and umoci unpack need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("mmdebstrap", "umoci", "bwrap")),
                       reason="mmdebstrap, umoci and bubblewrap build and run the image (bash .ci/setup)"),
]


@pytest.fixture(scope="module")
def image() -> Path:
    return agent_image()


@pytest.fixture(scope="module")
def rootfs(image, tmp_path_factory) -> Path:
    # this machine's image of the index, as its runtime would pull it
    return unpack(image, f"{__version__}-{host_platform().architecture}",
                  tmp_path_factory.mktemp("agent-image") / "bundle")


def _in_image(rootfs: Path, *argv: str) -> subprocess.CompletedProcess:
    cmd = ["bwrap", "--bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
           "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={})


def test_the_image_holds_the_agents_tools_and_is_the_one_the_manifest_names(image, rootfs):
    # the tag is the version the manifest names: an image index of both platforms (each image also tagged alone)
    index = json.loads((image / "index.json").read_text())
    tags = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}
    assert sorted(tags) == sorted([__version__, f"{__version__}-amd64", f"{__version__}-arm64"])
    assert tags[__version__]["mediaType"] == "application/vnd.oci.image.index.v1+json"
    p = _in_image(rootfs, "forensics", "agent", "manifest", "--json")
    assert p.returncode == 0, p.stderr
    ds = next(o for o in json.loads(p.stdout)["manifest"]["items"] if o["kind"] == "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/forensics/forensics-agent:{__version__}"
    # gdb (and libdw), zstd and kubectl are there for the analysis, cores and Events
    for argv, needle in ((("gdb", "--version"), "GNU gdb"), (("zstd", "--version"), "Zstandard"),
                         (("kubectl", "version", "--client"), "Client Version"),
                         (("eu-stack", "--version"), "elfutils"),
                         (("forensics", "--version"), __version__)):
        p = _in_image(rootfs, *argv)
        assert needle in p.stdout + p.stderr, (argv, p.stdout, p.stderr)
    # and the sandbox every analysis runs in sets up there, as agent serve starts it (its interpreter, run by path,
    # with the environment bin/forensics exports): libseccomp2 is in the image
    p = _in_image(rootfs, "env", "PYTHONHOME=/opt/forensics", "PYTHONPATH=/opt/forensics/site-packages",
                  "/opt/forensics/bin/python3.11", "-m", "forensics.sandbox", "--uid", "65532", "--", "sh", "-c",
                  "grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
    assert p.returncode == 0, p.stderr
    status = dict(line.split(":\t") for line in p.stdout.splitlines())
    assert (status["Uid"].split()[0], status["CapEff"], status["NoNewPrivs"], status["Seccomp"]) == (
        "65532", "0000000000000000", "1", "2"), p.stdout


def test_its_forensics_runs_on_the_host_as_the_kernel_runs_the_handler(rootfs, tmp_path, core_pattern):
    """The init container copies /opt/forensics to the host; the kernel runs its core handler there."""
    # GIVEN the installation copied out of the image, as the DaemonSet's init container does
    prefix = tmp_path / "host-prefix"
    shutil.copytree(rootfs / "opt/forensics", prefix, symlinks=True)
    # and a real kernel core of a crashed process
    src = tmp_path / "c.c"
    src.write_text("int main(void) { *(volatile int *)16 = 1; return 0; }\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "crasher"), str(src)], check=True)
    run = tmp_path / "run"
    run.mkdir()
    import resource

    p = subprocess.run([str(tmp_path / "crasher")], cwd=run, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)), capture_output=True)
    assert p.returncode == -signal.SIGSEGV
    (core,) = list(run.iterdir())
    live = subprocess.Popen(["sleep", "60"])
    try:
        # WHEN the copied handler takes it as the kernel runs it: absolute path, no environment, cwd /
        cmd = [str(prefix / "bin/forensics"), "core-handler", str(tmp_path / "cores"), str(live.pid), str(live.pid),
               "11", str(int(time.time())), "18446744073709551615", "--min-free", "0"]
        with open(core, "rb") as f:
            h = subprocess.run(cmd, stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
    finally:
        live.kill()
        live.wait()
    # THEN the core is kept whole, by the image's own interpreter and libraries
    assert h.returncode == 0, h.stderr
    (crash,) = (tmp_path / "cores" / "crashes").iterdir()
    meta = json.loads((crash / "metadata.json").read_text())
    assert meta["core"]["state"] == "kept" and meta["core"]["stream"]["kind"] == "core"
    # and its install command names itself as the handler (the path the kernel will run)
    v = subprocess.run([str(prefix / "bin/forensics"), "--version"], capture_output=True, text=True, env={}, cwd="/")
    assert v.returncode == 0 and __version__ in v.stdout
