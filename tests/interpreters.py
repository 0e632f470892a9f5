"""CPython interpreters built from Debian's source packages for the tests (free-threaded ``--disable-gil``).

``build_cpython("3.14", free_threaded=True)`` returns the installed prefix of CPython 3.14 built
from the ``orig.tar.xz`` that Debian unstable's ``python3.14`` source package carries (the
mirror's ``Sources`` index names it and its SHA-256, which is checked), configured with
``--disable-gil`` (CPython's default flags keep ``-g``), under
``<forensics cache>/cpython/<version>t-<key>``.  The key is what the build is made from: the
tarball's SHA-256, the configure flags and this builder's version; the build runs under an
exclusive file lock in a temporary directory renamed into place, so CI builds each at most once
per machine and concurrent test runs wait for one build.  With no network the newest cached
build of that version and flags is used; with neither, :class:`BuildUnavailable` says why.

Usable from a shell, too::

    python tests/interpreters.py 3.14t
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

__all__ = ["BuildUnavailable", "source_tarball", "build_cpython"]

MIRROR = os.environ.get("FORENSICS_TEST_MIRROR", "http://deb.debian.org/debian")
_BUILDER = "configure --disable-gil --without-ensurepip --disable-test-modules; make -j; make install; v1"
_MARKER = ".forensics-cpython.json"
_BUILD_TIMEOUT = 3600
_MAX_SOURCES = 64 << 20  # the decompressed Sources index


class BuildUnavailable(RuntimeError):
    """No built interpreter is cached and none can be built here (no mirror, no compiler): a test should skip."""


def _cache() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from forensics.cache import cache_dir

    return cache_dir() / "cpython"


def source_tarball(minor: str, suite: str = "sid", mirror: str = MIRROR) -> tuple[str, str, str]:
    """``(upstream version, URL, SHA-256)`` of the newest ``pythonMINOR`` orig tarball of the suite.

    :raises BuildUnavailable: when the mirror cannot be read or has no such source package
    """
    url = f"{mirror.rstrip('/')}/dists/{suite}/main/source/Sources.xz"
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            text = lzma.LZMADecompressor().decompress(resp.read(), max_length=_MAX_SOURCES).decode("utf-8", "replace")
    except (OSError, lzma.LZMAError) as e:
        raise BuildUnavailable(f"cannot read {url}: {e}") from e
    best: tuple[tuple[int, ...], str, str, str] | None = None
    for stanza in text.split("\n\n"):
        if f"\nPackage: python{minor}\n" not in "\n" + stanza + "\n":
            continue
        directory = next((ln.split(":", 1)[1].strip() for ln in stanza.splitlines() if ln.startswith("Directory:")), "")
        in_sums = False
        for line in stanza.splitlines():
            if line.startswith("Checksums-Sha256:"):
                in_sums = True
                continue
            if in_sums and not line.startswith(" "):
                in_sums = False
            if in_sums and line.strip().endswith(".orig.tar.xz"):
                sha, _, name = line.split()
                version = name.split("_", 1)[1].removesuffix(".orig.tar.xz")
                key = tuple(int(x) for x in version.split(".") if x.isdigit())
                if best is None or key > best[0]:
                    best = (key, version, f"{mirror.rstrip('/')}/{directory}/{name}", sha)
    if best is None:
        raise BuildUnavailable(f"{url} has no python{minor} source package with an orig tarball")
    return best[1], best[2], best[3]


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _cached(root: Path, minor: str) -> Path | None:
    found = sorted(root.glob(f"{minor}t-*/{_MARKER}"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def build_cpython(minor: str, *, free_threaded: bool = True) -> Path:
    """The prefix of CPython ``minor`` built from Debian unstable's source package (``bin/python{minor}[t]``).

    :raises BuildUnavailable: when there is no cached build and none can be made here
    """
    if not free_threaded:
        raise ValueError("only free-threaded builds are made here (the default ones come from Debian's packages)")
    root = _cache()
    root.mkdir(parents=True, exist_ok=True)
    try:
        version, url, sha = source_tarball(minor)
    except BuildUnavailable as e:
        found = _cached(root, minor)
        if found is not None:
            return found
        raise BuildUnavailable(f"no cached CPython {minor}t build, and {e}") from e
    key = hashlib.sha256(json.dumps([_BUILDER, sha]).encode()).hexdigest()[:16]
    final = root / f"{minor}t-{key}"
    if (final / _MARKER).is_file():
        return final
    with _locked(root / f".{minor}t-{key}.lock"):
        if (final / _MARKER).is_file():
            return final
        _build(final, minor, version, url, sha)
    return final


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"{what} exited {proc.returncode}: {' '.join(cmd)}\n{tail}")


def _build(final: Path, minor: str, version: str, url: str, sha: str) -> None:
    for tool in ("gcc", "make"):
        if shutil.which(tool) is None:
            raise BuildUnavailable(f"{tool} is not installed (bash .ci/setup installs the build dependencies)")
    work = final.with_name(f".build-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # a build that died before its marker is not a build
    work.mkdir()
    try:
        tarball = work / "src.tar.xz"
        h = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=300) as resp, open(tarball, "wb") as out:
            while chunk := resp.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha:
            raise RuntimeError(f"{url}: SHA-256 {h.hexdigest()}, the Sources index says {sha}")
        with tarfile.open(tarball) as tar:
            tar.extractall(work / "src", filter="data")
        src = next((work / "src").iterdir())
        prefix = final.with_name(f".prefix-{final.name}-{os.getpid()}")
        shutil.rmtree(prefix, ignore_errors=True)
        _run(["./configure", f"--prefix={final}", "--disable-gil", "--without-ensurepip", "--disable-test-modules"],
             src, "configure")
        _run(["make", f"-j{os.cpu_count() or 2}"], src, "make")
        _run(["make", f"DESTDIR={prefix}", "install"], src, "make install")
        built = prefix / str(final).lstrip("/")
        (built / _MARKER).write_text(json.dumps({"builder": _BUILDER, "version": version, "url": url,
                                                 "sha256": sha, "free_threaded": True}, indent=1) + "\n")
        os.rename(built, final)  # installed for --prefix=final, renamed into place whole
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(final.with_name(f".prefix-{final.name}-{os.getpid()}"), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith("t"):
        sys.exit("usage: interpreters.py 3.14t")
    print(build_cpython(sys.argv[1][:-1]))
