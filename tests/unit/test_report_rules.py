"""The incident classes as rows (forensics/report/rules/): every class has one row, and every class x template
has a title, a route and a runbook step; no two classes share a title or a runbook for one template (pure: facts
built by hand, one example per class, decided through the same rows the reports use)."""
from __future__ import annotations

import pytest

from forensics.model import NativeFrame
from forensics.modes import ReportTemplate
from forensics.report.facts import Facts
from forensics.report.incident import IncidentClass
from forensics.report.known import KnownMatch
from forensics.report.rules import CRITERIA, RULES, rule_for
from forensics.report.titles import make_title
from forensics.report.verdict import decide
from tests.unit.test_report_heap import BINDING, DRIVER, _facts, _run


def _frame(symbol: str, library: str) -> NativeFrame:
    return NativeFrame(index=0, pc=0x1000, symbol=symbol, offset=0, library=library)


_FIXED = KnownMatch(id="known-x", title="a known crash", summary="", fix="upgrade nvitop to 1.6.0",
                    sources=(("nvitop issue #1", "https://github.com/XuehaiPan/nvitop/issues/1"),),
                    matched_on=("signal SIGSEGV",))

#: one incident of each class, as its facts and the known issues that match
EXAMPLES: dict[IncidentClass, tuple[Facts, list[KnownMatch]]] = {
    IncidentClass.DRIVER: (_facts("driver-wrote-past-buffer", DRIVER, [_run("c", crashed=True)]), []),
    IncidentClass.BINDING: (_facts("binding-count-too-large", BINDING), []),
    IncidentClass.INSTALL: (Facts(requirement_problems=("nvitop 1.5.0 requires nvidia-ml-py<12.571",)), []),
    IncidentClass.KNOWN: (Facts(has_crash=True, signal="SIGSEGV"), [_FIXED]),
    IncidentClass.PROGRAM: (Facts(has_crash=True, signal="SIGSEGV",
                                  native_frames=(_frame("PyObject_Free", "/usr/lib/libpython3.11.so.1.0"),)), []),
    IncidentClass.OUTSIDE_NVML: (Facts(has_crash=True, signal="SIGSEGV",
                                       native_frames=(_frame("crash_here", "/opt/lib/libcrash.so"),)), []),
    IncidentClass.NO_CRASH: (Facts(repro_runs=(_run("python", crashed=False), _run("c", crashed=False))), []),
    IncidentClass.UNDETERMINED: (Facts(has_crash=True, signal="SIGSEGV", api="nvmlShutdown"), []),
}


def test_every_class_is_one_row_and_has_an_example():
    assert sorted(r.incident.value for r in RULES) == sorted(k.value for k in IncidentClass)
    assert len({r.incident for r in RULES}) == len(RULES)
    # a new class gets an example here, or this test names it
    assert set(EXAMPLES) == set(IncidentClass)


def test_the_decision_order_is_a_total_order():
    ranks = [c.rank for c, _ in CRITERIA]
    assert len(set(ranks)) == len(ranks) and ranks == sorted(ranks)
    assert CRITERIA[-1][1].incident is IncidentClass.UNDETERMINED  # the last, which always holds


@pytest.mark.parametrize("incident", list(IncidentClass), ids=lambda k: k.value)
def test_each_class_has_a_title_a_route_and_a_step_for_every_template(incident):
    f, known = EXAMPLES[incident]
    c = decide(f, known)
    # the example is of its class
    assert c.incident is incident
    rule = rule_for(incident)
    d = c.decision
    assert d.routes, "a class routes its report somewhere"
    assert d.steps, "a class gives the runbook a step"
    assert c.claims, "a class says what it concludes"
    # every template it routes to has the class's own title; the runbook always has one
    routed = {r.report for r in d.routes}
    assert routed <= set(rule.titles), routed - set(rule.titles)
    assert ReportTemplate.RUNBOOK in rule.titles
    for t in ReportTemplate:
        title = make_title(t, f, c)
        assert title.strip() and "\n" not in title, (t, title)
        if t.upstream and t not in routed:
            assert title.removeprefix("[BUG] ").startswith(f"not for {t.whom} ({c.words})"), title


@pytest.mark.parametrize("template", list(ReportTemplate), ids=lambda t: t.value)
def test_no_two_classes_share_a_title_or_a_runbook(template):
    # GIVEN each class's decision, titled on the same facts (every example's in turn): what the class says of
    # the incident, not what the facts say, has to tell the classes apart
    decided = {k: decide(f, known) for k, (f, known) in EXAMPLES.items()}
    for f, _known in EXAMPLES.values():
        titles: dict[str, list[str]] = {}
        for incident, c in decided.items():
            titles.setdefault(make_title(template, f, c), []).append(incident.value)
        assert [k for k in titles.values() if len(k) > 1] == []
    # and each class's runbook (its own example's steps) is its own
    runbooks: dict[tuple, list[str]] = {}
    for incident, c in decided.items():
        runbooks.setdefault(tuple((s.text, s.command) for s in c.decision.steps), []).append(incident.value)
    assert [k for k in runbooks.values() if len(k) > 1] == []
    assert len({r.words for r in RULES}) == len(RULES)
