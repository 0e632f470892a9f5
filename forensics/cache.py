"""forensics' cache directory (stack venvs, gdb's DWARF index, built reproducers).

``$FORENSICS_CACHE``, else ``$XDG_CACHE_HOME/forensics``, else ``~/.cache/forensics``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache directory (not created here)."""
    if os.environ.get("FORENSICS_CACHE"):
        return Path(os.environ["FORENSICS_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "forensics"
