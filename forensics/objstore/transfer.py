"""One file into one object, verified: the local digests, the transfer (s3transfer), the server's checksum.

A file is read once here before it is sent: its SHA-256 (compared with what the bundle's MANIFEST says by
the caller) and the SHA-256 of each part as s3transfer will cut it.  s3transfer sends it from
``/proc/self/fd/N`` (the descriptor the caller opened inside the bundle: nothing is looked up by name
again), each part with its SHA-256, which the server checks against the bytes it received.  Then the
object is verified against the local digests, by the first of these the server offers:

1. its SHA-256 checksum (``ChecksumMode=ENABLED``): of the whole object, or the composite of the parts'
   (``base64(sha256(part digests))-N``), computed here from the same parts;
2. its ETag, when it is an MD5 (no SSE-KMS, no SSE-C): the MD5, or MD5 of the parts' MD5s ``-N``;
3. the object read back and hashed.

Memory is bounded by the number of parts in flight (:attr:`StoreOptions.concurrency`), each sent from the
file in small reads, whatever the file's size.
"""
from __future__ import annotations

import base64
import hashlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ObjectNotFound, ObjectStoreDenied, ObjectStoreError, UploadConflict, UploadNotVerified
from .client import ObjectURL, StoreOptions, translate_error

__all__ = ["FileDigests", "Transfer", "digest_file", "part_layout", "OTHER_BYTES"]

#: how an object kept with other bytes than the file is recorded (a build-id store's object: another file of the
#: same build-id, uploaded from another node first)
OTHER_BYTES = "other-bytes"
_READ = 1 << 20
_MD5_ETAG = "0123456789abcdef"


@dataclass(frozen=True, slots=True, kw_only=True)
class FileDigests:
    """What a file is, as read here: size, SHA-256, and the composite SHA-256 of its parts (or None)."""

    size: int
    sha256: str  # hex
    parts: int  # 0: sent in one request
    composite_sha256: str | None  # base64(sha256(part digests))-N when sent in parts

    @property
    def expected_checksum(self) -> str:
        """The ``x-amz-checksum-sha256`` the object must have."""
        if self.composite_sha256 is not None:
            return self.composite_sha256
        return base64.b64encode(bytes.fromhex(self.sha256)).decode()


def part_layout(size: int, opts: StoreOptions) -> int:
    """The part size s3transfer cuts a file of ``size`` bytes into; 0: one request (below the threshold)."""
    from s3transfer.utils import ChunksizeAdjuster

    if size < opts.part_size:
        return 0
    return ChunksizeAdjuster().adjust_chunksize(opts.part_size, size)


def digest_file(fd: int, part: int) -> FileDigests:
    """Read the file at ``fd`` once (from offset 0, by pread): its SHA-256 and its parts' composite."""
    whole = hashlib.sha256()
    part_digests: list[bytes] = []
    cur = hashlib.sha256() if part else None
    in_part = offset = 0
    while True:
        want = _READ if not part else min(_READ, part - in_part)
        chunk = os.pread(fd, want, offset)
        if not chunk:
            break
        offset += len(chunk)
        whole.update(chunk)
        if cur is not None:
            cur.update(chunk)
            in_part += len(chunk)
            if in_part == part:
                part_digests.append(cur.digest())
                cur, in_part = hashlib.sha256(), 0
    if cur is not None and in_part:
        part_digests.append(cur.digest())
    composite = None
    if part:
        composite = (base64.b64encode(hashlib.sha256(b"".join(part_digests)).digest()).decode()
                     + f"-{len(part_digests)}")
    return FileDigests(size=offset, sha256=whole.hexdigest(), parts=len(part_digests) if part else 0,
                       composite_sha256=composite)


def _md5_etag(fd: int, part: int) -> str:
    """The ETag an S3 server gives the file sent whole (its MD5) or in parts of ``part`` bytes (the MD5 of
    the parts' MD5s, ``-N``)."""
    size = os.fstat(fd).st_size

    def md5_of(start: int, end: int) -> bytes:
        h = hashlib.md5(usedforsecurity=False)
        while start < end and (chunk := os.pread(fd, min(_READ, end - start), start)):
            h.update(chunk)
            start += len(chunk)
        return h.digest()

    if not part:
        return md5_of(0, size).hex()
    digests = [md5_of(start, min(start + part, size)) for start in range(0, size, part)]
    return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


class Transfer:
    """Uploads (and verifies, and reads back) objects of one store through one client and one s3transfer
    manager; close it (or use it as a context manager) to stop the manager's threads."""

    def __init__(self, client, opts: StoreOptions, *, sleep: Callable[[float], None] = time.sleep) -> None:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        self.client = client
        self.opts = opts
        self.sleep = sleep
        config = TransferConfig(multipart_threshold=opts.part_size, multipart_chunksize=opts.part_size,
                                max_concurrency=max(1, opts.concurrency), max_bandwidth=opts.max_bandwidth,
                                use_threads=True)
        self.manager = create_transfer_manager(client, config)

    def __enter__(self) -> Transfer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.manager.shutdown()

    def extra_args(self, digests: FileDigests) -> dict:
        args: dict = {"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": digests.sha256}}
        if self.opts.sse:
            args["ServerSideEncryption"] = self.opts.sse
        if self.opts.sse_kms_key_id:
            args["SSEKMSKeyId"] = self.opts.sse_kms_key_id
        if self.opts.storage_class:
            args["StorageClass"] = self.opts.storage_class
        return args

    def put_file(self, fd: int, url: ObjectURL, digests: FileDigests, *, replace: bool = False,
                 keep_other: bool = False) -> tuple[str, bool, bool]:
        """Upload the file at ``fd`` to ``url`` unless the object there is already this file, verified,
        retried (rounds with backoff) on what may pass.  An object there with other bytes is overwritten with
        ``replace``, kept with ``keep_other`` (:return: ``other-bytes``, not uploaded), else a conflict.

        :return: (how it was verified, uploaded now, an object with other bytes overwritten)
        :raises UploadConflict: when the object there holds other bytes (neither ``replace`` nor ``keep_other``)
        :raises UploadNotVerified: when the object holds other bytes than the file after the upload
        :raises ObjectStoreDenied, ObjectNotFound: at once (no retry helps)
        :raises ObjectStoreError: when every round failed
        """
        def attempt() -> tuple[str, bool, bool]:
            replaced = False
            try:
                already = self.verify(url, digests, fd=fd, must_exist=False)
            except UploadNotVerified as e:
                if keep_other:
                    return OTHER_BYTES, False, False
                if not replace:
                    raise UploadConflict(e.url, f"already holds other bytes ({e.reason})") from e
                already, replaced = None, True
            if already is not None:
                return already, False, False
            future = self.manager.upload(f"/proc/self/fd/{fd}", url.bucket, url.key, extra_args=self.extra_args(
                digests))
            future.result()
            how = self.verify(url, digests, fd=fd, must_exist=True)
            assert how is not None
            return how, True, replaced

        return self.retrying(attempt, url)

    def retrying(self, fn, url: ObjectURL):
        """``fn()``, tried again after 1, 2, 4 ... s (with jitter, at most 30 s) while it fails in a way a
        retry may mend; botocore retries each request first (:attr:`StoreOptions.attempts`)."""
        import botocore.exceptions as bx

        rounds = max(1, self.opts.rounds)
        for n in range(rounds):
            try:
                return fn()
            except (bx.BotoCoreError, bx.ClientError, OSError, ObjectStoreError) as e:
                err = translate_error(e, str(url), self.opts)
                if isinstance(err, (ObjectStoreDenied, ObjectNotFound, UploadConflict)) or n == rounds - 1:
                    raise err from e
                self.sleep(min(30.0, 2.0 ** n) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def verify(self, url: ObjectURL, digests: FileDigests, *, fd: int | None, must_exist: bool) -> str | None:
        """How the object at ``url`` was found to be the file: ``sha256`` (the server's checksum), ``etag``
        (its MD5s), ``read-back`` (read and hashed); None when there is no such object and not
        ``must_exist``.

        :raises UploadNotVerified: when it is another object (size, checksum or bytes differ)
        """
        import botocore.exceptions as bx

        try:
            head = self.client.head_object(Bucket=url.bucket, Key=url.key, ChecksumMode="ENABLED")
        except bx.ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 and not must_exist:
                return None
            raise
        if head.get("ContentLength") != digests.size:
            raise UploadNotVerified(str(url), f"the object holds {head.get('ContentLength')} bytes, the file "
                                              f"{digests.size}")
        said = head.get("ChecksumSHA256")
        if said:
            if said != digests.expected_checksum:
                raise UploadNotVerified(str(url), f"its SHA-256 checksum is {said}, the file's "
                                                  f"{digests.expected_checksum}")
            return "sha256"
        etag = str(head.get("ETag") or "").strip('"')
        if fd is not None and etag and not head.get("SSEKMSKeyId") and not head.get("SSECustomerAlgorithm") \
                and all(c in _MD5_ETAG for c in etag.partition("-")[0]) and len(etag.partition("-")[0]) == 32:
            expected = _md5_etag(fd, part_layout(digests.size, self.opts) if "-" in etag else 0)
            if etag != expected:
                raise UploadNotVerified(str(url), f"its ETag is {etag}, the file's {expected}")
            return "etag"
        got = self.read_back(url)
        if got != digests.sha256:
            raise UploadNotVerified(str(url), f"read back, its SHA-256 is {got}, the file's {digests.sha256}")
        return "read-back"

    def read_back(self, url: ObjectURL) -> str:
        """The SHA-256 of the object's bytes, streamed."""
        body = self.client.get_object(Bucket=url.bucket, Key=url.key)["Body"]
        h = hashlib.sha256()
        try:
            while chunk := body.read(_READ):
                h.update(chunk)
        finally:
            body.close()
        return h.hexdigest()

    def put_bytes(self, url: ObjectURL, data: bytes) -> None:
        """A small document, sent in one request with its SHA-256 (which the server checks), retried."""
        digest = hashlib.sha256(data).digest()
        args = self.extra_args(FileDigests(size=len(data), sha256=digest.hex(), parts=0, composite_sha256=None))
        args.pop("ChecksumAlgorithm")
        args["ChecksumSHA256"] = base64.b64encode(digest).decode()
        self.retrying(lambda: self.client.put_object(Bucket=url.bucket, Key=url.key, Body=data, **args), url)
