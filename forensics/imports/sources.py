"""Image sources: parse a reference, read an OCI layout / docker-archive / skopeo dir / unpacked root,
or have skopeo bring a registry (daemon, containers-storage) image into a local OCI layout.

Pure: :func:`parse_image_ref`, :func:`classify_manifest`, :func:`select_platform`,
:func:`choose_platform`, :func:`parse_config`.  I/O: :func:`open_image` (a context manager; temporary
copies are removed on exit), :func:`host_platform`.

An image index (a multi-platform image) leads to the image of one platform: this machine's unless
``--platform`` names another, the way a node's runtime pulls; the report says which
(:class:`~forensics.imports.model.PlatformChoice`), and an index without it is
:class:`~forensics.errors.PlatformNotInIndex`.  No registry client here: skopeo does the
transport, auth (``--creds``, ``--authfile``, credential helpers), mirrors and TLS.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO

from ..errors import ImageFormatError, ImageRefError, PlatformNotInIndex, SkopeoError, SkopeoNotFound
from ..subproc import OutputTooLarge, run_bounded
from .imagemeta import (MAX_INDEX_MANIFESTS, MT_DOCKER_LIST, MT_OCI_INDEX, Descriptor, Manifest, parse_digest,
                        parse_json,
                        read_archive_manifest, read_image_config, read_index, read_manifest, read_runtime_config)
from .layerstream import LayerBlob
from .model import ImageConfig, ImageInfo, ImageRef, ManifestKind, Platform, PlatformChoice, PlatformSource, Transport

__all__ = [
    "parse_image_ref",
    "parse_platform",
    "classify_manifest",
    "select_platform",
    "choose_platform",
    "host_platform",
    "parse_config",
    "OpenedImage",
    "open_image",
    "find_bundle_config",
    "SkopeoOptions",
    "read_skopeo_failure",
]

MT_DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
_MAX_JSON = 8 << 20
_MAX_LINKS = 40  # symlinks followed from one docker-archive member (Linux's MAXSYMLINKS)


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


def classify_manifest(doc: Manifest) -> tuple[ManifestKind, int, tuple[str, ...]]:
    """(kind, attestation manifests, platforms) of a manifest or index."""
    if doc.is_index:
        plats, att = [], 0
        for m in doc.manifests:
            if m.is_attestation:
                att += 1
                continue
            plats.append(str(m.platform) if m.platform else "")
        if doc.media_type == MT_DOCKER_LIST:
            return ManifestKind.DOCKER_MANIFEST_LIST, att, tuple(plats)
        return (ManifestKind.OCI_INDEX_WITH_ATTESTATIONS if att else ManifestKind.OCI_INDEX), att, tuple(plats)
    if doc.media_type == MT_DOCKER_V2:
        return ManifestKind.DOCKER_V2, 0, ()
    return ManifestKind.OCI_MANIFEST, 0, ()


def select_platform(index: Manifest, platform: Platform) -> Descriptor | None:
    """The descriptor of ``platform`` in an index (attestations never match)."""
    best = None
    for m in index.manifests:
        p = m.platform
        if m.is_attestation or p is None:
            continue
        if p.os != platform.os or p.architecture != platform.architecture:
            continue
        if platform.variant is not None and p.variant != platform.variant:
            continue
        if best is None or (platform.variant is None and not p.variant):
            best = m
    return best


#: ``uname -m`` -> the OCI platform its images are built for (the Go names runtimes match on)
_MACHINE_PLATFORMS = {"x86_64": ("amd64", None), "aarch64": ("arm64", None), "arm64": ("arm64", None),
                      "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"), "i686": ("386", None), "i386": ("386", None),
                      "ppc64le": ("ppc64le", None), "s390x": ("s390x", None), "riscv64": ("riscv64", None)}


def host_platform(machine: str | None = None) -> Platform:
    """The platform a container runtime on this machine pulls from an index (``machine``: ``uname -m``).

    >>> str(host_platform("aarch64")), str(host_platform("x86_64")), str(host_platform("armv7l"))
    ('linux/arm64', 'linux/amd64', 'linux/arm/v7')
    """
    if machine is None:
        machine = os.uname().machine
    arch, variant = _MACHINE_PLATFORMS.get(machine, (machine, None))
    return Platform(os="linux", architecture=arch, variant=variant)


def choose_platform(index: Manifest, platform: Platform, source: PlatformSource,
                    ref: str) -> tuple[Descriptor, PlatformChoice]:
    """The entry of ``platform`` in an image index and the record of the choice.

    :raises PlatformNotInIndex: the index lists no image of that platform
    """
    _, _, available = classify_manifest(index)
    chosen = select_platform(index, platform)
    if chosen is None:
        raise PlatformNotInIndex(ref, str(platform), source.value, tuple(a or "(no platform)" for a in available))
    return chosen, PlatformChoice(requested=str(platform), source=source, chosen=str(chosen.platform),
                                  digest=chosen.digest, available=available)


def parse_config(doc: object, ref: str = "config") -> ImageConfig:
    """WorkingDir, Env, Entrypoint, Cmd and User of an image config (see :func:`read_image_config`)."""
    return read_image_config(doc, ref).config


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


def _opener(path: str) -> Callable[[], BinaryIO]:
    """A blob's file, opened when its layer is read."""
    return lambda: open(path, "rb")


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

    def __enter__(self) -> _Slice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_json_file(ref: str, path: str, what: str, digest: str | None = None) -> object:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_JSON + 1)
    except FileNotFoundError as e:
        raise ImageFormatError(ref, what, f"{path} is missing") from e
    except OSError as e:
        raise ImageFormatError(ref, what, f"{path}: {e.strerror}") from e
    return _parse_json(ref, what, data, digest)


def _parse_json(ref: str, what: str, data: bytes, digest: str | None) -> object:
    if len(data) > _MAX_JSON:
        raise ImageFormatError(ref, what, "larger than 8 MiB")
    if digest:
        algo = digest.partition(":")[0]
        got = f"{algo}:" + hashlib.new(algo, data).hexdigest()
        if got != digest:
            raise ImageFormatError(ref, what, f"digest mismatch: expected {digest}, got {got}")
    return parse_json(data, ref, what)


def _blob_path(layout: str, digest: str) -> str:
    algo, _, hexd = digest.partition(":")  # parse_digest has checked both parts
    return os.path.join(layout, "blobs", algo, hexd)


def _tags(descs: tuple[Descriptor, ...]) -> str:
    return ", ".join(sorted({d.ref_name or "?" for d in descs})) or "none"


def _layout_entry(name: str, descs: tuple[Descriptor, ...], tag: str | None) -> Descriptor | Manifest:
    """The entry of an OCI layout's index.json that ``tag`` names; several of one tag (or untagged), each with
    a platform, are the layout's own index of platforms (containerd's export, ``oras``)."""
    picked = [d for d in descs if d.ref_name == tag] if tag else list(descs)
    if tag and not picked:
        raise ImageRefError(name, f"no image tagged {tag!r} in the layout (tags: {_tags(descs)})")
    if not picked:
        raise ImageRefError(name, "the layout's index.json lists no image")
    if len(picked) == 1:
        return picked[0]
    if all(d.platform is not None for d in picked) and (tag or len({d.ref_name for d in picked}) == 1):
        if len(picked) > MAX_INDEX_MANIFESTS:
            raise ImageFormatError(name, "index.json", f"{len(picked)} platform entries (more than "
                                                       f"{MAX_INDEX_MANIFESTS})")
        return Manifest(media_type=MT_OCI_INDEX, manifests=tuple(picked), is_index=True)
    if tag:
        return picked[0]
    raise ImageRefError(name, f"the layout holds {len(descs)} images; name one as oci:DIR:TAG ({_tags(descs)})")


def _open_oci(ref: ImageRef, platform: Platform, kind_override: tuple | None = None,
              source: PlatformSource = PlatformSource.OPTION, choice: PlatformChoice | None = None) -> OpenedImage:
    layout = ref.path
    name = str(ref)
    if not os.path.isdir(layout):
        raise ImageRefError(name, f"{layout} is not a directory")
    if not os.path.isfile(os.path.join(layout, "oci-layout")) or not os.path.isfile(os.path.join(layout, "index.json")):
        raise ImageRefError(name, f"{layout} is not an OCI image layout (no oci-layout / index.json)")
    descs = read_index(_read_json_file(name, os.path.join(layout, "index.json"), "index.json"), name).manifests
    entry = _layout_entry(name, descs, ref.tag)

    def load(d: Descriptor) -> Manifest:
        return read_manifest(_read_json_file(name, _blob_path(layout, d.digest), "manifest", d.digest), name,
                             d.media_type)

    doc = load(entry) if isinstance(entry, Descriptor) else entry
    kind, att, plats = classify_manifest(doc)
    manifest, mdigest = doc, entry.digest if isinstance(entry, Descriptor) else None
    warnings: list[str] = []
    if doc.is_index:
        chosen, choice = choose_platform(doc, platform, source, name)
        manifest, mdigest = load(chosen), chosen.digest
        if manifest.is_index:
            raise ImageFormatError(name, "manifest", f"{chosen.digest}: an index inside an index (not an image)")
    if kind_override is not None:
        kind, att, plats = kind_override
    if kind is ManifestKind.OCI_INDEX_WITH_ATTESTATIONS:
        warnings.append(
            f"delivery risk: the reference is an OCI image index carrying {att} attestation manifest(s) "
            "(BuildKit provenance/SBOM); older registries and registry sync jobs reject it or report "
            "'source repository does not exist'. Rebuild with --provenance=false --sbom=false, or copy a single "
            "platform manifest (skopeo copy without --all)")
    assert manifest.config is not None  # read_manifest guarantees it for an image manifest
    cfg = read_image_config(_read_json_file(name, _blob_path(layout, manifest.config.digest), "config",
                                            manifest.config.digest), name)
    blobs = []
    for layer in manifest.layers:
        path = _blob_path(layout, layer.digest)
        if not os.path.isfile(path):
            raise ImageFormatError(name, "layer", f"blob {layer.digest} is missing from the layout")
        blobs.append(LayerBlob(name=layer.digest, open=_opener(path), digest=layer.digest))
    info = ImageInfo(ref=name, transport=ref.transport, manifest_kind=kind, manifest_digest=mdigest,
                     platform=cfg.platform, layers=len(blobs), index_platforms=plats, attestations=att,
                     warnings=tuple(warnings), platform_choice=choice)
    return OpenedImage(info=info, config=cfg.config, blobs=tuple(blobs), config_platform=cfg.platform)


def _archive_member(name: str, members: dict[str, tarfile.TarInfo], p: str) -> tarfile.TarInfo:
    """The regular file an archive path names, following its symlinks inside the archive (bounded)."""
    m = members.get(p)
    seen = {p}
    while m is not None and m.issym():
        if len(seen) > _MAX_LINKS:
            raise ImageFormatError(name, "manifest.json", f"{p}: more than {_MAX_LINKS} symlinks in a row")
        nxt = os.path.normpath(os.path.join(os.path.dirname(m.name), m.linkname)).lstrip("/")
        if nxt in seen:
            raise ImageFormatError(name, "manifest.json", f"{p}: a symlink loop in the archive")
        seen.add(nxt)
        m = members.get(nxt)
    if m is None or not m.isreg():
        raise ImageFormatError(name, "manifest.json", f"{p} is not in the archive")
    return m


def _archive_digest(member_path: str, json_suffix: bool) -> str | None:
    """The digest a docker save member's name states (blobs/sha256/HEX, or HEX.json for old configs)."""
    base = member_path.rsplit("/", 1)[-1]
    if member_path.startswith("blobs/sha256/"):
        return "sha256:" + base
    if json_suffix and base.endswith(".json") and len(base) == 69:
        return "sha256:" + base[:-5]
    return None


def _open_docker_archive(ref: ImageRef) -> OpenedImage:
    name = str(ref)
    path = ref.path
    if not os.path.isfile(path):
        raise ImageRefError(name, f"{path}: no such file")
    try:
        tf = tarfile.open(path, "r:")  # noqa: SIM115 - closed by the with block below, once its errors are told
    except tarfile.TarError as e:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        hint = " (gzip-compressed? docker save writes an uncompressed tar; gunzip it first)" if gz else ""
        raise ImageRefError(name, f"not a tar archive{hint}: {e}") from e
    with tf:
        try:
            members = {os.path.normpath(m.name).lstrip("/"): m for m in tf.getmembers()}
        except tarfile.TarError as e:
            raise ImageFormatError(name, "archive", f"bad tar: {e}") from e
        mm = members.get("manifest.json")
        if mm is None:
            raise ImageRefError(name, "no manifest.json: not a docker save archive (for an OCI layout use oci:DIR)")

        def read_member(p: str, what: str) -> bytes:
            m = _archive_member(name, members, p)
            if m.size > _MAX_JSON:
                raise ImageFormatError(name, what, "larger than 8 MiB")
            f = tf.extractfile(m)
            return f.read(_MAX_JSON + 1) if f is not None else b""

        manifest = read_archive_manifest(_parse_json(name, "manifest.json",
                                                     read_member("manifest.json", "manifest.json"), None), name)
        if ref.tag:
            want = ref.tag
            if want.startswith("@") and want[1:].isascii() and want[1:].isdigit():
                i = int(want[1:])
                entry = manifest[i] if i < len(manifest) else None
            else:
                entry = next((e for e in manifest if want in e.repo_tags), None)
            if entry is None:
                tags = [t for e in manifest for t in e.repo_tags]
                raise ImageRefError(name, f"no image {want!r} in the archive (tags: {', '.join(tags) or 'none'})")
        elif len(manifest) == 1:
            entry = manifest[0]
        else:
            raise ImageRefError(name,
                                f"the archive holds {len(manifest)} images; name one as docker-archive:FILE:REPO:TAG")

        digest = _archive_digest(entry.config, True)
        cfg = read_image_config(_parse_json(name, "config", read_member(entry.config, "config"),
                                            parse_digest(digest, name, "config") if digest else None), name)
        blobs = []
        for i, lp in enumerate(entry.layers):
            m = _archive_member(name, members, lp)
            ldigest = _archive_digest(lp, False)
            blobs.append(LayerBlob(name=lp, open=functools.partial(_Slice, path, m.offset_data, m.size),
                                   digest=parse_digest(ldigest, name, "layer") if ldigest else None,
                                   diff_id=cfg.diff_ids[i] if i < len(cfg.diff_ids) else None))
    info = ImageInfo(ref=name, transport=ref.transport, manifest_kind=ManifestKind.DOCKER_ARCHIVE,
                     platform=cfg.platform, layers=len(blobs))
    return OpenedImage(info=info, config=cfg.config, blobs=tuple(blobs), config_platform=cfg.platform)


def _open_skopeo_dir(ref: ImageRef) -> OpenedImage:
    """skopeo's own ``dir:`` format (manifest.json + blobs named by hex digest)."""
    name = str(ref)
    d = ref.path
    manifest = read_manifest(_read_json_file(name, os.path.join(d, "manifest.json"), "manifest.json"), name)
    kind, _, _ = classify_manifest(manifest)
    if manifest.is_index:
        raise ImageRefError(name, "skopeo dir: copy holds an index; copy one platform (skopeo copy without --all)")
    assert manifest.config is not None
    cfg_d = manifest.config.digest
    cfg = read_image_config(_read_json_file(name, os.path.join(d, cfg_d.partition(":")[2]), "config", cfg_d), name)
    blobs = tuple(LayerBlob(name=layer.digest, digest=layer.digest,
                            open=_opener(os.path.join(d, layer.digest.partition(":")[2])))
                  for layer in manifest.layers)
    info = ImageInfo(ref=name, transport=Transport.DIR, manifest_kind=kind, platform=cfg.platform, layers=len(blobs))
    return OpenedImage(info=info, config=cfg.config, blobs=blobs, config_platform=cfg.platform)


def find_bundle_config(root: str) -> str | None:
    """The OCI runtime ``config.json`` an unpacker left with a root: ``BUNDLE/config.json`` for
    ``dir:BUNDLE/rootfs`` (``umoci unpack``, ``runc spec``) or for ``dir:BUNDLE`` itself."""
    root = os.path.abspath(root)
    for cand in (os.path.join(root, "config.json"), os.path.join(os.path.dirname(root), "config.json")):
        if os.path.isfile(cand):
            bundle = os.path.dirname(cand)
            if os.path.isdir(os.path.join(bundle, "rootfs")) and (
                    bundle == root or os.path.samefile(os.path.join(bundle, "rootfs"), root)):
                return cand
    return None


def _open_rootfs(ref: ImageRef) -> OpenedImage:
    """An unpacked root; its config from an OCI runtime bundle's ``config.json`` when one lies with it."""
    name = str(ref)
    cfg_path = find_bundle_config(ref.path)
    if cfg_path is None:
        info = ImageInfo(ref=name, transport=Transport.DIR, manifest_kind=ManifestKind.NONE)
        return OpenedImage(info=info, config=ImageConfig(), blobs=(), rootfs_dir=ref.path)
    bundle = os.path.dirname(cfg_path)
    config, _ids = read_runtime_config(_read_json_file(name, cfg_path, "config.json"), name)
    info = ImageInfo(ref=name, transport=Transport.DIR, manifest_kind=ManifestKind.RUNTIME_BUNDLE,
                     config_source=cfg_path)
    return OpenedImage(info=info, config=config, blobs=(), rootfs_dir=os.path.join(bundle, "rootfs"))


def _skopeo(ref_name: str, opts: SkopeoOptions, action: str, args: list[str]) -> str:
    exe = shutil.which(opts.skopeo)
    if exe is None:
        raise SkopeoNotFound(ref_name)
    try:
        p = run_bounded([exe, *args], timeout=opts.timeout)
    except subprocess.TimeoutExpired as e:
        raise SkopeoError(ref_name, action, f"timed out after {opts.timeout:g}s") from e
    except OutputTooLarge as e:  # a registry's answer (a manifest, a config) is a few KiB
        raise SkopeoError(ref_name, action, str(e)) from e
    if p.returncode != 0:
        detail, hint = read_skopeo_failure(p.stderr, p.returncode)
        if opts.creds:
            detail = detail.replace(opts.creds, "***")
        raise SkopeoError(ref_name, action, detail, hint)
    return p.stdout


#: skopeo's causes (the last part of its message) an SRE can act on, and what to do about each
_SKOPEO_HINTS = (
    ("connection refused", "Nothing listens there: check the registry's host and port, and that it is up."),
    ("no such host", "The registry's host name does not resolve: check its spelling and the DNS of this machine."),
    ("server gave HTTP response to HTTPS client", "The registry speaks plain HTTP: add --tls-verify=false."),
    ("certificate", "The registry's TLS certificate is not trusted here: install its CA, or --tls-verify=false for a "
                    "registry you trust on a private network."),
    ("authentication required", "The registry wants credentials: --creds USER:PASSWORD or --authfile FILE (as "
                                "`skopeo login` writes it)."),
    ("unauthorized", "The registry refused the credentials: check --creds/--authfile."),
    ("denied", "The registry refused the credentials or this repository: check --creds/--authfile and the name."),
    ("manifest unknown", "The registry has no such image: check the repository's name and the tag (skopeo "
                         "list-tags docker://REPOSITORY lists its tags)."),
    ("name unknown", "The registry has no such repository: check the image's name."),
    ("not known to registry", "The registry has no such repository: check the image's name."),
)
_MAX_DETAIL = 400


def read_skopeo_failure(stderr: str, returncode: int) -> tuple[str, str]:
    r"""skopeo's failure as one line, its cause first, and a hint for a cause an SRE can act on ("" otherwise).

    skopeo logs ``time="..." level=fatal msg="A: B: C"``, a chain of contexts whose last part is the cause: the
    line becomes ``C (A: B)``, without the log's time and level, and the "Error parsing image name" context that
    only repeats the reference.

    >>> read_skopeo_failure('time="2026-01-01T00:00:00Z" level=fatal msg="Error parsing image name '
    ...                     '\\"docker://h:5/x\\": reading manifest 1 in h:5/x: manifest unknown"', 1)[0]
    'manifest unknown (reading manifest 1 in h:5/x)'
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    logged = [_logrus_message(line) for line in lines]
    fatal = [m for m, level in logged if level in ("fatal", "error")]
    message = fatal[-1] if fatal else (lines[-1] if lines else f"exit status {returncode}")
    parts = [x for x in message.split(": ") if x]
    if parts and parts[0].startswith("Error parsing image name"):
        parts = parts[1:]
    cause = parts[-1] if parts else message
    context = ": ".join(p for p in parts[:-1] if p not in ("connect", cause))  # registries repeat the cause
    detail = f"{cause} ({context})" if context else cause
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL - 3] + "..."
    hint = next((h for key, h in _SKOPEO_HINTS if key in cause or key in parts[-2:-1] or key in message), "")
    return detail, hint


def _logrus_message(line: str) -> tuple[str, str]:
    """The message and level of one of skopeo's log lines (``time=... level=... msg="..."``, Go-quoted); the line
    itself and "" when it is not one."""
    level = msg = None
    for m in re.finditer(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line):
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            value = re.sub(r'\\(.)', lambda e: {"n": " ", "t": " "}.get(e.group(1), e.group(1)), value[1:-1])
        if key == "level":
            level = value
        elif key == "msg":
            msg = value
    if level is None or msg is None:
        return line, ""
    return msg, level


def _fetch_with_skopeo(ref: ImageRef, platform: Platform, opts: SkopeoOptions, workdir: str,
                       source: PlatformSource = PlatformSource.OPTION) -> OpenedImage:
    prefix = {Transport.DOCKER: "docker://", Transport.DOCKER_DAEMON: "docker-daemon:",
              Transport.CONTAINERS_STORAGE: "containers-storage:"}[ref.transport]
    src = prefix + ref.path
    common: list[str] = []
    kind_override = None
    choice = None
    if ref.transport is Transport.DOCKER:
        inspect = ["inspect", "--raw"]
        if opts.creds:
            inspect += ["--creds", opts.creds]
        if opts.authfile:
            inspect += ["--authfile", opts.authfile]
        if not opts.tls_verify:
            inspect += ["--tls-verify=false"]
        raw = _skopeo(src, opts, "inspect", inspect + [src])
        top = read_manifest(parse_json(raw.encode(), src, "registry manifest"), src)
        kind_override = classify_manifest(top)
        if top.is_index:  # chosen here, before anything is copied: the same choice as a layout's, and its error
            chosen, choice = choose_platform(top, platform, source, src)
            platform = chosen.platform or platform
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
    opened = _open_oci(ImageRef(transport=Transport.OCI, path=dest, tag="image"), platform, kind_override, source)
    info = replace(opened.info, ref=src, transport=ref.transport)
    if choice is not None:  # the registry's digest of the platform's manifest (the copy may be re-encoded)
        info = replace(info, platform_choice=choice, manifest_digest=choice.digest)
    return replace(opened, info=info)


@contextlib.contextmanager
def open_image(ref: ImageRef, *, platform: Platform | None = None,
               skopeo: SkopeoOptions | None = None) -> Iterator[OpenedImage]:
    """Open ``ref`` for reading; a skopeo copy lives in a temporary directory removed on exit.

    :param platform: the platform to read from an image index (None: this machine's, :func:`host_platform`)
    :raises ImageRefError: nothing readable at the reference
    :raises PlatformNotInIndex: an image index without an image of the platform
    :raises ImageFormatError: a malformed manifest, config or layout
    :raises SkopeoNotFound: a registry/daemon reference and no skopeo
    :raises SkopeoError: skopeo could not fetch it (auth, TLS, unknown repository)
    """
    source = PlatformSource.HOST if platform is None else PlatformSource.OPTION
    platform = platform or host_platform()
    if ref.transport is Transport.OCI:
        yield _check_platform(_open_oci(ref, platform, source=source), platform)
    elif ref.transport is Transport.DOCKER_ARCHIVE:
        yield _check_platform(_open_docker_archive(ref), platform)
    elif ref.transport is Transport.DIR:
        if not os.path.isdir(ref.path):
            raise ImageRefError(str(ref), f"{ref.path} is not a directory")
        if (os.path.isfile(os.path.join(ref.path, "manifest.json"))
            and os.path.isfile(os.path.join(ref.path, "version"))):
            yield _check_platform(_open_skopeo_dir(ref), platform)
        else:
            yield _open_rootfs(ref)
    else:
        with tempfile.TemporaryDirectory(prefix="forensics-image-") as tmp:
            yield _check_platform(_fetch_with_skopeo(ref, platform, skopeo or SkopeoOptions(), tmp, source),
                                  platform)


def _check_platform(opened: OpenedImage, platform: Platform) -> OpenedImage:
    got = opened.config_platform
    if got and not got.startswith(f"{platform.os}/{platform.architecture}"):
        w = f"the image's config says {got}, not {platform}: resolution assumes the image's platform"
        return replace(opened, info=replace(opened.info, warnings=opened.info.warnings + (w,)))
    return opened
