"""The agent image: an OCI image index for linux/amd64 and linux/arm64, built with mmdebstrap and umoci (no
Docker engine needed).

    .venv/bin/python .ci/image/build.py --out DIR [--tag TAG] [--platform linux/arm64 ...]
    skopeo copy --all oci:DIR:TAG docker://REGISTRY/forensics-agent:TAG     # the index and both images

``DIR:TAG`` is the image index (a node's runtime pulls its own platform's image from it); each platform's
image is also tagged ``TAG-ARCH`` in the layout (``umoci unpack --image DIR:TAG-arm64``).  Each image's
userland is that architecture's Debian packages; a foreign one (arm64 on x86-64) is installed by
mmdebstrap with its maintainer scripts run by qemu-user-static through binfmt_misc (``arch-test`` and
an enabled ``qemu-aarch64`` entry: bash .ci/setup).  The forensics wheel is pure Python: the same
wheel goes into both; its binary dependencies are PyPI's wheels for each architecture.

What it holds (Debian bookworm, ``--variant=essential`` plus the tools the agent runs):
gdb (native stacks; libdw from elfutils is the default unwinder), elfutils, zstd, kubectl
(Debian's ``kubernetes-client``: the agent's Events and pod lookups with its service account),
libseccomp2 (the seccomp filter of each analysis' sandbox, forensics/sandbox/),
and forensics itself, self-contained under ``/opt/forensics`` so that the DaemonSet's init
container can copy it to the host, where the kernel runs the core handler without the image's
root: its own interpreter (``bin/python3.11``), standard library, site-packages (forensics and its
dependencies, binary wheels from PyPI), and the shared libraries they need with the dynamic loader
(``lib/``); ``bin/forensics`` runs the interpreter through that loader, so it runs on any node of its
architecture whatever its distribution.  ``/usr/local/bin/forensics`` points at it (the agent pod's
command).  The image is tagged with the package version: what ``forensics agent manifest`` names.

Used by tests/integration/test_agent_image.py and test_agent_image_arm64.py, which build it once per input
(cached: tests/agent_image.py).
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
PACKAGES = ("python3", "gdb", "elfutils", "zstd", "kubernetes-client", "ca-certificates", "libseccomp2")
PY = "3.11"
PLATFORMS = ("linux/amd64", "linux/arm64")


class Arch:
    """What differs between the images of two architectures: the library directories, the loader, the wheels."""

    def __init__(self, deb: str, triplet: str, loader: str, machine: str) -> None:
        self.deb, self.triplet, self.loader, self.machine = deb, triplet, loader, machine
        self.lib_dirs = (f"lib/{triplet}", f"usr/lib/{triplet}", "lib64", "usr/lib")
        self.wheel_platforms = (f"manylinux2014_{machine}", f"manylinux_2_17_{machine}", f"manylinux_2_28_{machine}")


ARCHES = {"amd64": Arch("amd64", "x86_64-linux-gnu", "ld-linux-x86-64.so.2", "x86_64"),
          "arm64": Arch("arm64", "aarch64-linux-gnu", "ld-linux-aarch64.so.1", "aarch64")}
WRAPPER = """#!/bin/sh
# forensics, self-contained: this tree's interpreter through this tree's dynamic loader (runs on the host too)
here=$(dirname "$(readlink -f "$0")")/..
here=$(readlink -f "$here")
export PYTHONHOME="$here" PYTHONPATH="$here/site-packages" PYTHONNOUSERSITE=1
exec "$here/lib/{loader}" --library-path "$here/lib" "$here/bin/python{py}" -m forensics "$@"
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


def _find_lib(rootfs: Path, name: str, arch: Arch) -> Path | None:
    for d in arch.lib_dirs:
        p = rootfs / d / name
        if p.exists():
            return p
    return None


def assemble(rootfs: Path, site: Path, arch: Arch) -> None:
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
            lib = _find_lib(rootfs, name, arch)
            if lib is None:
                raise SystemExit(f"image: {name} not found in the image's library directories")
            dest = opt / "lib" / name
            shutil.copy2(lib.resolve(), dest)
            todo.append(dest)
    loader = _find_lib(rootfs, arch.loader, arch)
    if loader is None:
        raise SystemExit(f"image: no {arch.loader} in the {arch.deb} root")
    shutil.copy2(loader.resolve(), opt / "lib" / arch.loader)
    (opt / "bin/forensics").write_text(WRAPPER.format(py=PY, loader=arch.loader))
    (opt / "bin/forensics").chmod(0o755)
    (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    link = rootfs / "usr/local/bin/forensics"
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to("/opt/forensics/bin/forensics")


def forensics_wheel(work: Path) -> Path:
    """A wheel of this checkout: pure Python (``py3-none-any``), the same file in every architecture's image."""
    wheels = work / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True)
    (wheel,) = wheels.glob("crash_forensics-*.whl")
    if not wheel.name.endswith("-py3-none-any.whl"):
        raise SystemExit(f"image: {wheel.name} is not a pure-Python wheel: it cannot go into every architecture")
    return wheel


def site_packages(work: Path, wheel: Path, arch: Arch) -> Path:
    """forensics and its dependencies for CPython 3.11 of ``arch``: binary wheels of that machine, from PyPI."""
    site = work / f"site-{arch.deb}"
    plats = [a for p in arch.wheel_platforms for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(site),
                    "--python-version", PY, "--implementation", "cp", *plats, "--only-binary=:all:", str(wheel)],
                   check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)
    return site


def build_platform(out: Path, tag: str, arch: Arch, wheel: Path, work: Path) -> None:
    """One architecture's image into the layout ``out``, tagged ``tag-ARCH``."""
    from tests.roots import build_root

    # this machine's architecture as it always was; another installed whole under qemu-user (binfmt_misc)
    base = build_root(SUITE, PACKAGES, arch=arch.deb, emulate=True)
    site = site_packages(work, wheel, arch)
    image = f"{out}:{tag}-{arch.deb}"
    subprocess.run(["umoci", "new", "--image", image], check=True)
    bundle = work / f"bundle-{arch.deb}"
    subprocess.run(["umoci", "unpack", "--image", image, str(bundle)], check=True, capture_output=True)
    rootfs = bundle / "rootfs"
    shutil.rmtree(rootfs)
    subprocess.run(["cp", "-a", str(base), str(rootfs)], check=True)
    for marker in rootfs.glob(".forensics-root*"):
        marker.unlink()
    assemble(rootfs, site, arch)
    subprocess.run(["umoci", "repack", "--image", image, str(bundle)], check=True, capture_output=True)
    shutil.rmtree(bundle)
    subprocess.run(["umoci", "config", "--image", image, "--os", "linux", "--architecture", arch.deb,
                    "--config.entrypoint", "/opt/forensics/bin/forensics",
                    "--config.workingdir", "/", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
                    "--config.label", f"org.opencontainers.image.version={tag}",
                    "--config.label", "org.opencontainers.image.title=forensics-agent"], check=True)


def build(out: Path, tag: str, platforms: tuple[str, ...] = PLATFORMS) -> Path:
    """Build the image index of ``platforms`` into the OCI layout ``out`` as ``out:tag`` (each platform's image
    also as ``out:tag-ARCH``); returns ``out``."""
    from tests.oci_index import add_image_index

    arches = [ARCHES[p.split("/")[1]] for p in platforms]
    work = Path(tempfile.mkdtemp(prefix="forensics-image-"))
    try:
        wheel = forensics_wheel(work)
        subprocess.run(["umoci", "init", "--layout", str(out)], check=True)
        for arch in arches:
            build_platform(out, tag, arch, wheel, work)
        subprocess.run(["umoci", "gc", "--layout", str(out)], check=True)
        add_image_index(out, tag, [(f"{tag}-{a.deb}", f"linux/{a.deb}") for a in arches], untag=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    from forensics import __version__

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="OCI layout directory to create")
    ap.add_argument("--tag", default=__version__)
    ap.add_argument("--platform", dest="platforms", action="append", choices=[f"linux/{a}" for a in ARCHES],
                    help=f"a platform of the index (repeatable; default: {' and '.join(PLATFORMS)})")
    a = ap.parse_args()
    from tests.scriptenv import require_checkout_python

    # pip builds the checkout's wheel with hatchling (no build isolation); _needed reads ELF files with pyelftools
    require_checkout_python(".ci/image/build.py", ("pip", "hatchling", "elftools"))
    out = Path(a.out)
    if out.exists():
        raise SystemExit(f"{out}: already exists (not overwritten)")
    build(out, a.tag, tuple(a.platforms or PLATFORMS))
    print(f"Wrote {out}:{a.tag}")


if __name__ == "__main__":
    main()
