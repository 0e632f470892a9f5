"""The generated layout table and 3.13's _Py_DebugOffsets (forensics.pyread.layouts)."""
from __future__ import annotations

import struct

import pytest

from forensics.pyread.layouts import (  # noqa: I001
    _DEBUG_TO_TABLE,
    DEBUG_COOKIE,
    DEBUG_OFFSETS_313,
    Field,
    Struct,
    build_layout,
    load_table,
    parse_debug_offsets,
)
from forensics.pyread.locate import format_hexversion

VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
FAMILIES = {"3.8": 38, "3.9": 38, "3.10": 310, "3.11": 311, "3.12": 312, "3.13": 313}


@pytest.mark.parametrize("minor", VERSIONS)
def test_table_records_where_each_layout_came_from(minor):
    record = load_table()[minor]
    # THEN the exact version, the object read and its build-id are recorded
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


def test_unknown_version_is_refused():
    from forensics.pyread.layouts import LayoutError

    with pytest.raises(LayoutError):
        build_layout(3, 7)


def test_debug_offsets_field_order_matches_the_313_dwarf():
    # GIVEN the _Py_DebugOffsets layout gen_layouts read from 3.13's DWARF
    recorded = load_table()["3.13"]["debug_offsets_struct"]
    # THEN the reader's field list is the same, in the same order, all 8-byte fields after the cookie
    assert recorded["cookie"] == [0, 8]
    for i, name in enumerate(DEBUG_OFFSETS_313):
        assert recorded[name] == [8 + 8 * i, 8], name
    assert len(recorded) == len(DEBUG_OFFSETS_313) + 1


def debug_blob(**changes: int) -> bytes:
    """Debug offsets equal to the table's 3.13 layout, with ``changes`` (dotted names with '__')."""
    layout = build_layout(3, 13)
    values = dict.fromkeys(DEBUG_OFFSETS_313, 0)
    values.update({
        "version": 0x030D00F0,
        "runtime_state.interpreters_head": layout.runtime_head.offset,
        "interpreter_state.gil_runtime_state": 1000,
        "interpreter_state.gil_runtime_state_locked": 1000 + layout.offset("struct _gil_runtime_state", "locked"),
        "interpreter_state.gil_runtime_state_holder": 1000 + layout.offset("struct _gil_runtime_state", "last_holder"),
        "thread_state.next": layout.offset("PyThreadState", "next"),
        "unicode_object.state": layout.offset("PyASCIIObject", "state"),
        "unicode_object.asciiobject_size": layout.ascii_size,
    })
    for key in ("interpreter_state.next", "interpreter_state.threads_head", "interpreter_state.imports_modules",
                "interpreter_state.sysdict", "interpreter_state.ceval_gil", "thread_state.current_frame",
                "thread_state.thread_id", "thread_state.native_thread_id", "interpreter_frame.previous",
                "interpreter_frame.executable", "interpreter_frame.instr_ptr", "interpreter_frame.owner",
                "code_object.filename", "code_object.name", "code_object.qualname", "code_object.linetable",
                "code_object.firstlineno", "code_object.co_code_adaptive", "pyobject.ob_type",
                "type_object.tp_flags", "dict_object.ma_keys", "dict_object.ma_values", "long_object.lv_tag",
                "long_object.ob_digit", "bytes_object.ob_size", "bytes_object.ob_sval", "unicode_object.length"):
        tname, path = _DEBUG_TO_TABLE[key]
        values[key] = layout.offset(tname, path)
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    return DEBUG_COOKIE + struct.pack("<%dQ" % len(values), *values.values())


def test_parse_debug_offsets_needs_the_cookie():
    assert parse_debug_offsets(b"\0" * 1024) is None
    assert parse_debug_offsets(DEBUG_COOKIE + b"\0" * 16) is None  # too short
    assert parse_debug_offsets(debug_blob())["version"] == 0x030D00F0


def test_debug_offsets_equal_to_the_table_change_nothing():
    table = build_layout(3, 13)
    debug = build_layout(3, 13, parse_debug_offsets(debug_blob()))
    assert debug.tstate.decode(bytes(range(256)) * 2) == table.tstate.decode(bytes(range(256)) * 2)
    assert debug.gil_locked == table.gil_locked
    assert debug.offset("struct _gil_runtime_state", "locked") == table.offset("struct _gil_runtime_state", "locked")


def test_debug_offsets_override_the_table():
    # GIVEN a 3.13 patch release whose thread state moved ``next`` and whose str state moved by 8 bytes
    table = build_layout(3, 13)
    state = table.offset("PyASCIIObject", "state")
    debug = parse_debug_offsets(debug_blob(thread_state__next=0x1234, unicode_object__state=state + 8))
    # WHEN the layout is built with the core's debug offsets
    layout = build_layout(3, 13, debug)
    # THEN the core's offsets win, and bit-fields move with their struct
    assert layout.offset("PyThreadState", "next") == 0x1234
    assert layout.uni_state_bits["kind"][0] == table.uni_state_bits["kind"][0] + 64
    # and the table itself is unchanged
    assert build_layout(3, 13).offset("PyThreadState", "next") == table.offset("PyThreadState", "next")


def test_struct_decodes_signed_and_unsigned_fields_in_one_read():
    st = Struct({"a": Field(8, 4, True), "b": Field(16, 8), "c": Field(12, 1)})
    assert (st.start, st.size) == (8, 16)
    buf = struct.pack("<iBxxxQ", -5, 7, 2**63)
    assert st.decode(buf) == {"a": -5, "b": 2**63, "c": 7}


@pytest.mark.parametrize("hexv,text", [(0x030800F0, "3.8.0"), (0x030C01F0, "3.12.1"), (0x030D00C2, "3.13.0rc2"),
                                       (0x030B00A7, "3.11.0a7")])
def test_format_hexversion(hexv, text):
    assert format_hexversion(hexv) == text
