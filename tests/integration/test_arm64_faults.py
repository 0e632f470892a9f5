"""Faults in AArch64 cores (issue #31 item 3): the fault address of a qemu-user core, which has no NT_SIGINFO,
read from the faulting instruction; the first fault under a handler read from the arm64 signal frame.

exporter.py's ``segv`` (libcrash.c writes through 0x10) dies under qemu-user in the bookworm arm64 root
with libcrash.so cross-compiled under its own name (the fingerprint names the faulting object); its
x86_64 twin is the same scenario under this machine's CPython 3.11.  tests/crashers/nested_handler.c
dies with a handler on its stack.
"""
from __future__ import annotations

import json
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK
from tests.conftest import PYTHONS
from tests.crashers.make_core import EXPORTER, build_libcrash, crash_for_core

SUITE, TWIN = "bookworm", "3.11"
NESTED = Path(__file__).resolve().parent.parent / "crashers" / "nested_handler.c"


def analyze(core: Path, *args: str) -> dict:
    r = CliRunner().invoke(cli, ["analyze", "--json", *args, str(core)], catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    return json.loads(r.stdout)["analysis"]


@pytest.fixture(scope="module")
def guest(arm64_cores, tmp_path_factory) -> dict[str, Path]:
    from tests.arm64 import CROSS_CC, QEMU_IN_ROOT, analysis_sysroot, guest_python

    root = arm64_cores.root(SUITE)
    d = tmp_path_factory.mktemp("arm64-faults")
    lib = build_libcrash(d / "lib", cc=CROSS_CC)  # libcrash.so, as on x86_64
    run = d / "segv"
    run.mkdir()
    qemu = Path(shutil.which("qemu-aarch64-static") or "qemu-aarch64-static")
    core = crash_for_core([QEMU_IN_ROOT, guest_python(SUITE), str(EXPORTER), str(lib), "segv"], run, root=root,
                          binds=(EXPORTER, lib), tools=((qemu, QEMU_IN_ROOT),), guest=True, timeout=180)
    nested = d / "nested_handler"
    subprocess.run([CROSS_CC, "-O1", "-g", "-o", str(nested), str(NESTED)], check=True, timeout=120)
    out = {"segv": core, "root": root, "nested": nested,
           "sysroot": analysis_sysroot(root, d / "sysroot", [lib, nested])}
    for mode in ("abort-then-segv", "segv-then-abort"):
        run = d / mode
        run.mkdir()
        subprocess.run([str(qemu), "-L", str(root), str(nested), mode], cwd=run, capture_output=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
        (out[mode],) = run.glob("qemu_nested_handler_*.core")
    return out


def test_a_segv_without_siginfo_has_its_address_and_the_twins_fingerprint(guest, cores):
    if TWIN not in PYTHONS:
        pytest.skip(f"no CPython {TWIN} on this machine for the x86_64 twin")
    arm = analyze(guest["segv"], "--sysroot", str(guest["sysroot"]))
    x86 = analyze(cores.get(TWIN, "segv"))
    # THEN the write through 0x10 is a near-null SIGSEGV at 0x10 on both machines: on arm64 from the faulting
    # store (str w1, [x0]) and the registers, the core having no NT_SIGINFO
    for a in (arm, x86):
        assert (a["crash"]["signal_name"], a["crash"]["fault_address"], a["crash"]["fault_kind"]) == \
            ("SIGSEGV", 0x10, "near-null")
    assert arm["signature"].startswith("SIGSEGV at 0x10 (near-null) [segv]")
    # and one bug, one fingerprint
    assert arm["fingerprint_basis"] == x86["fingerprint_basis"] and arm["fingerprint"] == x86["fingerprint"]


def test_a_faulting_handler_leaves_the_first_fault_the_crash(guest):
    sysroot = str(guest["sysroot"])
    # GIVEN glibc's abort, whose SIGABRT handler then read through 0x10
    a = analyze(guest["abort-then-segv"], "--sysroot", sysroot)
    # THEN the crash is the heap corruption; the handler's fault follows, named
    assert a["crash"]["kind"] == "heap-corruption"
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    then = a["crash"]["then"]
    assert (then["signal_name"], then["fault_address"], then["handler"]["name"]) == ("SIGSEGV", 0x10, "on_abort")
    assert a["crash"]["exit_status"] == 139
    # GIVEN a store to 0x28, whose SIGSEGV handler then called abort()
    b = analyze(guest["segv-then-abort"], "--sysroot", sysroot)
    # THEN the crash is the SIGSEGV at 0x28, read from the arm64 signal frame under the handler
    assert (b["crash"]["signal_name"], b["crash"]["fault_address"]) == ("SIGSEGV", 0x28)
    assert b["crash"]["then"]["signal_name"] == "SIGABRT" and b["crash"]["then"]["handler"]["name"] == "on_segv"
    crashed = next(t for t in b["snapshot"]["threads"] if t["is_crashed"])
    (frame,) = crashed["signal_frames"]
    assert frame["fault_address"] == 0x28 and frame["esr"] is None and frame["native_index"] is not None
