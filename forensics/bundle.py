"""Reading a capture bundle: its manifest, its core, and a sysroot that makes the core analyzable.

A bundle (``forensics capture``, the core handler; written by :mod:`forensics.capture.bundle`)
is read by ``analyze``, ``report`` and ``verify-imports --bundle``: this module sits below
all of them and below capture.  :func:`bundle_sysroot` decompresses the core once and lays
out a sysroot of links to the stored objects by the paths the core names.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat

from . import rootpath
from .errors import InputNotFound, UnsafeBundle

__all__ = [
    "MANIFEST",
    "CORE_NAMES",
    "sha256_file",
    "is_bundle",
    "read_bundle_file",
    "read_bundle_json",
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
MAX_JSON = 64 << 20  # a bundle's JSON documents are read whole: bounded
#: A key of the object store: a GNU build-id in hex, or ``sha256-`` and the file's digest.
_STORE_KEY = re.compile(r"[0-9a-f]{4,128}|sha256-[0-9a-f]{64}")


def sha256_file(path: str) -> tuple[str, int]:
    """(hex sha256, size) of a file, read in 1 MiB chunks."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _sha256_fd(fd)
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def _inside(bundle_dir: str, rel: str) -> str:
    """The host path of what ``rel`` names inside the bundle, symlinks resolved inside it; OSError if none."""
    root = os.path.abspath(bundle_dir)
    return root.rstrip("/") + rootpath.resolve_in_root(root, rel)


def read_bundle_file(bundle_dir: str, rel: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file ``rel`` of a bundle, read inside the bundle only;
    None when there is no such file there (a symlink out of the bundle leads nowhere).

    >>> read_bundle_file("/nonexistent-bundle", "00-identity.json", 100) is None
    True
    """
    try:
        return rootpath.read_in_root(os.path.abspath(bundle_dir), rel, limit)
    except (OSError, ValueError):
        return None


def read_bundle_json(bundle_dir: str, rel: str, limit: int = MAX_JSON) -> object | None:
    """A JSON document of a bundle (see :func:`read_bundle_file`); None when absent, over ``limit`` or not JSON."""
    data = read_bundle_file(bundle_dir, rel, limit + 1)
    if data is None or len(data) > limit:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def read_manifest(bundle_dir: str) -> dict:
    """The bundle's MANIFEST.json.

    :raises InputNotFound: when the bundle has none, or it is not a JSON object
    """
    doc = read_bundle_json(bundle_dir, MANIFEST)
    if not isinstance(doc, dict):
        raise InputNotFound(os.path.join(bundle_dir, MANIFEST))
    return doc


def verify_manifest(bundle_dir: str) -> list[str]:
    """The items whose size or sha256 no longer match the manifest (empty: intact)."""
    bad = []
    for item in read_manifest(bundle_dir).get("items") or []:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            bad.append(f"{item!r:.80}: not a manifest item")
            continue
        try:
            fd = rootpath.open_in_root(os.path.abspath(bundle_dir), item["path"])
        except (OSError, ValueError):
            bad.append(f"{item['path']}: missing")
            continue
        try:
            digest, size = _sha256_fd(fd)
        finally:
            os.close(fd)
        if digest != item.get("sha256") or size != item.get("size"):
            bad.append(f"{item['path']}: changed")
    return bad


def find_core_in_bundle(bundle_dir: str) -> str | None:
    """The compressed (or plain) core of a bundle, whole ones first; None without one.

    The path returned has its symlinks resolved inside the bundle: it names a file of the bundle.
    """
    for sub in ("50-core", "."):
        for name in CORE_NAMES + ("core",):
            try:
                if stat.S_ISREG(rootpath.stat_in_root(os.path.abspath(bundle_dir), f"{sub}/{name}").st_mode):
                    return _inside(bundle_dir, f"{sub}/{name}")
            except (OSError, ValueError):
                continue
    return None


def find_object_store(bundle_dir: str) -> str | None:
    """``objects/`` of the bundle, else of the core directory that holds it (two levels up); a real
    directory, not a symlink."""
    d = os.path.abspath(bundle_dir)
    for _ in range(3):
        p = os.path.join(d, "objects")
        if os.path.isdir(p) and not os.path.islink(p):
            return p
        d = os.path.dirname(d)
    return None


def decompress_core(src: str, dest: str) -> int:
    """Stream-decompress a zstd core to ``dest`` (a new file, renamed into place); bytes written.

    A partial file (a frame cut by a full disk) is decompressed as far as it goes.
    """
    import zstandard

    d, name = os.path.split(os.path.abspath(dest))
    dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{name}.tmp{os.getpid()}"
        out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dir_fd)
        n = 0
        try:
            with open(src, "rb") as fin, os.fdopen(out_fd, "wb") as fout:
                reader = zstandard.ZstdDecompressor().stream_reader(fin, read_across_frames=True)
                try:
                    while chunk := reader.read(1 << 20):
                        fout.write(chunk)
                        n += len(chunk)
                except zstandard.ZstdError:
                    if not src.endswith(".partial.zst"):
                        raise
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return n


def _clean_path(path: object) -> str | None:
    """An absolute path with no ``..``, ``.`` or empty component (as the kernel names mapped files), else None."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 4096:
        return None
    parts = path.split("/")[1:]
    return path if parts and all(p not in ("", ".", "..") for p in parts) else None


def _store_key(key: object) -> str | None:
    return key if isinstance(key, str) and _STORE_KEY.fullmatch(key) else None


def _wanted_objects(bundle_dir: str, core_libraries: list[tuple[str, str | None]]) -> dict[str, str]:
    """{path the process saw: store key} from the bundle's snapshot and record and the core itself;
    entries naming anything but a clean absolute path and a store key are left out."""
    wanted: dict[str, str] = {}

    def want(path: object, key: object) -> None:
        p, k = _clean_path(path), _store_key(key)
        if p is not None and k is not None:
            wanted.setdefault(p, k)

    snap = read_bundle_json(bundle_dir, "40-process/snapshot.json")
    objects = snap.get("objects") if isinstance(snap, dict) else None
    for o in objects if isinstance(objects, list) else []:
        if isinstance(o, dict):
            want(o.get("path"), o.get("build_id"))
    meta = read_bundle_json(bundle_dir, "metadata.json")
    recorded = meta.get("objects") if isinstance(meta, dict) else None
    for path, key in (recorded.items() if isinstance(recorded, dict) else ()):
        want(path, key)
    for path, key in core_libraries:
        want(path, key)
    return wanted


def _link_object(store: str, key: str, sysroot_fd: int, path: str) -> None:
    """Put the stored object ``key`` at ``path`` inside the sysroot: a hard link (a copy across
    filesystems), made through descriptors, never through a symlink, never outside the sysroot."""
    try:
        src = rootpath.open_in_root(store, f"{key[:2]}/{key[2:]}")
    except (OSError, ValueError):
        return
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            return
        parent, name = path.rsplit("/", 1)
        dir_fd = rootpath.makedirs_in_root(sysroot_fd, parent)
        try:
            if _lexists_at(dir_fd, name):
                return
            # A hard link, not a symlink: the sysroot resolver never follows a link out of the
            # sysroot, and the store lies outside it.  Linked from the descriptor opened above.
            try:
                os.link(f"/proc/self/fd/{src}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
            except OSError:
                _copy_fd(src, dir_fd, name)
        finally:
            os.close(dir_fd)
    except OSError:
        return
    finally:
        os.close(src)


def _lexists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _copy_fd(src: int, dir_fd: int, name: str) -> None:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        offset = 0
        while chunk := os.pread(src, 1 << 20, offset):
            os.write(out, chunk)
            offset += len(chunk)
    finally:
        os.close(out)


def bundle_sysroot(bundle_dir: str) -> tuple[str, str]:
    """Make a bundle's core analyzable: ``(core_path, sysroot_dir)`` for ``forensics analyze``.

    The core is decompressed once to ``50-core/core``.  The sysroot (``.sysroot`` in the
    bundle) holds, at each path the core names (and the process snapshot recorded), a link to
    the stored object with that build-id.  The bundle is data from a node and a container:
    nothing it says names a place outside its own directory (paths with ``..``, keys that are
    not build-ids are left out; links and directories are made through descriptors).

    :raises InputNotFound: when the bundle has no core
    """
    from .core import open_core  # here, not above: capture writes bundles and never reads a core

    bundle_dir = os.path.abspath(bundle_dir)
    src = find_core_in_bundle(bundle_dir)
    if src is None:
        raise InputNotFound(os.path.join(bundle_dir, "50-core/core.zst"))
    if src.endswith(".zst"):
        core_dir = os.path.dirname(src)
        rel_core = os.path.relpath(os.path.join(core_dir, "core"), bundle_dir)
        try:
            core = _inside(bundle_dir, rel_core)
            if not os.path.isfile(core):
                raise FileNotFoundError(core)
        except OSError:
            core = os.path.join(core_dir, "core")
            decompress_core(src, core)
    else:
        core = src
    store = find_object_store(bundle_dir)
    try:
        sysroot_fd = rootpath.makedirs_in_root(bundle_dir, ".sysroot")
    except OSError as e:
        raise UnsafeBundle(bundle_dir, f".sysroot is not a directory of the bundle ({e.strerror}); "
                                       "forensics never writes through a link") from e
    try:
        if store is not None:
            cf = open_core(core)
            libraries = [(lib.path, lib.build_id) for lib in cf.libraries]
            for path, key in _wanted_objects(bundle_dir, libraries).items():
                _link_object(store, key, sysroot_fd, path)
    finally:
        os.close(sysroot_fd)
    return core, os.path.join(bundle_dir, ".sysroot")


def is_bundle(path: str) -> bool:
    """A capture bundle: a directory with its MANIFEST.json and a core (``50-core/`` or at its top)."""
    if not os.path.isdir(path):
        return False
    try:
        if not stat.S_ISREG(rootpath.stat_in_root(os.path.abspath(path), MANIFEST).st_mode):
            return False
    except (OSError, ValueError):
        return False
    return find_core_in_bundle(path) is not None
