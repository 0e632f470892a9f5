"""The S3 client: object URLs, the options of a store, a boto3 client made from them, its errors translated.

boto3 (botocore and s3transfer) is the one S3 implementation: its credential chain is the AWS SDKs'
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with the
config and credentials files, ``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN`` as EKS sets them, the
container and instance metadata endpoints), its endpoint ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``),
its region ``AWS_REGION``; the options here override the endpoint, region and profile only.  No secret is
taken from the command line (every user of a node reads ``/proc/PID/cmdline``): an endpoint with a
``user:password@`` part is refused (:func:`check_endpoint`), and no secret is ever put in a message: errors name
the bucket, the key, the server's error code and the endpoint without its user part, and every text of the SDK's
they quote passes through the redactor first (:func:`sdk_text`).

boto3 is imported here only, and only when a client is made: ``forensics analyze`` of a local core never
loads it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import (
    EndpointUserinfo,
    ForensicsError,
    ObjectNotFound,
    ObjectStoreDenied,
    ObjectStoreError,
    ObjectStoreUnavailable,
)

__all__ = ["ObjectURL", "StoreOptions", "parse_object_url", "is_object_url", "open_client", "translate_error",
           "redact_endpoint", "check_endpoint", "sdk_text", "SCHEME"]

SCHEME = "s3://"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: the server's error codes that mean "these credentials are not accepted here"
_DENIED = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken",
                     "InvalidClientTokenId", "TokenRefreshRequired", "403", "Forbidden",
                     "AuthorizationHeaderMalformed"})
_NOT_FOUND = frozenset({"NoSuchBucket", "NoSuchKey", "404", "NotFound", "NoSuchUpload"})
_REDIRECTS = frozenset({"301", "302", "303", "307", "308", "PermanentRedirect", "TemporaryRedirect", "Redirect"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectURL:
    """``s3://bucket/key``: a bucket and a key (or a prefix: a key that ends in ``/`` or names none)."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    def child(self, rel: str) -> ObjectURL:
        """The URL of ``rel`` under this one taken as a prefix."""
        base = self.key.rstrip("/")
        return ObjectURL(bucket=self.bucket, key=f"{base}/{rel}" if base else rel)


def is_object_url(text: str) -> bool:
    """Whether a command-line input names an object (``s3://...``) rather than a local path.

    >>> is_object_url("s3://bucket/crashes/x"), is_object_url("./s3:/x")
    (True, False)
    """
    return text.startswith(SCHEME)


def parse_object_url(text: str) -> ObjectURL:
    """``s3://bucket[/key]`` as a record; the key may be empty (the bucket's root).

    >>> parse_object_url("s3://crash-bundles/prod/node-1/")
    ObjectURL(bucket='crash-bundles', key='prod/node-1/')

    :raises ForensicsError: when it is not such a URL (the bucket name S3 allows, a key of at most 1024
        bytes without control characters or ``.``/``..`` components)
    """
    if not is_object_url(text):
        raise ForensicsError(f"{text!r}: not an object URL (s3://BUCKET/KEY)")
    bucket, _, key = text[len(SCHEME):].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ForensicsError(f"{text!r}: {bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)")
    if len(key.encode("utf-8", "surrogatepass")) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ForensicsError(f"{text!r}: not an object key (at most 1024 bytes, no control characters)")
    if any(part in (".", "..") for part in key.split("/")):
        raise ForensicsError(f"{text!r}: an object key with a '.' or '..' component")
    return ObjectURL(bucket=bucket, key=key)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOptions:
    """How to reach the store and how to write to it; None: what the AWS SDKs' environment says."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    attempts: int = 4  # tries of each request (botocore's standard retry mode: exponential backoff, jitter)
    rounds: int = 3  # tries of each object, 1, 2, 4 ... s apart, when every attempt of a request failed
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    part_size: int = 16 << 20  # multipart above this size, in parts of this size (S3: 5 MiB to 5 GiB)
    concurrency: int = 4  # parts in flight at once: memory is about concurrency x a few MiB, whatever the size
    max_bandwidth: int | None = None  # bytes per second of one upload, None: unbounded
    sse: str | None = None  # server-side encryption: "AES256", "aws:kms", "aws:kms:dsse"
    sse_kms_key_id: str | None = None
    storage_class: str | None = None  # STANDARD, STANDARD_IA, GLACIER_IR, ...
    deadline: float | None = None  # seconds a reading command's requests may take together (--deadline)

    def __post_init__(self) -> None:  # refused where the command starts, before any request
        check_endpoint(self.endpoint_url, "--endpoint-url")
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            check_endpoint(os.environ.get(name), name)

    def endpoint(self) -> str | None:
        """The endpoint in use: the option, else the AWS SDKs' environment; None: AWS's own."""
        return self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _userinfo(url: str) -> bool:
    scheme, sep, rest = url.partition("://")
    return "@" in (rest if sep else url).split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]


def check_endpoint(url: str | None, given_as: str) -> None:
    """Refuse an endpoint URL with a ``user[:password]@`` part: a credential there would be in the process list,
    the agent's manifest and every message the SDK makes of the URL.

    :raises EndpointUserinfo: naming where it was given, never its user part
    """
    if url and _userinfo(url):
        raise EndpointUserinfo(given_as, redact_endpoint(url))


def redact_endpoint(url: str | None) -> str:
    """An endpoint as it may be printed: without a ``user:password@`` part, a query or a fragment.

    >>> redact_endpoint("https://key:secret@minio.local:9000/?x=1")
    'https://minio.local:9000/'
    """
    if not url:
        return "AWS S3"
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host = rest.split("/", 1)
    netloc = host[0].rpartition("@")[2]
    path = ("/" + host[1]) if len(host) > 1 else ""
    path = path.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}{sep}{netloc}{path}"


def open_client(opts: StoreOptions):
    """A boto3 S3 client for ``opts`` (credentials found by the SDK's own chain, not here).

    Path-style addressing where an endpoint is given (MinIO, SeaweedFS, Ceph RGW answer on one host
    name); AWS's own choice otherwise.

    :raises ObjectStoreDenied: when the profile named does not exist
    """
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    endpoint = opts.endpoint()
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        check_endpoint(os.environ.get(name), name)
    config = Config(retries={"mode": "standard", "max_attempts": max(1, opts.attempts)},
                    connect_timeout=opts.connect_timeout, read_timeout=opts.read_timeout,
                    max_pool_connections=max(10, opts.concurrency + 2),
                    s3={"addressing_style": "path"} if endpoint else None)
    try:
        session = boto3.session.Session(profile_name=opts.profile, region_name=opts.region)
        return session.client("s3", endpoint_url=opts.endpoint_url, config=config)
    except botocore.exceptions.ProfileNotFound as e:
        raise ObjectStoreDenied(f"profile {opts.profile}", f"no such AWS profile ({e.kwargs.get('profile')})") from e
    except (botocore.exceptions.BotoCoreError, ValueError) as e:
        raise ObjectStoreError(redact_endpoint(endpoint), f"cannot make an S3 client: {_short(e)}") from e


_ANY_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]*@")


def sdk_text(e: object) -> str:
    """What the SDK says (an exception, a server's message) as it may be printed or logged: one line, every URL's
    user part removed, and the redactor's rules applied (a key, a token, a signed URL's signature)."""
    from ..redact import Redactor

    return Redactor().text(_ANY_USERINFO.sub(r"\1", " ".join(str(e).split())))


def _short(e: object, limit: int = 300) -> str:
    text = sdk_text(e)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def translate_error(e: BaseException, url: str, opts: StoreOptions) -> ForensicsError:
    """A botocore / s3transfer error as one of ours, for the object ``url``: credentials refused or missing
    (:class:`ObjectStoreDenied`), no such bucket or key (:class:`ObjectNotFound`), no answer through every
    retry (:class:`ObjectStoreUnavailable`), anything else the server said (:class:`ObjectStoreError`).
    The message holds the server's code and message, never a credential."""
    import botocore.exceptions as bx

    where = redact_endpoint(opts.endpoint())
    if isinstance(e, ForensicsError):
        return e
    if isinstance(e, RecursionError):  # botocore's region redirector, asking again at every redirect
        return ObjectStoreError(url, f"the object store at {where} answered with a redirect again and again "
                                     "(a redirect loop): check the endpoint and the bucket's region")
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return ObjectStoreDenied(url, f"no credentials for the object store at {where}: {_short(e)}")
    if isinstance(e, (bx.CredentialRetrievalError, bx.ProfileNotFound)) or type(e).__name__ in (
            "TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError"):
        return ObjectStoreDenied(url, f"cannot get credentials: {_short(e)}")
    if isinstance(e, bx.NoRegionError):
        return ObjectStoreError(url, "no region: set AWS_REGION or --region")
    if isinstance(e, bx.ClientError):
        err = e.response.get("Error", {}) if isinstance(e.response, dict) else {}
        code = str(err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "error")
        message = _short(str(err.get("Message") or ""), 200)
        said = f"{code}" + (f": {message}" if message and message != code else "")
        if code in _REDIRECTS:
            return ObjectStoreError(url, f"the object store at {where} answered with a redirect ({said}), which is "
                                         "not followed: check the endpoint and the bucket's region")
        if code in _DENIED:
            return ObjectStoreDenied(url, f"the object store at {where} refused the credentials ({said})")
        if code in _NOT_FOUND:
            return ObjectNotFound(url, f"not found at {where} ({said})")
        return ObjectStoreError(url, f"the object store at {where} said {said}")
    if isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                      bx.ConnectionClosedError, bx.ConnectionError, ConnectionError, TimeoutError)):
        return ObjectStoreUnavailable(url, f"the object store at {where} did not answer "
                                           f"({opts.attempts} attempts): {_short(e)}")
    if isinstance(e, (bx.BotoCoreError, OSError)):
        return ObjectStoreError(url, f"{type(e).__name__}: {_short(e)}")
    return ObjectStoreError(url, f"{type(e).__name__}: {_short(e)}")
