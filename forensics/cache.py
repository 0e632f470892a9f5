"""forensics' cache directory (stack venvs, gdb's DWARF index, built reproducers).

``$FORENSICS_CACHE``, else ``$XDG_CACHE_HOME/forensics``, else ``~/.cache/forensics``.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["cache_dir", "cache_path"]


def cache_dir() -> Path:
    """The cache directory (not created here)."""
    from pathlib import Path

    return Path(cache_path())


def cache_path(*parts: str) -> str:
    """:func:`cache_dir` (joined with ``parts``) as a string, for the readers of one analysis: importing
    pathlib (with urllib.parse and ipaddress) cost a heap-corruption analysis more than its heap did."""
    if os.environ.get("FORENSICS_CACHE"):
        root = os.environ["FORENSICS_CACHE"]
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache"), "forensics")
    return os.path.join(root, *parts)
