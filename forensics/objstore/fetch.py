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

A hostile store holds none of it (:mod:`.bounded`): every request is bounded by the command's deadline
(``--deadline``) and its object's own, a listing by its pages, keys and continuation tokens, the records of one
prefix by :data:`MAX_PREFIX_BYTES`, a record's JSON by the values a bundle's record can hold before it is parsed.
Of a prefix of bundles, one that cannot be read (a record dripped, redirected, malformed) is one line in
``problems`` and the others are read.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import threading
import time

from .. import rootpath
from ..bundle import MANIFEST, decompress_core
from ..core.unpack import max_core_bytes
from ..cache import cache_path, prune_lru
from ..digest import sha256
from ..errors import CacheUnavailable, ForensicsError, ObjectNotFound, ObjectStoreError
from ..records import record
from .bounded import READ_DEADLINE, Deadline, call_within, list_keys
from .client import ObjectURL, StoreOptions, open_client, parse_object_url, translate_error
from .upload import UPLOAD_RECORD, object_store_key

__all__ = ["fetch_inputs", "fetch_url", "prune_fetched", "read_bundle_places", "BundlePlaceRecord", "MAX_BUNDLES",
           "MAX_RECORD", "MAX_PREFIX_BYTES"]

MAX_BUNDLES = 1000  # bundles of one prefix fetched as a batch
MAX_RECORD = 16 << 20  # bytes of an UPLOAD.json / MANIFEST.json read
MAX_PREFIX_BYTES = 1 << 30  # bytes of the records of one prefix read, all together
MAX_ITEMS = 20_000
#: JSON values a record may hold, counted on its bytes before it is parsed (what MAX_ITEMS items and objects of
#: a dozen fields each need): a record of 16 MiB of "[[],[],..." or '"ab",' would parse into 20 times its size
_MAX_CONTAINERS = 4 * MAX_ITEMS
_MAX_COMMAS = 20 * MAX_ITEMS
_MAX_QUOTES = 40 * MAX_ITEMS
_LAST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: a later (or negative, or not finite) time is no time
_FREE_RESERVE = 1 << 30
_READ = 1 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def fetch_inputs(inputs, opts: StoreOptions | None = None, *,
                 problems: list[str] | None = None) -> tuple[tuple[str, ...], bool]:
    """The command's inputs with each ``s3://`` URL replaced by the local paths it was fetched to, and whether
    one of them was a prefix of bundles (a batch, however many it holds, as a directory of bundles is).

    :param problems: where a bundle of a prefix that could not be read, or a listing cut short, is said (one
        line each); what was read is still given
    """
    opts = opts or StoreOptions()
    problems = [] if problems is None else problems
    deadline = Deadline(opts.deadline or READ_DEADLINE)
    client = None
    out: list[str] = []
    batch = False
    for text in inputs:
        if not text.startswith("s3://"):
            out.append(text)
            continue
        client = client or open_client(opts)
        paths, many = fetch_url(parse_object_url(text), opts, client=client, deadline=deadline, problems=problems)
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


def fetch_url(url: ObjectURL, opts: StoreOptions, *, client=None, deadline: Deadline | None = None,
              problems: list[str] | None = None) -> tuple[list[str], bool]:
    """Local paths for what ``url`` names: ``[bundle directory]``, ``[core file]`` or a batch of bundles
    (then True; a bundle of it that cannot be read is a line in ``problems``).

    :raises ObjectNotFound: when the URL names no object, bundle nor bundles
    :raises ObjectStoreError: when an object cannot be read, or is not what its record says
    """
    client = client or open_client(opts)
    deadline = deadline or Deadline(opts.deadline or READ_DEADLINE)
    problems = [] if problems is None else problems
    try:
        if url.key and not url.key.endswith("/") and _exists(client, url, deadline):
            return [_fetch_core(client, url, opts, deadline)], False
        prefix = _as_prefix(url)
        found = _fetch_bundle(client, prefix, opts, deadline)
        if found is not None:
            return [found], False
        records = _records_under(client, prefix, opts, deadline, problems)
        if not records:
            raise ObjectNotFound(str(url), "no object, bundle (UPLOAD.json, MANIFEST.json) nor bundles under it")
        out = []
        for r in records:
            try:
                if (p := _fetch_bundle(client, r, opts, deadline)) is not None:
                    out.append(p)
            except Exception as e:  # noqa: BLE001 - one bundle of many: said, the others read
                problems.append(f"bundle {r} not read: {_ours(e, str(r), opts)}")
        return out, True
    except ForensicsError:
        raise
    except Exception as e:  # botocore's errors, a redirect loop's RecursionError: one line
        raise translate_error(e, str(url), opts) from e


@record
class BundlePlaceRecord:
    """What ``fleet --bundles`` reads of a bundle's ``UPLOAD.json``: where the bundle is (its ``s3://`` URL) and
    its ``place``'s fingerprint, node and time (None when absent, not a number, not finite or out of range)."""

    location: str
    fingerprint: str | None
    node: str | None
    time: float | None


def read_bundle_places(url: ObjectURL, opts: StoreOptions, *, client=None,
                       problems: list[str] | None = None) -> list[BundlePlaceRecord]:
    """The places of the bundles at or under ``url``, from their upload records alone, at most
    :data:`MAX_BUNDLES`, in key order.  Only ``place`` is kept of each record; each is at most
    :data:`MAX_RECORD` bytes and all of them :data:`MAX_PREFIX_BYTES`.  A record that cannot be read (late,
    redirected, not JSON) is one line in ``problems``; the others are read.

    :raises ObjectNotFound: when no bundle is there
    :raises ObjectStoreError: when the store refuses the listing
    """
    client = client or open_client(opts)
    deadline = Deadline(opts.deadline or READ_DEADLINE)
    problems = [] if problems is None else problems
    prefix = _as_prefix(url)
    out: list[BundlePlaceRecord] = []
    read = 0
    try:
        bundles = _records_under(client, prefix, opts, deadline, problems)
    except ForensicsError:
        raise
    except Exception as e:  # botocore's errors, a redirect loop's RecursionError: one line
        raise translate_error(e, str(url), opts) from e
    for n, bundle in enumerate(bundles):
        where = bundle.child(UPLOAD_RECORD)
        if read >= MAX_PREFIX_BYTES:
            problems.append(f"{url}: {len(bundles) - n:,} bundles' records not read: {read:,} bytes of records read "
                            f"already (at most {MAX_PREFIX_BYTES:,} a prefix)")
            break
        try:
            got = _get_small(client, where, deadline)
            if got is not None:
                read += len(got[0])
                place = _place_of(got[0], where, str(bundle))
                out.append(place)
                if place.time is None and place.fingerprint:
                    problems.append(f"bundle {bundle}: its place.time is not a time a clock gives (absent, not a "
                                    "number, not finite or out of range): counted without a time")
        except Exception as e:  # noqa: BLE001 - one record of many: said, the others read
            problems.append(f"bundle {bundle} not counted: {_ours(e, str(where), opts)}")
    if not out and not problems:
        raise ObjectNotFound(str(url), "no bundle (UPLOAD.json) at or under it")
    return out


def _as_prefix(url: ObjectURL) -> ObjectURL:
    return ObjectURL(bucket=url.bucket, key=url.key.rstrip("/") + "/" if url.key.strip("/") else "")


def _ours(e: BaseException, url: str, opts: StoreOptions) -> ForensicsError:
    """``e`` as one of our errors (SDK errors translated, their text redacted)."""
    return e if isinstance(e, ForensicsError) else translate_error(e, url, opts)


def _place_of(data: bytes, url: ObjectURL, location: str) -> BundlePlaceRecord:
    """The place an upload record gives, read keeping nothing else of it."""
    def keep(pairs: list) -> dict | None:  # a record's objects but its top and its place are dropped as parsed
        d = dict(pairs)
        if "place" in d:
            return {"place": d["place"]}
        return {k: d[k] for k in ("fingerprint", "node", "time") if k in d} if "fingerprint" in d else None

    doc = _json_object(data, url, object_pairs_hook=keep)
    found = doc.get("place")
    place: dict = found if isinstance(found, dict) else {}
    fp, node = place.get("fingerprint"), place.get("node")
    return BundlePlaceRecord(location=location, fingerprint=fp if isinstance(fp, str) and fp else None,
                             node=node if isinstance(node, str) else None, time=_time(place.get("time")))


def _time(value: object) -> float | None:
    """A record's time as seconds since the epoch; None when it is not one a clock gave.

    >>> _time(1700000000), _time(float("inf")), _time(int("9" * 401)), _time(True)
    (1700000000.0, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        t = float(value)
    except OverflowError:
        return None
    return t if 0.0 <= t <= _LAST_TIME else None  # NaN compares False


def _exists(client, url: ObjectURL, deadline: Deadline) -> bool:
    import botocore.exceptions as bx

    try:
        call_within(lambda _c: client.head_object(Bucket=url.bucket, Key=url.key), deadline=deadline, url=str(url),
                    what="its HEAD")
        return True
    except bx.ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
            return False
        raise


def _records_under(client, prefix: ObjectURL, opts: StoreOptions, deadline: Deadline,
                   problems: list[str]) -> list[ObjectURL]:
    """The bundles under ``prefix`` (the keys ending in ``/UPLOAD.json``), at most :data:`MAX_BUNDLES`."""
    found: list[ObjectURL] = []

    def record_key(key: str) -> bool:
        if key.endswith(f"/{UPLOAD_RECORD}"):
            found.append(ObjectURL(bucket=prefix.bucket, key=key[: -len(UPLOAD_RECORD)]))
        return len(found) >= MAX_BUNDLES

    list_keys(client, prefix.bucket, prefix.key, deadline=deadline, problems=problems, url=str(prefix),
              translate=lambda e: _ours(e, str(prefix), opts), stop_at=record_key)
    return found


def _get_small(client, url: ObjectURL, deadline: Deadline) -> tuple[bytes, str] | None:
    """(the object's bytes, its ETag), at most :data:`MAX_RECORD`; None when there is none."""
    import botocore.exceptions as bx

    def get(call) -> tuple[bytes, str] | None:
        started = time.monotonic()
        try:
            r = client.get_object(Bucket=url.bucket, Key=url.key)
        except bx.ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise
        call.sized(started, r.get("ContentLength"))
        call.body = body = r["Body"]
        try:
            data = body.read(MAX_RECORD + 1)
        finally:
            body.close()
        return data, str(r.get("ETag") or "")

    got = call_within(get, deadline=deadline, url=str(url), what="the record")
    if got is not None and len(got[0]) > MAX_RECORD:
        raise ObjectStoreError(str(url), f"more than {MAX_RECORD:,} bytes: not a bundle's record")
    return got


Planned = tuple[str, str, object, object]  # (path in the bundle, object key, size, sha256) as a record says


def _plan(client, prefix: ObjectURL, deadline: Deadline) -> tuple[list[Planned], str] | None:
    """The objects of the bundle at ``prefix`` and its record's ETag; None when the prefix holds neither an
    upload record nor a manifest."""
    got = _get_small(client, prefix.child(UPLOAD_RECORD), deadline)
    if got is not None:
        doc = _json_object(got[0], prefix.child(UPLOAD_RECORD))
        items: list[tuple[object, object, object, object]] = [
            (i.get("path"), i.get("key"), i.get("size"), i.get("sha256")) for i in _dicts(doc.get("items"))]
        items += [(object_store_key(o["store_key"]), o.get("key"), o.get("size"), o.get("sha256"))
                  for o in _dicts(doc.get("objects")) if isinstance(o.get("store_key"), str)]
        return [(p, k, s, h) for p, k, s, h in items if isinstance(p, str) and isinstance(k, str)], got[1]
    got = _get_small(client, prefix.child(MANIFEST), deadline)
    if got is None:
        return None
    doc = _json_object(got[0], prefix.child(MANIFEST))
    planned: list[Planned] = [(i["path"], prefix.child(i["path"]).key, i.get("size"), i.get("sha256"))
                              for i in _dicts(doc.get("items")) if isinstance(i.get("path"), str)]
    return [*planned, (MANIFEST, prefix.child(MANIFEST).key, len(got[0]), sha256(got[0]).hexdigest())], got[1]


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _json_object(data: bytes, url: ObjectURL, *, object_pairs_hook=None) -> dict:
    """A record's JSON object, parsed only when its bytes hold no more values than a bundle's record can (each
    value parsed costs ten to twenty times its bytes)."""
    if data.count(b"{") + data.count(b"[") > _MAX_CONTAINERS or data.count(b",") > _MAX_COMMAS \
            or data.count(b'"') > _MAX_QUOTES:
        raise ObjectStoreError(str(url), f"holds more JSON values than a bundle's record ({MAX_ITEMS:,} objects): "
                                         "not parsed")
    try:
        doc = json.loads(data, object_pairs_hook=object_pairs_hook)
    except (ValueError, RecursionError) as e:
        raise ObjectStoreError(str(url), f"not JSON: {str(e)[:200]}") from e
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


def _fetch_bundle(client, prefix: ObjectURL, opts: StoreOptions, deadline: Deadline) -> str | None:
    """The bundle at ``prefix`` as a directory of the cache; None when there is none there."""
    planned = _plan(client, prefix, deadline)
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
                _download(client, ObjectURL(bucket=prefix.bucket, key=key), tmp, path, size, digest, deadline)
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


def _download(client, url: ObjectURL, root: str, path: str, size: object, digest: object,
              deadline: Deadline) -> None:
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
        got = _stream(client, url, out, size, deadline)
    if got[1] != size or (isinstance(digest, str) and got[0] != digest):
        raise ObjectStoreError(str(url), f"{got[1]:,} bytes, SHA-256 {got[0][:16]}...; its record says "
                                         f"{size:,} bytes, {str(digest)[:16]}...")


def _stream(client, url: ObjectURL, out, limit: int, deadline: Deadline) -> tuple[str, int]:
    """(SHA-256, bytes) of the object written to ``out``: at most ``limit`` + 1 bytes read, within ``deadline``
    and the object's own bound (by ``limit``, its expected size)."""
    import hashlib

    cut = threading.Event()  # set when given up: the thread stops writing to ``out``

    def stream(call) -> tuple[str, int]:
        call.sized(time.monotonic(), limit)
        call.body = body = client.get_object(Bucket=url.bucket, Key=url.key)["Body"]
        h = hashlib.sha256()
        n = 0
        try:
            while n <= limit and not cut.is_set() and (chunk := body.read(min(_READ, limit + 1 - n))):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
        finally:
            body.close()
        return h.hexdigest(), n

    try:
        return call_within(stream, deadline=deadline, url=str(url), what="the object")
    except BaseException:
        cut.set()
        raise


def _fetch_core(client, url: ObjectURL, opts: StoreOptions, deadline: Deadline) -> str:
    """A core object in the cache, decompressed when it is zstd: the plain core's path."""
    head = call_within(lambda _c: client.head_object(Bucket=url.bucket, Key=url.key), deadline=deadline,
                       url=str(url), what="its HEAD")
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
                got = _stream(client, url, out, size, deadline)
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
