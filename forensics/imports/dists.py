"""Installed distributions on a sys.path: dist-info (METADATA, RECORD, top_level.txt), egg-info, and the
files dpkg installed (Debian packages: ``/var/lib/dpkg/info/PKG.list``).

:func:`parse_metadata`, :func:`parse_record` are pure; :func:`find_distributions`
reads them from a root in sys.path order, as ``importlib.metadata`` searches;
:func:`check_requirements` reports what ``pip check`` would.
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import urllib.parse
from dataclasses import dataclass
from email.parser import HeaderParser

from .dpkg import read_dpkg, upstream_version
from .model import Distribution, PathEntry, PathOrigin, RequirementProblem
from .rootfs import RootFS, join
from .versions import evaluate_marker, normalize_name, parse_requirement, specifier_contains

__all__ = ["parse_metadata", "parse_record", "editable_source", "InstalledFiles", "find_distributions",
           "check_requirements", "record_hash_matches"]


def parse_metadata(text: str) -> tuple[str, str, tuple[str, ...]]:
    """(Name, Version, Requires-Dist lines) of a METADATA / PKG-INFO file."""
    msg = HeaderParser().parsestr(text)
    return (msg.get("Name", "") or "").strip(), (msg.get("Version", "") or "").strip(), tuple(
        r.strip() for r in (msg.get_all("Requires-Dist") or ()))


def parse_record(text: str) -> list[tuple[str, str | None]]:
    """RECORD rows as (relative path, ``sha256=...`` or None); a malformed row ends the file, as it
    ends pip's reading of it.

    >>> parse_record('a.py,sha256=x,1\\n"' + 'b' * 200000 + '\\n')
    [('a.py', 'sha256=x')]
    """
    out = []
    reader = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:  # a malformed row (a field over csv's limit) ends the file; the rows before it count
            break
        if row and row[0]:
            out.append((row[0], row[1] if len(row) > 1 and row[1] else None))
    return out


def editable_source(direct_url: str | None) -> str | None:
    """The source directory of an editable install, from its ``direct_url.json`` (PEP 610); else None.

    >>> editable_source('{"dir_info": {"editable": true}, "url": "file:///src/nvitop%20old"}')
    '/src/nvitop old'
    >>> editable_source('{"dir_info": {}, "url": "file:///src/nvitop"}') is None
    True
    """
    if not direct_url:
        return None
    try:
        doc = json.loads(direct_url)
    except ValueError:  # unreadable direct_url.json: not known to be editable
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("dir_info"), dict) or not doc["dir_info"].get("editable"):
        return None
    url = doc.get("url")
    if not isinstance(url, str) or not url.startswith("file://"):
        return None
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return path.rstrip("/") or "/"


def _requires_txt(text: str) -> tuple[str, ...]:
    """egg-info requires.txt: unconditional lines only (sections are extras or markers)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            break
        if line and not line.startswith("#"):
            out.append(line)
    return tuple(out)


_Claim = tuple[str, str, "str | None"]  # (file, metadata directory, the hash it recorded)


@dataclass
class InstalledFiles:
    """Which distribution installed which file (in-root absolute paths), with the hash it recorded, and
    which distributions define each top-level name in each directory (two of them: a conflict)."""

    owner: dict[str, tuple[Distribution, str | None]]
    definers: dict[tuple[str, str], tuple[tuple[Distribution, str], ...]] = dataclasses.field(default_factory=dict)
    claims: dict[str, tuple[tuple[Distribution, str | None], ...]] = dataclasses.field(default_factory=dict)

    def claim(self, path: str) -> tuple[Distribution, str | None] | None:
        return self.owner.get(path)

    def claims_of(self, path: str) -> tuple[tuple[Distribution, str | None], ...]:
        """Every (distribution, recorded hash) that claims ``path``, in the order they were read; more
        than one where two installs wrote the same file (``pip install --target --upgrade`` leaves the
        old version's dist-info beside the new one's)."""
        return self.claims.get(path, ())

    def defined_by(self, location: str, top: str) -> tuple[tuple[Distribution, str], ...]:
        """(distribution, file) for every distribution installing ``top``'s own module file in ``location``."""
        return self.definers.get((location, top), ())


def _defines(rel: str) -> str | None:
    """The top-level name a file (relative to its site directory) defines: ``pynvml.py`` and
    ``pynvml/__init__.py`` define ``pynvml``; files inside a namespace directory define nothing.

    >>> _defines("pynvml.py"), _defines("pynvml/__init__.py"), _defines("google/protobuf/x.py"), _defines("a.abi3.so")
    ('pynvml', 'pynvml', None, 'a')
    """
    parts = rel.split("/")
    if len(parts) == 2 and parts[1] in ("__init__.py", "__init__.pyc") or (
            len(parts) == 2 and parts[1].startswith("__init__.") and parts[1].endswith(".so")):
        name = parts[0]
    elif len(parts) == 1 and (rel.endswith((".py", ".pyc")) or rel.endswith(".so")):
        name = rel.split(".", 1)[0]
    else:
        return None
    return name if name.isidentifier() else None


def find_distributions(fs: RootFS,
                       sys_path: tuple[PathEntry, ...]) -> tuple[list[Distribution], InstalledFiles, list[str]]:
    """Every dist-info/egg-info on sys.path, in search order, and the files dpkg installed there; the
    file->distribution map; notes."""
    dists: list[Distribution] = []
    owner: dict[str, tuple[Distribution, str | None]] = {}
    claims: list[_Claim] = []  # (file, metadata_dir, hash): every claim, also of a file another already claims
    notes: list[str] = []
    seen_dirs: set[str] = set()
    no_record: list[Distribution] = []
    for entry in sys_path:
        if not entry.exists or entry.path in seen_dirs:
            continue
        seen_dirs.add(entry.path)
        for name in fs.listdir(entry.path):
            mdir = f"{entry.path.rstrip('/')}/{name}"
            if name.endswith(".dist-info"):
                found = _read_dist_info(fs, entry.path, name, mdir, owner, claims)
                if found is not None:
                    dists.append(found[0])
                    if not found[1]:
                        no_record.append(found[0])
            elif name.endswith(".egg-info"):
                egg = _read_egg_info(fs, entry.path, mdir, owner, claims)
                if egg is not None:
                    dists.append(egg)
    site_dirs = tuple(e.path for e in sys_path if e.path in seen_dirs and e.path != "/"
                      and e.origin not in (PathOrigin.STDLIB, PathOrigin.WORKDIR, PathOrigin.SCRIPT_DIR))
    dists, dpkg_notes = _add_dpkg(fs, dists, owner, claims, site_dirs)
    notes += dpkg_notes
    by_dir = {d.metadata_dir: d for d in dists}
    for d in no_record:
        final = by_dir.get(d.metadata_dir, d)
        if final.package is None:
            notes.append(f"{d.metadata_dir}: no RECORD; files of {d.name} cannot be attributed")
    return dists, InstalledFiles(owner, _definers(claims, by_dir), _every_claim(claims, by_dir)), notes


def _read_dist_info(fs: RootFS, location: str, name: str, mdir: str, owner: dict[str, tuple[Distribution, str | None]],
                    claims: list[_Claim]) -> tuple[Distribution, bool] | None:
    """A ``.dist-info`` directory's distribution (None without METADATA) and whether it has a RECORD; its
    RECORD's files go into ``owner`` (first claim wins) and ``claims``."""
    meta = fs.read_text(mdir + "/METADATA")
    if meta is None:
        return None
    dname, version, requires = parse_metadata(meta)
    top = fs.read_text(mdir + "/top_level.txt")
    installer = fs.read_text(mdir + "/INSTALLER")
    dist = Distribution(name=dname or name[:-10].rsplit("-", 1)[0], version=version, metadata_dir=mdir,
                        location=location,
                        top_level=tuple(t.strip() for t in (top or "").splitlines() if t.strip()),
                        requires=requires, installer=(installer or "").strip() or None,
                        editable=editable_source(fs.read_text(mdir + "/direct_url.json", 1 << 16)))
    record = fs.read_text(mdir + "/RECORD")
    rows = parse_record(record) if record else []
    tops = set(dist.top_level)
    for rel, h in rows:
        path = join(location, rel)
        owner.setdefault(path, (dist, h))
        claims.append((path, mdir, h))
        first = rel.split("/", 1)[0]
        if not first.endswith((".dist-info", ".data")) and first != ".." and not first.startswith("__pycache__"):
            tops.add(first[:-3] if first.endswith(".py") else first.split(".", 1)[0])
    return _with_tops(dist, tops, owner), bool(rows)


def _read_egg_info(fs: RootFS, location: str, mdir: str, owner: dict[str, tuple[Distribution, str | None]],
                   claims: list[_Claim]) -> Distribution | None:
    """An ``.egg-info`` file or directory's distribution (None without PKG-INFO); the files its
    installed-files.txt lists go into ``owner`` and ``claims``."""
    is_dir = fs.is_dir(mdir)
    meta = fs.read_text(mdir + "/PKG-INFO" if is_dir else mdir)
    if meta is None:
        return None
    dname, version, _ = parse_metadata(meta)
    top = fs.read_text(mdir + "/top_level.txt") if is_dir else None
    req = fs.read_text(mdir + "/requires.txt") if is_dir else None
    dist = Distribution(name=dname, version=version, metadata_dir=mdir, location=location,
                        top_level=tuple(t.strip() for t in (top or "").splitlines() if t.strip()),
                        requires=_requires_txt(req or ""))
    files = fs.read_text(mdir + "/installed-files.txt") if is_dir else None
    for rel in (files or "").splitlines():
        if rel.strip():
            owner.setdefault(join(mdir, rel.strip()), (dist, None))
            claims.append((join(mdir, rel.strip()), mdir, None))
    return dist


def _definers(claims: list[_Claim],
              by_dir: dict[str, Distribution]) -> dict[tuple[str, str], tuple[tuple[Distribution, str], ...]]:
    """(site directory, top-level name) -> every (distribution, file) whose own module file defines that name."""
    definers: dict[tuple[str, str], dict[str, tuple[Distribution, str]]] = {}
    for path, mdir, _ in claims:
        d = by_dir.get(mdir)
        if d is None or not path.startswith(d.location.rstrip("/") + "/"):
            continue
        top = _defines(path[len(d.location.rstrip("/")) + 1:])
        if top is not None:
            definers.setdefault((d.location, top), {}).setdefault(mdir, (d, path))
    return {k: tuple(v.values()) for k, v in definers.items()}


def _every_claim(claims: list[_Claim],
                 by_dir: dict[str, Distribution]) -> dict[str, tuple[tuple[Distribution, str | None], ...]]:
    """file -> every (distribution, hash) claiming it, for the files more than one metadata directory claims."""
    seen: dict[str, dict[str, str | None]] = {}
    for path, mdir, h in claims:
        seen.setdefault(path, {}).setdefault(mdir, h)
    return {path: tuple((by_dir[m], h) for m, h in owners.items() if m in by_dir)
            for path, owners in seen.items() if len(owners) > 1}


def _add_dpkg(fs: RootFS, dists: list[Distribution], owner: dict, claims: list[_Claim],
              site_dirs: tuple[str, ...]) -> tuple[list[Distribution], list[str]]:
    """dpkg's file lists as package metadata: each package's files claimed by the egg-info/dist-info it
    installed (now marked with the package), or by a distribution made for the package when it has none."""
    info = read_dpkg(fs, site_dirs)
    if info is None or not info.owner:
        return dists, list(info.notes) if info else []
    by_dir = {d.metadata_dir: d for d in dists}
    pkg_dist: dict[str, Distribution] = {}
    # the metadata directory each package installed names its distribution
    for path, (pkg, _) in info.owner.items():
        base = path.rstrip("/").rsplit("/", 1)[-1]
        d = by_dir.get(path)
        if d is not None and base.endswith((".egg-info", ".dist-info")) and pkg.name not in pkg_dist:
            new = dataclasses.replace(d, package=pkg.name, package_version=pkg.version, installer=d.installer or "dpkg")
            pkg_dist[pkg.name] = new
            by_dir[path] = new
    for path, (pkg, md5) in sorted(info.owner.items()):
        dist = pkg_dist.get(pkg.name)
        if dist is None:
            location = next((s for s in site_dirs if path.startswith(s.rstrip("/") + "/")), None)
            if location is None:
                continue
            tops = sorted({t for p in info.owner if p.startswith(location.rstrip("/") + "/")
                           and info.owner[p][0].name == pkg.name
                           for t in (_defines(p[len(location.rstrip("/")) + 1:]),) if t})
            dist = Distribution(name=pkg.name, version=upstream_version(pkg.version), installer="dpkg",
                                metadata_dir=f"/var/lib/dpkg/info/{pkg.name}.list", location=location,
                                top_level=tuple(tops), package=pkg.name, package_version=pkg.version)
            pkg_dist[pkg.name] = dist
            by_dir[dist.metadata_dir] = dist
        if path not in owner or owner[path][0].package is None and owner[path][0].metadata_dir == dist.metadata_dir:
            owner[path] = (dist, f"md5:{md5}" if md5 else None)
        claims.append((path, dist.metadata_dir, f"md5:{md5}" if md5 else None))
    # every claim made before now names the marked distribution
    for path, (d, h) in list(owner.items()):
        if d.metadata_dir in by_dir and by_dir[d.metadata_dir] is not d:
            owner[path] = (by_dir[d.metadata_dir], h)
    out = [by_dir.get(d.metadata_dir, d) for d in dists]
    known = {d.metadata_dir for d in out}
    out += [d for d in pkg_dist.values() if d.metadata_dir not in known]
    return out, list(info.notes)


def _with_tops(dist: Distribution, tops: set[str], owner) -> Distribution:
    if set(dist.top_level) == tops:
        return dist
    new = dataclasses.replace(dist, top_level=tuple(sorted(tops)))
    for path, (d, h) in list(owner.items()):
        if d is dist:
            owner[path] = (new, h)
    return new


def record_hash_matches(data: bytes, record_hash: str | None) -> bool | None:
    """Compare bytes with a RECORD ``sha256=<urlsafe-b64>`` field or dpkg's ``md5:<hex>``; None when there
    is nothing to compare."""
    if record_hash and record_hash.startswith("md5:"):
        return hashlib.md5(data, usedforsecurity=False).hexdigest() == record_hash[4:]
    if not record_hash or "=" not in record_hash:
        return None
    algo, _, want = record_hash.partition("=")
    try:
        h = hashlib.new(algo, data).digest()
    except ValueError:  # a hash this Python lacks: nothing to compare (None, as documented)
        return None
    return base64.urlsafe_b64encode(h).rstrip(b"=").decode() == want


def check_requirements(dists: list[Distribution], marker_env: dict[str, str],
                       effective: dict[str, tuple[str, str]] | None = None) -> list[RequirementProblem]:
    """What ``pip check`` says of the installed set, plus requirements the *imported* versions break.

    :param effective: normalized dist name -> (version that imports, where) for shadowed modules
    """
    first: dict[str, Distribution] = {}
    for d in dists:
        first.setdefault(normalize_name(d.name), d)
    problems: list[RequirementProblem] = []
    for d in first.values():
        for line in d.requires:
            req = parse_requirement(line)
            if req is None:
                continue
            if req.marker:
                ok = evaluate_marker(req.marker, marker_env)
                if ok is not True:
                    continue
            have = first.get(req.name)
            if have is None:
                problems.append(RequirementProblem(
                    dist=d.name, dist_version=d.version, requirement=req.text, found=None,
                    message=f"{d.name} {d.version} requires {req.name}, which is not installed."))
                continue
            eff = (effective or {}).get(req.name)
            if req.specifier and not specifier_contains(req.specifier, have.version):
                # pip check's own words; when other code imports than pip recorded, say which
                extra = ""
                if eff and eff[0] != have.version:
                    extra = (f" The code that imports is {req.name} {eff[0]} ({eff[1]}), which "
                             f"{'satisfies' if specifier_contains(req.specifier, eff[0]) else 'breaks'} it.")
                problems.append(RequirementProblem(
                    dist=d.name, dist_version=d.version, requirement=req.text, found=f"{have.name} {have.version}",
                    message=f"{d.name} {d.version} has requirement {req.name}{req.specifier}, "
                            f"but you have {have.name} {have.version}.", note=extra.strip()))
                continue
            if eff and req.specifier and eff[0] != have.version and not specifier_contains(req.specifier, eff[0]):
                problems.append(RequirementProblem(
                    dist=d.name, dist_version=d.version, requirement=req.text, found=f"{req.name} {eff[0]}",
                    effective=True,
                    message=f"{d.name} {d.version} has requirement {req.name}{req.specifier}: the code that imports "
                            f"is {req.name} {eff[0]} ({eff[1]}); pip's metadata says {have.version}, so pip check "
                            "does not see it."))
    return problems
