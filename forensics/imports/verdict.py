"""Judge each module: OK, SHADOWED, CONFLICT, UNMANAGED, MISSING, VERSION-MISMATCH, with the fix; match known issues.

Pure functions over the records the other stages produced (plus a ``read``
callable over the root for the module's own ``__version__``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from collections.abc import Callable

from ..model import Severity
from .dists import InstalledFiles, record_hash_matches
from .model import (Distribution, HiddenCopy, KnownIssueHit, ModuleCheck, ModuleKind, PathOrigin, PythonSetup,
                    Resolution, Verdict)
from .versions import find_static_version, normalize_name, specifier_contains, version_key

__all__ = ["classify_module", "load_known_issues", "check_known_issues", "DIST_OF_MODULE", "fix_hint"]

# the distributions of the modules checked by default (when no installed metadata says otherwise)
DIST_OF_MODULE = {"nvitop": "nvitop", "nvitop_exporter": "nvitop-exporter", "pynvml": "nvidia-ml-py"}

_SITE = (PathOrigin.SITE, PathOrigin.USER_SITE)


def _claimed_by(res: Resolution, files: InstalledFiles):
    if res.file:
        return files.claim(res.file)
    return None


def _module_dists(name: str, dists: list[Distribution]) -> list[Distribution]:
    top = name.split(".")[0]
    return [d for d in dists if top in d.top_level]


def fix_hint(module: str, winner: Resolution, origin: PathOrigin | None, setup: PythonSetup, stale: str) -> str:
    """What to change so that the managed install wins."""
    top = module.split(".")[0]
    if origin is PathOrigin.WORKDIR:
        ver = setup.entrypoint.version or "3"
        new_enough = version_key(ver) and version_key(ver) >= version_key("3.11")
        safe = ("set ENV PYTHONSAFEPATH=1 (Python >= 3.11)" if new_enough
                else f"upgrade to Python >= 3.11 and set PYTHONSAFEPATH=1 (this is {ver})")
        return (f"set WORKDIR to a directory without a {top}/ tree, remove the stale tree {stale} from the image, "
                f"or {safe}")
    if origin is PathOrigin.SCRIPT_DIR:
        return f"remove the stale tree {stale} next to the entrypoint script, or move the script; or run with -P/-I"
    if origin is PathOrigin.PYTHONPATH:
        return f"remove {winner.path_entry} from PYTHONPATH, or remove the stale tree {stale}"
    if origin in (PathOrigin.PTH, PathOrigin.PTH_IMPORT):
        pth = next((e.note for e in setup.sys_path if e.path == winner.path_entry), "") or "the .pth file"
        return f"remove {pth} (it puts {winner.path_entry} on sys.path), or remove the stale tree {stale}"
    if origin is PathOrigin.SITECUSTOMIZE:
        src = next((e.note for e in setup.sys_path if e.path == winner.path_entry), "") or "sitecustomize.py"
        return (f"remove the sys.path edit that puts {winner.path_entry} on sys.path from {src} (site runs it at "
                f"every start-up), or remove the stale tree {stale}")
    return f"remove the stale tree {stale}, or reinstall with pip so that one distribution owns {top}"


@dataclass(frozen=True)
class _Winner:
    """What is known about the file that imports, before judging it: the fields every verdict shares."""

    module: str
    top: str
    resolved: Resolution
    origin: PathOrigin | None
    static_version: str | None
    distribution: Distribution | None  # the RECORD/dpkg owner of the file, else the editable install holding it
    record_hash: str | None  # the owner's recorded hash of the file ("sha256=..." or "md5:...")
    editable: Distribution | None  # the editable install whose source tree holds the file (no RECORD claims it)
    installed_file: bool
    record_hash_ok: bool | None
    hidden: tuple[HiddenCopy, ...]
    managed: tuple[Resolution, Distribution] | None  # the first managed copy the file hides: what should have won
    where: str  # the file, for the reason
    idx: str  # the sys.path entry it came from, for the reason

    def check(self, verdict: Verdict, reason: str, fix: str = "", *, expected: Resolution | None = None,
              expected_distribution: Distribution | None = None, expected_version: str | None = None,
              owners: tuple[Distribution, ...] = ()) -> ModuleCheck:
        return ModuleCheck(module=self.module, verdict=verdict, resolved=self.resolved, origin=self.origin,
                           static_version=self.static_version, distribution=self.distribution,
                           installed_file=self.installed_file, record_hash_ok=self.record_hash_ok, hidden=self.hidden,
                           reason=reason, fix=fix, expected=expected, expected_distribution=expected_distribution,
                           expected_version=expected_version, owners=owners)


def classify_module(module: str, winner: Resolution | None, candidates: list[Resolution], setup: PythonSetup,
                    dists: list[Distribution], files: InstalledFiles, read: Callable[[str], str | None],
                    read_bytes: Callable[[str], bytes | None]) -> ModuleCheck:
    """The verdict on ``module`` given its resolution and every sys.path entry's candidate."""
    if winner is None:
        owning = _module_dists(module, dists)
        install = owning[0].name if owning else DIST_OF_MODULE.get(module.split(".")[0], module.split(".")[0])
        return ModuleCheck(module=module, verdict=Verdict.MISSING, resolved=None,
                           reason=f"{module} is not importable on this sys.path",
                           fix=f"install it into the image (pip install {install})")
    w = _read_winner(module, winner, candidates, setup, dists, files, read, read_bytes)
    if w.managed is not None and (w.distribution is None or w.origin not in _SITE):
        return _shadowed(w, w.managed, setup)
    owners = files.defined_by(winner.path_entry, w.top) if module == w.top and winner.finder is None else ()
    if len(owners) > 1:
        return _conflict(w, owners)
    return _judge_owner(w, _module_dists(module, dists))


def _read_winner(module: str, winner: Resolution, candidates: list[Resolution], setup: PythonSetup,
                 dists: list[Distribution], files: InstalledFiles, read: Callable[[str], str | None],
                 read_bytes: Callable[[str], bytes | None]) -> _Winner:
    """The facts about the file that imports: its origin, static version, owner, hash, and what it hides."""
    top = module.split(".")[0]
    origin = PathOrigin.EDITABLE if winner.finder else {i: e.origin for i, e in enumerate(setup.sys_path)}.get(
        winner.path_index)
    locs = winner.search_locations or ((winner.file.rsplit("/", 1)[0],) if winner.file else ())
    static_version = None
    if winner.file and winner.file.endswith(".py"):
        static_version = find_static_version(read, winner.file, module, locs)
    claim = _claimed_by(winner, files)
    owner, rhash = claim if claim else (None, None)
    editable = None if owner is not None else _editable_owner(top, winner, dists)
    dist = owner or editable
    hash_ok = None
    if dist is not None and winner.file:
        data = read_bytes(winner.file)
        if data is not None:
            hash_ok = record_hash_matches(data, rhash)
            if hash_ok is False:  # several RECORDs claim the file: it is the one whose hash it has
                match = next(((d, h) for d, h in files.claims_of(winner.file) if record_hash_matches(data, h)), None)
                if match is not None:
                    (dist, rhash), hash_ok = match, True
    # the managed installs further down sys.path that the winner hides (the first: what should have won)
    managed: tuple[Resolution, Distribution] | None = None
    hidden: list[HiddenCopy] = []
    for c in candidates if module == top else ():  # the candidates are the top-level name's
        if c is winner or c.file == winner.file or c.kind is ModuleKind.NAMESPACE:
            continue
        cc = _claimed_by(c, files)
        if cc is not None:  # installed by pip (RECORD) or dpkg: site-packages, or a --target dir on PYTHONPATH
            managed = managed or (c, cc[0])
            hidden.append(HiddenCopy(file=c.file, path_entry=c.path_entry, distribution=cc[0]))
    where = f"{winner.file or winner.path_entry}"
    if winner.kind is ModuleKind.NAMESPACE:
        where = f"namespace package over {', '.join(winner.search_locations)}"
    # a submodule's path_entry is its package's directory; the sys.path entry is the package's
    in_path = 0 <= winner.path_index < len(setup.sys_path)
    entry = setup.sys_path[winner.path_index].path if in_path else winner.path_entry
    idx = f"sys.path[{winner.path_index}] = {entry} ({origin.value if origin else '?'})"
    if winner.finder:
        idx = f"not on sys.path: the editable-install finder {winner.path_entry}, installed by {winner.finder}"
    return _Winner(module=module, top=top, resolved=winner, origin=origin, static_version=static_version,
                   distribution=dist, record_hash=rhash, editable=editable, installed_file=claim is not None,
                   record_hash_ok=hash_ok, hidden=tuple(hidden), managed=managed, where=where, idx=idx)


def _shadowed(w: _Winner, managed: tuple[Resolution, Distribution], setup: PythonSetup) -> ModuleCheck:
    """The file that imports hides a managed install further down sys.path."""
    c, cd = managed
    dist, winner = w.distribution, w.resolved
    ver = w.static_version or (dist.version if dist else None) or "unknown version"
    by = dist.label if dist else "no distribution (unmanaged)"
    stale = winner.search_locations[0] if winner.kind is ModuleKind.PACKAGE else w.where
    return w.check(Verdict.SHADOWED,
                   reason=(f"{w.module} {ver} from {w.where} [{by}; {w.idx}] shadows {cd.label} installed at {c.file}"),
                   fix=fix_hint(w.module, winner, w.origin, setup, stale),
                   expected=c, expected_distribution=cd, expected_version=cd.version)


def _judge_owner(w: _Winner, owning: list[Distribution]) -> ModuleCheck:
    """The verdict on a file that hides no managed install and that one distribution at most installs."""
    module, winner, dist, where, idx = w.module, w.resolved, w.distribution, w.where, w.idx
    if dist is None and w.origin is PathOrigin.STDLIB:
        return w.check(Verdict.OK, reason=f"standard library: {where} ({idx})")
    if dist is None:
        claimers = [d for d in owning if d.location == winner.path_entry]
        if claimers:
            reason = (f"{where} is not in the RECORD of {claimers[0].name} {claimers[0].version}, which is installed "
                      f"in {winner.path_entry}: a file left behind or copied in")
        else:
            reason = f"no installed distribution claims {where} ({idx})"
        return w.check(Verdict.UNMANAGED, reason=reason,
                       fix=f"install {module} with pip (so its version is recorded) or remove {where}")
    if w.record_hash_ok is False:
        if w.record_hash and w.record_hash.startswith("md5:"):
            return w.check(Verdict.VERSION_MISMATCH,
                           reason=f"{winner.file} differs from the file {dist.label} installed (dpkg md5sums "
                                  "mismatch): modified or overwritten after install",
                           fix=f"reinstall the package (apt-get install --reinstall {dist.package})")
        return w.check(Verdict.VERSION_MISMATCH,
                       reason=f"{winner.file} differs from the file {dist.name} {dist.version} installed "
                              "(RECORD sha256 mismatch): modified or overwritten after install",
                       fix=f"reinstall {dist.name} (pip install --force-reinstall {dist.name}=={dist.version})")
    static_version, editable = w.static_version, w.editable
    if static_version and version_key(static_version) and version_key(dist.version) and \
            version_key(static_version) != version_key(dist.version):
        if editable is not None:
            return w.check(Verdict.VERSION_MISMATCH,
                           reason=(f"{module}.__version__ is {static_version} but {dist.name} metadata says "
                                   f"{dist.version}: an editable install from {editable.editable} ({idx}) runs "
                                   "whatever that tree holds now, and pip show reports the version it had "
                                   "when installed"),
                           fix=f"install {dist.name} from a wheel (pip install {dist.name}=={dist.version}), "
                               "not editable (-e), in images")
        return w.check(Verdict.VERSION_MISMATCH,
                       reason=f"{module}.__version__ is {static_version} but {dist.name} metadata says {dist.version}",
                       fix=f"reinstall {dist.name} so that its files and metadata agree")
    if editable is not None:
        return w.check(Verdict.OK,
                       reason=(f"{dist.label}, an editable install: {where} from the source tree "
                               f"{editable.editable} ({idx}); its code is whatever that tree holds"))
    return w.check(Verdict.OK, reason=f"{dist.label} from {where} ({idx})" + _hides(list(w.hidden)))


def _hides(hidden: list[HiddenCopy]) -> str:
    """The copies further down sys.path that never import (part of the truth: pip over apt)."""
    if not hidden:
        return ""
    parts = [f"{h.distribution.label if h.distribution else 'an unmanaged copy'} at {h.file or h.path_entry}"
             for h in hidden]
    return "; it hides " + "; ".join(parts) + " (never imported)"


def _conflict(w: _Winner, owners: tuple[tuple[Distribution, str], ...]) -> ModuleCheck:
    """Two distributions install ``module`` in one directory: one's code runs, the other's never does."""
    module, winner, dist = w.module, w.resolved, w.distribution
    labels = [f"{d.label} ({f.rsplit('/', 1)[-1] if not f.endswith('/__init__.py') else f.rsplit('/', 2)[-2] + '/'})"
              for d, f in owners]
    running = dist.label if dist is not None else "an unrecorded file"
    losers = [d for d, _ in owners if dist is None or d.metadata_dir != dist.metadata_dir]
    why = ("a package directory beats a module file in one directory" if winner.kind is ModuleKind.PACKAGE
           else "both claim the same file: the last installed overwrote it")
    if winner.kind is not ModuleKind.PACKAGE and w.record_hash_ok is True and dist is not None:
        why += f"; its content has the RECORD hash of {dist.label}"
    elif winner.kind is not ModuleKind.PACKAGE and w.record_hash_ok is False:
        why += "; its content matches none of their RECORD hashes: changed after install"
    expected = DIST_OF_MODULE.get(module)
    keep = next((d for d, _ in owners if expected and normalize_name(d.name) == normalize_name(expected)), None)
    if keep is not None and dist is not None and normalize_name(keep.name) == normalize_name(dist.name):
        keep = dist  # the expected distribution's version that runs
    if dist is not None and losers and all(normalize_name(d.name) == normalize_name(dist.name) for d in losers):
        fix = (f"remove the stale metadata {', '.join(d.metadata_dir for d in losers)} (what `pip install --target "
               f"--upgrade` leaves of the version it replaced): the files are {dist.label}'s")
    elif keep is not None and dist is not None and keep.metadata_dir != dist.metadata_dir:
        drop = [d for d, _ in owners if d.metadata_dir != keep.metadata_dir]
        fix = (f"uninstall {' and '.join(d.name for d in drop)} ({_uninstall(drop)}), then reinstall "
               f"{keep.name} ({_reinstall(keep)}) so that its files are whole again")
    else:
        fix = (f"keep one: uninstall {' and '.join(d.name for d in losers)} ({_uninstall(losers)}), then reinstall "
               f"the one you keep" + (f" ({_reinstall(dist)})" if dist else ""))
    return w.check(
        Verdict.CONFLICT, owners=tuple(d for d, _ in owners),
        reason=(f"{len(owners)} distributions install {module} in {winner.path_entry}: {', '.join(labels)}; "
                f"{winner.file} imports ({why}), so the code of {running} runs and "
                f"{', '.join(d.label for d in losers)} never imports ({w.idx})"),
        fix=fix)


def _uninstall(dists: list[Distribution]) -> str:
    pip = [d.name for d in dists if d.package is None]
    apt = [d.package for d in dists if d.package]
    out = []
    if pip:
        out.append("pip uninstall -y " + " ".join(pip))
    if apt:
        out.append("apt-get remove -y " + " ".join(apt))
    return "; ".join(out)


def _reinstall(d: Distribution) -> str:
    if d.package:
        return f"apt-get install --reinstall {d.package}"
    return f"pip install --force-reinstall --no-deps {d.name}=={d.version}"


def _editable_owner(top: str, winner: Resolution, dists: list[Distribution]) -> Distribution | None:
    """The editable install (direct_url.json) whose source tree holds the resolved file, naming ``top``."""
    where = winner.file or (winner.search_locations[0] if winner.search_locations else None)
    if not where:
        return None
    for d in dists:
        if d.editable and where.startswith(d.editable.rstrip("/") + "/") and (not d.top_level or top in d.top_level):
            return d
    return None


@lru_cache(maxsize=1)
def load_known_issues() -> tuple[dict, ...]:
    """The known version facts shipped in ``forensics/data/known_issues.json``."""
    path = Path(__file__).resolve().parent.parent / "data" / "known_issues.json"
    return tuple(json.loads(path.read_text(encoding="utf-8"))["issues"])


def check_known_issues(versions: dict[str, str], driver: str | None,
                       issues: tuple[dict, ...] | None = None) -> list[KnownIssueHit]:
    """The known issues whose conditions the versions (normalized dist name -> version) and driver meet.

    An issue with a ``driver`` condition matches only when the driver version is known.
    """
    hits = []
    for issue in issues if issues is not None else load_known_issues():
        matched = []
        ok = True
        for name, spec in issue.get("when", {}).items():
            have = versions.get(normalize_name(name))
            if have is None or not specifier_contains(spec, have):
                ok = False
                break
            matched.append(f"{name} {have}")
        if ok and issue.get("driver"):
            if driver is None or not specifier_contains(issue["driver"], driver):
                ok = False
            else:
                matched.append(f"driver {driver}")
        if ok:
            hits.append(KnownIssueHit(id=issue["id"], severity=Severity(issue["severity"]), summary=issue["summary"],
                                      detail=issue.get("detail", ""), fix=issue.get("fix", ""),
                                      sources=tuple(issue.get("sources", ())), matched=tuple(matched)))
    return hits
