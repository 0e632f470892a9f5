"""The incident on an arm64 node (issue #31 item 3): the simulated NVML built for arm64, the NVLink query
crashed under qemu-user in the arm64 roots, and the incident's conclusion reached from its core on
this x86_64 machine -- as on x86_64.

The Python reproducer (reproducers/nvml_nvlink_fieldvalues.py, nvidia-ml-py 12.575.51 of the incident: a
pure-Python module, copied from the incident's stack) runs under the root's CPython (bookworm's 3.11,
sid's 3.14) on the arm64
libnvidia-ml.so.580.126.09 with the heap fault (the library overflows its own scratch buffer and frees
it: glibc aborts inside nvmlDeviceGetFieldValues); the C reproducer, built for arm64, runs under
`forensics reproduce --arch arm64`.  The x86_64 twin is the same reproducer on the x86_64 build.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK, BuildError
from forensics.output import json_document
from forensics.reproduce import reproduce_payload, run_reproducers
from forensics.resources import find_reproducers
from forensics.simnvml import build_simnvml, ensure_stack_venv, sim_environment
from tests.crashers.make_core import crash_for_core
from tests.helpers import pyelftools_build_id

#: bookworm: CPython 3.11, glibc 2.36; sid: CPython 3.14, glibc 2.43, return addresses signed (qemu's CPU has PAC)
SUITES = ("bookworm", "sid")
REPRO_PY = find_reproducers() / "nvml_nvlink_fieldvalues.py"
ARGS = ["--iterations", "50", "--threads", "0"]
LIB = "libnvidia-ml.so.580.126.09"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module", params=SUITES, ids=lambda s: f"suite={s}")
def incident(request, arm64_cores, core_pattern, tmp_path_factory) -> dict[str, Path]:
    from tests.arm64 import QEMU_IN_ROOT, analysis_sysroot, guest_python

    suite = request.param
    root = arm64_cores.root(suite)
    try:
        stack = ensure_stack_venv("incident")
    except BuildError as e:
        pytest.skip(f"the incident's stack is unavailable: {e}")
    d = tmp_path_factory.mktemp("arm64-incident")
    # the incident's binding, pure Python: the same file on both machines
    binding = d / "binding"
    binding.mkdir()
    found = subprocess.run([str(stack), "-c", "import pynvml; print(pynvml.__file__)"], capture_output=True,
                           text=True, check=True, timeout=120).stdout.strip()
    shutil.copy2(found, binding / "pynvml.py")
    out: dict[str, Path] = {"root": root, "stack": stack, "dir": d}
    for arch in ("arm64", "x86_64"):
        sim = build_simnvml(d / f"sim-{arch}", arch=arch)
        env = sim_environment(sim, fault="heap", fault_after=2, detect="later", base={})
        env["PYTHONPATH"] = str(binding)
        run_dir = d / f"python-{arch}"
        run_dir.mkdir()
        if arch == "arm64":
            qemu = Path(shutil.which("qemu-aarch64-static") or "qemu-aarch64-static")
            argv = [QEMU_IN_ROOT, guest_python(suite), str(REPRO_PY), *ARGS]
            out["core-arm64"] = crash_for_core(argv, run_dir, env=env, root=root, guest=True, timeout=300,
                                               binds=(REPRO_PY.parent, sim, binding), tools=((qemu, QEMU_IN_ROOT),))
            sysroot = analysis_sysroot(root, d / "sysroot", [sim / LIB, binding / "pynvml.py", REPRO_PY])
            # the driver's layout: the soname link the dynamic linker's list names, to the versioned file
            os.symlink(LIB, sysroot / sim.relative_to("/") / "libnvidia-ml.so.1")
            out["sysroot"] = sysroot
        else:
            out["core-x86_64"] = crash_for_core([str(stack), str(REPRO_PY), *ARGS], run_dir, env=env,
                                                timeout=300)
        out[f"sim-{arch}"] = sim
    return out


def analysis_json(core: Path, out: Path, sysroot: Path | None = None) -> dict:
    args = ["analyze", "--json", "-o", str(out), str(core)] + (["--sysroot", str(sysroot)] if sysroot else [])
    r = run(*args)
    assert r.exit_code == EXIT_OK, r.stderr
    return json.loads(out.read_text())["analysis"]


def test_the_arm64_core_is_the_driver_fault_of_the_x86_64_twin(incident):
    d = incident["dir"]
    # WHEN both cores are analyzed here, the arm64 one with the arm64 root as --sysroot
    arm = analysis_json(incident["core-arm64"], d / "analysis-arm64.json", incident["sysroot"])
    x86 = analysis_json(incident["core-x86_64"], d / "analysis-x86_64.json")
    # THEN the arm64 crash is glibc's abort inside the library's own code, during the NVLink query
    assert arm["crash"]["kind"] == "heap-corruption"
    assert arm["crash"]["abort_message"] == x86["crash"]["abort_message"] == "double free or corruption (!prev)"
    print("arm64:", arm["signature"], "\nx86_64:", x86["signature"])
    assert "via nvlink_scratch_overflow (libnvidia-ml.so" in arm["signature"], arm["signature"]
    assert "nvmlDeviceGetFieldValues (pynvml.py:" in arm["signature"]
    # and its heap says what the twin's says: the library's own buffer, freed by the library
    a, x = arm["heap"]["corruption"], x86["heap"]["corruption"]
    assert a["verdict"] == x["verdict"] == "library-own-buffer", a["verdict_reason"]
    assert a["freed_by"]["function"] == x["freed_by"]["function"] == "nvlink_scratch_overflow"
    assert "/libnvidia-ml.so" in a["freed_by"]["library"] and a["freed_by"]["call"] == "nvmlDeviceGetFieldValues"
    assert a["overflowed"]["size"] == x["overflowed"]["size"] and a["first_bytes"] == x["first_bytes"]
    # and one bug, one fingerprint, whichever machine it crashed on
    assert arm["fingerprint_basis"] == x86["fingerprint_basis"]
    assert arm["fingerprint"] == x86["fingerprint"] and arm["fingerprint_partial"] is None


def test_the_incident_conclusion_from_the_arm64_core_and_reproducer(incident):
    d = incident["dir"]
    analysis = d / "analysis-arm64-report.json"
    analysis_json(incident["core-arm64"], analysis, incident["sysroot"])
    # GIVEN the C reproducer, built for arm64 and run under qemu in the same root, on the same fault
    env = sim_environment(incident["sim-arm64"], fault="heap", fault_after=2, detect="later", base=dict(os.environ))
    rep = run_reproducers(workdir=d / "reproduce", python="", nvml_dir=None, env=env, iterations=20, threads=0,
                          which=("c",), arch="arm64", sysroot=str(incident["root"]), analyze=False, timeout=300)
    (c,) = rep.runs
    assert c.crashed and c.signal == "SIGABRT" and c.core and Path(c.core).name.startswith("qemu_")
    reproduce = d / "reproduce.json"
    reproduce.write_text(json_document("reproduce", reproduce_payload(rep)) + "\n")
    for evidence, why in (([analysis], "the heap alone"), ([analysis, reproduce], "the heap and the C reproducer")):
        out = d / f"report-{len(evidence)}.md"
        r = run("report", "--template", "nvml", "-o", str(out), *map(str, evidence))
        assert r.exit_code == EXIT_OK, r.stderr
        front = out.read_text().split("\n---", 1)[0]
        # THEN the incident's class is the driver's, as on x86_64
        assert 'conclusion: "driver-fault"' in front, (why, front)


def test_the_arm64_core_names_the_driver_file_the_x86_64_twin_names(incident):
    """qemu's core has no NT_FILE: the dynamic linker's list names the driver as it was loaded (the soname link,
    libnvidia-ml.so.1); the evidence is which driver file that was, its version in its name, as the kernel's
    NT_FILE names it in the twin's core."""
    d = incident["dir"]
    # WHEN both cores are analyzed, the arm64 one with its root as --sysroot (the soname a link to the file there)
    arm = analysis_json(incident["core-arm64"], d / "names-arm64.json", incident["sysroot"])
    x86 = analysis_json(incident["core-x86_64"], d / "names-x86_64.json")
    # THEN the arm64 core names the file the link resolves to inside the sysroot, as the twin does
    a, x = arm["snapshot"]["core"]["nvml"], x86["snapshot"]["core"]["nvml"]
    assert Path(a["path"]).name == Path(x["path"]).name == LIB, (a, x)
    assert a["driver_version"] == x["driver_version"] == "580.126.09"
    assert a["version_source"] == x["version_source"] == "file-name"
    assert f"via nvlink_scratch_overflow ({LIB})" in arm["signature"], arm["signature"]
    # and the library keeps the name it was loaded by, its file the one whose build-id was read
    (lib,) = [lib for lib in arm["snapshot"]["core"]["libraries"] if Path(lib["path"]).name == LIB]
    loaded = Path(lib["loaded_as"])
    assert loaded.name == "libnvidia-ml.so.1" and loaded.parent == Path(lib["path"]).parent
    sim_file = incident["sim-arm64"] / LIB
    assert lib["file_path"] == str(incident["sysroot"]) + str(sim_file) and lib["status"] in ("ok", "unverified")
    assert lib["file_build_id"] == pyelftools_build_id(sim_file)
