"""The agent's arm64 image, run on this x86-64 machine under qemu-user: the node side of a GH200/GB200 node.

The image index of .ci/image/build.py (tests/agent_image.py) holds a linux/arm64 image whose userland
is Debian's arm64 packages (installed whole under qemu-user through binfmt_misc) and whose
/opt/forensics is the same pure-Python forensics wheel with aarch64 binary wheels under an aarch64
CPython and loader.  Its root is unpacked with umoci and run with bubblewrap as ``/``; its aarch64
programs run through the kernel's binfmt_misc entry of qemu-aarch64-static, as the image's own shell
script (``/opt/forensics/bin/forensics``) execs its loader.  The core handler takes a guest core that
qemu-user wrote of an arm64 CPython that crashed (qemu-user cannot be the kernel's core_pattern pipe
for a guest: the core goes to the handler on stdin, with the kernel's arguments), and ``agent serve``
answers /healthz and /metrics on 127.0.0.1.  verify-imports reads each image of the index.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import zstandard

from forensics import __version__
from forensics.bundle.layout import CORE_DIR, CORE_WHOLE
from forensics.imports.sources import host_platform
from tests.agent_image import agent_image, unpack
from tests.roots import emulation_problem, sandbox_command

EM_AARCH64, EM_X86_64 = 183, 62
QEMU_IN_ROOT = "/run/qemu-aarch64-static"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root and umoci unpack need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("mmdebstrap", "umoci", "bwrap", "skopeo")),
                       reason="mmdebstrap, umoci, skopeo and bubblewrap build, read and run the image "
                              "(bash .ci/setup)"),
    pytest.mark.skipif(emulation_problem("arm64") is not None,
                       reason=f"arm64 programs cannot run here: {emulation_problem('arm64')}"),
]


@pytest.fixture(scope="module")
def image() -> Path:
    return agent_image()


@pytest.fixture(scope="module")
def roots(image, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("agent-images")
    return {arch: unpack(image, f"{__version__}-{arch}", base / arch) for arch in ("amd64", "arm64")}


def _machine(path: Path) -> int | None:
    with open(path, "rb") as f:
        head = f.read(20)
    return int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" else None


def _in_image(root: Path, *argv: str, cwd: Path, binds=(), timeout: float = 300, stdin=None):
    """``argv`` in the image's root as ``/`` (read-only), no environment but PATH, as a container runs it."""
    cmd = sandbox_command(root, list(argv), cwd=cwd, binds=tuple(binds))
    return subprocess.run(cmd, capture_output=True, text=stdin is None, timeout=timeout, env={}, stdin=stdin)


def test_the_index_holds_both_platforms_and_the_same_forensics(image, roots):
    # GIVEN the index: skopeo (the oracle) picks each platform's image from it, and each config says its platform
    index = json.loads(subprocess.run(["skopeo", "inspect", "--raw", f"oci:{image}:{__version__}"],
                                      capture_output=True, check=True).stdout)
    assert {(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]} == {
        ("linux", "amd64"), ("linux", "arm64")}
    for arch in ("amd64", "arm64"):
        cfg = json.loads(subprocess.run(["skopeo", "inspect", "--config", "--override-arch", arch,
                                         f"oci:{image}:{__version__}"], capture_output=True, check=True).stdout)
        assert (cfg["os"], cfg["architecture"]) == ("linux", arch)
        assert cfg["config"]["Entrypoint"] == ["/opt/forensics/bin/forensics"]
    # THEN every ELF file of each /opt/forensics is of its architecture (interpreter, loader, libraries, wheels)
    for arch, want in (("amd64", EM_X86_64), ("arm64", EM_AARCH64)):
        opt = roots[arch] / "opt/forensics"
        machines = {p.relative_to(opt).as_posix(): _machine(p) for p in opt.rglob("*")
                    if p.is_file() and not p.is_symlink() and _machine(p) is not None}
        assert len(machines) > 20 and set(machines.values()) == {want}, (arch, set(machines.values()))
        assert (opt / ("lib/ld-linux-aarch64.so.1" if arch == "arm64" else "lib/ld-linux-x86-64.so.2")).is_file()
        # and the userland's gdb is Debian's arm64 build
        assert _machine(roots[arch] / "usr/bin/gdb") == want
    # and the forensics package is one wheel: the same bytes in both images
    def digest(arch: str) -> dict[str, str]:
        pkg = roots[arch] / "opt/forensics/site-packages/forensics"
        return {p.relative_to(pkg).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    amd, arm = digest("amd64"), digest("arm64")
    assert len(amd) > 100 and amd == arm


def test_the_arm64_images_tools_run_under_qemu(roots, tmp_path):
    root = roots["arm64"]
    for argv, needle in ((("forensics", "--version"), __version__), (("gdb", "--version"), "GNU gdb"),
                         (("eu-stack", "--version"), "elfutils"), (("zstd", "--version"), "Zstandard"),
                         (("kubectl", "version", "--client"), "Client Version"),
                         (("uname", "-m"), "aarch64")):
        p = _in_image(root, *argv, cwd=tmp_path)
        assert needle in p.stdout + p.stderr, (argv, p.stdout, p.stderr)
    # forensics itself sees an aarch64 machine (qemu-user), and the manifest it writes names the version's image
    p = _in_image(root, "forensics", "agent", "manifest", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ds = next(o for o in json.loads(p.stdout)["manifest"]["items"] if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f"forensics-agent:{__version__}")


@pytest.fixture(scope="module")
def guest_core(roots, tmp_path_factory) -> Path:
    """A core qemu-user wrote of the arm64 image's CPython dying of SIGSEGV (ctypes reads address 0)."""
    from tests.crashers.make_core import crash_for_core

    qemu = shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip("qemu-aarch64-static is not installed (apt-get install -y qemu-user-static)")
    run_dir = tmp_path_factory.mktemp("arm64-crash")
    core = crash_for_core([QEMU_IN_ROOT, "/usr/bin/python3", "-c", "import ctypes; ctypes.string_at(0)"], run_dir,
                          root=roots["arm64"], tools=((Path(qemu), QEMU_IN_ROOT),), guest=True, timeout=300)
    assert _machine(core) == EM_AARCH64
    return core


def _stored_core(crash: Path) -> bytes:
    meta = json.loads((crash / "metadata.json").read_text())
    assert meta["core"]["state"] == "kept" and meta["core"]["stream"]["kind"] == "core", meta["core"]
    assert meta["core"]["file"] == CORE_WHOLE
    with open(crash / CORE_DIR / CORE_WHOLE, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read()


def test_the_arm64_handler_keeps_a_guest_core_whole(roots, guest_core, tmp_path):
    # GIVEN a live process standing in for the crashed one (its /proc is what the handler reads), and the
    # guest core on stdin with the arguments the kernel gives (%d %P %i %s %t %c)
    live = subprocess.Popen(["sleep", "120"])
    prefix = tmp_path / "host-prefix"
    try:
        args = [str(live.pid), str(live.pid), "11", str(int(time.time())), "18446744073709551615", "--min-free", "0"]
        # WHEN the image's handler takes it in the image's root, under qemu
        cores = tmp_path / "cores"
        cores.mkdir()
        with open(guest_core, "rb") as f:
            h = _in_image(roots["arm64"], "/opt/forensics/bin/forensics", "core-handler", str(cores), *args,
                          cwd=cores, stdin=f, timeout=300)
        assert h.returncode == 0, h.stderr
        # and from /opt/forensics copied to the host (the init container's copy), run as the kernel runs it
        shutil.copytree(roots["arm64"] / "opt/forensics", prefix, symlinks=True)
        host_cores = tmp_path / "host-cores"
        with open(guest_core, "rb") as f:
            h2 = subprocess.run([str(prefix / "bin/forensics"), "core-handler", str(host_cores), *args], stdin=f,
                                capture_output=True, env={}, cwd="/", timeout=300)
        assert h2.returncode == 0, h2.stderr
    finally:
        live.kill()
        live.wait()
    # THEN each kept the core whole: the bytes qemu wrote
    want = guest_core.read_bytes()
    for d in (cores, host_cores):
        (crash,) = (d / "crashes").iterdir()
        assert _stored_core(crash) == want


def test_the_arm64_agent_serves_healthz_and_metrics(roots, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cores = tmp_path / "cores"
    cores.mkdir()
    cmd = sandbox_command(roots["arm64"], ["/opt/forensics/bin/forensics", "agent", "serve", "--core-dir", str(cores),
                                           "--node-name", "gh200-node-1", "--metrics-port", str(port), "--no-events"],
                          cwd=cores)
    agent = subprocess.Popen(cmd, env={}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180  # CPython's start-up under qemu-user
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                    health = (r.status, r.read().decode())
                break
            except OSError:
                assert agent.poll() is None, agent.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the arm64 agent did not answer /healthz"
                time.sleep(0.5)
        assert health[0] == 200 and health[1].strip() == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            body = r.read().decode()
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f.samples for f in text_string_to_metric_families(body)}
    (build,) = families["forensics_build_info"]
    assert build.labels["version"] == __version__ and build.labels["python"].startswith("3.11"), build
    assert any(s.labels.get("forensics_node") == "gh200-node-1" for f in families.values() for s in f), body[:2000]


def test_verify_imports_reads_each_image_of_the_agents_index(image):
    from click.testing import CliRunner

    from forensics.cli import cli

    ref = f"oci:{image}:{__version__}"
    raw = json.loads(subprocess.run(["skopeo", "inspect", "--raw", ref], capture_output=True, check=True).stdout)
    digests = {m["platform"]["architecture"]: m["digest"] for m in raw["manifests"]}
    host = host_platform()
    for args, arch, source in (([], host.architecture, "host"), (["--platform", "linux/arm64"], "arm64", "option"),
                               (["--platform", "linux/amd64"], "amd64", "option")):
        if arch not in digests:
            continue
        r = CliRunner().invoke(cli, ["verify-imports", ref, *args, "--json"], catch_exceptions=False)
        assert r.exit_code in (0, 3), r.output
        img = json.loads(r.stdout)["result"]["image"]
        assert img["platform_choice"]["chosen"] == f"linux/{arch}" and img["platform_choice"]["source"] == source
        assert img["digest"] == digests[arch] and img["platform"] == f"linux/{arch}"
    r = CliRunner().invoke(cli, ["verify-imports", ref, "--platform", "linux/s390x"], catch_exceptions=False)
    assert r.exit_code == 1 and "the image index has no linux/s390x image (--platform); it lists linux/amd64, " \
        "linux/arm64" in r.output
