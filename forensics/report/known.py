"""Match evidence against the knowledge file of known crashes (each entry with its source link).

Criteria (all optional; ``signal`` and ``kind``, when given, must hold; then an entry
matches when at least one criterion holds, and the report says how many held):
``signal`` (signal names), ``kind`` (crash classes), ``package_below`` (an imported
package's version lower than the fix), ``frames_any`` (substrings of the crashing
thread's native symbols/libraries or Python files/functions), ``driver_prefix``.
"""
from __future__ import annotations

import functools
import json
import re
from importlib import resources

from .evidence import Evidence

__all__ = ["load_known_crashes", "match_known_issues", "version_tuple"]


@functools.lru_cache(maxsize=1)
def load_known_crashes() -> tuple[dict, ...]:
    text = resources.files("forensics.report").joinpath("known_crashes.json").read_text()
    return tuple(json.loads(text)["entries"])


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


def _facts(ev: Evidence) -> dict:
    a = (ev.first("analyze") or {}).get("analysis") or (ev.first("capture") or {}).get("analysis") or {}
    crash = a.get("crash") or {}
    threads = (a.get("snapshot") or {}).get("threads") or []
    crashed = next((t for t in threads if t.get("is_crashed")), {})
    words = []
    for f in crashed.get("native_frames") or []:
        words += [f.get("symbol") or "", f.get("library") or ""]
    for f in crashed.get("py_frames") or []:
        words += [f.get("file") or "", f.get("function") or ""]
    versions: dict[str, str] = {}
    # what the crashed process imported (a capture's snapshot resolves it as CPython does), then what an
    # image or process check found
    for doc in ev.all("capture"):
        for m in ((doc.get("snapshot") or {}).get("python") or {}).get("modules") or []:
            if isinstance(m, dict) and m.get("module") and m.get("version"):
                versions.setdefault(str(m["module"]), str(m["version"]))
    for doc in ev.all("verify-imports"):
        mods = ((doc.get("result") or {}).get("modules")) or doc.get("modules") or []
        for m in mods:
            if isinstance(m, dict) and m.get("module") and (m.get("version") or m.get("module_version")):
                versions.setdefault(str(m["module"]), str(m.get("version") or m.get("module_version")))
    nvml = ((a.get("snapshot") or {}).get("core") or {}).get("nvml") or {}
    return {"signal": crash.get("signal_name"), "kind": crash.get("kind"), "words": words, "versions": versions,
            "driver": nvml.get("driver_version")}


def match_known_issues(ev: Evidence) -> list[dict[str, str]]:
    """Entries that match, best first: ``{"title", "source", "match"}``."""
    facts = _facts(ev)
    out = []
    for e in load_known_crashes():
        crit = e.get("criteria", {})
        held, total = [], 0
        if "signal" in crit:
            total += 1
            if facts["signal"] in crit["signal"]:
                held.append(f"signal {facts['signal']}")
        if "kind" in crit:
            total += 1
            if facts["kind"] in crit["kind"]:
                held.append(f"crash class {facts['kind']}")
        for pkg, fixed in (crit.get("package_below") or {}).items():
            total += 1
            v = facts["versions"].get(pkg)
            if v and version_tuple(v) < version_tuple(fixed):
                held.append(f"{pkg} {v} < {fixed}")
        if "frames_any" in crit:
            total += 1
            hits = sorted({w for w in crit["frames_any"] for x in facts["words"] if w in x})
            if hits:
                held.append("stack mentions " + ", ".join(hits))
        if "driver_prefix" in crit:
            total += 1
            if facts["driver"] and any(facts["driver"].startswith(p) for p in crit["driver_prefix"]):
                held.append(f"driver {facts['driver']}")
        gates = [g for g in ("signal", "kind") if g in crit]
        gate_held = {"signal": facts["signal"] in crit.get("signal", ()), "kind": facts["kind"] in crit.get("kind", ())}
        if any(not gate_held[g] for g in gates):
            continue  # the crash class or signal of an entry is a gate, not one criterion among others
        if held:
            strength = "strong" if len(held) == total else "partial"
            out.append({"title": e["title"], "source": e["source"],
                        "match": f"{strength} match ({len(held)} of {total} criteria: {'; '.join(held)})",
                        "_score": len(held) / max(total, 1)})
    # version facts that verify-imports matched (forensics/data/known_issues.json): one knowledge file
    # per kind of fact, both listed here
    seen = {d["title"] for d in out}
    for doc in ev.all("verify-imports"):
        for k in (doc.get("result") or {}).get("known_issues") or []:
            if not isinstance(k, dict) or not k.get("summary") or k["summary"] in seen:
                continue
            seen.add(k["summary"])
            sources = k.get("sources") or []
            out.append({"title": f"{k['summary']} — fix: {k.get('fix') or 'see source'}",
                        "source": sources[0] if sources else "",
                        "match": f"matched by verify-imports ({k.get('severity', '?')}: {', '.join(k.get('matched') or [])})",
                        "_score": 1.0 if k.get("severity") == "error" else 0.5})
    out.sort(key=lambda d: -d["_score"])
    for d in out:
        d.pop("_score")
    return out
