"""Independent oracles for Python stacks in cores: pystack (PyPI, test extra) and CPython's own py-bt.

Both return ``{native thread id: [(function, file, line), ...]}``, innermost frame first,
so a test can compare them frame for frame with forensics' walker.  pystack names a
frame by its code object's ``co_name`` (forensics by ``co_qualname`` where there is
one: compare the last dotted part).  :func:`py_bt_stacks` runs gdb with the
interpreter's own ``python-gdb.py`` (needs its DWARF: a pyenv build, or Debian's
``-dbg`` debug files under a root's ``/usr/lib/debug``).
"""
from __future__ import annotations

import functools
import pathlib
import re
import subprocess

__all__ = ["pystack_stacks", "py_bt_stacks", "frame_keys"]

Frames = dict[int, list[tuple[str, str, int | None]]]


@functools.lru_cache(maxsize=8)
def _library_dirs(root: str) -> str:
    dirs: set[str] = set()
    for pattern in ("**/*.so", "**/*.so.*"):
        dirs.update(str(p.parent) for p in pathlib.Path(root).glob(pattern) if "/usr/lib/debug/" not in str(p))
    return ":".join(sorted(dirs))


def pystack_stacks(core: str, executable: str, *, root: str | None = None, by_interpreter: bool = False) -> dict:
    """pystack's Python stacks of a core (``root``: the filesystem the process ran in); keyed by thread id,
    or by ``(thread id, interpreter id)`` (a thread has one state in each interpreter it entered)."""
    from pystack.engine import NativeReportingMode, get_process_threads_for_core

    threads = get_process_threads_for_core(core, executable, _library_dirs(root) if root else None,
                                           native_mode=NativeReportingMode.OFF)
    out: dict = {}
    for t in threads:
        frames = [(f.code.scope, f.code.filename, f.code.location.lineno) for f in t.frames]
        out[(t.tid, t.interpreter_id) if by_interpreter else t.tid] = list(reversed(frames))  # outermost first
    return out


_THREAD = re.compile(r"^Thread \d+ \((?:Thread 0x[0-9a-f]+ )?\(?LWP (\d+)\)")
_FRAME = re.compile(r'^  File "(.*)", line (\d+), in (.*)$')


def py_bt_stacks(core: str, executable: str, gdb_py: str, *, root: str | None = None,
                 lib_dirs: tuple[str, ...] = ()) -> Frames:
    """CPython's ``py-bt`` for every thread, from its own ``python-gdb.py`` loaded into gdb.

    py-bt finds Python frames by unwinding the native stack, so gdb must find every library:
    ``lib_dirs`` are searched besides the root (the crash sample's libcrash.so lives outside it).
    """
    # no index-cache here: with gdb 13 a cached .gdb-index of a big DWARF loses types that python-gdb.py
    # looks up globally ("No type named _PyInterpreterFrame")
    cmd = ["gdb", "-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex", "set auto-load off"]
    if root:
        cmd += ["-ex", f"set sysroot {root}", "-ex", f"set debug-file-directory {root}/usr/lib/debug"]
    if lib_dirs:
        cmd += ["-ex", f"set solib-search-path {':'.join(lib_dirs)}"]
    cmd += ["-ex", f"file {executable}", "-ex", f"core-file {core}", "-ex", f"source {gdb_py}",
            "-ex", "thread apply all py-bt"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    stacks: Frames = {}
    current: list | None = None
    for line in out.splitlines():
        m = _THREAD.match(line)
        if m:
            current = stacks.setdefault(int(m.group(1)), [])
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.append((m.group(3), m.group(1), int(m.group(2))))
    return {tid: frames for tid, frames in stacks.items() if frames}


def frame_keys(frames) -> list[tuple[str, str, int | None]]:
    """forensics' frames as the oracles name them: (co_name, file, line)."""
    return [(f.function.rsplit(".", 1)[-1], f.file, f.line) for f in frames]
