"""Editable installs: the import finders their ``.pth`` lines put on ``sys.meta_path``, read statically.

``pip install -e`` of a setuptools project with a flat layout writes
``__editable__.NAME-VER.pth`` (``import __editable___NAME_VER_finder; ….install()``)
and a finder module whose ``MAPPING`` sends each top-level name to a source tree;
hatchling's ``editables`` writes ``_NAME.pth`` / ``_NAME.py`` calling
``RedirectingFinder.map_module(name, file)``.  Both finders are appended to
``sys.meta_path``, so they answer only for a top-level name that no ``sys.path``
entry holds.  Nothing here imports or executes the image's code: the finder
module is parsed with :mod:`ast` and only literal values are taken.

:func:`parse_finder_module` is pure; :func:`find_in_finders` asks the root.
"""
from __future__ import annotations

import ast
import re

from .model import EditableFinder, ModuleKind, Resolution
from .pysource import parse_source
from .rootfs import RootFS, norm
from .suffixes import all_suffixes

__all__ = ["imported_module", "parse_finder_module", "find_in_finders"]

_IMPORT = re.compile(r"^import\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:;|$)")
_MAX_SOURCE = 1 << 20
_MAX_NAMES = 10_000


def imported_module(line: str) -> str | None:
    """The module a .pth ``import`` line imports first.

    >>> imported_module("import __editable___nvitop_1_7_1_finder; __editable___nvitop_1_7_1_finder.install()")
    '__editable___nvitop_1_7_1_finder'
    >>> imported_module("import sys; sys.path.insert(0, '/x')") is None
    True
    """
    m = _IMPORT.match(line.strip())
    if not m or m.group(1) in ("sys", "os", "site"):
        return None
    return m.group(1)


def parse_finder_module(source: str, *, pth: str, module_file: str) -> EditableFinder | None:
    """The finder an editable install's module installs, or None if it is not one we can read.

    setuptools: module-level ``MAPPING = {name: path}`` (literal), ``NAMESPACES``, ``PATH_PLACEHOLDER``
    and an ``install()`` function.  editables: ``….map_module('name', '/path/file.py')`` calls.

    >>> src = "MAPPING: dict[str, str] = {'nvitop': '/src/nvitop/nvitop'}\\nNAMESPACES = {}\\n" \\
    ...       "PATH_PLACEHOLDER = '__editable__.nvitop-1.7.1.finder' + '.__path_hook__'\\ndef install(): pass\\n"
    >>> f = parse_finder_module(src, pth="/s/x.pth", module_file="/s/f.py")
    >>> f.style, f.mapping, f.path_placeholder
    ('setuptools', (('nvitop', '/src/nvitop/nvitop'),), None)
    >>> src = "from editables.redirector import RedirectingFinder as F\\nF.install()\\n" \\
    ...       "F.map_module('nvitop', '/src/nvitop/nvitop/__init__.py')\\n"
    >>> parse_finder_module(src, pth="/s/_nvitop.pth", module_file="/s/_nvitop.py").mapping
    (('nvitop', '/src/nvitop/nvitop/__init__.py'),)
    """
    tree = parse_source(source[:_MAX_SOURCE], module_file)
    if tree is None:
        return None
    assigned: dict[str, ast.expr] = {}
    functions: set[str] = set()
    redirections: list[tuple[str, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            assigned[node.target.id] = node.value
        elif isinstance(node, ast.FunctionDef):
            functions.add(node.name)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            strs = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            is_map = isinstance(call.func, ast.Attribute) and call.func.attr == "map_module"
            if is_map and len(call.args) == len(strs) == 2:
                redirections.append((strs[0], strs[1]))
    if redirections:
        return EditableFinder(style="editables", pth=pth, module_file=module_file,
                              mapping=tuple(redirections[:_MAX_NAMES]))
    if "MAPPING" not in assigned or "install" not in functions:
        return None
    mapping = _literal(assigned["MAPPING"])
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        return None
    namespaces = _literal(assigned.get("NAMESPACES")) if "NAMESPACES" in assigned else {}
    placeholder = None
    if isinstance(namespaces, dict) and namespaces:
        placeholder = _string_sum(assigned.get("PATH_PLACEHOLDER"))
    return EditableFinder(style="setuptools", pth=pth, module_file=module_file,
                          mapping=tuple(list(mapping.items())[:_MAX_NAMES]), path_placeholder=placeholder)


def _literal(node: ast.expr | None):
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # not a literal: unknown
        return None


def _string_sum(node: ast.expr | None) -> str | None:
    """A string constant or a ``+`` of string constants (setuptools' PATH_PLACEHOLDER)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_sum(node.left), _string_sum(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _with_suffix(path: str, suffix: str) -> str:
    """``pathlib.Path.with_suffix``: the last dot of the name, if any, is replaced."""
    head, _, name = path.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return f"{head}/{stem}{suffix}" if head else stem + suffix


def find_in_finders(fs: RootFS, finders: tuple[EditableFinder, ...], name: str, version: str,
                    triplet: str = "x86_64-linux-gnu") -> Resolution | None:
    """The module a top-level ``name`` resolves to through the editable finders, in meta_path order."""
    for finder in finders:
        target = dict(finder.mapping).get(name)
        if target is None:
            continue
        if finder.style == "editables":  # spec_from_file_location(name, file)
            if not fs.is_file(target):
                continue
            files = [target]
        else:  # setuptools' _find_spec: DIR/__init__.py, then DIR with each module suffix
            files = [f"{target.rstrip('/')}/__init__.py"] + [_with_suffix(target, s)
                                                             for s in all_suffixes(version, triplet)]
        for f in files:
            f = norm(f)
            if not fs.is_file(f):
                continue
            package = f.rsplit("/", 1)[-1].startswith("__init__.")
            kind = ModuleKind.PACKAGE if package else (
                ModuleKind.EXTENSION if f.endswith(".so") else ModuleKind.BYTECODE if f.endswith(".pyc")
                else ModuleKind.MODULE)
            return Resolution(module=name, kind=kind, file=f, path_entry=finder.module_file, path_index=-1,
                              search_locations=(f.rsplit("/", 1)[0],) if package else (), finder=finder.pth)
    return None
