"""``report --explain``: each claim of the conclusion with the evidence items it rests on, the routing and the
steps with theirs (pure: a :class:`~.verdict.Conclusion` in, lines or a JSON-able dict out)."""
from __future__ import annotations

from typing import Any

from .verdict import Conclusion

__all__ = ["explanation", "explain_lines"]


def _items(c: Conclusion, keys: tuple[str, ...]) -> list:
    """The decision's evidence items named by ``keys``, in the decision's order."""
    return [i for i in c.decision.items if i.key in keys]


def explanation(c: Conclusion) -> dict[str, Any]:
    """The decision as JSON values: the class, its basis, what is missing, the claims with their evidence, who gets
    which report, the steps, the versions that ran, and the claims the evidence does not carry."""
    d = c.decision

    def items(keys: tuple[str, ...]) -> list[dict[str, str]]:
        return [{"key": i.key, "source": i.source, "fact": i.fact} for i in _items(c, keys)]

    return {
        "incident": c.incident.value, "words": c.words, "basis": items(d.basis), "missing": list(d.missing),
        "claims": [{"text": cl.text, "evidence": items(cl.evidence)} for cl in c.claims],
        "routes": [{"order": r.order, "owner": r.owner, "report": r.report.value, "where": r.where, "action": r.action,
                    "evidence": items(r.evidence)} for r in d.routes],
        "steps": [{"text": s.text, "command": s.command, "evidence": items(s.evidence)} for s in d.steps],
        "versions": [{"package": v.package, "ran": v.ran, "installed": v.installed, "source": v.source}
                     for v in d.versions],
        "unsupported_claims": c.unsupported_claims(),
    }


def explain_lines(c: Conclusion) -> list[str]:
    """The same as lines, read from the conclusion's records: ``claim: TEXT`` then ``  <- FACT [key, source]`` for
    each item it rests on."""
    d = c.decision
    out = [f"incident: {c.incident.value} ({c.words})"]
    out += [f"  missing: {m}" for m in d.missing]
    entries: list[tuple[str, str, str | None, tuple[str, ...]]] = [
        *(("claim", cl.text, None, cl.evidence) for cl in c.claims),
        *(("route", f"({r.order}) the {r.report.value} report -> {r.owner}: {r.action}", None, r.evidence)
          for r in d.routes),
        *(("step", s.text, s.command, s.evidence) for s in d.steps)]
    for kind, head, command, keys in entries:
        out.append(f"{kind}: {head}" + (f"  $ {command}" if command else ""))
        out += [f"  <- {i.fact} [{i.key}, {i.source}]" for i in _items(c, keys)]
    out += [f"NOT CARRIED: {u}" for u in c.unsupported_claims()]
    return out
