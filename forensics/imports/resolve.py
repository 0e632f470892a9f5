"""Which file a module name resolves to on a sys.path, as importlib's PathFinder/FileFinder decide.

Per directory: a package (``name/__init__`` with an extension, source or bytecode
suffix) wins over a module file (``name.cpython-XY-*.so``, ``name.abi3.so``,
``name.so``, ``name.py``, ``name.pyc``); a directory without ``__init__`` is a
namespace portion, used only when no entry holds a regular package or module.
"""
from __future__ import annotations

from .finders import find_in_finders
from .model import ModuleKind, PathEntry, Resolution
from .rootfs import RootFS
from .suffixes import extension_suffixes

__all__ = ["find_candidates", "find_module"]


def _suffixes(version: str, triplet: str) -> tuple[tuple[str, ModuleKind], ...]:
    return tuple((s, ModuleKind.EXTENSION) for s in extension_suffixes(version, triplet)) + (
        (".py", ModuleKind.MODULE), (".pyc", ModuleKind.BYTECODE))


def _find_in_dir(fs: RootFS, directory: str, tail: str, version: str, triplet: str):
    """('package'|'module'|'namespace', file, kind) for ``tail`` in one directory, or None."""
    base = directory.rstrip("/") + "/" + tail
    names = None
    if fs.is_dir(base):
        for suffix, _kind in _suffixes(version, triplet):
            init = f"{base}/__init__{suffix}"
            if fs.is_file(init):
                return "package", init, ModuleKind.PACKAGE
        names = "namespace"
    for suffix, kind in _suffixes(version, triplet):
        f = base + suffix
        if fs.is_file(f):
            return "module", f, kind
    if names:
        return "namespace", base, ModuleKind.NAMESPACE
    return None


def find_candidates(fs: RootFS, locations: list[tuple[int, str]], name: str, tail: str, version: str,
                    triplet: str = "x86_64-linux-gnu") -> list[Resolution]:
    """Every location's answer for ``tail``, in search order (the first non-namespace one wins)."""
    out = []
    for index, loc in locations:
        hit = _find_in_dir(fs, loc, tail, version, triplet)
        if hit is None:
            continue
        what, file, kind = hit
        if what == "namespace":
            out.append(Resolution(module=name, kind=kind, file=None, path_entry=loc, path_index=index,
                                  search_locations=(file,)))
        else:
            locs = (file.rsplit("/", 1)[0],) if what == "package" else ()
            out.append(Resolution(module=name, kind=kind, file=file, path_entry=loc, path_index=index,
                                  search_locations=locs))
    return out


def _pick(cands: list[Resolution], name: str) -> Resolution | None:
    for c in cands:
        if c.kind is not ModuleKind.NAMESPACE:
            return c
    portions = [c for c in cands if c.kind is ModuleKind.NAMESPACE]
    if portions:
        first = portions[0]
        return Resolution(module=name, kind=ModuleKind.NAMESPACE, file=None, path_entry=first.path_entry,
                          path_index=first.path_index,
                          search_locations=tuple(p.search_locations[0] for p in portions))
    return None


def find_module(fs: RootFS, sys_path: tuple[PathEntry, ...], name: str, version: str,
                triplet: str = "x86_64-linux-gnu", finders: tuple = ()) -> tuple[Resolution | None, list[Resolution]]:
    """The resolution of dotted ``name`` and, for its top-level part, every sys.path entry's candidate.

    Submodules are searched in the parent package's directories, as ``__path__`` directs.  A
    top-level name that no sys.path entry holds goes to the editable installs' ``finders``
    (:class:`~forensics.imports.model.EditableFinder`, after the path finder on sys.meta_path);
    a namespace portion on sys.path is found first and hides them, as in CPython.
    """
    parts = name.split(".")
    locations = [(i, e.path) for i, e in enumerate(sys_path) if e.exists]
    cands = find_candidates(fs, locations, parts[0], parts[0], version, triplet)
    current = _pick(cands, parts[0])
    if finders and current is None:
        current = find_in_finders(fs, finders, parts[0], version, triplet)
    for depth in range(1, len(parts)):
        if current is None or not current.search_locations:
            return None, cands
        sub = ".".join(parts[: depth + 1])
        sub_locs = [(current.path_index, d) for d in current.search_locations]
        current = _pick(find_candidates(fs, sub_locs, sub, parts[depth], version, triplet), sub)
    return current, cands
