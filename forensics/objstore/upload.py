"""A sealed capture bundle into an S3-compatible bucket, every object verified, the node's copy deleted after.

Object keys (each part made of ``A-Z a-z 0-9 . _ -``, anything else ``_``)::

    PREFIX/CLUSTER/NODE/NAMESPACE/POD/TIME-FINGERPRINT-CRASHID/<the bundle's own paths>
    PREFIX/CLUSTER/NODE/NAMESPACE/POD/TIME-FINGERPRINT-CRASHID/UPLOAD.json   written last
    PREFIX/objects/<key[:2]>/<key[2:]>    the ELF objects the core maps, by build-id (shared by bundles)

``TIME`` is the crash's UTC time (``20261201T155812Z``); ``FINGERPRINT`` the agent's analysis' (``unknown``
before one); a pod without a name known is ``_``.  Every regular file of the bundle is uploaded (the
zstd core, the evidence, ``MANIFEST.json``, ``60-analysis/`` once the agent wrote it), and the objects of
the core directory's build-id store the bundle's record names.  Each file is checked against the
bundle's MANIFEST.json (SHA-256 and size) as it is read for the upload, and each object against the
file after it (:mod:`.transfer`).  ``UPLOAD.json``, the upload's record (every object: path, key, size,
SHA-256, how it was verified), is the last object written: a bundle prefix without it is an upload
cut short, which a second run completes (objects already there and verified are not sent again).  A bundle
whose core the core directory's budget deleted (its record says so) uploads what is left: the missing core
and the rewritten record are named in ``UPLOAD.json``'s ``not_as_sealed``; any other missing or changed
file is refused.

The same crash uploaded again under the same prefix (a second agent; ``60-analysis/`` removed so that an
upgraded agent analyzes again) finds its objects there.  What the agent wrote itself -- ``60-analysis/``, the
record the budget rewrote, ``UPLOAD.json`` -- is overwritten (``UPLOAD.json``'s item says ``replaced``); what the
core handler captured (the core, the evidence, ``MANIFEST.json``) is compared by hash, and other bytes at its
key are a conflict (:class:`~forensics.errors.UploadConflict`: no retry mends it).  An object of the build-id
store with other bytes is kept (another file of the same build-id, from another node: ``other-bytes``).

The node's copy is deleted only when every object is verified and the record written, and never with
``keep``.  The build-id store's objects stay (other crashes share them; the store's budget ages them).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass

from .. import rootpath
from ..bundle import find_object_store, read_bundle_json, read_crash_record, read_manifest
from ..bundle.layout import (
    ANALYSIS,
    ANALYSIS_DIR,
    ANALYSIS_POD,
    CORE_DIR,
    MANIFEST,
    OBJECTS,
    PROCESS_SNAPSHOT,
    RECORD,
    UPLOADED,
)
from ..bundle.record import CoreState
from ..errors import InputNotFound, UnsafeBundle, UploadNotVerified
from .client import ObjectURL, StoreOptions, open_client
from .transfer import Transfer, digest_file, part_layout

__all__ = ["UPLOAD_RECORD", "BundlePlace", "UploadedObject", "UploadResult", "read_place", "upload_bundle",
           "object_store_key"]

UPLOAD_RECORD = "UPLOAD.json"
MAX_FILES = 20_000  # files of one bundle uploaded (a bundle is data from the node: bounded)
_STORE_KEY = re.compile(r"[0-9a-f]{4,128}|sha256-[0-9a-f]{64}")
_KEY_PART = re.compile(r"[^A-Za-z0-9._-]")


def _key_part(value: object, default: str = "_") -> str:
    """One component of an object key: ``A-Z a-z 0-9 . _ -`` (anything else ``_``), at most 100 characters.

    >>> _key_part("kube system/../x"), _key_part(".."), _key_part(None)
    ('kube_system_.._x', '_', '_')
    """
    text = _KEY_PART.sub("_", str(value))[:100] if isinstance(value, str) and value else default
    return default if text in (".", "..") else text


@dataclass(frozen=True, slots=True, kw_only=True)
class BundlePlace:
    """Where a bundle goes in the bucket: by cluster, node, namespace, pod, time and fingerprint."""

    cluster: str
    node: str
    namespace: str | None
    pod: str | None
    time: float | None
    fingerprint: str | None
    crash_id: str

    def prefix(self) -> str:
        """The bundle's key prefix under the destination (no trailing ``/``).

        >>> BundlePlace(cluster="prod", node="gpu-1", namespace="ml", pod="exporter-x", time=0.0,
        ...             fingerprint="0123456789ab", crash_id="c1").prefix()
        'prod/gpu-1/ml/exporter-x/19700101T000000Z-0123456789ab-c1'
        """
        when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.time)) if self.time is not None else "notime"
        crash_id = _key_part(self.crash_id)
        if crash_id.startswith(f"{when}-"):  # the core handler's ids begin with the time: said once
            crash_id = crash_id[len(when) + 1:]
        leaf = f"{when}-{_key_part(self.fingerprint, 'unknown')}-{crash_id}"
        return "/".join((_key_part(self.cluster), _key_part(self.node), _key_part(self.namespace),
                         _key_part(self.pod), leaf))


def _doc(bundle_dir: str, rel: str) -> dict:
    doc = read_bundle_json(bundle_dir, rel, 8 << 20)
    return doc if isinstance(doc, dict) else {}


def read_place(bundle_dir: str, *, cluster: str, node: str | None = None) -> BundlePlace:
    """A bundle's place from its own records: the handler's (node, time, crash id, pod UID), the agent's
    analysis (fingerprint) and pod (namespace, name); ``node`` overrides the recorded one."""
    rec = read_crash_record(bundle_dir)
    manifest = _doc(bundle_dir, MANIFEST)
    analysis = _doc(bundle_dir, ANALYSIS).get("analysis")
    pod = _doc(bundle_dir, ANALYSIS_POD)
    fp = analysis.get("fingerprint") if isinstance(analysis, dict) else None
    crash_id = (rec.crash_id if rec else None) or manifest.get("crash_id") \
        or os.path.basename(os.path.normpath(bundle_dir))
    return BundlePlace(
        cluster=cluster, node=node or (rec.node if rec else None) or os.uname().nodename,
        namespace=pod.get("namespace") if isinstance(pod.get("namespace"), str) else None,
        pod=pod.get("name") if isinstance(pod.get("name"), str) else (rec.pod_uid if rec else None),
        time=rec.time if rec else None, fingerprint=fp if isinstance(fp, str) else None, crash_id=str(crash_id))


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadedObject:
    path: str  # in the bundle, or objects/xx/rest for a stored object
    key: str
    size: int
    sha256: str
    verified_by: str  # sha256 | etag | read-back | other-bytes (a store object of the same key kept)
    uploaded: bool  # False: it was there already, verified
    in_manifest: bool
    store_key: str | None = None  # an object of the core directory's build-id store
    replaced: bool = False  # an object the agent writes (60-analysis/) overwrote one with other bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadResult:
    url: str  # s3://bucket/PREFIX/.../ of the bundle
    record: str  # s3:// URL of UPLOAD.json
    objects: tuple[UploadedObject, ...]
    deleted: bool

    @property
    def bytes_uploaded(self) -> int:
        return sum(o.size for o in self.objects if o.uploaded)


def object_store_key(store_key: str) -> str:
    """The object key (under the destination) of a build-id store's object.

    >>> object_store_key("0a1b2c3d")
    'objects/0a/1b2c3d'
    """
    return f"{OBJECTS}/{store_key[:2]}/{store_key[2:]}"


def _bundle_files(bundle_dir: str) -> list[str]:
    """The bundle's regular files (relative paths, MANIFEST.json last); names starting with ``.`` (a file
    being written, a lock), symlinks and the agent's record of the upload are left out; directories are not
    followed out of the bundle."""
    out: list[str] = []
    for root, dirs, files in os.walk(bundle_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.startswith(".") or (root == bundle_dir and name == UPLOADED) \
                    or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            out.append(os.path.relpath(path, bundle_dir))
            if len(out) > MAX_FILES:
                raise UnsafeBundle(bundle_dir, f"more than {MAX_FILES:,} files")
    return sorted(out, key=lambda rel: (rel == MANIFEST, rel))


def _store_objects(bundle_dir: str) -> tuple[str | None, list[str]]:
    """(the core directory's build-id store, the keys the bundle's records name that it holds) -- none when
    the store is the bundle's own ``objects/`` (uploaded with the bundle's files)."""
    store = find_object_store(bundle_dir)
    if store is None or os.path.dirname(store) == os.path.abspath(bundle_dir):
        return None, []
    rec = read_crash_record(bundle_dir)
    keys: set[str] = set(rec.objects.values()) if rec else set()
    objects = _doc(bundle_dir, PROCESS_SNAPSHOT).get("objects")
    keys.update(str(o["build_id"]) for o in (objects if isinstance(objects, list) else ()) if isinstance(o, dict)
                and isinstance(o.get("build_id"), str))
    found = []
    for key in sorted(k for k in keys if _STORE_KEY.fullmatch(k)):
        for name in (key, f"{key}.debug"):
            with contextlib.suppress(OSError, ValueError):
                if stat.S_ISREG(rootpath.stat_in_root(store, f"{name[:2]}/{name[2:]}").st_mode):
                    found.append(name)
    return store, found


def _manifest_items(bundle_dir: str) -> dict[str, tuple[str, int]]:
    items = read_manifest(bundle_dir).get("items")
    out: dict[str, tuple[str, int]] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            size = item.get("size")
            out[item["path"]] = (str(item.get("sha256")), size if isinstance(size, int) else -1)
    return out


def _put(t: Transfer, root: str, rel: str, url: ObjectURL, listed: tuple[str, int] | None, *, replace: bool = False,
         keep_other: bool = False) -> UploadedObject:
    """One file of ``root`` (opened inside it) to ``url``: checked against its manifest entry, verified; an object
    there with other bytes replaced (``replace``), kept (``keep_other``) or a conflict (:meth:`Transfer.put_file`)."""
    try:
        fd = rootpath.open_in_root(root, rel)
    except (OSError, ValueError) as e:
        raise InputNotFound(os.path.join(root, rel)) from e
    try:
        digests = digest_file(fd, part_layout(os.fstat(fd).st_size, t.opts))
        if listed is not None and (digests.sha256, digests.size) != listed:
            raise UploadNotVerified(os.path.join(root, rel), f"changed since the bundle was sealed: SHA-256 "
                                                             f"{digests.sha256[:16]}..., {digests.size:,} bytes; "
                                                             f"MANIFEST.json says {listed[0][:16]}..., "
                                                             f"{listed[1]} bytes")
        how, uploaded, replaced = t.put_file(fd, url, digests, replace=replace, keep_other=keep_other)
    finally:
        os.close(fd)
    return UploadedObject(path=rel, key=url.key, size=digests.size, sha256=digests.sha256, verified_by=how,
                          uploaded=uploaded, in_manifest=listed is not None, replaced=replaced)


def upload_bundle(bundle_dir: str, dest: ObjectURL, place: BundlePlace, opts: StoreOptions, *,
                  keep: bool = False, client=None) -> UploadResult:
    """Upload the sealed bundle at ``bundle_dir`` under ``dest`` (see the module's layout), verify every
    object, write ``UPLOAD.json`` last, then (unless ``keep``) delete the bundle directory.

    :raises InputNotFound: when the bundle has no MANIFEST.json, or a file it lists is missing
    :raises UploadNotVerified: when a file no longer matches MANIFEST.json, or an object not the file
    :raises UploadConflict: when the bucket holds other bytes at the key of a file the handler captured
    :raises ObjectStoreDenied: when the store refuses the credentials (or none are found)
    :raises ObjectStoreError: when the store fails through every retry; nothing is deleted then
    """
    bundle_dir = os.path.abspath(bundle_dir)
    listed = _manifest_items(bundle_dir)
    files = _bundle_files(bundle_dir)
    unsealed = _budget_changes(bundle_dir, listed, files)
    missing = sorted(set(listed) - set(files) - set(unsealed))
    if missing:
        raise InputNotFound(os.path.join(bundle_dir, missing[0]),
                            f"The bundle's MANIFEST.json lists {len(missing)} file(s) it no longer has; "
                            "nothing was uploaded.")
    for rel in unsealed:  # not compared with the manifest: the budget changed them after the seal, and says so
        listed.pop(rel, None)
    base = dest.child(place.prefix())
    store, store_keys = _store_objects(bundle_dir)
    done: list[UploadedObject] = []
    with Transfer(client or open_client(opts), opts) as t:
        for rel in files:
            done.append(_put(t, bundle_dir, rel, base.child(rel), listed.get(rel), replace=_agents_own(rel, unsealed)))
        for key in store_keys:
            assert store is not None
            obj = _put(t, store, f"{key[:2]}/{key[2:]}", dest.child(object_store_key(key)), None, keep_other=True)
            done.append(UploadedObject(path=object_store_key(key), key=obj.key, size=obj.size, sha256=obj.sha256,
                                       verified_by=obj.verified_by, uploaded=obj.uploaded, in_manifest=False,
                                       store_key=key))
        record = base.child(UPLOAD_RECORD)
        t.put_bytes(record, _record_document(place, base, done, unsealed))
    if not keep:
        _delete_bundle(bundle_dir)
    return UploadResult(url=f"{base}/", record=str(record), objects=tuple(done), deleted=not keep)


def _agents_own(rel: str, unsealed: dict[str, str]) -> bool:
    """Whether the bundle's file ``rel`` is one the agent writes (its analysis) or rewrites after the seal (the
    record the budget rewrote): overwritten in the bucket when the object there has other bytes -- the same crash
    analyzed again, by an upgraded agent or a second one. Every other file is captured evidence, compared by hash.

    >>> _agents_own("60-analysis/analysis.json", {}), _agents_own("50-core/core.zst", {})
    (True, False)
    """
    return rel.startswith(f"{ANALYSIS_DIR}/") or rel in unsealed


def _budget_changes(bundle_dir: str, listed: dict[str, tuple[str, int]], files: list[str]) -> dict[str, str]:
    """{path: why} of the manifest's items the core directory's budget changed after the bundle was sealed, as
    the handler's record says: a core deleted for the budget (missing) and the record that says so (rewritten).
    Nothing when the record says no such thing: then a missing or changed item is refused."""
    rec = read_crash_record(bundle_dir)
    if rec is None or rec.core.state is not CoreState.DELETED_FOR_BUDGET:
        return {}
    out = {rel: "deleted for the core directory's budget" for rel in listed
           if rel not in files and rel.startswith(f"{CORE_DIR}/")}
    if RECORD in listed:
        out[RECORD] = "rewritten: the core deleted for the budget"
    return out


def _record_document(place: BundlePlace, base: ObjectURL, done: list[UploadedObject],
                     unsealed: dict[str, str]) -> bytes:
    doc = {
        "not_as_sealed": [{"path": p, "why": why} for p, why in sorted(unsealed.items())],
        "schema_version": 1, "uploaded_at": time.time(), "bundle": base.key + "/",
        "place": {"cluster": place.cluster, "node": place.node, "namespace": place.namespace, "pod": place.pod,
                  "time": place.time, "fingerprint": place.fingerprint, "crash_id": place.crash_id},
        "items": [{"path": o.path, "key": o.key, "size": o.size, "sha256": o.sha256, "verified_by": o.verified_by,
                   "in_manifest": o.in_manifest, **({"replaced": True} if o.replaced else {})}
                  for o in done if o.store_key is None],
        "objects": [{"store_key": o.store_key, "key": o.key, "size": o.size, "sha256": o.sha256,
                     "verified_by": o.verified_by} for o in done if o.store_key is not None],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _delete_bundle(bundle_dir: str) -> None:
    """The bundle directory gone: renamed out of the crash list first (a reader never sees half of it)."""
    parent, name = os.path.split(bundle_dir)
    doomed = os.path.join(parent, f".{name}.uploaded")
    try:
        os.rename(bundle_dir, doomed)
    except OSError:
        doomed = bundle_dir
    shutil.rmtree(doomed)
