"""An OCI image index (a multi-platform image) made in an OCI layout from images already in it.

umoci builds and tags one image per platform but writes no index; skopeo copies an index (``--all``) but
makes none.  :func:`add_image_index` writes the index blob the OCI image spec describes -- one
descriptor per platform image, each with its ``platform`` -- and tags it in the layout's
``index.json``, as ``docker buildx``'s OCI exporter lays one out.  skopeo then reads, checks and pushes
it like any other (``skopeo inspect --raw oci:DIR:TAG``, ``skopeo copy --all``).

Used by .ci/image/build.py (the agent's image for linux/amd64 and linux/arm64) and the
verify-imports tests of image indexes.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MT_INDEX", "MT_MANIFEST", "REF_NAME", "platform_object", "add_image_index"]

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def platform_object(text: str) -> dict:
    """``linux/arm64[/v8]`` as an OCI descriptor's ``platform``.

    >>> platform_object("linux/arm/v7")
    {'architecture': 'arm', 'os': 'linux', 'variant': 'v7'}
    """
    parts = text.split("/")
    out = {"architecture": parts[1], "os": parts[0]}
    if len(parts) > 2:
        out["variant"] = parts[2]
    return out


def _put(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    p = layout / "blobs" / "sha256" / digest.split(":")[1]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return digest, len(data)


def add_image_index(layout: Path, tag: str, images: Sequence[tuple[str, str]], *, untag: bool = True) -> str:
    """Tag in ``layout`` an image index of the images tagged ``images``: ``[("image-arm64", "linux/arm64"), ...]``.

    :param untag: take the per-platform tags out of ``index.json`` (their manifests stay, reached through the
        index), so that the layout holds one image by name, as a registry's tag does
    :return: the index's digest
    """
    path = layout / "index.json"
    top = json.loads(path.read_text())
    by_tag = {(m.get("annotations") or {}).get(REF_NAME): m for m in top["manifests"]}
    entries = []
    for image_tag, platform in images:
        m = by_tag[image_tag]
        entries.append({"mediaType": m.get("mediaType", MT_MANIFEST), "digest": m["digest"], "size": m["size"],
                        "platform": platform_object(platform)})
    index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": entries}
    digest, size = _put(layout, json.dumps(index, indent=1).encode())
    gone = {tag} | ({t for t, _ in images} if untag else set())
    top["manifests"] = [m for m in top["manifests"] if (m.get("annotations") or {}).get(REF_NAME) not in gone]
    top["manifests"].append({"mediaType": MT_INDEX, "digest": digest, "size": size,
                             "annotations": {REF_NAME: tag}})
    path.write_text(json.dumps(top))
    return digest
