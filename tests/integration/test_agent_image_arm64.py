"""The agent's arm64 image, run on this x86-64 machine under qemu-user: the node side of a GH200/GB200 node.

The image index of .ci/image/build.py (tests/agent_image.py) holds a linux/arm64 image whose userland
is Debian's arm64 packages (installed whole under qemu-user through binfmt_misc) and whose
/opt/forensics is the same pure-Python forensics wheel with aarch64 binary wheels under an aarch64
CPython and loader.  Its root is unpacked with umoci and run with bubblewrap as ``/``; its aarch64
programs run through the kernel's binfmt_misc entry of qemu-aarch64-static, as the image's own shell
script (``/opt/forensics/bin/forensics``) execs its loader -- or, on a machine whose binfmt_misc has no such
entry, through one registered in a user and mount namespace of the test's own (tests/roots.py
``sandbox_command(emulate=...)``; the machine's binfmt_misc is never touched).  The core handler takes a guest core that
qemu-user wrote of an arm64 CPython that crashed (qemu-user cannot be the kernel's core_pattern pipe
for a guest: the core goes to the handler on stdin, with the kernel's arguments); the image's own
``analyze`` reads the bundle (Python and native stacks of the arm64 core); ``agent serve`` answers
/healthz and /metrics on 127.0.0.1 and analyzes and counts the crash.  verify-imports reads each
image of the index.
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
from tests.roots import guest_exec_problem, sandbox_command

EM_AARCH64, EM_X86_64 = 183, 62
QEMU_IN_ROOT = "/run/qemu-aarch64-static"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap --mode=root and umoci unpack need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("mmdebstrap", "umoci", "bwrap", "skopeo")),
                       reason="mmdebstrap, umoci, skopeo and bubblewrap build, read and run the image "
                              "(bash .ci/setup)"),
    pytest.mark.skipif(guest_exec_problem("arm64") is not None,
                       reason=f"arm64 programs cannot run here: {guest_exec_problem('arm64')}"),
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


def _emulate(root: Path) -> str | None:
    """The qemu-user architecture of a root's programs (its shell's machine), None for this machine's."""
    return "aarch64" if _machine(root / "usr" / "bin" / "dash") == EM_AARCH64 else None


def _in_image(root: Path, *argv: str, cwd: Path, binds=(), timeout: float = 300, stdin=None, env=None):
    """``argv`` in the image's root as ``/`` (read-only), no environment but PATH (and ``env``), as a container
    runs it."""
    cmd = sandbox_command(root, list(argv), cwd=cwd, binds=tuple(binds), emulate=_emulate(root))
    return subprocess.run(cmd, capture_output=True, text=stdin is None, timeout=timeout, env=env or {}, stdin=stdin)


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


@pytest.fixture(scope="module")
def handled(roots, guest_core, tmp_path_factory) -> dict[str, Path]:
    """The guest core taken by the arm64 image's core handler: in the image's root, and from its /opt/forensics
    copied to the host (the init container's copy) run as the kernel runs a handler (no environment, cwd /).
    A live process stands in for the crashed one (its /proc is what the handler reads); the core is on stdin
    with the arguments the kernel gives (%d %P %i %s %t %c)."""
    base = tmp_path_factory.mktemp("arm64-handled")
    out = {"root": base / "cores", "host": base / "host-cores"}
    out["root"].mkdir()
    prefix = base / "host-prefix"
    shutil.copytree(roots["arm64"] / "opt/forensics", prefix, symlinks=True)
    live = subprocess.Popen(["sleep", "600"])
    try:
        args = [str(live.pid), str(live.pid), "11", str(int(time.time())), "18446744073709551615", "--min-free", "0"]
        with open(guest_core, "rb") as f:
            h = _in_image(roots["arm64"], "/opt/forensics/bin/forensics", "core-handler", str(out["root"]), *args,
                          cwd=out["root"], stdin=f, timeout=300)
        assert h.returncode == 0, h.stderr
        with open(guest_core, "rb") as f:
            h = subprocess.run([str(prefix / "bin/forensics"), "core-handler", str(out["host"]), *args], stdin=f,
                               capture_output=True, env={}, cwd="/", timeout=300)
        assert h.returncode == 0, h.stderr
    finally:
        live.kill()
        live.wait()
    return out


def test_the_arm64_handler_keeps_a_guest_core_whole(handled, guest_core):
    # THEN each handler kept the core whole: the bytes qemu wrote
    want = guest_core.read_bytes()
    for d in handled.values():
        (crash,) = (d / "crashes").iterdir()
        assert _stored_core(crash) == want


def test_the_arm64_images_analyze_reads_the_bundle(roots, handled, tmp_path):
    # WHEN the image's own forensics (aarch64 CPython, Debian's arm64 libdw) analyzes the bundle under qemu, the
    # crashed program's root given (it is the image's: its python3 crashed); the cache is writable (the root is not)
    (crash,) = (handled["root"] / "crashes").iterdir()
    p = _in_image(roots["arm64"], "forensics", "analyze", str(crash), "--sysroot", "/", "--json",
                  cwd=handled["root"], binds=(tmp_path,), env={"FORENSICS_CACHE": str(tmp_path / "cache")},
                  timeout=600)
    assert p.returncode in (0, 4), p.stderr
    a = json.loads(p.stdout)["analysis"]
    snap = a["snapshot"]
    # THEN the arm64 crash as it happened: SIGSEGV in ctypes.string_at called from the -c code, on CPython 3.11
    assert a["crash"]["kind"] == "segv" and a["crash"]["signal"] == 11 and snap["core"]["arch"] == "aarch64"
    (thread,) = [t for t in snap["threads"] if t["is_crashed"]]
    assert [f["function"] for f in thread["py_frames"]] == ["string_at", "<module>"], thread["py_frames"]
    assert snap["python_version"].startswith("3.11")
    libs = [f["library"] or "" for f in thread["native_frames"]]
    assert any(lib.endswith("_ctypes.cpython-311-aarch64-linux-gnu.so") for lib in libs), libs


def _wait_answer(url: str, agent: subprocess.Popen, timeout: float, log: Path) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read().decode()
        except OSError:
            assert agent.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"the arm64 agent did not answer {url}"
            time.sleep(0.5)


def _wait_analyzed(core_dir: Path, agent: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            idx = json.loads((core_dir / "agent-index.json").read_text())
            if idx["crashes"] == 1 and idx["pending"] == 0:
                return idx
        except (OSError, ValueError, KeyError):
            pass
        assert agent.poll() is None, "the arm64 agent exited"
        time.sleep(1)
    raise AssertionError(f"the arm64 agent did not analyze the crash in {timeout}s")


def test_the_arm64_agent_serves_healthz_and_metrics_and_analyzes_the_crash(roots, handled, tmp_path):
    # GIVEN the core directory the arm64 handler wrote
    cores = tmp_path / "cores"
    shutil.copytree(handled["root"], cores)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # WHEN the arm64 image's agent serves it, under qemu, in the image's root (read-only here: its cache is bound)
    cache = tmp_path / "cache"
    cache.mkdir()
    # agent serve's own code, its analyses unsandboxed: qemu-user refuses a guest its seccomp filter (the sandbox is
    # tested natively: test_sandbox.py, test_agent_privilege.py, and in the amd64 image, test_agent_image.py)
    serve = ("import sys\nfrom forensics import __version__\nfrom forensics.agent.serve import ServeConfig, serve\n"
             "serve(ServeConfig(core_dir=sys.argv[1], node='gh200-node-1', metrics_port=int(sys.argv[2]), "
             "metrics_address='127.0.0.1', events=False, version=__version__, sandbox_uid=None))")
    cmd = sandbox_command(roots["arm64"], ["/usr/bin/env", "PYTHONHOME=/opt/forensics",
                                           "PYTHONPATH=/opt/forensics/site-packages", "/opt/forensics/bin/python3.11",
                                           "-c", serve, str(cores), str(port)],
                          cwd=cores, binds=(cache,), emulate="aarch64")
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:  # the agent keeps its own descriptor
        agent = subprocess.Popen(cmd, env={"FORENSICS_CACHE": str(cache)}, stdout=out, stderr=subprocess.STDOUT)
    try:
        # THEN /healthz answers (CPython's start-up under qemu-user takes a while), the crash is analyzed
        status, text = _wait_answer(f"http://127.0.0.1:{port}/healthz", agent, 180, log)
        assert status == 200 and text.strip() == "ok", text
        _wait_analyzed(cores, agent, 600)
        status, body = _wait_answer(f"http://127.0.0.1:{port}/metrics", agent, 60, log)
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    from prometheus_client.parser import text_string_to_metric_families

    assert status == 200
    families = {f.name: f.samples for f in text_string_to_metric_families(body)}
    (build,) = families["forensics_build_info"]
    assert build.labels["version"] == __version__ and build.labels["python"].startswith("3.11"), build
    # and /metrics counts it, on this node, under its fingerprint
    crashes = [s for s in families["forensics_crashes"] if s.name == "forensics_crashes_total"]
    assert len(crashes) == 1 and crashes[0].value == 1, crashes
    assert crashes[0].labels["forensics_node"] == "gh200-node-1" and crashes[0].labels["fingerprint"] != "unknown", \
        crashes
    (analysis,) = cores.glob("crashes/*/60-analysis/analysis.json")
    assert json.loads(analysis.read_text())["analysis"]["fingerprint"].startswith(crashes[0].labels["fingerprint"])


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
