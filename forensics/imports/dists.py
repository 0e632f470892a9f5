"""Installed distributions on a sys.path: dist-info (METADATA, RECORD, top_level.txt) and egg-info.

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

from .model import Distribution, PathEntry, RequirementProblem
from .rootfs import RootFS, join
from .versions import evaluate_marker, normalize_name, parse_requirement, specifier_contains

__all__ = ["parse_metadata", "parse_record", "editable_source", "InstalledFiles", "find_distributions", "check_requirements",
           "record_hash_matches"]


def parse_metadata(text: str) -> tuple[str, str, tuple[str, ...]]:
    """(Name, Version, Requires-Dist lines) of a METADATA / PKG-INFO file."""
    msg = HeaderParser().parsestr(text)
    return (msg.get("Name", "") or "").strip(), (msg.get("Version", "") or "").strip(), tuple(
        r.strip() for r in (msg.get_all("Requires-Dist") or ()))


def parse_record(text: str) -> list[tuple[str, str | None]]:
    """RECORD rows as (relative path, ``sha256=...`` or None)."""
    out = []
    for row in csv.reader(io.StringIO(text)):
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
    except ValueError:
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


@dataclass
class InstalledFiles:
    """Which distribution installed which file (in-root absolute paths), and the RECORD hash."""

    owner: dict[str, tuple[Distribution, str | None]]

    def claim(self, path: str) -> tuple[Distribution, str | None] | None:
        return self.owner.get(path)


def find_distributions(fs: RootFS, sys_path: tuple[PathEntry, ...]) -> tuple[list[Distribution], InstalledFiles, list[str]]:
    """Every dist-info/egg-info on sys.path, in search order; the file->distribution map; notes."""
    dists: list[Distribution] = []
    owner: dict[str, tuple[Distribution, str | None]] = {}
    notes: list[str] = []
    seen_dirs: set[str] = set()
    for entry in sys_path:
        if not entry.exists or entry.path in seen_dirs:
            continue
        seen_dirs.add(entry.path)
        for name in fs.listdir(entry.path):
            mdir = f"{entry.path.rstrip('/')}/{name}"
            if name.endswith(".dist-info"):
                meta = fs.read_text(mdir + "/METADATA")
                if meta is None:
                    continue
                dname, version, requires = parse_metadata(meta)
                top = fs.read_text(mdir + "/top_level.txt")
                installer = fs.read_text(mdir + "/INSTALLER")
                dist = Distribution(name=dname or name[:-10].rsplit("-", 1)[0], version=version, metadata_dir=mdir,
                                    location=entry.path,
                                    top_level=tuple(t.strip() for t in (top or "").splitlines() if t.strip()),
                                    requires=requires, installer=(installer or "").strip() or None,
                                    editable=editable_source(fs.read_text(mdir + "/direct_url.json", 1 << 16)))
                record = fs.read_text(mdir + "/RECORD")
                rows = parse_record(record) if record else []
                if not rows:
                    notes.append(f"{mdir}: no RECORD; files of {dist.name} cannot be attributed")
                tops = set(dist.top_level)
                for rel, h in rows:
                    path = join(entry.path, rel)
                    owner.setdefault(path, (dist, h))
                    first = rel.split("/", 1)[0]
                    if not first.endswith((".dist-info", ".data")) and first != ".." and not first.startswith("__pycache__"):
                        tops.add(first[:-3] if first.endswith(".py") else first.split(".", 1)[0])
                dist = _with_tops(dist, tops, owner)
                dists.append(dist)
            elif name.endswith(".egg-info"):
                is_dir = fs.is_dir(mdir)
                meta = fs.read_text(mdir + "/PKG-INFO" if is_dir else mdir)
                if meta is None:
                    continue
                dname, version, _ = parse_metadata(meta)
                top = fs.read_text(mdir + "/top_level.txt") if is_dir else None
                req = fs.read_text(mdir + "/requires.txt") if is_dir else None
                dist = Distribution(name=dname, version=version, metadata_dir=mdir, location=entry.path,
                                    top_level=tuple(t.strip() for t in (top or "").splitlines() if t.strip()),
                                    requires=_requires_txt(req or ""))
                files = fs.read_text(mdir + "/installed-files.txt") if is_dir else None
                for rel in (files or "").splitlines():
                    if rel.strip():
                        owner.setdefault(join(mdir, rel.strip()), (dist, None))
                dists.append(dist)
    return dists, InstalledFiles(owner), notes


def _with_tops(dist: Distribution, tops: set[str], owner) -> Distribution:
    if set(dist.top_level) == tops:
        return dist
    new = dataclasses.replace(dist, top_level=tuple(sorted(tops)))
    for path, (d, h) in list(owner.items()):
        if d is dist:
            owner[path] = (new, h)
    return new


def record_hash_matches(data: bytes, record_hash: str | None) -> bool | None:
    """Compare bytes with a RECORD ``sha256=<urlsafe-b64>`` field; None when there is nothing to compare."""
    if not record_hash or "=" not in record_hash:
        return None
    algo, _, want = record_hash.partition("=")
    try:
        h = hashlib.new(algo, data).digest()
    except ValueError:
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
            if req.specifier and not specifier_contains(req.specifier, have.version):
                problems.append(RequirementProblem(
                    dist=d.name, dist_version=d.version, requirement=req.text, found=f"{have.name} {have.version}",
                    message=f"{d.name} {d.version} has requirement {req.name}{req.specifier}, "
                            f"but you have {have.name} {have.version}."))
                continue
            eff = (effective or {}).get(req.name)
            if eff and req.specifier and eff[0] != have.version and not specifier_contains(req.specifier, eff[0]):
                problems.append(RequirementProblem(
                    dist=d.name, dist_version=d.version, requirement=req.text, found=f"{req.name} {eff[0]}",
                    effective=True,
                    message=f"{d.name} {d.version} has requirement {req.name}{req.specifier}, but the {req.name} "
                            f"that imports is {eff[0]} ({eff[1]}); pip sees {have.version}."))
    return problems
