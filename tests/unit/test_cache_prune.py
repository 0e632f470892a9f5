"""The cache's one pruner (forensics.cache.prune_lru) as the bundle cache uses it: entries on disk in a temporary
FORENSICS_CACHE, aged by their mtime."""
from __future__ import annotations

import os
import time
from pathlib import Path

from forensics.bundle import prune_bundle_cache
from forensics.cache import entry_bytes


def _entry(root: Path, name: str, age: float, files: dict[str, int]) -> Path:
    entry = root / "bundles" / name
    for rel, size in files.items():
        (entry / rel).parent.mkdir(parents=True, exist_ok=True)
        (entry / rel).write_bytes(b"\0" * size)
    now = time.time()
    os.utime(entry, (now - age, now - age))
    return entry


def test_a_sysroot_copy_counts_against_the_bundle_cache_budget(tmp_path, monkeypatch):
    """The bundle cache summed only an entry's top files (its core): a sysroot of copied objects (a cache on
    another filesystem than the bundles) was never counted, however large."""
    # GIVEN an entry used 3 h ago holding 2 MiB of copied objects in its sysroot, and one used 2 h ago with a core
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path))
    _entry(tmp_path, "old", 3 * 3600, {"sysroot/usr/lib/libnvidia-ml.so.1": 2 << 20})
    _entry(tmp_path, "newer", 2 * 3600, {"core": 1 << 20})
    # WHEN the cache is pruned to 1.5 MiB
    deleted = prune_bundle_cache(budget=3 << 19)
    # THEN the least recently used entry went, and what is left fits
    assert [Path(p).name for p in deleted] == ["old"]
    assert [p.name for p in (tmp_path / "bundles").iterdir()] == ["newer"]


def test_a_hard_linked_object_is_not_counted_and_a_recent_entry_is_kept(tmp_path, monkeypatch):
    # GIVEN an old entry whose sysroot object is a hard link of a file outside it (deleting it frees nothing),
    # and a recent entry over the budget
    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path))
    stored = tmp_path / "bundle-objects" / "lib.so"
    stored.parent.mkdir()
    stored.write_bytes(b"\0" * (4 << 20))
    old = _entry(tmp_path, "old", 3 * 3600, {"core": 1 << 10})
    (old / "sysroot").mkdir()
    os.link(stored, old / "sysroot" / "lib.so")
    os.symlink(stored, old / "sysroot" / "link.so")
    os.utime(old, (time.time() - 3 * 3600,) * 2)
    _entry(tmp_path, "recent", 60, {"core": 2 << 20})
    # WHEN the old entry is measured and the cache pruned to 1 MiB
    assert entry_bytes(str(old)) == 1 << 10
    deleted = prune_bundle_cache(budget=1 << 20)
    # THEN the old entry went (the budget is still passed) but the recent one, in use within the hour, stays
    assert [Path(p).name for p in deleted] == ["old"]
    assert [p.name for p in (tmp_path / "bundles").iterdir()] == ["recent"]


def test_the_decompressed_store_cores_are_pruned_past_their_own_budget(tmp_path, monkeypatch):
    # GIVEN two decompressed systemd-coredump cores of 1 MiB, used 2 h and 3 h ago, and a 1 MiB budget
    from forensics.coredumpd import prune_cache

    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path))
    monkeypatch.setenv("FORENSICS_COREDUMP_CACHE_BYTES", str(1 << 20))
    now = time.time()
    for name, age in (("a", 2 * 3600), ("b", 3 * 3600)):
        entry = tmp_path / "coredump" / name
        entry.mkdir(parents=True)
        (entry / "core").write_bytes(b"\0" * (1 << 20))
        os.utime(entry, (now - age, now - age))
    # WHEN the store's cache is pruned
    deleted = prune_cache()
    # THEN the least recently used one went
    assert [Path(p).name for p in deleted] == ["b"]
