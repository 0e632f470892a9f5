"""``s3://`` inputs of the readers (``analyze``, ``report``): a bundle, a core or a prefix of bundles, fetched
into the forensics cache and read there as local ones.

- A bundle prefix (``s3://bucket/.../TIME-FINGERPRINT-CRASHID/``): its ``UPLOAD.json`` (what
  ``forensics upload`` wrote last) names every object; a prefix copied by other means needs its
  ``MANIFEST.json``.  Each object is streamed into ``CACHE/s3/<entry>/bundle/<path>`` (paths made
  inside that directory only, no ``..``, no link followed), never more bytes than the record says, its
  SHA-256 checked against the record as it arrives; the build-id store's objects go to the bundle's
  ``objects/``, where the sysroot is laid out from.  The entry is keyed by the endpoint, the bucket, the
  prefix and the record's ETag, built in a temporary directory renamed into place, and reused.
- A core object (``.../50-core/core.zst``, or any object that is not a prefix): streamed into the cache,
  at most ``FORENSICS_MAX_CORE_BYTES``, and a zstd one decompressed there with the bundle reader's bounds.
- A prefix holding neither: the bundles under it (the keys ending in ``/UPLOAD.json``, at most
  :data:`MAX_BUNDLES`), each fetched as above: a batch.

Nothing is fetched without room: 1 GiB stays free on the cache's filesystem; entries past
``FORENSICS_BUNDLE_CACHE_BYTES`` (4 GiB) are deleted, least recently used first, never one used in the last
hour.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat

from .. import rootpath
from ..bundle import MANIFEST, decompress_core
from ..core.unpack import max_core_bytes
from ..cache import cache_path, prune_lru
from ..digest import sha256
from ..errors import CacheUnavailable, ForensicsError, ObjectNotFound, ObjectStoreError
from .client import ObjectURL, StoreOptions, open_client, parse_object_url, translate_error
from .upload import UPLOAD_RECORD, object_store_key

__all__ = ["fetch_inputs", "fetch_url", "prune_fetched", "read_bundle_records", "MAX_BUNDLES"]

MAX_BUNDLES = 1000  # bundles of one prefix fetched as a batch
MAX_RECORD = 16 << 20  # bytes of an UPLOAD.json / MANIFEST.json read
MAX_ITEMS = 20_000
_FREE_RESERVE = 1 << 30
_READ = 1 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def fetch_inputs(inputs, opts: StoreOptions | None = None) -> tuple[tuple[str, ...], bool]:
    """The command's inputs with each ``s3://`` URL replaced by the local paths it was fetched to, and whether
    one of them was a prefix of bundles (a batch, however many it holds, as a directory of bundles is)."""
    opts = opts or StoreOptions()
    client = None
    out: list[str] = []
    batch = False
    for text in inputs:
        if not text.startswith("s3://"):
            out.append(text)
            continue
        client = client or open_client(opts)
        paths, many = fetch_url(parse_object_url(text), opts, client=client)
        out.extend(paths)
        batch = batch or many
    if client is not None:
        prune_fetched()
    return tuple(out), batch


_PRUNE_AGE = 3600.0  # an entry used within the hour is never pruned (an analysis may be reading it)


def prune_fetched(budget: int | None = None) -> list[str]:
    """Delete the least recently used entries of ``CACHE/s3`` beyond ``budget`` bytes (default
    ``FORENSICS_BUNDLE_CACHE_BYTES`` or 4 GiB); never one used in the last hour.  :return: those deleted"""
    if budget is None:
        try:
            budget = int(os.environ.get("FORENSICS_BUNDLE_CACHE_BYTES") or 4 << 30)
        except ValueError:
            budget = 4 << 30
    return prune_lru("s3", budget, _PRUNE_AGE)


def fetch_url(url: ObjectURL, opts: StoreOptions, *, client=None) -> tuple[list[str], bool]:
    """Local paths for what ``url`` names: ``[bundle directory]``, ``[core file]`` or a batch of bundles
    (then True).

    :raises ObjectNotFound: when the URL names no object, bundle nor bundles
    :raises ObjectStoreError: when an object cannot be read, or is not what its record says
    """
    import botocore.exceptions as bx

    client = client or open_client(opts)
    try:
        if url.key and not url.key.endswith("/") and _exists(client, url):
            return [_fetch_core(client, url, opts)], False
        prefix = ObjectURL(bucket=url.bucket, key=url.key.rstrip("/") + "/" if url.key.strip("/") else "")
        found = _fetch_bundle(client, prefix, opts)
        if found is not None:
            return [found], False
        records = _records_under(client, prefix)
        if not records:
            raise ObjectNotFound(str(url), "no object, bundle (UPLOAD.json, MANIFEST.json) nor bundles under it")
        return [p for r in records if (p := _fetch_bundle(client, r, opts)) is not None], True
    except (bx.BotoCoreError, bx.ClientError) as e:
        raise translate_error(e, str(url), opts) from e


def read_bundle_records(url: ObjectURL, opts: StoreOptions, *, client=None) -> list[tuple[str, dict]]:
    """The upload records of the bundles at or under ``url``: (the bundle's ``s3://`` URL, its ``UPLOAD.json``), at
    most :data:`MAX_BUNDLES`, in key order; only the records are read (each at most :data:`MAX_RECORD` bytes).

    :raises ObjectNotFound: when no bundle is there
    :raises ObjectStoreError: when the store refuses, or a record is not a JSON object
    """
    import botocore.exceptions as bx

    client = client or open_client(opts)
    prefix = ObjectURL(bucket=url.bucket, key=url.key.rstrip("/") + "/" if url.key.strip("/") else "")
    out = []
    try:
        for bundle in _records_under(client, prefix):
            got = _get_small(client, bundle.child(UPLOAD_RECORD))
            if got is not None:
                out.append((str(bundle), _json_object(got[0], bundle.child(UPLOAD_RECORD))))
    except (bx.BotoCoreError, bx.ClientError) as e:
        raise translate_error(e, str(url), opts) from e
    if not out:
        raise ObjectNotFound(str(url), "no bundle (UPLOAD.json) at or under it")
    return out


def _exists(client, url: ObjectURL) -> bool:
    import botocore.exceptions as bx

    try:
        client.head_object(Bucket=url.bucket, Key=url.key)
        return True
    except bx.ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return False
        raise


def _records_under(client, prefix: ObjectURL) -> list[ObjectURL]:
    out: list[ObjectURL] = []
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=prefix.bucket, Prefix=prefix.key)
    for page in pages:
        for o in page.get("Contents", []):
            key = o["Key"]
            if key.endswith(f"/{UPLOAD_RECORD}"):
                out.append(ObjectURL(bucket=prefix.bucket, key=key[: -len(UPLOAD_RECORD)]))
                if len(out) >= MAX_BUNDLES:
                    return out
    return out


def _get_small(client, url: ObjectURL) -> tuple[bytes, str] | None:
    """(the object's bytes, its ETag), at most :data:`MAX_RECORD`; None when there is none."""
    import botocore.exceptions as bx

    try:
        r = client.get_object(Bucket=url.bucket, Key=url.key)
    except bx.ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return None
        raise
    body = r["Body"]
    try:
        data = body.read(MAX_RECORD + 1)
    finally:
        body.close()
    if len(data) > MAX_RECORD:
        raise ObjectStoreError(str(url), f"more than {MAX_RECORD:,} bytes: not a bundle's record")
    return data, str(r.get("ETag") or "")


Planned = tuple[str, str, object, object]  # (path in the bundle, object key, size, sha256) as a record says


def _plan(client, prefix: ObjectURL) -> tuple[list[Planned], str] | None:
    """The objects of the bundle at ``prefix`` and its record's ETag; None when the prefix holds neither an
    upload record nor a manifest."""
    got = _get_small(client, prefix.child(UPLOAD_RECORD))
    if got is not None:
        doc = _json_object(got[0], prefix.child(UPLOAD_RECORD))
        items: list[tuple[object, object, object, object]] = [
            (i.get("path"), i.get("key"), i.get("size"), i.get("sha256")) for i in _dicts(doc.get("items"))]
        items += [(object_store_key(o["store_key"]), o.get("key"), o.get("size"), o.get("sha256"))
                  for o in _dicts(doc.get("objects")) if isinstance(o.get("store_key"), str)]
        return [(p, k, s, h) for p, k, s, h in items if isinstance(p, str) and isinstance(k, str)], got[1]
    got = _get_small(client, prefix.child(MANIFEST))
    if got is None:
        return None
    doc = _json_object(got[0], prefix.child(MANIFEST))
    planned: list[Planned] = [(i["path"], prefix.child(i["path"]).key, i.get("size"), i.get("sha256"))
                              for i in _dicts(doc.get("items")) if isinstance(i.get("path"), str)]
    return [*planned, (MANIFEST, prefix.child(MANIFEST).key, len(got[0]), sha256(got[0]).hexdigest())], got[1]


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _json_object(data: bytes, url: ObjectURL) -> dict:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ObjectStoreError(str(url), f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ObjectStoreError(str(url), "not a JSON object")
    return doc


def _entry(opts: StoreOptions, url: ObjectURL, etag: str) -> str:
    ident = f"{opts.endpoint() or 'aws'}|{url.bucket}|{url.key}|{etag}"
    return cache_path("s3", sha256(ident.encode()).hexdigest()[:32])


@contextlib.contextmanager
def _locked(entry: str):
    """The cache entry's directory, held under its lock (one fetch builds it; the others wait, then reuse)."""
    try:
        os.makedirs(entry, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(entry, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise CacheUnavailable(entry, e.strerror or str(e)) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.utime(entry)  # last used: what pruning goes by
        yield entry
    finally:
        os.close(fd)


def _fetch_bundle(client, prefix: ObjectURL, opts: StoreOptions) -> str | None:
    """The bundle at ``prefix`` as a directory of the cache; None when there is none there."""
    planned = _plan(client, prefix)
    if planned is None:
        return None
    items, etag = planned
    if len(items) > MAX_ITEMS:
        raise ObjectStoreError(str(prefix), f"its record lists more than {MAX_ITEMS:,} objects")
    with _locked(_entry(opts, prefix, etag)) as entry:
        final = os.path.join(entry, "bundle")
        if os.path.isdir(final):
            return final
        _room(entry, sum(s for _p, _k, s, _h in items if isinstance(s, int)))
        tmp = os.path.join(entry, f".bundle.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            for path, key, size, digest in items:
                _download(client, ObjectURL(bucket=prefix.bucket, key=key), tmp, path, size, digest)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final


def _room(directory: str, need: int) -> None:
    st = os.statvfs(directory)
    spare = st.f_bavail * st.f_frsize - _FREE_RESERVE
    if need > spare:
        raise CacheUnavailable(directory, f"the bundle needs {need:,} bytes; {max(0, spare):,} to spare "
                                          "(1 GiB stays free)")


def _download(client, url: ObjectURL, root: str, path: str, size: object, digest: object) -> None:
    """One object to ``root/path`` (made inside ``root``, a new file), at most its recorded size, its SHA-256
    checked as it arrives."""
    if not isinstance(size, int) or size < 0 or size > max_core_bytes():
        raise ObjectStoreError(str(url), f"its record gives it no usable size ({size!r})")
    parent, _, name = path.rpartition("/")
    if not name or name.startswith(".") or path.startswith("/"):
        raise ObjectStoreError(str(url), f"{path!r} is not a path inside a bundle")
    try:
        dir_fd = rootpath.makedirs_in_root(root, parent, 0o700) if parent else os.open(root, os.O_PATH)
    except OSError as e:
        raise ObjectStoreError(str(url), f"{path!r} is not a path inside a bundle ({e.strerror})") from e
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except FileExistsError as e:
        raise ObjectStoreError(str(url), f"{path!r} is listed twice") from e
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "wb") as out:
        got = _stream(client, url, out, size)
    if got[1] != size or (isinstance(digest, str) and got[0] != digest):
        raise ObjectStoreError(str(url), f"{got[1]:,} bytes, SHA-256 {got[0][:16]}...; its record says "
                                         f"{size:,} bytes, {str(digest)[:16]}...")


def _stream(client, url: ObjectURL, out, limit: int) -> tuple[str, int]:
    """(SHA-256, bytes) of the object written to ``out``: at most ``limit`` + 1 bytes read."""
    import hashlib

    body = client.get_object(Bucket=url.bucket, Key=url.key)["Body"]
    h = hashlib.sha256()
    n = 0
    try:
        while n <= limit and (chunk := body.read(min(_READ, limit + 1 - n))):
            h.update(chunk)
            out.write(chunk)
            n += len(chunk)
    finally:
        body.close()
    return h.hexdigest(), n


def _fetch_core(client, url: ObjectURL, opts: StoreOptions) -> str:
    """A core object in the cache, decompressed when it is zstd: the plain core's path."""
    head = client.head_object(Bucket=url.bucket, Key=url.key)
    size = int(head.get("ContentLength") or 0)
    limit = max_core_bytes()
    if size > limit:
        raise ObjectStoreError(str(url), f"{size:,} bytes: more than FORENSICS_MAX_CORE_BYTES ({limit:,})")
    with _locked(_entry(opts, url, str(head.get("ETag") or ""))) as entry:
        core = os.path.join(entry, "core")
        if os.path.isfile(core):
            return core
        _room(entry, size)
        raw = os.path.join(entry, f".object.tmp{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(raw)
        try:
            fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as out:
                got = _stream(client, url, out, size)
            if got[1] != size:
                raise ObjectStoreError(str(url), f"{got[1]:,} bytes read, {size:,} announced")
            with open(raw, "rb") as f:
                magic = f.read(4)
            if magic == _ZSTD_MAGIC:
                decompress_core(raw, core)
                os.unlink(raw)
            else:
                os.rename(raw, core)
        except OSError as e:
            if isinstance(e, ForensicsError):
                raise
            raise CacheUnavailable(entry, e.strerror or str(e)) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.lstat(raw).st_mode):
                    os.unlink(raw)
        return core
