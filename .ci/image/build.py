"""The agent image: an OCI image built with mmdebstrap and umoci (no Docker engine needed).

    .venv/bin/python .ci/image/build.py --out DIR [--tag TAG]      # an OCI layout at DIR, image DIR:TAG
    skopeo copy oci:DIR:TAG docker://REGISTRY/forensics-agent:TAG

What it holds (Debian bookworm, ``--variant=essential`` plus the tools the agent runs):
gdb (native stacks; libdw from elfutils is the default unwinder), elfutils, zstd, kubectl
(Debian's ``kubernetes-client``: the agent's Events and pod lookups with its service account),
and forensics itself, self-contained under ``/opt/forensics`` so that the DaemonSet's init
container can copy it to the host, where the kernel runs the core handler without the image's
root: its own interpreter (``bin/python3.11``), standard library, site-packages (forensics and its
dependencies, binary wheels from PyPI), and the shared libraries they need with the dynamic loader
(``lib/``); ``bin/forensics`` runs the interpreter through that loader, so it runs on any x86-64
node whatever its distribution.  ``/usr/local/bin/forensics`` points at it (the agent pod's
command).  The image is tagged with the package version: what ``forensics agent manifest`` names.

Used by tests/integration/test_agent_image.py, which builds it once per input (cached).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SUITE = "bookworm"
PACKAGES = ("python3", "gdb", "elfutils", "zstd", "kubernetes-client", "ca-certificates")
PY = "3.11"
_LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib")
WRAPPER = """#!/bin/sh
# forensics, self-contained: this tree's interpreter through this tree's dynamic loader (runs on the host too)
here=$(dirname "$(readlink -f "$0")")/..
here=$(readlink -f "$here")
export PYTHONHOME="$here" PYTHONPATH="$here/site-packages" PYTHONNOUSERSITE=1
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/bin/python{py}" -m forensics "$@"
"""


def _needed(path: Path) -> list[str]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            return [t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                    for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    except (ELFError, OSError):
        return []


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _find_lib(rootfs: Path, name: str) -> Path | None:
    for d in _LIB_DIRS:
        p = rootfs / d / name
        if p.exists():
            return p
    return None


def assemble(rootfs: Path, site: Path) -> None:
    """Lay out /opt/forensics in ``rootfs``: interpreter, stdlib, site-packages, libraries, loader, wrapper."""
    opt = rootfs / "opt/forensics"
    (opt / "bin").mkdir(parents=True)
    (opt / "lib").mkdir()
    shutil.copy2(rootfs / f"usr/bin/python{PY}", opt / f"bin/python{PY}")
    shutil.copytree(rootfs / f"usr/lib/python{PY}", opt / f"lib/python{PY}", symlinks=False,
                    ignore=shutil.ignore_patterns("test", "tests", "idlelib", "tkinter", "turtledemo", "__pycache__",
                                                  "dist-packages", "ensurepip"))
    shutil.copytree(site, opt / "site-packages")
    # the shared libraries every ELF file of the tree needs, resolved inside the image, with the loader
    todo = [p for p in opt.rglob("*") if p.is_file() and _is_elf(p)]
    seen: set[str] = set()
    while todo:
        for name in _needed(todo.pop()):
            if name in seen:
                continue
            seen.add(name)
            lib = _find_lib(rootfs, name)
            if lib is None:
                raise SystemExit(f"image: {name} not found in the image's library directories")
            dest = opt / "lib" / name
            shutil.copy2(lib.resolve(), dest)
            todo.append(dest)
    loader = _find_lib(rootfs, "ld-linux-x86-64.so.2")
    shutil.copy2(loader.resolve(), opt / "lib/ld-linux-x86-64.so.2")
    (opt / "bin/forensics").write_text(WRAPPER.format(py=PY))
    (opt / "bin/forensics").chmod(0o755)
    (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    link = rootfs / "usr/local/bin/forensics"
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to("/opt/forensics/bin/forensics")


def site_packages(work: Path) -> Path:
    """forensics (a wheel of this checkout) and its dependencies for CPython 3.11 x86-64, from PyPI."""
    wheels = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True)
    (wheel,) = wheels.glob("crash_forensics-*.whl")
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(site),
                    "--python-version", PY, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
                    "--only-binary=:all:", str(wheel)], check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)
    return site


def build(out: Path, tag: str) -> Path:
    """Build the image into the OCI layout ``out`` as ``out:tag``; returns ``out``."""
    from tests.roots import build_root

    base = build_root(SUITE, PACKAGES)
    work = Path(tempfile.mkdtemp(prefix="forensics-image-"))
    try:
        site = site_packages(work)
        subprocess.run(["umoci", "init", "--layout", str(out)], check=True)
        subprocess.run(["umoci", "new", "--image", f"{out}:{tag}"], check=True)
        bundle = work / "bundle"
        subprocess.run(["umoci", "unpack", "--image", f"{out}:{tag}", str(bundle)], check=True, capture_output=True)
        rootfs = bundle / "rootfs"
        shutil.rmtree(rootfs)
        subprocess.run(["cp", "-a", str(base), str(rootfs)], check=True)
        for marker in rootfs.glob(".forensics-root*"):
            marker.unlink()
        assemble(rootfs, site)
        subprocess.run(["umoci", "repack", "--image", f"{out}:{tag}", str(bundle)], check=True, capture_output=True)
        subprocess.run(["umoci", "config", "--image", f"{out}:{tag}",
                        "--config.entrypoint", "/opt/forensics/bin/forensics",
                        "--config.workingdir", "/", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
                        "--config.label", f"org.opencontainers.image.version={tag}",
                        "--config.label", "org.opencontainers.image.title=forensics-agent"], check=True)
        subprocess.run(["umoci", "gc", "--layout", str(out)], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    from forensics import __version__

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="OCI layout directory to create")
    ap.add_argument("--tag", default=__version__)
    a = ap.parse_args()
    from tests.scriptenv import require_checkout_python

    # pip builds the checkout's wheel with hatchling (no build isolation); _needed reads ELF files with pyelftools
    require_checkout_python(".ci/image/build.py", ("pip", "hatchling", "elftools"))
    out = Path(a.out)
    if out.exists():
        raise SystemExit(f"{out}: already exists (not overwritten)")
    build(out, a.tag)
    print(f"Wrote {out}:{a.tag}")


if __name__ == "__main__":
    main()
