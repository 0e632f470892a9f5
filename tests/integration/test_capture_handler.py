"""forensics core-handler on real kernel cores: fed as the kernel feeds it, and installed for real.

Cores come from real crashing processes: ``tests/crashers/exporter.py`` (Python + libcrash.so)
and a small C program compiled here (``crasher.c`` below: small cores, fast to make many).
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import zstandard

from forensics.bundle import bundle_sysroot, verify_manifest
from forensics.capture.handler import HandlerConfig, run_core_handler
from forensics.bundle.record import CoreState
from forensics.core import open_core
from forensics.model import LibraryStatus

ROOT = Path(__file__).resolve().parents[2]
FORENSICS = Path(sys.executable).parent / "forensics"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root")

CRASHER_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
/* usage: crasher MODE [FIFO]   MODE: segv | abort | sleep | random-segv (8 MiB of random heap first) */
int main(int argc, char **argv) {
    if (argc > 2) { int fd = open(argv[2], O_WRONLY); write(fd, "ready\n", 6); close(fd); }
    if (!strcmp(argv[1], "sleep")) { for (;;) pause(); }
    if (!strcmp(argv[1], "random-segv")) {
        size_t n = 8u << 20; unsigned char *b = malloc(n); int r = open("/dev/urandom", O_RDONLY);
        size_t got = 0; while (got < n) { ssize_t k = read(r, b + got, n - got); if (k <= 0) break; got += k; }
        fprintf(stderr, "%d\n", b[n / 2]);
    }
    if (!strcmp(argv[1], "abort")) abort();
    *(volatile int *)16 = 1;
    return 0;
}
"""


@pytest.fixture(scope="module")
def crasher(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("crasher")
    (d / "crasher.c").write_text(CRASHER_C)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(d / "crasher"), str(d / "crasher.c")], check=True)
    return d / "crasher"


def _core_of(crasher: Path, mode: str, directory: Path) -> Path:
    """A real kernel core of the C crasher (core_pattern must be a plain name: the session fixture)."""
    run = Path(tempfile.mkdtemp(prefix=f"core-{mode}-", dir=directory))

    def setup():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    p = subprocess.run([str(crasher), mode], cwd=run, preexec_fn=setup, capture_output=True, timeout=60)
    assert p.returncode < 0, p
    cores = list(run.iterdir())
    assert cores, f"no core in {run}"
    return cores[0]


@pytest.fixture(scope="module")
def small_cores(crasher, tmp_path_factory, core_pattern) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("small-cores")
    return {m: _core_of(crasher, m, d) for m in ("segv", "abort")}


@pytest.fixture
def live(crasher):
    """A live process whose /proc the handler reads (the kernel keeps the dying one alive the same way)."""
    p = subprocess.Popen([str(crasher), "sleep"])
    try:
        time.sleep(0.05)
        yield p
    finally:
        p.kill()
        p.wait()


def _handler_cli(core_dir: Path, pid: int, sig: int, core: Path, limit: str = "18446744073709551615", *extra: str):
    """Run the handler as the kernel does: absolute path, no environment, cwd /, core on stdin."""
    cmd = [str(FORENSICS), "core-handler", str(core_dir), str(pid), str(pid), str(sig), str(int(time.time())), limit,
           *extra]
    with open(core, "rb") as f:
        return subprocess.run(cmd, stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)


def _crashes(core_dir: Path) -> list[Path]:
    return sorted((core_dir / "crashes").iterdir())


def _decompress(path: Path) -> bytes:
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()


def test_handler_fed_a_real_core_like_the_kernel(cores, newest_python, tmp_path, live):
    # GIVEN a real kernel core of the Python exporter and a live process for /proc
    core = cores.get(newest_python, "heap-prev")
    # WHEN the handler runs as the kernel runs it
    p = _handler_cli(tmp_path, live.pid, signal.SIGABRT, core)
    # THEN the core is kept whole, compressed, byte for byte
    assert p.returncode == 0, p.stderr
    (crash,) = _crashes(tmp_path)
    meta = json.loads((crash / "metadata.json").read_text())
    assert meta["state"] == "done" and meta["core"]["state"] == "kept"
    assert _decompress(crash / "50-core" / "core.zst") == core.read_bytes()
    assert meta["core"]["bytes_compressed"] < core.stat().st_size / 4
    # the process snapshot came from /proc of the live process, objects are in the store by build-id
    snap = json.loads((crash / "40-process" / "snapshot.json").read_text())
    assert snap["pid"] == live.pid
    assert snap["limits"]["Max core file size"]
    for path, key in meta["objects"].items():
        assert (tmp_path / "objects" / key[:2] / key[2:]).is_file(), path
    # the crash's pc is named from the core's own notes
    assert meta["crash_pc"]["signal"] == signal.SIGABRT and meta["crash_pc"]["module"].endswith("libc.so.6")
    assert verify_manifest(str(crash)) == []
    assert not list((crash / "50-core").glob(".*tmp*")) and not (crash / ".reserve").exists()


def test_handler_keeps_the_kernel_log_lines_of_the_crash(small_cores, tmp_path, live):
    # GIVEN an NVRM Xid line in the kernel log (written as the driver would, marked as a test line)
    marker = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={live.pid}, name=python3, GPU has fallen off the bus. " \
             f"[forensics test {uuid.uuid4().hex}]"
    try:
        with open("/dev/kmsg", "w") as k:
            k.write(marker + "\n")
    except OSError as e:
        pytest.skip(f"cannot write the kernel log here (/dev/kmsg: {e.strerror}); CI runs as root")
    # WHEN the handler takes a crash, kept and not kept
    for limit in ("18446744073709551615", "0"):
        assert _handler_cli(tmp_path, live.pid, signal.SIGSEGV, small_cores["segv"], limit).returncode == 0
    # THEN each bundle holds the line, listed with its digest in the manifest
    crashes = _crashes(tmp_path)
    assert len(crashes) == 2
    for crash in crashes:
        log = (crash / "30-kernel" / "kernel-nvidia.log").read_text()
        assert marker in log.splitlines()
        items = {i["path"] for i in json.loads((crash / "MANIFEST.json").read_text())["items"]}
        assert "30-kernel/kernel-nvidia.log" in items
        assert verify_manifest(str(crash)) == []


FAKE_SMI = """#!/bin/sh
# a stand-in for the driver's nvidia-smi (no GPU here): slow, and says what its stdin is
sleep {delay}
echo "Driver Version                            : 580.126.09"
echo "stdin: $(readlink /proc/self/fd/0)"
"""


def _fake_nvidia_smi(directory: Path, delay: float) -> str:
    bindir = directory / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "nvidia-smi").write_text(FAKE_SMI.format(delay=delay))
    (bindir / "nvidia-smi").chmod(0o755)
    return f"{bindir}:/usr/bin:/bin"


def _handler_on_a_pipe(core_dir: Path, pid: int, core: Path, path_env: str):
    """The handler reading a pipe, as from the kernel; (process, when it let go of the pipe)."""
    cmd = [str(FORENSICS), "core-handler", str(core_dir), str(pid), str(pid), "11", str(int(time.time())),
           "18446744073709551615"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": path_env}, cwd="/")
    proc.stdin.write(core.read_bytes())
    proc.stdin.close()
    released = None
    while proc.poll() is None:
        try:
            if os.readlink(f"/proc/{proc.pid}/fd/0") == "/dev/null":
                released = time.monotonic()
                break
        except OSError:
            pass
        time.sleep(0.01)
    return proc, released


def test_handler_lets_go_of_the_pipe_before_its_slow_work(small_cores, tmp_path, live):
    """With kernel.core_pipe_limit > 0 the kernel holds the dying process until the handler closes the pipe."""
    path_env = _fake_nvidia_smi(tmp_path, 2)
    proc, released = _handler_on_a_pipe(tmp_path / "cores", live.pid, small_cores["segv"], path_env)
    proc.wait(timeout=60)
    done = time.monotonic()
    err = proc.stderr.read().decode(errors="replace")
    assert proc.returncode == 0, err
    # the pipe was let go of once the core was in, seconds before the handler finished
    assert released is not None and done - released > 1.5
    (crash,) = _crashes(tmp_path / "cores")
    assert _decompress(crash / "50-core" / "core.zst") == small_cores["segv"].read_bytes()
    smi = (crash / "30-kernel" / "nvidia-smi.txt").read_text()
    # nvidia-smi ran at crash time, without the kernel's pipe as its stdin
    assert "580.126.09" in smi and "stdin: /dev/null" in smi


def test_handler_does_not_wait_for_a_hung_nvidia_smi(small_cores, tmp_path, live):
    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    (core_dir / "handler.json").write_text(json.dumps({"config": {"smi_timeout": 1, "min_free": 0}}))
    path_env = _fake_nvidia_smi(tmp_path, 60)
    t = time.monotonic()
    proc, released = _handler_on_a_pipe(core_dir, live.pid, small_cores["segv"], path_env)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode(errors="replace")
    assert proc.returncode == 0, err
    assert time.monotonic() - t < 20 and released is not None
    (crash,) = _crashes(core_dir)
    assert "did not finish in 1 s (killed)" in (crash / "30-kernel" / "nvidia-smi.txt").read_text()
    assert json.loads((crash / "metadata.json").read_text())["core"]["state"] == "kept"


def test_handler_honours_rlimit_core_below_a_page(small_cores, tmp_path, live):
    for limit in ("0", "4095"):
        p = _handler_cli(tmp_path, live.pid, signal.SIGSEGV, small_cores["segv"], limit)
        assert p.returncode == 0, p.stderr
    for crash in _crashes(tmp_path):
        meta = json.loads((crash / "metadata.json").read_text())
        assert meta["core"]["state"] == "metadata-only"
        assert "RLIMIT_CORE" in meta["core"]["reasons"][0]
        assert meta["core"]["bytes_in"] == small_cores["segv"].stat().st_size  # stdin drained
        assert not list((crash / "50-core").iterdir())


def test_handler_cuts_at_the_maximum_size_and_at_rlimit_core(small_cores, tmp_path, live):
    core = small_cores["segv"]
    p = _handler_cli(tmp_path, live.pid, signal.SIGSEGV, core, "18446744073709551615", "--max-core-size", "64K")
    assert p.returncode == 0, p.stderr
    p = _handler_cli(tmp_path, live.pid, signal.SIGSEGV, core, "12288")
    assert p.returncode == 0, p.stderr
    a, b = _crashes(tmp_path)
    for crash, size in ((a, 65536), (b, 12288)):
        meta = json.loads((crash / "metadata.json").read_text())
        assert meta["core"]["state"] == "truncated"
        assert meta["core"]["bytes_in"] == core.stat().st_size
        assert _decompress(crash / "50-core" / "core.truncated.zst") == core.read_bytes()[:size]


def test_crash_loop_of_200_bounded_disk_one_copy_of_each_library(small_cores, tmp_path, live):
    # GIVEN a budget that holds the metadata of 200 crashes, the objects and a few cores
    segv, abrt = small_cores["segv"], small_cores["abort"]
    probe = tmp_path / "probe"
    run_core_handler(str(probe), live.pid, live.pid, 11, time.time(), None, stdin_fd=os.open(segv, os.O_RDONLY),
                     config=HandlerConfig(min_free=0))
    one_core = (next((probe / "crashes").iterdir()) / "50-core" / "core.zst").stat().st_size
    budget = 4 << 20
    cfg = HandlerConfig(budget=budget, min_free=0, loop_limit=5)
    d = tmp_path / "cores"
    # WHEN 200 crashes (two crash kinds) arrive within the hour
    for i in range(200):
        src = segv if i % 2 else abrt
        fd = os.open(src, os.O_RDONLY)
        try:
            run_core_handler(str(d), live.pid, live.pid, 11 if i % 2 else 6, time.time(), None, stdin_fd=fd, config=cfg)
        finally:
            os.close(fd)
    # THEN every crash has its metadata, only the first 5 of each kind per hour have a core,
    crashes = _crashes(d)
    assert len(crashes) == 200
    metas = [json.loads((c / "metadata.json").read_text()) for c in crashes]
    assert all(m["state"] == "done" for m in metas)
    kept = [m for m in metas if m["core"]["file"]]
    assert len(kept) == 10
    assert sum("crash loop" in " ".join(m["core"]["reasons"]) for m in metas) == 190
    # one copy of each library in the store, and of each debug file this machine has for them (libc6-dbg),
    objects = [p for p in (d / "objects").rglob("*") if p.is_file()]
    mapped = {k for m in metas for k in m["objects"].values()}
    debug = {k for m in metas for k in m.get("debug_files", {}).values()}
    assert debug <= {f"{k}.debug" for k in mapped}
    assert len(objects) == len(mapped) + len(debug) and len(mapped) <= 5
    # and the directory stays near its budget: the oldest cores went; the newest of each crash-loop key stayed while
    # it fitted, the newest core of the image always
    total = sum(p.stat().st_blocks * 512 for p in d.rglob("*") if p.is_file())
    on_disk = [c for c in crashes if list((c / "50-core").glob("core*.zst"))]
    if total > budget:
        assert 1 <= len(on_disk) <= len({m["crash_loop_key"] for m in metas}), (total, budget, one_core)
    newest = [m for m in metas if m["core"]["file"]][-1]["crash_id"]
    assert list((d / "crashes" / newest / "50-core").glob("core*.zst")), newest


def test_budget_collects_objects_no_remaining_core_uses(crasher, small_cores, tmp_path):
    """A library upgrade: the old cores go for the budget, and the old library's stored copy with them."""
    # GIVEN a library only the first process maps (the "old driver"), with its own build-id
    old_lib = tmp_path / "libolddriver.so"
    (tmp_path / "old.c").write_text("int old_driver_version(void) { return 570; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id", "-o", str(old_lib), str(tmp_path / "old.c")],
                   check=True)
    d = tmp_path / "cores"
    cfg = HandlerConfig(budget=0, min_free=0, loop_limit=100, object_grace=0)

    def crash_with(env):
        live = subprocess.Popen([str(crasher), "sleep"], env=env)
        try:
            time.sleep(0.05)
            fd = os.open(small_cores["segv"], os.O_RDONLY)
            try:
                return run_core_handler(str(d), live.pid, live.pid, 11, time.time(), None, stdin_fd=fd, config=cfg)
            finally:
                os.close(fd)
        finally:
            live.kill()
            live.wait()

    # WHEN the same crash happens first with the old library mapped, then without it
    first = crash_with({"LD_PRELOAD": str(old_lib)})
    first_meta = json.loads((Path(first.crash_dir) / "metadata.json").read_text())
    old_key = first_meta["objects"][str(old_lib)]
    assert (d / "objects" / old_key[:2] / old_key[2:]).is_file()
    # (a budget the first crash fits, objects included: the budget counts them, and stores none over it)
    cfg = HandlerConfig(budget=sum(p.stat().st_blocks * 512 for p in d.rglob("*") if p.is_file()) + 4096,
                        min_free=0, loop_limit=100, object_grace=0)
    second = crash_with({})
    # THEN the first core went for the budget (the second is the newest of the crash-loop key),
    meta1 = json.loads((Path(first.crash_dir) / "metadata.json").read_text())
    meta2 = json.loads((Path(second.crash_dir) / "metadata.json").read_text())
    assert meta1["crash_loop_key"] == meta2["crash_loop_key"]
    assert meta1["core"]["state"] == "deleted-for-budget" and meta2["core"]["state"] == "kept"
    # the old library's copy went with it, and every object the remaining core uses stayed
    assert not (d / "objects" / old_key[:2] / old_key[2:]).exists()
    assert str(old_lib) not in meta2["objects"] and meta2["objects"]
    for key in meta2["objects"].values():
        assert (d / "objects" / key[:2] / key[2:]).is_file(), key
    events = [e for e in map(json.loads, (d / "index.jsonl").read_text().splitlines()) if e.get("event") == "budget"]
    assert events[-1]["deleted"] == [Path(first.crash_dir).name] and events[-1]["objects_deleted"] == 1


def test_budget_spares_young_objects_a_streaming_crash_may_use(tmp_path):
    """An object not yet named by any record (its crash still streams) stays within the grace time."""
    from forensics.capture.budget import collect_objects
    from forensics.capture.store import ObjectStore

    store = ObjectStore(str(tmp_path))
    key, _ = store.add_file(sys.executable)
    assert collect_objects(str(tmp_path), grace=3600) == 0 and store.has(key)
    # used again later: the copy is refreshed, not rewritten, and its age restarts
    old = time.time() - 7200
    os.utime(store.path_of(key), (old, old))
    assert store.add_file(sys.executable) == (key, 0)
    assert collect_objects(str(tmp_path), grace=3600) == 0 and store.has(key)
    assert collect_objects(str(tmp_path), grace=3600, now=time.time() + 3601) == 1 and not store.has(key)


@pytest.fixture
def tiny_fs(tmp_path):
    from tests.helpers import tmpfs

    with tmpfs(tmp_path / "tiny", "3m") as mnt:
        yield mnt


def test_full_filesystem_keeps_metadata_and_marks_the_partial_core(crasher, tmp_path, tiny_fs, live, core_pattern):
    # GIVEN a real core of 8 MiB random heap (incompressible) and a 3 MiB filesystem
    core = _core_of(crasher, "random-segv", tmp_path)
    # WHEN the handler streams it there
    fd = os.open(core, os.O_RDONLY)
    try:
        r = run_core_handler(str(tiny_fs / "cores"), live.pid, live.pid, 11, time.time(), None, stdin_fd=fd,
                             config=HandlerConfig(min_free=0))
    finally:
        os.close(fd)
    # THEN the metadata is whole, the core is marked as cut by the full disk, and what is kept is a prefix
    (crash,) = _crashes(tiny_fs / "cores")
    meta = json.loads((crash / "metadata.json").read_text())
    assert meta["state"] == "done"
    assert meta["core"]["state"] in ("truncated", "partial"), meta["core"]
    assert "disk filled up" in " ".join(meta["core"]["reasons"])
    assert meta["core"]["bytes_in"] == core.stat().st_size
    kept = crash / "50-core" / meta["core"]["file"]
    data = b""
    with open(kept, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        try:
            while chunk := reader.read(1 << 16):
                data += chunk
        except zstandard.ZstdError:
            assert meta["core"]["state"] == "partial"
    assert len(data) > 0 and core.read_bytes().startswith(data)
    assert r.core_state.value == meta["core"]["state"]


def test_installed_into_the_kernel_for_real(cores, newest_python, tmp_path, short_core_dir, core_pattern):
    """The shortest window: both crashers wait on a FIFO, the pattern is set, they crash, it is restored."""
    from tests.crashers.make_core import EXPORTER, build_libcrash
    from forensics.capture.pattern import install_handler, read_core_pattern, uninstall_handler

    lib = build_libcrash(tmp_path)
    core_dir = short_core_dir  # short: core_pattern holds 128 bytes
    fifos, procs = [], []
    from tests.conftest import PYTHONS

    python = PYTHONS[newest_python]
    for limit in (resource.RLIM_INFINITY, 0):  # opted in by a raised limit / not opted in
        fifo = tmp_path / f"ready-{limit}"
        os.mkfifo(fifo)

        def setup(limit=limit):
            resource.setrlimit(resource.RLIMIT_CORE, (limit, resource.RLIM_INFINITY))

        procs.append(subprocess.Popen([python, str(EXPORTER), str(lib), "heap-prev", str(fifo)], cwd=tmp_path,
                                      preexec_fn=setup, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        fifos.append(fifo)
    program = str(FORENSICS)  # the installed script, as the kernel runs it
    try:
        with core_pattern.exclusive():  # no other test session on this machine sees the pattern meanwhile
            before = read_core_pattern()
            try:
                install_handler(str(core_dir), program=program, config={"min_free": 0})
                for fifo in fifos:
                    with open(fifo) as f:
                        assert f.read() == "ready\n"
                for p in procs:
                    p.wait(timeout=60)
            finally:
                if read_core_pattern() != before:
                    uninstall_handler(str(core_dir))
            assert read_core_pattern() == before
    finally:
        # a skip (the lock not had in time) or a failure leaves the crashers blocked on their FIFOs: end them
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p in procs:
        assert p.returncode == -signal.SIGABRT
    # the handler may still be writing after the process is reaped: wait for both records
    deadline = time.time() + 60
    metas = []
    while time.time() < deadline:
        metas = [json.loads(m.read_text()) for m in core_dir.glob("crashes/*/metadata.json")]
        if len(metas) == 2 and all(m["state"] == "done" for m in metas):
            break
        time.sleep(0.2)
    by_pid = {m["pid"]: m for m in metas}
    assert set(by_pid) == {p.pid for p in procs}, metas
    opted, not_opted = by_pid[procs[0].pid], by_pid[procs[1].pid]
    assert opted["core"]["state"] == "kept" and opted["rlimit_core"] is None
    assert not_opted["core"]["state"] == "metadata-only" and not_opted["rlimit_core"] == 0
    # the bundle analyzes with its stored objects as sysroot, libcrash.so included
    crash = core_dir / "crashes" / opted["crash_id"]
    assert any(p.endswith("libcrash.so") for p in opted["objects"])
    core, sysroot = bundle_sysroot(str(crash))
    cf = open_core(core, sysroot=sysroot)
    assert cf.pid == procs[0].pid
    libs = {lib.name: lib.status for lib in cf.libraries}
    assert libs["libcrash.so"] == LibraryStatus.OK
    assert all(s == LibraryStatus.OK for s in libs.values()), libs


def test_analyze_takes_a_bundle_and_uses_its_stored_objects(cores, newest_python, tmp_path, live):
    # GIVEN the handler's crash record of a real core
    core = cores.get(newest_python, "heap-prev")
    assert _handler_cli(tmp_path, live.pid, signal.SIGABRT, core).returncode == 0
    (crash,) = _crashes(tmp_path)
    # WHEN forensics analyze is given the bundle directory itself
    from click.testing import CliRunner

    from forensics.cli import cli

    r = CliRunner().invoke(cli, ["analyze", "--json", str(crash)], catch_exceptions=False)
    # THEN the core is analysed with the bundle's own objects as sysroot
    assert r.exit_code == 0, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    # (laid out in the forensics cache: analysis never writes into the bundle)
    assert a["snapshot"]["sysroot"].endswith("/sysroot") and not a["snapshot"]["sysroot"].startswith(str(crash))
    assert not (crash / ".sysroot").exists() and not (crash / "50-core" / "core").exists()
    libs = [lib for lib in a["snapshot"]["core"]["libraries"] if lib["path"] != "[vdso]"]
    assert libs and all(lib["status"] == "ok" for lib in libs)
    # objects the store holds (those the live process for /proc shares with the core, libc at least)
    # are read from the bundle's sysroot, not from this machine
    libc = next(lib for lib in libs if lib["path"].endswith("/libc.so.6"))
    assert libc["file_path"].startswith(a["snapshot"]["sysroot"])
    assert a["snapshot"]["threads"][0]["py_frames"][0]["function"] == "query_nvlink_throughput_counters"
    # and a directory of crash records is a batch
    r = CliRunner().invoke(cli, ["analyze", "--json", str(tmp_path)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["batch"]["total"] == 1


def _record(core_dir: Path) -> tuple[dict, dict]:
    (crash,) = _crashes(core_dir)
    index = [json.loads(line) for line in (core_dir / "index.jsonl").read_text().splitlines()]
    return json.loads((crash / "metadata.json").read_text()), index[-1]


@pytest.mark.parametrize("case", ["first-half", "header-64K", "empty", "closed", "random-10M"])
def test_a_broken_stream_is_never_recorded_as_a_whole_core(cores, newest_python, tmp_path, live, case):
    """#13.2: a stream that ends early, random bytes or an empty / closed stdin were recorded
    {"state": "kept", "reasons": []}: the record must say what was received."""
    # GIVEN what the kernel's pipe delivered, made here from a real kernel core
    core = cores.get(newest_python, "heap-prev").read_bytes()
    data = {"first-half": core[: len(core) // 2], "header-64K": core[:65536], "empty": b"", "closed": b"",
            "random-10M": os.urandom(10 << 20)}[case]
    src = tmp_path / "stream"
    src.write_bytes(data)
    # a stream of unknown size reserves its bound (--max-core-size, 32 GiB by default) above --min-free: this is
    # about the stream, not the disk, so neither depends on this machine's free space (with under ~36 GB free the
    # handler chose metadata-only)
    (tmp_path / "cores").mkdir()
    (tmp_path / "cores" / "handler.json").write_text(
        json.dumps({"config": {"min_free": 0, "max_core_size": 256 << 20}}))
    # WHEN the handler takes it as the kernel runs it (for "closed", with no stdin at all)
    cmd = [str(FORENSICS), "core-handler", str(tmp_path / "cores"), str(live.pid), str(live.pid), "6",
           str(int(time.time())), "18446744073709551615"]
    with open(src, "rb") as f:
        p = subprocess.run(cmd, stdin=f if case != "closed" else None, capture_output=True, text=True, env={},
                           cwd="/", timeout=120, preexec_fn=(lambda: os.close(0)) if case == "closed" else None)
    assert p.returncode == 0, p.stderr
    # THEN the record and the index say what it was, with the reason
    meta, entry = _record(tmp_path / "cores")
    c = meta["core"]
    expected_state = {"first-half": "truncated", "header-64K": "truncated"}.get(case, "not-a-core")
    assert c["state"] == entry["state"] == expected_state, c
    assert c["reasons"] and entry["reasons"] == c["reasons"]
    reason = {"first-half": f"the stream ended after {len(data):,} bytes; "
                            f"the core's program headers claim {len(core):,}",
              "header-64K": "the stream ended after 65,536 bytes",
              "empty": "the stream was empty (0 bytes): no core", "closed": "the stream was empty (0 bytes): no core",
              "random-10M": "the stream is not an ELF core: not an ELF file"}[case]
    assert any(reason in r for r in c["reasons"]), c["reasons"]
    assert c["stream"]["bytes"] == len(data)
    if case in ("first-half", "header-64K"):
        assert c["file"] == "core.truncated.zst" and c["stream"]["expected_bytes"] == len(core)
    # nothing received is lost: what came is kept, byte for byte, under a name that says what it is
    crash = _crashes(tmp_path / "cores")[0]
    if data:
        assert _decompress(crash / "50-core" / c["file"]) == data
    else:
        assert c["file"] is None and not list((crash / "50-core").iterdir())


def test_a_whole_core_is_checked_and_kept(small_cores, tmp_path, live):
    p = _handler_cli(tmp_path, live.pid, signal.SIGSEGV, small_cores["segv"])
    assert p.returncode == 0, p.stderr
    meta, entry = _record(tmp_path)
    size = small_cores["segv"].stat().st_size
    assert meta["core"]["state"] == entry["state"] == "kept" and entry["reasons"] == []
    assert meta["core"]["stream"] == {"kind": "core", "bytes": size, "expected_bytes": size, "reason": None}


@pytest.mark.parametrize("extra", [("--budget", "lots"), ("--no-such-option",), ("--loop-limit",)],
                         ids=["bad-size", "unknown-option", "missing-value"])
def test_a_bad_option_still_drains_and_keeps_the_core(small_cores, tmp_path, live, extra):
    """#13.7: `core-handler` with a bad option exited (click's usage error) without reading stdin."""
    core = small_cores["segv"].read_bytes() * 8  # more than a pipe holds: an unread pipe blocks the writer
    cmd = [str(FORENSICS), "core-handler", str(tmp_path), str(live.pid), str(live.pid), "11", str(int(time.time())),
           "18446744073709551615", *extra]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd="/")
    try:
        p.stdin.write(core)  # BrokenPipeError when the handler left without draining
        p.stdin.close()
        assert p.wait(timeout=120) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    meta, _ = _record(tmp_path)
    assert meta["core"]["bytes_in"] == len(core)
    assert any(w.startswith("argument: ignored") for w in meta["warnings"]), meta["warnings"]


@pytest.mark.parametrize("bad_time", ["nan", "1e30", "-5", "yesterday"])
def test_a_bad_crash_time_keeps_the_core_and_notes_it(small_cores, tmp_path, live, bad_time):
    """#13.7: a %t of nan or 1e30 saved nothing at all."""
    cmd = [str(FORENSICS), "core-handler", str(tmp_path), str(live.pid), str(live.pid), "11", bad_time,
           "18446744073709551615"]
    before = time.time()
    with open(small_cores["segv"], "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
    assert p.returncode == 0, p.stderr
    meta, entry = _record(tmp_path)
    assert meta["core"]["state"] == "kept"
    assert before - 1 <= meta["time"] <= time.time() + 1 and entry["time"] == meta["time"]
    assert any(f"crash time (%t) {bad_time!r} is not a time" in w for w in meta["warnings"]), meta["warnings"]


def test_no_directory_drains_and_exits_2(small_cores, tmp_path):
    core = small_cores["segv"].read_bytes() * 8
    p = subprocess.Popen([str(FORENSICS), "core-handler"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={}, cwd="/")
    p.stdin.write(core)
    p.stdin.close()
    assert p.wait(timeout=60) == 2


class _OpenWatch:
    """The kernel's inotify watch on one file for opens and reads (``IN_OPEN | IN_ACCESS``): whether anything
    opened it for reading, seen by the kernel, not by the code under test.  (Opens with ``O_PATH``, which only
    name a file, are not events; an open that reads it is.)"""

    IN_ACCESS, IN_OPEN = 0x1, 0x20

    def __init__(self, path: Path) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        assert libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_OPEN | self.IN_ACCESS) >= 0, \
            os.strerror(ctypes.get_errno())

    def events(self) -> list[int]:
        """The event masks since the last call."""
        import struct

        out = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            at = 0
            while at + 16 <= len(data):
                _, mask, _, name_len = struct.unpack_from("iIII", data, at)
                out.append(mask)
                at += 16 + name_len

    def close(self) -> None:
        os.close(self.fd)


def test_a_dropped_core_never_opens_debug_files(crasher, small_cores, tmp_path, live):
    """The decision comes before any debug-file work: a core dropped by the crash-loop limit, RLIMIT_CORE or the
    free-space minimum costs the dying process no debug-file lookup; a kept core's are stored after it."""
    from forensics.core.buildid import read_build_id_from_file
    from forensics.core.debugfiles import build_id_debug_path

    # GIVEN the node's debug file of the crasher's executable (its own build-id), in a node root of this test
    build_id = read_build_id_from_file(str(crasher))
    assert build_id
    node = tmp_path / "node"
    debug = node / build_id_debug_path(build_id).lstrip("/")
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(crasher), str(debug)], check=True)
    assert read_build_id_from_file(str(debug)) == build_id
    debug_bytes = debug.read_bytes()
    core_dir = tmp_path / "cores"
    watch = _OpenWatch(debug)

    def crash(limit: int | None, cfg: HandlerConfig):
        fd = os.open(small_cores["segv"], os.O_RDONLY)
        try:
            r = run_core_handler(str(core_dir), live.pid, live.pid, 11, time.time(), limit, stdin_fd=fd, config=cfg,
                                 host_root=str(node))
        finally:
            os.close(fd)
        return r, json.loads((Path(r.crash_dir) / "metadata.json").read_text()), watch.events()

    try:
        # WHEN the first crash comes (kept: the crash-loop limit is 1 core per hour)
        r, meta, events = crash(None, HandlerConfig(min_free=0, loop_limit=1))
        # THEN its debug file was opened and read (the watch sees it) and stored by build-id
        assert r.core_state is CoreState.KEPT, r.warnings
        assert any(m & _OpenWatch.IN_OPEN for m in events), events
        exe = next(p for p in meta["objects"] if p.endswith("/crasher"))
        assert meta["debug_files"][exe] == f"{build_id}.debug"
        assert (core_dir / "objects" / build_id[:2] / f"{build_id[2:]}.debug").read_bytes() == debug_bytes
        # and WHEN the same crash comes again (the crash-loop limit), from a process not opted in (RLIMIT_CORE 0),
        # and with too little free space
        for limit, cfg, reason in ((None, HandlerConfig(min_free=0, loop_limit=1), "crash loop"),
                                   (0, HandlerConfig(min_free=0, loop_limit=-1), "RLIMIT_CORE 0"),
                                   (None, HandlerConfig(min_free=1 << 62, loop_limit=-1), "bytes free")):
            r, meta, events = crash(limit, cfg)
            # THEN it is metadata only, and its debug file was never opened, nor stored for it
            assert r.core_state is CoreState.METADATA_ONLY and reason in " ".join(meta["core"]["reasons"]), meta["core"]
            assert events == [], (reason, events)
            assert meta["debug_files"] == {} and meta["objects"][exe] == build_id
    finally:
        watch.close()


def test_a_kept_core_s_python_imports_are_read_after_the_process_is_gone(small_cores, tmp_path):
    """A Python process's imports are resolved once its core is written, the process gone, in its root and mount
    namespace held for it: a module its working directory shadows, on a mount only its namespace has (a volume),
    is still found; a dropped core's are not looked for, and its record says so."""
    import hashlib

    # GIVEN a Python process whose working directory is a tmpfs mounted in its own mount namespace only, holding
    # pynvml.py (shadowing any installed nvidia-ml-py, as an image's WORKDIR did in the incident)
    work = tmp_path / "work"
    work.mkdir()
    source = b'__version__ = "shadow"\n'
    script = ('mount -t tmpfs forensics-test "$0" && cd "$0" && printf \'__version__ = "shadow"\\n\' > pynvml.py && '
              'exec "$1" -c "import pynvml, sys; print(\'ready\', flush=True); sys.stdin.read()"')
    live = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(work),
                             sys.executable], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    core_dir = tmp_path / "cores"
    try:
        assert live.stdout.readline().strip() == b"ready"
        assert not (work / "pynvml.py").exists()  # not on this namespace's side of the mount
        # WHEN a crash of it is dropped (RLIMIT_CORE 0)
        p = _handler_cli(core_dir, live.pid, signal.SIGSEGV, small_cores["segv"], "0")
        assert p.returncode == 0, p.stderr
        (dropped,) = _crashes(core_dir)
        # THEN its modules are not looked for, and its snapshot says so (not "none found")
        py = json.loads((dropped / "40-process" / "snapshot.json").read_text())["python"]
        assert py["modules"] == [] and py["modules_skipped"] == "not looked for: the core was not kept (metadata only)"
        # WHEN a crash of it is kept: the core goes in while the process exists, and the process is gone (its mount
        # namespace with it) before the stream ends, as the kernel lets it go once its core is read
        h = subprocess.Popen([str(FORENSICS), "core-handler", str(core_dir), str(live.pid), str(live.pid), "11",
                              str(int(time.time())), "18446744073709551615"], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={}, cwd="/")
        h.stdin.write(small_cores["segv"].read_bytes())
        h.stdin.flush()
        time.sleep(0.2)  # the handler past its reading of /proc/PID, streaming
        live.kill()
        live.wait()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{live.pid}") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not os.path.exists(f"/proc/{live.pid}")
        h.stdin.close()
        assert h.wait(timeout=120) == 0, h.stderr.read()
    finally:
        live.kill()
        live.wait()
    kept = next(c for c in _crashes(core_dir) if c != dropped)
    meta = json.loads((kept / "metadata.json").read_text())
    assert meta["core"]["state"] == "kept"
    # THEN its imports were resolved after it was gone: pynvml from its working directory, read on the tmpfs its
    # namespace had (hashed: the very file)
    py = json.loads((kept / "40-process" / "snapshot.json").read_text())["python"]
    assert py["modules_skipped"] is None
    pynvml = next(m for m in py["modules"] if m["module"] == "pynvml")
    assert pynvml["path"] == str(work / "pynvml.py")
    assert pynvml["sha256"] == hashlib.sha256(source).hexdigest()


def test_a_huge_mapped_object_is_named_not_copied(small_cores, tmp_path):
    """A crashed process may map any file; one over the handler's max_object_size (2 GiB; here one of 5 GiB: ELF
    magic, then data at its end) is kept by build-id and size only, the others stored."""
    big = tmp_path / "libhuge.so"
    with open(big, "wb") as f:
        f.write(b"\x7fELF")
        f.seek((5 << 30) - 4096)
        f.write(b"x" * 4096)
    live = subprocess.Popen([sys.executable, "-c", "import mmap, sys; f = open(sys.argv[1], 'rb'); "
                             "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); print('ready', flush=True); "
                             "sys.stdin.read()", str(big)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline().strip() == b"ready"
        fd = os.open(small_cores["segv"], os.O_RDONLY)
        try:
            r = run_core_handler(str(tmp_path / "cores"), live.pid, live.pid, 11, time.time(), None, stdin_fd=fd,
                                 config=HandlerConfig(min_free=0))
        finally:
            os.close(fd)
    finally:
        live.kill()
        live.wait()
    assert r.core_state is CoreState.KEPT, r.warnings
    meta = json.loads((Path(r.crash_dir) / "metadata.json").read_text())
    why = f"{5 << 30} bytes, over max_object_size {2 << 30}"
    assert f"object {big}: {why}: kept by build-id and size only" in r.warnings
    assert meta["objects_not_copied"][str(big)] == {"build_id": None, "size": 5 << 30, "why": why}
    assert str(big) not in meta["objects"] and meta["objects"]  # the others are stored
    stored = sum(p.stat().st_size for p in (tmp_path / "cores" / "objects").rglob("*") if p.is_file())
    assert stored < 1 << 30


def test_a_crash_rlimit_core_drops_does_not_wait_for_the_directory_lock(small_cores, tmp_path, live):
    """Another handler's budget pass holds the directory's lock (it walks every crash); the decision for a process
    not opted in (RLIMIT_CORE 0) needs neither the index nor the free space, so its process is let go meanwhile."""
    import fcntl

    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    lock = os.open(core_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # GIVEN the lock held, as a budget pass holds it
    try:
        cmd = [str(FORENSICS), "core-handler", str(core_dir), str(live.pid), str(live.pid), "11",
               str(int(time.time())), "0"]
        h = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd="/")

        def feed():  # as the kernel writes: blocked while the handler does not read
            with contextlib.suppress(BrokenPipeError):
                h.stdin.write(small_cores["segv"].read_bytes())
                h.stdin.close()

        threading.Thread(target=feed, daemon=True).start()
        # WHEN its process crashes with RLIMIT_CORE 0: THEN the handler lets go of the pipe while the lock is held
        deadline, released = time.monotonic() + 60, False
        while not released and time.monotonic() < deadline and h.poll() is None:
            with contextlib.suppress(OSError):
                released = os.readlink(f"/proc/{h.pid}/fd/0") == "/dev/null"
            time.sleep(0.01)
        assert released, "the handler held the dying process while another handler had the directory's lock"
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    # and, the lock free, it records the crash (the index is appended under the lock)
    assert h.wait(timeout=60) == 0, h.stderr.read()
    (crash,) = _crashes(core_dir)
    assert json.loads((crash / "metadata.json").read_text())["core"]["state"] == "metadata-only"


def test_a_process_mapping_thousands_of_files_gets_a_bounded_snapshot(tmp_path):
    """Each mapped file costs the dying process a descriptor, a build-id and a mount lookup while it waits: a
    process that maps more files than any real one (4,200 here; PyTorch maps ~1,000) gets the first 4,096."""
    from forensics.procfs import parse_maps, read_proc_text
    from forensics.capture.snapshot import MAX_MAPPED_FILES, open_mapped_objects

    libs = tmp_path / "libs"
    libs.mkdir()
    for i in range(MAX_MAPPED_FILES + 104):
        (libs / f"lib{i}.so").write_bytes(b"\x7fELF" + bytes(4092))
    code = ("import mmap, os, sys\nkeep = []\nfor n in sorted(os.listdir(sys.argv[1])):\n"
            "    with open(os.path.join(sys.argv[1], n), 'rb') as f:\n"
            "        keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(libs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    fds: list = []
    try:
        assert p.stdout.readline().strip() == b"ready"
        warnings: list[str] = []
        fds = open_mapped_objects(p.pid, parse_maps(read_proc_text(p.pid, "maps")), warnings)
    finally:
        p.kill()
        p.wait()
        for _, fd in fds:
            os.close(fd)
    mapped = sum(1 for _, fd in fds)
    assert MAX_MAPPED_FILES - 20 < mapped <= MAX_MAPPED_FILES  # (the interpreter's own files among the first)
    assert any(w.endswith(f"the first {MAX_MAPPED_FILES} opened, the rest not captured") for w in warnings), warnings
