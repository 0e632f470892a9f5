"""Image sources: parse a reference, read an OCI layout / docker-archive / skopeo dir / unpacked root,
or have skopeo bring a registry (daemon, containers-storage) image into a local OCI layout.

Pure: :func:`parse_image_ref`, :func:`classify_manifest`, :func:`select_platform`,
:func:`parse_config`.  I/O: :func:`open_image` (a context manager; temporary
copies are removed on exit).  No registry client here: skopeo does the
transport, auth (``--creds``, ``--authfile``, credential helpers), mirrors and TLS.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, replace
from typing import Iterator

from ..errors import ImageFormatError, ImageRefError, SkopeoError, SkopeoNotFound
from .layers import LayerBlob
from .model import ImageConfig, ImageInfo, ImageRef, ManifestKind, Platform, Transport

__all__ = [
    "parse_image_ref",
    "parse_platform",
    "classify_manifest",
    "select_platform",
    "parse_config",
    "OpenedImage",
    "open_image",
    "SkopeoOptions",
]

MT_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MT_DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MT_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
_INDEX_TYPES = (MT_OCI_INDEX, MT_DOCKER_LIST)
_MAX_JSON = 8 << 20


def parse_image_ref(text: str) -> ImageRef:
    """Parse a reference the way skopeo names transports.

    >>> parse_image_ref("oci:/tmp/img:1.7.1")
    ImageRef(transport=<Transport.OCI: 'oci'>, path='/tmp/img', tag='1.7.1')
    >>> parse_image_ref("127.0.0.1:5000/nvitop:1.7.1").transport.value
    'docker'
    """
    for prefix, transport in (("oci:", Transport.OCI), ("docker-archive:", Transport.DOCKER_ARCHIVE),
                              ("dir:", Transport.DIR)):
        if text.startswith(prefix):
            rest = text[len(prefix):]
            if transport is Transport.DIR:
                return ImageRef(transport=transport, path=rest)
            path, sep, tag = rest.partition(":")
            return ImageRef(transport=transport, path=path, tag=tag or None)
    if text.startswith("docker://"):
        return ImageRef(transport=Transport.DOCKER, path=text[len("docker://"):])
    if text.startswith("docker-daemon:"):
        return ImageRef(transport=Transport.DOCKER_DAEMON, path=text[len("docker-daemon:"):])
    if text.startswith("containers-storage:"):
        return ImageRef(transport=Transport.CONTAINERS_STORAGE, path=text[len("containers-storage:"):])
    if os.path.isdir(text):
        if os.path.isfile(os.path.join(text, "oci-layout")):
            return ImageRef(transport=Transport.OCI, path=text)
        return ImageRef(transport=Transport.DIR, path=text)
    if os.path.isfile(text) and tarfile.is_tarfile(text):
        return ImageRef(transport=Transport.DOCKER_ARCHIVE, path=text)
    if "/" in text or "@sha256:" in text or ":" in text:
        return ImageRef(transport=Transport.DOCKER, path=text)
    raise ImageRefError(text, "not a path and not a registry reference (HOST[:PORT]/REPO:TAG)")


def parse_platform(text: str) -> Platform:
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise ImageRefError(text, "--platform must be OS/ARCH[/VARIANT], e.g. linux/amd64")
    return Platform(os=parts[0], architecture=parts[1], variant=parts[2] if len(parts) == 3 else None)


def classify_manifest(doc: dict, media_type: str | None = None) -> tuple[ManifestKind, int, tuple[str, ...]]:
    """(kind, attestation manifests, platforms) of a manifest or index document."""
    mt = doc.get("mediaType") or media_type or ""
    if mt in _INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
        plats, att = [], 0
        for m in doc.get("manifests", ()):
            ann = m.get("annotations") or {}
            p = m.get("platform") or {}
            if ann.get("vnd.docker.reference.type") == "attestation-manifest" or (
                    p.get("os") == "unknown" and p.get("architecture") == "unknown"):
                att += 1
                continue
            plats.append("/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x))
        if mt == MT_DOCKER_LIST:
            return ManifestKind.DOCKER_MANIFEST_LIST, att, tuple(plats)
        return (ManifestKind.OCI_INDEX_WITH_ATTESTATIONS if att else ManifestKind.OCI_INDEX), att, tuple(plats)
    if mt == MT_DOCKER_V2:
        return ManifestKind.DOCKER_V2, 0, ()
    return ManifestKind.OCI_MANIFEST, 0, ()


def select_platform(index: dict, platform: Platform) -> dict | None:
    """The descriptor of ``platform`` in an index (attestations never match)."""
    best = None
    for m in index.get("manifests", ()):
        p = m.get("platform") or {}
        ann = m.get("annotations") or {}
        if ann.get("vnd.docker.reference.type") == "attestation-manifest":
            continue
        if p.get("os") == platform.os and p.get("architecture") == platform.architecture:
            if platform.variant is None or p.get("variant") == platform.variant:
                if best is None or (platform.variant is None and not p.get("variant")):
                    best = m
    return best


def parse_config(doc: dict) -> ImageConfig:
    """WorkingDir, Env, Entrypoint, Cmd and User of an image config."""
    c = doc.get("config") or doc.get("Config") or {}
    env = []
    for item in c.get("Env") or ():
        k, _, v = str(item).partition("=")
        env.append((k, v))
    return ImageConfig(working_dir=c.get("WorkingDir") or "/", env=tuple(env),
                       entrypoint=tuple(c.get("Entrypoint") or ()), cmd=tuple(c.get("Cmd") or ()),
                       user=c.get("User") or "")


@dataclass(frozen=True, slots=True, kw_only=True)
class SkopeoOptions:
    creds: str | None = None
    authfile: str | None = None
    tls_verify: bool = True
    skopeo: str = "skopeo"
    timeout: float = 1800.0


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenedImage:
    info: ImageInfo
    config: ImageConfig
    blobs: tuple[LayerBlob, ...]
    rootfs_dir: str | None = None  # dir: sources (an unpacked root)
    config_platform: str | None = None


class _Slice:
    """A byte range of a file, opened on demand (a layer inside a docker-archive tar)."""

    def __init__(self, path: str, offset: int, size: int) -> None:
        self.f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self.f.seek(offset)
        self.left = size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_json_file(ref: str, path: str, what: str, digest: str | None = None) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_JSON + 1)
    except FileNotFoundError as e:
        raise ImageFormatError(ref, what, f"{path} is missing") from e
    except OSError as e:
        raise ImageFormatError(ref, what, f"{path}: {e.strerror}") from e
    return _parse_json(ref, what, data, digest)


def _parse_json(ref: str, what: str, data: bytes, digest: str | None) -> dict:
    if len(data) > _MAX_JSON:
        raise ImageFormatError(ref, what, "larger than 8 MiB")
    if digest and digest.startswith("sha256:"):
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise ImageFormatError(ref, what, f"digest mismatch: expected {digest}, got {got}")
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ImageFormatError(ref, what, f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ImageFormatError(ref, what, "not a JSON object")
    return doc


def _blob_path(layout: str, digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    if not hexd or "/" in hexd or "/" in algo or ".." in digest:
        raise ImageFormatError(layout, "descriptor", f"bad digest {digest!r}")
    return os.path.join(layout, "blobs", algo, hexd)


def _open_oci(ref: ImageRef, platform: Platform, kind_override: tuple | None = None) -> OpenedImage:
    layout = ref.path
    name = str(ref)
    if not os.path.isdir(layout):
        raise ImageRefError(name, f"{layout} is not a directory")
    if not os.path.isfile(os.path.join(layout, "oci-layout")) or not os.path.isfile(os.path.join(layout, "index.json")):
        raise ImageRefError(name, f"{layout} is not an OCI image layout (no oci-layout / index.json)")
    index = _read_json_file(name, os.path.join(layout, "index.json"), "index.json")
    descs = index.get("manifests") or []
    if ref.tag:
        picked = [d for d in descs if (d.get("annotations") or {}).get("org.opencontainers.image.ref.name") == ref.tag]
        if not picked:
            tags = sorted({(d.get("annotations") or {}).get("org.opencontainers.image.ref.name", "?") for d in descs})
            raise ImageRefError(name, f"no image tagged {ref.tag!r} in the layout (tags: {', '.join(tags) or 'none'})")
        desc = picked[0]
    elif len(descs) == 1:
        desc = descs[0]
    else:
        tags = sorted({(d.get("annotations") or {}).get("org.opencontainers.image.ref.name", "?") for d in descs})
        raise ImageRefError(name, f"the layout holds {len(descs)} images; name one as oci:DIR:TAG ({', '.join(tags)})")

    def load(d: dict) -> dict:
        return _read_json_file(name, _blob_path(layout, d["digest"]), "manifest", d["digest"])

    doc = load(desc)
    kind, att, plats = classify_manifest(doc, desc.get("mediaType"))
    manifest, mdigest = doc, desc["digest"]
    warnings: list[str] = []
    if "manifests" in doc and "layers" not in doc:
        chosen = select_platform(doc, platform)
        if chosen is None:
            raise ImageRefError(name, f"no {platform} image in the index (platforms: {', '.join(plats) or 'none'}); "
                                      "pass --platform")
        manifest, mdigest = load(chosen), chosen["digest"]
    if kind_override is not None:
        kind, att, plats = kind_override
    if kind is ManifestKind.OCI_INDEX_WITH_ATTESTATIONS:
        warnings.append(
            f"delivery risk: the reference is an OCI image index carrying {att} attestation manifest(s) "
            "(BuildKit provenance/SBOM); older registries and registry sync jobs reject it or report "
            "'source repository does not exist'. Rebuild with --provenance=false --sbom=false, or copy a single "
            "platform manifest (skopeo copy without --all)")
    cfg_desc = manifest.get("config") or {}
    if not cfg_desc.get("digest"):
        raise ImageFormatError(name, "manifest", "no config descriptor")
    cfg = _read_json_file(name, _blob_path(layout, cfg_desc["digest"]), "config", cfg_desc["digest"])
    blobs = []
    for layer in manifest.get("layers") or ():
        path = _blob_path(layout, layer["digest"])
        if not os.path.isfile(path):
            raise ImageFormatError(name, "layer", f"blob {layer['digest']} is missing from the layout")
        blobs.append(LayerBlob(name=layer["digest"], open=lambda p=path: open(p, "rb"), digest=layer["digest"]))
    info = ImageInfo(ref=name, transport=ref.transport, manifest_kind=kind, manifest_digest=mdigest,
                     platform=_cfg_platform(cfg), layers=len(blobs), index_platforms=plats, attestations=att,
                     warnings=tuple(warnings))
    return OpenedImage(info=info, config=parse_config(cfg), blobs=tuple(blobs), config_platform=_cfg_platform(cfg))


def _cfg_platform(cfg: dict) -> str | None:
    if not cfg.get("os"):
        return None
    return "/".join(x for x in (cfg.get("os"), cfg.get("architecture"), cfg.get("variant")) if x)


def _open_docker_archive(ref: ImageRef) -> OpenedImage:
    name = str(ref)
    path = ref.path
    if not os.path.isfile(path):
        raise ImageRefError(name, f"{path}: no such file")
    try:
        tf = tarfile.open(path, "r:")
    except tarfile.TarError as e:
        hint = " (gzip-compressed? docker save writes an uncompressed tar; gunzip it first)" if \
            open(path, "rb").read(2) == b"\x1f\x8b" else ""
        raise ImageRefError(name, f"not a tar archive{hint}: {e}") from e
    with tf:
        members = {m.name.lstrip("./") if m.name.startswith("./") else m.name: m for m in tf.getmembers()}
        mm = members.get("manifest.json")
        if mm is None:
            raise ImageRefError(name, "no manifest.json: not a docker save archive (for an OCI layout use oci:DIR)")
        manifest = json.loads(tf.extractfile(mm).read(_MAX_JSON))
        if not isinstance(manifest, list) or not manifest:
            raise ImageFormatError(name, "manifest.json", "expected a non-empty list")
        if ref.tag:
            want = ref.tag
            if want.startswith("@") and want[1:].isdigit():
                i = int(want[1:])
                entry = manifest[i] if i < len(manifest) else None
            else:
                entry = next((e for e in manifest if want in (e.get("RepoTags") or ())), None)
            if entry is None:
                tags = [t for e in manifest for t in (e.get("RepoTags") or ())]
                raise ImageRefError(name, f"no image {want!r} in the archive (tags: {', '.join(tags) or 'none'})")
        elif len(manifest) == 1:
            entry = manifest[0]
        else:
            raise ImageRefError(name, f"the archive holds {len(manifest)} images; name one as docker-archive:FILE:REPO:TAG")

        def member(p: str) -> tarfile.TarInfo:
            m = members.get(p)
            while m is not None and m.issym():
                m = members.get(os.path.normpath(os.path.join(os.path.dirname(p), m.linkname)))
            if m is None or not m.isreg():
                raise ImageFormatError(name, "manifest.json", f"{p} is not in the archive")
            return m

        cfg_name = entry.get("Config") or ""
        cm = member(cfg_name)
        cfg_bytes = tf.extractfile(cm).read(_MAX_JSON + 1)
        base = os.path.basename(cfg_name)
        digest = None
        if cfg_name.startswith("blobs/sha256/"):
            digest = "sha256:" + base
        elif base.endswith(".json") and len(base) == 69:
            digest = "sha256:" + base[:-5]
        cfg = _parse_json(name, "config", cfg_bytes, digest)
        diff_ids = list((cfg.get("rootfs") or {}).get("diff_ids") or ())
        blobs = []
        for i, lp in enumerate(entry.get("Layers") or ()):
            m = member(lp)
            ldigest = "sha256:" + lp.rsplit("/", 1)[-1] if lp.startswith("blobs/sha256/") else None
            blobs.append(LayerBlob(name=lp, open=lambda o=m.offset_data, s=m.size: _Slice(path, o, s),
                                   digest=ldigest, diff_id=diff_ids[i] if i < len(diff_ids) else None))
    info = ImageInfo(ref=name, transport=ref.transport, manifest_kind=ManifestKind.DOCKER_ARCHIVE,
                     platform=_cfg_platform(cfg), layers=len(blobs))
    return OpenedImage(info=info, config=parse_config(cfg), blobs=tuple(blobs), config_platform=_cfg_platform(cfg))


def _open_skopeo_dir(ref: ImageRef) -> OpenedImage:
    """skopeo's own ``dir:`` format (manifest.json + blobs named by hex digest)."""
    name = str(ref)
    d = ref.path
    manifest = _read_json_file(name, os.path.join(d, "manifest.json"), "manifest.json")
    kind, _, _ = classify_manifest(manifest)
    if "layers" not in manifest:
        raise ImageRefError(name, "skopeo dir: copy holds an index; copy one platform (skopeo copy without --all)")
    cfg_d = manifest["config"]["digest"]
    cfg = _read_json_file(name, os.path.join(d, cfg_d.partition(":")[2]), "config", cfg_d)
    blobs = tuple(LayerBlob(name=l["digest"], open=lambda p=os.path.join(d, l["digest"].partition(":")[2]): open(p, "rb"),
                            digest=l["digest"]) for l in manifest["layers"])
    info = ImageInfo(ref=name, transport=Transport.DIR, manifest_kind=kind, platform=_cfg_platform(cfg),
                     layers=len(blobs))
    return OpenedImage(info=info, config=parse_config(cfg), blobs=blobs, config_platform=_cfg_platform(cfg))


def _skopeo(ref_name: str, opts: SkopeoOptions, action: str, args: list[str]) -> str:
    exe = shutil.which(opts.skopeo)
    if exe is None:
        raise SkopeoNotFound(ref_name)
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=opts.timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise SkopeoError(ref_name, action, f"timed out after {opts.timeout:g}s") from e
    if p.returncode != 0:
        detail = (p.stderr.strip().splitlines() or ["exit status %d" % p.returncode])[-1]
        if opts.creds:
            detail = detail.replace(opts.creds, "***")
        raise SkopeoError(ref_name, action, detail)
    return p.stdout


def _fetch_with_skopeo(ref: ImageRef, platform: Platform, opts: SkopeoOptions, workdir: str) -> OpenedImage:
    prefix = {Transport.DOCKER: "docker://", Transport.DOCKER_DAEMON: "docker-daemon:",
              Transport.CONTAINERS_STORAGE: "containers-storage:"}[ref.transport]
    src = prefix + ref.path
    common: list[str] = []
    kind_override = None
    if ref.transport is Transport.DOCKER:
        inspect = ["inspect", "--raw"]
        if opts.creds:
            inspect += ["--creds", opts.creds]
        if opts.authfile:
            inspect += ["--authfile", opts.authfile]
        if not opts.tls_verify:
            inspect += ["--tls-verify=false"]
        raw = _skopeo(src, opts, "inspect", inspect + [src])
        try:
            kind_override = classify_manifest(json.loads(raw))
        except ValueError as e:
            raise ImageFormatError(src, "manifest", f"registry answered non-JSON: {e}") from e
        if opts.creds:
            common += ["--src-creds", opts.creds]
        if opts.authfile:
            common += ["--src-authfile", opts.authfile]
        if not opts.tls_verify:
            common += ["--src-tls-verify=false"]
    dest = os.path.join(workdir, "oci")
    plat = ["--override-os", platform.os, "--override-arch", platform.architecture]
    if platform.variant:
        plat += ["--override-variant", platform.variant]
    _skopeo(src, opts, "copy", [*plat, "copy", "--quiet", *common, src, f"oci:{dest}:image"])
    opened = _open_oci(ImageRef(transport=Transport.OCI, path=dest, tag="image"), platform, kind_override)
    info = replace(opened.info, ref=src, transport=ref.transport)
    return replace(opened, info=info)


@contextlib.contextmanager
def open_image(ref: ImageRef, *, platform: Platform | None = None, skopeo: SkopeoOptions | None = None) -> Iterator[OpenedImage]:
    """Open ``ref`` for reading; a skopeo copy lives in a temporary directory removed on exit.

    :raises ImageRefError: nothing readable at the reference
    :raises ImageFormatError: a malformed manifest, config or layout
    :raises SkopeoNotFound: a registry/daemon reference and no skopeo
    :raises SkopeoError: skopeo could not fetch it (auth, TLS, unknown repository)
    """
    platform = platform or Platform()
    if ref.transport is Transport.OCI:
        yield _check_platform(_open_oci(ref, platform), platform)
    elif ref.transport is Transport.DOCKER_ARCHIVE:
        yield _check_platform(_open_docker_archive(ref), platform)
    elif ref.transport is Transport.DIR:
        if not os.path.isdir(ref.path):
            raise ImageRefError(str(ref), f"{ref.path} is not a directory")
        if os.path.isfile(os.path.join(ref.path, "manifest.json")) and os.path.isfile(os.path.join(ref.path, "version")):
            yield _check_platform(_open_skopeo_dir(ref), platform)
        else:
            info = ImageInfo(ref=str(ref), transport=Transport.DIR, manifest_kind=ManifestKind.NONE)
            yield OpenedImage(info=info, config=ImageConfig(), blobs=(), rootfs_dir=ref.path)
    else:
        with tempfile.TemporaryDirectory(prefix="forensics-image-") as tmp:
            yield _check_platform(_fetch_with_skopeo(ref, platform, skopeo or SkopeoOptions(), tmp), platform)


def _check_platform(opened: OpenedImage, platform: Platform) -> OpenedImage:
    got = opened.config_platform
    if got and not got.startswith(f"{platform.os}/{platform.architecture}"):
        w = f"the image's config says {got}, not {platform}: resolution assumes the image's platform"
        return replace(opened, info=replace(opened.info, warnings=opened.info.warnings + (w,)))
    return opened
