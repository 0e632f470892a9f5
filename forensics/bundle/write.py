"""Writing a bundle: a new directory, its items written atomically, and at the end its manifest.

The layout (what each item is called, in the order an on-call engineer reads them) is :mod:`.layout`'s.
A bundle directory is created new (never reused): a second capture gets its own.
"""
from __future__ import annotations

import contextlib
import json
import os
import time

from ..errors import CoreDirectoryError
from .layout import MANIFEST
from .read import sha256_file

__all__ = ["BundleWriter", "new_bundle_dir", "write_atomic", "fsync_dir", "replacing"]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(path: str, tmp: str, mode: int):
    """A descriptor on ``tmp``; when the block ends well: fsync, rename onto ``path``; else ``tmp`` is removed."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        yield fd
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):  # our own temporary file; the error being raised is what matters
            os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)


def write_atomic(path: str, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a temporary name, fsync, rename, fsync the directory."""
    d = os.path.dirname(path) or "."
    with replacing(path, os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}"), mode) as fd:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    fsync_dir(d)


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
        p = self._abs(rel)
        write_atomic(p, data)
        return p
