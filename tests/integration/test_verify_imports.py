"""verify-imports on real images: OCI layouts and docker-archive tars with a runnable CPython and real wheels.

Each scenario is built once per session (tests/integration/test_verify_imports_helpers.py);
the CLI runs in-process through click's CliRunner and we assert on its JSON document.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli

from .test_verify_imports_helpers import (ImageFactory, Layer, base_blob, host_python, image_config, make_blob,
                                          missing_tool, write_docker_archive, write_oci)


pytestmark = pytest.mark.skipif(host_python() is None,
                                reason="CPython 3.11 (pyenv) not found: it is the image's interpreter")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> ImageFactory:
    return ImageFactory(tmp_path_factory.mktemp("images"))


def run(*args: str) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    doc = None
    if "--json" in args and result.exit_code in (0, 3):
        doc = json.loads(result.stdout)
    return result.exit_code, doc, result.output + (result.stderr if result.stderr_bytes is not None else "")


def module(doc: dict, name: str) -> dict:
    return next(m for m in doc["result"]["modules"] if m["module"] == name)


def bwrap_problem() -> str | None:
    missing = missing_tool("bwrap")
    if missing:
        return missing
    p = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"], capture_output=True,
                       text=True)
    return None if p.returncode == 0 else f"bubblewrap cannot create namespaces here: {p.stderr.strip()}"


# -- verdicts ---------------------------------------------------------------------------------------------

EXPECT = {
    # scenario: (exit code, nvitop verdict, nvitop version that imports, origin of the winning entry)
    "clean": (0, "OK", "1.7.1", "site-packages"),
    "incident": (3, "SHADOWED", "1.5.0", "working-directory"),
    "safepath": (0, "OK", "1.7.1", "site-packages"),
    "pythonpath": (3, "SHADOWED", "1.5.0", "PYTHONPATH"),
    "tmp-pythonpath": (3, "SHADOWED", "1.5.0", "PYTHONPATH"),  # the image's /tmp is the runtime's /tmp
    "pth": (3, "SHADOWED", "1.5.0", "pth-import"),
    "whiteout": (0, "OK", "1.7.1", "site-packages"),
    "opaque": (0, "OK", "1.7.1", "site-packages"),
    "attestation": (0, "OK", "1.7.1", "site-packages"),
    "console-script": (3, "SHADOWED", "1.5.0", "script-directory"),
    "conflict": (3, "OK", "1.5.0", "site-packages"),  # a known issue of severity error: nvitop 1.5.0's bound
    "guard": (0, "OK", "1.7.1", "site-packages"),
    "editable": (3, "VERSION-MISMATCH", "1.5.0", "editable-finder"),
}
CASES = [pytest.param(s, "oci", id=f"source=oci,image={s}") for s in EXPECT] + [
    pytest.param(s, "docker-archive", id=f"source=docker-archive,image={s}") for s in ("clean", "incident", "whiteout")]


@pytest.mark.parametrize("scenario,fmt", CASES)
def test_verdicts(images, scenario, fmt):
    # GIVEN a real image
    ref = images.get(scenario, fmt)
    # WHEN verified
    code, doc, out = run(ref, "--json")
    # THEN nvitop's verdict, the version that imports and why are reported
    want_code, verdict, version, origin = EXPECT[scenario]
    assert code == want_code, out
    nv = module(doc, "nvitop")
    assert (nv["verdict"], nv["effective_version"], nv["origin"]) == (verdict, version, origin)
    assert doc["schema_version"] == 1 and doc["command"] == "verify-imports"
    assert module(doc, "nvitop_exporter")["verdict"] == "OK"
    assert module(doc, "pynvml")["verdict"] == "OK"
    if verdict == "SHADOWED":
        assert nv["expected_distribution"]["name"] == "nvitop" and nv["expected_version"] == "1.7.1"
        assert "1.5.0" in nv["reason"] and "1.7.1" in nv["reason"]
        assert nv["distribution"] is None  # the stale tree belongs to no distribution
    elif origin == "editable-finder":
        # pip's metadata says 1.7.1 (pip show lies); the checkout the finder maps to holds 1.5.0
        assert nv["distribution"]["name"] == "nvitop" and nv["distribution"]["version"] == "1.7.1"
        assert nv["resolved"]["file"] == nv["distribution"]["editable"] + "/nvitop/__init__.py"
        assert nv["installed_file"] is False and "editable install" in nv["reason"] and "-e" in nv["fix"]
        (finder,) = doc["result"]["python"]["finders"]
        assert finder["style"] == "setuptools" and finder["pth"].endswith(".pth")
    else:
        assert nv["installed_file"] and nv["record_hash_ok"] is True


def test_incident_names_both_versions_and_the_fixes(images):
    code, doc, _ = run(images.get("incident"), "--json")
    nv = module(doc, "nvitop")
    assert nv["resolved"]["file"] == "/app/nvitop/__init__.py"
    assert nv["expected"]["file"] == "/usr/local/lib/python3.11/site-packages/nvitop/__init__.py"
    assert "WORKDIR" in nv["fix"] and "PYTHONSAFEPATH=1" in nv["fix"]
    py = doc["result"]["python"]
    assert py["entrypoint"]["mode"] == "module" and py["entrypoint"]["version"] == "3.11"
    # the official python image's layout: CPython in /usr/local, upstream's site.py and site-packages
    assert py["site_layout"] == "upstream" and py["prefix"] == "/usr/local"
    assert py["sys_path"][-1]["path"] == "/usr/local/lib/python3.11/site-packages"
    assert py["sys_path"][0] == {"path": "/app", "origin": "working-directory", "exists": True,
                                 "note": "working directory (-m)"}
    # nvitop-exporter 1.7.1 pins nvitop~=1.7.1: the shadow breaks it although pip sees 1.7.1
    eff = [p for p in doc["result"]["requirement_problems"] if p["effective"]]
    assert eff and eff[0]["dist"] == "nvitop-exporter" and "1.5.0" in eff[0]["message"]
    # text output for people says the same
    code, _, text = run(images.get("incident"))
    assert code == 3 and "SHADOWED" in text
    assert "result: NOT OK (nvitop SHADOWED; known issue nvitop-1.5.0-nvidia-ml-py-bound (error))" in text


def test_attestation_index_is_a_delivery_warning(images):
    code, doc, out = run(images.get("attestation"), "--json")
    img = doc["result"]["image"]
    assert code == 0 and img["manifest_kind"] == "oci-index-with-attestations" and img["attestations"] == 1
    assert any("delivery risk" in w for w in img["warnings"]) and "delivery risk" in out
    assert run(images.get("clean"), "--json")[1]["result"]["image"]["manifest_kind"] == "oci-manifest"
    assert run(images.get("attestation"), "--strict")[0] == 3


def test_pip_check_and_known_issues_with_driver(images):
    code, doc, _ = run(images.get("conflict"), "--json", "--driver", "580.126.09")
    msgs = [p["message"] for p in doc["result"]["requirement_problems"]]
    assert ("nvitop 1.5.0 has requirement nvidia-ml-py<12.571.0a0,>=11.450.51, but you have nvidia-ml-py 12.575.51."
            in msgs)
    ids = {k["id"] for k in doc["result"]["known_issues"]}
    assert {"nvitop-1.5.0-nvidia-ml-py-bound", "driver-580-needs-nvitop-1.5.3", "nvitop-exit-nvmlshutdown-race",
            "nvidia-ml-py-12.575.51-field-ids"} <= ids
    assert all(k["sources"] for k in doc["result"]["known_issues"])
    # an error-severity known issue fails without --strict; the last line says why, as the exit status does
    assert code == 3 and doc["result"]["failures"] == ["known issue nvitop-1.5.0-nvidia-ml-py-bound (error)"]
    code, _, text = run(images.get("conflict"), "--strict", "--driver", "580.126.09")
    assert code == 3 and text.rstrip().splitlines()[-1].startswith("  result: NOT OK (known issue nvitop-1.5.0")
    assert "--strict: 1 requirement conflict(s)" in text.rstrip().splitlines()[-1]
    clean = run(images.get("clean"), "--json", "--driver", "580.126.09")[1]
    assert clean["result"]["known_issues"] == [] and clean["result"]["requirement_problems"] == []


def test_entrypoint_override_and_extra_module(images):
    # the incident image run as `python3 -I -m nvitop_exporter`: isolated mode drops the working directory
    code, doc, _ = run(images.get("incident"), "--json", "--entrypoint", "python3 -I -m nvitop_exporter",
                       "--module", "psutil", "--module", "no_such_module")
    assert module(doc, "nvitop")["verdict"] == "OK" and module(doc, "psutil")["verdict"] == "OK"
    assert module(doc, "no_such_module")["verdict"] == "MISSING" and code == 3


def test_unpacked_root_dir_source(images, tmp_path):
    from forensics.imports.layers import read_layers
    from forensics.imports.sources import open_image, parse_image_ref

    with open_image(parse_image_ref(images.get("incident"))) as opened:
        fs = read_layers(opened.blobs)
        root = tmp_path / "rootfs"
        root.mkdir()
        fs.extract(str(root))
    code, doc, _ = run(f"dir:{root}", "--json", "--entrypoint", "python3 -m nvitop_exporter", "--workdir", "/app")
    assert code == 3 and module(doc, "nvitop")["verdict"] == "SHADOWED"
    assert doc["result"]["image"]["manifest_kind"] == "none"
    code, doc, _ = run(f"dir:{root}", "--json", "--entrypoint", "python3 -m nvitop_exporter", "--workdir", "/app",
                       "--env", "PYTHONSAFEPATH=1")
    assert code == 0


def test_bad_references_are_clear_errors(images, tmp_path):
    code, _, out = run(f"oci:{tmp_path}:nope")
    assert code == 1 and "not an OCI image layout" in out
    layout = images.get("clean").split(":")[1]
    code, _, out = run(f"oci:{layout}:no-such-tag")
    assert code == 1 and "no image tagged 'no-such-tag'" in out and "clean" in out
    assert run()[0] == 2


# -- --execute: ground truth ------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", list(EXPECT), ids=lambda s: f"image={s}")
def test_execute_agrees_with_static(images, scenario):
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    code, doc, out = run(images.get(scenario), "--json", "--execute")
    x = doc["result"]["execute"]
    assert x["agrees"], out
    assert x["sys_path_agrees"]
    nv = next(m for m in x["modules"] if m["module"] == "nvitop")
    assert nv["version"] == EXPECT[scenario][2] and nv["error"] is None  # it really imported
    assert code == EXPECT[scenario][0]


def test_execute_fails_a_module_the_images_interpreter_cannot_import(images):
    # GIVEN the clean image with libpthread.so.0 deleted by an upper layer: PyPI's psutil extension needs it, so
    # the image's own interpreter cannot import nvitop (nor psutil) -- every file is where the static analysis says
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    ref = images.get("missing-lib")
    static = run(ref, "--json")
    # WHEN the gate runs with --execute
    code, doc, out = run(ref, "--json", "--execute")
    _, _, text = run(ref, "--execute")
    # THEN NOT OK, exit 3 (it said OK, exit 0): the ImportError and the file it could not find (no package
    # database in this image to say whose it is)
    assert static[0] == 0 and code == 3, out
    ran = {m["module"]: m for m in doc["result"]["execute"]["modules"]}
    assert ran["nvitop"]["error"].startswith("ImportError: libpthread.so.0: cannot open shared object file")
    assert ran["nvitop"]["missing"] == "libpthread.so.0" and ran["nvitop"]["provided_by"] is None
    assert "nvitop cannot be imported: libpthread.so.0 missing" in doc["result"]["failures"]
    assert text.rstrip().splitlines()[-1].startswith("  result: NOT OK (nvitop cannot be imported: libpthread.so.0 "
                                                     "missing; "), text
    assert "    x nvitop: " in text and "        missing: libpthread.so.0" in text


def test_execute_on_docker_archive(images):
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    code, doc, _ = run(images.get("incident", "docker-archive"), "--json", "--execute")
    x = doc["result"]["execute"]
    assert x["agrees"] and next(m for m in x["modules"] if m["module"] == "nvitop")["file"] == "/app/nvitop/__init__.py"


# -- hostile images ----------------------------------------------------------------------------------------

def _bomb_blob(out: Path):
    """A gzip layer holding one 300 MB file of zeros (~300 KB compressed)."""
    import tarfile

    ti = tarfile.TarInfo("zeros")
    ti.size = 300 << 20
    header = ti.tobuf(format=tarfile.PAX_FORMAT)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = out / "bomb.gz"
    with open(path, "wb") as f:
        f.write(comp.compress(header))
        chunk = b"\0" * (1 << 20)
        for _ in range(300):
            f.write(comp.compress(chunk))
        f.write(comp.compress(b"\0" * 1024))
        f.write(comp.flush())
    import hashlib

    from .test_verify_imports_helpers import Blob

    data = path.read_bytes()
    return Blob(path, "sha256:" + hashlib.sha256(data).hexdigest(), "sha256:" + "0" * 64, len(data),
                "application/vnd.oci.image.layer.v1.tar+gzip")


HOSTILE = ["traversal", "symlink-escape", "hardlink-shadow", "bomb"]


def _hostile_image(kind: str, out: Path, sentinel: str, fmt: str) -> str:
    layers = []
    if kind == "traversal":
        layers.append(Layer().file("../../../../../.." + sentinel, "pwned"))
    elif kind == "symlink-escape":
        layers.append(Layer().symlink("/escape", "/"))
        layers.append(Layer().file("escape" + sentinel, "pwned"))
    elif kind == "hardlink-shadow":
        layers.append(Layer().dir("/etc").hardlink("etc/shadow-copy", "/etc/shadow", raw_name=True))
    blobs = [base_blob()] + [make_blob(layer.tar_bytes(), out / "store") for layer in layers]
    if kind == "bomb":
        blobs.append(_bomb_blob(out))
    cfg = image_config(blobs, entrypoint=["python3", "-m", "nvitop_exporter"], workdir="/srv")
    if fmt == "oci":
        return write_oci(out / "oci", blobs, cfg, tag=kind)
    return write_docker_archive(out / f"{kind}.tar", blobs, cfg)


# docker save writes uncompressed layers: no decompression bomb can exist there, so that pair is not made
@pytest.mark.parametrize("kind,fmt", [(k, f) for k in HOSTILE for f in ("oci", "docker-archive")
                                      if not (k == "bomb" and f == "docker-archive")])
def test_hostile_layers_are_refused_and_nothing_is_written(kind, fmt, tmp_path):
    sentinel = f"/tmp/forensics-hostile-{uuid.uuid4().hex}"
    ref = _hostile_image(kind, tmp_path, sentinel, fmt)
    for extra in ([], ["--execute"]):
        code, _, out = run(ref, *extra)
        assert code == 1, out
        assert "error: layer" in out
        assert ("only for an image you trust" if kind == "bomb" else "do not deploy this image") in out
        assert {"traversal": "path traversal", "symlink-escape": "is a symlink", "hardlink-shadow": "hard link",
                "bomb": "decompression bomb"}[kind] in out
        assert not os.path.lexists(sentinel)
    assert not os.path.exists("/etc/shadow-copy")


def test_driver_from_a_capture_bundle(images, tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "30-kernel").mkdir(parents=True)
    (bundle / "30-kernel" / "nvidia-smi.txt").write_text("==============NVSMI LOG==============\n"
                                                       "Driver Version                            : 580.126.09\n")
    code, doc, _ = run(images.get("incident"), "--json", "--bundle", str(bundle))
    assert doc["result"]["driver"] == "580.126.09"
    assert "driver-580-needs-nvitop-1.5.3" in {k["id"] for k in doc["result"]["known_issues"]}


def test_an_active_guard_is_reported(images):
    code, doc, _ = run(images.get("guard"), "--json")
    guards = doc["result"]["guards"]
    assert code == 0 and len(guards) == 1
    assert guards[0]["target"] == "nvitop.api.device:Device.nvlink_throughput"
    assert guards[0]["env"] == "FORENSICS_GUARD_NVLINK" and guards[0]["returns"] == "[]"
    assert guards[0]["active"] is True
    code, _, text = run(images.get("guard"))
    assert "guard active" in text
    # the same image with the switch set off in its Env: installed, but not active
    code, doc, _ = run(images.get("guard-off"), "--json")
    (g,) = doc["result"]["guards"]
    assert g["active"] is False and g["target"] == "nvitop.api.device:Device.nvlink_throughput"
    assert "switched off" in run(images.get("guard-off"))[2]
    # flat fields for forensics report
    nv = module(doc, "nvitop")
    assert nv["version"] == "1.7.1" and nv["file"].endswith("site-packages/nvitop/__init__.py")
    assert doc["result"]["image"]["digest"].startswith("sha256:")


def test_report_from_a_shadowed_image_says_the_shadowing_was_found(images, tmp_path):
    # GIVEN verify-imports evidence of the incident's image (WORKDIR /app shadows site-packages)
    out = tmp_path / "imports.json"
    r = CliRunner().invoke(cli, ["verify-imports", "--json", "--driver", "580.126.09", "-o", str(out),
                                 images.get("incident")], catch_exceptions=False)
    assert r.exit_code == 3 and out.is_file()
    # WHEN a report is written from it
    r = CliRunner().invoke(cli, ["report", "--json", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)["report"]
    md = rep["markdown"].replace("\\", "")
    # THEN the versions are the ones that really import, and shadowing is named, with the image's path
    # (an image path is not a local path: it stays in the upstream report), and it leads the conclusion
    assert "### What version of nvitop are you using?\n\n1.5.0" in md
    # (a confirmed shadowing is FOUND, not "NOT ruled out": issue #26)
    assert "Old source shadowing the installed packages: FOUND: nvitop: SHADOWED (/app/nvitop/__init__.py)" in md
    # the decision: a shadowed install, the shadowing and its fix leading the conclusion, nothing told to upgrade
    conclusion = rep["conclusion"]
    assert conclusion["incident"] == "shadowed-or-unsupported-install"
    assert conclusion["statement"].startswith(
        "The code that ran is not the installed distribution's: nvitop: SHADOWED: /app/nvitop/__init__.py")
    assert "PYTHONSAFEPATH=1" in conclusion["statement"]
    assert "upgrade nvitop" not in md.lower()  # an issue never tells its own project to upgrade itself
