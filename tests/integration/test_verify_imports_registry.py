"""verify-imports by registry reference: a real registry (Debian's docker-registry) on 127.0.0.1, fed with skopeo.

One registry without auth and one with htpasswd basic auth, started by the tests on free ports.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.helpers import stop_process

from .test_verify_imports_helpers import ImageFactory, host_python, missing_tool

pytestmark = [
    pytest.mark.skipif(host_python() is None, reason="CPython 3.11 (pyenv) not found"),
    pytest.mark.skipif(bool(missing_tool("skopeo", "docker-registry", "htpasswd")),
                       reason=str(missing_tool("skopeo", "docker-registry", "htpasswd"))),
]

USER, PASSWORD = "sre", "s3cret-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_registry(tmp, auth: bool):
    port = _free_port()
    store = tmp / f"store-{port}"
    store.mkdir()
    cfg = ["version: 0.1", "log:", "  level: error", "storage:", "  filesystem:", f"    rootdirectory: {store}",
           "  delete:", "    enabled: true", "http:", f"  addr: 127.0.0.1:{port}"]
    if auth:
        htpasswd = tmp / "htpasswd"
        line = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
        htpasswd.write_text(line.strip() + "\n")
        cfg += ["auth:", "  htpasswd:", "    realm: forensics-tests", f"    path: {htpasswd}"]
    cfg_path = tmp / f"registry-{port}.yml"
    cfg_path.write_text("\n".join(cfg) + "\n")
    with open(tmp / f"registry-{port}.log", "wb") as log:  # the registry keeps its own copy of the descriptor
        proc = subprocess.Popen(["docker-registry", "serve", str(cfg_path)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            break
        except urllib.error.HTTPError:  # 401 with auth: it is up
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(tmp / f'registry-{port}.log').read_text()}") from None
            time.sleep(0.1)
    return proc, port


@pytest.fixture(scope="module")
def registries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("registry")
    procs = []
    try:
        anon, anon_port = _start_registry(tmp, auth=False)
        procs.append(anon)
        authed, auth_port = _start_registry(tmp, auth=True)
        procs.append(authed)
        yield {"anon": f"127.0.0.1:{anon_port}", "auth": f"127.0.0.1:{auth_port}"}
    finally:
        for p in procs:
            stop_process(p)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> ImageFactory:
    return ImageFactory(tmp_path_factory.mktemp("reg-images"))


def push(oci_ref: str, dest: str, creds: str | None = None, all_: bool = False) -> None:
    cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if creds:
        cmd += ["--dest-creds", creds]
    if all_:
        cmd += ["--all"]
    subprocess.run(cmd + [oci_ref, f"docker://{dest}"], check=True, capture_output=True, timeout=300)


def run(*args: str):
    result = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    doc = json.loads(result.stdout) if "--json" in args and result.exit_code in (0, 3) else None
    return result.exit_code, doc, result.output


def verdict(doc, name="nvitop"):
    return next(m for m in doc["result"]["modules"] if m["module"] == name)["verdict"]


def test_anonymous_registry_reference(registries, images):
    # GIVEN the incident image and the clean one pushed to a plain-HTTP registry
    reg = registries["anon"]
    push(images.get("incident"), f"{reg}/exporter:incident")
    push(images.get("clean"), f"{reg}/exporter:1.7.1")
    # WHEN verified by reference (skopeo brings it into a local OCI layout)
    code, doc, out = run(f"{reg}/exporter:incident", "--tls-verify=false", "--json")
    # THEN the same verdict as from the layout
    assert code == 3 and verdict(doc) == "SHADOWED", out
    assert doc["result"]["image"]["transport"] == "docker"
    assert doc["result"]["image"]["manifest_kind"] in ("oci-manifest", "docker-schema2-manifest")
    code, doc, _ = run(f"docker://{reg}/exporter:1.7.1", "--tls-verify=false", "--json")
    assert code == 0 and verdict(doc) == "OK"


def test_registry_by_digest_and_attestation_index(registries, images):
    reg = registries["anon"]
    push(images.get("attestation"), f"{reg}/exporter:attested", all_=True)
    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{reg}/exporter:attested"],
                         capture_output=True, check=True)
    import hashlib

    digest = "sha256:" + hashlib.sha256(raw.stdout).hexdigest()
    code, doc, out = run(f"{reg}/exporter@{digest}", "--tls-verify=false", "--json")
    assert code == 0, out
    img = doc["result"]["image"]
    assert img["manifest_kind"] == "oci-index-with-attestations" and img["attestations"] == 1
    assert "delivery risk" in out


def test_htpasswd_registry(registries, images):
    reg = registries["auth"]
    push(images.get("incident"), f"{reg}/private/exporter:incident", creds=f"{USER}:{PASSWORD}")
    # with credentials: verified
    code, doc, _ = run(f"{reg}/private/exporter:incident", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}",
                       "--json")
    assert code == 3 and verdict(doc) == "SHADOWED"
    # an auth file (as `skopeo login` / docker login write it) works too
    import base64

    authfile = os.path.join(os.path.dirname(os.path.dirname(images.base)), "auth.json")
    with open(authfile, "w") as f:
        json.dump({"auths": {reg: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}, f)
    code, doc, _ = run(f"{reg}/private/exporter:incident", "--tls-verify=false", "--authfile", authfile, "--json")
    assert code == 3
    # without, or with wrong ones: a clear error, the password never echoed
    code, _, out = run(f"{reg}/private/exporter:incident", "--tls-verify=false")
    assert code == 1 and "skopeo inspect failed" in out and "--creds" in out
    code, _, out = run(f"{reg}/private/exporter:incident", "--tls-verify=false", "--creds", f"{USER}:wrong-pw")
    assert code == 1 and "wrong-pw" not in out


def test_missing_skopeo_is_explained(monkeypatch, registries):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, out = run(f"{registries['anon']}/exporter:1.7.1")
    assert code == 1 and "needs skopeo" in out and "apt-get install -y skopeo" in out


@pytest.mark.parametrize("where", ["unknown tag", "unknown repository", "nothing listening"])
def test_skopeos_failure_is_one_line_with_its_cause_first(registries, images, where):
    # GIVEN a reference the registry does not have (or a port nothing listens on)
    reg = registries["anon"]
    push(images.get("clean"), f"{reg}/exporter:1.7.1")
    ref, cause, hint = {
        "unknown tag": (f"{reg}/exporter:no-such-tag", "manifest unknown (reading manifest no-such-tag in ",
                        "check the repository's name and the tag"),
        "unknown repository": (f"{reg}/no/such-repo:1", "manifest unknown (reading manifest 1 in ",
                               "check the repository's name and the tag"),
        "nothing listening": (f"127.0.0.1:{_free_port()}/exporter:1", "connection refused (", "Nothing listens there"),
    }[where]
    # WHEN verify-imports is given it
    code, _, out = run(ref, "--tls-verify=false")
    # THEN one error line, skopeo's cause first (not its log line, time and level, with the cause at the end), and a
    # hint for that cause
    assert code == 1, out
    error, hint_line = out.splitlines()
    assert error.startswith(f"forensics: error: docker://{ref}: skopeo inspect failed: {cause}"), error
    assert 'time="' not in out and "level=fatal" not in out and "Error parsing image name" not in out, out
    assert hint_line.startswith("forensics: hint: ") and hint in hint_line, hint_line
