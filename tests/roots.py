"""Debian root filesystems for tests: built once with mmdebstrap, cached, shared by every test run.

``build_root("sid", ["python3.14", "python3.14-dbg"])`` returns a directory under
``<forensics cache>/roots/`` holding a minimal Debian root of that suite with those
packages.  A root is keyed by what it is built from: the suite, the sorted package
list, the mirror, and the ``Date:`` of the mirror's ``Release`` file (the mirror here
is a dated snapshot, so a new snapshot makes a new root).  It is built under an
exclusive file lock into a temporary directory beside its final name and renamed into
place, so another test run reading the cache sees a whole root or none.  A root whose
marker (``.forensics-root.json``) is there is complete and never modified: tests
only read it (:func:`sandbox_command` binds it read-only).

Without network the newest cached root of the same suite and packages is used; with
neither, :class:`RootUnavailable` says why (a test should skip).

Usable from a shell, too::

    python tests/roots.py sid python3.14 python3.14-dbg libc6-dbg
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MIRROR", "RootUnavailable", "release_date", "root_key", "build_root", "sandbox_command"]

MIRROR = os.environ.get("FORENSICS_TEST_MIRROR", "http://deb.debian.org/debian")
#: the mirror is a dated snapshot: its Release files are past their Valid-Until
APT_OPTIONS = ('Acquire::Check-Valid-Until "false"',)
#: what a root holds beyond the packages; a change here is a change of every key
_BUILDER = "mmdebstrap variant=essential; docs/man/locales excluded; v1"
_DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
_MARKER = ".forensics-root.json"
_BUILD_TIMEOUT = 1800


class RootUnavailable(RuntimeError):
    """No root can be built or found here (no mmdebstrap, no mirror, not root): a test should skip."""


def _roots_dir(cache: Path | None) -> Path:
    if cache is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from forensics.cache import cache_dir

        cache = cache_dir()
    return Path(cache) / "roots"


def release_date(suite: str, mirror: str = MIRROR, *, timeout: float = 30.0) -> str:
    """The ``Date:`` field of ``MIRROR/dists/SUITE/Release``.

    :raises RootUnavailable: when the mirror cannot be reached or has no such suite
    """
    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            head = resp.read(64 << 10).decode("utf-8", "replace")
    except (OSError, urllib.error.URLError) as e:
        raise RootUnavailable(f"cannot read {url}: {e}") from e
    for line in head.splitlines():
        if line.startswith("Date:"):
            return line.split(":", 1)[1].strip()
    raise RootUnavailable(f"{url} has no Date: field")


def root_key(suite: str, packages: Sequence[str], date: str, mirror: str = MIRROR) -> str:
    """The cache key of a root: what it is built from.

    >>> root_key("sid", ["b", "a"], "d") == root_key("sid", ["a", "b", "a"], "d")
    True
    """
    text = json.dumps([_BUILDER, mirror, suite, sorted(set(packages)), date])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _marker(suite: str, packages: Sequence[str], date: str, mirror: str) -> dict:
    return {"builder": _BUILDER, "mirror": mirror, "suite": suite, "packages": sorted(set(packages)),
            "release_date": date}


def _cached(roots: Path, suite: str, packages: Sequence[str], mirror: str) -> Path | None:
    """The newest complete root of this suite and package list, whatever its snapshot date."""
    best: tuple[str, Path] | None = None
    want = sorted(set(packages))
    for marker in roots.glob(f"{suite}-*/{_MARKER}"):
        try:
            rec = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("packages") == want and rec.get("mirror") == mirror and rec.get("builder") == _BUILDER:
            stamp = str(rec.get("built_at", ""))
            if best is None or stamp > best[0]:
                best = (stamp, marker.parent)
    return best[1] if best else None


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build_root(suite: str, packages: Sequence[str], *, mirror: str = MIRROR, cache: Path | None = None) -> Path:
    """A cached Debian root of ``suite`` with ``packages`` installed; built once.

    :param suite: a suite of the mirror (``sid``, ``bookworm``)
    :param packages: binary packages to install (their dependencies come along)
    :param mirror: the Debian mirror (a dated snapshot here)
    :param cache: the forensics cache directory (default: :func:`forensics.cache.cache_dir`)
    :return: the root directory (do not write into it)
    :raises RootUnavailable: when there is no cached root and none can be built here
    """
    roots = _roots_dir(cache)
    roots.mkdir(parents=True, exist_ok=True)
    try:
        date = release_date(suite, mirror)
    except RootUnavailable as e:
        found = _cached(roots, suite, packages, mirror)
        if found is not None:
            return found
        raise RootUnavailable(f"no cached {suite} root with {' '.join(sorted(packages))}, and {e}") from e
    key = root_key(suite, packages, date, mirror)
    final = roots / f"{suite}-{key}"
    if (final / _MARKER).is_file():
        return final
    with _locked(roots / f".{suite}-{key}.lock"):
        if (final / _MARKER).is_file():  # another run built it while we waited
            return final
        _build(final, suite, packages, date, mirror)
    return final


def _build(final: Path, suite: str, packages: Sequence[str], date: str, mirror: str) -> None:
    tool = shutil.which("mmdebstrap")
    if tool is None:
        raise RootUnavailable("mmdebstrap is not installed (apt-get install -y mmdebstrap; bash .ci/setup does it)")
    if os.geteuid() != 0:
        raise RootUnavailable("building a Debian root needs root (mmdebstrap --mode=root)")
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    if final.exists():  # a build that died before its marker: not a root
        shutil.rmtree(final)
    cmd = [tool, "--quiet", "--mode=root", "--variant=essential", f"--include={','.join(sorted(set(packages)))}"]
    cmd += [f"--aptopt={opt}" for opt in APT_OPTIONS]
    cmd += [f"--dpkgopt=path-exclude={p}" for p in _DPKG_EXCLUDES]
    cmd += [suite, str(tmp), mirror]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"mmdebstrap took over {_BUILD_TIMEOUT} s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join(proc.stderr.splitlines()[-15:])
        raise RuntimeError(f"mmdebstrap exited {proc.returncode}: {' '.join(cmd)}\n{tail}")
    import time

    rec = _marker(suite, packages, date, mirror)
    rec["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (tmp / _MARKER).write_text(json.dumps(rec, indent=1) + "\n")
    os.rename(tmp, final)


#: the root's own top-level directories, never hidden under a tmpfs for a host path bound below them
_SYSTEM_TOPS = frozenset({"bin", "boot", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "var"})


def sandbox_command(root: Path, argv: Sequence[str], *, cwd: Path, binds: Sequence[Path] = ()) -> list[str]:
    """``argv`` run inside ``root`` (read-only) with bubblewrap; ``cwd`` and ``binds`` are bound
    read-write at their own host paths, so a core written to ``cwd`` lands on the host and the
    paths it names (the crash sample, libcrash.so) are the host's.

    The process keeps the host's pid namespace: its core names its real pid and thread ids.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RootUnavailable("bubblewrap is not installed (apt-get install -y bubblewrap)")
    # bwrap's own / is an empty tmpfs: the root's top-level entries are bound read-only into it,
    # which leaves room to make the mount points of the host paths bound beside them
    # A host path under a directory the root has but nothing in it needs (/root, /home: the forensics cache
    # under $HOME) gets an empty tmpfs there instead: a read-only bind leaves no room for its mount point.
    tops = {Path(p).parts[1] for p in (cwd, *binds) if len(Path(p).parts) > 1} - _SYSTEM_TOPS
    cmd = [bwrap]
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in ("proc", "dev", "tmp", "run") or entry.name.startswith("."):
            continue
        if entry.is_symlink():
            cmd += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
        elif entry.name in tops:
            cmd += ["--tmpfs", f"/{entry.name}"]
        elif entry.is_dir():
            cmd += ["--ro-bind", entry.path, f"/{entry.name}"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for path in (cwd, *binds):
        cmd += ["--bind", str(path), str(path)]
    cmd += ["--chdir", str(cwd), "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--", *argv]
    return cmd


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: roots.py SUITE PACKAGE...")
    print(build_root(sys.argv[1], sys.argv[2:]))
