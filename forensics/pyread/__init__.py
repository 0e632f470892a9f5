"""Python stacks from a core without gdb and without CPython's debug symbols (CPython 3.8-3.13).

:func:`read_python_state` gives the same document as ``gdb_scripts/forensics_python.py``
(``forensics.analyze.stacks.build_threads`` takes either)::

    {"python_version": "3.12.1", "status": "ok", "detail": "", "gil_holder_native_id": 1234,
     "threads": [{"native_thread_id": 1234, "thread_id": 1397..., "name": "MainThread",
                  "holds_gil": True, "frames": [{"function", "file", "line", "is_entry"}, ...],
                  "error": None}]}

How: :mod:`.locate` finds ``_PyRuntime`` through the dynamic symbol table of the
executable or libpython (file matched by build-id, else the ELF image in the
core) and reads the version from the binary; :mod:`.layouts` gives the struct
offsets (the generated ``layouts.json``, or 3.13's own ``_Py_DebugOffsets``);
:mod:`.walk` follows interpreters -> thread states -> frames -> code objects with
every read bounded by the core's segments (:mod:`.objects`).

``status``: ``ok``; ``error`` (a partial result: ``detail`` says where reading
stopped); ``no-interpreter`` (the runtime has no interpreter yet or any more);
``no-python-symbols`` (no ``_PyRuntime``: not a CPython process, or its symbol
table is neither on disk nor in the core; or a version the reader does not know).
A thread whose frame chain breaks keeps the frames read before the break and
names the address in its ``error``; the document is then a partial result too
(``status`` ``error``, ``detail`` naming the thread), never ``ok``.
"""
from __future__ import annotations

from forensics.model import CoreFile

__all__ = ["read_python_state"]

_NOT_CPYTHON = "not a CPython process: no object in the core defines _PyRuntime"


def _empty_doc() -> dict:
    return {"python_version": None, "status": "ok", "detail": "", "gil_holder_native_id": None, "threads": []}


def read_python_state(core: CoreFile, *, sysroot: str | None = None) -> dict:
    """The Python stack of every thread of a CPython core, read without gdb.

    Never raises for what is in the core: a corrupted interpreter state yields a
    partial document (``status`` ``"error"`` or a thread ``error``).

    :param core: the core as :func:`forensics.core.open_core` read it (its
        libraries' files were resolved then, with its sysroot)
    :param sysroot: where to look for an object file the core names that
        ``core`` has no file for
    :return: the document described in the module docstring

    >>> from forensics.core import open_core
    >>> read_python_state(open_core("core"))["threads"][0]["frames"][0]  # doctest: +SKIP
    {'function': 'query_nvlink_throughput_counters', 'file': 'exporter.py', 'line': 31, 'is_entry': True}
    """
    from forensics.core.memory import CoreMemory
    from forensics.errors import ForensicsError

    doc = _empty_doc()
    try:
        with CoreMemory.open(core.path) as mem:
            _read(doc, core, mem, sysroot)
    except ForensicsError as exc:
        doc["status"], doc["detail"] = "error", str(exc)
    except Exception as exc:  # noqa: BLE001 - a corrupted core must give a document, never a traceback
        doc["status"] = "error"
        doc["detail"] = f"reading stopped: {type(exc).__name__}: {exc}"
    return doc


def _read(doc: dict, core: CoreFile, mem, sysroot: str | None) -> None:
    from forensics.pyread.layouts import DEBUG_OFFSETS_313, LayoutError, build_layout, parse_debug_offsets
    from forensics.pyread.locate import TYPE_SYMBOLS, detect_version, find_runtime
    from forensics.pyread.objects import Objects, Reader
    from forensics.pyread.walk import walk_runtime

    binary = find_runtime(core, mem, sysroot=sysroot)
    if binary is None:
        doc["status"] = "no-python-symbols"
        pythonish = any("python" in lib.name for lib in core.libraries)
        doc["detail"] = (
            "no CPython runtime (_PyRuntime) found: the dynamic symbol table of the interpreter is neither "
            "in a file matching the core's build-id nor in the core; pass --sysroot with its files"
            if pythonish else _NOT_CPYTHON
        )
        return
    raw = mem.read_prefix(binary.runtime, 8 + 8 * len(DEBUG_OFFSETS_313))
    debug = parse_debug_offsets(raw)
    version = detect_version(binary, core, mem, debug["version"] if debug else None)
    if version is None:
        doc["status"] = "no-python-symbols"
        doc["detail"] = f"found _PyRuntime in {binary.library.path} but could not read its CPython version"
        return
    doc["python_version"] = version.text
    where = (version.major, version.minor)
    if where != (3, 13):
        debug = None  # other versions' debug offsets have another shape: the table decides
    if debug is not None and debug["free_threaded"]:
        doc["status"] = "no-python-symbols"
        doc["detail"] = f"CPython {version.text} is a free-threaded build, which this reader does not support"
        return
    try:
        layout = build_layout(*where, debug)
    except LayoutError as exc:
        doc["status"] = "no-python-symbols"
        doc["detail"] = f"CPython {version.text} is not supported by the built-in reader: {exc}"
        return
    reader = Reader(mem)
    types = {name: binary.symbol(name) for name in TYPE_SYMBOLS}
    walk_runtime(doc, layout, reader, Objects(layout, reader, types), core, binary.runtime)
