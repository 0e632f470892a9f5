"""The incident classes as rows (forensics/report/rules/): every class has one row, and every class x template
has a title, a route and a runbook step; no two classes share a title or a runbook for one template (pure: facts
built by hand, one example per class, decided through the same rows the reports use)."""
from __future__ import annotations

import dataclasses

import pytest

from forensics.model import NativeFrame
from forensics.modes import ReportTemplate
from forensics.report.facts import Facts
from forensics.report.incident import IncidentClass
from forensics.bundle.documents import ProbeSpec
from forensics.report.kills import Kill, KillKind
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
    IncidentClass.KILL: (Facts(kill=Kill(kind=KillKind.OOM, source="the pod", signal="SIGKILL", exit_code=137,
                                         pod="monitoring/exporter-7d9f", container="exporter",
                                         owner="daemonset/exporter", memory_limit="64Mi")), []),
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


#: one kill of each kind, as a pod's evidence would give it
KILLS = {
    KillKind.OOM: Kill(kind=KillKind.OOM, source="the pod", signal="SIGKILL", exit_code=137, pod="ns/p",
                       container="exporter", owner="daemonset/exporter", memory_limit="64Mi", memory_request="32Mi"),
    KillKind.EVICTED: Kill(kind=KillKind.EVICTED, source="the pod", pod="ns/p", container="exporter",
                           usage="The node was low on resource: memory. Container exporter was using 2Gi, request "
                                 "is 1Gi."),
    KillKind.LIVENESS: Kill(kind=KillKind.LIVENESS, source="the pod", signal="SIGKILL", exit_code=137, pod="ns/p",
                            container="exporter", owner="daemonset/exporter",
                            probe=ProbeSpec(action="HTTP GET /healthz on port metrics", timeout=1),
                            messages=("Unhealthy: Liveness probe failed: context deadline exceeded",)),
    KillKind.SENT: Kill(kind=KillKind.SENT, source="the core", signal="SIGABRT", exit_code=134,
                        sender="pid 4242 (uid 0) with kill(2)", sender_pid=4242),
    KillKind.SIGNALED: Kill(kind=KillKind.SIGNALED, source="the pod", signal="SIGTERM", exit_code=143, pod="ns/p",
                            container="exporter"),
}


def test_every_kill_is_a_kill_with_its_own_title_and_steps():
    assert set(KILLS) == set(KillKind)
    seen_titles, seen_steps = set(), set()
    for kill in KILLS.values():
        f = Facts(kill=kill)
        c = decide(f, [])
        # a kill, filed nowhere upstream; every upstream report says it is not for it
        assert c.incident is IncidentClass.KILL and [r.report for r in c.decision.routes] == [ReportTemplate.RUNBOOK]
        assert c.statement.startswith("Not a crash: ") and kill.words in c.statement
        title = make_title(ReportTemplate.RUNBOOK, f, c)
        assert kill.words in title, title
        for t in (ReportTemplate.NVML, ReportTemplate.BINDING, ReportTemplate.NVITOP):
            assert make_title(t, f, c).removeprefix("[BUG] ").startswith(f"not for {t.whom} (")
        seen_titles.add(title)
        seen_steps.add(tuple(s.text for s in c.decision.steps))
    assert len(seen_titles) == len(seen_steps) == len(KILLS)


def test_an_oom_kill_names_the_limit_and_raises_it_on_the_owner():
    c = decide(Facts(kill=KILLS[KillKind.OOM]), [])
    commands = [s.command for s in c.decision.steps]
    assert commands == [
        """kubectl get pod p -n ns -o 'jsonpath={.spec.containers[?(@.name=="exporter")].resources}'""",
        "kubectl set resources daemonset/exporter -n ns -c exporter --limits=memory=128Mi",
        """kubectl get daemonset/exporter -n ns -o 'jsonpath={.spec.template.spec.containers[?(@.name=="exporter")]"""
        """.resources.limits.memory}'"""]
    assert "it reached its limit of 64Mi (its request is 32Mi)" in c.statement


def test_a_kill_beside_a_crash_is_a_second_cause_fixed_first():
    # GIVEN a binding's heap overflow in the core and an OOM kill of the same container in the pod's evidence
    f, _ = EXAMPLES[IncidentClass.BINDING]
    c = decide(dataclasses.replace(f, kill=KILLS[KillKind.OOM]), [])
    d = c.decision
    # THEN the incident is the binding's fault, the kill a cause of its own fixed first, each route with its evidence
    assert c.incident is IncidentClass.BINDING
    assert [k.incident for k in d.causes] == [IncidentClass.KILL, IncidentClass.BINDING]
    assert [(r.order, r.report) for r in d.routes] == [(1, ReportTemplate.RUNBOOK), (2, ReportTemplate.BINDING)]
    assert d.routes[0].evidence == ("kill", "kill.memory") and d.routes[1].evidence == ("heap",)
    assert c.statement.startswith("2 causes, to be fixed in this order: (1) a kill: OOM-killed by the kernel at its "
                                  "memory limit of 64Mi (exit 137, SIGKILL), first because")
    heads = [s.text[:21] for s in d.steps]
    assert heads == ["See what the containe", "Raise the limit above", "Prove it: daemonset/e", "Pin the binding in th"]
    assert make_title(ReportTemplate.BINDING, f, c).startswith("nvidia-ml-py")
