"""``sitecustomize`` and ``usercustomize``, read as the editable finders are read: with ast, never run.

``site`` imports these two modules after the site directories and their ``.pth``
files are on sys.path (Debian ships ``/etc/python3.X/sitecustomize.py``, linked
from the standard library), so a line such as ``sys.path.insert(0, '/opt/x')``
decides what imports before the application runs.  :func:`evaluate_customize`
walks the module's statements in order and applies what it can decide:

* ``sys.path.insert(N, P)``, ``.append(P)``, ``.extend([...])``, ``.remove(P)``,
  ``sys.path[:0] = [...]``, ``sys.path += [...]``, ``sys.path = [...]``,
  ``site.addsitedir(P)`` -- with P a string literal, a name bound to one, a ``+``
  of such, or ``os.path.join`` of such;
* imports: a standard-library module is harmless; one that does not resolve
  raises ImportError (a ``try``/``except ImportError`` then runs its handler, as
  Debian's own apport hook does); one that resolves outside the standard library
  runs code nobody read;
* anything else that touches the import system (``sys``, ``site``,
  ``importlib``, ``exec``, ``os.chdir``, a call into such a module or into a
  function the file defines) is *unevaluated*: the static verdict is then
  uncertain and says so, and ``--execute`` gives the ground truth.
"""
from __future__ import annotations

import ast
import posixpath
import sys
from dataclasses import dataclass, field
from collections.abc import Callable

__all__ = ["CustomizeEffect", "evaluate_customize", "builtin_or_stdlib"]

# what may change what imports: the import system's state, and ways to run code
_RISKY_MODULES = {"site", "importlib", "builtins", "runpy", "pkgutil", "zipimport", "imp"}
_SYS_IMPORT_STATE = {"path", "meta_path", "path_hooks", "path_importer_cache", "modules", "__dict__"}
_RISKY_CALLS = {"__import__", "exec", "eval", "compile", "setattr", "delattr", "globals", "vars", "__builtins__"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_MAX_STATEMENTS = 10_000


class _ImportFailed(Exception):
    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.module = module


class _Raised(Exception):
    """An exception the module would raise at start-up (uncaught: site reports it, the rest does not run)."""


@dataclass
class CustomizeEffect:
    """What evaluating one customize module did to sys.path, and what it could not decide."""

    edits: list[str] = field(default_factory=list)  # the sys.path edits applied, as written
    unevaluated: list[str] = field(default_factory=list)  # "line N: <code>" whose effect was not decided
    runs: list[str] = field(default_factory=list)  # non-stdlib modules it imports (their code runs)
    stopped: str | None = None  # why the module stops early at start-up (an uncaught exception)


def _line(node: ast.AST, source_lines: list[str]) -> str:
    n = getattr(node, "lineno", 0)
    text = source_lines[n - 1].strip() if 0 < n <= len(source_lines) else ast.dump(node)[:80]
    return f"line {n}: {text[:160]}"


class _Evaluator:
    def __init__(self, path: list[str], addsitedir: Callable[[str], None], classify: Callable[[str], str | None],
                 source: str) -> None:
        self.path = path
        self.addsitedir = addsitedir
        self.classify = classify  # module name -> "stdlib" | "code" | None (not importable)
        self.lines = source.splitlines()
        self.effect = CustomizeEffect()
        self.consts: dict[str, object] = {}  # names bound to str / list-of-str values
        self.aliases: dict[str, str] = {}  # local name -> dotted module or module.attr it stands for
        self.running: set[str] = set()  # local names bound to modules whose code runs
        self.functions: dict[str, ast.AST] = {}
        self.steps = 0

    # -- names and values ---------------------------------------------------------------------
    def dotted(self, node: ast.AST) -> str | None:
        """``sys.path.insert`` for an attribute chain, local import names translated."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def value(self, node: ast.AST) -> object:
        """A str, int or list of str the expression is known to hold; raises KeyError when unknown."""
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.value(node.operand)
            if isinstance(v, int):
                return -v
        if isinstance(node, ast.Name) and node.id in self.consts:
            return self.consts[node.id]
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(e) for e in node.elts]
            if all(isinstance(i, str) for i in items):
                return items
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.value(node.left), self.value(node.right)
            if isinstance(a, str) and isinstance(b, str):
                return a + b
            if isinstance(a, list) and isinstance(b, list):
                return a + b
        if isinstance(node, ast.Call) and not node.keywords and self.dotted(node.func) == "os.path.join":
            parts = [self.value(a) for a in node.args]
            strs = [p for p in parts if isinstance(p, str)]
            if strs and len(strs) == len(parts):
                return posixpath.join(*strs)
        raise KeyError("unknown value")

    @staticmethod
    def risky(dotted: str) -> bool:
        parts = dotted.split(".")
        if parts[0] == "sys":
            return len(parts) > 1 and parts[1] in _SYS_IMPORT_STATE
        return parts[0] in _RISKY_MODULES or dotted in ("os.chdir", "os.fchdir")

    def touches(self, node: ast.AST) -> bool:
        """May this code change what imports (or run code nobody read)?"""
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute):
                d = self.dotted(n)
                if d and self.risky(d):
                    return True
            elif isinstance(n, ast.Name):
                if n.id in _RISKY_CALLS or n.id in self.running or n.id in self.functions:
                    return True
                if self.risky(self.aliases.get(n.id, "")) and n.id in self.aliases:
                    return True
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                if any(self.classify(m) == "code" for m in names if m) or (isinstance(n, ast.ImportFrom) and n.level):
                    return True
        return False

    # -- statements -----------------------------------------------------------------------------
    def run(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.steps += 1
            if self.steps > _MAX_STATEMENTS:
                self.unevaluated(stmt, "too many statements to follow")
                return
            self.statement(stmt)

    def unevaluated(self, node: ast.AST, why: str = "") -> None:
        self.effect.unevaluated.append(_line(node, self.lines) + (f" ({why})" if why else ""))

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, (ast.Pass, ast.Global, ast.Nonlocal)) or (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self.import_statement(stmt)
            return
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self.try_statement(stmt)  # type: ignore[arg-type]
            return
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if self.touches(stmt):
                self.functions[stmt.name] = stmt
            return
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self.call(stmt, stmt.value)
            return
        if isinstance(stmt, ast.Assign):
            self.assign(stmt, stmt.targets, stmt.value)
            return
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.assign(stmt, [stmt.target], stmt.value)
            return
        if isinstance(stmt, ast.AugAssign):
            self.aug_assign(stmt)
            return
        if isinstance(stmt, ast.If):
            self.if_statement(stmt)
            return
        if isinstance(stmt, ast.Raise):
            raise _Raised(_line(stmt, self.lines))
        if self.touches(stmt):
            self.unevaluated(stmt)

    def import_statement(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                self.import_module(stmt, a.name)
                local = a.asname or a.name.split(".")[0]
                self.aliases[local] = a.name if a.asname else a.name.split(".")[0]
                if self.classify(a.name) == "code":
                    self.running.add(local)
            return
        if stmt.level:
            self.unevaluated(stmt, "a relative import")
            return
        module = stmt.module or ""
        self.import_module(stmt, module)
        for a in stmt.names:
            local = a.asname or a.name
            self.aliases[local] = f"{module}.{a.name}"
            if self.classify(module) == "code":
                self.running.add(local)

    def aug_assign(self, stmt: ast.AugAssign) -> None:
        if self.dotted(stmt.target) == "sys.path" and isinstance(stmt.op, ast.Add):
            try:
                items = self.value(stmt.value)
            except KeyError:
                items = None
            if isinstance(items, list):
                self.path.extend(items)
                self.effect.edits.append(_line(stmt, self.lines))
                return
        if self.touches(stmt):
            self.unevaluated(stmt)

    def if_statement(self, stmt: ast.If) -> None:
        try:
            test = self.value(stmt.test)
        except KeyError:
            test = None
        if isinstance(stmt.test, ast.Constant):
            self.run(stmt.body if stmt.test.value else stmt.orelse)
        elif test is not None:
            self.run(stmt.body if test else stmt.orelse)
        elif self.touches(stmt):
            self.unevaluated(stmt, "a condition not evaluated")

    def import_module(self, stmt: ast.stmt, name: str) -> None:
        kind = self.classify(name)
        if kind is None:
            raise _ImportFailed(name)
        if kind == "code":
            self.effect.runs.append(name)
            self.unevaluated(stmt, f"imports {name}, whose code runs at start-up and was not read")

    def try_statement(self, stmt: ast.Try) -> None:
        try:
            self.run(stmt.body)
        except _ImportFailed as e:
            handler = next((h for h in stmt.handlers if h.type is None or any(
                n in _IMPORT_ERRORS for n in self._handler_names(h.type))), None)
            if handler is None:
                raise
            if handler.name:
                self.consts.pop(handler.name, None)
            self.run(handler.body)
            del e
        else:
            self.run(stmt.orelse)
        finally:
            self.run(stmt.finalbody)

    @staticmethod
    def _handler_names(node: ast.AST) -> list[str]:
        elts = node.elts if isinstance(node, ast.Tuple) else [node]
        return [e.id if isinstance(e, ast.Name) else e.attr if isinstance(e, ast.Attribute) else "" for e in elts]

    def call(self, stmt: ast.stmt, call: ast.Call) -> None:
        name = self.dotted(call.func)
        if name in ("sys.path.insert", "sys.path.append", "sys.path.extend", "sys.path.remove", "site.addsitedir") \
                and not call.keywords:
            try:
                args = [self.value(a) for a in call.args]
            except KeyError:
                self.unevaluated(stmt, "an argument that is not a literal")
                return
            if self.apply(name, args, stmt):
                self.effect.edits.append(_line(stmt, self.lines))
                return
            self.unevaluated(stmt)
            return
        if isinstance(call.func, ast.Name) and call.func.id in self.functions:
            self.unevaluated(stmt, f"calls {call.func.id}(), which touches the import system")
            return
        if self.touches(call):
            self.unevaluated(stmt)

    def apply(self, name: str, args: list, stmt: ast.stmt) -> bool:
        if name == "sys.path.insert" and len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
            i = args[0]
            self.path.insert(i if i >= 0 else max(0, len(self.path) + i), args[1])
            return True
        if name == "sys.path.append" and len(args) == 1 and isinstance(args[0], str):
            self.path.append(args[0])
            return True
        if name == "sys.path.extend" and len(args) == 1 and isinstance(args[0], list):
            self.path.extend(args[0])
            return True
        if name == "sys.path.remove" and len(args) == 1 and isinstance(args[0], str):
            if args[0] not in self.path:
                raise _Raised(_line(stmt, self.lines) + " (ValueError: not on sys.path)")
            self.path.remove(args[0])
            return True
        if name == "site.addsitedir" and len(args) == 1 and isinstance(args[0], str):
            self.addsitedir(args[0])
            return True
        return False

    def assign(self, stmt: ast.stmt, targets: list[ast.expr], value: ast.expr) -> None:
        for t in targets:
            if self.dotted(t) == "sys.path" or (isinstance(t, ast.Subscript) and self.dotted(t.value) == "sys.path"):
                try:
                    items = self.value(value)
                except KeyError:
                    items = None
                if not isinstance(items, list):
                    self.unevaluated(stmt, "sys.path set to a value not evaluated")
                    return
                if isinstance(t, ast.Subscript):
                    sl = t.slice
                    if not isinstance(sl, ast.Slice) or sl.step is not None:
                        self.unevaluated(stmt)
                        return
                    try:
                        lo = self.value(sl.lower) if sl.lower is not None else None
                        hi = self.value(sl.upper) if sl.upper is not None else None
                    except KeyError:
                        self.unevaluated(stmt)
                        return
                    if not ((lo is None or isinstance(lo, int)) and (hi is None or isinstance(hi, int))):
                        self.unevaluated(stmt)
                        return
                    self.path[lo:hi] = items
                else:
                    self.path[:] = items
                self.effect.edits.append(_line(stmt, self.lines))
                return
            if isinstance(t, ast.Name):
                try:
                    self.consts[t.id] = self.value(value)
                except KeyError:
                    self.consts.pop(t.id, None)
                    if self.touches(value):
                        self.running.add(t.id)  # an alias of something risky (x = sys.path)
            elif self.touches(t):
                self.unevaluated(stmt)
                return
        if self.touches(value) and not isinstance(value, (ast.Constant, ast.List, ast.Tuple)):
            if any(isinstance(t, ast.Name) and t.id in self.running for t in targets):
                return  # recorded as risky: a later use is unevaluated
            self.unevaluated(stmt)


def evaluate_customize(tree: ast.Module, source: str, path: list[str], *, addsitedir: Callable[[str], None],
                       classify: Callable[[str], str | None]) -> CustomizeEffect:
    """Apply a customize module's decidable sys.path edits to ``path`` (in place), in statement order.

    :param tree: the parsed module
    :param source: its text (for the lines quoted in the result)
    :param path: sys.path as site left it before importing the module; edited in place
    :param addsitedir: what ``site.addsitedir(P)`` does (add P and process its .pth files)
    :param classify: a module name -> ``"stdlib"`` (harmless), ``"code"`` (resolves outside the standard
        library: its code would run) or None (does not import)

    >>> p = ["/usr/lib/python3.11"]
    >>> src = "import sys\\ntry:\\n    import apport_python_hook\\nexcept ImportError:\\n    pass\\n" \\
    ...       "sys.path.insert(0, '/opt/override')\\n"
    >>> e = evaluate_customize(ast.parse(src), src, p, addsitedir=p.append,
    ...                        classify=lambda m: "stdlib" if m == "sys" else None)
    >>> p, e.edits, e.unevaluated
    (['/opt/override', '/usr/lib/python3.11'], ["line 6: sys.path.insert(0, '/opt/override')"], [])
    """
    ev = _Evaluator(path, addsitedir, classify, source)
    try:
        ev.run(tree.body)
    except _ImportFailed as e:
        ev.effect.stopped = f"import {e.module} fails (ImportError): the rest of the module does not run"
    except _Raised as e:
        ev.effect.stopped = f"{e}: an uncaught exception; the rest of the module does not run"
    except RecursionError:
        ev.effect.unevaluated.append("the module is nested too deeply to follow")
    return ev.effect


def builtin_or_stdlib(name: str) -> bool:
    """Whether a module that no sys.path entry holds is built into the interpreter (``sys``, ``_io``)."""
    top = name.split(".")[0]
    return top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ())
