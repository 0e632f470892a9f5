"""Python-level stacks of every thread of a CPython core, as one JSON line.

Sourced into gdb 13 (``gdb -nx -batch -ex 'source forensics_python.py'
-ex forensics-python PYTHON CORE``).  The command ``forensics-python`` walks
the CPython interpreter state of the inferior (a core file: nothing is ever
called in it) using CPython's DWARF debug information, and prints exactly one
line::

    FORENSICS-PYTHON-JSON: {"python_version": ..., "status": ..., ...}

Supported: CPython 3.8 to 3.13.  The version-specific layout ("family") is
chosen from the debug information itself (which fields exist), never from
file names:

- 38:  tstate->frame / f_back; co_lnotab, f_lasti in bytes (3.8, 3.9)
- 310: tstate->frame / f_back; co_linetable pairs, f_lasti in code units
- 311: tstate->cframe->current_frame / previous; location table from
  prev_instr; ``is_entry`` flag on the frame
- 312: as 311, but a frame is an entry when the next one is a C-stack shim
- 313: tstate->current_frame / previous; location table from instr_ptr;
  f_executable checked to be a code object

Thread names come from ``threading._active`` (via sys.modules), native ids
from ``tstate->native_thread_id`` (3.11+) or, for 3.8-3.10, from gdb's
thread handles / ``Thread._native_id`` / the pthread struct.

All object reads go through ``Inferior.read_memory`` with offsets taken once
from the DWARF types, which is much faster than ``gdb.Value`` arithmetic and
lets every read be bounded and validated (the heap of a crashed process may
be corrupt).  Reading errors are recorded per thread and the walk carries on.
"""

import json
import struct

import gdb

JSON_PREFIX = "FORENSICS-PYTHON-JSON: "
COMMAND_NAME = "forensics-python"

MAX_INTERPRETERS = 64
MAX_THREADS = 4096
MAX_FRAMES = 4096
MAX_STR_CHARS = 4096
MAX_LINETABLE_BYTES = 1 << 20
MAX_DICT_ENTRIES = 1 << 16
MAX_LONG_DIGITS = 8

# Constants of CPython that the DWARF does not always carry (enums/macros).
FRAME_OWNED_BY_THREAD = 0
FRAME_OWNED_BY_GENERATOR = 1
FRAME_OWNED_BY_CSTACK = 3
DICT_KEYS_GENERAL = 0
TPFLAGS_INLINE_VALUES = 1 << 2  # 3.13
TPFLAGS_MANAGED_DICT = 1 << 4  # 3.11+

_READ_ERRORS = (gdb.error, struct.error, ValueError, OverflowError)


class NoPythonSymbols(Exception):
    """The CPython types are missing from the debug information."""


class BadObject(Exception):
    """A structure was readable but is not what it should be."""


_READ_FAILURES = _READ_ERRORS + (BadObject,)


def _describe(exc):
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------
# DWARF type helpers
# ---------------------------------------------------------------------------

def _lookup_type(name):
    """The typedef-stripped gdb.Type called ``name``, or None."""
    try:
        return gdb.lookup_type(name).strip_typedefs()
    except gdb.error:
        return None


def _has_field(gtype, name):
    if gtype is None:
        return False
    gtype = gtype.strip_typedefs()
    if gtype.code not in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION):
        return False
    return any(f.name == name for f in gtype.fields())


def _offset(gtype, path):
    """(byte offset, stripped type) of the dotted field ``path`` in ``gtype``."""
    if gtype is None:
        # A type can be missing while others are present: extension modules built against
        # CPython's headers carry some of its types in their own DWARF (PyObject, ...).
        raise NoPythonSymbols("no debug type for the field %r" % path)
    off = 0
    cur = gtype.strip_typedefs()
    for name in path.split("."):
        for field in cur.fields():
            if field.name == name:
                off += field.bitpos // 8
                cur = field.type.strip_typedefs()
                break
        else:
            raise NoPythonSymbols("type %s has no field %r" % (cur, name))
    return off, cur


def _global_address(name, slow_fallback=False):
    """Address of a global data symbol, or None.

    ``slow_fallback`` also asks the expression evaluator (which sees minimal
    symbols too); it costs tens of milliseconds when the symbol is missing.
    """
    try:
        sym = gdb.lookup_global_symbol(name)
        if sym is not None:
            return int(sym.value().address)
    except gdb.error:
        pass
    if slow_fallback:
        try:
            return int(gdb.parse_and_eval("(unsigned long)&'%s'" % name))
        except gdb.error:
            pass
    return None


# ---------------------------------------------------------------------------
# Raw memory access
# ---------------------------------------------------------------------------

class Memory:
    """Bounded raw reads from the inferior, with cheap integer decoding."""

    def __init__(self, ptr_size, little_endian):
        self._read = gdb.selected_inferior().read_memory
        self.ptr_size = ptr_size
        end = "<" if little_endian else ">"
        self._fmt = {
            (1, False): struct.Struct(end + "B"), (1, True): struct.Struct(end + "b"),
            (2, False): struct.Struct(end + "H"), (2, True): struct.Struct(end + "h"),
            (4, False): struct.Struct(end + "I"), (4, True): struct.Struct(end + "i"),
            (8, False): struct.Struct(end + "Q"), (8, True): struct.Struct(end + "q"),
        }
        self._ptr = self._fmt[(ptr_size, False)]

    def read(self, addr, size):
        if not addr:
            raise BadObject("NULL pointer")
        if size <= 0:
            return b""
        return self._read(addr, size).tobytes()

    def uint(self, buf, off, size, signed=False):
        return self._fmt[(size, signed)].unpack_from(buf, off)[0]

    def ptr_at(self, buf, off):
        return self._ptr.unpack_from(buf, off)[0]

    def ptr(self, addr):
        return self._ptr.unpack_from(self.read(addr, self.ptr_size), 0)[0]

    def ptr_array(self, addr, count):
        if count <= 0:
            return []
        buf = self.read(addr, count * self.ptr_size)
        fmt = self._ptr.format[0] + "%d%s" % (count, self._ptr.format[1])
        return list(struct.unpack(fmt, buf))


class Record:
    """A set of scalar fields of one struct, read with a single memory read."""

    def __init__(self, mem, gtype, paths, optional=()):
        self._mem = mem
        items = []
        for path in tuple(paths) + tuple(optional):
            try:
                off, ftype = _offset(gtype, path)
            except NoPythonSymbols:
                if path in optional:
                    continue
                raise
            signed = False
            if ftype.code in (gdb.TYPE_CODE_INT, gdb.TYPE_CODE_CHAR, gdb.TYPE_CODE_ENUM):
                signed = bool(getattr(ftype, "is_signed", False))
            size = ftype.sizeof
            if size not in (1, 2, 4, 8):
                raise NoPythonSymbols("field %s of %s is not a scalar" % (path, gtype))
            items.append((path, off, size, signed))
        self.start = min(i[1] for i in items)
        self.size = max(i[1] + i[2] for i in items) - self.start
        self._items = [(p, o - self.start, s, sg) for p, o, s, sg in items]
        self.names = frozenset(i[0] for i in items)

    def read(self, addr):
        buf = self._mem.read(addr + self.start, self.size)
        uint = self._mem.uint
        return {p: uint(buf, o, s, sg) for p, o, s, sg in self._items}


# ---------------------------------------------------------------------------
# Line tables
# ---------------------------------------------------------------------------

def _load_linetable():
    """forensics.pyread.linetable, loaded by path: one decoder of each version's line table
    serves both the gdb walker and the direct reader (checkout: ../forensics/pyread; wheel:
    ../pyread, as gdb_scripts is installed inside the forensics package)."""
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "..", "forensics", "pyread", "linetable.py"),
                      os.path.join(here, "..", "pyread", "linetable.py")):
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("forensics_linetable", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError("forensics/pyread/linetable.py not found beside " + here)


_linetable = _load_linetable()
line_from_lnotab = _linetable.line_from_lnotab
line_from_linetable_310 = _linetable.line_from_linetable_310
line_from_locations = _linetable.line_from_locations


# ---------------------------------------------------------------------------
# Layout: offsets and the version family, from the debug info
# ---------------------------------------------------------------------------

class Layout:
    """Everything version-dependent, computed once from the DWARF types."""

    def __init__(self):
        runtime_t = _lookup_type("_PyRuntimeState")
        interp_t = _lookup_type("PyInterpreterState")
        tstate_t = _lookup_type("PyThreadState")
        code_t = _lookup_type("PyCodeObject")
        if runtime_t is None or interp_t is None or tstate_t is None or code_t is None:
            raise NoPythonSymbols("CPython types (_PyRuntimeState, PyThreadState) "
                                  "are not in the debug info")
        self.runtime_addr = _global_address("_PyRuntime", slow_fallback=True)
        if not self.runtime_addr:
            raise NoPythonSymbols("symbol _PyRuntime not found")

        void_p = gdb.lookup_type("void").pointer()
        self.ptr_size = void_p.sizeof
        endian = gdb.execute("show endian", to_string=True)
        self.mem = Memory(self.ptr_size, "big endian" not in endian)
        mem = self.mem

        self.family = self._detect_family(tstate_t, code_t)
        self.runtime = Record(mem, runtime_t, ["interpreters.head"])
        self.runtime_main = (Record(mem, runtime_t, ["main_thread"])
                             if _has_field(runtime_t, "main_thread") else None)
        self._init_interp(interp_t, runtime_t)
        self._init_tstate(tstate_t)
        self._init_frames(tstate_t)
        self._init_code(code_t)
        self._init_objects()

    # -- detection ----------------------------------------------------------

    @staticmethod
    def _interpreter_frame_type(tstate_t):
        """_PyInterpreterFrame, reached through the thread state's own fields
        (faster than a by-name lookup, and immune to typedef spelling)."""
        if _has_field(tstate_t, "current_frame"):  # 3.13
            return _offset(tstate_t, "current_frame")[1].target().strip_typedefs()
        if _has_field(tstate_t, "cframe"):  # 3.11/3.12 (3.10 has a cframe too)
            cframe_t = _offset(tstate_t, "cframe")[1].target().strip_typedefs()
            if _has_field(cframe_t, "current_frame"):
                return _offset(cframe_t, "current_frame")[1].target().strip_typedefs()
        return None

    @classmethod
    def _detect_family(cls, tstate_t, code_t):
        if _has_field(tstate_t, "frame"):
            return 310 if _has_field(code_t, "co_linetable") else 38
        iframe_t = cls._interpreter_frame_type(tstate_t)
        if iframe_t is None:
            raise NoPythonSymbols("_PyInterpreterFrame is not in the debug info")
        if _has_field(iframe_t, "f_executable"):
            return 313
        if _has_field(iframe_t, "is_entry"):
            return 311
        return 312

    # -- interpreter / thread state ----------------------------------------

    def _init_interp(self, interp_t, runtime_t):
        mem = self.mem
        head = "tstate_head" if _has_field(interp_t, "tstate_head") else "threads.head"
        modules = "modules" if _has_field(interp_t, "modules") else "imports.modules"
        self.interp = Record(mem, interp_t, ["next", head, modules, "sysdict"])
        self.interp_head, self.interp_modules = head, modules
        # GIL: embedded in _PyRuntime (3.8-3.11) or interp->ceval.gil (3.12+).
        self.gil_in_runtime = None
        self.gil_interp_ptr_off = None
        self.gil_interp_embedded_off = None
        gil_t = None
        ceval_t = _offset(interp_t, "ceval")[1] if _has_field(interp_t, "ceval") else None
        if ceval_t is not None and _has_field(ceval_t, "gil"):
            off, gtype = _offset(interp_t, "ceval.gil")
            if gtype.code == gdb.TYPE_CODE_PTR:
                self.gil_interp_ptr_off = off
                gil_t = gtype.target().strip_typedefs()
            else:  # embedded (3.9/3.10 isolated-subinterpreter builds)
                self.gil_interp_embedded_off = off
                gil_t = gtype
        if gil_t is None and _has_field(_offset(runtime_t, "ceval")[1], "gil"):
            off, gil_t = _offset(runtime_t, "ceval.gil")
            self.gil_in_runtime = self.runtime_addr + off
        self.gil = None
        if gil_t is not None:
            # 3.8-3.12 wrap both in _Py_atomic_* structs; 3.13 uses plain fields.
            def scalar(name):
                inner = _offset(gil_t, name)[1]
                return name + "._value" if _has_field(inner, "_value") else name

            locked, holder = scalar("locked"), scalar("last_holder")
            self.gil = Record(mem, gil_t, [locked, holder])
            self.gil_locked, self.gil_holder = locked, holder

    def _init_tstate(self, tstate_t):
        if self.family in (38, 310):
            frame = "frame"
        elif self.family == 313:
            frame = "current_frame"
        else:
            frame = "cframe"
        self.tstate_frame = frame
        self.tstate = Record(self.mem, tstate_t, ["next", "thread_id", frame],
                             optional=["native_thread_id"])
        if self.family in (311, 312):
            cframe_t = _offset(tstate_t, "cframe")[1].target()
            self.cframe = Record(self.mem, cframe_t, ["current_frame"])

    def _init_frames(self, tstate_t):
        mem = self.mem
        fo_t = _lookup_type("PyFrameObject")
        if self.family in (38, 310):
            self.frame = Record(mem, fo_t, ["f_back", "f_code", "f_lasti", "f_lineno", "f_trace"])
            return
        self.frameobj = Record(mem, fo_t, ["f_trace", "f_lineno"])
        iframe_t = self._interpreter_frame_type(tstate_t)
        code = "f_executable" if self.family == 313 else "f_code"
        instr = "instr_ptr" if self.family == 313 else "prev_instr"
        self.iframe_code, self.iframe_instr = code, instr
        self.iframe = Record(mem, iframe_t, ["previous", code, instr, "owner", "frame_obj"],
                             optional=["is_entry"])

    def _init_code(self, code_t):
        mem = self.mem
        name = "co_qualname" if _has_field(code_t, "co_qualname") else "co_name"
        table = "co_lnotab" if self.family == 38 else "co_linetable"
        self.code_name, self.code_table = name, table
        # ob_base is PyObject (3.8-3.10) or PyVarObject (3.11+)
        if _has_field(_offset(code_t, "ob_base")[1], "ob_type"):
            self.code_type_path = "ob_base.ob_type"
        else:
            self.code_type_path = "ob_base.ob_base.ob_type"
        self.code = Record(mem, code_t, [self.code_type_path, name, "co_filename",
                                         "co_firstlineno", table])
        self.code_units_off = (_offset(code_t, "co_code_adaptive")[0]
                               if _has_field(code_t, "co_code_adaptive") else None)

    def _init_objects(self):
        mem = self.mem
        obj_t = _lookup_type("PyObject")
        var_t = _lookup_type("PyVarObject")
        self.ob_type_off = _offset(obj_t, "ob_type")[0]
        self.ob_size_off = _offset(var_t, "ob_size")[0]
        self.free_threaded = _has_field(obj_t, "ob_tid")
        self.type_addr = {n: _global_address(n) for n in
                          ("PyCode_Type", "PyUnicode_Type", "PyBytes_Type", "PyLong_Type",
                           "PyDict_Type", "PyModule_Type")}
        # bytes
        bytes_t = _lookup_type("PyBytesObject")
        self.bytes_sval_off = _offset(bytes_t, "ob_sval")[0]
        # str
        ascii_t = _lookup_type("PyASCIIObject")
        compact_t = _lookup_type("PyCompactUnicodeObject")
        uni_t = _lookup_type("PyUnicodeObject")
        self.ascii_size = ascii_t.sizeof
        self.compact_size = compact_t.sizeof
        self.uni_length_off = _offset(ascii_t, "length")[0]
        state_off, state_t = _offset(ascii_t, "state")
        bits = {}
        for f in state_t.fields():
            bits[f.name] = (state_off * 8 + f.bitpos, f.bitsize or f.type.sizeof * 8)
        self.uni_state_bits = bits
        self.uni_data_off = _offset(uni_t, "data")[0]
        # int
        long_t = _lookup_type("PyLongObject")
        if _has_field(long_t, "long_value"):
            self.long_tag_off = _offset(long_t, "long_value.lv_tag")[0]
            digit_off, digit_t = _offset(long_t, "long_value.ob_digit")
        else:
            self.long_tag_off = None
            digit_off, digit_t = _offset(long_t, "ob_digit")
        self.long_digit_off = digit_off
        self.long_digit_size = digit_t.target().sizeof
        self.long_digit_bits = 30 if self.long_digit_size == 4 else 15
        # dict
        dict_t = _lookup_type("PyDictObject")
        keys_t = _lookup_type("PyDictKeysObject")
        self.dict = Record(mem, dict_t, ["ma_keys", "ma_values"])
        self.new_dict_keys = _has_field(keys_t, "dk_log2_size")
        if self.new_dict_keys:
            self.keys = Record(mem, keys_t, ["dk_log2_size", "dk_log2_index_bytes",
                                             "dk_kind", "dk_nentries"])
        else:
            self.keys = Record(mem, keys_t, ["dk_size", "dk_nentries"])
        self.keys_indices_off = _offset(keys_t, "dk_indices")[0]
        entry_t = _lookup_type("PyDictKeyEntry")
        self.entry_general = (entry_t.sizeof, _offset(entry_t, "me_key")[0],
                              _offset(entry_t, "me_value")[0])
        uentry_t = _lookup_type("PyDictUnicodeEntry")
        self.entry_unicode = (None if uentry_t is None else
                              (uentry_t.sizeof, _offset(uentry_t, "me_key")[0],
                               _offset(uentry_t, "me_value")[0]))
        values_t = _lookup_type("PyDictValues")
        self.values_off = _offset(values_t, "values")[0] if values_t is not None else 0
        self.values_valid = (_offset(values_t, "valid")[0]
                             if values_t is not None and _has_field(values_t, "valid") else None)
        # type objects / instance dicts
        type_t = _lookup_type("PyTypeObject")
        self.type = Record(mem, type_t, ["tp_flags", "tp_dictoffset", "tp_basicsize"])
        heap_t = _lookup_type("PyHeapTypeObject")
        self.ht_cached_keys_off = _offset(heap_t, "ht_cached_keys")[0]
        self.managed_dict_off = -(1 if self.free_threaded else 3) * self.ptr_size
        module_t = _lookup_type("PyModuleObject")
        self.md_dict_off = (_offset(module_t, "md_dict")[0] if module_t is not None
                            else obj_t.sizeof)


# ---------------------------------------------------------------------------
# Object readers (str, bytes, int, dict, instance __dict__)
# ---------------------------------------------------------------------------

class Objects:
    """Decoding of the few CPython object kinds the walk needs."""

    def __init__(self, layout):
        self.L = layout
        self.mem = layout.mem

    def _check_type(self, addr, hdr, type_name):
        want = self.L.type_addr.get(type_name)
        if want and self.mem.ptr_at(hdr, self.L.ob_type_off) != want:
            raise BadObject("object at 0x%x is not a %s" % (addr, type_name[:-5].lower()))

    def _bits(self, buf, name):
        bit, size = self.L.uni_state_bits[name]
        word = int.from_bytes(buf[bit // 8:(bit + size + 7) // 8 + 1], "little")
        return (word >> (bit % 8)) & ((1 << size) - 1)

    def str_length(self, addr):
        """(header bytes, length) of a str object."""
        L = self.L
        hdr = self.mem.read(addr, L.compact_size)
        self._check_type(addr, hdr, "PyUnicode_Type")
        length = self.mem.uint(hdr, L.uni_length_off, 8, True)
        return hdr, length

    def read_str(self, addr, max_chars=MAX_STR_CHARS, hdr=None, length=None):
        L = self.L
        if hdr is None:
            hdr, length = self.str_length(addr)
        if length < 0:
            raise BadObject("str at 0x%x has a negative length" % addr)
        kind = self._bits(hdr, "kind")
        if kind not in (1, 2, 4):
            raise BadObject("str at 0x%x has kind %d" % (addr, kind))
        if self._bits(hdr, "compact"):
            data = addr + (L.ascii_size if self._bits(hdr, "ascii") else L.compact_size)
        else:
            data = self.mem.ptr(addr + L.uni_data_off)
        count = min(length, max_chars)
        raw = self.mem.read(data, count * kind) if count else b""
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        text = raw.decode(codec, errors="replace")
        return text + ("..." if length > count else "")

    def str_equals(self, addr, expected):
        try:
            hdr, length = self.str_length(addr)
        except BadObject:
            return False
        if length != len(expected):
            return False
        return self.read_str(addr, len(expected), hdr, length) == expected

    def read_bytes(self, addr, max_bytes):
        L = self.L
        hdr = self.mem.read(addr, L.bytes_sval_off)
        self._check_type(addr, hdr, "PyBytes_Type")
        size = self.mem.uint(hdr, L.ob_size_off, 8, True)
        if size < 0 or size > max_bytes:
            raise BadObject("bytes at 0x%x has size %d" % (addr, size))
        return self.mem.read(addr + L.bytes_sval_off, size) if size else b""

    def read_int(self, addr):
        L = self.L
        hdr = self.mem.read(addr, L.long_digit_off)
        self._check_type(addr, hdr, "PyLong_Type")
        if L.long_tag_off is not None:  # 3.12+: lv_tag = ndigits << 3 | sign
            tag = self.mem.uint(hdr, L.long_tag_off, 8)
            ndigits, sign = tag >> 3, 1 - (tag & 3)
        else:
            size = self.mem.uint(hdr, L.ob_size_off, 8, True)
            ndigits, sign = abs(size), (size > 0) - (size < 0)
        if ndigits > MAX_LONG_DIGITS:
            raise BadObject("int at 0x%x has %d digits" % (addr, ndigits))
        if not ndigits:
            return 0
        raw = self.mem.read(addr + L.long_digit_off, ndigits * L.long_digit_size)
        value = 0
        for i in reversed(range(ndigits)):
            value = (value << L.long_digit_bits) | self.mem.uint(raw, i * L.long_digit_size,
                                                                 L.long_digit_size)
        return sign * value

    # -- dicts ---------------------------------------------------------------

    def keys_items(self, keys_addr, values_addr=0):
        """(key, value) pointers of a keys table; values from a split array."""
        L, mem = self.L, self.mem
        k = L.keys.read(keys_addr)
        nentries = k["dk_nentries"]
        if L.new_dict_keys:
            if k["dk_log2_size"] > 30 or k["dk_log2_index_bytes"] > 34:
                raise BadObject("dict keys at 0x%x look corrupt" % keys_addr)
            entries = keys_addr + L.keys_indices_off + (1 << k["dk_log2_index_bytes"])
            if k["dk_kind"] == DICT_KEYS_GENERAL or L.entry_unicode is None:
                esize, key_off, value_off = L.entry_general
            else:
                esize, key_off, value_off = L.entry_unicode
            capacity = 1 << k["dk_log2_size"]
        else:
            size = k["dk_size"]
            if size <= 0 or size > (1 << 30):
                raise BadObject("dict keys at 0x%x look corrupt" % keys_addr)
            ixsize = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
            entries = keys_addr + L.keys_indices_off + size * ixsize
            esize, key_off, value_off = L.entry_general
            capacity = size
        if nentries < 0 or nentries > capacity:
            raise BadObject("dict keys at 0x%x: %d entries for size %d"
                            % (keys_addr, nentries, capacity))
        nentries = min(nentries, MAX_DICT_ENTRIES)
        if not nentries:
            return []
        buf = mem.read(entries, nentries * esize)
        split = mem.ptr_array(values_addr, nentries) if values_addr else None
        out = []
        for i in range(nentries):
            key = mem.ptr_at(buf, i * esize + key_off)
            value = split[i] if split is not None else mem.ptr_at(buf, i * esize + value_off)
            if key and value:
                out.append((key, value))
        return out

    def dict_items(self, addr):
        hdr = self.mem.read(addr, self.L.ob_type_off + self.mem.ptr_size)
        self._check_type(addr, hdr, "PyDict_Type")
        d = self.L.dict.read(addr)
        values = d["ma_values"]
        if values:
            values += self.L.values_off
        return self.keys_items(d["ma_keys"], values)

    @staticmethod
    def lookup(items, is_key):
        for key, value in items:
            if is_key(key):
                return value
        return None

    def dict_get_str(self, addr, name):
        return self.lookup(self.dict_items(addr), lambda k: self.str_equals(k, name))

    def instance_dict_items(self, obj):
        """(key, value) pointers of an instance's attributes, any layout."""
        L, mem = self.L, self.mem
        tp = mem.ptr(obj + L.ob_type_off)
        t = L.type.read(tp)
        flags = t["tp_flags"]
        if L.family >= 311 and flags & TPFLAGS_MANAGED_DICT:
            cached_keys = lambda: mem.ptr(tp + L.ht_cached_keys_off)  # noqa: E731
            if L.family == 311:  # dict at obj-3 words, values at obj-4 words
                dict_addr = mem.ptr(obj - 3 * L.ptr_size)
                if dict_addr:
                    return self.dict_items(dict_addr)
                values = mem.ptr(obj - 4 * L.ptr_size)
                return self.keys_items(cached_keys(), values + L.values_off) if values else []
            if L.family == 312:  # tagged dict-or-values at obj-3 words
                dorv = mem.ptr(obj - 3 * L.ptr_size)
                if dorv & 1:
                    return self.keys_items(cached_keys(), dorv + 1 + L.values_off)
                return self.dict_items(dorv) if dorv else []
            dict_addr = mem.ptr(obj + L.managed_dict_off)  # 3.13
            if dict_addr:
                return self.dict_items(dict_addr)
            if flags & TPFLAGS_INLINE_VALUES:
                values = obj + t["tp_basicsize"]
                if L.values_valid is not None and not mem.read(values + L.values_valid, 1)[0]:
                    return []
                return self.keys_items(cached_keys(), values + L.values_off)
            return []
        off = t["tp_dictoffset"]
        if off <= 0:
            return []  # no dict, or a var-sized object (not the case for Thread)
        dict_addr = mem.ptr(obj + off)
        return self.dict_items(dict_addr) if dict_addr else []


# ---------------------------------------------------------------------------
# Code objects
# ---------------------------------------------------------------------------

class CodeCache:
    """Name, file and line table of code objects, read once per address."""

    def __init__(self, layout, objects):
        self.L = layout
        self.O = objects
        self._cache = {}

    def is_code(self, addr):
        want = self.L.type_addr.get("PyCode_Type")
        try:
            return bool(addr) and (not want or self.L.mem.ptr(addr + self.L.ob_type_off) == want)
        except _READ_ERRORS:
            return False

    def get(self, addr):
        info = self._cache.get(addr)
        if info is None:
            info = self._cache[addr] = self._read(addr)
        return info

    def _read(self, addr):
        """Fields of one code object; a bad field degrades only that field."""
        L = self.L
        c = L.code.read(addr)
        want = L.type_addr.get("PyCode_Type")
        if want and c[L.code_type_path] != want:
            raise BadObject("0x%x is not a code object" % addr)
        info = {"name": "<unknown>", "file": "<unknown>", "first": c["co_firstlineno"],
                "table": None, "lines": {}, "error": None,
                "units": addr + L.code_units_off if L.code_units_off is not None else None}
        for key, field, reader in (
                ("name", L.code_name, self.O.read_str),
                ("file", "co_filename", self.O.read_str),
                ("table", L.code_table,
                 lambda a: self.O.read_bytes(a, MAX_LINETABLE_BYTES))):
            try:
                info[key] = reader(c[field])
            except _READ_FAILURES as exc:
                info["error"] = info["error"] or "code 0x%x %s: %s" % (addr, field,
                                                                      _describe(exc))
        return info

    def line(self, info, lasti):
        """Line of instruction ``lasti`` (bytes for 3.8/3.9, code units after)."""
        if lasti < 0:
            return info["first"]
        if info["table"] is None:
            return None
        lines = info["lines"]
        if lasti not in lines:
            fam = self.L.family
            if fam == 38:
                line = line_from_lnotab(info["table"], info["first"], lasti)
            elif fam == 310:
                line = line_from_linetable_310(info["table"], info["first"], lasti * 2)
            else:
                line = line_from_locations(info["table"], info["first"], lasti)
            lines[lasti] = line
        return lines[lasti]


# ---------------------------------------------------------------------------
# Frame walkers, one per frame-layout family
# ---------------------------------------------------------------------------

def _frame_dict(info, line, is_entry):
    return {"function": info["name"], "file": info["file"], "line": line, "is_entry": is_entry}


def _unknown_frame(is_entry):
    return {"function": "<unknown>", "file": "<unknown>", "line": None, "is_entry": is_entry}


def walk_frame_objects(layout, codes, frame_addr):
    """3.8-3.10: PyFrameObject chain; one eval call per frame (all entries)."""
    frames, seen, error = [], set(), None
    while frame_addr:
        if frame_addr in seen:
            error = "frame cycle at 0x%x" % frame_addr
            break
        if len(frames) >= MAX_FRAMES:
            error = "stopped after %d frames" % MAX_FRAMES
            break
        seen.add(frame_addr)
        try:
            f = layout.frame.read(frame_addr)
        except _READ_FAILURES as exc:
            error = "frame 0x%x: %s" % (frame_addr, _describe(exc))
            break
        try:
            info = codes.get(f["f_code"])
            if f["f_trace"] and f["f_lineno"] > 0:
                line = f["f_lineno"]
            else:
                line = codes.line(info, f["f_lasti"])
            frames.append(_frame_dict(info, line, True))
            error = error or info["error"]
        except _READ_FAILURES as exc:
            error = error or "frame 0x%x code: %s" % (frame_addr, _describe(exc))
            frames.append(_unknown_frame(True))
        frame_addr = f["f_back"]
    return frames, error


def _iframe_line(layout, codes, info, raw):
    frame_obj = raw["frame_obj"]
    if frame_obj:
        try:
            fo = layout.frameobj.read(frame_obj)
            if fo["f_trace"] and fo["f_lineno"] > 0:
                return fo["f_lineno"]
        except _READ_FAILURES:
            pass
    instr = raw[layout.iframe_instr]
    if not instr or info["units"] is None:
        return None
    delta = instr - info["units"]
    if delta % 2:
        return None
    return codes.line(info, delta // 2)


def walk_interpreter_frames(layout, codes, frame_addr):
    """3.11-3.13: _PyInterpreterFrame chain (shim frames skipped)."""
    chain, seen, error = [], set(), None
    complete = True
    while frame_addr:
        if frame_addr in seen:
            error, complete = "frame cycle at 0x%x" % frame_addr, False
            break
        if len(chain) >= 2 * MAX_FRAMES:
            error, complete = "stopped after %d frames" % MAX_FRAMES, False
            break
        seen.add(frame_addr)
        try:
            raw = layout.iframe.read(frame_addr)
        except _READ_FAILURES as exc:
            error, complete = "frame 0x%x: %s" % (frame_addr, _describe(exc)), False
            break
        chain.append((frame_addr, raw))
        frame_addr = raw["previous"]

    frames = []
    for idx, (addr, raw) in enumerate(chain):
        owner = raw["owner"]
        if owner not in (FRAME_OWNED_BY_THREAD, FRAME_OWNED_BY_GENERATOR):
            continue  # C-stack shim (3.12+) or a frame that is not executing
        if "is_entry" in raw:  # 3.11
            is_entry = bool(raw["is_entry"])
        elif idx + 1 < len(chain):
            is_entry = chain[idx + 1][1]["owner"] == FRAME_OWNED_BY_CSTACK
        else:
            is_entry = complete
        code = raw[layout.iframe_code]
        if layout.family >= 313:
            code &= ~3  # f_executable may be any object: require a code object
            if not codes.is_code(code):
                continue
        try:
            info = codes.get(code)
            frames.append(_frame_dict(info, _iframe_line(layout, codes, info, raw), is_entry))
            error = error or info["error"]
        except _READ_FAILURES as exc:
            error = error or "frame 0x%x code: %s" % (addr, _describe(exc))
            frames.append(_unknown_frame(is_entry))
        if len(frames) >= MAX_FRAMES:
            error = error or "stopped after %d frames" % MAX_FRAMES
            break
    return frames, error


# ---------------------------------------------------------------------------
# Threads, names, GIL
# ---------------------------------------------------------------------------

class NativeIds:
    """pthread ident -> LWP for 3.8-3.10, whose thread states lack
    ``native_thread_id``.  Sources, best first: gdb's thread handles
    (libthread_db), hints (``Thread._native_id``; the main thread's LWP is
    the process id), then the tid field of the pthread struct (the ident is
    its address), at an offset calibrated on the known pairs and checked
    against the LWPs present in the core."""

    SCAN_BYTES = 0x1000

    def __init__(self, mem):
        self.mem = mem
        self.by_handle, self.core_lwps = {}, set()
        self.hints = {}
        self._offset = False  # not calibrated yet
        try:
            for thread in gdb.selected_inferior().threads():
                self.core_lwps.add(thread.ptid[1])
                try:
                    handle = thread.handle()
                except (gdb.error, AttributeError):
                    continue
                if handle:
                    self.by_handle[int.from_bytes(handle, "little")] = thread.ptid[1]
        except gdb.error:
            pass

    def add_hint(self, ident, lwp):
        if ident and lwp and (not self.core_lwps or lwp in self.core_lwps):
            self.hints.setdefault(ident, lwp)

    def resolve(self, ident):
        lwp = self.by_handle.get(ident) or self.hints.get(ident)
        if lwp or not ident:
            return lwp
        offset = self._calibrate()
        if offset is None:
            return None
        try:
            lwp = self.mem.uint(self.mem.read(ident + offset, 4), 0, 4, True)
        except _READ_FAILURES:
            return None
        return lwp if lwp in self.core_lwps else None

    def _calibrate(self):
        if self._offset is not False:
            return self._offset
        self._offset = None
        candidates = None
        for ident, lwp in list({**self.hints, **self.by_handle}.items())[:8]:
            try:
                raw = self.mem.read(ident, self.SCAN_BYTES)
            except _READ_FAILURES:
                continue
            found = {off for off in range(0, self.SCAN_BYTES, 4)
                     if self.mem.uint(raw, off, 4, True) == lwp}
            candidates = found if candidates is None else candidates & found
        if candidates:
            self._offset = min(candidates)
        return self._offset


def thread_names(layout, objects, modules_addr):
    """threading._active as {ident: (name, native_id)}; {} when unreadable."""
    mod = objects.dict_get_str(modules_addr, "threading")
    if not mod:
        return {}
    md_dict = layout.mem.ptr(mod + layout.md_dict_off)
    active = objects.dict_get_str(md_dict, "_active")
    if not active:
        return {}
    result = {}
    for key, thread in objects.dict_items(active):
        try:
            ident = objects.read_int(key)
            attrs = objects.instance_dict_items(thread)
            name = native = None
            for akey, avalue in attrs:
                if name is None and objects.str_equals(akey, "_name"):
                    name = objects.read_str(avalue)
                elif native is None and objects.str_equals(akey, "_native_id"):
                    try:
                        native = objects.read_int(avalue)
                    except _READ_FAILURES:
                        pass  # None before the thread started
            result[ident] = (name, native)
        except _READ_FAILURES:
            continue
    return result


def read_gil(layout, interp_addr):
    """(locked, last_holder tstate address) or (None, None)."""
    if layout.gil is None:
        return None, None
    if layout.gil_in_runtime:
        base = layout.gil_in_runtime
    elif layout.gil_interp_ptr_off is not None:
        base = layout.mem.ptr(interp_addr + layout.gil_interp_ptr_off)
    else:
        base = interp_addr + layout.gil_interp_embedded_off
    g = layout.gil.read(base)
    return bool(g[layout.gil_locked]), g[layout.gil_holder]


def _version_from_hex(hexv):
    text = "%d.%d.%d" % (hexv >> 24, (hexv >> 16) & 0xFF, (hexv >> 8) & 0xFF)
    level, serial = (hexv >> 4) & 0xF, hexv & 0xF
    if level in (0xA, 0xB, 0xC):
        text += {0xA: "a", 0xB: "b", 0xC: "rc"}[level] + str(serial)
    return text


def _py_version_symbol(slow_fallback=False):
    """Version from the Py_Version constant (3.11+), or None."""
    addr = _global_address("Py_Version", slow_fallback)
    if not addr:
        return None
    try:
        raw = gdb.selected_inferior().read_memory(addr, 4).tobytes()
        big = "big endian" in gdb.execute("show endian", to_string=True)
        return _version_from_hex(int.from_bytes(raw, "big" if big else "little"))
    except _READ_ERRORS:
        return None


def python_version(objects, sysdict):
    """Py_Version (3.11+), else the first word of sys.version."""
    text = _py_version_symbol()
    if text:
        return text
    try:
        version = objects.dict_get_str(sysdict, "version")
        return objects.read_str(version, 64).split()[0] if version else None
    except (_READ_FAILURES + (IndexError,)):
        return None


def _thread_frames(layout, codes, ts):
    if layout.family in (38, 310):
        return walk_frame_objects(layout, codes, ts["frame"])
    if layout.family == 313:
        first = ts["current_frame"]
    else:
        cframe = ts["cframe"]
        first = layout.cframe.read(cframe)["current_frame"] if cframe else 0
    return walk_interpreter_frames(layout, codes, first)


def collect():
    """The whole document (a dict) for the current inferior."""
    doc = {"python_version": None, "status": "ok", "detail": "",
           "gil_holder_native_id": None, "threads": []}
    try:
        layout = Layout()
    except NoPythonSymbols as exc:
        doc["status"] = "no-python-symbols"
        doc["python_version"] = _py_version_symbol(slow_fallback=True)
        if _global_address("_PyRuntime", slow_fallback=True) is None:
            doc["detail"] = ("no CPython runtime (_PyRuntime) found: not a CPython process, "
                             "or its libpython is missing/stripped; Python stacks need "
                             "CPython's debug symbols.")
        else:
            doc["detail"] = ("the Python stack needs CPython's debug symbols (%s): install "
                             "the interpreter's debug symbols (e.g. Debian pythonX.Y-dbg / "
                             "libpythonX.Y-dbg) or use a CPython built with -g."
                             % _describe(exc))
        return doc
    objects = Objects(layout)
    codes = CodeCache(layout, objects)

    head = layout.runtime.read(layout.runtime_addr)["interpreters.head"]
    if not head:
        doc["status"] = "no-interpreter"
        doc["python_version"] = _py_version_symbol()
        doc["detail"] = "_PyRuntime.interpreters.head is NULL: no running CPython interpreter"
        return doc

    classic_ids = None
    if "native_thread_id" not in layout.tstate.names:
        classic_ids = NativeIds(layout.mem)
        try:
            main_ident = layout.runtime_main.read(layout.runtime_addr)["main_thread"]
            classic_ids.add_hint(main_ident, gdb.selected_inferior().pid)
        except (_READ_FAILURES + (AttributeError,)):
            pass
    problems = []
    interp_addr, seen_interps = head, set()
    version_done = False
    while interp_addr and len(seen_interps) < MAX_INTERPRETERS and interp_addr not in seen_interps:
        seen_interps.add(interp_addr)
        try:
            interp = layout.interp.read(interp_addr)
        except _READ_FAILURES as exc:
            problems.append("interpreter 0x%x: %s" % (interp_addr, _describe(exc)))
            break
        if not version_done:
            doc["python_version"] = python_version(objects, interp["sysdict"])
            version_done = True
        try:
            names = thread_names(layout, objects, interp[layout.interp_modules])
        except _READ_FAILURES:
            names = {}
        if classic_ids is not None:
            for ident, (_, native) in names.items():
                classic_ids.add_hint(ident, native)
        try:
            locked, holder = read_gil(layout, interp_addr)
        except _READ_FAILURES:
            locked, holder = None, None

        tstate_addr, seen = interp[layout.interp_head], set()
        while tstate_addr:
            if tstate_addr in seen:
                problems.append("thread-state cycle at 0x%x" % tstate_addr)
                break
            if len(doc["threads"]) >= MAX_THREADS:
                problems.append("stopped after %d threads" % MAX_THREADS)
                break
            seen.add(tstate_addr)
            try:
                ts = layout.tstate.read(tstate_addr)
            except _READ_FAILURES as exc:
                problems.append("thread state 0x%x: %s" % (tstate_addr, _describe(exc)))
                break
            ident = ts["thread_id"]
            name = names.get(ident, (None, None))[0]
            native = ts.get("native_thread_id")
            if native is None and classic_ids is not None:
                native = classic_ids.resolve(ident)
            holds = bool(locked) and holder == tstate_addr
            if holds:
                doc["gil_holder_native_id"] = native
            try:
                frames, error = _thread_frames(layout, codes, ts)
            except _READ_FAILURES as exc:
                frames, error = [], "thread state 0x%x frames: %s" % (tstate_addr, _describe(exc))
            doc["threads"].append({"native_thread_id": native, "thread_id": ident, "name": name,
                                   "holds_gil": holds, "frames": frames, "error": error})
            tstate_addr = ts["next"]
        if locked and holder and doc["gil_holder_native_id"] is None:
            try:  # holder not in the list (e.g. another interpreter's thread)
                ts = layout.tstate.read(holder)
                doc["gil_holder_native_id"] = (
                    ts.get("native_thread_id")
                    or (classic_ids.resolve(ts["thread_id"]) if classic_ids else None))
            except _READ_FAILURES:
                pass
        interp_addr = interp["next"]
    if problems:
        doc["status"] = "error"
        doc["detail"] = "partial result: " + "; ".join(problems)
    return doc


class ForensicsPython(gdb.Command):
    """Print the Python stack of every thread as one FORENSICS-PYTHON-JSON line."""

    def __init__(self):
        super().__init__(COMMAND_NAME, gdb.COMMAND_DATA)

    def invoke(self, argument, from_tty):
        try:
            doc = collect()
        except Exception as exc:  # never let a traceback replace the JSON line
            doc = {"python_version": None, "status": "error",
                   "detail": "%s: %s" % (type(exc).__name__, _describe(exc)),
                   "gil_holder_native_id": None, "threads": []}
        gdb.write(JSON_PREFIX + json.dumps(doc, separators=(",", ":")) + "\n")
        gdb.flush()


ForensicsPython()
gdb.write("FORENSICS: python script loaded\n")
