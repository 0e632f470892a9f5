"""The simulated NVML and the C reproducer built for arm64 nodes (GH200/GB200) and run here under qemu-user.

The arm64 builds come from Debian's cross compiler (gcc-aarch64-linux-gnu, installed by .ci/setup); they run
under ``qemu-aarch64-static -L <arm64 root>``, named explicitly (binfmt_misc is not mounted here).  The root
is Debian's arm64 C library as the cross toolchain ships it (libc6-arm64-cross: /usr/aarch64-linux-gnu), the
loader and libc a Debian arm64 node runs.
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
from forensics.errors import EXIT_FINDINGS, BuildError
from forensics.simnvml import build_c_reproducer, build_simnvml, elf_arch, guest_command, host_arch, sim_environment

CROSS_ROOT = Path("/usr/aarch64-linux-gnu")

pytestmark = [
    pytest.mark.skipif(host_arch() != "x86_64", reason="the arm64 builds are cross builds from an x86_64 machine"),
    pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                       reason="no aarch64-linux-gnu-gcc (Debian: gcc-aarch64-linux-gnu; .ci/setup installs it)"),
    pytest.mark.skipif(shutil.which("qemu-aarch64-static") is None, reason="no qemu-aarch64-static (qemu-user-static)"),
    pytest.mark.skipif(not (CROSS_ROOT / "lib" / "ld-linux-aarch64.so.1").is_file(),
                       reason=f"no arm64 C library in {CROSS_ROOT} (Debian: libc6-arm64-cross)"),
]


@pytest.fixture(scope="module")
def arm64(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("simnvml-arm64")
    return build_simnvml(d / "sim", arch="arm64"), build_c_reproducer(d / "bin", arch="aarch64")


def machine(path: Path) -> str:
    out = subprocess.run(["readelf", "-h", str(path)], capture_output=True, text=True, check=True).stdout
    return next(ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.strip().startswith("Machine:"))


def test_arm64_builds_are_aarch64_elf_laid_out_as_a_driver_install(arm64):
    lib_dir, exe = arm64
    lib = lib_dir / "libnvidia-ml.so.580.126.09"
    # THEN both are AArch64 objects, the library with the driver's soname and its link
    assert machine(lib) == machine(exe) == "AArch64"
    assert elf_arch(lib) == elf_arch(exe) == "aarch64"
    assert os.readlink(lib_dir / "libnvidia-ml.so.1") == lib.name
    assert "[libnvidia-ml.so.1]" in subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    dynsym = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
    for fn in ("nvmlInitWithFlags", "nvmlDeviceGetFieldValues", "nvmlShutdown"):
        assert f" {fn}\n" in dynsym or dynsym.rstrip().endswith(f" {fn}")


def test_a_build_of_the_other_architecture_is_rebuilt(tmp_path):
    # GIVEN the library built for this machine
    lib = build_simnvml(tmp_path) / "libnvidia-ml.so.580.126.09"
    assert elf_arch(lib) == "x86_64"
    # WHEN the same directory is asked for arm64, then for this machine again
    build_simnvml(tmp_path, arch="arm64")
    arm = elf_arch(lib)
    build_simnvml(tmp_path)
    # THEN each time the file is of the architecture asked for (not "up to date" by its mtime)
    assert (arm, elf_arch(lib)) == ("aarch64", "x86_64")


def test_no_cross_compiler_or_unknown_architecture_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(BuildError, match="aarch64-linux-gnu-gcc not found on PATH .*gcc-aarch64-linux-gnu"):
        build_simnvml(tmp_path, arch="aarch64")
    with pytest.raises(ValueError, match="unknown architecture 'riscv64'"):
        build_c_reproducer(tmp_path, arch="riscv64")
    with pytest.raises(BuildError, match="qemu-aarch64-static not found"):
        guest_command(["/bin/true"], "arm64", CROSS_ROOT)


def test_the_arm64_reproducer_queries_the_simulated_node_under_qemu(arm64, tmp_path):
    lib_dir, exe = arm64
    # WHEN the arm64 C reproducer runs on the arm64 simulated NVML under qemu-user, without a fault
    env = sim_environment(lib_dir, gpus=2)
    proc = subprocess.run(guest_command([str(exe), "--iterations", "3", "--threads", "1"], "arm64", CROSS_ROOT),
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    # THEN it ran as an arm64 process (the kernel line qemu reports is aarch64) on the simulated GPUs
    assert proc.returncode == 0, proc.stderr
    assert "aarch64" in next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("kernel:"))
    assert "libnvidia-ml.so.580.126.09" in proc.stdout and "2 x NVIDIA H20" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("VERDICT: clean: 2 GPUs x 18 links x 3 iterations, no crash")


def test_reproduce_arch_arm64_crashes_the_arm64_reproducer_and_keeps_its_guest_core(tmp_path):
    # WHEN forensics reproduce builds both for arm64 and runs the C reproducer with the heap fault under qemu
    r = CliRunner().invoke(cli, ["reproduce", "--sim", "--sim-fault", "heap", "--arch", "arm64", "--sysroot",
                                 str(CROSS_ROOT), "--workdir", str(tmp_path), "--iterations", "20", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == EXIT_FINDINGS, r.output
    doc = json.loads(r.stdout)
    # THEN only the C reproducer ran (no arm64 interpreter was named), under qemu, and glibc aborted it
    (run,) = doc["runs"]
    assert run["name"] == "c" and run["command"][:3] == [shutil.which("qemu-aarch64-static"), "-L", str(CROSS_ROOT)]
    assert run["outcome"].startswith("crashed (SIGABRT)")
    assert run["verdict"].startswith("crashed: SIGABRT inside call #")
    assert doc["environment"]["libnvidia_ml"].endswith("simnvml-aarch64/libnvidia-ml.so.580.126.09")
    assert "aarch64" in doc["environment"]["kernel"]
    # and, its calls from worker threads having crashed, it ran once more making the same calls from the main thread
    # (#40 item 3), under qemu too: the simulated heap fault fires in any thread's calls (--sim-fault-thread any, the
    # default; the x86_64 run in test_incidents' test_driver_fault crashes from the main thread too), so that run
    # crashed as well and the conclusion says so
    main = doc["main_thread"]
    assert main["command"][:3] == run["command"][:3] and main["command"][main["command"].index("--threads") + 1] == "0"
    assert (main["status"], main["outcome"], main["thread_only"]) == ("crashed", "crashed (SIGABRT)", False)
    assert doc["conclusion"] == ("the C reproducer failed (the Python one did not run): suspect the driver library; "
                                 "the same calls from the main thread crashed (SIGABRT) too")
    # and the core is the one qemu wrote of the arm64 program; the emulator's own core is not left beside it
    core = Path(run["core"])
    assert core.name.startswith("qemu_nvml_nvlink_fieldvalues_") and machine(core) == "AArch64"
    assert not (core.parent / "core").exists()
    # and so for the run from the main thread, beside it
    (main_core,) = (core.parent.parent / "c-main-thread").glob("qemu_nvml_nvlink_fieldvalues_*.core")
    assert machine(main_core) == "AArch64" and not (main_core.parent / "core").exists()


def test_reproduce_another_arch_needs_a_root(tmp_path):
    r = CliRunner().invoke(cli, ["reproduce", "--sim", "--arch", "arm64", "--workdir", str(tmp_path)])
    assert r.exit_code == 2 and "--arch arm64 is not this machine's (x86_64): give --sysroot" in r.output


def test_reproduce_arch_arm64_runs_both_reproducers_with_the_roots_python(tmp_path, monkeypatch, core_pattern):
    from forensics.simnvml import ensure_stack_venv
    from tests.arm64 import guest_problem, guest_python, guest_root
    from tests.roots import RootUnavailable

    if guest_problem():
        pytest.skip(guest_problem())
    try:
        root = guest_root("bookworm")
        stack = ensure_stack_venv("incident")
    except (RootUnavailable, BuildError) as e:
        pytest.skip(f"no arm64 root or no incident stack: {e}")
    # GIVEN nvidia-ml-py of the incident (pure Python) on PYTHONPATH, the root's CPython named as the guest sees it
    found = subprocess.run([str(stack), "-c", "import pynvml; print(pynvml.__file__)"], capture_output=True,
                           text=True, check=True, timeout=120).stdout.strip()
    binding = tmp_path / "binding"
    binding.mkdir()
    shutil.copy2(found, binding / "pynvml.py")
    monkeypatch.setenv("PYTHONPATH", str(binding))
    before = {p: p.stat().st_mtime_ns for p in (root, root / "tmp", root / "usr" / "lib")}
    # WHEN forensics reproduce runs both on the arm64 simulated NVML with the heap fault
    r = CliRunner().invoke(cli, ["reproduce", "--sim", "--sim-fault", "heap", "--arch", "arm64", "--sysroot",
                                 str(root), "--python", guest_python("bookworm"), "--workdir", str(tmp_path / "w"),
                                 "--iterations", "20", "--json"], catch_exceptions=False)
    assert r.exit_code == EXIT_FINDINGS, r.output
    doc = json.loads(r.stdout)
    runs = {run["name"]: run for run in doc["runs"]}
    # THEN the Python reproducer ran the root's interpreter under qemu, and both crashed: the driver's fault
    assert runs["python"]["command"][3] == str(root / "usr" / "bin" / "python3.11")
    assert all(run["outcome"].startswith("crashed (SIGABRT)") for run in runs.values()), runs
    assert all(Path(run["core"]).name.startswith("qemu_") for run in runs.values())
    assert doc["environment"]["python"].startswith("CPython 3.11.")
    assert doc["conclusion"].startswith("both reproducers failed, the C one without Python: suspect the driver")
    # and each core was analyzed with the root plus what qemu loaded from this machine's paths (the reproducer,
    # the simulated driver): the crash is in the driver's own code, as on x86_64
    for run in runs.values():
        assert run["signature"].startswith('SIGABRT "double free or corruption (!prev)" [heap-corruption]'), run
        assert "via nvlink_scratch_overflow (libnvidia-ml.so" in run["signature"], run["signature"]
    assert (tmp_path / "w" / "sysroot-aarch64" / "usr" / "bin" / "python3.11").is_file()
    # and the root itself was not written
    assert {p: p.stat().st_mtime_ns for p in before} == before
    # and the C reproducer's crash is one bug with its x86_64 twin's (the same fault on this machine's build)
    from forensics.reproduce import run_reproducers

    x86 = run_reproducers(workdir=tmp_path / "x86", python="", nvml_dir=None, which=("c",), iterations=20,
                          env=sim_environment(build_simnvml(tmp_path / "x86" / "sim"), fault="heap"))
    assert x86.runs[0].fingerprint == runs["c"]["fingerprint"] and x86.runs[0].signature.split(" via ")[1] == \
        runs["c"]["signature"].split(" via ")[1].replace("libnvidia-ml.so.1", "libnvidia-ml.so.580.126.09")
