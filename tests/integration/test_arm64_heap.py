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
    """The arm64 root of ``suite`` plus arm64/libcrash.so at the host path the guest core names."""
    from tests.arm64 import analysis_sysroot

    if suite not in _SYSROOTS:
        core = arm64_cores.core(suite, "heap-prev")
        lib = next(core.parent.parent.glob("arm64/libcrash.so"))
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
    assert a["freed_by"]["library"].endswith("/arm64/libcrash.so") and x["freed_by"]["library"].endswith("/libcrash.so")
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


TLS_PROBE = r"""
import ctypes, sys, threading, time
lib = ctypes.CDLL(sys.argv[1])
ready = threading.Event()
def worker():
    keep = [bytes(20000) for _ in range(8)]  # malloc() in this thread: its tcache and its arena
    ready.set()
    time.sleep(120)
t = threading.Thread(target=worker, daemon=True)
t.start()
ready.wait()
with open(sys.argv[2], "w") as f:
    f.write(f"{threading.get_native_id()} {threading.main_thread().ident} {t.native_id} {t.ident}\n")
lib.forensics_heap_overflow(0)
"""


def test_tcaches_above_the_thread_pointer(arm64_cores, tmp_path):
    """TLS variant I read on a real arm64 core: qemu-user writes no NT_ARM_TLS, so each thread's pointer is put
    in from what the guest's Python said (pthread_self() is the struct pthread below the thread pointer:
    TPIDR_EL0 = pthread_self() + sizeof(struct pthread), its size from the arm64 libc6-dbg, by gdb-multiarch)."""
    import dataclasses
    import shutil
    import subprocess

    from forensics.core import open_core
    from forensics.heap import read_heap
    from tests.arm64 import QEMU_IN_ROOT, analysis_sysroot, build_guest_libcrash, guest_python
    from tests.crashers.make_core import crash_for_core

    if shutil.which("gdb-multiarch") is None:
        pytest.skip("no gdb-multiarch (the oracle of sizeof(struct pthread))")
    root = arm64_cores.root("bookworm")
    lib = build_guest_libcrash(tmp_path)
    probe, said = tmp_path / "probe.py", tmp_path / "run" / "threads.txt"
    probe.write_text(TLS_PROBE)
    (tmp_path / "run").mkdir()
    qemu = Path(shutil.which("qemu-aarch64-static") or "qemu-aarch64-static")
    core_path = crash_for_core([QEMU_IN_ROOT, guest_python("bookworm"), str(probe), str(lib), str(said)],
                               tmp_path / "run", root=root, binds=(probe, lib), tools=((qemu, QEMU_IN_ROOT),),
                               guest=True, timeout=180, outputs=("threads.txt",))
    sysroot = analysis_sysroot(root, tmp_path / "sysroot", [lib])
    libc_debug = [p for p in (root / "usr" / "lib" / "debug" / ".build-id").glob("*/*.debug")
                  if b"main_arena" in p.read_bytes()]
    assert libc_debug
    out = subprocess.run(["gdb-multiarch", "-nx", "-batch", "-ex", "print sizeof(struct pthread)",
                          str(libc_debug[0])], capture_output=True, text=True, timeout=120).stdout
    pthread_size = int(out.rsplit("=", 1)[1])
    main_tid, main_self, worker_tid, worker_self = map(int, said.read_text().split())
    # GIVEN the core's threads with their thread pointers (the note qemu-user does not write)
    core = open_core(str(core_path), sysroot=str(sysroot))
    tps = {main_tid: main_self + pthread_size, worker_tid: worker_self + pthread_size}
    assert set(tps) == {t.tid for t in core.threads}
    with_tp = dataclasses.replace(core, threads=tuple(dataclasses.replace(t, fs_base=tps[t.tid]) for t in core.threads))
    # WHEN the heap's tcaches are read
    found = {t.tid: t for t in read_heap(with_tp, sysroot=str(sysroot), corruption=False, summary=True).summary.tcaches}
    guessed = {t.tid: t for t in read_heap(core, sysroot=str(sysroot), corruption=False, summary=True).summary.tcaches}
    # THEN each is found in libc's TLS block above the thread pointer, at the offset of the tcache symbol
    for tid in tps:
        assert found[tid].address is not None and "thread pointer+0x" in found[tid].found_by, found[tid]
    # the main thread's is the one read without the thread pointer; the worker's lies in its own thread arena
    assert found[main_tid].address == guessed[main_tid].address
    assert found[worker_tid].arena is not None and found[worker_tid].arena != found[main_tid].arena
    assert guessed[worker_tid].address is None
