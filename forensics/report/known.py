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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .facts import Facts, Phase

__all__ = ["KnownMatch", "load_known_crashes", "load_version_facts", "match_known_issues", "version_tuple",
           "support_facts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownMatch:
    id: str
    title: str
    summary: str
    fix: str
    sources: tuple[tuple[str, str], ...]  # (label, url)
    matched_on: tuple[str, ...]  # each part of the definition, as it held


@functools.lru_cache(maxsize=1)
def load_known_crashes() -> tuple[dict, ...]:
    text = resources.files("forensics.report").joinpath("known_crashes.json").read_text()
    return tuple(json.loads(text)["entries"])


@functools.lru_cache(maxsize=1)
def load_version_facts() -> dict[str, dict]:
    """``forensics/data/known_issues.json`` by id (what verify-imports matches against)."""
    path = Path(__file__).resolve().parent.parent / "data" / "known_issues.json"
    return {i["id"]: i for i in json.loads(path.read_text(encoding="utf-8"))["issues"]}


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


def _holds(defined: dict, f: Facts) -> list[str] | None:
    """Each part of ``defined`` as it holds in ``f``; None as soon as one does not."""
    held: list[str] = []
    if "signal" in defined:
        if f.signal not in defined["signal"]:
            return None
        held.append(f"signal {f.signal}")
    if "kind" in defined:
        if f.kind not in defined["kind"]:
            return None
        held.append(f"crash class {f.kind}")
    if "thread" in defined:
        want_main = defined["thread"] == "main"
        if f.is_main_thread is None or f.is_main_thread != want_main:
            return None
        held.append("the main thread" if want_main else
                    f"a thread other than the main one ({f.thread_name or 'unnamed'}, tid {f.tid})")
    if "phase" in defined:
        if f.phase is Phase.UNKNOWN or f.phase.value != defined["phase"]:
            return None
        held.append("while the interpreter exits (a thread is in Py_FinalizeEx / the exit handlers)"
                    if f.phase is Phase.EXIT else "while the process runs (no thread is exiting)")
    if "fields_any" in defined:
        used = set(f.query.fields) if f.query else set()
        common = sorted(used & set(defined["fields_any"]))
        if not common:
            return None
        held.append("the failing query uses NVML field ids " + ", ".join(map(str, common)))
    if "frames_any" in defined:
        hits = sorted({w for w in defined["frames_any"] for x in f.frame_words if w in x})
        if not hits:
            return None
        held.append("the crashing thread's stack has " + ", ".join(hits))
    for pkg, fixed in (defined.get("package_below") or {}).items():
        have = getattr(f, _PACKAGE_FACT.get(pkg, ""), None)
        if not have or not version_tuple(have) < version_tuple(fixed):
            return None
        held.append(f"{pkg} {have} < {fixed}")
    return held


def _sources(urls) -> tuple[tuple[str, str], ...]:
    out = []
    for s in urls or ():
        if isinstance(s, dict):
            out.append((str(s.get("label") or s.get("url")), str(s.get("url"))))
        else:
            out.append((_label_url(str(s)), str(s)))
    return tuple(out)


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
        held = _holds(e.get("defined_by") or {}, f)
        if held:
            out.append(KnownMatch(id=e["id"], title=e["title"], summary=e.get("summary", ""), fix=e.get("fix", ""),
                                  sources=_sources(e.get("sources")), matched_on=tuple(held)))
    facts = load_version_facts()
    for hit in f.version_facts:
        entry = facts.get(hit.id, {})
        if entry.get("kind") != "fields":
            continue
        held = _holds({"fields_any": entry.get("fields") or []}, f)
        if held:
            out.append(KnownMatch(id=entry["id"], title=entry["summary"], summary=entry.get("detail", ""),
                                  fix=entry.get("fix", ""), sources=_sources(entry.get("sources")),
                                  matched_on=tuple(held) + hit.matched))
    return out


def support_facts(f: Facts) -> list[dict]:
    """verify-imports' version facts that say the setup is outside what a package declares (``support``)."""
    facts = load_version_facts()
    out = []
    for hit in f.version_facts:
        entry = facts.get(hit.id, {})
        if entry.get("kind") == "support":
            out.append({"id": entry["id"], "summary": entry["summary"], "detail": entry.get("detail", ""),
                        "fix": entry.get("fix", ""), "severity": entry.get("severity", ""),
                        "sources": _sources(entry.get("sources")), "matched": hit.matched})
    return out
