"""Known crashes, matched on what defines them.

An entry of ``known_crashes.json`` is defined by parts -- ``signal``, ``kind`` (crash class),
``thread`` (``main`` / ``non-main``), ``phase`` (``running`` / ``exit``), ``fields_any`` (NVML
field ids the failing query uses), ``frames_any`` (words of the crashing thread's frames),
``package_below`` (an imported package older than the fix).  It matches only when every part
holds in the facts; a part the evidence cannot establish (no native stacks to tell the phase,
no versions) does not hold.  A non-match is not listed.

The version facts verify-imports matched (``forensics/data/known_issues.json``) are sorted by
their ``kind``: ``fields`` entries are listed when the failing query uses one of their field
ids; ``crash`` entries only through their crash definition here; ``support`` entries belong to
the report's conclusion (an unsupported pairing), not to this list.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

from .facts import Facts, Phase

__all__ = ["KnownMatch", "KnownCrash", "CrashDefinition", "VersionFactEntry", "SupportFact", "Source",
           "load_known_crashes", "load_version_facts", "match_known_issues", "version_tuple", "support_facts"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownMatch:
    id: str
    title: str
    summary: str
    fix: str
    sources: tuple[tuple[str, str], ...]  # (label, url)
    matched_on: tuple[str, ...]  # each part of the definition, as it held


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    url: str
    label: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashDefinition:
    """What makes a known crash that crash (``defined_by``): each part set must hold; None: not part of it."""

    signal: tuple[str, ...] | None = None
    kind: tuple[str, ...] | None = None
    thread: str | None = None  # "main" | "non-main"
    phase: str | None = None  # "running" | "exit"
    fields_any: tuple[int, ...] | None = None
    frames_any: tuple[str, ...] | None = None
    package_below: dict[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownCrash:
    """An entry of ``known_crashes.json``."""

    id: str
    title: str
    defined_by: CrashDefinition
    summary: str = ""
    fix: str = ""
    sources: tuple[Source | str, ...] = ()
    verified: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionFactEntry:
    """An entry of ``forensics/data/known_issues.json`` (what verify-imports matches versions against)."""

    id: str
    kind: str  # "support" | "fields" | "crash"
    severity: str
    summary: str
    detail: str = ""
    fix: str = ""
    fields: tuple[int, ...] = ()
    sources: tuple[Source | str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SupportFact:
    """A version fact verify-imports matched that says the setup is outside what a package declares."""

    id: str
    summary: str
    detail: str
    fix: str
    severity: str
    sources: tuple[tuple[str, str], ...]
    matched: tuple[str, ...]


def _read_entries(text: str, key: str, cls: type[_T], name: str) -> tuple[_T, ...]:
    """The entries under ``key`` of a shipped JSON file, read into records here (a broken file is one error)."""
    from ..errors import ForensicsError
    from ..jsonrecords import RecordFormatError, from_jsonable

    try:
        doc = json.loads(text)
        entries = doc.get(key) if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise RecordFormatError(f"$.{key}", "expected a list")
        return tuple(from_jsonable(cls, e, f"$.{key}[{i}]") for i, e in enumerate(entries))
    except (ValueError, RecordFormatError) as e:
        raise ForensicsError(f"{name}: the shipped file is broken: {e}") from None


@functools.lru_cache(maxsize=1)
def load_known_crashes() -> tuple[KnownCrash, ...]:
    text = resources.files("forensics.report").joinpath("known_crashes.json").read_text()
    return _read_entries(text, "entries", KnownCrash, "known_crashes.json")


@functools.lru_cache(maxsize=1)
def load_version_facts() -> dict[str, VersionFactEntry]:
    """``forensics/data/known_issues.json`` by id (what verify-imports matches against)."""
    path = Path(__file__).resolve().parent.parent / "data" / "known_issues.json"
    return {i.id: i for i in _read_entries(path.read_text(encoding="utf-8"), "issues", VersionFactEntry,
                                           "known_issues.json")}


def version_tuple(v: str) -> tuple[int, ...]:
    """``"1.7.1"`` -> ``(1, 7, 1)``; non-numeric parts end the tuple.

    >>> version_tuple("12.575.51") < version_tuple("13.580.126")
    True
    """
    out = []
    for part in re.split(r"[.+-]", v):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


_PACKAGE_FACT = {"nvitop": "nvitop", "nvitop-exporter": "exporter", "nvidia-ml-py": "binding"}


def _signal(defined: CrashDefinition, f: Facts) -> str | None:
    return f"signal {f.signal}" if f.signal in (defined.signal or ()) else None


def _kind(defined: CrashDefinition, f: Facts) -> str | None:
    return f"crash class {f.kind}" if f.kind in (defined.kind or ()) else None


def _thread(defined: CrashDefinition, f: Facts) -> str | None:
    want_main = defined.thread == "main"
    if f.is_main_thread is None or f.is_main_thread != want_main:
        return None
    return ("the main thread" if want_main else
            f"a thread other than the main one ({f.thread_name or 'unnamed'}, tid {f.tid})")


def _phase(defined: CrashDefinition, f: Facts) -> str | None:
    if f.phase is Phase.UNKNOWN or f.phase.value != defined.phase:
        return None
    return ("while the interpreter exits (a thread is in Py_FinalizeEx / the exit handlers)"
            if f.phase is Phase.EXIT else "while the process runs (no thread is exiting)")


def _fields(defined: CrashDefinition, f: Facts) -> str | None:
    used = set(f.query.fields) if f.query else set()
    common = sorted(used & set(defined.fields_any or ()))
    return "the failing query uses NVML field ids " + ", ".join(map(str, common)) if common else None


def _frames(defined: CrashDefinition, f: Facts) -> str | None:
    hits = sorted({w for w in defined.frames_any or () for x in f.frame_words if w in x})
    return "the crashing thread's stack has " + ", ".join(hits) if hits else None


#: the parts of a definition, in the order a match names them: the field that asks for it, how it holds
_PARTS: tuple[tuple[str, Callable[[CrashDefinition, Facts], str | None]], ...] = (
    ("signal", _signal), ("kind", _kind), ("thread", _thread), ("phase", _phase), ("fields_any", _fields),
    ("frames_any", _frames))


def _holds(defined: CrashDefinition, f: Facts) -> list[str] | None:
    """Each part of ``defined`` as it holds in ``f``; None as soon as one does not."""
    held: list[str] = []
    for name, check in _PARTS:
        if getattr(defined, name) is None:
            continue
        part = check(defined, f)
        if part is None:
            return None
        held.append(part)
    for pkg, fixed in (defined.package_below or {}).items():
        have = getattr(f, _PACKAGE_FACT.get(pkg, ""), None)
        if not have or not version_tuple(have) < version_tuple(fixed):
            return None
        held.append(f"{pkg} {have} < {fixed}")
    return held


def _sources(sources: tuple[Source | str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((s.label or s.url, s.url) if isinstance(s, Source) else (_label_url(s), s) for s in sources)


def _label_url(url: str) -> str:
    m = re.match(r"https://pypi\.org/project/([^/]+)/([^/]+)/?$", url)
    if m:
        return f"{m.group(1)} {m.group(2)} on PyPI"
    m = re.match(r"https://github\.com/([^/]+/[^/]+)/(issues|pull)/(\d+)", url)
    if m:
        return f"{m.group(1).split('/')[1]} {'issue' if m.group(2) == 'issues' else 'pull request'} #{m.group(3)}"
    return url


def match_known_issues(f: Facts) -> list[KnownMatch]:
    """The known crashes whose definition holds, then the field-id facts the failing query touches."""
    out = []
    for e in load_known_crashes():
        held = _holds(e.defined_by, f)
        if held:
            out.append(KnownMatch(id=e.id, title=e.title, summary=e.summary, fix=e.fix, sources=_sources(e.sources),
                                  matched_on=tuple(held)))
    facts = load_version_facts()
    for hit in f.version_facts:
        entry = facts.get(hit.id)
        if entry is None or entry.kind != "fields":
            continue
        held = _holds(CrashDefinition(fields_any=entry.fields), f)
        if held:
            out.append(KnownMatch(id=entry.id, title=entry.summary, summary=entry.detail, fix=entry.fix,
                                  sources=_sources(entry.sources), matched_on=tuple(held) + hit.matched))
    return out


def support_facts(f: Facts) -> list[SupportFact]:
    """verify-imports' version facts that say the setup is outside what a package declares (``support``)."""
    facts = load_version_facts()
    out = []
    for hit in f.version_facts:
        entry = facts.get(hit.id)
        if entry is not None and entry.kind == "support":
            out.append(SupportFact(id=entry.id, summary=entry.summary, detail=entry.detail, fix=entry.fix,
                                   severity=entry.severity, sources=_sources(entry.sources), matched=hit.matched))
    return out
