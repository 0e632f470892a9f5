"""Image metadata read at the edge, into typed records: nothing past this module sees a raw JSON value.

An image's metadata is input someone else made.  Each reader takes a parsed JSON
value and either returns a frozen record or raises
:class:`~forensics.errors.ImageFormatError` naming the document and the field:

* :func:`read_index`, :func:`read_manifest` -- an OCI ``index.json``, an image index or
  manifest (OCI or Docker schema 2) -> :class:`Manifest` of :class:`Descriptor`
* :func:`read_image_config` -- an image config -> :class:`ConfigDoc` (the
  :class:`~forensics.imports.model.ImageConfig` the runtime uses, the platform, diff_ids)
* :func:`read_archive_manifest` -- ``docker save``'s ``manifest.json`` -> :class:`ArchiveEntry`
* :func:`read_runtime_config` -- an OCI runtime bundle's ``config.json`` (``umoci unpack``,
  ``runc spec``) -> :class:`~forensics.imports.model.ImageConfig`
* :func:`parse_digest` -- ``algorithm:hex``, only algorithms that can be verified

The types accepted are the ones runtimes accept: Entrypoint and Cmd may be a list of
strings or a single string (Docker's ``StrSlice``), everything else has one type.

>>> read_image_config({"config": {"Entrypoint": 5}}, "img")
Traceback (most recent call last):
...
forensics.errors.ImageFormatError: img: config: config.Entrypoint: expected a list of strings, got an integer
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import ImageFormatError
from .model import ImageConfig, Platform

__all__ = [
    "DIGEST_ALGORITHMS",
    "MAX_PATH",
    "MAX_INDEX_MANIFESTS",
    "Descriptor",
    "Manifest",
    "ConfigDoc",
    "ArchiveEntry",
    "parse_digest",
    "parse_json",
    "read_index",
    "read_manifest",
    "read_image_config",
    "read_archive_manifest",
    "read_runtime_config",
]

#: digest algorithms whose blobs can be verified (OCI image spec: sha256, sha512), and their hex length
DIGEST_ALGORITHMS = {"sha256": 64, "sha512": 128}
MAX_PATH = 4095  # Linux PATH_MAX (4096) less the terminating NUL
_MAX_ITEMS = 100_000  # entries of one list (layers, manifests, Env, args)
#: entries of one image index (platforms and attestations): real multi-platform images list a few dozen
MAX_INDEX_MANIFESTS = 1024
_MAX_PLATFORM_FIELD = 128  # bytes of a platform's os, architecture or variant ("linux", "arm64", "v8")
_HEX = re.compile(r"^[0-9a-f]+$")
MT_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (MT_OCI_INDEX, MT_DOCKER_LIST)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _Doc:
    """Typed access to one JSON object: every getter checks the type and names the field on error."""

    def __init__(self, value: object, ref: str, what: str, path: str = "") -> None:
        self.ref, self.what, self.path = ref, what, path
        if not isinstance(value, dict):
            self.fail(f"expected an object, got {_kind(value)}")
        self.value: dict = value  # type: ignore[assignment]

    def fail(self, reason: str, key: str | None = None):
        field = ".".join(p for p in (self.path, key) if p)
        raise ImageFormatError(self.ref, self.what, f"{field}: {reason}" if field else reason)

    def sub(self, key: str, *, required: bool = False) -> _Doc | None:
        v = self.value.get(key)
        if v is None:
            if required:
                self.fail("missing", key)
            return None
        return _Doc(v, self.ref, self.what, ".".join(p for p in (self.path, key) if p))

    def text(self, key: str, *, required: bool = False, default: str = "") -> str:
        v = self.value.get(key)
        if v is None:
            if required:
                self.fail("missing", key)
            return default
        if not isinstance(v, str):
            self.fail(f"expected a string, got {_kind(v)}", key)
        if "\0" in v:
            self.fail("contains a NUL byte", key)
        return v

    def number(self, key: str) -> int | None:
        v = self.value.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"expected an integer, got {_kind(v)}", key)
        if v < 0:
            self.fail("negative", key)
        return v

    def items(self, key: str) -> list:
        v = self.value.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(f"expected a list, got {_kind(v)}", key)
        if len(v) > _MAX_ITEMS:
            self.fail(f"more than {_MAX_ITEMS} entries", key)
        return v

    def strings(self, key: str, *, str_slice: bool = False) -> tuple[str, ...]:
        """A list of strings (null: empty); with ``str_slice`` a lone string too, as Docker reads Cmd."""
        v = self.value.get(key)
        if v is None:
            return ()
        if str_slice and isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            self.fail(f"expected a list of strings, got {_kind(v)}", key)
        if len(v) > _MAX_ITEMS:
            self.fail(f"more than {_MAX_ITEMS} entries", key)
        for i, item in enumerate(v):
            if not isinstance(item, str):
                self.fail(f"expected a list of strings, item {i} is {_kind(item)}", key)
            if "\0" in item:
                self.fail(f"item {i} contains a NUL byte", key)
        return tuple(v)

    def string_map(self, key: str) -> tuple[tuple[str, str], ...]:
        v = self.value.get(key)
        if v is None:
            return ()
        if not isinstance(v, dict):
            self.fail(f"expected an object of strings, got {_kind(v)}", key)
        for k, item in v.items():
            if not isinstance(item, str):
                self.fail(f"expected an object of strings, {k!r} is {_kind(item)}", key)
        return tuple(sorted(v.items()))


def parse_digest(value: object, ref: str, what: str) -> str:
    """``algorithm:hex`` of a verifiable algorithm, or :class:`ImageFormatError`.

    >>> parse_digest("sha256:" + "ab" * 32, "img", "layer")[:10]
    'sha256:aba'
    >>> parse_digest("sha512:zz", "img", "layer")
    Traceback (most recent call last):
    ...
    forensics.errors.ImageFormatError: img: layer: digest 'sha512:zz' is not a valid sha512 digest (128 hex digits)
    """
    if not isinstance(value, str):
        raise ImageFormatError(ref, what, f"digest: expected a string, got {_kind(value)}")
    algo, sep, hexd = value.partition(":")
    if not sep:
        raise ImageFormatError(ref, what, f"digest {value[:80]!r} has no algorithm (expected sha256:HEX)")
    want = DIGEST_ALGORITHMS.get(algo)
    if want is None:
        raise ImageFormatError(ref, what, f"digest {value[:80]!r}: algorithm {algo[:20]!r} cannot be verified "
                                          f"(only {', '.join(DIGEST_ALGORITHMS)})")
    if len(hexd) != want or not _HEX.match(hexd):
        raise ImageFormatError(ref, what, f"digest {value[:80]!r} is not a valid {algo} digest ({want} hex digits)")
    return value


def parse_json(data: bytes, ref: str, what: str) -> object:
    """``json.loads`` with its failures (syntax, encoding, nesting depth) as :class:`ImageFormatError`."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ImageFormatError(ref, what, "not JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ImageFormatError(ref, what, f"not JSON: {e}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Descriptor:
    """An OCI content descriptor (a manifest's config or layer, an index's manifest)."""

    media_type: str
    digest: str
    size: int | None = None
    annotations: tuple[tuple[str, str], ...] = ()
    platform: Platform | None = None

    def annotation(self, name: str) -> str | None:
        return dict(self.annotations).get(name)

    @property
    def ref_name(self) -> str | None:
        return self.annotation("org.opencontainers.image.ref.name")

    @property
    def is_attestation(self) -> bool:
        """A BuildKit attestation manifest (provenance/SBOM), never an image to run."""
        if self.annotation("vnd.docker.reference.type") == "attestation-manifest":
            return True
        return self.platform is not None and self.platform.os == "unknown" and self.platform.architecture == "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """An image manifest (``layers`` set) or an index (``manifests`` set)."""

    media_type: str
    config: Descriptor | None = None
    layers: tuple[Descriptor, ...] = ()
    manifests: tuple[Descriptor, ...] = ()
    is_index: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigDoc:
    config: ImageConfig
    platform: str | None  # "linux/amd64[/variant]" as the config says, None when it says nothing
    diff_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveEntry:
    """One image of a ``docker save`` archive: member paths of its config and layers."""

    config: str
    repo_tags: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()


def _platform(doc: _Doc | None) -> Platform | None:
    if doc is None:
        return None
    for key in ("os", "architecture", "variant"):
        if len(doc.text(key)) > _MAX_PLATFORM_FIELD:
            doc.fail(f"longer than {_MAX_PLATFORM_FIELD} characters", key)
    return Platform(os=doc.text("os"), architecture=doc.text("architecture"), variant=doc.text("variant") or None)


def _descriptor(value: object, ref: str, what: str, path: str) -> Descriptor:
    d = _Doc(value, ref, what, path)
    if d.value.get("digest") is None:
        d.fail("missing", "digest")
    digest = parse_digest(d.value["digest"], ref, f"{what}: {path}")
    return Descriptor(media_type=d.text("mediaType"), digest=digest, size=d.number("size"),
                      annotations=d.string_map("annotations"), platform=_platform(d.sub("platform")))


def read_index(doc: object, ref: str) -> Manifest:
    """An OCI layout's ``index.json``: the descriptors it lists (possibly none)."""
    d = _Doc(doc, ref, "index.json")
    manifests = tuple(_descriptor(v, ref, "index.json", f"manifests[{i}]") for i, v in enumerate(d.items("manifests")))
    return Manifest(media_type=d.text("mediaType"), manifests=manifests, is_index=True)


def read_manifest(doc: object, ref: str, media_type: str | None = None) -> Manifest:
    """A manifest or an index: an index lists ``manifests``; an image manifest has ``config`` and ``layers``."""
    d = _Doc(doc, ref, "manifest")
    mt = d.text("mediaType") or media_type or ""
    if mt in INDEX_TYPES or ("manifests" in d.value and "layers" not in d.value):
        items = d.items("manifests")
        if len(items) > MAX_INDEX_MANIFESTS:
            d.fail(f"an image index of {len(items)} entries (more than {MAX_INDEX_MANIFESTS})", "manifests")
        manifests = tuple(_descriptor(v, ref, "manifest", f"manifests[{i}]") for i, v in enumerate(items))
        return Manifest(media_type=mt, manifests=manifests, is_index=True)
    if d.value.get("config") is None:
        d.fail("no config descriptor", "config")
    config = _descriptor(d.value["config"], ref, "manifest", "config")
    layers = tuple(_descriptor(v, ref, "manifest", f"layers[{i}]") for i, v in enumerate(d.items("layers")))
    return Manifest(media_type=mt, config=config, layers=layers)


def _working_dir(d: _Doc, key: str) -> str:
    wd = d.text(key) or "/"
    if len(wd.encode("utf-8", "surrogateescape")) > MAX_PATH:
        d.fail(f"longer than {MAX_PATH} bytes (PATH_MAX): no runtime can enter it", key)
    if not wd.startswith("/"):
        wd = "/" + wd  # runtimes resolve a relative WorkingDir against the root
    return wd


def _env(items: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        k, _, v = item.partition("=")
        out.append((k, v))
    return tuple(out)


def read_image_config(doc: object, ref: str) -> ConfigDoc:
    """WorkingDir, Env, Entrypoint, Cmd and User of an image config, its platform and diff_ids."""
    d = _Doc(doc, ref, "config")
    key = "config" if "config" in d.value else "Config"
    c = d.sub(key)
    if c is None:
        config = ImageConfig()
    else:
        config = ImageConfig(working_dir=_working_dir(c, "WorkingDir"), env=_env(c.strings("Env")),
                             entrypoint=c.strings("Entrypoint", str_slice=True), cmd=c.strings("Cmd", str_slice=True),
                             user=c.text("User"))
    os_, arch, variant = d.text("os"), d.text("architecture"), d.text("variant")
    platform = "/".join(x for x in (os_, arch, variant) if x) if os_ else None
    rootfs = d.sub("rootfs")
    diff_ids: tuple[str, ...] = ()
    if rootfs is not None:
        diff_ids = tuple(parse_digest(v, ref, f"config: rootfs.diff_ids[{i}]")
                         for i, v in enumerate(rootfs.items("diff_ids")))
    return ConfigDoc(config=config, platform=platform, diff_ids=diff_ids)


def _member(value: str, d: _Doc, key: str) -> str:
    if not value:
        d.fail("empty member path", key)
    if len(value) > MAX_PATH:
        d.fail(f"member path longer than {MAX_PATH} bytes", key)
    return value


def read_archive_manifest(doc: object, ref: str) -> tuple[ArchiveEntry, ...]:
    """``docker save``'s ``manifest.json``: a non-empty list of {Config, RepoTags, Layers}."""
    if not isinstance(doc, list):
        raise ImageFormatError(ref, "manifest.json", f"expected a list of images, got {_kind(doc)}")
    if not doc:
        raise ImageFormatError(ref, "manifest.json", "expected a non-empty list of images")
    out = []
    for i, item in enumerate(doc[:_MAX_ITEMS]):
        d = _Doc(item, ref, "manifest.json", f"[{i}]")
        out.append(ArchiveEntry(config=_member(d.text("Config", required=True), d, "Config"),
                                repo_tags=d.strings("RepoTags"),
                                layers=tuple(_member(p, d, "Layers") for p in d.strings("Layers"))))
    return tuple(out)


def read_runtime_config(doc: object, ref: str) -> tuple[ImageConfig, tuple[int, int] | None]:
    """An OCI runtime bundle's ``config.json`` (what ``umoci unpack`` writes next to ``rootfs/``).

    Its ``process`` holds the command (args: Entrypoint and Cmd joined), cwd, env and the user as
    numbers.  Returns the config and (uid, gid), or None when it names no user.
    """
    d = _Doc(doc, ref, "config.json")
    p = d.sub("process")
    if p is None:
        return ImageConfig(), None
    user = p.sub("user")
    ids = None
    if user is not None:
        uid, gid = user.number("uid"), user.number("gid")
        ids = (uid or 0, gid or 0)
    config = ImageConfig(working_dir=_working_dir(p, "cwd"), env=_env(p.strings("env")), cmd=p.strings("args"),
                         user=f"{ids[0]}:{ids[1]}" if ids else "")
    return config, ids
