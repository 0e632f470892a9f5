"""Python frames by module and path: ``ctypes.string_at (ctypes/__init__.py:519)``.

A code object knows its file's full path, not its module.  The module follows from the path
where the path shows its import root: the standard library (``lib/python3.12/``, Debian's
``/usr/lib/python3.11/``, a frozen module) or an installed package (``site-packages/``,
``dist-packages/``).  Elsewhere (a script, an application's own directory) the root is not in
the core, so the frame is shown by its function and file name (the package directory too for
an ``__init__.py``).  The same short path is what a fingerprint hashes, so one crash
fingerprints the same in every interpreter prefix, venv and image.
"""
from __future__ import annotations

import re

from ..model import PyFrame
from ..records import record

__all__ = ["PyLocation", "python_location", "describe_pyframe", "describe_pyframe_parts", "first_outside_stdlib"]

_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/|/python\d+\.zip/")
_FROZEN = re.compile(r"<frozen ([\w.]+)>")


@record
class PyLocation:
    """Where a Python frame's code lives: its module when the path shows it, the path from the import
    root (else the file name), and whether it is the standard library."""

    module: str | None
    path: str
    stdlib: bool


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    m = None
    for m in pattern.finditer(text):  # noqa: B007 - the last one is wanted
        continue
    return m


def _module(rel: str) -> str | None:
    if not rel.endswith(".py"):
        return None
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def python_location(file: str | None) -> PyLocation:
    """The module and short path of a code object's file.

    >>> python_location("/usr/lib/python3.12/ctypes/__init__.py")
    PyLocation(module='ctypes', path='ctypes/__init__.py', stdlib=True)
    >>> python_location("/venv/lib/python3.12/site-packages/nvitop/api/device.py")
    PyLocation(module='nvitop.api.device', path='nvitop/api/device.py', stdlib=False)
    >>> python_location("/app/exporter.py")
    PyLocation(module=None, path='exporter.py', stdlib=False)
    >>> python_location("<frozen runpy>")
    PyLocation(module='runpy', path='<frozen runpy>', stdlib=True)
    """
    file = file or "?"
    frozen = _FROZEN.fullmatch(file)
    if frozen:
        return PyLocation(module=frozen.group(1), path=file, stdlib=True)
    packages = _last_match(_PACKAGES, file)
    if packages is not None:
        rel = file[packages.end():]
        return PyLocation(module=_module(rel), path=rel, stdlib=False)
    stdlib = _last_match(_STDLIB, file)
    if stdlib is not None:
        rel = file[stdlib.end():]
        return PyLocation(module=_module(rel), path=rel, stdlib=True)
    parts = file.rsplit("/", 2)
    name = parts[-1]
    if name in ("__init__.py", "__main__.py") and len(parts) > 1 and parts[-2]:
        name = f"{parts[-2]}/{name}"
    return PyLocation(module=None, path=name, stdlib=False)


def describe_pyframe_parts(p: PyFrame, *, full: bool = False) -> tuple[str, str]:
    """(``module.function`` or ``function``, ``path:line``) of a Python frame; ``full``: the file's whole path, as
    the process named it (what an editor opens), not the path below its sys.path entry.

    >>> describe_pyframe_parts(PyFrame(function="string_at", file="/usr/lib/python3.12/ctypes/__init__.py", line=519))
    ('ctypes.string_at', 'ctypes/__init__.py:519')
    """
    loc = python_location(p.file)
    name = f"{loc.module}.{p.function}" if loc.module and p.function != "<module>" else (
        f"{loc.module} <module>" if loc.module else p.function)
    path = p.file if full and p.file else loc.path
    return name, f"{path}:{p.line if p.line is not None else '?'}"


def describe_pyframe(p: PyFrame, *, full: bool = False) -> str:
    """A Python frame as ``module.function (path:line)``, or ``function (file.py:line)`` outside a known root;
    ``full``: with the file's whole path.

    >>> describe_pyframe(PyFrame(function="collect", file="/app/exporter.py", line=56))
    'collect (exporter.py:56)'
    >>> describe_pyframe(PyFrame(function="collect", file="/app/exporter.py", line=56), full=True)
    'collect (/app/exporter.py:56)'
    """
    name, where = describe_pyframe_parts(p, full=full)
    return f"{name} ({where})"


def first_outside_stdlib(frames: tuple[PyFrame, ...] | list[PyFrame]) -> PyFrame | None:
    """The innermost frame whose code is not the standard library's (the caller that matters), or None."""
    return next((p for p in frames if not python_location(p.file).stdlib), None)
