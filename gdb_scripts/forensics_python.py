"""GDB script: the struct layout of the CPython in gdb's program, read from its DWARF, as one JSON line.

This is the one thing about Python stacks only gdb can do here: read DWARF.  The
walk of the interpreter state itself is ``forensics.pyread`` (one walker, fed by
this layout, by ``_Py_DebugOffsets`` in the core, or by the generated table).

Sourced into gdb 13 (``gdb -nx``), it defines ``forensics-layout``, which prints::

    FORENSICS-LAYOUT-JSON: {"ptr_size": 8, "types": {...}, "sizes": {...}, "enums": {...}, ...}

in the format of one record of ``forensics/pyread/layouts.json`` (whose generator,
``forensics.pyread.gen_layouts``, runs this same command on an interpreter's file),
or ``{"error": "..."}`` when the program has no CPython DWARF.  Types are looked up
from the compilation unit that defines ``_PyRuntime``, so the DWARF of an extension
module that carries a few CPython types of its own is never used instead.
Nothing here reads the inferior's memory except the addresses of a few symbols.
gdb sources every script into one namespace, so each global name here starts with
``LAYOUT_`` / ``_layout_`` (a plain ``MARKER`` would replace forensics_native.py's).
"""

import json

import gdb

LAYOUT_MARKER = "FORENSICS-LAYOUT-JSON: "

#: type name -> field paths (dotted) the walker may use; a field a version lacks is left out
LAYOUT_TYPES = {
    "_PyRuntimeState": ("interpreters.head", "main_thread", "ceval.gil", "gilstate.tstate_current",
                        "debug_offsets"),
    "PyInterpreterState": ("next", "id", "tstate_head", "threads.head", "threads.main", "modules",
                           "imports.modules", "sysdict", "ceval.gil", "_gil"),
    "struct _gil_runtime_state": ("locked", "locked._value", "last_holder", "last_holder._value", "enabled"),
    "PyThreadState": ("next", "interp", "thread_id", "native_thread_id", "frame", "cframe", "current_frame"),
    "_PyCFrame": ("current_frame",),
    "PyFrameObject": ("f_back", "f_code", "f_lasti", "f_lineno", "f_trace"),
    "_PyInterpreterFrame": ("previous", "f_code", "f_executable", "prev_instr", "instr_ptr", "owner",
                            "frame_obj", "is_entry", "tlbc_index", "f_funcobj"),
    "PyCodeObject": ("co_filename", "co_name", "co_qualname", "co_firstlineno", "co_lnotab", "co_linetable",
                     "co_code_adaptive", "co_tlbc"),
    "PyObject": ("ob_refcnt", "ob_type", "ob_tid", "ob_ref_local", "ob_ref_shared"),
    "PyVarObject": ("ob_size",),
    "PyBytesObject": ("ob_sval",),
    "PyASCIIObject": ("length", "state", "state.kind", "state.compact", "state.ascii"),
    "PyUnicodeObject": ("data",),
    "PyLongObject": ("ob_digit", "long_value.lv_tag", "long_value.ob_digit"),
    "PyDictObject": ("ma_keys", "ma_values"),
    "PyDictKeysObject": ("dk_size", "dk_log2_size", "dk_log2_index_bytes", "dk_kind", "dk_nentries", "dk_indices"),
    "PyDictKeyEntry": ("me_key", "me_value"),
    "PyDictUnicodeEntry": ("me_key", "me_value"),
    "PyDictValues": ("values", "valid", "embedded", "capacity"),
    "PyTypeObject": ("tp_flags", "tp_dictoffset", "tp_basicsize"),
    "PyHeapTypeObject": ("ht_cached_keys",),
    "PyModuleObject": ("md_dict",),
}
#: structs whose sizeof the walker needs
LAYOUT_SIZES = ("PyASCIIObject", "PyCompactUnicodeObject", "PyDictKeyEntry", "PyDictUnicodeEntry", "PyObject",
         "struct _Py_DebugOffsets")
#: enums whose constants the walker needs (the DWARF carries them; the headers change them)
LAYOUT_ENUMS = ("_frameowner",)
#: global symbols whose addresses the walker can use when the object's .dynsym lacks them
LAYOUT_SYMBOLS = ("_PyRuntime", "Py_Version", "PyCode_Type", "PyUnicode_Type", "PyBytes_Type", "PyLong_Type",
           "PyDict_Type")

_LAYOUT_KINDS = {gdb.TYPE_CODE_PTR: "ptr", gdb.TYPE_CODE_STRUCT: "struct", gdb.TYPE_CODE_UNION: "union",
          gdb.TYPE_CODE_ARRAY: "array"}


def _layout_scope():
    """(static block, objfile name) of the compilation unit defining ``_PyRuntime``; (None, None)
    without its DWARF.

    The definition only: an extension module's DWARF declares ``_PyRuntime`` too, and its compilation
    unit carries only the CPython types its headers showed it.  gdb marks both as unresolved (the
    address comes from the ELF symbol), so the object is the one whose ELF symbol the address is.
    """
    try:
        addr = int(gdb.parse_and_eval("(unsigned long)&'_PyRuntime'"))
        where = gdb.execute(f"info symbol 0x{addr:x}", to_string=True).strip()
    except (gdb.error, RuntimeError):
        return None, None
    path = where.rsplit(" of ", 1)[1].strip() if " of " in where else gdb.current_progspace().filename
    for objfile in gdb.objfiles():
        owner = objfile.owner or objfile
        if path not in (objfile.filename, owner.filename):
            continue
        try:
            sym = objfile.lookup_global_symbol("_PyRuntime") or objfile.lookup_static_symbol("_PyRuntime")
        except (gdb.error, RuntimeError):
            continue
        if sym is not None and sym.symtab is not None:
            return sym.symtab.static_block(), owner.filename
    return None, None


def _layout_find(name, block):
    names = (name,) if name.startswith(("struct ", "enum ")) else (name, "struct " + name)
    for n in names:
        try:
            return gdb.lookup_type(n, block).strip_typedefs()
        except (gdb.error, RuntimeError):
            pass
    return None


def _layout_field(t, path):
    """The record of the dotted field ``path`` of ``t``, or None when a part is missing."""
    cur, bits, bitsize = t, 0, 0
    for part in path.split("."):
        if cur.code not in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION):
            return None
        for f in cur.fields():
            if f.name == part:
                bits += f.bitpos
                bitsize = f.bitsize
                cur = f.type.strip_typedefs()
                break
        else:
            return None
    kind = _LAYOUT_KINDS.get(cur.code, "int")
    entry = {"offset": bits // 8, "size": cur.sizeof, "kind": kind,
             "signed": bool(getattr(cur, "is_signed", False)) if kind == "int" else False}
    if bitsize:
        entry["bit"], entry["bits"] = bits, bitsize
    if cur.code == gdb.TYPE_CODE_PTR:
        target = cur.target()
        entry["target_size"] = 0 if target.code == gdb.TYPE_CODE_VOID else target.strip_typedefs().sizeof
    elif cur.code == gdb.TYPE_CODE_ARRAY:
        entry["target_size"] = cur.target().strip_typedefs().sizeof
    return entry


def _layout_flatten(t, prefix, base, out):
    """Every scalar of a struct of structs (``_Py_DebugOffsets``) as ``{dotted name: [offset, size]}``."""
    for f in t.fields():
        ft = f.type.strip_typedefs()
        if ft.code == gdb.TYPE_CODE_STRUCT:
            _layout_flatten(ft, prefix + f.name + ".", base + f.bitpos // 8, out)
        else:
            out[prefix + f.name] = [base + f.bitpos // 8, ft.sizeof]
    return out


def _layout_address(name):
    try:
        sym = gdb.lookup_global_symbol(name) or gdb.lookup_static_symbol(name)
        if sym is not None:
            return int(sym.value().address)
    except (gdb.error, RuntimeError):
        pass
    try:  # a minimal (ELF) symbol
        return int(gdb.parse_and_eval(f"(unsigned long)&'{name}'"))
    except (gdb.error, RuntimeError):
        return None


def forensics_layout_record():
    """The layout of the program's CPython, from its DWARF."""
    block, objfile = _layout_scope()
    if block is None:
        return {"error": "no DWARF for _PyRuntime (CPython's debug information is not loaded)"}
    out = {"ptr_size": gdb.lookup_type("void").pointer().sizeof, "types": {}, "sizes": {}, "enums": {},
           "objfile": objfile}
    for tname, paths in LAYOUT_TYPES.items():
        t = _layout_find(tname, block)
        if t is None:
            continue
        fields = {}
        for path in paths:
            entry = _layout_field(t, path)
            if entry is not None:
                fields[path] = entry
        out["types"][tname] = {"size": t.sizeof, "fields": fields}
    for tname in LAYOUT_SIZES:
        t = _layout_find(tname, block)
        if t is not None:
            out["sizes"][tname] = t.sizeof
    for ename in LAYOUT_ENUMS:
        t = _layout_find("enum " + ename, block)
        if t is not None and t.code == gdb.TYPE_CODE_ENUM:
            out["enums"][ename] = {f.name: f.enumval for f in t.fields()}
    debug = _layout_find("struct _Py_DebugOffsets", block)
    if debug is not None:
        out["debug_offsets_struct"] = _layout_flatten(debug, "", 0, {})
    if "PyThreadState" not in out["types"] or "PyCodeObject" not in out["types"]:
        return {"error": "the DWARF that defines _PyRuntime has no PyThreadState or PyCodeObject"}
    out["symbols"] = {name: _layout_address(name) for name in LAYOUT_SYMBOLS}
    return out


class ForensicsLayout(gdb.Command):
    """Print the CPython layout of the program as one FORENSICS-LAYOUT-JSON line."""

    def __init__(self):
        super().__init__("forensics-layout", gdb.COMMAND_DATA)

    def invoke(self, argument, from_tty):
        try:
            record = forensics_layout_record()
        except Exception as exc:  # noqa: BLE001 - never let a traceback replace the JSON line: the error is its value
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            record = {"error": f"{type(exc).__name__}: {first_line}"}
        gdb.write(LAYOUT_MARKER + json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")
        gdb.flush()


ForensicsLayout()
gdb.write("FORENSICS: python script loaded\n")
