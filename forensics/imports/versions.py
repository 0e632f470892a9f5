"""Versions, specifiers, requirement lines and environment markers (the parts of PEP 440/508 we need),
and a module's ``__version__`` read statically with :mod:`ast`, never by importing it.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .pysource import parse_source

__all__ = [
    "parse_version",
    "version_key",
    "specifier_contains",
    "Requirement",
    "parse_requirement",
    "evaluate_marker",
    "find_static_version",
    "normalize_name",
]

_VERSION_RE = re.compile(
    r"""^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d+)?)?
    (?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?))?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class _Version:
    epoch: int
    release: tuple[int, ...]
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None

    def key(self):
        rel = list(self.release)
        while len(rel) > 1 and rel[-1] == 0:
            rel.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre = (-_INF, 0)  # 1.0.dev1 < 1.0a1
        else:
            pre = self.pre if self.pre is not None else (_INF, 0)
        post = self.post if self.post is not None else -_INF
        dev = self.dev if self.dev is not None else _INF
        return (self.epoch, tuple(rel), pre, post, dev)


def parse_version(text: str) -> _Version | None:
    """Parse a PEP 440 version; None for anything else.

    >>> parse_version("12.571.0a0").pre, parse_version("1.7.1").release
    ((0, 0), (1, 7, 1))
    """
    m = _VERSION_RE.match(text or "")
    if not m:
        return None
    pre = (_PRE_ORDER[m.group("pre_l").lower()], int(m.group("pre_n") or 0)) if m.group("pre_l") else None
    post_n = m.group("post_n1") or m.group("post_n2")
    post = int(post_n) if post_n else (0 if m.group("post_l") else None)
    dev = int(m.group("dev_n") or 0) if m.group("dev_l") else None
    return _Version(int(m.group("epoch") or 0), tuple(int(x) for x in m.group("release").split(".")), pre, post, dev)


def version_key(text: str):
    v = parse_version(text)
    return v.key() if v else None


def _compare(op: str, have: str, want: str) -> bool:
    if op == "===":
        return have == want
    if want.endswith(".*") and op in ("==", "!="):
        hv = parse_version(have)
        wv = parse_version(want[:-2])
        if hv is None or wv is None:
            return False
        n = len(wv.release)
        match = hv.epoch == wv.epoch and hv.release[:n] + (0,) * (n - len(hv.release[:n])) == wv.release
        return match if op == "==" else not match
    hk, wk = version_key(have), version_key(want)
    if hk is None or wk is None:
        return False
    if op == "~=":
        wv = parse_version(want)
        if wv is None or len(wv.release) < 2:
            return False
        prefix = ".".join(str(x) for x in wv.release[:-1]) + ".*"
        return hk >= wk and _compare("==", have, prefix)
    return {"==": hk == wk, "!=": hk != wk, "<": hk < wk, "<=": hk <= wk, ">": hk > wk, ">=": hk >= wk}[op]


_CLAUSE_RE = re.compile(r"^\s*(===|~=|==|!=|<=|>=|<|>)\s*([^\s,]+)\s*$")


def specifier_contains(specifier: str, version: str) -> bool:
    """Whether ``version`` satisfies every clause of ``specifier`` (pre-releases count, as in pip check).

    >>> specifier_contains("<12.571.0a0,>=11.450.51", "12.575.51"), specifier_contains("~=1.7.1", "1.7.3")
    (False, True)
    """
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        m = _CLAUSE_RE.match(clause)
        if not m or not _compare(m.group(1), version, m.group(2)):
            return False
    return True


def normalize_name(name: str) -> str:
    """PEP 503 normalisation: ``Nvidia_ML.py`` -> ``nvidia-ml-py``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    name: str
    specifier: str
    marker: str | None
    text: str


# name, [extras], @ url (skipped), (specifier), ; marker
_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(?:@\s*\S+)?"
                     r"\s*\(?\s*([^;()]*?)\s*\)?\s*(?:;\s*(.*))?$")


def parse_requirement(text: str) -> Requirement | None:
    """``nvidia-ml-py<12.571.0a0,>=11.450.51`` -> Requirement; None when unparseable."""
    m = _REQ_RE.match(text)
    if not m:
        return None
    return Requirement(name=normalize_name(m.group(1)), specifier=m.group(3).replace(" ", ""),
                       marker=(m.group(4) or None), text=text.strip())


_TOKEN_RE = re.compile(r"\s*(\(|\)|===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b|and\b|or\b|'[^']*'|\"[^\"]*\"|[A-Za-z_.]+)")


def evaluate_marker(marker: str, env: dict[str, str]) -> bool | None:
    """Evaluate a PEP 508 marker against ``env``; None when it depends on an extra or cannot be read.

    >>> evaluate_marker('platform_system == "Windows"', {"platform_system": "Linux"})
    False
    >>> evaluate_marker('python_version >= "3.8" and extra == "x"', {"python_version": "3.11"}) is None
    True
    """
    tokens: list[str] = []
    pos = 0
    while pos < len(marker):
        m = _TOKEN_RE.match(marker, pos)
        if not m:
            return None
        tokens.append(m.group(1))
        pos = m.end()
        if not marker[pos:].strip():
            break
    if any(t == "extra" for t in tokens):
        return None
    try:
        return _MarkerParser(tokens, env).expr()
    except (IndexError, ValueError, KeyError):  # a marker this reader cannot follow: undecided (None)
        return None


class _MarkerParser:
    """Recursive descent over a marker's tokens: ``expr := conj ("or" conj)*``, ``conj := atom ("and" atom)*``,
    ``atom := "(" expr ")" | value op value``; raises IndexError/ValueError on what it cannot read."""

    def __init__(self, tokens: list[str], env: dict[str, str]) -> None:
        self.tokens, self.env, self.i = tokens, env, 0

    def value(self, tok: str) -> str | None:
        if tok[:1] in "'\"":
            return tok[1:-1]
        return self.env.get(tok)

    def atom(self) -> bool:
        tokens = self.tokens
        if tokens[self.i] == "(":
            self.i += 1
            r = self.expr()
            self.i += 1  # ')'
            return r
        left, op, right = self.value(tokens[self.i]), tokens[self.i + 1], self.value(tokens[self.i + 2])
        self.i += 3
        if left is None or right is None:
            raise ValueError("unknown marker variable")
        op = " ".join(op.split())
        if op == "in":
            return left in right
        if op == "not in":
            return left not in right
        if version_key(left) is not None and version_key(right) is not None and op != "===":
            return _compare(op, left, right)
        return {"==": left == right, "!=": left != right, "===": left == right}.get(op, False)

    def conj(self) -> bool:
        r = self.atom()
        while self.i < len(self.tokens) and self.tokens[self.i] == "and":
            self.i += 1
            r = self.atom() and r
        return r

    def expr(self) -> bool:
        r = self.conj()
        while self.i < len(self.tokens) and self.tokens[self.i] == "or":
            self.i += 1
            r = self.conj() or r
        return r


# -- __version__ by ast -------------------------------------------------------------------------


def _assigned_string(tree: ast.Module, names: tuple[str, ...]) -> str | None:
    for node in tree.body:
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name) and t.id in names:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
                if isinstance(value, ast.Name):  # __version__ = version
                    return _assigned_string(tree, (value.id,))
    return None


def _imported(tree: ast.Module, name: str) -> tuple[int, str | None, str] | None:
    """(level, module, original name) of ``from X import Y [as name]``."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return node.level, node.module, alias.name
    return None


def find_static_version(read, file: str, package: str, package_dirs: tuple[str, ...], _depth: int = 0,
                        _name: str = "__version__") -> str | None:
    """``__version__`` of a module read with ast: a literal, or one hop through ``from .version import``.

    :param read: ``read(path) -> str | None`` over the root
    :param file: the module's file (a package's ``__init__.py``)
    :param package: the module's dotted name (``nvitop``)
    :param package_dirs: the package's directories (where ``.version`` lives)
    """
    if _depth > 3 or not file.endswith(".py"):
        return None
    text = read(file)
    if text is None:
        return None
    tree = parse_source(text, file)
    if tree is None:
        return None
    found = _assigned_string(tree, (_name,))
    if found is not None:
        return found
    imp = _imported(tree, _name)
    if imp is None:
        return None
    level, module, original = imp
    top = package.split(".")[0]
    if level == 0:
        if not module or module.split(".")[0] != top:
            return None
        inside = module == package or module.startswith(package + ".")
        rel_parts = module.split(".")[len(package.split(".")):] if inside else None
        if rel_parts is None:
            return None
    else:
        rel_parts = (module or "").split(".") if module else []
        is_pkg = file.endswith("/__init__.py")
        up = level - 1 if is_pkg else level  # from a plain module, level 1 is its package
        if up > 0:
            return None
    for d in package_dirs:
        base = d.rstrip("/")
        if not rel_parts:
            continue
        stem = base + "/" + "/".join(rel_parts)
        for cand in (stem + ".py", stem + "/__init__.py"):
            if read(cand) is not None:
                return find_static_version(read, cand, package + "." + ".".join(rel_parts),
                                           (cand.rsplit("/", 1)[0],), _depth + 1, original)
    return None
