"""The core handler's limits under storms: decided and reserved under one lock, objects bounded and counted, a
budget that holds whatever the crash sites, a directory out of inodes.

Real kernel cores of a small C crasher (random heap so the cores do not compress away, six crash sites), fed to
the real handler, many at once, on small tmpfs mounts made here.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from forensics.capture.handler import HandlerConfig, run_core_handler
from tests.helpers import tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root")

CRASHER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
/* usage: crasher SITE KIB   fills KIB of random heap, then crashes in site_SITE (0-5); SITE "sleep": waits */
#define SITE(n) __attribute__((noinline)) void site_##n(void) { *(volatile int *)(16 + n) = n; }
SITE(0) SITE(1) SITE(2) SITE(3) SITE(4) SITE(5)
int main(int argc, char **argv) {
    if (!strcmp(argv[1], "sleep")) { for (;;) pause(); }
    size_t n = (size_t)atoi(argv[2]) << 10; unsigned char *b = malloc(n + 1); int r = open("/dev/urandom", O_RDONLY);
    size_t got = 0; while (got < n) { ssize_t k = read(r, b + got, n - got); if (k <= 0) break; got += k; }
    fprintf(stderr, "%d\n", b[n / 2]);
    void (*sites[])(void) = {site_0, site_1, site_2, site_3, site_4, site_5};
    sites[atoi(argv[1]) % 6]();
    return 0;
}
"""


@pytest.fixture(scope="module")
def crasher(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("crasher")
    (d / "crasher.c").write_text(CRASHER_C)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(d / "crasher"), str(d / "crasher.c")], check=True)
    return d / "crasher"


def _core_of(crasher: Path, site: int, kib: int, directory: Path) -> Path:
    run = Path(tempfile.mkdtemp(prefix=f"core-{site}-", dir=directory))

    def setup():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    p = subprocess.run([str(crasher), str(site), str(kib)], cwd=run, preexec_fn=setup, capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGSEGV, p
    (core,) = list(run.iterdir())
    return core


@pytest.fixture(scope="module")
def cores(crasher, tmp_path_factory, core_pattern) -> dict[tuple[int, int], Path]:
    """(site, KiB of random heap) -> a real kernel core."""
    d = tmp_path_factory.mktemp("cores")
    return {(s, k): _core_of(crasher, s, k, d) for s, k in [(0, 4), (0, 4096), *((s, 640) for s in range(6))]}


@pytest.fixture
def live(crasher):
    p = subprocess.Popen([str(crasher), "sleep"])
    try:
        time.sleep(0.05)
        yield p
    finally:
        p.kill()
        p.wait()


def _handle(core_dir: Path, pid: int, core: Path, cfg: HandlerConfig):
    fd = os.open(core, os.O_RDONLY)
    try:
        return run_core_handler(str(core_dir), pid, pid, 11, time.time(), None, stdin_fd=fd, config=cfg)
    finally:
        os.close(fd)


def _storm(n: int, core_dir: Path, pid: int, core: Path, cfg: HandlerConfig) -> list:
    """``n`` handlers at once, as the kernel starts one per crash."""
    results: list = [None] * n
    go = threading.Barrier(n)

    def one(i: int) -> None:
        go.wait()
        results[i] = _handle(core_dir, pid, core, cfg)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


def _records(core_dir: Path) -> list[dict]:
    return [json.loads((c / "metadata.json").read_text()) for c in sorted((core_dir / "crashes").iterdir())]


def test_100_concurrent_crashes_keep_at_most_the_loop_limit(cores, tmp_path, live):
    # GIVEN the crash-loop limit of 5 cores an hour
    cfg = HandlerConfig(loop_limit=5, min_free=0)
    # WHEN 100 crashes of one image and signal arrive at once
    _storm(100, tmp_path / "cores", live.pid, cores[(0, 4)], cfg)
    # THEN every crash has a finished record, 5 of them a core, 95 metadata only for the crash loop
    recs = _records(tmp_path / "cores")
    assert len(recs) == 100 and all(r["state"] == "done" for r in recs)
    kept = [r for r in recs if r["core"]["file"]]
    assert len(kept) == 5, [r["core"]["state"] for r in recs]
    assert sum("crash loop" in " ".join(r["core"]["reasons"]) for r in recs) == 95
    assert not list((tmp_path / "cores" / ".reservations").iterdir())  # every reservation released


def test_20_concurrent_crashes_on_a_small_disk_damage_no_core(cores, tmp_path, live):
    # GIVEN a 48 MiB filesystem, a minimum free space of 8 MiB and 4 MiB cores of random heap
    core = cores[(0, 4096)]
    with tmpfs(tmp_path / "small", "48m") as mnt:
        cfg = HandlerConfig(loop_limit=100, min_free=8 << 20)
        # WHEN 20 crash at once
        _storm(20, mnt / "cores", live.pid, core, cfg)
        # THEN no core is damaged: each is kept whole or not at all, with the free space as the reason
        recs = _records(mnt / "cores")
        states = [r["core"]["state"] for r in recs]
        assert len(recs) == 20 and all(r["state"] == "done" for r in recs), states
        assert set(states) <= {"kept", "metadata-only"}, states
        assert 1 <= states.count("kept") < 20, states
        for r in recs:
            if r["core"]["state"] == "metadata-only":
                assert any("free" in why for why in r["core"]["reasons"]), r["core"]


@pytest.mark.parametrize("inodes_left", [0, 1, 2, 3, 5, 8, 13])
def test_a_directory_out_of_inodes_gives_a_finished_record(cores, tmp_path, live, inodes_left):
    # GIVEN a core directory that has seen a crash, on a filesystem with only ``inodes_left`` inodes left
    mnt = tmp_path / "few"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=400", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        cfg = HandlerConfig(loop_limit=100, min_free=0)
        _handle(mnt / "cores", live.pid, cores[(0, 4)], cfg)
        fill = mnt / "fill"
        fill.mkdir()
        made = []
        while True:
            try:
                (fill / str(len(made))).touch()
            except OSError:
                break
            made.append(fill / str(len(made)))
        for p in made[len(made) - inodes_left:] if inodes_left else []:
            p.unlink()
        # WHEN a crash comes
        res = _handle(mnt / "cores", live.pid, cores[(0, 4)], cfg)
        # THEN its record is finished, saying why it holds no core; or, without an inode for the record, its index
        # line says it
        lines = [json.loads(x) for x in (mnt / "cores" / "index.jsonl").read_text().splitlines()]
        assert len(lines) == 2, lines
        crash_dirs = sorted((mnt / "cores" / "crashes").iterdir())
        if len(crash_dirs) == 2 and (crash_dirs[1] / "metadata.json").exists():
            rec = json.loads((crash_dirs[1] / "metadata.json").read_text())
            assert rec["state"] == "done", rec
            assert rec["core"]["state"] in ("kept", "metadata-only", "failed", "partial", "truncated"), rec
            if rec["core"]["state"] != "kept":
                assert any("No space left" in w or "inode" in w for w in rec["core"]["reasons"]), rec["core"]
        assert lines[1]["state"] == res.core_state.value
        # with a few inodes the core itself is kept (the evidence files that did not fit named in the warnings), and
        # no reserved room is left behind
        if inodes_left >= 5:
            assert lines[1]["state"] == "kept", lines[1]
        assert not list((mnt / "cores" / "crashes").glob("*/50-core/.core.zst.tmp"))
        if lines[1]["state"] != "kept":
            assert any("No space left" in w or "inode" in w for w in lines[1]["reasons"]), lines[1]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_dead_handler_s_reservation_is_reclaimed(cores, tmp_path, live):
    """A handler killed while its core streams leaves its reservation (the room and the loop limit's count): the
    next handler reclaims it by pid and start time, finishing the dead one's record."""
    d = tmp_path / "cores"
    forensics = Path(sys.executable).parent / "forensics"
    cmd = [str(forensics), "core-handler", str(d), str(live.pid), str(live.pid), "11", str(int(time.time())),
           "18446744073709551615", "--loop-limit", "1"]
    # GIVEN a handler that has reserved room for a 4 MiB core and is killed while it streams
    h = subprocess.Popen(cmd, stdin=subprocess.PIPE, env={}, cwd="/")
    h.stdin.write(cores[(0, 4096)].read_bytes()[: 2 << 20])
    h.stdin.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(d.glob("crashes/*/50-core/.core.zst.tmp")):
        time.sleep(0.05)
    h.kill()
    h.wait()
    h.stdin.close()
    (dead,) = list((d / "crashes").iterdir())
    assert list((d / ".reservations").iterdir())
    assert json.loads((dead / "metadata.json").read_text())["state"] == "in-progress"
    # WHEN the next crash comes (the loop limit is 1)
    r = _handle(d, live.pid, cores[(0, 4)], HandlerConfig(loop_limit=1, min_free=0))
    # THEN it keeps its core (the dead one's count is gone), the dead one's record is finished and its room freed
    assert r.core_state.value == "kept", r.reasons
    rec = json.loads((dead / "metadata.json").read_text())
    assert rec["state"] == "done" and rec["core"]["state"] == "failed"
    assert "ended before it finished" in rec["core"]["reasons"][-1]
    assert not (dead / "50-core" / ".core.zst.tmp").exists()
    assert not list((d / ".reservations").iterdir())


def _usage(d: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in d.rglob("*") if p.is_file())


def test_the_budget_holds_whatever_the_crash_sites(cores, tmp_path, live):
    """Each crash site is its own crash-loop key, and the newest core of each key was kept whatever the budget: a
    process that crashes at six sites kept six cores over it."""
    # GIVEN a budget of what one crash takes (metadata, objects, its ~650 KiB core) and 2 MiB more
    d = tmp_path / "cores"
    _handle(d, live.pid, cores[(0, 640)], HandlerConfig(min_free=0, loop_limit=100))
    budget = _usage(d) + (2 << 20)
    cfg = HandlerConfig(budget=budget, min_free=0, loop_limit=100)
    # WHEN the same program crashes at six sites
    for site in range(1, 6):
        _handle(d, live.pid, cores[(site, 640)], cfg)
    recs = _records(d)
    assert len({r["crash_loop_key"] for r in recs}) == 6  # six crash sites, six crash-loop keys
    # THEN the directory fits its budget, and the newest crash keeps its core
    assert _usage(d) <= budget, (_usage(d), budget, [r["core"]["state"] for r in recs])
    assert recs[-1]["core"]["state"] == "kept"
    assert sum(r["core"]["state"] == "deleted-for-budget" for r in recs) >= 2


_MAP = ("import mmap, sys\nfiles = [open(p, 'rb') for p in sys.argv[1:]]\n"
        "keep = [mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) for f in files]\n"
        "print('ready', flush=True)\nsys.stdin.read()\n")


def _mapping(files: list[str]) -> subprocess.Popen:
    """A process that maps ``files`` (a crashed process may map any file it can open)."""
    return subprocess.Popen([sys.executable, "-c", _MAP, *files], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_sparse_mapped_files_are_kept_by_build_id_and_size_only(cores, tmp_path):
    """Three sparse 1 GiB files mapped by the crashing process (ELF magic, then holes): the holes hide how large a
    file is (a process can map terabytes of them), so each is named by build-id and size, neither hashed nor
    copied."""
    files = []
    for i in range(3):
        p = tmp_path / f"libsparse{i}.so"
        with open(p, "wb") as f:
            f.write(b"\x7fELF" + bytes([i]) * 60)
            f.truncate(1 << 30)
        files.append(str(p))
    proc = _mapping(files)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        started = time.monotonic()
        r = _handle(tmp_path / "cores", proc.pid, cores[(0, 4)], HandlerConfig(min_free=0, loop_limit=100))
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    print(f"\nthree sparse 1 GiB mapped files: the handler done in {took:.1f} s")
    rec = json.loads((Path(r.crash_dir) / "metadata.json").read_text())
    assert rec["state"] == "done" and rec["core"]["state"] == "kept"
    # THEN none is in the store, each is named with its size and why
    assert not any(f in rec["objects"] for f in files), rec["objects"]
    for f in files:
        kept = rec["objects_not_copied"][f]
        assert kept["size"] == 1 << 30 and kept["why"].startswith("sparse"), kept
    objects = tmp_path / "cores" / "objects"
    assert not any(p.stat().st_size >= 1 << 30 for p in objects.rglob("*") if p.is_file())


def test_memfd_libraries_are_kept_by_build_id_and_size_only(cores, tmp_path):
    """A process that maps three 1 GiB memfd "libraries" (memfd_create, ELF magic, then holes): memory in no image,
    named by build-id and size, neither hashed nor copied (they once wrote 3 GiB into the store)."""
    proc = subprocess.Popen([sys.executable, "-c", _MEMFDS], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        usage_before = _usage(tmp_path / "cores") if (tmp_path / "cores").exists() else 0
        r = _handle(tmp_path / "cores", proc.pid, cores[(0, 4)], HandlerConfig(min_free=0, loop_limit=100))
    finally:
        proc.kill()
        proc.wait()
    rec = json.loads((Path(r.crash_dir) / "metadata.json").read_text())
    memfds = {k: v for k, v in (rec.get("objects_not_copied") or {}).items() if k.startswith("/memfd:")}
    assert len(memfds) == 3 and all(v["size"] == 1 << 30 and "memfd" in v["why"] for v in memfds.values()), rec
    assert not any(k.startswith("/memfd:") for k in rec["objects"])
    assert _usage(tmp_path / "cores") - usage_before < 256 << 20  # the process's real libraries, no memfd


_MEMFDS = ("import mmap, os, sys\nkeep = []\nfor i in range(3):\n"
           "    fd = os.memfd_create(f'libfake{i}.so')\n    os.write(fd, b'\\x7fELF' + bytes([i]) * 60)\n"
           "    os.ftruncate(fd, 1 << 30)\n    keep.append(mmap.mmap(fd, 0, prot=mmap.PROT_READ))\n"
           "print('ready', flush=True)\nsys.stdin.read()\n")


def test_objects_without_a_build_id_are_hashed_within_a_bound(cores, tmp_path):
    """An object without a build-id is keyed by the sha256 of its bytes: three 24 MiB ones under a bound of 36 MiB
    a crash get one hashed and stored, the others named (a thousand would have been hashed for hours)."""
    files = []
    for i in range(3):
        p = tmp_path / f"libnoid{i}.so"
        p.write_bytes(b"\x7fELF" + bytes([i + 1]) * ((24 << 20) - 4))
        files.append(str(p))
    proc = _mapping(files)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        r = _handle(tmp_path / "cores", proc.pid, cores[(0, 4)],
                    HandlerConfig(min_free=0, loop_limit=100, max_objects=36 << 20))
    finally:
        proc.kill()
        proc.wait()
    rec = json.loads((Path(r.crash_dir) / "metadata.json").read_text())
    assert sum(f in rec["objects"] for f in files) == 1, rec["objects"]
    assert sum("bytes hashed a crash: not stored" in w for w in rec["warnings"]) == 2, rec["warnings"]


def test_the_objects_one_crash_stores_are_bounded(cores, tmp_path):
    """Three mapped files of 1 MiB of data each (ELF magic, then random bytes) under a bound of 2.5 MiB a crash."""
    files = []
    for i in range(3):
        p = tmp_path / f"libdata{i}.so"
        p.write_bytes(b"\x7fELF" + os.urandom((1 << 20) - 4))
        files.append(str(p))
    proc = _mapping(files)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        r = _handle(tmp_path / "cores", proc.pid, cores[(0, 4)],
                    HandlerConfig(min_free=0, loop_limit=100, max_objects=(5 << 20) // 2))
    finally:
        proc.kill()
        proc.wait()
    rec = json.loads((Path(r.crash_dir) / "metadata.json").read_text())
    stored = [f for f in files if f in rec["objects"]]
    refused = [w for w in rec["warnings"] if "would take this crash's objects over" in w]
    assert len(stored) <= 2 and refused, (stored, rec["warnings"])
    assert rec["objects_bytes"] <= (5 << 20) // 2 + (1 << 20)  # data bound, plus a page per file


def test_concurrent_handler_processes_keep_at_most_the_loop_limit(cores, tmp_path, live):
    """As the kernel runs them: one handler process per crash, all at once (each reservation named by its own pid
    and start time, none taken for a dead one's)."""
    d = tmp_path / "cores"
    forensics = Path(sys.executable).parent / "forensics"
    core = cores[(0, 4)]
    procs = []
    for _ in range(12):
        cmd = [str(forensics), "core-handler", str(d), str(live.pid), str(live.pid), "11", str(int(time.time())),
               "18446744073709551615", "--loop-limit", "3", "--min-free", "0"]
        fd = os.open(core, os.O_RDONLY)
        try:
            procs.append(subprocess.Popen(cmd, stdin=fd, stderr=subprocess.PIPE, env={}, cwd="/"))
        finally:
            os.close(fd)
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
        p.stderr.close()
    recs = _records(d)
    assert len(recs) == 12 and all(r["state"] == "done" for r in recs)
    assert sum(1 for r in recs if r["core"]["file"]) == 3, [r["core"]["state"] for r in recs]
    assert not list((d / ".reservations").iterdir())
