"""Generate ``layouts.json``: CPython 3.8-3.13 struct layouts read from the DWARF of debug builds.

Run it on a machine that has CPython debug builds (pyenv builds keep ``-g``)::

    python -m forensics.pyread.gen_layouts [-o forensics/pyread/layouts.json] [PYTHON ...]

Without arguments it uses every CPython 3.8-3.13 that ``tests/pythons.py`` finds
(pyenv first, then /usr/bin/pythonX.Y).  For each one it runs ``gdb -nx -batch``
on the object that holds the interpreter (libpython when the build is shared,
else the executable) with a small gdb-Python snippet that prints, for every
field :mod:`forensics.pyread` uses, its byte offset, size and signedness (and the
bit position of bit-fields), plus the sizes of a few structs.  The facts are
recorded with where they came from: the exact version, the object's path and
its GNU build-id.  A field a version lacks is simply absent: the reader picks
its code path from which fields exist, as ``gdb_scripts/forensics_python.py``
does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

__all__ = ["TYPES", "SIZES", "generate_layout", "main"]

#: type name (as gdb looks it up) -> field paths (dotted) the reader may use; missing ones are skipped
TYPES: dict[str, tuple[str, ...]] = {
    "_PyRuntimeState": (
        "interpreters.head", "main_thread", "ceval.gil", "gilstate.tstate_current", "debug_offsets",
    ),
    "PyInterpreterState": (
        "next", "tstate_head", "threads.head", "modules", "imports.modules", "sysdict", "ceval.gil",
    ),
    "struct _gil_runtime_state": ("locked", "locked._value", "last_holder", "last_holder._value"),
    "PyThreadState": ("next", "thread_id", "native_thread_id", "frame", "cframe", "current_frame"),
    "_PyCFrame": ("current_frame",),
    "PyFrameObject": ("f_back", "f_code", "f_lasti", "f_lineno", "f_trace"),
    "_PyInterpreterFrame": (
        "previous", "f_code", "f_executable", "prev_instr", "instr_ptr", "owner", "frame_obj", "is_entry",
    ),
    "PyCodeObject": (
        "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_lnotab", "co_linetable",
        "co_code_adaptive",
    ),
    "PyObject": ("ob_refcnt", "ob_type", "ob_tid"),
    "PyVarObject": ("ob_size",),
    "PyBytesObject": ("ob_sval",),
    "PyASCIIObject": ("length", "state", "state.kind", "state.compact", "state.ascii"),
    "PyUnicodeObject": ("data",),
    "PyLongObject": ("ob_digit", "long_value.lv_tag", "long_value.ob_digit"),
    "PyDictObject": ("ma_keys", "ma_values"),
    "PyDictKeysObject": ("dk_size", "dk_log2_size", "dk_log2_index_bytes", "dk_kind", "dk_nentries", "dk_indices"),
    "PyDictKeyEntry": ("me_key", "me_value"),
    "PyDictUnicodeEntry": ("me_key", "me_value"),
    "PyDictValues": ("values", "valid"),
    "PyTypeObject": ("tp_flags", "tp_dictoffset", "tp_basicsize"),
    "PyHeapTypeObject": ("ht_cached_keys",),
    "PyModuleObject": ("md_dict",),
}

#: structs whose sizeof the reader needs
SIZES = (
    "PyASCIIObject", "PyCompactUnicodeObject", "PyDictKeyEntry", "PyDictUnicodeEntry", "PyObject",
    "struct _Py_DebugOffsets",
)

# Runs inside gdb: reads TYPES/SIZES from a JSON file and prints one JSON line.
_GDB_SNIPPET = r'''
import json, gdb
spec = json.load(open(SPEC_PATH))

def find(name):
    for n in (name, "struct " + name) if not name.startswith("struct ") else (name,):
        try:
            return gdb.lookup_type(n).strip_typedefs()
        except gdb.error:
            pass
    return None

def kind(t):
    return {gdb.TYPE_CODE_PTR: "ptr", gdb.TYPE_CODE_STRUCT: "struct", gdb.TYPE_CODE_UNION: "union",
            gdb.TYPE_CODE_ARRAY: "array"}.get(t.code, "int")

out = {"types": {}, "sizes": {}, "ptr_size": gdb.lookup_type("void").pointer().sizeof}
for tname, paths in spec["types"].items():
    t = find(tname)
    if t is None:
        continue
    fields = {}
    for path in paths:
        cur, bits, bitsize, ok = t, 0, 0, True
        for part in path.split("."):
            if cur.code not in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION):
                ok = False
                break
            for f in cur.fields():
                if f.name == part:
                    bits += f.bitpos
                    bitsize = f.bitsize
                    cur = f.type.strip_typedefs()
                    break
            else:
                ok = False
                break
        if not ok:
            continue
        entry = {"offset": bits // 8, "size": cur.sizeof, "kind": kind(cur),
                 "signed": bool(getattr(cur, "is_signed", False)) if kind(cur) == "int" else False}
        if bitsize:
            entry["bit"] = bits
            entry["bits"] = bitsize
        if cur.code == gdb.TYPE_CODE_PTR:
            target = cur.target()
            entry["target_size"] = 0 if target.code == gdb.TYPE_CODE_VOID else target.strip_typedefs().sizeof
        elif cur.code == gdb.TYPE_CODE_ARRAY:
            entry["target_size"] = cur.target().strip_typedefs().sizeof
        fields[path] = entry
    out["types"][tname] = {"size": t.sizeof, "fields": fields}
for tname in spec["sizes"]:
    t = find(tname)
    if t is not None:
        out["sizes"][tname] = t.sizeof
if find("struct _Py_DebugOffsets") is not None:
    def walk(t, pre, base, acc):
        for f in t.fields():
            ft = f.type.strip_typedefs()
            if ft.code == gdb.TYPE_CODE_STRUCT:
                walk(ft, pre + f.name + ".", base + f.bitpos // 8, acc)
            else:
                acc[pre + f.name] = [base + f.bitpos // 8, ft.sizeof]
        return acc
    out["debug_offsets_struct"] = walk(find("struct _Py_DebugOffsets"), "", 0, {})
print("LAYOUT-JSON: " + json.dumps(out))
'''


def _interpreter_object(python: str) -> tuple[str, str]:
    """(exact version, path of the ELF object holding _PyRuntime) of one interpreter."""
    code = (
        "import sys, sysconfig, os\n"
        "v = '%d.%d.%d' % sys.version_info[:3]\n"
        "lib = sysconfig.get_config_var('LDLIBRARY') or ''\n"
        "d = sysconfig.get_config_var('LIBDIR') or ''\n"
        "shared = sysconfig.get_config_var('Py_ENABLE_SHARED')\n"
        "p = os.path.join(d, sysconfig.get_config_var('INSTSONAME') or lib) if shared else sys.executable\n"
        "print(v); print(os.path.realpath(p))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    version, path = out.split("\n")[:2]
    return version, path


def generate_layout(python: str, *, gdb: str = "gdb") -> dict:
    """The layout record of one interpreter, read from its DWARF with gdb.

    :param python: the interpreter's executable
    :raises RuntimeError: when gdb prints no layout (no debug info, gdb missing or failing)
    """
    from forensics.core.buildid import read_build_id_from_file

    version, obj = _interpreter_object(python)
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "spec.json")
        with open(spec, "w") as f:
            json.dump({"types": TYPES, "sizes": SIZES}, f)
        script = os.path.join(tmp, "layout.py")
        with open(script, "w") as f:
            f.write("SPEC_PATH = %r\n" % spec + _GDB_SNIPPET)
        proc = subprocess.run(
            [gdb, "-nx", "-batch", "-ex", f"source {script}", obj],
            capture_output=True, text=True, timeout=300,
        )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("LAYOUT-JSON: ")), None)
    if line is None:
        raise RuntimeError(f"gdb printed no layout for {obj}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    facts = json.loads(line[len("LAYOUT-JSON: "):])
    if "PyThreadState" not in facts["types"] or "PyCodeObject" not in facts["types"]:
        raise RuntimeError(f"{obj} has no CPython debug types (built without -g?)")
    return {"version": version, "source": obj, "build_id": read_build_id_from_file(obj), **facts}


def _default_pythons() -> list[str]:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, here)
    try:
        from tests.pythons import discover_pythons
    except ImportError:  # an installed forensics without its tests: no discovery
        return []
    return list(discover_pythons().values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pythons", nargs="*", help="interpreters (default: every CPython 3.8-3.13 found)")
    parser.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "layouts.json"))
    parser.add_argument("--gdb", default="gdb")
    args = parser.parse_args(argv)
    pythons = args.pythons or _default_pythons()
    if not pythons:
        print("no CPython 3.8-3.13 found; pass interpreters as arguments", file=sys.stderr)
        return 1
    layouts = {}
    if os.path.exists(args.output):  # keep versions this machine lacks
        with open(args.output) as f:
            layouts = json.load(f).get("layouts", {})
    for python in pythons:
        record = generate_layout(python, gdb=args.gdb)
        key = ".".join(record["version"].split(".")[:2])
        layouts[key] = record
        print(f"{key}: {record['version']} from {record['source']} (build-id {record['build_id']})", file=sys.stderr)
    doc = {
        "generator": "python -m forensics.pyread.gen_layouts",
        "note": "struct offsets read from the DWARF of each build named in 'source'; do not edit by hand",
        "layouts": dict(sorted(layouts.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(".")))),
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"Wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
