"""Python source from an image, parsed without trusting it: bounded, and every parser failure is None.

An image's ``.py`` files are input: a file of ten thousand nested brackets makes
:func:`ast.parse` raise ``RecursionError`` or ``MemoryError``, not ``SyntaxError``.
:func:`parse_source` is the one place the subpackage parses such text.
"""
from __future__ import annotations

import ast

__all__ = ["MAX_SOURCE", "parse_source"]

MAX_SOURCE = 1 << 20  # bytes of one source file the analysis reads


def parse_source(text: str | None, filename: str = "<image>") -> ast.Module | None:
    """The module's AST, or None when it is absent, too large or does not parse.

    >>> parse_source("x = (" * 100_000) is None
    True
    >>> type(parse_source("import sys")).__name__
    'Module'
    """
    if text is None or len(text) > MAX_SOURCE:
        return None
    try:
        return ast.parse(text, filename=filename)
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # the caller says "does not parse"
        return None
