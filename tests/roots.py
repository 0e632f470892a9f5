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

``build_root("bookworm", [...], arch="arm64")`` builds a root of another architecture (the
packages only unpacked, ``mmdebstrap --variant=extract``: their maintainer scripts would need the
foreign CPU), to run under qemu-user (tests/arm64.py); its key and directory name say the
architecture, and an amd64 root's key is what it always was.  With ``emulate=True`` it is installed
whole instead (``--variant=essential``), its maintainer scripts run by qemu-user-static through
binfmt_misc (:func:`emulation_problem` says what is missing): the agent image's arm64 userland.

Without network the newest cached root of the same suite and packages is used; with
neither, :class:`RootUnavailable` says why (a test should skip).

Usable from a shell, too::

    python tests/roots.py sid python3.14 python3.14-dbg libc6-dbg
    python tests/roots.py --arch=arm64 bookworm python3.11 libc6-dbg
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

__all__ = ["MIRROR", "NATIVE_ARCH", "RootUnavailable", "release_date", "root_key", "build_root", "emulation_problem",
           "guest_exec_problem", "binfmt_entry_enabled", "private_binfmt_problem",
           "sandbox_command"]

MIRROR = os.environ.get("FORENSICS_TEST_MIRROR", "http://deb.debian.org/debian")
#: the mirror is a dated snapshot: its Release files are past their Valid-Until
APT_OPTIONS = ('Acquire::Check-Valid-Until "false"',)
#: what a root holds beyond the packages; a change here is a change of every key
_BUILDER = "mmdebstrap variant=essential; docs/man/locales excluded; v1"
#: a foreign root: unpacked, not configured (no maintainer script can run), usr-merge links made
_FOREIGN_BUILDER = "mmdebstrap variant=extract; docs/man/locales excluded; usr-merge links; v1"
#: a foreign root installed whole, its maintainer scripts run under qemu-user (binfmt_misc)
_EMULATED_BUILDER = "mmdebstrap variant=essential under qemu-user binfmt_misc; docs/man/locales excluded; v1"
#: qemu-user's name of the foreign Debian architectures a root can be installed whole for
QEMU_ARCH = {"arm64": "aarch64"}
#: the architecture of this machine's roots; a root of any other is unpacked only
NATIVE_ARCH = "amd64"
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


def _builder(arch: str, emulate: bool = False) -> str:
    if arch == NATIVE_ARCH:
        return _BUILDER
    return _EMULATED_BUILDER if emulate else _FOREIGN_BUILDER


def binfmt_entry_enabled(qemu: str) -> bool:
    """Whether the machine's binfmt_misc has an enabled ``qemu-QEMU`` entry (binfmt-support's, .ci/setup's)."""
    try:
        return Path(f"/proc/sys/fs/binfmt_misc/qemu-{qemu}").read_text().splitlines()[:1] == ["enabled"]
    except OSError:
        return False


#: binfmt_misc's registration of a static qemu-user for each architecture's ELF executables (magic and mask as the
#: kernel parses them, \x escapes and all; flag F: the interpreter is opened now, so it is found inside any root)
_BINFMT = {"aarch64": r":{name}:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
                      r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:{qemu}:F"}
#: in a user and mount namespace of its own: mount a binfmt_misc instance of that namespace (Linux 6.7+), register
#: qemu-user in it, run the command -- the machine's binfmt_misc is not touched
_PRIVATE_BINFMT = ('mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && printf "%s\\n" "$1" '
                   '> /proc/sys/fs/binfmt_misc/register && shift && exec "$@"')
_private_probe: dict[str, str | None] = {}


def _private_binfmt(qemu: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a user and mount namespace whose own binfmt_misc runs ``qemu``'s ELF executables by
    qemu-user-static."""
    static, unshare, sh = shutil.which(f"qemu-{qemu}-static"), shutil.which("unshare"), shutil.which("sh")
    if static is None or qemu not in _BINFMT:
        raise RootUnavailable(f"qemu-{qemu}-static is not installed (apt-get install -y qemu-user-static)")
    if unshare is None or sh is None:
        raise RootUnavailable("unshare (util-linux) is not installed")
    reg = _BINFMT[qemu].format(name=f"forensics-tests-{qemu}", qemu=static)
    return [unshare, "--user", "--map-root-user", "--mount", "--", sh, "-c", _PRIVATE_BINFMT, "sh", reg, *argv]


def private_binfmt_problem(qemu: str = "aarch64") -> str | None:
    """Why this machine cannot run ``qemu``'s executables through a binfmt_misc of a namespace of the tests' own
    (no unshare, user namespaces or binfmt_misc mounts not allowed here, Linux older than 6.7), or None."""
    if qemu not in _private_probe:
        try:
            r = subprocess.run(_private_binfmt(qemu, ["/bin/true"]), capture_output=True, text=True, timeout=60)
            _private_probe[qemu] = None if r.returncode == 0 else \
                f"binfmt_misc cannot be mounted in a user namespace here: {r.stderr.strip()[-200:]}"
        except (RootUnavailable, OSError, subprocess.SubprocessError) as e:
            _private_probe[qemu] = str(e)
    return _private_probe[qemu]


def guest_exec_problem(arch: str) -> str | None:
    """Why programs of Debian architecture ``arch`` cannot be run here, exec'ing one another as an image's do (its
    shell script execs its loader), or None: the machine's binfmt_misc entry of qemu-user, else one registered in a
    namespace of the tests' own (:func:`sandbox_command`'s ``emulate``)."""
    qemu = QEMU_ARCH.get(arch)
    if qemu is None:
        return f"no qemu-user name known for Debian architecture {arch!r}"
    if shutil.which(f"qemu-{qemu}-static") is None:
        return f"qemu-{qemu}-static is not installed (apt-get install -y qemu-user-static)"
    if binfmt_entry_enabled(qemu):
        return None
    why = private_binfmt_problem(qemu)
    return None if why is None else (f"binfmt_misc has no enabled qemu-{qemu} entry, and {why}")


def emulation_problem(arch: str) -> str | None:
    """Why a root of Debian architecture ``arch`` cannot be installed whole here, or None: mmdebstrap runs its
    maintainer scripts through the kernel's binfmt_misc entry of qemu-user-static, and checks it with arch-test."""
    qemu = QEMU_ARCH.get(arch)
    if qemu is None:
        return f"no qemu-user name known for Debian architecture {arch!r}"
    for tool, package in ((f"qemu-{qemu}-static", "qemu-user-static"), ("arch-test", "arch-test")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y {package} binfmt-support arch-test)"
    if not binfmt_entry_enabled(qemu):
        return (f"binfmt_misc has no enabled qemu-{qemu} entry (as root: mount -t binfmt_misc binfmt_misc "
                f"/proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-{qemu}; bash .ci/setup does it)")
    return None


def root_key(suite: str, packages: Sequence[str], date: str, mirror: str = MIRROR, arch: str = NATIVE_ARCH,
             emulate: bool = False) -> str:
    """The cache key of a root: what it is built from.

    >>> root_key("sid", ["b", "a"], "d") == root_key("sid", ["a", "b", "a"], "d")
    True
    >>> root_key("sid", ["a"], "d") == root_key("sid", ["a"], "d", arch="arm64")
    False
    """
    what: list = [_builder(arch, emulate), mirror, suite, sorted(set(packages)), date]
    if arch != NATIVE_ARCH:  # an amd64 root keeps the key it had before roots of other architectures
        what.append(arch)
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def _dir_name(suite: str, key: str, arch: str) -> str:
    return f"{suite}-{key}" if arch == NATIVE_ARCH else f"{suite}-{arch}-{key}"


def _marker(suite: str, packages: Sequence[str], date: str, mirror: str, arch: str = NATIVE_ARCH,
            emulate: bool = False) -> dict:
    rec = {"builder": _builder(arch, emulate), "mirror": mirror, "suite": suite, "packages": sorted(set(packages)),
           "release_date": date}
    if arch != NATIVE_ARCH:
        rec["arch"] = arch
    return rec


def _cached(roots: Path, suite: str, packages: Sequence[str], mirror: str, arch: str = NATIVE_ARCH,
            emulate: bool = False) -> Path | None:
    """The newest complete root of this suite and package list, whatever its snapshot date."""
    best: tuple[str, Path] | None = None
    want = sorted(set(packages))
    for marker in roots.glob(f"{suite}-*/{_MARKER}"):
        try:
            rec = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if (rec.get("packages") == want and rec.get("mirror") == mirror
                and rec.get("builder") == _builder(arch, emulate) and rec.get("arch", NATIVE_ARCH) == arch):
            stamp = str(rec.get("built_at", ""))
            if best is None or stamp > best[0]:
                best = (stamp, marker.parent)
    return best[1] if best else None


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build_root(suite: str, packages: Sequence[str], *, mirror: str = MIRROR, cache: Path | None = None,
               arch: str = NATIVE_ARCH, emulate: bool = False) -> Path:
    """A cached Debian root of ``suite`` with ``packages`` installed; built once.

    :param suite: a suite of the mirror (``sid``, ``bookworm``)
    :param packages: binary packages to install (their dependencies come along)
    :param mirror: the Debian mirror (a dated snapshot here)
    :param cache: the forensics cache directory (default: :func:`forensics.cache.cache_dir`)
    :param arch: a Debian architecture; another than this machine's is unpacked only (run it under qemu-user)
    :param emulate: install a foreign root whole, its maintainer scripts run under qemu-user (an image's root)
    :return: the root directory (do not write into it)
    :raises RootUnavailable: when there is no cached root and none can be built here
    """
    roots = _roots_dir(cache)
    roots.mkdir(parents=True, exist_ok=True)
    try:
        date = release_date(suite, mirror)
    except RootUnavailable as e:
        found = _cached(roots, suite, packages, mirror, arch, emulate)
        if found is not None:
            return found
        raise RootUnavailable(f"no cached {suite} root with {' '.join(sorted(packages))}, and {e}") from e
    key = root_key(suite, packages, date, mirror, arch, emulate)
    final = roots / _dir_name(suite, key, arch)
    if (final / _MARKER).is_file():
        return final
    with _locked(roots / f".{final.name}.lock"):
        if (final / _MARKER).is_file():  # another run built it while we waited
            return final
        _build(final, suite, packages, date, mirror, arch, emulate)
    return final


def _build(final: Path, suite: str, packages: Sequence[str], date: str, mirror: str, arch: str = NATIVE_ARCH,
           emulate: bool = False) -> None:
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
    emulate = emulate and arch != NATIVE_ARCH
    if emulate and (why := emulation_problem(arch)) is not None:
        raise RootUnavailable(f"cannot install a {arch} root whole: {why}")
    if arch == NATIVE_ARCH:
        variant = ["--variant=essential"]
    else:
        variant = [f"--variant={'essential' if emulate else 'extract'}", f"--arch={arch}"]
    cmd = [tool, "--quiet", "--mode=root", *variant, f"--include={','.join(sorted(set(packages)))}"]
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

    if arch != NATIVE_ARCH and not emulate:
        _link_merged_usr(tmp)
    rec = _marker(suite, packages, date, mirror, arch, emulate)
    rec["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (tmp / _MARKER).write_text(json.dumps(rec, indent=1) + "\n")
    os.rename(tmp, final)


def _link_merged_usr(root: Path) -> None:
    """/bin, /sbin and /lib as links into /usr where the unpacked packages put them only there (a
    merged-/usr suite whose links come from a maintainer script or a package not included)."""
    for name in ("bin", "sbin", "lib"):
        if not os.path.lexists(root / name) and (root / "usr" / name).is_dir():
            os.symlink(f"usr/{name}", root / name)


#: the root's own top-level directories, never hidden under a tmpfs for a host path bound below them
_SYSTEM_TOPS = frozenset({"bin", "boot", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "var"})


def sandbox_command(root: Path, argv: Sequence[str], *, cwd: Path, binds: Sequence[Path] = (),
                    tools: Sequence[tuple[Path, str]] = (), emulate: str | None = None) -> list[str]:
    """``argv`` run inside ``root`` (read-only) with bubblewrap; ``cwd`` and ``binds`` are bound
    read-write at their own host paths, so a core written to ``cwd`` lands on the host and the
    paths it names (the crash sample, libcrash.so) are the host's.  ``tools`` are host files bound
    read-only at the given paths under ``/run`` (a static qemu-user binary, tests/arm64.py).

    The process keeps the host's pid namespace: its core names its real pid and thread ids.  It dies with
    bwrap (``--die-with-parent``): a test that terminates the bwrap it started leaves nothing running (an agent
    under qemu-user outlived it, reparented to init).

    :param emulate: the root's programs are of this qemu-user architecture (``aarch64``): where the machine's
        binfmt_misc has no entry for it (or ``FORENSICS_TEST_PRIVATE_BINFMT=1`` asks), bwrap runs in a user and
        mount namespace whose own binfmt_misc has one (:func:`guest_exec_problem`); the machine's is not touched
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RootUnavailable("bubblewrap is not installed (apt-get install -y bubblewrap)")
    # bwrap's own / is an empty tmpfs: the root's top-level entries are bound read-only into it,
    # which leaves room to make the mount points of the host paths bound beside them
    # A host path under a directory the root has but nothing in it needs (/root, /home: the forensics cache
    # under $HOME) gets an empty tmpfs there instead: a read-only bind leaves no room for its mount point.
    tops = {Path(p).parts[1] for p in (cwd, *binds) if len(Path(p).parts) > 1} - _SYSTEM_TOPS
    cmd = [bwrap, "--die-with-parent"]
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
    for host, inside in tools:
        if not inside.startswith("/run/"):
            raise ValueError(f"a tool is bound under /run, not at {inside}")
        cmd += ["--ro-bind", str(host), inside]
    cmd += ["--chdir", str(cwd), "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--", *argv]
    if emulate is not None and (os.environ.get("FORENSICS_TEST_PRIVATE_BINFMT") == "1"
                                or not binfmt_entry_enabled(emulate)):
        return _private_binfmt(emulate, cmd)
    return cmd


if __name__ == "__main__":
    _args = sys.argv[1:]
    _arch = NATIVE_ARCH
    if _args and _args[0].startswith("--arch="):
        _arch = _args.pop(0).split("=", 1)[1]
    if len(_args) < 2:
        sys.exit("usage: roots.py [--arch=ARCH] SUITE PACKAGE...")
    print(build_root(_args[0], _args[1:], arch=_arch))


# Debian roots whose glibc the heap tests read besides this machine's: suite -> (glibc, its python3)
GLIBC_ROOTS = {"bullseye": ("2.31", "/usr/bin/python3"), "trixie": ("2.41", "/usr/bin/python3")}


def glibc_root_of(request) -> tuple[str, Path, str, str]:
    """An indirect fixture's root by suite (``request.param``): (suite, root, glibc, python3); "sid" is the
    session's ``sid_root``; a root that cannot be built skips the test with the reason."""
    import pytest

    suite = request.param
    if suite == "sid":
        return "sid", request.getfixturevalue("sid_root"), "2.43", "/usr/bin/python3.13"
    try:
        root = build_root(suite, ["python3", "libc6-dbg"])
    except RootUnavailable as e:
        pytest.skip(f"no Debian {suite} root: {e}")
    return suite, root, *GLIBC_ROOTS[suite]
