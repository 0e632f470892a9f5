"""The agent's image index (.ci/image/build.py: linux/amd64 and linux/arm64), built once per input and cached.

The image is built once per input (the recipe, the package's files, the index writer) into
``<forensics cache>/images/agent-<key>``, under a lock, into a temporary directory renamed into
place: another test run sees a whole image or none.  Without a way to build it here (no Debian
mirror and nothing cached, no qemu-user/binfmt_misc for the foreign architecture) the tests skip
with the builder's reason.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.cache import cache_dir

__all__ = ["ROOT", "inputs_key", "agent_image", "unpack"]

ROOT = Path(__file__).resolve().parents[1]


def inputs_key() -> str:
    h = hashlib.sha256()
    for p in sorted([ROOT / ".ci/image/build.py", ROOT / "pyproject.toml", ROOT / "tests/oci_index.py",
                     *(ROOT / "forensics").rglob("*.py"), *(ROOT / "forensics").rglob("*.j2"),
                     *(ROOT / "forensics").rglob("*.json"), *(ROOT / "gdb_scripts").rglob("*"),
                     *(ROOT / "reproducers").rglob("*")]):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def agent_image() -> Path:
    """The OCI layout of the agent's image index (tag: the package version; ``VERSION-ARCH`` each image)."""
    images = cache_dir() / "images"
    images.mkdir(parents=True, exist_ok=True)
    final = images / f"agent-{inputs_key()}"
    if (final / "index.json").is_file():
        return final
    with open(images / ".agent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "index.json").is_file():
            return final
        tmp = images / f".tmp-agent-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        p = subprocess.run([sys.executable, str(ROOT / ".ci/image/build.py"), "--out", str(tmp)],
                           capture_output=True, text=True, timeout=3600)
        if p.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            if "RootUnavailable" in p.stderr or "cannot read" in p.stderr:
                pytest.skip(f"the agent image cannot be built here: {p.stderr.strip()[-300:]}")
            raise AssertionError(p.stderr[-3000:])
        os.rename(tmp, final)
        # images of older inputs: keep the newest two (another test run may be reading one)
        old = sorted((p for p in images.glob("agent-*") if p != final), key=lambda p: p.stat().st_mtime)
        for p in old[:-1]:
            shutil.rmtree(p, ignore_errors=True)
    return final


def unpack(image: Path, tag: str, dest: Path) -> Path:
    """``umoci unpack`` of ``image:tag`` into the bundle ``dest``; returns its root."""
    subprocess.run(["umoci", "unpack", "--image", f"{image}:{tag}", str(dest)], check=True, capture_output=True)
    return dest / "rootfs"
