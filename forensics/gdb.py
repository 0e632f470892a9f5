"""The gdb session: native stacks and CPython's layout from DWARF for a core, through GDB/MI (pygdbmi).

gdb runs with ``-nx`` (no user init files), batch-like over MI, with
auto-loading and debuginfod off unless asked.  It is pointed only at files
whose build-id the core reader checked: a private directory of links, one per
library, goes to ``solib-search-path`` and the sysroot is an empty directory,
so gdb can never pick up a different build of a library from this machine.

Our GDB scripts (``gdb_scripts/``) print stage markers and one JSON line each:
``forensics-native`` the native frames of every thread, ``forensics-layout`` the
struct layout of the core's CPython read from its DWARF (the Python stacks are then
walked by :mod:`forensics.pyread` with it).  This module parses them and raises an
error naming the last stage reached.
"""
from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .cache import cache_dir
from .errors import GdbError, GdbNotFound, GdbTimeout
from .model import CoreFile, DwarfLayout, LibraryStatus, NativeFrame, NativeStack
from .modes import Unwinder
from .resources import find_shipped

if TYPE_CHECKING:
    from pygdbmi.gdbcontroller import GdbController

__all__ = ["GdbResult", "GdbSession", "find_gdb_scripts", "run_gdb", "parse_marker_json", "parse_native_stacks",
           "parse_layout",
           "update_link_farm", "update_debug_farm", "gdb_for_core"]

NATIVE_MARKER = "FORENSICS-NATIVE-JSON: "
LAYOUT_MARKER = "FORENSICS-LAYOUT-JSON: "
DEFAULT_TIMEOUT = 120.0


#: the machine names platform.machine() gives, per core architecture (model.Arch's values)
_HOST_MACHINES = {"x86-64": ("x86_64", "amd64"), "aarch64": ("aarch64", "arm64")}
MULTIARCH_GDB = "gdb-multiarch"


def gdb_for_core(core: CoreFile, gdb: str = "gdb") -> str:
    """The gdb to read ``core`` with: ``gdb`` as given, except the default ``gdb`` for a core of another machine
    than this one, which is read by ``gdb-multiarch`` where it is installed (Debian's ``gdb`` knows its own
    machine only).
    """
    import platform

    if gdb != "gdb" or platform.machine().lower() in _HOST_MACHINES.get(core.arch.value, ()):
        return gdb
    return MULTIARCH_GDB if shutil.which(MULTIARCH_GDB) else gdb


def find_gdb_scripts() -> Path:
    """The directory holding forensics_native.py and forensics_python.py.

    In a checkout it is ``gdb_scripts/`` beside the package; in a wheel it is
    installed inside the package as ``forensics/gdb_scripts``.
    """
    found = find_shipped("gdb_scripts", "forensics_native.py")
    if found is None:
        raise GdbError("loading scripts", f"gdb_scripts not found beside {Path(__file__).resolve().parent}")
    return found


@dataclass(frozen=True, slots=True)
class GdbResult:
    """The raw, parsed output of our two scripts for one core."""

    native: tuple[NativeStack, ...] | None  # None when native stacks were not asked for
    layout: DwarfLayout | None  # CPython's layout from DWARF, or why gdb gave none; None when not asked
    log: tuple[str, ...]


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _parse_frames(frames: object) -> tuple[NativeFrame, ...]:
    out: list[NativeFrame] = []
    for f in frames if isinstance(frames, list) else ():
        if not isinstance(f, dict):
            continue
        out.append(NativeFrame(index=len(out), pc=_int(f.get("pc")) or 0, symbol=_str(f.get("function")),
                               offset=_int(f.get("offset")), library=_str(f.get("library")),
                               file=_str(f.get("file")), line=_int(f.get("line")), inlined=bool(f.get("inlined")),
                               tailcall=bool(f.get("tailcall"))))
    return tuple(out)


def parse_native_stacks(doc: object) -> tuple[NativeStack, ...]:
    """``forensics-native``'s document (``{"threads": [{"num", "lwp", "frames": [{"pc", "function", "offset",
    "library", "file", "line", "inlined", "tailcall"}], "error", "method"}]}``) as records, where it enters
    (each stack's ``method`` is :attr:`~forensics.modes.Unwinder.GDB`: gdb unwound it).

    >>> parse_native_stacks({"threads": [{"num": 1, "lwp": 7, "frames": [{"pc": 16, "function": "main"}]}]})[0].tid
    7
    """
    threads = doc.get("threads") if isinstance(doc, dict) else None
    out: list[NativeStack] = []
    for t in threads if isinstance(threads, list) else ():
        tid = _int(t.get("lwp")) if isinstance(t, dict) else None
        if tid is None:
            continue
        out.append(NativeStack(num=_int(t.get("num")) or 0, tid=tid, frames=_parse_frames(t.get("frames")),
                               error=_str(t.get("error")), method=Unwinder.GDB))
    return tuple(out)


def parse_layout(doc: dict | None) -> DwarfLayout:
    """``forensics-layout``'s document (a record in ``forensics/pyread/layouts.json``'s format with the ``objfile``
    whose DWARF it came from, or ``{"error": ...}``) as a record, where it enters; None (no document) is an error.

    >>> parse_layout({"error": "no DWARF for _PyRuntime"}).error, parse_layout(None).error
    ('no DWARF for _PyRuntime', 'forensics-layout printed no result')
    >>> parse_layout({"ptr_size": 8, "types": {}, "objfile": "/usr/bin/python3.12"}).objfile
    '/usr/bin/python3.12'
    """
    if doc is None:
        return DwarfLayout(error="forensics-layout printed no result")
    if "error" in doc:
        return DwarfLayout(error=str(doc["error"]))
    return DwarfLayout(table=doc, objfile=_str(doc.get("objfile")))


def parse_marker_json(text: str, marker: str) -> dict | None:
    """Find the line starting with ``marker`` in gdb's console output and decode its JSON.

    >>> parse_marker_json('noise\\nFORENSICS-NATIVE-JSON: {"threads": []}\\n', NATIVE_MARKER)
    {'threads': []}
    """
    for line in text.splitlines():
        if line.startswith(marker):
            return json.loads(line[len(marker):])
    return None


class GdbSession:
    """One gdb process, reusable for several cores of the same or different executables.

    gdb starts on the first :meth:`analyze`, not here: a batch keeps one session per worker
    and most cores never need gdb (the libdw unwinder and the direct reader do the work).
    """

    def __init__(self, gdb: str = "gdb", *, timeout: float = DEFAULT_TIMEOUT, debuginfod: str | None = None):
        path = shutil.which(gdb)
        if path is None:
            raise GdbNotFound(gdb)
        self._path = path
        self._debuginfod = debuginfod
        self.timeout = timeout
        self._token = 0
        self._log: list[str] = []
        self._farm: Path | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._exe: str | None = None
        self._gdb: GdbController | None = None
        self._started = False
        self._stage = "starting"

    def _start(self) -> None:
        from pygdbmi.gdbcontroller import GdbController

        self._started = True
        try:
            self._gdb = GdbController(
                command=[self._path, "-nx", "--quiet", "--interpreter=mi3"],
                time_to_check_for_additional_output_sec=0.0,
            )
        except (OSError, ValueError) as e:
            raise GdbError("to start", str(e)) from e
        self._scripts = find_gdb_scripts()
        self._stage = "configuring"
        settings = [
            "set pagination off",
            "set width 0",
            "set confirm off",
            "set auto-load off",
            "set print thread-events off",
            "set max-value-size unlimited",
        ]
        cache = _index_cache_dir()
        if cache is not None:
            # gdb keeps the DWARF index of each build-id it has read: the second core of the
            # same libpython (a batch, a crash loop) skips re-indexing its debug info.
            settings += [f"set index-cache directory {cache}", "set index-cache enabled on"]
        if self._debuginfod:
            settings += [f"set debuginfod urls {self._debuginfod}", "set debuginfod enabled on"]
        else:
            settings.append("set debuginfod enabled off")
        for cmd in settings:
            self.console(cmd, check=False)
        self._stage = "loading scripts"
        out = self.console(f"source {self._scripts / 'forensics_native.py'}")
        if "FORENSICS: native script loaded" not in out:
            raise GdbError("loading scripts", _last(out) or "forensics_native.py did not load")
        out = self.console(f"source {self._scripts / 'forensics_python.py'}")
        if "FORENSICS: python script loaded" not in out:
            raise GdbError("loading scripts", _last(out) or "forensics_python.py did not load")
        self._stage = "ready"

    # -- MI plumbing -------------------------------------------------------------------------

    def _command(self, mi: str, timeout: float | None = None) -> tuple[str, list[str], dict]:
        """Send one MI command; return (console text, error lines, result record)."""
        from pygdbmi.constants import GdbTimeoutError

        gdb = self._gdb
        if gdb is None:  # closed (a timeout, or the caller's close): a command now is the caller's bug, said
            raise GdbError(self._stage, "gdb is not running")
        self._token += 1
        token = self._token
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            gdb.write(f"{token}{mi}", read_response=False)
        except (OSError, ValueError, GdbTimeoutError) as e:
            raise GdbError(self._stage, f"cannot write to gdb: {e}") from e
        console: list[str] = []
        errors: list[str] = []
        while True:
            if time.monotonic() > deadline:
                self.close()
                raise GdbTimeout(self._stage, timeout or self.timeout)
            try:
                # Wait for output ourselves, then let pygdbmi parse whatever is there: its own
                # waiting loop costs a fixed delay per command.
                remaining = max(0.0, min(1.0, deadline - time.monotonic()))
                select.select(gdb.io_manager.read_list, [], [], remaining)
                responses = gdb.get_gdb_response(timeout_sec=0, raise_error_on_timeout=False)
            except (OSError, ValueError) as e:
                raise GdbError(self._stage, f"gdb exited: {e}") from e
            for r in responses:
                kind, payload = r.get("type"), r.get("payload")
                if kind == "console" and isinstance(payload, str):
                    console.append(payload)
                elif kind == "log" and isinstance(payload, str):
                    errors.append(payload)
                    self._log.append(payload.rstrip("\n"))
                elif kind == "result" and r.get("token") == token:
                    return "".join(console), errors, r
            if gdb.gdb_process is not None and gdb.gdb_process.poll() is not None and not responses:
                raise GdbError(self._stage, f"gdb exited with status {gdb.gdb_process.returncode}")

    def console(self, command: str, *, check: bool = True, timeout: float | None = None) -> str:
        """Run a CLI command and return what it printed."""
        escaped = command.replace("\\", "\\\\").replace('"', '\\"')
        text, errors, result = self._command(f'-interpreter-exec console "{escaped}"', timeout)
        if check and result.get("message") == "error":
            msg = (result.get("payload") or {}).get("msg") or "".join(errors).strip()
            raise GdbError(self._stage, f"{command}: {msg}")
        return text

    # -- the job ----------------------------------------------------------------------------------

    def analyze(self, core: CoreFile, exe_file: str | None, *, python: bool = True, native: bool = True,
                sysroot: str | None = None) -> GdbResult:
        """Load ``core`` with ``exe_file``; return its native stacks (``native``) and CPython's layout read
        from DWARF (``python``).

        The executable stays loaded between calls with the same ``exe_file``, and the
        library links are kept, so a batch of cores of one program reads symbols once.
        """
        if not self._started:
            self._start()
        elif self._gdb is None:
            raise GdbError(self._stage, "the gdb session was closed")
        self._log.clear()
        if self._farm is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="forensics-gdb-")
            self._farm = Path(self._tmp.name) / "libs"
            self._farm.mkdir()
            empty_root = Path(self._tmp.name) / "sysroot"
            empty_root.mkdir()
            self._stage = "configuring"
            self.console(f"set sysroot {empty_root}")
            self.console(f"set solib-search-path {self._farm}")
            # separate debug files: only those forensics.core.debugfiles found by build-id (in the
            # sysroot first, then this machine's), never a name-matched file of another build
            self._debug = Path(self._tmp.name) / "debug"
            self._debug.mkdir()
            self.console(f"set debug-file-directory {self._debug}")
        update_link_farm(core, self._farm)
        update_debug_farm(core, self._debug, sysroot)
        if exe_file != self._exe:
            self._stage = "loading the executable"
            self.console(f"file {_quote(exe_file)}" if exe_file else "file", check=bool(exe_file))
            self._exe = exe_file
        self._stage = "loading the core"
        self.console(f"core-file {_quote(core.path)}")
        added = self._add_library_symbols(core) if exe_file is None else 0
        native_doc = None
        if native:
            self._stage = "reading native stacks"
            doc = parse_marker_json(self.console("forensics-native"), NATIVE_MARKER)
            if doc is None:
                raise GdbError(self._stage, "forensics-native printed no result")
            native_doc = parse_native_stacks(doc)
        layout = None
        if python:
            self._stage = "reading CPython's layout from DWARF"
            layout = parse_layout(parse_marker_json(self.console("forensics-layout", check=False), LAYOUT_MARKER))
        self._stage = "unloading"
        self.console("core-file", check=False)
        if added:
            self.console("symbol-file", check=False)  # the next core's libraries may sit elsewhere
        self._stage = "ready"
        return GdbResult(native=native_doc, layout=layout, log=tuple(self._log))

    def _add_library_symbols(self, core: CoreFile) -> int:
        """Without the executable gdb cannot list the shared libraries (it finds them through the
        executable's dynamic section), so every library whose build-id checked out is loaded at the
        address the core maps it: its symbols and unwind tables name and walk the frames.
        :return: how many were loaded
        """
        n = 0
        for lib in core.libraries:
            if lib.path == core.executable or lib.status is not LibraryStatus.OK or not lib.file_path:
                continue
            self.console(f"add-symbol-file {_quote(lib.file_path)} -o {lib.base:#x}", check=False)
            n += 1
        return n

    @property
    def closed(self) -> bool:
        """True once gdb was started and has exited (closed, or killed at a timeout)."""
        return self._started and self._gdb is None

    def close(self) -> None:
        gdb = getattr(self, "_gdb", None)
        if gdb is not None:
            _stop(gdb.gdb_process)
            gdb.gdb_process = None
            self._gdb = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._farm = None

    def __enter__(self) -> GdbSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """End gdb within ``grace`` seconds twice over, whatever it is doing; never raises.

    pygdbmi's own exit terminates gdb and waits for it without reading its output: a gdb
    blocked writing to a full pipe (a long walk printing, stopped at a timeout) never gets
    to exit, and the wait never ends.  Its output is drained here while it exits; one that
    does not is killed.
    """
    if proc is None:
        return
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.communicate(timeout=grace)
    except Exception:  # noqa: BLE001 - closing must never raise
        pass


def _index_cache_dir() -> Path | None:
    d = cache_dir() / "gdb-index"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return d if os.access(d, os.W_OK) else None


def run_gdb(core: CoreFile, exe_file: str | None, *, gdb: str = "gdb", timeout: float = DEFAULT_TIMEOUT,
            debuginfod: str | None = None, python: bool = True, native: bool = True,
            sysroot: str | None = None) -> GdbResult:
    """Start gdb, analyze one core (native stacks and CPython's DWARF layout, each unless switched off), stop gdb.
    The default ``gdb`` becomes gdb-multiarch for a core of another machine (:func:`gdb_for_core`)."""
    with GdbSession(gdb_for_core(core, gdb), timeout=timeout, debuginfod=debuginfod) as session:
        return session.analyze(core, exe_file, python=python, native=native, sysroot=sysroot)


def update_link_farm(core: CoreFile, farm: Path) -> None:
    """Point the links in ``farm`` (by basename) at every library file whose build-id checked out.

    Libraries that are missing or of another build get no link on purpose: gdb then
    shows their frames as unnamed rather than naming them from a wrong file.  A link
    left from an earlier core of the same session is replaced when its target differs.
    """
    wanted: dict[str, str] = {}
    for lib in core.libraries:
        if lib.file_path is None or lib.status not in (LibraryStatus.OK, LibraryStatus.UNVERIFIED):
            continue
        target = os.path.abspath(lib.file_path)
        # gdb looks a library up by the name the dynamic loader used (link_map), which can
        # be a symlink name such as libffi.so.8 for the file libffi.so.8.1.2, or the
        # soname (libnvidia-ml.so.1 for libnvidia-ml.so.580.126.09).
        for name in (lib.name, *_soname_aliases(lib.name), *_soname(target)):
            wanted.setdefault(name, target)  # two libraries of one name: the first mapped wins
    for entry in os.scandir(farm):
        if entry.name not in wanted or os.readlink(entry.path) != wanted[entry.name]:
            os.unlink(entry.path)
    for name, target in wanted.items():
        link = farm / name
        if not os.path.islink(link):
            os.symlink(target, link)


def update_debug_farm(core: CoreFile, directory: Path, sysroot: str | None) -> None:
    """Lay out ``directory`` as a debug-file directory gdb reads by build-id (``.build-id/xx/rest.debug``),
    one link per library whose file is used and whose debug file :func:`find_debug_file` found.

    Links of an earlier core of the same session stay while they point at the same file.
    """
    from .core.debugfiles import find_debug_file

    wanted: dict[str, str] = {}
    for lib in core.libraries:
        build_id = lib.build_id or lib.file_build_id
        if lib.file_path is None or lib.status not in (LibraryStatus.OK, LibraryStatus.UNVERIFIED) or not build_id:
            continue
        found = find_debug_file(build_id, sysroot, lib.path)
        if found is not None:
            wanted[f"{build_id[:2]}/{build_id[2:]}.debug"] = os.path.abspath(found)
    root = directory / ".build-id"
    for sub in (os.scandir(root) if root.is_dir() else ()):
        for entry in os.scandir(sub.path):
            rel = f"{sub.name}/{entry.name}"
            if rel not in wanted or os.readlink(entry.path) != wanted[rel]:
                os.unlink(entry.path)
    for rel, target in wanted.items():
        link = root / rel
        if not os.path.islink(link):
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, link)


def _soname(path: str) -> list[str]:
    """The file's DT_SONAME, read once per file version (a batch links the same libraries per core)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    name = _soname_of(path, st.st_mtime_ns, st.st_size)
    return [name] if name else []


@functools.lru_cache(maxsize=4096)
def _soname_of(path: str, mtime_ns: int, size: int) -> str | None:
    from .core.image import ElfImage

    image = ElfImage.from_file(path)
    name = image.soname() if image is not None else None
    return name if name and "/" not in name else None


def _soname_aliases(name: str) -> list[str]:
    """``libffi.so.8.1.2`` -> ``["libffi.so.8.1", "libffi.so.8"]``."""
    if ".so." not in name:
        return []
    head, _, version = name.partition(".so.")
    parts = version.split(".")
    return [f"{head}.so." + ".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _quote(path: str) -> str:
    return path if " " not in path else f'"{path}"'


def _last(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
