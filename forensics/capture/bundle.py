"""The evidence bundle: numbered items in the order an on-call engineer reads them, a sha256 manifest.

::

    00-identity.json          pod / job / node UIDs, container, image, timestamps
    10-kubernetes/            pod, events, node (scheduling state)            [--pod]
    20-node/                  kubelet, container runtime, device plugin lines  [when the node offers them]
    30-kernel/                NVRM / Xid kernel log lines, nvidia-smi output   [when present]
    40-process/               the process snapshot and the /proc files as read
    50-core/                  the compressed core and its record               [after a crash]
    objects/                  the ELF objects the core maps, by build-id        [pod bundles; node bundles share the core directory's]
    MANIFEST.json             every item: path, size, sha256, what it is

A bundle directory is created new (never reused): a second capture gets its own.
:func:`bundle_sysroot` makes a core in a bundle analyzable anywhere: it decompresses the
core once and lays out a sysroot of links to the stored objects by the paths the core names.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

from ..errors import CoreDirectoryError, InputNotFound

__all__ = [
    "BundleWriter",
    "new_bundle_dir",
    "read_manifest",
    "verify_manifest",
    "find_core_in_bundle",
    "find_object_store",
    "decompress_core",
    "bundle_sysroot",
    "CORE_NAMES",
    "sha256_file",
]

#: Core file names in ``50-core``, whole first: a truncated core is a valid zstd stream of the
#: first bytes; a partial one ends in the middle of a zstd frame (the disk filled up).
CORE_NAMES = ("core.zst", "core.truncated.zst", "core.partial.zst")
MANIFEST = "MANIFEST.json"


def sha256_file(path: str) -> tuple[str, int]:
    """(hex sha256, size) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


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
        except FileExistsError:
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


def read_manifest(bundle_dir: str) -> dict:
    p = os.path.join(bundle_dir, MANIFEST)
    if not os.path.isfile(p):
        raise InputNotFound(p)
    with open(p) as f:
        return json.load(f)


def verify_manifest(bundle_dir: str) -> list[str]:
    """The items whose size or sha256 no longer match the manifest (empty: intact)."""
    bad = []
    for item in read_manifest(bundle_dir)["items"]:
        p = os.path.join(bundle_dir, item["path"])
        if not os.path.isfile(p):
            bad.append(f"{item['path']}: missing")
            continue
        digest, size = sha256_file(p)
        if digest != item["sha256"] or size != item["size"]:
            bad.append(f"{item['path']}: changed")
    return bad


def find_core_in_bundle(bundle_dir: str) -> str | None:
    """The compressed (or plain) core of a bundle, whole ones first; None without one."""
    for sub in ("50-core", "."):
        for name in CORE_NAMES + ("core",):
            p = os.path.join(bundle_dir, sub, name)
            if os.path.isfile(p):
                return os.path.normpath(p)
    return None


def find_object_store(bundle_dir: str) -> str | None:
    """``objects/`` of the bundle, else of the core directory that holds it (two levels up)."""
    d = os.path.abspath(bundle_dir)
    for _ in range(3):
        p = os.path.join(d, "objects")
        if os.path.isdir(p):
            return p
        d = os.path.dirname(d)
    return None


def decompress_core(src: str, dest: str) -> int:
    """Stream-decompress a zstd core to ``dest`` (atomically); bytes written.

    A partial file (a frame cut by a full disk) is decompressed as far as it goes.
    """
    import zstandard

    tmp = f"{dest}.tmp{os.getpid()}"
    n = 0
    dctx = zstandard.ZstdDecompressor()
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        reader = dctx.stream_reader(fin, read_across_frames=True)
        try:
            while chunk := reader.read(1 << 20):
                fout.write(chunk)
                n += len(chunk)
        except zstandard.ZstdError:
            if not src.endswith(".partial.zst"):
                raise
    os.rename(tmp, dest)
    return n


def bundle_sysroot(bundle_dir: str) -> tuple[str, str]:
    """Make a bundle's core analyzable: ``(core_path, sysroot_dir)`` for ``forensics analyze``.

    The core is decompressed once to ``50-core/core``.  The sysroot
    (``.sysroot`` in the bundle) holds, at each path the core names (and the process
    snapshot recorded), a link to the stored object with that build-id.

    :raises InputNotFound: when the bundle has no core
    """
    from ..core import open_core

    bundle_dir = os.path.abspath(bundle_dir)
    src = find_core_in_bundle(bundle_dir)
    if src is None:
        raise InputNotFound(os.path.join(bundle_dir, "50-core/core.zst"))
    if src.endswith(".zst"):
        core = os.path.join(os.path.dirname(src), "core")
        if not os.path.isfile(core):
            decompress_core(src, core)
    else:
        core = src
    store = find_object_store(bundle_dir)
    sysroot = os.path.join(bundle_dir, ".sysroot")
    os.makedirs(sysroot, exist_ok=True)
    wanted: dict[str, str] = {}
    snap = os.path.join(bundle_dir, "40-process", "snapshot.json")
    if os.path.isfile(snap):
        with open(snap) as f:
            for o in json.load(f).get("objects", []):
                if o.get("build_id"):
                    wanted[o["path"]] = o["build_id"]
    meta = os.path.join(bundle_dir, "metadata.json")
    if os.path.isfile(meta):
        with open(meta) as f:
            for path, key in (json.load(f).get("objects") or {}).items():
                wanted.setdefault(path, key)
    cf = open_core(core)
    for lib in cf.libraries:
        if lib.build_id:
            wanted.setdefault(lib.path, lib.build_id)
    if store is not None:
        for path, key in wanted.items():
            target = os.path.join(store, key[:2], key[2:])
            if not path.startswith("/") or not os.path.isfile(target):
                continue
            link = os.path.join(sysroot, path.lstrip("/"))
            if os.path.lexists(link):
                continue
            os.makedirs(os.path.dirname(link), exist_ok=True)
            # A hard link (a copy across filesystems), not a symlink: the sysroot resolver never
            # follows a link out of the sysroot, and the store lies outside it.
            try:
                os.link(target, link)
            except OSError:
                shutil.copy2(target, link)
    return core, sysroot
