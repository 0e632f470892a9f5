"""Where this installation of forensics lies: what a child ``python -m forensics`` of this interpreter reads.

A sandbox shows or grants an analysis what it needs and no more: ``analyze --sandbox``'s bubblewrap view binds
the installation read-only (:mod:`.contain`), ``agent serve`` checks at start that its analyses' uid can reach it.
The installation may lie anywhere -- a virtual environment under /tmp, /home or /root, pyenv's interpreter behind
the venv's link, a pipx install, conda, a Nix store -- so it is read from the running interpreter, and each of its
paths is traced one component at a time (:func:`forensics.rootpath.trace_in_root`): every symlink on the way is
part of it, as is the file it leads to.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..rootpath import trace_in_root

__all__ = ["Installation", "read_installation", "MAX_MAPS"]

MAX_MAPS = 1 << 16  # lines of /proc/self/maps read, at most (a Python process maps a few hundred)


@dataclass(frozen=True, slots=True, kw_only=True)
class Installation:
    """The installation's symlinks on the way to its files, each as (its canonical path, its target), and the
    canonical files and directories they lead to (none of them beneath another, never ``/`` itself)."""

    links: tuple[tuple[str, str], ...]
    paths: tuple[str, ...]


def _mapped_dirs() -> set[str]:
    """The directory of each file this process runs code of: the loader, libpython, the libraries and extension
    modules it loaded (an interpreter outside ``/usr`` has its own: conda's, a Nix store's). Files mapped as data
    (a core being read) are not code, and not the installation's."""
    out = set()
    try:
        with open("/proc/self/maps") as f:
            for n, line in enumerate(f):
                if n >= MAX_MAPS:
                    break
                fields = line.rstrip("\n").split(None, 5)
                if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/") \
                        and not fields[5].endswith(" (deleted)"):
                    out.add(os.path.dirname(fields[5]))
    except OSError:  # no /proc: the other paths still say where the interpreter lies
        pass
    return out


def read_installation() -> Installation:
    """What ``[sys.executable, "-m", "forensics", ...]`` reads of this installation, wherever it lies: the interpreter
    as invoked (a venv's link to pyenv's; pipx's venv), the prefixes (a venv's ``pyvenv.cfg``; the interpreter's
    home with its standard library and libpython), the directories and archives it imports from (``sys.path`` but
    its first entry: this process's script directory or working directory, which a child run with ``-m`` elsewhere
    does not have), forensics' package with what ships beside it (a checkout's ``gdb_scripts/``), and the
    directories of the shared objects this process has mapped. Paths that do not exist are left out.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # forensics/
    entries = sys.path if getattr(sys.flags, "safe_path", False) else sys.path[1:]
    wanted = [sys.executable, getattr(sys, "_base_executable", ""), sys.prefix, sys.exec_prefix, sys.base_prefix,
              sys.base_exec_prefix, *entries, os.path.dirname(package), *sorted(_mapped_dirs())]
    links: dict[str, str] = {}
    real: set[str] = set()
    for path in wanted:
        if not path or not os.path.isabs(path):
            continue
        try:
            met, canonical = trace_in_root("/", path)
        except OSError:  # not there (a zip of the standard library that was never installed): nothing to read
            continue
        links.update(met)
        if canonical != "/":
            real.add(canonical)
    paths = [p for p in sorted(real) if not any(p.startswith(q + "/") for q in real)]
    return Installation(links=tuple(sorted(links.items())), paths=tuple(paths))
