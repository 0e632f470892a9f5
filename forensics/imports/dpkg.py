"""Debian packages as package metadata: which files dpkg installed, from which package, at which version.

``apt-get install python3-psutil`` leaves an ``.egg-info`` without RECORD in
``/usr/lib/python3/dist-packages``; the files are listed by dpkg in
``/var/lib/dpkg/info/python3-psutil.list`` with their md5 sums beside it, and the
package's version is in ``/var/lib/dpkg/status``.  Such a module is managed (by
dpkg), like one pip installed.

:func:`parse_status` and :func:`parse_md5sums` are pure; :func:`read_dpkg` reads
only the packages that depend on Python (every Debian Python module package does)
and keeps only their files below the given site directories.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .rootfs import RootFS

__all__ = ["DpkgPackage", "DpkgFiles", "parse_status", "parse_md5sums", "upstream_version", "read_dpkg",
           "find_file_owners"]

STATUS = "/var/lib/dpkg/status"
INFO = "/var/lib/dpkg/info"
_MAX_STATUS = 64 << 20
_MAX_LIST = 16 << 20
_MAX_PACKAGES = 20_000
_MAX_FILES = 2_000_000
_PYTHON_DEP = re.compile(r"(^|[\s,|])(python3|python3\.\d+|python3:any|libpython3[\w.]*)([\s,(:|]|$)")


@dataclass(frozen=True, slots=True, kw_only=True)
class DpkgPackage:
    name: str
    version: str
    architecture: str = ""
    python: bool = False  # it depends on Python (or is named for it): its files may be modules


@dataclass(frozen=True, slots=True, kw_only=True)
class DpkgFiles:
    """dpkg's view of the site directories: in-root path -> (package, md5 hex or None)."""

    owner: dict[str, tuple[DpkgPackage, str | None]]
    packages: tuple[DpkgPackage, ...] = ()
    notes: tuple[str, ...] = ()


def upstream_version(version: str) -> str:
    """The upstream part of a Debian version: no epoch, no Debian revision.

    >>> upstream_version("1:5.9.4-1+b1"), upstream_version("23.0.1+dfsg-1")
    ('5.9.4', '23.0.1+dfsg')
    """
    v = version.split(":", 1)[1] if ":" in version.split("-", 1)[0] else version
    return v.rsplit("-", 1)[0] if "-" in v else v


def parse_status(text: str) -> dict[str, DpkgPackage]:
    """Installed packages of a dpkg status file (``Status: install ok installed``), by name.

    >>> st = "Package: python3-psutil\\nStatus: install ok installed\\nArchitecture: amd64\\n" \\
    ...      "Version: 5.9.4-1+b1\\nDepends: python3 (<< 3.12), python3 (>= 3.11~), libc6 (>= 2.14)\\n\\n" \\
    ...      "Package: gone\\nStatus: deinstall ok config-files\\nVersion: 1\\n"
    >>> parse_status(st)
    {'python3-psutil': DpkgPackage(name='python3-psutil', version='5.9.4-1+b1', architecture='amd64', python=True)}
    """
    out: dict[str, DpkgPackage] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
                continue
            k, sep, v = line.partition(":")
            if sep:
                key = k.strip()
                fields[key] = v.strip()
        name = fields.get("Package")
        if not name or fields.get("Status", "").split()[-1:] != ["installed"]:
            continue
        deps = " ".join(fields.get(k, "") for k in ("Depends", "Pre-Depends", "Provides"))
        python = bool(_PYTHON_DEP.search(deps)) or name.startswith(("python3", "libpython3"))
        out[name] = DpkgPackage(name=name, version=fields.get("Version", ""),
                                architecture=fields.get("Architecture", ""), python=python)
        if len(out) >= _MAX_PACKAGES:
            break
    return out


def parse_md5sums(text: str) -> dict[str, str]:
    """``/var/lib/dpkg/info/PKG.md5sums``: absolute in-root path -> md5 hex.

    >>> parse_md5sums("688df665a36f93399ef3b02f41e23b54  usr/lib/python3/dist-packages/psutil/__init__.py\\n")
    {'/usr/lib/python3/dist-packages/psutil/__init__.py': '688df665a36f93399ef3b02f41e23b54'}
    """
    out = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) == 32 and path:
            out["/" + path.lstrip("/")] = digest.lower()
    return out


def read_dpkg(fs: RootFS, site_dirs: tuple[str, ...]) -> DpkgFiles | None:
    """The files dpkg installed below ``site_dirs`` (in-root paths), or None when the root has no dpkg database."""
    status = fs.read_text(STATUS, _MAX_STATUS)
    if status is None:
        return None
    packages = parse_status(status)
    prefixes = tuple(d.rstrip("/") + "/" for d in site_dirs)
    owner: dict[str, tuple[DpkgPackage, str | None]] = {}
    notes: list[str] = []
    kept = 0
    for pkg in packages.values():
        if not pkg.python:
            continue
        base = None
        for cand in (f"{INFO}/{pkg.name}:{pkg.architecture}", f"{INFO}/{pkg.name}"):
            if fs.is_file(cand + ".list"):
                base = cand
                break
        if base is None:
            continue
        listing = fs.read_text(base + ".list", _MAX_LIST)
        if listing is None:
            notes.append(f"{base}.list could not be read: files of {pkg.name} not attributed")
            continue
        files = [p for p in listing.splitlines() if p.startswith(prefixes)]
        if not files:
            continue
        sums = parse_md5sums(fs.read_text(base + ".md5sums", _MAX_LIST) or "")
        for p in files:
            owner.setdefault(p, (pkg, sums.get(p)))
        kept += len(files)
        if kept > _MAX_FILES:
            notes.append(f"more than {_MAX_FILES} files in dpkg's lists below the site directories: the rest ignored")
            break
    return DpkgFiles(owner=owner, packages=tuple(packages.values()), notes=tuple(notes))


_MAX_OWNER_READ = 256 << 20  # bytes of dpkg's file lists read to find one file's package


def find_file_owners(fs: RootFS, name: str) -> tuple[tuple[DpkgPackage, str], ...] | None:
    """The installed packages whose dpkg file list names a file called ``name`` (``libpthread.so.0``), with the
    path each lists; None when the root has no dpkg database.  What a failed import could not find is often a
    file a package installed and a later layer deleted: the list still names it.

    Bounded: at most :data:`_MAX_PACKAGES` packages and :data:`_MAX_OWNER_READ` bytes of lists are read.
    """
    status = fs.read_text(STATUS, _MAX_STATUS)
    if status is None or "/" in name or not name:
        return None
    found: list[tuple[DpkgPackage, str]] = []
    read = 0
    for pkg in list(parse_status(status).values())[:_MAX_PACKAGES]:
        for base in (f"{INFO}/{pkg.name}:{pkg.architecture}", f"{INFO}/{pkg.name}"):
            listing = fs.read_text(base + ".list", _MAX_LIST) if fs.is_file(base + ".list") else None
            if listing is None:
                continue
            read += len(listing)
            found += [(pkg, p) for p in listing.splitlines() if p.endswith("/" + name)]
            break
        if read > _MAX_OWNER_READ:
            break
    return tuple(found)
