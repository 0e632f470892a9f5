"""glibc's heap in AArch64 cores (issue #31 item 3), read on this x86_64 machine with --sysroot.

The heap crasher (tests/crashers/exporter.py + libcrash.c, cross-compiled) dies under qemu-user in the
arm64 roots of tests/arm64.py: bookworm (CPython 3.11, glibc 2.36) and sid (CPython 3.14, glibc 2.43,
whose arm64 free() tail-calls _int_free_chunk and leaves no frame), each with libc6-dbg.  Its x86_64
twin is the same scenario under CPython of the same minor version (this machine's 3.11; Debian's 3.14 in
the x86_64 sid root).  Each is analyzed as `forensics analyze --json` does: the heap's anatomy, the
class, and the fingerprint -- one bug, one fingerprint on both machines.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK
from tests.conftest import PYTHONS

#: (arm64 suite, the x86_64 twin's interpreter: tests/conftest.py CoreFactory's key)
SUITES = [pytest.param("bookworm", "3.11", id="suite=bookworm"), pytest.param("sid", "sid-3.14", id="suite=sid")]


def analyze(core: Path, sysroot: Path | None = None) -> dict:
    args = ["analyze", "--json", str(core)] + (["--sysroot", str(sysroot)] if sysroot else [])
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    return json.loads(r.stdout)["analysis"]


_SYSROOTS: dict[str, Path] = {}


def arm64_sysroot(arm64_cores, suite: str, base: Path) -> Path:
    """The arm64 root of ``suite`` plus libcrash-arm64.so at the host path the guest core names."""
    from tests.arm64 import analysis_sysroot

    if suite not in _SYSROOTS:
        core = arm64_cores.core(suite, "heap-prev")
        lib = next(core.parent.parent.glob("libcrash-arm64.so"))
        base.mkdir(parents=True, exist_ok=True)
        _SYSROOTS[suite] = analysis_sysroot(arm64_cores.root(suite), base / suite, [lib])
    return _SYSROOTS[suite]


@pytest.mark.parametrize("suite, twin", SUITES)
@pytest.mark.parametrize("scenario", ["heap-prev", "heap-next-size"])
def test_the_heap_verdict_and_the_fingerprint_are_the_twins(scenario, suite, twin, arm64_cores, cores,
                                                              tmp_path_factory):
    if not twin.startswith("sid-") and twin not in PYTHONS:
        pytest.skip(f"no CPython {twin} on this machine for the x86_64 twin")
    # GIVEN the heap overflow crashed on arm64 (under qemu) and on this machine
    sysroot = arm64_sysroot(arm64_cores, suite, tmp_path_factory.getbasetemp() / "arm64-sysroots")
    arm = analyze(arm64_cores.core(suite, scenario), sysroot)
    x86 = analyze(cores.get(twin, scenario), cores.interpreter(twin).root)
    # THEN the arm64 core is read as one (AArch64, with glibc's abort message)
    assert arm["crash"]["kind"] == x86["crash"]["kind"] == "heap-corruption"
    assert arm["crash"]["abort_message"] == x86["crash"]["abort_message"]
    # and the heap's anatomy is the twin's: the chunk that overflowed, its size, the overflow, who freed it
    a, x = arm["heap"]["corruption"], x86["heap"]["corruption"]
    assert arm["heap"]["problems"] == []
    assert a["message"] == x["message"] and a["verdict"] == x["verdict"] == "library-own-buffer", a["verdict_reason"]
    assert a["overflowed"]["size"] == x["overflowed"]["size"] == 0x510
    assert a["usable_size"] == x["usable_size"] and a["overflow_past_usable"] == x["overflow_past_usable"]
    assert a["first_bytes"] == x["first_bytes"]
    assert a["freed_by"]["function"] == x["freed_by"]["function"] == "forensics_heap_overflow"
    assert a["freed_by"]["library"].endswith("/libcrash-arm64.so")
    assert a["damaged"]["address"] - a["overflowed"]["address"] == x["damaged"]["address"] - x["overflowed"]["address"]
    # and one bug has one fingerprint on both machines, complete on both
    assert arm["fingerprint_basis"] == x86["fingerprint_basis"]
    assert arm["fingerprint"] == x86["fingerprint"] and arm["fingerprint_partial"] is None


@pytest.mark.parametrize("suite, twin", SUITES)
def test_the_main_threads_tcache_without_a_thread_pointer(suite, twin, arm64_cores, cores, tmp_path_factory):
    if not twin.startswith("sid-") and twin not in PYTHONS:
        pytest.skip(f"no CPython {twin} on this machine for the x86_64 twin")
    # GIVEN the arm64 core (qemu-user writes no NT_ARM_TLS: no thread pointer) and its twin (fs_base in NT_PRSTATUS)
    sysroot = arm64_sysroot(arm64_cores, suite, tmp_path_factory.getbasetemp() / "arm64-sysroots")
    arm = analyze_heap(arm64_cores.core(suite, "heap-prev"), sysroot)
    x86 = analyze_heap(cores.get(twin, "heap-prev"), cores.interpreter(twin).root)
    # THEN on x86_64 the main thread's tcache, found through its TLS block, is where it is read without the thread
    # pointer on arm64: as far into the main heap (the first chunk; glibc 2.43: the second, after a 0x40 one)
    where = []
    for h in (x86, arm):
        main_heap = next(a for a in h["summary"]["arenas"] if a["kind"] == "main")["heaps"][0]
        tcache = next(t for t in h["summary"]["tcaches"] if t["tid"] == h["pid"])
        assert tcache["bins"] and all(b["broken_at"] is None for b in tcache["bins"])
        where.append(tcache["address"] - main_heap["first_chunk"])
    assert where[0] == where[1] == (16 if suite == "bookworm" else 0x50), where
    assert "TLS block" in next(t for t in x86["summary"]["tcaches"] if t["tid"] == x86["pid"])["found_by"]
    main = next(t for t in arm["summary"]["tcaches"] if t["tid"] == arm["pid"])
    assert main["found_by"].startswith("the main heap's first chunk of a tcache's size, the main thread's")
    # and another thread's is not guessed: it says why
    others = [t for t in arm["summary"]["tcaches"] if t["tid"] != arm["pid"]]
    assert others and all(t["address"] is None and "NT_ARM_TLS" in t["found_by"] for t in others)


def analyze_heap(core: Path, sysroot: Path | None) -> dict:
    args = ["analyze", "--heap", "--json", str(core)] + (["--sysroot", str(sysroot)] if sysroot else [])
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    return {"summary": a["heap"]["summary"], "pid": a["snapshot"]["core"]["pid"]}
