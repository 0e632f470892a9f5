"""The NVIDIA driver version for the known-issue checks, read from a capture bundle.

A bundle (``forensics capture``) records it in ``40-process/snapshot.json``
(``host_driver_version``, the library's version) and in ``30-kernel/nvidia-smi.txt``
(``Driver Version``), read inside the bundle only (:func:`forensics.bundle.read_bundle_file`).
:func:`find_driver_version` is pure over the parsed files.
"""
from __future__ import annotations

import os
import re

from ..bundle import read_bundle_file, read_bundle_json
from ..bundle.layout import NVIDIA_SMI, PROCESS_SNAPSHOT
from ..errors import InputNotFound

__all__ = ["find_driver_version", "read_bundle_driver"]

_VERSION = re.compile(r"^\d{3}\.\d+(?:\.\d+)?$")
_KEYS = ("host_driver_version", "driver_version")


def find_driver_version(doc, smi_text: str | None = None) -> str | None:
    """The first driver version in a snapshot document (by key, depth first) or nvidia-smi text.

    >>> find_driver_version({"nvml": {"library": {"host_driver_version": "580.126.09"}}})
    '580.126.09'
    >>> find_driver_version({}, "Driver Version                            : 575.57.08")
    '575.57.08'
    """
    stack = [doc]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            for k in _KEYS:
                v = cur.get(k)
                if isinstance(v, str) and _VERSION.match(v):
                    return v
            stack.extend(reversed(list(cur.values())))
        elif isinstance(cur, list):
            stack.extend(reversed(cur))
    if smi_text:
        m = re.search(r"Driver Version\s*:\s*(\d{3}\.\d+(?:\.\d+)?)", smi_text)
        if m:
            return m.group(1)
    return None


def read_bundle_driver(bundle: str) -> str | None:
    """The driver version a capture bundle recorded, or None.

    :raises InputNotFound: when ``bundle`` is not a directory
    """
    if not os.path.isdir(bundle):
        raise InputNotFound(bundle)
    doc = read_bundle_json(bundle, PROCESS_SNAPSHOT)
    smi_bytes = read_bundle_file(bundle, NVIDIA_SMI, 1 << 20)
    smi = smi_bytes.decode("utf-8", "replace") if smi_bytes is not None else None
    return find_driver_version(doc, smi)
