"""Struct layouts of CPython for the walker, from three sources: the core's debug offsets, the table, DWARF.

``layouts.json`` (written by :mod:`forensics.pyread.gen_layouts` from the DWARF of
each build) holds, per version and build (``3.14``, ``3.14t``), the offset, size and
signedness of every field the walker uses, the constants of the enums it needs, and
the shape of ``_Py_DebugOffsets``.  A field a version lacks is absent, and the code
path is chosen from which fields exist (the "family").

:func:`choose_layout` picks the layout for a core, best source first:

1. CPython 3.13+ publishes its own offsets in ``_PyRuntime.debug_offsets``
   (:mod:`.debug_offsets`): they override the table record of that version (or, for
   a version newer than any known, of the newest known one) for every field they
   cover; the table gives the rest (dict internals, bit positions of str state);
2. the table record alone (3.8-3.12, or when the debug offsets were refused);
3. a record read from the DWARF of the core's own interpreter by gdb
   (``gdb_scripts/forensics_python.py``), used as it is: ``Layout(record)``.

Every :class:`Layout` says in :attr:`Layout.description` what it was made of.
"""
from __future__ import annotations

import functools
import json
import os
import struct
from forensics.model import LayoutSource
from forensics.pyread.debug_offsets import DebugOffsets
from forensics.records import record

__all__ = [
    "Field",
    "Struct",
    "Layout",
    "LayoutChoice",
    "load_table",
    "debug_offset_shapes",
    "apply_debug_offsets",
    "build_layout",
    "choose_layout",
    "compare_layouts",
    "LayoutError",
]

# debug-offsets name -> (type, field path) of the table that it overrides
_DEBUG_TO_TABLE = {
    "runtime_state.interpreters_head": ("_PyRuntimeState", "interpreters.head"),
    "interpreter_state.id": ("PyInterpreterState", "id"),
    "interpreter_state.next": ("PyInterpreterState", "next"),
    "interpreter_state.threads_head": ("PyInterpreterState", "threads.head"),
    "interpreter_state.threads_main": ("PyInterpreterState", "threads.main"),
    "interpreter_state.imports_modules": ("PyInterpreterState", "imports.modules"),
    "interpreter_state.sysdict": ("PyInterpreterState", "sysdict"),
    "interpreter_state.ceval_gil": ("PyInterpreterState", "ceval.gil"),
    "interpreter_state.gil_runtime_state_locked": ("struct _gil_runtime_state", "locked"),
    "interpreter_state.gil_runtime_state_holder": ("struct _gil_runtime_state", "last_holder"),
    "thread_state.next": ("PyThreadState", "next"),
    "thread_state.interp": ("PyThreadState", "interp"),
    "thread_state.current_frame": ("PyThreadState", "current_frame"),
    "thread_state.thread_id": ("PyThreadState", "thread_id"),
    "thread_state.native_thread_id": ("PyThreadState", "native_thread_id"),
    "interpreter_frame.previous": ("_PyInterpreterFrame", "previous"),
    "interpreter_frame.executable": ("_PyInterpreterFrame", "f_executable"),
    "interpreter_frame.instr_ptr": ("_PyInterpreterFrame", "instr_ptr"),
    "interpreter_frame.owner": ("_PyInterpreterFrame", "owner"),
    "interpreter_frame.tlbc_index": ("_PyInterpreterFrame", "tlbc_index"),
    "code_object.filename": ("PyCodeObject", "co_filename"),
    "code_object.name": ("PyCodeObject", "co_name"),
    "code_object.qualname": ("PyCodeObject", "co_qualname"),
    "code_object.linetable": ("PyCodeObject", "co_linetable"),
    "code_object.firstlineno": ("PyCodeObject", "co_firstlineno"),
    "code_object.co_code_adaptive": ("PyCodeObject", "co_code_adaptive"),
    "code_object.co_tlbc": ("PyCodeObject", "co_tlbc"),
    "pyobject.ob_type": ("PyObject", "ob_type"),
    "type_object.tp_flags": ("PyTypeObject", "tp_flags"),
    "type_object.tp_basicsize": ("PyTypeObject", "tp_basicsize"),
    "type_object.tp_dictoffset": ("PyTypeObject", "tp_dictoffset"),
    "heap_type_object.ht_cached_keys": ("PyHeapTypeObject", "ht_cached_keys"),
    "dict_object.ma_keys": ("PyDictObject", "ma_keys"),
    "dict_object.ma_values": ("PyDictObject", "ma_values"),
    "long_object.lv_tag": ("PyLongObject", "long_value.lv_tag"),
    "long_object.ob_digit": ("PyLongObject", "long_value.ob_digit"),
    "bytes_object.ob_size": ("PyVarObject", "ob_size"),
    "bytes_object.ob_sval": ("PyBytesObject", "ob_sval"),
    "unicode_object.length": ("PyASCIIObject", "length"),
    "unicode_object.state": ("PyASCIIObject", "state"),
}
# debug-offsets names that are struct sizes the walker uses
_DEBUG_TO_SIZES = {
    "unicode_object.asciiobject_size": "PyASCIIObject",
    "unicode_object.compactunicodeobject_size": "PyCompactUnicodeObject",
}

_FORMATS = {(1, False): "B", (1, True): "b", (2, False): "H", (2, True): "h",
            (4, False): "I", (4, True): "i", (8, False): "Q", (8, True): "q"}


class LayoutError(Exception):
    """The table or the debug offsets do not describe a layout the reader can use."""


class Field(tuple):
    """(offset, size, signed) of one scalar field."""

    __slots__ = ()

    def __new__(cls, offset: int, size: int, signed: bool = False) -> Field:
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
        # fields that do not overlap (most structs): one unpack of them all, in offset order, then by name in the
        # order given; overlapping ones (a union's members) are unpacked one by one
        by_off = sorted(self._items, key=lambda item: item[2])
        self._one: struct.Struct | None = None
        if all(a[2] + a[1].size <= b[2] for a, b in zip(by_off, by_off[1:], strict=False)):
            fmt, pos = "<", 0
            for _, f, off in by_off:
                fmt, pos = fmt + f"{off - pos}x" + f.format[1:], off + f.size
            self._one = struct.Struct(fmt)
            where = {name: i for i, (name, _, _) in enumerate(by_off)}
            self._perm = [(name, where[name]) for name, _, _ in self._items]

    def decode(self, buf: bytes) -> dict[str, int]:
        if self._one is not None:
            values = self._one.unpack_from(buf)
            return {name: values[i] for name, i in self._perm}
        return {name: fmt.unpack_from(buf, off)[0] for name, fmt, off in self._items}


@functools.lru_cache(maxsize=1)
def load_table() -> dict:
    """The generated table: ``{"3.8": {...}, "3.14": {...}, "3.14t": {...}}``."""
    with open(os.path.join(os.path.dirname(__file__), "layouts.json")) as f:
        return json.load(f)["layouts"]


def debug_offset_shapes() -> dict[str, dict[str, list[int]]]:
    """The recorded ``_Py_DebugOffsets`` shapes of the default builds, by table key (``"3.13"``)."""
    return {k: r["debug_offsets_struct"] for k, r in load_table().items()
            if "debug_offsets_struct" in r and not _flags(k)}


def _flags(key: str) -> str:
    """The ABI flags of a table key: ``"3.14t"`` -> ``"t"``."""
    return key.lstrip("0123456789.")


def _order(key: str) -> tuple[int, int]:
    major, minor = key.rstrip("td").split(".")
    return int(major), int(minor)


def _copied(value):
    """A copy of a JSON value, dicts and lists copied all the way down (what copy.deepcopy gives for one, without
    its memo and dispatch: a tenth of the cost)."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def apply_debug_offsets(record: dict, debug: DebugOffsets) -> dict:
    """A copy of a table record with every field the debug offsets cover set from them.

    A struct that moved carries its bit-fields with it (str state).
    """
    rec = _copied(record)
    types = rec["types"]
    values = dict(debug.values)
    base = values.get("interpreter_state.gil_runtime_state")
    for name in ("interpreter_state.gil_runtime_state_locked", "interpreter_state.gil_runtime_state_holder"):
        if base is not None and name in values:  # offsets in the interpreter: made relative to the GIL struct
            values[name] -= base
    for name, (tname, path) in _DEBUG_TO_TABLE.items():
        if name not in values:
            continue
        fields = types.setdefault(tname, {"size": 0, "fields": {}})["fields"]
        old = fields.get(path)
        new_off = values[name]
        if old is None:
            fields[path] = {"offset": new_off, "size": 8, "signed": False, "kind": "int"}
            continue
        delta = new_off - old["offset"]
        if not delta:
            continue
        prefix = path + "."
        for p, f in fields.items():
            if p == path or p.startswith(prefix):
                f["offset"] += delta
                if "bit" in f:
                    f["bit"] += delta * 8
    for name, sname in _DEBUG_TO_SIZES.items():
        if values.get(name):
            rec["sizes"][sname] = values[name]
    return rec


@record
class LayoutChoice:
    """The layout chosen for one core, and what it was made of."""

    layout: Layout
    source: LayoutSource
    description: str  # "_Py_DebugOffsets of 3.14.10 over table 3.14 (3.14.10)"


def choose_layout(major: int, minor: int, *, free_threaded: bool = False, debug: DebugOffsets | None = None,
                  refused: str | None = None) -> LayoutChoice:
    """The layout of CPython ``major.minor`` from the core's debug offsets and the table.

    :param debug: the core's parsed ``_Py_DebugOffsets`` (3.13+)
    :param refused: why the core's debug offsets were not trusted, when they were not
    :raises LayoutError: when neither source describes this version and build
    """
    table = load_table()
    want = f"{major}.{minor}" + ("t" if free_threaded else "")
    record = table.get(want)
    build = "free-threaded " if free_threaded else ""
    if debug is not None:
        base_key = want
        if record is None:  # newer than any known: the newest known record of this build gives the rest
            same_build = [k for k in table if _flags(k) == ("t" if free_threaded else "")
                          and _order(k) < (major, minor)]
            if not same_build:
                raise LayoutError(f"no table record for {build}CPython {major}.{minor} or older to complete "
                                  "its debug offsets with")
            base_key = max(same_build, key=_order)
            record = table[base_key]
        layout = Layout(apply_debug_offsets(record, debug))
        from forensics.pyread.locate import format_hexversion

        newer = "" if base_key == want else f"; {major}.{minor} is newer than any known version"
        shape = "" if debug.shape == f"{major}.{minor}" else f", read with the {debug.shape} struct shape"
        return LayoutChoice(layout=layout, source=LayoutSource.DEBUG_OFFSETS,
                            description=f"_Py_DebugOffsets of {format_hexversion(debug.version)}{shape} over "
                                        f"table {base_key} ({record['version']}){newer}")
    if record is None:
        known = ", ".join(sorted(table, key=_order))
        why = f" (its _Py_DebugOffsets were refused: {refused})" if refused else ""
        raise LayoutError(f"{build}CPython {major}.{minor} is not in the layout table ({known}){why}")
    note = f"; the core's _Py_DebugOffsets were refused: {refused}" if refused else ""
    return LayoutChoice(layout=Layout(record), source=LayoutSource.TABLE,
                        description=f"table {want} ({record['version']}){note}")


class Layout:
    """Everything version-dependent, computed once from one layout record (table, debug offsets or DWARF).

    ``family`` names the frame layout: 38 (3.8/3.9), 310, 311, 312, 313 (3.13 and later:
    ``tstate->current_frame``, ``f_executable`` a tagged reference from 3.14).
    :attr:`fields_used` holds every field the walker reads, for comparing two layouts.
    """

    def __init__(self, record: dict) -> None:
        self.record = record
        self.version = record.get("version")  # None for a DWARF record (the core gives the version)
        self.fields_used: dict[str, Field] = {}
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
            raise LayoutError(f"the layout has no {tname}.{path}") from None
        found = Field(f["offset"], f["size"], f["signed"])
        self.fields_used[f"{tname}.{path}"] = found
        return found

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
        self.interp = self.struct(i, ["next", self.interp_head, self.interp_modules, "sysdict"], optional=("id",))
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
        # ``interp``: the back pointer a thread state of the interpreter's list must hold
        self.tstate = self.struct(t, ["next", "thread_id", self.tstate_frame], optional=("native_thread_id", "interp"))
        self.cframe = self.struct("_PyCFrame", ["current_frame"]) if self.family in (311, 312) else None

    def _frames(self) -> None:
        fo = "PyFrameObject"
        if self.family in (38, 310):
            self.frame = self.struct(fo, ["f_back", "f_code", "f_lasti", "f_lineno", "f_trace"])
            return
        self.frameobj = self.struct(fo, ["f_trace", "f_lineno"])
        # a frame of the chain runs Python code when a thread or a generator owns it; the others are
        # the C-stack shims that mark where one _PyEval_EvalFrameDefault call begins (3.12+)
        owners = self.record.get("enums", {}).get("_frameowner", {})
        self.running_owners = frozenset((owners.get("FRAME_OWNED_BY_THREAD", 0),
                                         owners.get("FRAME_OWNED_BY_GENERATOR", 1)))
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
            self.long_tag_off: int | None = self.offset(lo, "long_value.lv_tag")
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


def build_layout(major: int, minor: int, debug: DebugOffsets | None = None, *,
                 free_threaded: bool = False) -> Layout:
    """The layout of CPython ``major.minor`` (see :func:`choose_layout`).

    :raises LayoutError: when the table has no such version or the record is unusable
    """
    return choose_layout(major, minor, free_threaded=free_threaded, debug=debug).layout


def compare_layouts(a: Layout, b: Layout) -> list[str]:
    """Where two layouts of one core disagree, field by field of what the walker reads.

    >>> t = build_layout(3, 12)
    >>> compare_layouts(t, t)
    []
    """
    out = []
    if a.family != b.family:
        out.append(f"frame family {a.family} vs {b.family}")
    for name in sorted(set(a.fields_used) | set(b.fields_used)):
        fa, fb = a.fields_used.get(name), b.fields_used.get(name)
        if fa != fb:
            out.append(f"{name}: {_field_text(fa)} vs {_field_text(fb)}")
    return out


def _field_text(f: Field | None) -> str:
    return "absent" if f is None else f"offset {f[0]} size {f[1]}"
