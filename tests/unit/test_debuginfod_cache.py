"""libdebuginfod's cache as forensics keeps it: where it is, libdebuginfod's cleaning settings, the byte budget,
and the removal of what a killed fetch left (a live fetch's file is never touched)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from forensics.core import debuginfod
from forensics.core.debuginfod import clean_debuginfod_cache, debuginfod_cache_path, sweep_partial_fetches

DAY = 86400


def _entry(root: Path, build_id: str, size: int, age: float, now: float) -> Path:
    d = root / build_id
    d.mkdir(parents=True)
    f = d / "debuginfo"
    f.write_bytes(b"x" * size)
    os.utime(f, (now - age, now - age))
    os.utime(d, (now - age, now - age))
    return d


def test_the_cache_is_where_libdebuginfod_looks(monkeypatch, tmp_path):
    monkeypatch.delenv("DEBUGINFOD_CACHE_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert debuginfod_cache_path() == str(tmp_path / ".cache" / "debuginfod_client")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert debuginfod_cache_path() == str(tmp_path / "xdg" / "debuginfod_client")
    (tmp_path / ".debuginfod_client_cache").mkdir()  # libdebuginfod's old default wins when it exists
    assert debuginfod_cache_path() == str(tmp_path / ".debuginfod_client_cache")
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(tmp_path / "given"))
    assert debuginfod_cache_path() == str(tmp_path / "given")


def test_cleaning_follows_libdebuginfods_settings(tmp_path):
    now = time.time()
    old = _entry(tmp_path, "aa" * 20, 10, 8 * DAY, now)
    fresh = _entry(tmp_path, "bb" * 20, 10, 1 * DAY, now)
    (tmp_path / "not-a-build-id").mkdir()
    os.utime(tmp_path / "not-a-build-id", (now - 30 * DAY, now - 30 * DAY))
    # WHEN the cache is cleaned for the first time: the settings files are made with libdebuginfod's defaults
    deleted = clean_debuginfod_cache(str(tmp_path), now=now + 2 * DAY)
    assert (tmp_path / "cache_clean_interval_s").read_text() == "86400"
    assert (tmp_path / "max_unused_age_s").read_text() == "604800"
    # THEN a file not read for a week is deleted with its directory; a day-old one and what is not ours stay
    assert str(old / "debuginfo") in deleted and not old.exists()
    assert (fresh / "debuginfo").exists() and (tmp_path / "not-a-build-id").exists()
    # AND within the interval nothing is cleaned, whatever the age
    os.utime(fresh / "debuginfo", (now - 30 * DAY, now - 30 * DAY))
    assert clean_debuginfod_cache(str(tmp_path), now=time.time() + 60) == []
    # AND a shorter max_unused_age_s written by the operator, once the interval has passed, is obeyed
    (tmp_path / "max_unused_age_s").write_text("3600\n")
    os.utime(tmp_path / "cache_clean_interval_s", (now - 2 * DAY, now - 2 * DAY))
    os.utime(fresh / "debuginfo", (now - 7200, now - 7200))
    assert str(fresh / "debuginfo") in clean_debuginfod_cache(str(tmp_path), now=now)


def test_the_byte_budget_deletes_the_least_recently_used_build_ids(monkeypatch, tmp_path):
    now = time.time()
    a = _entry(tmp_path, "a1" * 20, 4000, 5 * DAY, now)
    b = _entry(tmp_path, "b2" * 20, 4000, 3 * DAY, now)
    c = _entry(tmp_path, "c3" * 20, 4000, 1 * DAY, now)
    kept = _entry(tmp_path, "d4" * 20, 4000, 9 * DAY, now)  # the one just fetched (old times from the server)
    recent = _entry(tmp_path, "e5" * 20, 4000, 60, now)
    monkeypatch.setenv("FORENSICS_DEBUGINFOD_CACHE_BYTES", "12000")
    deleted = debuginfod._prune(keep=str(kept), root=str(tmp_path))
    # THEN the oldest go first until the rest fit; neither the kept nor the recently used one is touched
    assert deleted == [str(a), str(b)]
    assert c.exists() and kept.exists() and recent.exists()


def test_a_partial_file_is_removed_only_when_its_writer_is_gone(tmp_path):
    tmp_dir = tmp_path / debuginfod.TMP_DIR
    tmp_dir.mkdir()
    live, dead = tmp_dir / ".debuginfo.live.tmp", tmp_dir / ".debuginfo.dead.tmp"
    live.write_bytes(b"partial")
    dead.write_bytes(b"partial")
    other = tmp_dir / "somebody-elses"
    other.write_bytes(b"")
    # GIVEN a writer alive holding its file's lock (another process, as a concurrent analysis would be)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(live)!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        # WHEN the partial files are swept
        removed = sweep_partial_fetches(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    # THEN only the dead one is removed; the live one, and what is not a partial fetch, stay
    assert removed == [str(dead)]
    assert live.exists() and other.exists()
    # AND once its writer is gone it goes too
    assert sweep_partial_fetches(str(tmp_path)) == [str(live)]
