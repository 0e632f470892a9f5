"""Editable installs' finders: parsed from their modules (never run) and consulted after sys.path."""
from __future__ import annotations

from pathlib import Path

from forensics.imports.finders import find_in_finders, imported_module, parse_finder_module
from forensics.imports.model import ModuleKind, PathEntry, PathOrigin
from forensics.imports.resolve import find_module
from forensics.imports.rootfs import DirFS

SETUPTOOLS = """from __future__ import annotations
import sys
MAPPING: dict[str, str] = {mapping!r}
NAMESPACES: dict[str, list[str]] = {namespaces!r}
PATH_PLACEHOLDER = '__editable__.pkg-1.0.finder' + ".__path_hook__"
def install():
    if not any(finder == _EditableFinder for finder in sys.meta_path):
        sys.meta_path.append(_EditableFinder)
"""


def finder_source(mapping, namespaces=None):
    return SETUPTOOLS.format(mapping=mapping, namespaces=namespaces or {})


def test_setuptools_finder_mapping_and_placeholder():
    f = parse_finder_module(finder_source({"nvitop": "/src/nvitop/nvitop"}), pth="/s/a.pth", module_file="/s/f.py")
    assert f.style == "setuptools" and f.mapping == (("nvitop", "/src/nvitop/nvitop"),) and f.path_placeholder is None
    f = parse_finder_module(finder_source({"ns": "/src/ns"}, {"ns": []}), pth="/s/a.pth", module_file="/s/f.py")
    assert f.path_placeholder == "__editable__.pkg-1.0.finder.__path_hook__"


def test_modules_that_are_not_finders_or_not_literal_are_ignored():
    assert parse_finder_module("import os\nos.system('id')\n", pth="p", module_file="m") is None
    # a MAPPING computed at run time is not evaluated
    assert parse_finder_module("MAPPING = dict(a='/x')\ndef install(): pass\n", pth="p", module_file="m") is None
    assert parse_finder_module("MAPPING = {'a': 1}\ndef install(): pass\n", pth="p", module_file="m") is None
    assert parse_finder_module("MAPPING = {'a': '/x'}\n", pth="p", module_file="m") is None  # no install()
    assert parse_finder_module("def (:\n", pth="p", module_file="m") is None
    assert parse_finder_module("F.map_module(name, path)\n", pth="p", module_file="m") is None


def test_imported_module():
    assert imported_module("import _nvitop") == "_nvitop"
    assert imported_module("import os; os.environ.setdefault('X', '1')") is None
    assert imported_module("# import x") is None


def test_resolution_through_the_finders(tmp_path: Path):
    root = tmp_path / "root"
    (root / "src/pkg/pkg").mkdir(parents=True)
    (root / "src/pkg/pkg/__init__.py").write_text("__version__ = '1.0'\n")
    (root / "src/mod.py").write_text("")
    (root / "src/file_target.py").write_text("")
    (root / "site").mkdir()
    fs = DirFS(str(root))
    st = parse_finder_module(finder_source({"pkg": "/src/pkg/pkg", "mod": "/src/mod", "gone": "/src/gone"}),
                             pth="/site/__editable__.pkg-1.0.pth", module_file="/site/__editable___pkg_1_0_finder.py")
    ed = parse_finder_module("import F\nF.map_module('other', '/src/file_target.py')\n",
                             pth="/site/_other.pth", module_file="/site/_other.py")
    finders = (st, ed)
    pkg = find_in_finders(fs, finders, "pkg", "3.11")
    assert (pkg.kind, pkg.file, pkg.search_locations) == (
        ModuleKind.PACKAGE, "/src/pkg/pkg/__init__.py", ("/src/pkg/pkg",))
    assert pkg.finder == "/site/__editable__.pkg-1.0.pth" and pkg.path_index == -1
    assert find_in_finders(fs, finders, "mod", "3.11").file == "/src/mod.py"
    assert find_in_finders(fs, finders, "other", "3.11").file == "/src/file_target.py"
    assert find_in_finders(fs, finders, "gone", "3.11") is None
    sys_path = (PathEntry(path="/site", origin=PathOrigin.SITE, exists=True),)
    # sys.path first: a submodule is found through the package's directory
    winner, _ = find_module(fs, sys_path, "pkg", "3.11", finders=finders)
    assert winner.file == "/src/pkg/pkg/__init__.py"
    # a regular package or a namespace portion on sys.path hides the finder, as PathFinder comes first
    (root / "site/pkg").mkdir()
    winner, _ = find_module(fs, sys_path, "pkg", "3.11", finders=finders)
    assert winner.kind is ModuleKind.NAMESPACE and winner.finder is None
    (root / "site/pkg/__init__.py").write_text("")
    winner, _ = find_module(fs, sys_path, "pkg", "3.11", finders=finders)
    assert winner.file == "/site/pkg/__init__.py"
