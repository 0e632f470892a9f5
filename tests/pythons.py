"""Discover the CPython interpreters on this machine, one per minor version (3.8-3.13).

pyenv's versions are found through ``pyenv root`` (or $PYENV_ROOT, or ~/.pyenv);
system interpreters (/usr/bin/python3.X, /usr/local/bin/python3.X) fill the gaps.
Nothing here hard-codes one machine's paths.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

__all__ = ["WANTED", "discover_pythons"]

WANTED = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")


def _pyenv_root() -> str | None:
    if os.environ.get("PYENV_ROOT"):
        return os.environ["PYENV_ROOT"]
    exe = shutil.which("pyenv")
    if exe:
        try:
            return subprocess.run([exe, "root"], capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            pass
    home = os.path.expanduser("~/.pyenv")
    return home if os.path.isdir(home) else None


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"/versions/(\d+)\.(\d+)\.(\d+)/", path)
    return tuple(int(x) for x in m.groups()) if m else (0,)


def discover_pythons() -> dict[str, str]:
    """``{"3.12": "/root/.pyenv/versions/3.12.1/bin/python3", ...}`` for the versions found."""
    found: dict[str, str] = {}
    root = _pyenv_root()
    if root:
        for exe in sorted(glob.glob(os.path.join(root, "versions", "*", "bin", "python3")), key=_version_key):
            m = re.search(r"/versions/(\d+\.\d+)\.\d+/", exe)
            if m and m.group(1) in WANTED:
                found[m.group(1)] = exe  # the newest patch release of each minor wins
    for minor in WANTED:
        if minor not in found:
            for d in ("/usr/local/bin", "/usr/bin"):
                exe = os.path.join(d, f"python{minor}")
                if os.access(exe, os.X_OK):
                    found[minor] = exe
                    break
    return found
