"""verify-imports on images built from real Debian packages, against what each image's own interpreter says.

The images (tests/debian_images.py) are bookworm roots from mmdebstrap with python3, pip, venv and
python3-psutil from apt, the nvitop / nvidia-ml-py / pynvml wheels from PyPI installed by the image's
own pip, assembled by umoci.  Their ground truth was printed by the image's interpreter, run with
bubblewrap over what ``umoci unpack`` extracted, from the working directory and with the
environment and user of the runtime bundle.  Every module the static analysis resolves with
certainty must be the file the interpreter imports; ``--execute`` must agree wherever the static
resolver claims certainty, and say why where it does not.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.debian_images import SCENARIOS, debian_images
from tests.roots import RootUnavailable

from .test_verify_imports import bwrap_problem

DIST = "/usr/local/lib/python3.11/dist-packages"
APT = "/usr/lib/python3/dist-packages"


@pytest.fixture(scope="module")
def deb():
    try:
        return debian_images()
    except RootUnavailable as e:
        pytest.skip(f"Debian images cannot be built here: {e}")


@functools.cache
def _run(args: tuple[str, ...]) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.output + (r.stderr if r.stderr_bytes is not None else "")


def run(*args: str) -> tuple[int, dict | None, str]:
    """The CLI's exit status, its JSON document (with --json), its text; each image is read once per
    argument list (reading a 190 MB Debian image is the slow part; the result is the same)."""
    code, stdout, text = _run(args) if not any(a.startswith("dir:") for a in args) else _run.__wrapped__(args)
    doc = json.loads(stdout) if "--json" in args and code in (0, 3) else None
    return code, doc, text


def mod(doc: dict, name: str) -> dict:
    return next(m for m in doc["result"]["modules"] if m["module"] == name)


def kinds(doc: dict) -> list[str]:
    return [f["kind"] for f in doc["result"]["findings"]]


# scenario: (exit status, {module: verdict}, finding kinds in order, static verdict certain)
EXPECT = {
    "deb-clean": (0, {"nvitop": "OK", "nvitop_exporter": "OK", "pynvml": "OK", "psutil": "OK"}, [], True),
    "deb-incident": (3, {"nvitop": "SHADOWED", "nvitop_exporter": "OK", "pynvml": "OK", "psutil": "OK"}, [], True),
    "deb-venv-system-site": (3, {"nvitop": "OK", "pynvml": "OK", "psutil": "OK"}, [], True),
    "deb-sitecustomize": (3, {"nvitop": "SHADOWED", "pynvml": "OK", "psutil": "OK"}, [], True),
    "deb-sitecustomize-dynamic": (3, {"nvitop": "OK", "pynvml": "OK", "psutil": "OK"}, ["uncertain"], False),
    "deb-pip-over-apt": (0, {"psutil": "OK"}, [], True),
    "deb-apt-modified": (3, {"psutil": "VERSION-MISMATCH"}, [], True),
    "deb-two-owners": (3, {"nvitop": "OK", "pynvml": "CONFLICT", "psutil": "OK"}, [], True),
    "deb-python-missing": (3, {"nvitop": "OK", "nvitop_exporter": "OK", "pynvml": "OK"}, ["entrypoint-not-found"],
                           True),
    "deb-bad-pth": (3, {"nvitop": "OK", "pynvml": "OK", "psutil": "OK"}, ["startup-fails"], True),
    # every file where it is expected: only running the image's interpreter shows that none of them imports
    "deb-missing-lib": (0, {"nvitop": "OK", "nvitop_exporter": "OK", "psutil": "OK"}, [], True),
}
assert set(EXPECT) == set(SCENARIOS)


def _only(name: str) -> list[str]:
    return ["--only"] + [a for m in SCENARIOS[name].modules for a in ("-m", m)]


@pytest.mark.parametrize("name", list(EXPECT), ids=lambda n: f"image={n}")
def test_static_verdict_is_what_the_image_imports(deb, name):
    # GIVEN a Debian image and what its own interpreter imported
    truth = deb.truth[name]
    # WHEN verified statically
    code, doc, out = run(deb.ref(name), "--json", *_only(name))
    # THEN the verdicts, the findings and the exit status are the expected ones ...
    want_code, verdicts, finding_kinds, certain = EXPECT[name]
    assert {m: mod(doc, m)["verdict"] for m in verdicts} == verdicts, out
    assert kinds(doc) == finding_kinds
    assert code == want_code, doc["result"]["failures"]
    assert doc["result"]["python"]["site_layout"] == "debian"
    # ... and every module is the file the interpreter imports (where the static resolver is certain)
    if not certain:
        return
    for m, t in truth.get("modules", {}).items():
        static = mod(doc, m)
        assert (static["resolved"] or {}).get("file") == t["file"], (m, static["reason"])
        if t.get("version") is not None:
            assert static["effective_version"] == t["version"], m


@pytest.mark.parametrize("name", list(EXPECT), ids=lambda n: f"image={n}")
def test_execute_agrees_where_the_static_verdict_is_certain(deb, name):
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    code, doc, out = run(deb.ref(name), "--json", "--execute", *_only(name))
    x = doc["result"]["execute"]
    want_code, _, _, certain = EXPECT[name]
    if any("import_error" in t for t in deb.truth[name].get("modules", {}).values()):
        want_code = 3  # a module the image's interpreter cannot import is not OK (#41 item 1)
    if certain:
        assert x["agrees"], out
        assert code == want_code
    else:
        # the dynamic sitecustomize: --execute disagrees, and says which entry and what put it there
        assert not x["agrees"] and code == 3
        assert "sys.path[1] = /opt/override" in x["difference"]
        assert "sitecustomize.py" in x["difference"] and "Fix:" in x["difference"]
    truth = deb.truth[name]
    if "startup_error" in truth:
        assert x["startup_error"] and "UnicodeDecodeError" in x["startup_error"]
        assert x["modules"] == []
    else:
        for m, t in truth["modules"].items():
            ran = next(r for r in x["modules"] if r["module"] == m)
            assert ran["file"] == t["file"], m


def test_requirement_conflicts_are_what_the_images_pip_check_says(deb):
    for name, truth in deb.truth.items():
        if "pip_check" not in truth:
            continue
        code, doc, _ = run(deb.ref(name), "--json", *_only(name))
        ours = sorted(p["message"] for p in doc["result"]["requirement_problems"] if not p["effective"])
        theirs = sorted(ln for ln in truth["pip_check"] if ln != "No broken requirements found.")
        assert ours == theirs, name


def test_a_system_site_packages_venv_searches_debians_directories(deb):
    # #15 item 2: nvitop 1.5.0 imports from dist-packages; the venv's nvidia-ml-py 12.575.51 breaks its bound
    code, doc, out = run(deb.ref("deb-venv-system-site"), "--json", *_only("deb-venv-system-site"))
    paths = [e["path"] for e in doc["result"]["python"]["sys_path"]]
    assert paths == deb.truth["deb-venv-system-site"]["sys_path"]
    nv = mod(doc, "nvitop")
    assert nv["resolved"]["file"] == f"{DIST}/nvitop/__init__.py" and nv["effective_version"] == "1.5.0"
    assert mod(doc, "pynvml")["resolved"]["file"] == "/opt/venv/lib/python3.11/site-packages/pynvml.py"
    ids = {k["id"] for k in doc["result"]["known_issues"]}
    assert {"nvitop-1.5.0-nvidia-ml-py-bound", "nvitop-exit-nvmlshutdown-race"} <= ids
    code, doc, _ = run(deb.ref("deb-venv-system-site"), "--json", "--driver", "580.126.09",
                       *_only("deb-venv-system-site"))
    ids = {k["id"] for k in doc["result"]["known_issues"]}
    assert {"driver-580-needs-nvitop-1.5.3", "nvidia-ml-py-12.575.51-field-ids"} <= ids


def test_sitecustomize_is_read_and_named_in_the_fix(deb):
    # #15 item 3: a literal sys.path edit in /etc/python3.11/sitecustomize.py decides what imports
    code, doc, out = run(deb.ref("deb-sitecustomize"), "--json", *_only("deb-sitecustomize"))
    py = doc["result"]["python"]
    (cz,) = py["customize"]
    assert cz["module"] == "sitecustomize" and cz["path"] == "/usr/lib/python3.11/sitecustomize.py"
    assert cz["edits"] == ["line 9: sys.path.insert(0, '/opt/override')"] and cz["unevaluated"] == []
    assert py["sys_path"][1]["path"] == "/opt/override" and py["sys_path"][1]["origin"] == "sitecustomize"
    nv = mod(doc, "nvitop")
    assert nv["origin"] == "sitecustomize" and nv["expected_version"] == "1.5.0"
    assert "sitecustomize.py" in nv["fix"] and "/opt/override" in nv["fix"]
    # Debian's own sitecustomize (the apport hook, guarded by try/except ImportError) is no uncertainty
    code, doc, _ = run(deb.ref("deb-clean"), "--json", *_only("deb-clean"))
    (cz,) = doc["result"]["python"]["customize"]
    assert cz["edits"] == [] and cz["unevaluated"] == [] and code == 0


def test_apt_modules_are_managed_by_dpkg_and_pip_copies_hide_them(deb):
    # #15 item 4: python3-psutil's files are listed by dpkg; never 'UNMANAGED', never 'remove it'
    code, doc, _ = run(deb.ref("deb-clean"), "--json", *_only("deb-clean"))
    ps = mod(doc, "psutil")
    assert ps["verdict"] == "OK" and ps["installed_file"] and ps["record_hash_ok"] is True
    assert ps["distribution"]["package"] == "python3-psutil" and ps["distribution"]["version"] == "5.9.4"
    assert ps["distribution"]["package_version"].startswith("5.9.4-")
    # pip's psutil in /usr/local hides apt's: the hidden copy is part of the answer
    code, doc, out = run(deb.ref("deb-pip-over-apt"), "--json", *_only("deb-pip-over-apt"))
    ps = mod(doc, "psutil")
    assert ps["resolved"]["file"] == f"{DIST}/psutil/__init__.py" and ps["distribution"]["package"] is None
    (hidden,) = ps["hidden"]
    assert hidden["file"] == f"{APT}/psutil/__init__.py" and hidden["distribution"]["package"] == "python3-psutil"
    assert "it hides psutil 5.9.4 (Debian package python3-psutil" in ps["reason"]
    # an apt file edited after install: dpkg's md5sums say so, and the fix is apt's
    code, doc, _ = run(deb.ref("deb-apt-modified"), "--json", *_only("deb-apt-modified"))
    ps = mod(doc, "psutil")
    assert ps["record_hash_ok"] is False and "dpkg md5sums" in ps["reason"]
    assert ps["fix"] == "reinstall the package (apt-get install --reinstall python3-psutil)"


def test_two_distributions_owning_pynvml_is_a_conflict_with_its_fix(deb):
    # #15 item 5: nvidia-ml-py's pynvml.py and the deprecated pynvml's pynvml/ in one directory
    code, doc, out = run(deb.ref("deb-two-owners"), "--json", "--driver", "580.126.09", *_only("deb-two-owners"))
    pv = mod(doc, "pynvml")
    assert pv["verdict"] == "CONFLICT" and pv["resolved"]["file"] == f"{DIST}/pynvml/__init__.py"
    assert sorted((o["name"], o["version"]) for o in pv["owners"]) == [("nvidia-ml-py", "12.575.51"),
                                                                        ("pynvml", "11.5.3")]
    assert pv["distribution"]["name"] == "pynvml" and "pip uninstall -y pynvml" in pv["fix"]
    assert "nvidia-ml-py==12.575.51" in pv["fix"]
    # the known issue keyed on nvidia-ml-py 12.575.51 is not applied: that code never imports
    assert "nvidia-ml-py-12.575.51-field-ids" not in {k["id"] for k in doc["result"]["known_issues"]}
    assert any("nvidia-ml-py 12.575.51 not applied" in n for n in doc["result"]["notes"])
    # and the image's interpreter agrees: nvitop cannot even import its pynvml functions
    assert deb.truth["deb-two-owners"]["modules"]["pynvml"]["file"] == f"{DIST}/pynvml/__init__.py"
    assert "_nvmlGetFunctionPointer" in deb.truth["deb-two-owners"]["modules"]["nvitop"]["import_error"]


def test_an_entrypoint_the_image_lacks_is_the_first_finding(deb):
    # #15 item 7: `python` on Debian (python3 only): the container exits 127
    assert deb.truth["deb-python-missing"]["entrypoint_found"] is False
    code, _, text = run(deb.ref("deb-python-missing"), *_only("deb-python-missing"))
    lines = text.splitlines()
    assert code == 3 and lines[2].startswith("  FINDING: 'python' is not on the image's PATH")
    assert "exits 127" in lines[2] and lines[-1].startswith("  result: NOT OK ('python' is not on the image's PATH")


def test_a_non_utf8_pth_is_a_start_up_failure_not_a_bubblewrap_problem(deb):
    # #13 item 7: --execute on a non-UTF-8 .pth suggested installing bubblewrap
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    code, doc, text = run(deb.ref("deb-bad-pth"), "--json", "--execute", *_only("deb-bad-pth"))
    assert code == 3 and "hint" not in text and "apt-get install -y bubblewrap" not in text
    x = doc["result"]["execute"]
    assert x["agrees"] and x["notes"] == ["the static analysis predicted this failure"]
    assert doc["result"]["findings"][0]["kind"] == "startup-fails"
    assert "legacy.pth is not valid UTF-8" in doc["result"]["findings"][0]["summary"]


def test_device_nodes_and_setuid_bits_are_notes_not_refusals(deb):
    # #15 items 1 and 7: the base layer is a whole root file system (mmdebstrap: /dev/console, /dev/null ...)
    code, doc, out = run(deb.ref("deb-clean"), "--json", *_only("deb-clean"))
    notes = doc["result"]["notes"]
    assert any("device nodes in the layers skipped" in n for n in notes)
    assert any("setuid/setgid bits" in n for n in notes)
    assert doc["result"]["warnings"] == [] and code == 0
    assert "warning:" not in run(deb.ref("deb-clean"), *_only("deb-clean"))[2]


@pytest.fixture(scope="module")
def bundle(deb, tmp_path_factory):
    """What ``umoci unpack`` leaves: BUNDLE/config.json (the runtime's view of the config) and BUNDLE/rootfs."""
    if shutil.which("umoci") is None:
        pytest.skip("umoci is not installed")
    out = tmp_path_factory.mktemp("bundle") / "incident"
    subprocess.run(["umoci", "unpack", "--image", f"{deb.layout}:deb-incident", str(out)], check=True,
                   capture_output=True, timeout=600)
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_an_unpacked_bundle_is_read_with_its_config(bundle):
    # #20 item 7: look for the config where unpackers leave it (umoci: config.json beside rootfs/)
    for ref in (f"dir:{bundle}/rootfs", f"dir:{bundle}"):
        code, doc, out = run(ref, "--json", "--only", "-m", "nvitop")
        assert doc["result"]["image"]["manifest_kind"] == "oci-runtime-bundle"
        assert doc["result"]["image"]["config_source"] == f"{bundle}/config.json"
        assert mod(doc, "nvitop")["verdict"] == "SHADOWED" and code == 3, out
        assert doc["result"]["python"]["working_dir"] == "/app"


def test_a_root_without_config_refuses_a_clean_ok(bundle, tmp_path):
    # #20 item 7: dir:ROOTFS with no config: the verdict depends on the entrypoint and working directory
    rootfs = bundle / "rootfs"
    moved = bundle / "config.json.away"
    os.rename(bundle / "config.json", moved)
    try:
        code, doc, text = run(f"dir:{rootfs}", "--json", "--only", "-m", "nvitop")
        assert code == 3 and kinds(doc) == ["no-config"]
        assert mod(doc, "nvitop")["verdict"] == "OK"  # from "/", which is not what the container runs
        assert any(n.startswith("/app/nvitop/__init__.py lies outside sys.path") for n in doc["result"]["notes"])
        code, _, text = run(f"dir:{rootfs}", "--only", "-m", "nvitop")
        assert text.rstrip().splitlines()[-1].startswith("  result: NOT OK (no image config")
        # with the command and the directory the container runs, the verdict is the image's
        code, doc, _ = run(f"dir:{rootfs}", "--json", "--only", "-m", "nvitop", "--entrypoint",
                           "python3 -m nvitop_exporter", "--workdir", "/app")
        assert code == 3 and kinds(doc) == [] and mod(doc, "nvitop")["verdict"] == "SHADOWED"
    finally:
        os.rename(moved, bundle / "config.json")


def test_strict_and_the_last_line_agree_with_the_exit_status(deb):
    # #20 item 7: --strict exited 3 under "result: OK"; an [error] known issue sat above "result: OK"
    for args in ([], ["--strict"]):
        for name in ("deb-clean", "deb-venv-system-site"):
            code, _, text = run(deb.ref(name), *args, *_only(name))
            last = text.rstrip().splitlines()[-1]
            assert (code == 0) == (last == "  result: OK"), (name, args, last)
    code, _, text = run(deb.ref("deb-venv-system-site"), "--strict", *_only("deb-venv-system-site"))
    assert "--strict: 1 requirement conflict(s)" in text.rstrip().splitlines()[-1]


def test_execute_fails_an_image_whose_interpreter_cannot_import_the_module(deb):
    # GIVEN an image whose every module is the file the static analysis expects, but whose own interpreter cannot
    # import nvitop: PyPI's psutil extension needs libpthread.so.0, which an upper layer deleted
    truth = deb.truth["deb-missing-lib"]["modules"]
    assert "libpthread.so.0" in truth["nvitop"]["import_error"], truth  # the oracle: the image's python3 fails
    assert "libpthread.so.0" in truth["psutil"]["import_error"], truth
    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    # WHEN it is verified with --execute (the gate an SRE puts before a rollout)
    code, _, text = run(deb.ref("deb-missing-lib"), "--execute", *_only("deb-missing-lib"))
    code_json, doc, _ = run(deb.ref("deb-missing-lib"), "--json", "--execute", *_only("deb-missing-lib"))
    # THEN it is NOT OK, exit 3 (it said OK, exit 0), with the ImportError, the missing file and the package dpkg
    # says provides it
    assert code == 3 and code_json == 3, text
    result = text.rstrip().splitlines()[-1]
    assert result.startswith("  result: NOT OK (nvitop cannot be imported: libpthread.so.0 missing (dpkg: libc6 "), \
        result
    assert "lists /lib/x86_64-linux-gnu/libpthread.so.0, not in the image (a layer deleted it)" in result, result
    assert "x nvitop: " in text and "(import error: ImportError: libpthread.so.0: cannot open shared object" in text
    ran = {m["module"]: m for m in doc["result"]["execute"]["modules"]}
    assert ran["nvitop"]["missing"] == ran["psutil"]["missing"] == "libpthread.so.0"
    assert ran["nvitop"]["provided_by"].startswith("dpkg: libc6 ")
    assert not doc["result"]["ok"] and "nvitop cannot be imported" in doc["result"]["failures"][0]
    # and without --execute the static verdicts stay OK: what the files are is not what runs
    assert run(deb.ref("deb-missing-lib"), *_only("deb-missing-lib"))[0] == 0
