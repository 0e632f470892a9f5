"""Batch triage and bundles on real cores: every input accounted for, partial results visible, the
crash's own time, and evidence left as it was (issues #14 item 6, #20 items 6 and 9)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
from tests.conftest import PYTHONS
from tests.crashers.make_core import make_gcore

CRASH_TIME = 1_700_000_000  # the crash time the handler records (long before the test runs)


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def truncated_copy(core: Path, dest: Path) -> Path:
    with open(core, "rb") as src:
        dest.write_bytes(src.read(os.path.getsize(core) // 3))
    return dest


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: its type, mode, size and modification time."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                                             st.st_mtime_ns)
    return out


def test_directory_of_symlinks_to_cores(cores, newest_python, tmp_path):
    # GIVEN a directory of symlinks to cores kept elsewhere, a link to a directory, and a note
    d = tmp_path / "links"
    d.mkdir()
    heap, segv = cores.get(newest_python, "heap-prev"), cores.get(newest_python, "segv")
    (d / "a").symlink_to(heap)
    (d / "b").symlink_to(segv)
    (d / "elsewhere").symlink_to(tmp_path)
    (d / "notes.txt").write_text("not a core\n")
    # WHEN it is analyzed as a batch
    r = run("analyze", "--json", str(d))
    # THEN the linked cores are analyzed, and the files that are not cores are counted, not dropped
    assert r.exit_code == EXIT_OK, r.stderr
    batch = json.loads(r.stdout)["batch"]
    assert batch["total"] == 2 and len(batch["groups"]) == 2
    assert sorted(batch["skipped"]) == sorted([str(d / "elsewhere"), str(d / "notes.txt")])
    # first seen is the crash's time: the core the link points at
    g = {x["signature"].split()[0]: x for x in batch["groups"]}
    assert g["SIGABRT"]["first_seen"] == heap.stat().st_mtime
    text = run("analyze", str(d)).stdout
    assert "2 files skipped (not cores)" in text.splitlines()[0]


def test_partial_cores_show_in_the_table_and_the_exit_code(cores, newest_python, tmp_path):
    # GIVEN two whole cores of one crash and a truncated copy of one of them
    d = tmp_path / "cores"
    d.mkdir()
    for i in range(2):
        shutil.copy(cores.get(newest_python, "heap-prev", i), d / f"core.{i}")
    truncated_copy(cores.get(newest_python, "heap-prev", 0), d / "core.cut")
    # WHEN the batch is analyzed
    r = run("analyze", "--json", str(d))
    # THEN the exit code says partial, and the truncated core is named as partial, with why
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    doc = json.loads(r.stdout)
    cut = next(c for c in doc["cores"] if c["path"].endswith("core.cut"))
    assert cut["partial"].startswith("truncated core (") and not cut["complete"]
    partial_rows = [p for g in doc["batch"]["groups"] for p in g["partial"]]
    assert partial_rows == [f"{d / 'core.cut'}: {cut['partial']}"]
    whole = next(g for g in doc["batch"]["groups"] if g["count"] >= 2)
    assert not whole["partial"] and whole["example"] != str(d / "core.cut")
    text = run("analyze", str(d))
    assert text.exit_code == EXIT_PARTIAL
    assert "(1 partial)" in text.stdout.splitlines()[0]
    assert f"partial (its fingerprint may differ): {d / 'core.cut'}: truncated core" in text.stdout


def test_truncated_core_alone_blames_the_truncation(cores, newest_python, tmp_path):
    # GIVEN a core cut to a third, as a size limit or a full disk leaves it
    cut = truncated_copy(cores.get(newest_python, "heap-prev"), tmp_path / "core.cut")
    r = run("analyze", "--json", str(cut))
    assert r.exit_code == EXIT_PARTIAL
    a = json.loads(r.stdout)["analysis"]
    status = a["snapshot"]["python_stack_status"]
    # THEN what is missing is said to be memory the core does not hold, not debug symbols
    assert "the core is truncated" in status and "debug symbols" not in status, status
    assert "truncated" in a["fingerprint_partial"]


def test_snapshot_in_a_batch_is_listed_apart(cores, newest_python, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(cores.get(newest_python, "segv"), d / "core.segv")
    shutil.copy(make_gcore(tmp_path, PYTHONS[newest_python]), d / "core.gcore")
    r = run("analyze", "--json", str(d))
    assert r.exit_code == EXIT_OK, r.stderr
    batch = json.loads(r.stdout)["batch"]
    assert len(batch["groups"]) == 1 and batch["groups"][0]["signature"].startswith("SIGSEGV")
    assert [e["path"] for e in batch["snapshots"]] == [str(d / "core.gcore")]
    assert "1 snapshot (no crash)" in run("analyze", str(d)).stdout


# -- core handler bundles ------------------------------------------------------------------------


@pytest.fixture
def live():
    """A live process whose /proc the handler reads (the kernel keeps the dying one alive the same way)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.1)
        yield p
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def handler_dir(cores, newest_python, tmp_path, live):
    """A core handler's directory: one crash with its core kept, one with metadata only (RLIMIT_CORE 0)."""
    if os.geteuid() != 0:
        pytest.skip("the core handler reads /proc/PID of other processes as root")
    from forensics.capture.handler import run_core_handler

    d = tmp_path / "cores"
    core = cores.get(newest_python, "heap-prev")
    for rlimit in (None, 0):
        fd = os.open(core, os.O_RDONLY)
        try:
            run_core_handler(str(d), live.pid, live.pid, signal.SIGABRT, CRASH_TIME, rlimit, stdin_fd=fd)
        finally:
            os.close(fd)
    return d


def test_analyzing_a_bundle_never_writes_into_it(handler_dir, tmp_path, monkeypatch):
    # GIVEN a handler's bundle with its compressed core (mode 0640), and an empty forensics cache
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path / "cache"))
    kept = next(p for p in (handler_dir / "crashes").iterdir() if (p / "50-core" / "core.zst").exists())
    before = tree(handler_dir)
    # WHEN it is analyzed, alone and as part of the handler's directory
    r = run("analyze", "--json", str(kept))
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    run("analyze", "--json", str(handler_dir))
    # THEN the bundle is as it was: no decompressed core, no sysroot, same modes and times
    assert tree(handler_dir) == before
    # the core was decompressed into the cache, readable by its owner only
    (entry,) = (tmp_path / "cache" / "bundles").iterdir()
    assert stat.S_IMODE((entry / "core").stat().st_mode) == 0o600
    assert a["snapshot"]["core"]["path"] == str(entry / "core")
    assert a["snapshot"]["sysroot"] == str(entry / "sysroot")


def test_batch_of_handler_bundles_uses_the_recorded_crash_time(handler_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path / "cache"))
    r = run("analyze", "--json", str(handler_dir))
    assert r.exit_code == EXIT_OK, r.stderr
    batch = json.loads(r.stdout)["batch"]
    # THEN first and last seen are the crash's time as the handler recorded it, not the analysis time
    (group,) = batch["groups"]
    assert group["first_seen"] == group["last_seen"] == CRASH_TIME
    # and the crash whose core was not kept is listed, with why
    (meta,) = batch["metadata_only"]
    assert meta["mtime"] == CRASH_TIME and "RLIMIT_CORE" in meta["no_core"]
    text = run("analyze", str(handler_dir)).stdout
    assert "metadata only (no core kept: RLIMIT_CORE" in text
    assert "2023-11-14 22:13:20Z" in text  # CRASH_TIME


def test_the_handlers_index_holds_no_second_fingerprint_definition(handler_dir, cores, newest_python, tmp_path,
                                                                   monkeypatch):
    # GIVEN the handler's index: its crash-loop key is no fingerprint, and is not called one
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path / "cache"))
    index = [json.loads(line) for line in (handler_dir / "index.jsonl").read_text().splitlines()]
    assert all("fingerprint" not in e and e["crash_loop_key"] for e in index)
    # WHEN the directory is analyzed (what the agent publishes)
    doc = json.loads(run("analyze", "--json", str(handler_dir)).stdout)
    # THEN each crash id of the index gets the one fingerprint, the same as analyzing the core itself
    by_id = {c["crash_id"]: c for c in doc["cores"]}
    assert set(by_id) == {e["id"] for e in index}
    kept = next(e for e in index if e["core"])
    plain = json.loads(run("analyze", "--json", str(cores.get(newest_python, "heap-prev"))).stdout)["analysis"]
    assert by_id[kept["id"]]["fingerprint"] == plain["fingerprint"]


def test_metadata_only_bundle_alone_says_so(handler_dir):
    bundle = next(p for p in (handler_dir / "crashes").iterdir() if not any((p / "50-core").iterdir()))
    r = run("analyze", str(bundle))
    assert r.exit_code == EXIT_ERROR
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("forensics: error:")]
    assert f"{bundle}: metadata only (no core kept: RLIMIT_CORE" in line


# -- decompressing a bundle's core: bounded, and only ever into the cache ----------------------------


def test_decompression_stops_where_the_core_says_it_ends(cores, newest_python, tmp_path):
    import zstandard

    from forensics.bundle import decompress_core
    from forensics.errors import CoreReadError

    # GIVEN a compressed core followed by 32 MiB of zeros (a few KiB compressed: a decompression bomb)
    core = cores.get(newest_python, "segv")
    bomb = tmp_path / "core.zst"
    with open(core, "rb") as src:
        bomb.write_bytes(zstandard.ZstdCompressor().compress(src.read() + bytes(32 << 20)))
    assert bomb.stat().st_size < core.stat().st_size
    # WHEN it is decompressed
    n = decompress_core(str(bomb), str(tmp_path / "core"))
    # THEN no more is written than the core's own program headers say it holds
    assert n == core.stat().st_size == (tmp_path / "core").stat().st_size
    # and a stream that is no core is held to the limit
    junk = tmp_path / "junk.zst"
    junk.write_bytes(zstandard.ZstdCompressor().compress(bytes(8 << 20)))
    with pytest.raises(CoreReadError, match="decompresses to more than"):
        decompress_core(str(junk), str(tmp_path / "junk"), limit=1 << 20)
    assert not (tmp_path / "junk").exists() and not list(tmp_path.glob(".junk.tmp*"))


def test_an_unusable_cache_is_said_and_the_bundle_left_alone(handler_dir, tmp_path, monkeypatch):
    kept = next(p for p in (handler_dir / "crashes").iterdir() if (p / "50-core" / "core.zst").exists())
    not_a_dir = tmp_path / "cache-file"
    not_a_dir.write_text("")
    monkeypatch.setenv("FORENSICS_CACHE", str(not_a_dir))
    before = tree(handler_dir)
    r = run("analyze", str(kept))
    assert r.exit_code == EXIT_ERROR
    assert "cannot use the forensics cache" in r.stderr and "FORENSICS_CACHE" in r.stderr
    assert tree(handler_dir) == before


def test_a_damaged_compressed_core_is_one_line_and_a_cut_one_partial(handler_dir, tmp_path, monkeypatch):
    import zstandard

    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path / "cache"))
    kept = next(p for p in (handler_dir / "crashes").iterdir() if (p / "50-core" / "core.zst").exists())
    good = (kept / "50-core" / "core.zst").read_bytes()
    # GIVEN copies of the bundle: one whose first zstd block header is garbage (a reserved block type), one whose
    # stream stops in the middle of its frame (zstd says nothing: the core it gives is cut short)
    at = zstandard.frame_header_size(good)
    damaged, cut = tmp_path / "damaged", tmp_path / "cut"
    for copy, data in ((damaged, good[:at] + b"\xff\xff\xff" + good[at + 3:]), (cut, good[: len(good) // 2])):
        shutil.copytree(kept, copy)
        (copy / "50-core" / "core.zst").write_bytes(data)
    # WHEN each is analyzed
    r = run("analyze", str(damaged))
    # THEN the damaged one is one line naming the file and the stream, exit 1, no traceback, nothing left behind
    assert r.exit_code == EXIT_ERROR
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("forensics: error:")]
    assert f"{damaged / '50-core' / 'core.zst'}: cannot read core: damaged zstd stream:" in line, r.stderr
    assert "Traceback" not in r.output and not list((tmp_path / "cache").rglob("*.tmp*"))
    # and the cut one is analyzed as far as it goes: a truncated core, a partial result that says so
    r = run("analyze", "--json", str(cut))
    assert r.exit_code == EXIT_PARTIAL, r.output
    core = json.loads(r.stdout)["analysis"]["snapshot"]["core"]
    assert core["truncated"] and core["size"] < core["expected_size"]
