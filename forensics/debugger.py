"""``forensics debug``: gdb on a core, set up the way analyze reads it -- what ``coredumpctl debug`` does, plus
Python.

:func:`plan_debug` reads the core (a capture bundle, a systemd-coredump store file) and says how gdb should
open it: the crashed machine's files (``--sysroot``, a bundle's own objects), the debug directories, CPython's
gdb helper for that interpreter (``python-gdb.py``: ``py-bt``, ``py-list``, ``py-locals``) and the crashed thread
selected.  :meth:`DebugPlan.argv` is the command; the CLI runs it or prints it.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil

from .analyze.pipeline import open_input
from .core import open_core
from .gdb import gdb_for_core
from .model import CoreFile, LibraryStatus
from .records import record

__all__ = ["DebugPlan", "plan_debug", "find_python_helper"]

_DEBUG_DIR = "/usr/lib/debug"
_AUTO_LOAD = "/usr/share/gdb/auto-load"
_MAX_PYENV = 200  # pyenv's versions looked at


@record
class DebugPlan:
    """How gdb opens a core: every path on this machine, and what could not be found (``notes``)."""

    gdb: str
    core: str
    executable: str | None  # the program's file (None: gdb reads the core without it)
    sysroot: str | None
    library_dirs: tuple[str, ...]  # where the libraries whose build-ids checked out are, outside the sysroot
    debug_dirs: tuple[str, ...]
    python_helper: str | None  # CPython's python-gdb.py for the crashed interpreter
    crashed_tid: int | None
    notes: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The gdb command line: settings before the files are read (``-iex``), then the core, then the helper
        and the crashed thread (``-ex``, run in order once the core is loaded)."""
        # no script gdb would load on its own (a sysroot's, an image's: someone else's code): the helper, from this
        # machine, is sourced by name below
        argv = [self.gdb, "-q", "-iex", "set auto-load python-scripts off"]
        if self.sysroot:
            # nor the image's libthread_db (gdb's safe-path refuses it anyway, at length)
            argv += ["-iex", f"set sysroot {self.sysroot}", "-iex", "set auto-load libthread-db off"]
        if self.library_dirs:
            argv += ["-iex", "set solib-search-path " + ":".join(self.library_dirs)]
        if self.debug_dirs:
            argv += ["-iex", "set debug-file-directory " + ":".join(self.debug_dirs)]
        argv += [self.executable] if self.executable else []
        argv += ["-c", self.core]
        if self.python_helper:
            argv += ["-ex", f"source {self.python_helper}"]
        if self.crashed_tid is not None:  # by its LWP: gdb's thread numbers are its own
            argv += ["-ex", "python [t.switch() for t in gdb.selected_inferior().threads() "
                            f"if t.ptid[1] == {self.crashed_tid}]", "-ex", "thread"]
        return argv

    def command(self) -> str:
        """:meth:`argv` as one shell line (what ``--print`` shows)."""
        return shlex.join(self.argv())


def plan_debug(path: str, *, sysroot: str | None = None, exe: str | None = None, gdb: str = "gdb") -> DebugPlan:
    """How to open ``path`` (a core, a capture bundle, a systemd-coredump store file) in gdb.

    :raises ForensicsError: as :func:`forensics.core.open_core` (missing, unreadable, not a core)
    """
    core_path, root, _store = open_input(path, sysroot)
    core = open_core(core_path, sysroot=root, exe=exe)
    notes = []
    executable = exe or _executable_file(core)
    if executable is None:
        notes.append(f"the executable {core.executable or '(unnamed)'} was not found with its build-id: gdb reads "
                     "the core without it (pass --exe, or --sysroot with the crashed machine's files)")
    helper, in_root = find_python_helper(core, root)
    if helper is None and in_root is not None:
        notes.append(f"the crashed image's own python-gdb.py ({in_root}) is not loaded: it is code from the image; "
                     f"in gdb, 'source {in_root}' loads it if you trust the image (or install python-gdb.py of "
                     "the same CPython version here)")
    elif helper is None and _python_objects(core):
        notes.append("no python-gdb.py for this interpreter here (Debian: apt-get install python3.X-dbg; a CPython "
                     "build from source installs it beside the binary): gdb shows native frames only, no py-bt")
    dirs = [d for d in ((os.path.join(root, _DEBUG_DIR.lstrip("/")) if root else None), _DEBUG_DIR)
            if d and os.path.isdir(d)]
    return DebugPlan(gdb=gdb_for_core(core, gdb), core=os.path.abspath(core_path),
                     executable=os.path.abspath(executable) if executable else None,
                     sysroot=os.path.abspath(root) if root else None, library_dirs=_library_dirs(core, root),
                     debug_dirs=tuple(dict.fromkeys(dirs)),
                     python_helper=helper, crashed_tid=core.crashed_tid, notes=tuple(notes))


def _executable_file(core: CoreFile) -> str | None:
    """The program's file whose build-id checked out against the core (the core reader's own check)."""
    lib = next((lib for lib in core.libraries if lib.path == core.executable), None)
    ok = (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
    return lib.file_path if lib is not None and lib.file_path and lib.status in ok else None


def _library_dirs(core: CoreFile, root: str | None) -> tuple[str, ...]:
    """The directories of the libraries whose build-id checked out but which are not where gdb looks (in the
    sysroot at the path the core names): gdb finds them there by name."""
    out = []
    for lib in core.libraries:
        if lib.file_path is None or lib.status is not LibraryStatus.OK or lib.path == core.executable:
            continue
        expected = os.path.join(root, lib.path.lstrip("/")) if root else lib.path
        if os.path.abspath(lib.file_path) != os.path.abspath(expected):
            out.append(os.path.dirname(os.path.abspath(lib.file_path)))
    return tuple(dict.fromkeys(out))


def _python_objects(core: CoreFile) -> list[tuple[str, str]]:
    """The CPython objects of the process (its interpreter, its libpython): (the path the core names, the file)."""
    return [(lib.path, lib.file_path) for lib in core.libraries if lib.file_path and (
        lib.name.startswith("libpython3") or lib.name.startswith("python3") or
        (lib.path == core.executable and "python" in lib.name))]


def find_python_helper(core: CoreFile, sysroot: str | None) -> tuple[str | None, str | None]:
    """CPython's gdb helper (``python-gdb.py``) for the crashed interpreter: ``(helper, in_root)``.

    ``helper`` is a file of this machine: the interpreter's own where it ran here (``bin/python3.11-gdb.py`` beside
    a pyenv build's binary, ``libpython3.11.so.1.0-gdb.py`` beside a shared build's library, gdb's auto-load
    directory for Debian's ``python3.X-dbg``), else this machine's helper of the same CPython version.  A helper
    found only inside ``sysroot`` is the crashed image's code: it is ``in_root``, named, never loaded.
    """
    root = os.path.abspath(sysroot) if sysroot else None
    in_root = None
    for named, file in _python_objects(core):
        real = os.path.realpath(file)
        inside = real[len(root):] if root and real.startswith(root + "/") else None
        for candidate in _helper_candidates(named, file, real, inside, root):
            if not os.path.isfile(candidate):
                continue
            if root and os.path.realpath(candidate).startswith(root + "/"):
                in_root = in_root or candidate
                continue
            return candidate, None
        version = _cpython_version(named)
        found = next((c for c in _local_helpers(version) if os.path.isfile(c)), None) if version else None
        if found:
            return found, None
    return None, in_root


def _helper_candidates(named: str, file: str, real: str, inside: str | None, root: str | None) -> list[str]:
    """Where CPython's install and Debian's put the helper of one object, in the order gdb's auto-load looks."""
    out = [file + "-gdb.py", real + "-gdb.py"]
    for base in (_AUTO_LOAD, _DEBUG_DIR):
        for path in dict.fromkeys(p for p in (inside, named) if p):
            out.append(os.path.join(root or "/", base.lstrip("/"), path.lstrip("/")) + "-gdb.py")
    return out


def _cpython_version(name: str) -> str | None:
    """``3.11`` of ``/usr/bin/python3.11``, ``libpython3.11.so.1.0``, ``python3.13d``; None for another name.

    >>> _cpython_version("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"), _cpython_version("/usr/bin/python3.13d")
    ('3.11', '3.13')
    """
    m = re.search(r"python(3\.\d+)", os.path.basename(name))
    return m.group(1) if m else None


def _local_helpers(version: str) -> list[str]:
    """This machine's helpers of CPython ``version``: Debian's python3.X-dbg, pyenv's builds, the interpreter on
    PATH (a helper's code reads a process of the same minor version through its DWARF)."""
    out = [f"{_AUTO_LOAD}/usr/bin/python{version}-gdb.py",
           f"{_AUTO_LOAD}/usr/lib/x86_64-linux-gnu/libpython{version}.so.1.0-gdb.py"]
    pyenv = os.path.join(os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv"), "versions")
    with contextlib.suppress(OSError):
        for d in sorted(os.listdir(pyenv), reverse=True)[:_MAX_PYENV]:
            if d == version or d.startswith(version + "."):
                out.append(os.path.join(pyenv, d, "bin", f"python{version}-gdb.py"))
    on_path = shutil.which(f"python{version}")
    if on_path:
        out.append(os.path.realpath(on_path) + "-gdb.py")
    return out
