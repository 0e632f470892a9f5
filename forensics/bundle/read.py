"""Reading a capture bundle: its manifest, its core, and a sysroot that makes the core analyzable.

A bundle (``forensics capture``, the core handler; written by :mod:`.write`) is read by ``analyze``,
``report`` and ``verify-imports --bundle``: this package sits below all of them and below capture.
Reading never writes into the bundle: :func:`bundle_sysroot` decompresses the core once into the
forensics cache and lays out, beside it, a sysroot of links to the stored objects by the paths the
core names.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable

from .. import rootpath
from ..digest import sha256
from ..errors import CacheUnavailable, ForensicsError, InputNotFound
from .record import CrashRecord, Identity
from .layout import (CORE_DIR, CORE_NAMES, CORE_PLAIN, CORE_WHOLE, IDENTITY, MANIFEST, OBJECTS, PROCESS_SNAPSHOT,
                     RECORD, core_item)

__all__ = [
    "sha256_file",
    "is_bundle",
    "read_bundle_file",
    "read_bundle_json",
    "read_manifest",
    "verify_manifest",
    "check_manifest",
    "find_core_in_bundle",
    "find_object_store",
    "decompress_core",
    "bundle_sysroot",
    "prune_bundle_cache",
]

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


def _sha256_fd(fd: int, limit: int | None = None) -> tuple[str, int]:
    """sha256 and size of what ``fd`` reads, at most ``limit`` + 1 bytes of it (one more than a bound, to tell)."""
    h = sha256()
    n = 0
    while (limit is None or n <= limit) and (chunk := os.read(fd, 1 << 20 if limit is None
                                                              else min(1 << 20, limit + 1 - n))):
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

    >>> read_bundle_file("/nonexistent-bundle", IDENTITY, 100) is None
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


def check_manifest(bundle_dir: str, manifest: dict | None = None, *, take: Callable[[str, int], None] | None = None,
                   ) -> tuple[list[tuple[str, str, int]], list[tuple[str, str]]]:
    """Each manifest item hashed as it is now, read inside the bundle only: ((path, sha256, size) of each
    item that matches the manifest; (path, why) of each that does not: ``missing`` / ``changed`` / ``not a
    regular file`` / ``not a manifest item``), each path once.

    Each distinct file (device and inode) is hashed once, however many items name it, and at most the size
    it had when opened (a file that grows while it is read has ``changed``).

    :param manifest: the manifest already read (what a caller parsed), else the bundle's
    :param take: called with (path, size) before a distinct file is hashed: the caller's budget, which may raise
    """
    good: list[tuple[str, str, int]] = []
    bad: list[tuple[str, str]] = []
    hashed: dict[tuple[int, int], tuple[str, int]] = {}
    seen: set[str] = set()
    root = os.path.abspath(bundle_dir)
    items = (read_manifest(bundle_dir) if manifest is None else manifest).get("items") or []
    for item in items if isinstance(items, list) else [items]:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            bad.append((f"{item!r:.80}", "not a manifest item"))
            continue
        if item["path"] in seen:
            continue
        seen.add(item["path"])
        try:
            fd = rootpath.open_in_root(root, item["path"])
        except (OSError, ValueError) as e:  # EINVAL: a FIFO, device or socket, which the resolver will not open
            bad.append((item["path"], "not a regular file" if getattr(e, "errno", None) == errno.EINVAL
                        else "missing"))
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                bad.append((item["path"], "not a regular file"))
                continue
            if (st.st_dev, st.st_ino) not in hashed:
                if take is not None:
                    take(item["path"], st.st_size)
                hashed[st.st_dev, st.st_ino] = _sha256_fd(fd, st.st_size)
            digest, size = hashed[st.st_dev, st.st_ino]
        finally:
            os.close(fd)
        if digest != item.get("sha256") or size != item.get("size"):
            bad.append((item["path"], "changed"))
        else:
            good.append((item["path"], digest, size))
    return good, bad


def verify_manifest(bundle_dir: str) -> list[str]:
    """The items whose size or sha256 no longer match the manifest (empty: intact)."""
    return [f"{path}: {why}" for path, why in check_manifest(bundle_dir)[1]]


def find_core_in_bundle(bundle_dir: str) -> str | None:
    """The compressed (or plain) core of a bundle, whole ones first; None without one.

    The path returned has its symlinks resolved inside the bundle: it names a file of the bundle.
    """
    for sub in (CORE_DIR, "."):
        for name in CORE_NAMES + (CORE_PLAIN,):
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
        p = os.path.join(d, OBJECTS)
        if os.path.isdir(p) and not os.path.islink(p):
            return p
        d = os.path.dirname(d)
    return None


def decompress_core(src: str, dest: str, *, limit: int | None = None) -> int:
    """Stream-decompress a bundle's zstd core to ``dest`` (a new file, mode 0600, renamed into place); bytes
    written.  Bounded as :func:`forensics.core.unpack.decompress_core_file` says; a partial file
    (``core.partial.zst``: a frame cut by a full disk) is decompressed as far as it goes.

    :raises CoreReadError: when the stream is damaged, or decompressing would pass a bound
    """
    from ..core.unpack import decompress_core_file

    return decompress_core_file(src, dest, "zstd", limit=limit, partial=src.endswith(".partial.zst"))


def _entry_key(src: str) -> str | None:
    """The cache key of a bundle's core: the file's identity (device, inode, size, times) and real path,
    so a changed or replaced file gets a new entry and two bundles never share one."""
    try:
        st = os.stat(src)
    except OSError:
        return None
    ident = f"{os.path.realpath(src)}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return sha256(ident.encode()).hexdigest()[:32]


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

    snap = read_bundle_json(bundle_dir, PROCESS_SNAPSHOT)
    objects = snap.get("objects") if isinstance(snap, dict) else None
    for o in objects if isinstance(objects, list) else []:
        if isinstance(o, dict):
            want(o.get("path"), o.get("build_id"))
    rec = read_crash_record(bundle_dir, MAX_JSON)
    for path, key in (rec.objects.items() if rec is not None else ()):
        want(path, key)
    for lib_path, build_id in core_libraries:
        want(lib_path, build_id)
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


def bundle_sysroot(bundle_dir: str) -> tuple[str, str | None]:
    """Make a bundle's core analyzable: ``(core_path, sysroot_dir)`` for ``forensics analyze``.

    Analysis never writes into evidence: the compressed core is decompressed once into the
    forensics cache (``bundles/<key>/core``, 0600, keyed by the compressed file's identity, built
    under a lock and renamed into place), and the sysroot -- at each path the core names (and the
    process snapshot recorded), the stored object with that build-id, and at
    ``/usr/lib/debug/.build-id/xx/rest.debug`` its separate debug file when the capture stored one
    (``<build-id>.debug``) -- is laid out beside it.  The
    bundle's files, modes and times stay as they were.  A bundle with a plain core is read in
    place.  Nothing the bundle says names a place outside it (paths with ``..``, keys that are not
    build-ids are left out; links are made through descriptors).  Without stored objects the
    sysroot is None.

    :raises InputNotFound: when the bundle has no core
    :raises CoreReadError: when the core cannot be decompressed within its bounds
    """
    import fcntl

    from ..cache import cache_dir

    bundle_dir = os.path.abspath(bundle_dir)
    src = find_core_in_bundle(bundle_dir)
    if src is None:
        raise InputNotFound(os.path.join(bundle_dir, core_item(CORE_WHOLE)))
    key = _entry_key(src)
    if key is None:
        raise InputNotFound(src)
    entry = cache_dir() / "bundles" / key
    try:
        entry.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_fd = os.open(entry / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise CacheUnavailable(str(entry.parent), e.strerror or str(e)) from e
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # one analysis builds the entry; the others wait and reuse it
        core = src
        if src.endswith(".zst"):
            core = str(entry / "core")
            if not os.path.isfile(core):
                try:
                    decompress_core(src, core)
                except ForensicsError:
                    raise
                except OSError as e:  # the cache's disk, not the bundle (its stream errors are CoreReadError)
                    raise CacheUnavailable(str(entry), e.strerror or str(e)) from e
        sysroot = entry / "sysroot"
        if not sysroot.is_dir():
            _build_sysroot(bundle_dir, core, entry)
        os.utime(entry)  # last used: what pruning goes by
    finally:
        os.close(lock_fd)
    prune_bundle_cache(keep=entry)
    return core, str(sysroot) if any(sysroot.iterdir()) else None


def _build_sysroot(bundle_dir: str, core: str, entry) -> None:
    """Lay out ``entry/sysroot`` through a temporary directory renamed into place: each stored object
    the bundle names, at the path the process saw it (:func:`_link_object`)."""
    import shutil  # here, not above: a plain core's analysis imports this module, and needs neither

    from ..core import open_core  # here, not above: capture writes bundles and never reads a core

    tmp = entry / f".sysroot.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    store = find_object_store(bundle_dir)
    if store is not None:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            from ..core.debugfiles import build_id_debug_path

            libraries = [(lib.path, lib.build_id) for lib in open_core(core).libraries]
            for path, key in _wanted_objects(bundle_dir, libraries).items():
                _link_object(store, key, fd, path)
                # its separate debug file, when the capture found one (stored as <build-id>.debug), where
                # the debug-file lookup of every reader looks: /usr/lib/debug/.build-id/xx/rest.debug
                debug_path = build_id_debug_path(key) if not key.startswith("sha256-") else None
                if debug_path is not None:
                    _link_object(store, f"{key}.debug", fd, debug_path)
        finally:
            os.close(fd)
    os.rename(tmp, entry / "sysroot")


DEFAULT_BUNDLE_CACHE = 4 << 30  # bytes of decompressed bundle cores kept (FORENSICS_BUNDLE_CACHE_BYTES)
_PRUNE_AGE = 3600.0  # an entry used within the hour is never pruned (an analysis may be reading it)


def prune_bundle_cache(*, keep=None, budget: int | None = None) -> list[str]:
    """Delete the least recently used bundle entries of the cache beyond ``budget`` bytes (default
    ``FORENSICS_BUNDLE_CACHE_BYTES`` or 4 GiB); never ``keep`` nor an entry used in the last hour.
    :return: the entries deleted"""
    from ..cache import prune_lru

    if budget is None:
        try:
            budget = int(os.environ.get("FORENSICS_BUNDLE_CACHE_BYTES") or DEFAULT_BUNDLE_CACHE)
        except ValueError:
            budget = DEFAULT_BUNDLE_CACHE
    return prune_lru("bundles", budget, _PRUNE_AGE, keep=None if keep is None else str(keep))


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


MAX_RECORD = 1 << 20  # bytes of a bundle's record read (metadata.json, 00-identity.json)


def read_crash_record(bundle_dir: str, limit: int = MAX_RECORD) -> CrashRecord | None:
    """The core handler's record of the crash (``metadata.json``), read inside the bundle and bounded; None when
    the bundle has none (not a handler's bundle, or a record cut by a full disk, or not a JSON object)."""
    return CrashRecord.from_json(read_bundle_json(bundle_dir, RECORD, limit))


def has_manifest(path: str) -> bool:
    """A bundle directory, with or without a core: it has its MANIFEST.json (a file of the bundle)."""
    if not os.path.isdir(path):
        return False
    try:
        return stat.S_ISREG(rootpath.stat_in_root(os.path.abspath(path), MANIFEST).st_mode)
    except (OSError, ValueError):
        return False


def bundle_crash_time(bundle_dir: str) -> float | None:
    """When the crash happened, as the bundle recorded it (the core handler's ``metadata.json`` time,
    else ``00-identity.json``'s), or None when it recorded none."""
    rec = read_crash_record(bundle_dir)
    if rec is not None and rec.time is not None and rec.time > 0:
        return float(rec.time)
    ident = Identity.from_json(read_bundle_json(bundle_dir, IDENTITY, MAX_RECORD))
    return float(ident.time) if ident is not None and ident.time is not None and ident.time > 0 else None


def bundle_no_core_reason(bundle_dir: str) -> str | None:
    """Why a bundle kept no core ("RLIMIT_CORE 0 < one page", the crash-loop limit, ...), or None when it
    has a core; a bundle without a core and without a reason says so."""
    if find_core_in_bundle(bundle_dir) is not None:
        return None
    rec = read_crash_record(bundle_dir)
    reasons = [r for r in rec.core.reasons if r] if rec is not None else []
    if reasons:
        return "; ".join(reasons)[:500]
    state = rec.core.state_name if rec is not None else None
    return f"core {state}" if state else "the bundle holds no core"


__all__ += ["has_manifest", "bundle_crash_time", "bundle_no_core_reason", "read_crash_record"]
