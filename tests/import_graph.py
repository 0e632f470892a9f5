"""The package's import graph as its source states it: every ``import`` of a forensics module,
at module level or inside a function (a lazy import is still an arrow).

``python -m tests.import_graph`` prints the modules by floor (floor 0 imports nothing from
forensics; floor n imports only modules below n) and the arrows between the package's units.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

__all__ = ["PACKAGE_DIR", "read_graph", "find_cycles", "floors", "unit_of", "module_files", "string_literals"]

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "forensics"


def module_files(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    """``{dotted module name: its file}`` for every module of the package under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _target(modules: dict[str, Path], name: str) -> str | None:
    """The forensics module ``name`` is, or lies in (``forensics.x.func`` -> ``forensics.x``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _run_at_import(tree: ast.Module) -> list[ast.AST]:
    """The nodes a module runs when it is imported: its body, its classes' bodies and its branches, not the
    bodies of its functions nor ``if TYPE_CHECKING:`` blocks."""
    out: list[ast.AST] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING":
            todo += stmt.orelse
            continue
        out.append(stmt)
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += [s for s in getattr(stmt, field, []) if isinstance(s, ast.stmt)]
        for handler in getattr(stmt, "handlers", []):
            todo += handler.body
    return out


def read_graph(root: Path = PACKAGE_DIR, *, at_import: bool = False) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` for every module of the package under ``root``; ``at_import``: only the
    imports a module makes when it is imported (none inside its functions)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in (_run_at_import(tree) if at_import else ast.walk(tree)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [f"{prefix}.{a.name}" for a in node.names]
            for name in names:
                target = _target(modules, name)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string constant of a module but its docstrings, an f-string's constant parts
    each on its own: what the code spells, not what it documents."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 0 without forensics imports, else one above its highest import (graph acyclic)."""
    out: dict[str, int] = {}

    def floor(m: str) -> int:
        if m not in out:
            out[m] = 1 + max((floor(d) for d in graph[m]), default=-1)
        return out[m]

    for m in graph:
        floor(m)
    return out


def unit_of(module: str) -> str:
    """The unit a module belongs to: its top-level module or subpackage (``forensics.capture.pod`` -> ``capture``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def main() -> None:
    graph = read_graph()
    cycles = find_cycles(graph)
    if cycles:
        print("cycles:", cycles)
        return
    by_floor: dict[int, list[str]] = defaultdict(list)
    for m, f in floors(graph).items():
        by_floor[f].append(m.removeprefix("forensics."))
    for f in sorted(by_floor):
        print(f"{f:>2}  {' '.join(sorted(by_floor[f]))}")
    units: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            if unit_of(a) != unit_of(b):
                units[unit_of(a)].add(unit_of(b))
    print()
    for u in sorted(units):
        print(f"{u} -> {' '.join(sorted(units[u]))}")


if __name__ == "__main__":
    main()
