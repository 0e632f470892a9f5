"""A shadowed or unsupported install: the code that ran is not the installed distribution's (verify-imports:
SHADOWED, ...) -- decided before the binding's and every later class -- or the setup is outside what a package
declares (pip check, version facts) and nothing else decided.  The image is fixed first; nothing is filed
upstream."""
from __future__ import annotations

from ...modes import INTERNAL_WHERE, ReportTemplate
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route
from .common import runbook_title, MODULE_KEYS, crash_phrase, has, install_steps, runs_claim, sentence
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE"]


def _shadowed(g: Grounds) -> Found | None:
    if g.shadowed:
        return Found(basis=tuple(i.key for i in g.items if i.key.startswith("imports.")))
    return None


def _unsupported(g: Grounds) -> Found | None:
    if g.unsupported:
        return Found(basis=("imports.requirements",) if "imports.requirements" in g.keys else ())
    return None


def _beside(d: Decision) -> bool:
    """A second cause beside the decided class (a driver fault), fixed first: its reports stand on their own."""
    return d.has_cause(IncidentClass.INSTALL) and len(d.causes) > 1


def _routes(g: Grounds, d: Decision) -> list[Route]:
    action = ("fix the image first: until it runs the installed code, no crash says what the installed releases do"
              if _beside(d) else
              "fix the image first; file nothing upstream until the installed code still crashes")
    return [Route(order=1, owner="the team", where=INTERNAL_WHERE, report=ReportTemplate.RUNBOOK, action=action,
                  evidence=d.basis)]


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f = g.f
    keys = has(d, *(i.key for i in d.items if i.key.startswith("imports.")))
    out = []
    if d.shadowed:
        out.append(Claim(text="The code that ran is not the installed distribution's: " + "; ".join(d.shadowed) + ".",
                         evidence=has(d, *MODULE_KEYS)))
    if d.unsupported:
        out.append(Claim(text="The setup is unsupported: " + "; ".join(d.unsupported) + ".",
                         evidence=has(d, "imports.requirements", "imports.support")))
    if _beside(d):  # the other cause's claims say the crash and the runs
        return out + [Claim(text="Fix the image first and check it with verify-imports.", evidence=keys)]
    out.append(Claim(text="Fix the image first and check it with verify-imports; nothing is filed upstream until the "
                          "supported, installed code still crashes.", evidence=keys))
    if f.has_crash:
        out.append(Claim(text=sentence(f"the crash: {crash_phrase(f)}."),
                         evidence=has(d, "core", "core.inside_nvml")))
    return out + runs_claim(f, d)


def _says(g: Grounds) -> str:
    """A shadowed install with the versions that ran beside those installed (the words of its titles)."""
    if not g.shadowed:
        return RULE.words
    differ = [v for v in g.versions if v.ran and v.installed and v.ran != v.installed]
    if not differ:
        return "a shadowed install: the code that ran is not the installed one's"
    installed = " and ".join(dict.fromkeys(str(v.installed) for v in differ))
    return (f"a shadowed install: {' and '.join(f'{v.package} {v.ran}' for v in differ)} ran, not the installed "
            f"{installed}")


RULE = IncidentRule(
    incident=IncidentClass.INSTALL,
    words="a shadowed or unsupported install: the code that ran is not the supported installed one",
    criteria=(Criterion(rank=20, test=_shadowed), Criterion(rank=80, test=_unsupported)),
    routes=_routes, steps=install_steps, claims=_claims, upgrading=True,
    titles={ReportTemplate.RUNBOOK: runbook_title}, accompanies=_shadowed, fix_order=1, says=_says,
    first_because="until the image runs the installed code, what crashes is not the installed releases' code")
