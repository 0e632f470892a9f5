"""verify-imports of an image index (a multi-platform image): it reads the node's platform and says which.

Two real images of the verify-imports scenarios in one OCI layout -- the clean exporter as linux/amd64,
the incident's (a stale checkout shadowing nvitop) made linux/arm64 with ``umoci config
--architecture`` -- under one OCI image index (tests/oci_index.py).  skopeo is the oracle of the choice:
``skopeo copy --override-arch`` picks the image a runtime of that platform pulls, and its manifest is
the one the report must name.  The same index pushed with ``skopeo copy --all`` to a real registry
(Debian's docker-registry on 127.0.0.1) is chosen from before anything is copied.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.imports.format import load_import_report
from forensics.imports.sources import host_platform
from tests.helpers import stop_process
from tests.oci_index import MT_INDEX, add_image_index, platform_object

from .test_verify_imports_helpers import ImageFactory, host_python, missing_tool
from .test_verify_imports_registry import _start_registry

pytestmark = [
    pytest.mark.skipif(host_python() is None, reason="CPython 3.11 (pyenv) not found"),
    pytest.mark.skipif(bool(missing_tool("umoci", "skopeo", "docker-registry")),
                       reason=str(missing_tool("umoci", "skopeo", "docker-registry"))),
]

HOST = str(host_platform())
# the image each platform's runtime pulls, and the verdict that tells them apart
VERDICT = {"linux/amd64": "OK", "linux/arm64": "SHADOWED"}


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    images = ImageFactory(tmp_path_factory.mktemp("platforms"))
    ref = images.get("clean")
    images.get("incident")
    path = Path(ref[len("oci:"):].rsplit(":", 1)[0])
    # the incident's image, made an arm64 image by umoci (its config's architecture)
    subprocess.run(["umoci", "config", "--image", f"{path}:incident", "--tag", "incident-arm64",
                    "--architecture", "arm64"], check=True, capture_output=True)
    add_image_index(path, "multi", [("clean", "linux/amd64"), ("incident-arm64", "linux/arm64")], untag=False)
    others = [p for p in ("linux/amd64", "linux/arm64") if p != HOST]
    add_image_index(path, "others", [("clean" if p == "linux/amd64" else "incident-arm64", p) for p in others]
                    + [("clean", "linux/s390x")], untag=False)
    return path


def skopeo_pick(src: str, arch: str) -> str:
    """The digest of the manifest skopeo copies for ``arch`` from the index at ``src`` (the oracle)."""
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", src], capture_output=True,
                         check=True).stdout
    index = json.loads(raw)
    assert index["mediaType"] == MT_INDEX
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"forensics-pick-{os.getpid()}-{arch}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    try:
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--override-os", "linux",
                        "--override-arch", arch, src, f"dir:{out}"], check=True, capture_output=True)
        return "sha256:" + hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    finally:
        subprocess.run(["rm", "-rf", str(out)], check=True)


def run(*args: str):
    result = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    doc = json.loads(result.stdout) if "--json" in args and result.exit_code in (0, 3) else None
    return result.exit_code, doc, result.output


def verdict(doc) -> str:
    return next(m for m in doc["result"]["modules"] if m["module"] == "nvitop")["verdict"]


@pytest.mark.skipif(HOST not in VERDICT, reason=f"this machine is {HOST}: the index holds amd64 and arm64 images")
def test_an_index_gives_this_machines_image_and_says_so(layout):
    # GIVEN an index of an amd64 and an arm64 image
    ref = f"oci:{layout}:multi"
    # WHEN verified with no --platform
    code, doc, out = run(ref, "--json")
    # THEN the image this machine's runtime pulls is read (skopeo's pick for this machine), and the report says so
    assert code == (0 if VERDICT[HOST] == "OK" else 3) and verdict(doc) == VERDICT[HOST], out
    choice = doc["result"]["image"]["platform_choice"]
    assert choice == {"requested": HOST, "source": "host", "chosen": HOST,
                      "digest": skopeo_pick(ref, HOST.split("/")[1]),
                      "available": ["linux/amd64", "linux/arm64"]}
    assert doc["result"]["image"]["digest"] == choice["digest"]
    assert doc["result"]["image"]["platform"] == HOST  # what the chosen image's config says
    # the evidence reads back into the record (forensics report reads it so)
    assert load_import_report(doc).image.platform_choice.chosen == HOST
    code, _, text = run(ref)
    other = next(p for p in VERDICT if p != HOST)
    assert f"  platform:    {HOST} from the image index (this machine's platform); the index also lists {other}" \
        in text.splitlines()


def test_platform_chooses_the_other_image(layout):
    ref = f"oci:{layout}:multi"
    for platform, expected in VERDICT.items():
        # WHEN a platform is named
        code, doc, out = run(ref, "--platform", platform, "--json")
        # THEN that platform's image is read: its own verdict, skopeo's manifest for it, its config's platform
        assert verdict(doc) == expected and code == (0 if expected == "OK" else 3), out
        choice = doc["result"]["image"]["platform_choice"]
        assert choice["source"] == "option" and choice["chosen"] == choice["requested"] == platform
        assert choice["digest"] == skopeo_pick(ref, platform.split("/")[1])
        assert doc["result"]["image"]["platform"] == platform
        _, _, text = run(ref, "--platform", platform)
        assert f"  platform:    {platform} from the image index (--platform)" in text


def test_a_platform_the_index_lacks_is_one_line_and_exit_1(layout):
    # GIVEN --platform of a platform the index does not hold
    code, _, out = run(f"oci:{layout}:multi", "--platform", "linux/riscv64")
    # THEN one error line naming what it holds, one hint, exit 1 (no traceback, nothing verified)
    lines = out.splitlines()
    assert code == 1 and len(lines) == 2, out
    assert lines[0] == (f"forensics: error: oci:{layout}:multi: the image index has no linux/riscv64 image "
                        "(--platform); it lists linux/amd64, linux/arm64")
    assert lines[1].startswith("forensics: hint: Pass --platform OS/ARCH")


def test_an_index_of_only_other_platforms_is_one_line_and_exit_1(layout):
    # GIVEN an index without this machine's platform, and no --platform
    code, _, out = run(f"oci:{layout}:others")
    lines = out.splitlines()
    # THEN the same one line, saying the platform was this machine's
    assert code == 1 and len(lines) == 2, out
    assert f"the image index has no {HOST} image (this machine's platform); it lists " in lines[0]
    assert "linux/s390x" in lines[0] and "Traceback" not in out


def _hostile_index(layout: Path, tag: str, entries: list) -> str:
    """An index whose entries a hostile registry chose (the manifests they name exist)."""
    from tests.oci_index import REF_NAME

    data = json.dumps({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": entries}).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest.split(":")[1]).write_bytes(data)
    top = json.loads((layout / "index.json").read_text())
    top["manifests"].append({"mediaType": MT_INDEX, "digest": digest, "size": len(data),
                             "annotations": {REF_NAME: tag}})
    (layout / "index.json").write_text(json.dumps(top))
    return f"oci:{layout}:{tag}"


def test_hostile_indexes_are_bounded_and_escaped(layout):
    top = json.loads((layout / "index.json").read_text())
    clean = next(m for m in top["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == "clean")
    entry = {"mediaType": clean["mediaType"], "digest": clean["digest"], "size": clean["size"]}
    # an index of 5000 entries: refused by its count, before any is read
    ref = _hostile_index(layout, "huge", [{**entry, "platform": platform_object(f"linux/arch{i}")}
                                          for i in range(5000)])
    code, _, out = run(ref, "--platform", "linux/amd64")
    assert code == 1 and "an image index of 5000 entries (more than 1024)" in out and len(out.splitlines()) == 2
    # a platform name of 10 KB
    ref = _hostile_index(layout, "long", [{**entry, "platform": {"os": "linux", "architecture": "a" * 10_000}}])
    code, _, out = run(ref, "--platform", "linux/amd64")
    assert code == 1 and "longer than 128 characters" in out and len(out) < 1000
    # platform names with control characters: listed escaped, on one line
    ref = _hostile_index(layout, "ctl", [{**entry, "platform": {"os": "linux", "architecture": "x\n\x1b[31mforged"}}])
    code, _, out = run(ref, "--platform", "linux/amd64")
    assert code == 1 and len(out.splitlines()) == 2 and "\x1b" not in out and "forged" in out.splitlines()[0]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if missing_tool("docker-registry"):
        pytest.skip(str(missing_tool("docker-registry")))
    proc, port = _start_registry(tmp_path_factory.mktemp("platform-registry"), auth=False)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


def test_a_registry_index_is_chosen_from_before_anything_is_copied(layout, registry):
    # GIVEN the index pushed whole to a registry (skopeo copy --all)
    subprocess.run(["skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi",
                    f"docker://{registry}/exporter:multi"], check=True, capture_output=True, timeout=300)
    ref = f"{registry}/exporter:multi"
    raw = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                                    capture_output=True, check=True).stdout)
    listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in raw["manifests"]}
    for platform, expected in VERDICT.items():
        # WHEN verified by reference with --platform
        code, doc, out = run(ref, "--tls-verify=false", "--platform", platform, "--json")
        # THEN that platform's image, named by the registry's own digest of it
        assert verdict(doc) == expected, out
        choice = doc["result"]["image"]["platform_choice"]
        assert choice["chosen"] == platform and choice["digest"] == listed[platform]
        assert doc["result"]["image"]["manifest_kind"] == "oci-index"
    # a platform it lacks: the same one line, from the registry's index (skopeo copies nothing)
    code, _, out = run(ref, "--tls-verify=false", "--platform", "linux/ppc64le")
    assert code == 1 and (f"forensics: error: docker://{ref}: the image index has no linux/ppc64le image "
                          "(--platform); it lists linux/amd64, linux/arm64") in out.splitlines()
