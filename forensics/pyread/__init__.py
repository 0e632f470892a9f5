"""Python stacks of a CPython core: one walker, several sources of layouts (CPython 3.8-3.15).

:func:`read_python_stacks` gives a :class:`~forensics.model.PythonStacks` record for
either method of ``forensics analyze``:

- ``direct`` (no gdb, no debug symbols): the layout comes from the ``_Py_DebugOffsets``
  CPython 3.13+ publishes in the core, over the generated table (:mod:`.layouts`), or
  from the table alone for 3.8-3.12;
- ``gdb``: the layout is the record gdb read from the DWARF of the core's own
  interpreter (``gdb_scripts/forensics_python.py``), passed as ``dwarf``.

Either way :mod:`.locate` finds ``_PyRuntime`` through the dynamic symbol table of the
executable or libpython (file matched by build-id, else the ELF image in the core) and
reads the version from the binary, and :mod:`.walk` follows interpreters -> thread
states -> frames -> code objects with every read bounded by the core's segments
(:mod:`.objects`) and the whole walk bounded by :class:`~.objects.Limits`.

Status (:class:`~forensics.model.PythonStatus`): ``OK``; ``PARTIAL`` (a thread's stack
stopped short, the thread list broke, or a bound cut the walk: ``detail`` says where);
``NO_INTERPRETER``; ``NOT_PYTHON``; ``NO_RUNTIME`` (the symbol table of the interpreter is
neither in a file matching the core nor in the core); ``UNSUPPORTED`` (no layout for this
version or build: the reason says which); ``FAILED`` (nothing read).
"""
from __future__ import annotations

from dataclasses import replace
from forensics.model import CoreFile, DwarfLayout, LayoutSource, PythonStacks, PythonStatus
from forensics.pyread.objects import Limits
from forensics.records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from forensics.pyread.layouts import Layout
    from forensics.pyread.locate import PythonBinary, PythonVersion

__all__ = ["read_python_stacks", "find_interpreter", "Interpreter", "layout_differences", "Limits"]

_NOT_CPYTHON = "not a CPython process: no object in the core defines _PyRuntime"


def read_python_stacks(core: CoreFile, *, sysroot: str | None = None, dwarf: DwarfLayout | None = None,
                       limits: Limits | None = None, mem=None,
                       interpreter: Interpreter | PythonStacks | None = None) -> PythonStacks:
    """The Python stack of every thread of a CPython core.

    Never raises for what is in the core: a corrupted interpreter state yields a
    ``PARTIAL`` record, a walk that reached a bound says so in ``cut``.

    :param core: the core as :func:`forensics.core.open_core` read it (its libraries' files
        were resolved then, with its sysroot)
    :param sysroot: where to look for an object file the core names that ``core`` has no file for
    :param dwarf: gdb's layout from DWARF (:func:`forensics.gdb.parse_layout`; the ``gdb`` method); None
        for the debug offsets and the table (the ``direct`` method)
    :param limits: bounds of the walk (default :class:`Limits`)
    :param mem: the core's memory, open (:class:`~forensics.core.CoreMemory`); None: the core is opened here
    :param interpreter: what :func:`find_interpreter` found in ``mem`` for the direct method (an analysis
        finds it once for all its readers); None: found here.  Not used with ``dwarf``.
    :return: the record

    >>> from forensics.core import open_core
    >>> read_python_stacks(open_core("core")).threads[0].frames[0].function  # doctest: +SKIP
    'query_nvlink_throughput_counters'
    """
    from forensics.core.memory import CoreMemory
    from forensics.errors import ForensicsError

    try:
        if mem is not None:
            return _read(core, mem, sysroot, dwarf, limits or Limits(), interpreter)
        with CoreMemory.open(core.path) as opened:
            return _read(core, opened, sysroot, dwarf, limits or Limits(), interpreter)
    except ForensicsError as exc:
        return PythonStacks(status=PythonStatus.FAILED, detail=str(exc))
    except Exception as exc:  # noqa: BLE001 - a corrupted core must give a result, never a traceback
        return PythonStacks(status=PythonStatus.FAILED, detail=f"reading stopped: {type(exc).__name__}: {exc}")


@record
class Interpreter:
    """The CPython runtime of a core, its version, and the layout the walker reads it with."""

    binary: PythonBinary  # the object defining _PyRuntime, and where _PyRuntime is
    version: PythonVersion
    layout: Layout
    source: LayoutSource
    description: str  # the layout trusted, in words
    free_threaded: bool


def find_interpreter(core: CoreFile, mem, *, sysroot: str | None = None,
                     dwarf: DwarfLayout | None = None) -> Interpreter | PythonStacks:
    """The runtime, the version and the layout to walk with (as :func:`read_python_stacks` sets them
    up, for readers of more than stacks: frame locals); or the record saying why there are none.

    One analysis finds it once (:func:`forensics.analyze.analyze_core`) and hands it to the walker, the
    crashing thread's locals and the heap's owner search, with ``mem``: what it found may read through
    ``mem`` (an interpreter found in the core's memory), valid while ``mem`` is open.

    :param mem: the core's memory (:class:`~forensics.core.CoreMemory`)
    :param dwarf: gdb's layout from DWARF, used instead of the debug offsets and the table
    """
    from forensics.pyread.debug_offsets import DebugOffsetsError, parse_debug_offsets, read_size
    from forensics.pyread.layouts import Layout, LayoutError, choose_layout, debug_offset_shapes
    from forensics.pyread.locate import detect_version, find_runtime

    binary = find_runtime(core, mem, sysroot=sysroot)
    in_memory = None
    if binary is None:
        from forensics.pyread.scan import find_runtime_in_memory

        binary = find_runtime_in_memory(core, mem, page=mem.layout.page_size if mem.layout else 4096)
        in_memory = _files_problem(core) or "no file's symbol table gave it"
    if binary is None:
        # an AArch64 core without NT_FILE read without its sysroot names no object: its executable still says
        pythonish = (any("python" in lib.name for lib in core.libraries)
                     or "python" in (core.executable or "").rsplit("/", 1)[-1])
        if not pythonish:
            return PythonStacks(status=PythonStatus.NOT_PYTHON, detail=_NOT_CPYTHON)
        return PythonStacks(status=PythonStatus.NO_RUNTIME, detail=(
            f"no CPython runtime (_PyRuntime) found: {in_memory}, and the core's own memory did not give it"
            if in_memory and in_memory != "no file's symbol table gave it" else
            "no CPython runtime (_PyRuntime) found: the dynamic symbol table of the interpreter is neither "
            "in a file matching the core's build-id nor in the core; pass --sysroot with its files"))
    shapes = debug_offset_shapes()
    debug = refused = None
    raw = mem.read_prefix(binary.runtime, max((read_size(s) for s in shapes.values()), default=24))
    try:
        debug = parse_debug_offsets(raw, shapes, runtime_size=binary.runtime_size)
    except DebugOffsetsError as exc:
        refused = str(exc)
    version = detect_version(binary, core, mem, debug.version if debug else None)
    if version is None:
        return PythonStacks(status=PythonStatus.UNSUPPORTED,
                            detail=f"found _PyRuntime in {binary.library.path} but could not read its CPython version")
    free_threaded = bool(debug and debug.free_threaded)
    if dwarf is not None:
        if dwarf.table is None:
            changed = _files_problem(core)
            if changed and "another build" in changed:  # debug symbols of the file here would not help
                return PythonStacks(status=PythonStatus.UNSUPPORTED, version=version.text,
                                    free_threaded=free_threaded, detail=f"gdb: {dwarf.error}: {changed}")
            return PythonStacks(status=PythonStatus.UNSUPPORTED, version=version.text, free_threaded=free_threaded,
                                detail=f"gdb: {dwarf.error}; Debian/Ubuntu ship it in python{version.major}."
                                       f"{version.minor}-dbg (or build CPython with -g)")
        try:
            layout = Layout(dwarf.table)
        except (LayoutError, KeyError) as exc:
            return PythonStacks(status=PythonStatus.UNSUPPORTED, version=version.text,
                                detail=f"gdb's DWARF layout of CPython {version.text} is not usable: {exc}")
        return Interpreter(binary=binary, version=version, layout=layout, source=LayoutSource.DWARF,
                      description=f"DWARF of {dwarf.objfile or binary.library.path}" + _found(in_memory),
                      free_threaded=free_threaded or layout.free_threaded)
    try:
        choice = choose_layout(version.major, version.minor, free_threaded=free_threaded, debug=debug,
                               refused=refused)
    except LayoutError as exc:
        return PythonStacks(status=PythonStatus.UNSUPPORTED, version=version.text, free_threaded=free_threaded,
                            detail=str(exc))
    return Interpreter(binary=binary, version=version, layout=choice.layout, source=choice.source,
                  description=choice.description + _found(in_memory), free_threaded=free_threaded)


def _found(in_memory: str | None) -> str:
    return f"; _PyRuntime found in the core's memory ({in_memory})" if in_memory else ""


def _files_problem(core: CoreFile) -> str | None:
    """Why the interpreter's files could not say where ``_PyRuntime`` is, naming the file: another build
    than the one that crashed (the node upgraded it since), or missing.  None when neither is the case."""
    from forensics.model import LibraryStatus
    from forensics.pyread.locate import interpreter_objects

    candidates = interpreter_objects(core)
    exe = [lib for lib in candidates if lib.path == core.executable]
    for lib in candidates:
        if lib.status is LibraryStatus.MISMATCH:
            return (f"the file at {lib.file_path} is another build than the one that crashed (build-id "
                    f"{lib.file_build_id}, the core ran {lib.build_id})")
    for lib in exe:
        if lib.status is LibraryStatus.MISSING:
            return f"{lib.path} is missing{'' if lib.file_path else ' here'} (no file of build-id {lib.build_id})"
    return None


def _read(core: CoreFile, mem, sysroot: str | None, dwarf: DwarfLayout | None, limits: Limits,
          interpreter: Interpreter | PythonStacks | None) -> PythonStacks:
    from forensics.pyread.locate import TYPE_SYMBOLS
    from forensics.pyread.objects import Budget, Objects, Reader
    from forensics.pyread.walk import walk_runtime

    found = interpreter if interpreter is not None and dwarf is None else \
        find_interpreter(core, mem, sysroot=sysroot, dwarf=dwarf)
    if isinstance(found, PythonStacks):
        return found
    binary, layout = found.binary, found.layout
    reader = Reader(mem, Budget(limits))
    types = {name: binary.symbol(name) for name in TYPE_SYMBOLS}
    walked = walk_runtime(layout, reader, Objects(layout, reader, types), core, binary.runtime)
    stacks = PythonStacks(status=PythonStatus.OK, version=found.version.text, layout=found.description,
                          layout_source=found.source, free_threaded=found.free_threaded,
                          gil_holder=walked.gil_holder, threads=tuple(walked.threads))
    if walked.no_interpreter:
        return replace(stacks, status=PythonStatus.NO_INTERPRETER,
                       detail="_PyRuntime.interpreters.head is NULL: no running CPython interpreter")
    problems = list(walked.problems)
    if walked.cut:
        problems.append(walked.cut)
    if problems:
        status = PythonStatus.PARTIAL if walked.threads else PythonStatus.FAILED
        return replace(stacks, status=status, detail="; ".join(problems), cut=walked.cut)
    return stacks


def layout_differences(core: CoreFile, dwarf: DwarfLayout, *, sysroot: str | None = None, mem=None,
                       interpreter: Interpreter | PythonStacks | None = None) -> list[str]:
    """Where gdb's DWARF layout and the direct reader's layout of this core disagree (``--method both``).

    Field by field of what the walker reads; a side that has no layout is said.

    :param mem: the core's memory, open; None: the core is opened here
    :param interpreter: the direct reader's (:func:`find_interpreter` without ``dwarf``), when found already
    """
    from forensics.core.memory import CoreMemory
    from forensics.pyread.layouts import compare_layouts

    if mem is None:
        with CoreMemory.open(core.path) as opened:
            return layout_differences(core, dwarf, sysroot=sysroot, mem=opened, interpreter=interpreter)
    a = find_interpreter(core, mem, sysroot=sysroot, dwarf=dwarf)
    b = interpreter if interpreter is not None else find_interpreter(core, mem, sysroot=sysroot)
    if isinstance(a, PythonStacks) and isinstance(b, PythonStacks):
        return []
    if isinstance(a, PythonStacks):
        return ["only one method has a layout: " + a.detail]
    if isinstance(b, PythonStacks):
        return ["only one method has a layout: " + b.detail]
    return compare_layouts(a.layout, b.layout)
