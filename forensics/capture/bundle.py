"""The evidence bundle as capture writes it: numbered items in the order an on-call engineer reads them.

::

    00-identity.json          pod / job / node UIDs, container, image, timestamps
    10-kubernetes/            pod, events, node (scheduling state)            [--pod]
    20-node/                  kubelet, container runtime, device plugin lines  [when the node offers them]
    30-kernel/                NVRM / Xid kernel log lines, nvidia-smi output   [when present]
    40-process/               the process snapshot and the /proc files as read
    50-core/                  the compressed core and its record               [after a crash]
    objects/                  the ELF objects the core maps, by build-id        [pod bundles; node bundles
                                                                                 share the core directory's]
    MANIFEST.json             every item: path, size, sha256, what it is

A bundle directory is created new (never reused): a second capture gets its own.
Reading a bundle (its manifest, its core, its sysroot) is :mod:`forensics.bundle`'s, below
both capture and the commands that read bundles.
"""
from __future__ import annotations

import json
import os
import time

from ..bundle import MANIFEST, sha256_file
from ..errors import CoreDirectoryError

__all__ = ["BundleWriter", "new_bundle_dir"]


def new_bundle_dir(parent: str, name: str) -> str:
    """Create ``parent/name`` (``name-2``, ``name-3``... when taken) and return it: never an existing one.

    :raises CoreDirectoryError: when ``parent`` cannot hold it
    """
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise CoreDirectoryError(parent, e.strerror or str(e)) from e
    for i in range(1, 10000):
        path = os.path.join(parent, name if i == 1 else f"{name}-{i}")
        try:
            os.mkdir(path, 0o750)
            return path
        except FileExistsError:  # taken: the next suffix
            continue
        except OSError as e:
            raise CoreDirectoryError(parent, e.strerror or str(e)) from e
    raise CoreDirectoryError(parent, f"10000 bundles named {name} already")


class BundleWriter:
    """Writes items into a bundle directory and, at the end, its manifest."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.items: dict[str, str] = {}  # relpath -> description

    def _abs(self, rel: str) -> str:
        p = os.path.join(self.path, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def add_bytes(self, rel: str, data: bytes, what: str) -> str:
        from .store import write_atomic

        p = self._abs(rel)
        write_atomic(p, data)
        self.items[rel] = what
        return p

    def add_json(self, rel: str, obj, what: str) -> str:
        return self.add_bytes(rel, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode(), what)

    def note_file(self, rel: str, what: str) -> None:
        """Record a file already written at ``rel`` (a core, objects)."""
        self.items[rel] = what

    def write_manifest(self, extra: dict | None = None) -> str:
        entries = []
        for rel in sorted(self.items):
            p = os.path.join(self.path, rel)
            if not os.path.isfile(p):
                continue
            digest, size = sha256_file(p)
            entries.append({"path": rel, "size": size, "sha256": digest, "what": self.items[rel]})
        doc = {"schema_version": 1, "written_at": time.time(), "items": entries, **(extra or {})}
        return self.add_bytes_raw(MANIFEST, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())

    def add_bytes_raw(self, rel: str, data: bytes) -> str:
        from .store import write_atomic

        p = self._abs(rel)
        write_atomic(p, data)
        return p
