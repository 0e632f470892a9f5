"""Struct layouts of CPython 3.8-3.13: the generated table, and 3.13's ``_Py_DebugOffsets``.

``layouts.json`` (written by :mod:`forensics.pyread.gen_layouts` from the DWARF
of debug builds) holds, per minor version, the offset, size and signedness of
every field the reader uses.  A field a version lacks is absent, and the code
path is chosen from which fields exist (the "family"), as the gdb method does.

CPython 3.13 also publishes its own offsets in ``_PyRuntime.debug_offsets``
(cookie ``xdebugpy``); :func:`parse_debug_offsets` reads them from the core and
:func:`build_layout` lets them override the table, so a 3.13 patch release with
moved fields is still read right.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import struct

__all__ = [
    "Field",
    "Struct",
    "Layout",
    "DEBUG_COOKIE",
    "DEBUG_OFFSETS_313",
    "load_table",
    "parse_debug_offsets",
    "build_layout",
    "LayoutError",
]

DEBUG_COOKIE = b"xdebugpy"

#: the uint64 fields of 3.13's ``struct _Py_DebugOffsets``, in order, after cookie[8]
DEBUG_OFFSETS_313 = (
    "version", "free_threaded",
    "runtime_state.size", "runtime_state.finalizing", "runtime_state.interpreters_head",
    "interpreter_state.size", "interpreter_state.id", "interpreter_state.next", "interpreter_state.threads_head",
    "interpreter_state.gc", "interpreter_state.imports_modules", "interpreter_state.sysdict",
    "interpreter_state.builtins", "interpreter_state.ceval_gil", "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled", "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "thread_state.size", "thread_state.prev", "thread_state.next", "thread_state.interp",
    "thread_state.current_frame", "thread_state.thread_id", "thread_state.native_thread_id",
    "thread_state.datastack_chunk", "thread_state.status",
    "interpreter_frame.size", "interpreter_frame.previous", "interpreter_frame.executable",
    "interpreter_frame.instr_ptr", "interpreter_frame.localsplus", "interpreter_frame.owner",
    "code_object.size", "code_object.filename", "code_object.name", "code_object.qualname",
    "code_object.linetable", "code_object.firstlineno", "code_object.argcount", "code_object.localsplusnames",
    "code_object.localspluskinds", "code_object.co_code_adaptive",
    "pyobject.size", "pyobject.ob_type",
    "type_object.size", "type_object.tp_name", "type_object.tp_repr", "type_object.tp_flags",
    "tuple_object.size", "tuple_object.ob_item", "tuple_object.ob_size",
    "list_object.size", "list_object.ob_item", "list_object.ob_size",
    "dict_object.size", "dict_object.ma_keys", "dict_object.ma_values",
    "float_object.size", "float_object.ob_fval",
    "long_object.size", "long_object.lv_tag", "long_object.ob_digit",
    "bytes_object.size", "bytes_object.ob_size", "bytes_object.ob_sval",
    "unicode_object.size", "unicode_object.state", "unicode_object.length", "unicode_object.asciiobject_size",
    "gc.size", "gc.collecting",
)

# debug-offsets name -> (type, field path) of the table that it overrides
_DEBUG_TO_TABLE = {
    "runtime_state.interpreters_head": ("_PyRuntimeState", "interpreters.head"),
    "interpreter_state.next": ("PyInterpreterState", "next"),
    "interpreter_state.threads_head": ("PyInterpreterState", "threads.head"),
    "interpreter_state.imports_modules": ("PyInterpreterState", "imports.modules"),
    "interpreter_state.sysdict": ("PyInterpreterState", "sysdict"),
    "interpreter_state.ceval_gil": ("PyInterpreterState", "ceval.gil"),
    "interpreter_state.gil_runtime_state_locked": ("struct _gil_runtime_state", "locked"),
    "interpreter_state.gil_runtime_state_holder": ("struct _gil_runtime_state", "last_holder"),
    "thread_state.next": ("PyThreadState", "next"),
    "thread_state.current_frame": ("PyThreadState", "current_frame"),
    "thread_state.thread_id": ("PyThreadState", "thread_id"),
    "thread_state.native_thread_id": ("PyThreadState", "native_thread_id"),
    "interpreter_frame.previous": ("_PyInterpreterFrame", "previous"),
    "interpreter_frame.executable": ("_PyInterpreterFrame", "f_executable"),
    "interpreter_frame.instr_ptr": ("_PyInterpreterFrame", "instr_ptr"),
    "interpreter_frame.owner": ("_PyInterpreterFrame", "owner"),
    "code_object.filename": ("PyCodeObject", "co_filename"),
    "code_object.name": ("PyCodeObject", "co_name"),
    "code_object.qualname": ("PyCodeObject", "co_qualname"),
    "code_object.linetable": ("PyCodeObject", "co_linetable"),
    "code_object.firstlineno": ("PyCodeObject", "co_firstlineno"),
    "code_object.co_code_adaptive": ("PyCodeObject", "co_code_adaptive"),
    "pyobject.ob_type": ("PyObject", "ob_type"),
    "type_object.tp_flags": ("PyTypeObject", "tp_flags"),
    "dict_object.ma_keys": ("PyDictObject", "ma_keys"),
    "dict_object.ma_values": ("PyDictObject", "ma_values"),
    "long_object.lv_tag": ("PyLongObject", "long_value.lv_tag"),
    "long_object.ob_digit": ("PyLongObject", "long_value.ob_digit"),
    "bytes_object.ob_size": ("PyVarObject", "ob_size"),
    "bytes_object.ob_sval": ("PyBytesObject", "ob_sval"),
    "unicode_object.length": ("PyASCIIObject", "length"),
    "unicode_object.state": ("PyASCIIObject", "state"),
}

_FORMATS = {(1, False): "B", (1, True): "b", (2, False): "H", (2, True): "h",
            (4, False): "I", (4, True): "i", (8, False): "Q", (8, True): "q"}


class LayoutError(Exception):
    """The table or the debug offsets do not describe a layout the reader can use."""


class Field(tuple):
    """(offset, size, signed) of one scalar field."""

    __slots__ = ()

    def __new__(cls, offset: int, size: int, signed: bool = False) -> "Field":
        return super().__new__(cls, (offset, size, signed))

    @property
    def offset(self) -> int:
        return self[0]


class Struct:
    """Several scalar fields of one struct, read with a single bounded memory read."""

    def __init__(self, fields: dict[str, Field]) -> None:
        if not fields:
            raise LayoutError("a struct reader needs at least one field")
        for name, (_, size, signed) in fields.items():
            if (size, signed) not in _FORMATS:
                raise LayoutError(f"field {name} is not a scalar ({size} bytes)")
        self.start = min(f[0] for f in fields.values())
        self.size = max(f[0] + f[1] for f in fields.values()) - self.start
        self._items = [(name, struct.Struct("<" + _FORMATS[(f[1], f[2])]), f[0] - self.start)
                       for name, f in fields.items()]
        self.names = frozenset(fields)

    def decode(self, buf: bytes) -> dict[str, int]:
        return {name: fmt.unpack_from(buf, off)[0] for name, fmt, off in self._items}


@functools.lru_cache(maxsize=1)
def load_table() -> dict:
    """The generated table: ``{"3.8": {...}, ...}``."""
    with open(os.path.join(os.path.dirname(__file__), "layouts.json")) as f:
        return json.load(f)["layouts"]


def parse_debug_offsets(raw: bytes) -> dict[str, int] | None:
    """3.13's ``_Py_DebugOffsets`` as ``{name: value}``, or None without the cookie.

    :param raw: the bytes at ``&_PyRuntime.debug_offsets`` (at least 8 + 8 * len(DEBUG_OFFSETS_313))
    """
    if raw[:8] != DEBUG_COOKIE or len(raw) < 8 + 8 * len(DEBUG_OFFSETS_313):
        return None
    values = struct.unpack_from("<%dQ" % len(DEBUG_OFFSETS_313), raw, 8)
    return dict(zip(DEBUG_OFFSETS_313, values))


def _apply_debug_offsets(record: dict, debug: dict[str, int]) -> dict:
    rec = copy.deepcopy(record)
    types = rec["types"]
    debug = dict(debug)
    for name in ("interpreter_state.gil_runtime_state_locked", "interpreter_state.gil_runtime_state_holder"):
        # offsets in the interpreter of its own GIL's fields: made relative to the GIL struct
        debug[name] -= debug["interpreter_state.gil_runtime_state"]
    for name, (tname, path) in _DEBUG_TO_TABLE.items():
        fields = types.setdefault(tname, {"size": 0, "fields": {}})["fields"]
        old = fields.get(path)
        new_off = debug[name]
        if old is None:
            fields[path] = {"offset": new_off, "size": 8, "signed": False, "kind": "int"}
            continue
        delta = new_off - old["offset"]
        if not delta:
            continue
        # a struct moved: its bit-fields (str state) move with it
        prefix = path + "."
        for p, f in fields.items():
            if p == path or p.startswith(prefix):
                f["offset"] += delta
                if "bit" in f:
                    f["bit"] += delta * 8
    rec["sizes"]["PyASCIIObject"] = debug["unicode_object.asciiobject_size"]
    return rec


class Layout:
    """Everything version-dependent, computed once from one table record.

    ``family`` names the frame layout: 38 (3.8/3.9), 310, 311, 312, 313.
    """

    def __init__(self, record: dict) -> None:
        self.record = record
        self.version = record["version"]
        self.ptr_size = record.get("ptr_size", 8)
        if self.ptr_size != 8:
            raise LayoutError("only 64-bit layouts are supported")
        self._types = record["types"]
        tstate, code = "PyThreadState", "PyCodeObject"
        for t in ("_PyRuntimeState", "PyInterpreterState", tstate, code):
            if t not in self._types:
                raise LayoutError(f"the table has no {t}")
        if self.has(tstate, "frame"):
            self.family = 310 if self.has(code, "co_linetable") else 38
        elif self.has("_PyInterpreterFrame", "f_executable"):
            self.family = 313
        elif self.has("_PyInterpreterFrame", "is_entry"):
            self.family = 311
        else:
            self.family = 312
        self._runtime()
        self._threads()
        self._frames()
        self._code()
        self._objects()

    # -- table access ---------------------------------------------------------------------

    def has(self, tname: str, path: str) -> bool:
        return path in self._types.get(tname, {}).get("fields", {})

    def field(self, tname: str, path: str) -> Field:
        try:
            f = self._types[tname]["fields"][path]
        except KeyError:
            raise LayoutError(f"the table has no {tname}.{path}") from None
        return Field(f["offset"], f["size"], f["signed"])

    def offset(self, tname: str, path: str) -> int:
        return self.field(tname, path).offset

    def struct(self, tname: str, paths: tuple[str, ...] | list[str], optional: tuple[str, ...] = ()) -> Struct:
        fields = {p: self.field(tname, p) for p in paths}
        fields.update({p: self.field(tname, p) for p in optional if self.has(tname, p)})
        return Struct(fields)

    # -- per area -------------------------------------------------------------------------

    def _runtime(self) -> None:
        self.runtime_head = self.field("_PyRuntimeState", "interpreters.head")
        self.runtime_main_thread = (self.field("_PyRuntimeState", "main_thread")
                                    if self.has("_PyRuntimeState", "main_thread") else None)
        i = "PyInterpreterState"
        self.interp_head = "tstate_head" if self.has(i, "tstate_head") else "threads.head"
        self.interp_modules = "modules" if self.has(i, "modules") else "imports.modules"
        self.interp = self.struct(i, ["next", self.interp_head, self.interp_modules, "sysdict"])
        # the GIL: in _PyRuntime (3.8-3.11) or behind interp->ceval.gil (3.12+)
        gil_t = "struct _gil_runtime_state"
        self.gil_runtime_off = None
        self.gil_interp_ptr_off = None
        if self.has(i, "ceval.gil") and self._types[i]["fields"]["ceval.gil"].get("kind") == "ptr":
            self.gil_interp_ptr_off = self.offset(i, "ceval.gil")
        elif self.has("_PyRuntimeState", "ceval.gil"):
            self.gil_runtime_off = self.offset("_PyRuntimeState", "ceval.gil")
        self.gil = None
        if gil_t in self._types and (self.gil_runtime_off is not None or self.gil_interp_ptr_off is not None):
            locked = "locked._value" if self.has(gil_t, "locked._value") else "locked"
            holder = "last_holder._value" if self.has(gil_t, "last_holder._value") else "last_holder"
            self.gil = self.struct(gil_t, [locked, holder])
            self.gil_locked, self.gil_holder = locked, holder

    def _threads(self) -> None:
        t = "PyThreadState"
        self.tstate_frame = {38: "frame", 310: "frame", 313: "current_frame"}.get(self.family, "cframe")
        self.tstate = self.struct(t, ["next", "thread_id", self.tstate_frame], optional=("native_thread_id",))
        self.cframe = self.struct("_PyCFrame", ["current_frame"]) if self.family in (311, 312) else None

    def _frames(self) -> None:
        fo = "PyFrameObject"
        if self.family in (38, 310):
            self.frame = self.struct(fo, ["f_back", "f_code", "f_lasti", "f_lineno", "f_trace"])
            return
        self.frameobj = self.struct(fo, ["f_trace", "f_lineno"])
        self.iframe_code = "f_executable" if self.family == 313 else "f_code"
        self.iframe_instr = "instr_ptr" if self.family == 313 else "prev_instr"
        self.iframe = self.struct("_PyInterpreterFrame",
                                  ["previous", self.iframe_code, self.iframe_instr, "owner", "frame_obj"],
                                  optional=("is_entry",))

    def _code(self) -> None:
        c = "PyCodeObject"
        self.code_name = "co_qualname" if self.has(c, "co_qualname") else "co_name"
        self.code_table = "co_lnotab" if self.family == 38 else "co_linetable"
        self.ob_type_off = self.offset("PyObject", "ob_type")
        fields = {p: self.field(c, p) for p in (self.code_name, "co_filename", "co_firstlineno", self.code_table)}
        fields["ob_type"] = Field(self.ob_type_off, 8, False)
        self.code = Struct(fields)
        self.code_units_off = self.offset(c, "co_code_adaptive") if self.has(c, "co_code_adaptive") else None

    def _objects(self) -> None:
        sizes = self.record["sizes"]
        self.ob_size_off = self.offset("PyVarObject", "ob_size")
        self.free_threaded = self.has("PyObject", "ob_tid")
        self.bytes_sval_off = self.offset("PyBytesObject", "ob_sval")
        a = "PyASCIIObject"
        self.ascii_size = sizes["PyASCIIObject"]
        self.compact_size = sizes["PyCompactUnicodeObject"]
        self.uni_length_off = self.offset(a, "length")
        self.uni_state_bits = {}
        for name in ("kind", "compact", "ascii"):
            f = self._types[a]["fields"]["state." + name]
            self.uni_state_bits[name] = (f["bit"], f["bits"])
        self.uni_data_off = self.offset("PyUnicodeObject", "data")
        lo = "PyLongObject"
        if self.has(lo, "long_value.lv_tag"):
            self.long_tag_off = self.offset(lo, "long_value.lv_tag")
            digit = self._types[lo]["fields"]["long_value.ob_digit"]
        else:
            self.long_tag_off = None
            digit = self._types[lo]["fields"]["ob_digit"]
        self.long_digit_off = digit["offset"]
        self.long_digit_size = digit.get("target_size") or 4
        self.long_digit_bits = 30 if self.long_digit_size == 4 else 15
        self.dict = self.struct("PyDictObject", ["ma_keys", "ma_values"])
        k = "PyDictKeysObject"
        self.new_dict_keys = self.has(k, "dk_log2_size")
        if self.new_dict_keys:
            self.keys = self.struct(k, ["dk_log2_size", "dk_log2_index_bytes", "dk_kind", "dk_nentries"])
        else:
            self.keys = self.struct(k, ["dk_size", "dk_nentries"])
        self.keys_indices_off = self.offset(k, "dk_indices")
        e = "PyDictKeyEntry"
        self.entry_general = (sizes[e], self.offset(e, "me_key"), self.offset(e, "me_value"))
        u = "PyDictUnicodeEntry"
        self.entry_unicode = ((sizes[u], self.offset(u, "me_key"), self.offset(u, "me_value"))
                              if u in sizes and u in self._types else None)
        v = "PyDictValues"
        self.values_off = self.offset(v, "values") if self.has(v, "values") else 0
        self.values_valid = self.offset(v, "valid") if self.has(v, "valid") else None
        self.type = self.struct("PyTypeObject", ["tp_flags", "tp_dictoffset", "tp_basicsize"])
        self.ht_cached_keys_off = self.offset("PyHeapTypeObject", "ht_cached_keys")
        self.managed_dict_off = -(1 if self.free_threaded else 3) * self.ptr_size
        self.md_dict_off = (self.offset("PyModuleObject", "md_dict") if self.has("PyModuleObject", "md_dict")
                            else sizes.get("PyObject", 16))


def build_layout(major: int, minor: int, debug: dict[str, int] | None = None) -> Layout:
    """The layout of CPython ``major.minor``, corrected by the core's debug offsets when given.

    :raises LayoutError: when the table has no such version or the record is unusable
    """
    record = load_table().get(f"{major}.{minor}")
    if record is None:
        raise LayoutError(f"CPython {major}.{minor} is not in the layout table (3.8-3.13)")
    if debug is not None:
        record = _apply_debug_offsets(record, debug)
    return Layout(record)
