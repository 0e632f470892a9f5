"""The file suffixes CPython's import system tries, per version (``importlib.machinery``).

Below both the sys.path resolution (:mod:`.resolve`) and the editable installs'
finders (:mod:`.finders`), which each ask "which file names can hold module X".
"""
from __future__ import annotations

__all__ = ["extension_suffixes", "all_suffixes"]


def extension_suffixes(version: str, triplet: str = "x86_64-linux-gnu") -> tuple[str, ...]:
    """``importlib.machinery.EXTENSION_SUFFIXES`` of CPython ``version`` on Linux.

    >>> extension_suffixes("3.11")
    ('.cpython-311-x86_64-linux-gnu.so', '.abi3.so', '.so')
    """
    return (f".cpython-{version.replace('.', '')}-{triplet}.so", ".abi3.so", ".so")


def all_suffixes(version: str, triplet: str = "x86_64-linux-gnu") -> tuple[str, ...]:
    """``importlib.machinery.all_suffixes()``: source, bytecode, extensions.

    >>> all_suffixes("3.12")[:3]
    ('.py', '.pyc', '.cpython-312-x86_64-linux-gnu.so')
    """
    return (".py", ".pyc") + extension_suffixes(version, triplet)
