"""``report --explain``: each claim of the conclusion with the evidence items it rests on, the routing and the
steps with theirs (pure: a :class:`~.verdict.Conclusion` in, lines or a JSON-able dict out)."""
from __future__ import annotations

from typing import Any

from .verdict import Conclusion

__all__ = ["explanation", "explain_lines"]


def explanation(c: Conclusion) -> dict[str, Any]:
    """The decision as JSON values: the class, its basis, what is missing, the claims with their evidence, who gets
    which report, the steps, the versions that ran, and the claims the evidence does not carry."""
    d = c.decision

    def items(keys: tuple[str, ...]) -> list[dict[str, str]]:
        return [{"key": i.key, "source": i.source, "fact": i.fact} for i in d.items if i.key in keys]

    return {
        "incident": c.incident.value, "words": c.incident.words, "basis": items(d.basis), "missing": list(d.missing),
        "claims": [{"text": cl.text, "evidence": items(cl.evidence)} for cl in c.claims],
        "routes": [{"order": r.order, "owner": r.owner, "report": r.report, "where": r.where, "action": r.action,
                    "evidence": items(r.evidence)} for r in d.routes],
        "steps": [{"text": s.text, "command": s.command, "evidence": items(s.evidence)} for s in d.steps],
        "versions": [{"package": v.package, "ran": v.ran, "installed": v.installed, "source": v.source}
                     for v in d.versions],
        "unsupported_claims": c.unsupported_claims(),
    }


def explain_lines(c: Conclusion) -> list[str]:
    """The same as lines: ``claim: TEXT`` then ``  <- FACT [key, source]`` for each item it rests on."""
    e = explanation(c)
    out = [f"incident: {e['incident']} ({e['words']})"]
    out += [f"  missing: {m}" for m in e["missing"]]
    for kind, entries in (("claim", e["claims"]), ("route", e["routes"]), ("step", e["steps"])):
        for x in entries:
            head = x["text"] if kind != "route" else f"({x['order']}) the {x['report']} report -> {x['owner']}: " \
                                                         f"{x['action']}"
            out.append(f"{kind}: {head}" + (f"  $ {x['command']}" if x.get("command") else ""))
            out += [f"  <- {i['fact']} [{i['key']}, {i['source']}]" for i in x["evidence"]]
    out += [f"NOT CARRIED: {u}" for u in e["unsupported_claims"]]
    return out
