"""glibc heap layouts: the table, the model it is generated from, and the message -> check table."""
from __future__ import annotations

import json

import pytest

from forensics.heap.anatomy import CHECKS, classify_message
from forensics.heap.gen_layouts import _comparable, model_structs
from forensics.heap.layout import (
    NEWEST,
    OLDEST,
    LayoutError,
    known_versions,
    layout_for_version,
    layout_from_structs,
)

VERSIONS = [(2, m) for m in range(OLDEST[1], NEWEST[1] + 1)]


def test_the_table_covers_2_31_to_2_43():
    assert known_versions() == tuple(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"glibc={v[0]}.{v[1]}")
def test_every_table_entry_is_what_the_model_of_its_sources_says(version):
    # GIVEN the generated table (DWARF entries were checked against the model when generated)
    from forensics.heap.layout import _table

    entry = _table()["layouts"][f"{version[0]}.{version[1]}"]
    # THEN each entry, read from DWARF or modelled, equals the model
    assert _comparable(entry["structs"]) == _comparable(model_structs(version[1])), entry["source"]


def test_the_four_debian_versions_come_from_dwarf():
    from forensics.heap.layout import _table

    sources = {k: v["source"] for k, v in _table()["layouts"].items()}
    for v in ("2.31", "2.36", "2.41", "2.43"):
        assert sources[v].startswith("DWARF of GNU C Library (Debian GLIBC " + v), sources[v]


@pytest.mark.parametrize(
    "version, arena_size, top, heap_info, tcache_chunk, fastbins, safe, slots, mmap_overhead",
    [
        ((2, 31), 2200, 96, 32, 0x290, True, False, False, 16),
        ((2, 32), 2200, 96, 32, 0x290, True, True, False, 16),
        ((2, 35), 2200, 96, 48, 0x290, True, True, False, 16),
        ((2, 42), 2200, 96, 48, 0x300, True, True, True, 16),
        ((2, 43), 2112, 8, 48, 0x300, False, True, True, 8),
    ],
    ids=lambda v: f"glibc={v[0]}.{v[1]}" if isinstance(v, tuple) else None,
)
def test_layout_behaviour_by_version(version, arena_size, top, heap_info, tcache_chunk, fastbins, safe, slots,
                                     mmap_overhead):
    lay = layout_for_version(version)
    assert (lay.arena_size, lay.arena_top, lay.heap_info_size, lay.tcache_chunk_size) == (
        arena_size, top, heap_info, tcache_chunk)
    assert (lay.arena_fastbins is not None, lay.safe_linking, lay.tcache_counts_free_slots, lay.mmap_overhead) == (
        fastbins, safe, slots, mmap_overhead)
    assert lay.nbins == 128
    # bin_at(1) is the unsorted bin: its fd is bins[0]
    assert lay.bin_address(0x1000, 1) + 16 == 0x1000 + lay.arena_bins


def test_a_version_outside_the_table_says_how_to_get_one():
    with pytest.raises(LayoutError, match="libc6-dbg"):
        layout_for_version((2, 28))


def test_a_struct_source_without_malloc_state_is_refused():
    structs = json.loads(json.dumps(model_structs(36)))
    del structs["malloc_state"]
    with pytest.raises(LayoutError, match="malloc_state"):
        layout_from_structs((2, 36), structs, "test")


@pytest.mark.parametrize("message, kind", [
    ("free(): invalid next size (normal)", "next-size"),
    ("free(): invalid next size (fast)", "next-size"),
    ("double free or corruption (!prev)", "next-prev-inuse"),
    ("double free or corruption (out)", "out"),
    ("double free or corruption (top)", "top"),
    ("free(): invalid pointer", "invalid-pointer"),
    ("munmap_chunk(): invalid pointer", "munmap"),
    ("free(): double free detected in tcache 2", "tcache-double"),
    ("corrupted size vs. prev_size", "bins"),
    ("corrupted size vs. prev_size while consolidating", "consolidate-prev"),
    ("malloc(): unsorted double linked list corrupted", "bins"),
    ("malloc(): corrupted top size", "top-size"),
    ("malloc(): unaligned tcache chunk detected", "tcache-list"),
])
def test_glibc_messages_name_their_check(message, kind):
    assert classify_message(message).kind == kind


def test_every_check_text_is_distinct():
    texts = [c.text for c in CHECKS]
    assert len(texts) == len(set(texts))
