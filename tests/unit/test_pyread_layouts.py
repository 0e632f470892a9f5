"""The layout sources of the one walker: the generated table and the core's _Py_DebugOffsets (pure)."""
from __future__ import annotations

import struct

import pytest

from forensics.model import LayoutSource
from forensics.pyread.debug_offsets import (
    COOKIE, DebugOffsetsError, parse_debug_offsets, read_size, shape_for,
)
from forensics.pyread.layouts import (
    Field, LayoutError, Struct, build_layout, choose_layout, compare_layouts, debug_offset_shapes, load_table,
)
from forensics.pyread.locate import format_hexversion

VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
FAMILIES = {"3.8": 38, "3.9": 38, "3.10": 310, "3.11": 311, "3.12": 312, "3.13": 313, "3.14": 313, "3.15": 313}


@pytest.mark.parametrize("minor", VERSIONS)
def test_table_records_where_each_layout_came_from(minor):
    record = load_table()[minor]
    assert record["version"].startswith(minor + ".")
    assert record["source"] and len(record["build_id"]) == 40
    assert record["ptr_size"] == 8


@pytest.mark.parametrize("minor", VERSIONS)
def test_every_version_builds_a_layout_of_its_family(minor):
    major, m = (int(x) for x in minor.split("."))
    layout = build_layout(major, m)
    assert layout.family == FAMILIES[minor]
    assert ("native_thread_id" in layout.tstate.names) == (m >= 11)
    assert layout.gil is not None
    assert (layout.gil_runtime_off is not None) == (m <= 11)
    if m >= 11:  # the frame owners come from the DWARF's enum, not from constants here
        assert layout.running_owners == {0, 1}


def test_unknown_old_version_is_refused_with_the_known_ones():
    with pytest.raises(LayoutError, match=r"CPython 3.7 is not in the layout table \(3.8, .*3.15\)"):
        build_layout(3, 7)


# -- _Py_DebugOffsets ---------------------------------------------------------------------------------


def blob(key: str = "3.14", version: int = 0x030E0AF0, **changes: int) -> bytes:
    """A _Py_DebugOffsets of the recorded ``key`` shape: each section's size 4096, every offset 8 ×
    its index in the section; ``changes`` (dotted names with '__') override."""
    shape = debug_offset_shapes()[key]
    buf = bytearray(read_size(shape))
    buf[:8] = COOKIE
    values: dict[str, int] = {"version": version, "free_threaded": 0}
    for i, name in enumerate(n for n in shape if n not in ("cookie", "version", "free_threaded")):
        values[name] = 4096 if name.endswith(".size") else 8 * (i % 64)
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    for name, value in values.items():
        off, size = shape[name]
        buf[off:off + size] = value.to_bytes(size, "little")
    return bytes(buf)


@pytest.mark.parametrize("key", ["3.13", "3.14", "3.15"])
def test_each_known_shape_is_recorded_from_the_dwarf_and_read_whole(key):
    shape = debug_offset_shapes()[key]
    assert shape["cookie"] == [0, 8] and shape["version"] == [8, 8] and shape["free_threaded"] == [16, 8]
    version = {"3.13": 0x030D12F0, "3.14": 0x030E0AF0, "3.15": 0x030F02F0}[key]
    parsed = parse_debug_offsets(blob(key, version), debug_offset_shapes())
    assert parsed.shape == key and parsed.version == version and not parsed.free_threaded
    assert set(parsed.values) == set(shape) - {"cookie"}


def test_shapes_grow_between_versions():
    shapes = debug_offset_shapes()
    assert read_size(shapes["3.13"]) < read_size(shapes["3.14"]) < read_size(shapes["3.15"])
    assert "interpreter_state.threads_main" not in shapes["3.13"] and "interpreter_state.threads_main" in shapes["3.14"]


def test_no_cookie_is_not_debug_offsets():
    assert parse_debug_offsets(b"\0" * 1024, debug_offset_shapes()) is None


@pytest.mark.parametrize("changes,reason", [
    ({"version": 0x020E0AF0}, "is not a CPython 3.13+ PY_VERSION_HEX"),
    ({"version": 0x030C01F0}, "is not a CPython 3.13+ PY_VERSION_HEX"),
    ({"free_threaded": 2}, "free_threaded field is 2"),
    ({"thread_state__size": 0}, "thread_state.size is 0"),
    ({"thread_state__size": 1 << 30}, "thread_state.size is 1073741824"),
    ({"thread_state__next": 5000}, "thread_state.next is 5000, past thread_state.size 4096"),
])
def test_inconsistent_debug_offsets_are_refused_with_the_reason(changes, reason):
    with pytest.raises(DebugOffsetsError, match=reason.replace("(", r"\(").replace("+", r"\+")):
        parse_debug_offsets(blob(**changes), debug_offset_shapes())


def test_runtime_size_must_be_the_symbol_size_and_the_struct_whole():
    shapes = debug_offset_shapes()
    assert parse_debug_offsets(blob(), shapes, runtime_size=4096).shape == "3.14"
    with pytest.raises(DebugOffsetsError, match=r"runtime_state.size 4096 is not the size of _PyRuntime \(316616\)"):
        parse_debug_offsets(blob(), shapes, runtime_size=316616)
    with pytest.raises(DebugOffsetsError, match="the core holds 100 of its"):
        parse_debug_offsets(blob()[:100], shapes)


def test_a_newer_version_is_read_with_the_newest_shape_and_says_so():
    # GIVEN the debug offsets of a CPython 3.16 laid out as 3.15's
    version = 0x031000A1
    assert shape_for(version, debug_offset_shapes())[0] == "3.15"
    debug = parse_debug_offsets(blob("3.15", version), debug_offset_shapes())
    # WHEN a layout is chosen for it
    choice = choose_layout(3, 16, debug=debug)
    # THEN the 3.15 table completes it, and the description says which offsets and shape were trusted
    assert choice.source is LayoutSource.DEBUG_OFFSETS
    assert choice.description.startswith(
        "_Py_DebugOffsets of 3.16.0a1, read with the 3.15 struct shape over table 3.15")
    assert "3.16 is newer than any known version" in choice.description


def real_debug(key: str):
    """Debug offsets equal to the table's own record of ``key`` (as the core of that build holds them)."""
    layout = build_layout(*map(int, key.split(".")))
    changes = {"runtime_state__interpreters_head": layout.runtime_head.offset,
               "thread_state__next": layout.offset("PyThreadState", "next"),
               "unicode_object__state": layout.offset("PyASCIIObject", "state"),
               "unicode_object__asciiobject_size": layout.ascii_size,
               "interpreter_state__gil_runtime_state": 0,
               "interpreter_state__gil_runtime_state_locked": layout.offset("struct _gil_runtime_state", "locked"),
               "interpreter_state__gil_runtime_state_holder":
                   layout.offset("struct _gil_runtime_state", "last_holder")}
    return changes


def test_debug_offsets_override_the_table_and_move_bit_fields():
    # GIVEN a 3.14 patch release whose thread state moved ``next`` and whose str state moved by 8 bytes
    table = build_layout(3, 14)
    changes = real_debug("3.14")
    changes["thread_state__next"] = 0x123
    changes["unicode_object__state"] += 8
    debug = parse_debug_offsets(blob(**changes), debug_offset_shapes())
    # WHEN the layout is built with the core's debug offsets
    choice = choose_layout(3, 14, debug=debug)
    # THEN the core's offsets win, bit-fields move with their struct, and the table itself is unchanged
    assert choice.layout.offset("PyThreadState", "next") == 0x123
    assert choice.layout.uni_state_bits["kind"][0] == table.uni_state_bits["kind"][0] + 64
    assert build_layout(3, 14).offset("PyThreadState", "next") == table.offset("PyThreadState", "next")
    assert "PyThreadState.next: offset 291 size 8 vs offset 8 size 8" in compare_layouts(choice.layout, table)


def test_refused_debug_offsets_fall_back_to_the_table_and_say_why():
    choice = choose_layout(3, 14, refused="thread_state.size is 0")
    assert choice.source is LayoutSource.TABLE
    assert choice.description == ("table 3.14 (3.14.10); the core's _Py_DebugOffsets were refused: "
                                  "thread_state.size is 0")


def test_struct_decodes_signed_and_unsigned_fields_in_one_read():
    st = Struct({"a": Field(8, 4, True), "b": Field(16, 8), "c": Field(12, 1)})
    assert (st.start, st.size) == (8, 16)
    buf = struct.pack("<iBxxxQ", -5, 7, 2**63)
    assert st.decode(buf) == {"a": -5, "b": 2**63, "c": 7}


@pytest.mark.parametrize("hexv,text", [(0x030800F0, "3.8.0"), (0x030C01F0, "3.12.1"), (0x030D00C2, "3.13.0rc2"),
                                       (0x030B00A7, "3.11.0a7"), (0x030E0AF0, "3.14.10")])
def test_format_hexversion(hexv, text):
    assert format_hexversion(hexv) == text


def test_a_free_threaded_build_without_a_table_record_says_so():
    # the debug offsets of a 3.14t core (free_threaded=1) cover less than the walk needs; without a 3.14t
    # record (no free-threaded build's DWARF here) the reason names the build
    debug = parse_debug_offsets(blob(free_threaded=1), debug_offset_shapes())
    assert debug.free_threaded
    with pytest.raises(LayoutError, match=r"no table record for free-threaded CPython 3.14 or older"):
        choose_layout(3, 14, free_threaded=True, debug=debug)
    with pytest.raises(LayoutError, match=r"^free-threaded CPython 3.14 is not in the layout table"):
        choose_layout(3, 14, free_threaded=True)
