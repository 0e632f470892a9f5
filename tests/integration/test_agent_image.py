"""The agent image (.ci/image/build.py): built here with mmdebstrap and umoci, then used as the DaemonSet uses it.

The image is built once per input (the recipe, the package's files) into the forensics cache, under
a lock, renamed into place. Its root is unpacked with umoci and run with bubblewrap as the
container's root (forensics, gdb, zstd, kubectl there); its /opt/forensics is copied out, as the
init container copies it to the host, and its core handler takes a real kernel core from there,
run as the kernel runs it (no environment, no image root).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forensics import __version__
from forensics.cache import cache_dir

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root and umoci unpack need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("mmdebstrap", "umoci", "bwrap")),
                       reason="mmdebstrap, umoci and bubblewrap build and run the image (bash .ci/setup)"),
]


def _inputs_key() -> str:
    h = hashlib.sha256()
    for p in sorted([ROOT / ".ci/image/build.py", ROOT / "pyproject.toml", *(ROOT / "forensics").rglob("*.py"),
                     *(ROOT / "forensics").rglob("*.j2"), *(ROOT / "forensics").rglob("*.json"),
                     *(ROOT / "gdb_scripts").rglob("*"), *(ROOT / "reproducers").rglob("*")]):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def image() -> Path:
    images = cache_dir() / "images"
    images.mkdir(parents=True, exist_ok=True)
    final = images / f"agent-{_inputs_key()}"
    if not (final / "index.json").is_file():
        with open(images / ".agent.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / "index.json").is_file():
                tmp = images / f".tmp-agent-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                p = subprocess.run([sys.executable, str(ROOT / ".ci/image/build.py"), "--out", str(tmp)],
                                   capture_output=True, text=True, timeout=1800)
                if p.returncode:
                    shutil.rmtree(tmp, ignore_errors=True)
                    if "RootUnavailable" in p.stderr or "cannot read" in p.stderr:
                        pytest.skip(f"no Debian mirror to build the image from: {p.stderr.strip()[-300:]}")
                    raise AssertionError(p.stderr[-3000:])
                os.rename(tmp, final)
                # images of older inputs: keep the newest two (another test run may be reading one)
                old = sorted((p for p in images.glob("agent-*") if p != final), key=lambda p: p.stat().st_mtime)
                for p in old[:-1]:
                    shutil.rmtree(p, ignore_errors=True)
    return final


@pytest.fixture(scope="module")
def rootfs(image, tmp_path_factory) -> Path:
    bundle = tmp_path_factory.mktemp("agent-image") / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{image}:{__version__}", str(bundle)],
                   check=True, capture_output=True)
    return bundle / "rootfs"


def _in_image(rootfs: Path, *argv: str) -> subprocess.CompletedProcess:
    cmd = ["bwrap", "--bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
           "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={})


def test_the_image_holds_the_agents_tools_and_is_the_one_the_manifest_names(image, rootfs):
    # the tag is the version the manifest names, the entrypoint forensics
    index = json.loads((image / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == [__version__]
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
