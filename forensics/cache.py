"""forensics' cache directory (stack venvs, gdb's DWARF index, built reproducers, decompressed cores).

``$FORENSICS_CACHE``, else ``$XDG_CACHE_HOME/forensics``, else ``~/.cache/forensics``.  :func:`prune_lru`
keeps one of its subdirectories of entries within a byte budget, least recently used first.
"""
from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

__all__ = ["cache_dir", "cache_path", "prune_lru", "prune_dir_lru", "entry_bytes"]


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


def entry_bytes(path: str) -> int:
    """The bytes deleting the directory ``path`` frees: its regular files' sizes, at any depth, but those
    hard-linked elsewhere too (a sysroot's object linked from its bundle); links and directories are not
    followed."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink == 1 and stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def prune_lru(subdir: str, budget: int, min_age: float, *, keep: str | None = None) -> list[str]:
    """Delete the least recently used entries (directories; their mtime says when last used) of
    ``CACHE/subdir`` while they hold more than ``budget`` bytes (:func:`entry_bytes`); never ``keep``
    nor one used in the last ``min_age`` seconds (an analysis may be reading it).

    :return: the entries deleted, oldest first
    """
    return prune_dir_lru(cache_path(subdir), budget, min_age, keep=keep)


def prune_dir_lru(directory: str, budget: int, min_age: float, *, keep: str | None = None,
                  is_entry: Callable[[str], bool] | None = None,
                  last_used: Callable[[str], float] | None = None) -> list[str]:
    """:func:`prune_lru` over any ``directory``: its subdirectories whose name ``is_entry`` accepts (all by
    default), each last used when ``last_used(path)`` says (its mtime by default).

    :return: the entries deleted, oldest first
    """
    import shutil
    import time

    entries = []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False) and (is_entry is None or is_entry(e.name)):
                        used = last_used(e.path) if last_used else e.stat(follow_symlinks=False).st_mtime
                        entries.append((used, entry_bytes(e.path), e.path))
                except OSError:
                    continue
    except OSError:
        return []
    total = sum(size for _, size, _ in entries)
    deleted = []
    now = time.time()
    for mtime, size, path in sorted(entries):
        if total <= budget:
            break
        if now - mtime < min_age or (keep is not None and os.path.samefile(path, keep)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        total -= size
        deleted.append(path)
    return deleted
