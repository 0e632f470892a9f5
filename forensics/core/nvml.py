"""Identify the NVIDIA management library (libnvidia-ml.so) a process had mapped.

The driver installs ``libnvidia-ml.so.<driver version>`` and a ``.so.1`` link to
it; the kernel records the real file, so the version is usually in the file
name.  When the mapped file is named ``.so.1`` (a container runtime may mount it
that way) the version is looked for in the file's bytes: a ``NNN.NN[.NN]``
string near "NVIDIA", reading at most the first 64 MiB.  The build-id comes from
the core and pins the exact build either way.
"""
from __future__ import annotations

import collections
import mmap
import re
from collections.abc import Iterable

from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.model import Library, LibraryStatus, Mapping, NvmlLibrary

__all__ = [
    "NVML_PREFIX",
    "is_nvml",
    "parse_driver_version_from_name",
    "find_driver_version_string",
    "find_nvml",
]

NVML_PREFIX = "libnvidia-ml.so"
MAX_SCAN = 64 << 20
_NEAR = 256
_MAX_HITS = 10000
_NAME_VERSION = re.compile(r"^libnvidia-ml\.so\.(\d{2,4}(?:\.\d{1,3}){1,2})$")
_VERSION = re.compile(rb"(?<![\d.])(\d{3}\.\d{2,3}(?:\.\d{2})?)(?![\d.])")
_NVIDIA = re.compile(rb"NVIDIA")


def is_nvml(path: str) -> bool:
    """Whether the basename starts with ``libnvidia-ml.so``."""
    return path.rsplit("/", 1)[-1].startswith(NVML_PREFIX)


def parse_driver_version_from_name(path: str) -> str | None:
    """The driver version in a ``libnvidia-ml.so.X.Y[.Z]`` file name, or None for ``.so`` / ``.so.1``.

    >>> parse_driver_version_from_name("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09")
    '580.126.09'
    >>> parse_driver_version_from_name("/usr/lib/libnvidia-ml.so.1") is None
    True
    """
    m = _NAME_VERSION.match(path.rsplit("/", 1)[-1])
    return m.group(1) if m else None


def find_driver_version_string(data: bytes | mmap.mmap, limit: int = MAX_SCAN) -> str | None:
    """The driver version (``535.104.05``, ``550.54``) found within 256 bytes of "NVIDIA".

    Only the first ``limit`` bytes are searched.  When several versions appear,
    the most frequent wins (the first seen on a tie).

    >>> find_driver_version_string(b"\\0NVIDIA NVML Driver 580.126.09\\0")
    '580.126.09'
    """
    end = min(len(data), limit)
    counts: collections.Counter[bytes] = collections.Counter()
    for i, hit in enumerate(_NVIDIA.finditer(data, 0, end)):
        if i >= _MAX_HITS:
            break
        lo, hi = max(0, hit.start() - _NEAR), min(end, hit.end() + _NEAR)
        for m in _VERSION.finditer(data, lo, hi):
            counts[m.group(1)] += 1
    if not counts:
        return None
    return counts.most_common(1)[0][0].decode()


def _version_from_file(path: str) -> str | None:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return find_driver_version_string(mm)
    except (OSError, ValueError):
        return None


def _version_from_core(mem: CoreMemory, mappings: Iterable[Mapping]) -> str | None:
    budget = MAX_SCAN
    for m in mappings:
        if not m.in_core or budget <= 0:
            continue
        n = min(m.in_core, budget)
        try:
            found = find_driver_version_string(mem.read(m.start, n))
        except MemoryNotInCore:
            continue
        budget -= n
        if found:
            return found
    return None


def find_nvml(mem: CoreMemory, mappings: Iterable[Mapping], libraries: Iterable[Library]) -> NvmlLibrary | None:
    """Describe the mapped libnvidia-ml, or None when the process had none.

    :param mem: the core's memory (searched when the file cannot be used)
    :param mappings: the core's mappings
    :param libraries: the mapped libraries, with resolved files and build-ids
    """
    lib = next((x for x in libraries if is_nvml(x.path)), None)
    if lib is None:
        path = next((m.path for m in mappings if m.path and is_nvml(m.path)), None)
        if path is None:
            return None
        lib = Library(
            path=path, base=0, build_id=None, file_path=None, file_build_id=None, status=LibraryStatus.MISSING
        )
    version = parse_driver_version_from_name(lib.path)
    if version is not None:
        return NvmlLibrary(path=lib.path, build_id=lib.build_id, driver_version=version, version_source="file-name")
    if lib.file_path is not None and lib.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED):
        version = _version_from_file(lib.file_path)
    if version is None:
        version = _version_from_core(mem, (m for m in mappings if m.path == lib.path))
    return NvmlLibrary(
        path=lib.path,
        build_id=lib.build_id,
        driver_version=version,
        version_source="version-string" if version else None,
    )
