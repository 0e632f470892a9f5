"""Generate ``layouts.json``: CPython struct layouts read from the DWARF of each build, through gdb.

Run it where CPython builds with debug information are (pyenv builds keep ``-g``;
Debian's ``pythonX.Y-dbg`` carries the DWARF of the release build under
``/usr/lib/debug`` and is itself a debug build)::

    python -m forensics.pyread.gen_layouts [-o forensics/pyread/layouts.json] [PYTHON ...]
    python -m forensics.pyread.gen_layouts --sysroot ROOT /usr/bin/python3.14 /usr/bin/python3.14d

Without arguments it uses every CPython that ``tests/pythons.py`` finds.  With
``--sysroot`` the interpreters are paths inside that root and are never run: the
object defining ``_PyRuntime`` (the executable, or its libpython), its version and
its ABI flags are read from the files, and gdb looks for separate debug files under
``ROOT/usr/lib/debug``.  The DWARF is read by ``gdb_scripts/forensics_python.py``'s
``forensics-layout`` command — the same code that gives ``--method gdb`` its layout.

Each record is keyed by ``MAJOR.MINOR`` plus the ABI flags (``t`` free-threaded,
``d`` debug: ``3.14``, ``3.14d``, ``3.14t``) and says where it came from: the exact
version, the object's path and its GNU build-id.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

__all__ = ["generate_layout", "table_key", "main"]

_MARKER = "FORENSICS-LAYOUT-JSON: "


def table_key(version: str, *, free_threaded: bool, debug: bool) -> str:
    """The table's key of one build.

    >>> table_key("3.14.10", free_threaded=True, debug=True)
    '3.14td'
    """
    major_minor = ".".join(version.split(".")[:2])
    return major_minor + ("t" if free_threaded else "") + ("d" if debug else "")


def _run_interpreter(python: str) -> tuple[str, str, str]:
    """(exact version, sys.abiflags, path of the ELF object holding _PyRuntime) of a runnable interpreter."""
    code = (
        "import sys, sysconfig, os\n"
        "v = '%d.%d.%d' % sys.version_info[:3]\n"
        "lib = sysconfig.get_config_var('LDLIBRARY') or ''\n"
        "d = sysconfig.get_config_var('LIBDIR') or ''\n"
        "shared = sysconfig.get_config_var('Py_ENABLE_SHARED')\n"
        "p = os.path.join(d, sysconfig.get_config_var('INSTSONAME') or lib) if shared else sys.executable\n"
        "print(v); print(getattr(sys, 'abiflags', '')); print(os.path.realpath(p))\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    version, abiflags, path = out.split("\n")[:3]
    return version, abiflags, path


def _inspect_file(python: str, sysroot: str) -> tuple[str, str, str]:
    """(exact version, ABI flags, object path) of an interpreter inside ``sysroot``, from its files alone."""
    from forensics.pyread.locate import describe_runtime_file

    found = describe_runtime_file(python, sysroot)
    if found is None:
        raise RuntimeError(f"{python}: no object defining _PyRuntime (with a readable version) under {sysroot}")
    return found


def generate_layout(python: str, *, sysroot: str | None = None, gdb: str = "gdb") -> dict:
    """The layout record of one interpreter, read from its DWARF with gdb.

    :param python: the interpreter's executable (inside ``sysroot`` when given)
    :param sysroot: a root filesystem holding it; its files are read, never run
    :raises RuntimeError: when gdb prints no layout (no debug info, gdb missing or failing)
    """
    from forensics.core.buildid import read_build_id_from_file
    from forensics.resources import find_shipped

    version, abiflags, obj = _inspect_file(python, sysroot) if sysroot else _run_interpreter(python)
    cmd = [gdb, "-nx", "-batch", "-ex", "set debuginfod enabled off"]
    if sysroot:
        cmd += ["-ex", f"set debug-file-directory {os.path.join(sysroot, 'usr/lib/debug')}"]
    scripts = find_shipped("gdb_scripts", "forensics_python.py")
    if scripts is None:
        raise RuntimeError("gdb_scripts/forensics_python.py is not shipped beside forensics")
    cmd += ["-ex", f"source {scripts / 'forensics_python.py'}", "-ex", f"file {obj}",
            "-ex", "forensics-layout"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(_MARKER)), None)
    if line is None:
        raise RuntimeError(f"gdb printed no layout for {obj}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    facts = json.loads(line[len(_MARKER):])
    if "error" in facts:
        raise RuntimeError(f"{obj}: {facts['error']} (built without -g, or its debug file is missing?)")
    for drop in ("symbols", "objfile"):  # addresses of this file, not of a process
        facts.pop(drop, None)
    source = os.path.relpath(obj, sysroot) if sysroot else obj
    return {"version": version, "abiflags": abiflags, "source": "/" + source.lstrip("/") if sysroot else source,
            "build_id": read_build_id_from_file(obj), **facts}


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
    parser.add_argument("--sysroot", help="a root filesystem the interpreters are in (read, never run)")
    parser.add_argument("--gdb", default="gdb")
    args = parser.parse_args(argv)
    pythons = args.pythons or ([] if args.sysroot else _default_pythons())
    if not pythons:
        print("no CPython found; pass interpreters as arguments", file=sys.stderr)
        return 1
    layouts = {}
    if os.path.exists(args.output):  # keep versions this machine lacks
        with open(args.output) as f:
            layouts = json.load(f).get("layouts", {})
    for python in pythons:
        record = generate_layout(python, sysroot=args.sysroot, gdb=args.gdb)
        key = table_key(record["version"], free_threaded="t" in record["abiflags"], debug="d" in record["abiflags"])
        layouts[key] = record
        print(f"{key}: {record['version']} from {record['source']} (build-id {record['build_id']})", file=sys.stderr)

    def order(kv: tuple[str, dict]) -> tuple:
        major, minor = kv[0].rstrip("td").split(".")
        return int(major), int(minor), kv[0]

    doc = {
        "generator": "python -m forensics.pyread.gen_layouts",
        "note": "struct offsets read from the DWARF of each build named in 'source'; do not edit by hand",
        "layouts": dict(sorted(layouts.items(), key=order)),
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"Wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
