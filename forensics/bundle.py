"""Reading a capture bundle: its manifest, its core, and a sysroot that makes the core analyzable.

A bundle (``forensics capture``, the core handler; written by :mod:`forensics.capture.bundle`)
is read by ``analyze``, ``report`` and ``verify-imports --bundle``: this module sits below
all of them and below capture.  :func:`bundle_sysroot` decompresses the core once and lays
out a sysroot of links to the stored objects by the paths the core names.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

from .errors import InputNotFound

__all__ = [
    "MANIFEST",
    "CORE_NAMES",
    "sha256_file",
    "is_bundle",
    "read_manifest",
    "verify_manifest",
    "find_core_in_bundle",
    "find_object_store",
    "decompress_core",
    "bundle_sysroot",
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
    from .core import open_core  # here, not above: capture writes bundles and never reads a core

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


def is_bundle(path: str) -> bool:
    """A capture bundle: a directory with its MANIFEST.json and a core (``50-core/`` or at its top)."""
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, MANIFEST)):
        return False
    return find_core_in_bundle(path) is not None
