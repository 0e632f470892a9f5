"""Files shipped with forensics beside its code: the GDB scripts and the NVML reproducers.

In a checkout they are top-level directories beside the package (``gdb_scripts/``,
``reproducers/``); in a wheel they are installed inside it (``forensics/gdb_scripts``,
``forensics/reproducers``).  Below every module that reads them (gdb, simnvml,
reproduce, report), and imports nothing from forensics but the error tree.
"""
from __future__ import annotations

from pathlib import Path

from .errors import BuildError

__all__ = ["find_shipped", "find_reproducers", "reproducer_sources", "REPRODUCER_FILES"]

#: The minimal reproducers an upstream maintainer runs, by language.
REPRODUCER_FILES = {"python": "nvml_nvlink_fieldvalues.py", "c": "nvml_nvlink_fieldvalues.c"}
_MAX_SOURCE = 200_000


def find_shipped(name: str, marker: str) -> Path | None:
    """The shipped directory ``name`` (inside the package, else beside it) that holds ``marker``; None without one."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent / name):
        if (candidate / marker).exists():
            return candidate
    return None


def find_reproducers() -> Path:
    """The ``reproducers`` directory: ``forensics/reproducers`` in a wheel, ``<repo>/reproducers`` in a checkout.

    :raises BuildError: when neither exists.
    """
    found = find_shipped("reproducers", "simnvml")
    if found is None:
        raise BuildError("the NVML reproducers", f"no reproducers/ directory beside {Path(__file__).resolve().parent}")
    return found


def reproducer_sources() -> dict[str, str]:
    """``{"python": source, "c": source}`` of the minimal reproducers, for reports (bounded to 200 kB each).

    :raises BuildError: when no reproducers directory was shipped
    """
    root = find_reproducers()
    out = {}
    for lang, name in REPRODUCER_FILES.items():
        f = root / name
        if f.is_file():
            with open(f, encoding="utf-8", errors="replace") as fh:
                out[lang] = fh.read(_MAX_SOURCE)
    return out
