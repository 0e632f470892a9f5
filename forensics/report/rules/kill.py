"""A kill: the process was stopped from outside -- the kernel's OOM killer at the container's memory limit, the
kubelet's eviction or its kill after a failed liveness probe, a signal another process sent (the core's siginfo),
an exit status of 137 or 143 -- and did not crash (:mod:`..kills`).  Nothing is filed upstream: the runbook names
the kill and its likely sender, and gives the steps that fit (the limit, the probe, the sender).  Beside a crash
it is a second cause, fixed first: a process that keeps being killed restarts before any fix can be seen
working."""
from __future__ import annotations

import shlex

from ...modes import INTERNAL_WHERE, ReportTemplate
from ..facts import Facts
from ..grounds import Grounds
from ..incident import Claim, Decision, IncidentClass, Route, Step
from ..kills import Kill, KillKind
from ..phrases import process_name
from .common import has
from .row import Criterion, Found, IncidentRule

__all__ = ["RULE", "doubled"]

_BASIS = ("kill", "kill.memory", "kill.probe", "kill.events", "core")


def _decides(g: Grounds) -> Found | None:
    return Found(basis=g.has(*_BASIS)) if g.f.kill is not None and not g.f.has_crash else None


def _accompanies(g: Grounds) -> Found | None:
    return Found(basis=g.has(*_BASIS[:-1])) if g.f.kill is not None else None


def _kill(g: Grounds) -> Kill:
    assert g.f.kill is not None  # the class holds only with one
    return g.f.kill


def _who(f: Facts, k: Kill) -> str:
    """The process killed: the pod's container, else the process by name."""
    if k.pod:
        return f"container {k.container} of pod {k.pod}" if k.container else f"pod {k.pod}"
    if k.pods:
        return f"{k.pods} pod{'s' if k.pods != 1 else ''} of the fleet"
    return process_name(f)


def _routes(g: Grounds, d: Decision) -> list[Route]:
    k = _kill(g)
    return [Route(order=1, owner="the team", where=INTERNAL_WHERE, report=ReportTemplate.RUNBOOK,
                  action=f"nothing to file upstream: stop what killed it ({k.kind.sender})", evidence=d.basis)]


# ---- the steps that fit each kill --------------------------------------------------------------------------

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def doubled(quantity: str) -> str | None:
    """Twice a memory quantity, in its own unit: ``64Mi`` -> ``128Mi``, ``1G`` -> ``2G``; None when it is not one.

    >>> doubled("64Mi"), doubled("1.5Gi"), doubled("268435456"), doubled("lots")
    ('128Mi', '3Gi', '536870912', None)
    """
    for unit in sorted(_UNITS, key=len, reverse=True):
        if quantity.endswith(unit):
            number = quantity[: -len(unit)]
            break
    else:
        unit, number = "", quantity
    try:
        value = float(number) * 2
    except ValueError:
        return None
    return f"{int(value) if value == int(value) else value}{unit}"


def _kubectl_where(k: Kill) -> list[str]:
    ns, _, name = (k.pod or "").partition("/")
    return ["-n", ns] if ns and name else []


def _container_jsonpath(k: Kill, field: str) -> str:
    return f'{{.spec.containers[?(@.name=="{k.container}")].{field}}}'


def _memory_steps(k: Kill, evidence: tuple[str, ...]) -> list[Step]:
    """An OOM kill: read the limit, raise it (or find what grows), prove the owner has the new one."""
    ns, _, pod = (k.pod or "").partition("/")
    limit = f"its memory limit of {k.memory_limit}" if k.memory_limit else "its memory limit"
    out = [Step(text=f"See what the container may use: the kernel killed it at {limit}"
                     + (f" (request {k.memory_request})" if k.memory_request else "")
                     + "; what it used then is the limit (an OOM kill is at the limit), not what it needs",
                command=shlex.join(["kubectl", "get", "pod", pod, *_kubectl_where(k), "-o",
                                    "jsonpath=" + _container_jsonpath(k, "resources")])
                if pod and k.container else None, evidence=evidence)]
    new = doubled(k.memory_limit) if k.memory_limit else None
    if k.owner and k.container and new:
        out.append(Step(text=f"Raise the limit above what it uses -- twice it, {new}, then watch its use (kubectl top "
                             "pod) -- or, if its use grows without bound, find what grows (a leak is fixed, not fed); "
                             f"the pod's owner, {k.owner}, holds the limit its next pods get",
                        command=shlex.join(["kubectl", "set", "resources", k.owner, *_kubectl_where(k), "-c",
                                            k.container, f"--limits=memory={new}"]), evidence=evidence))
        out.append(Step(text=f"Prove it: {k.owner}'s pod template has the new limit ({new})",
                        command=shlex.join(["kubectl", "get", k.owner, *_kubectl_where(k), "-o", "jsonpath={.spec."
                                            f'template.spec.containers[?(@.name=="{k.container}")].resources.limits'
                                            ".memory}"]), evidence=evidence))
    else:
        out.append(Step(text="Raise the container's memory limit above what it uses (its pod's owner holds it), or "
                             "find what grows if its use grows without bound", command=None, evidence=evidence))
    return out


def _probe_steps(k: Kill, evidence: tuple[str, ...]) -> list[Step]:
    """A failed liveness probe: read the probe and its failures, then give the process the time it needs."""
    ns, _, pod = (k.pod or "").partition("/")
    said = "; ".join(k.messages) or "the events name the probe's failures"
    out = [Step(text=f"See the probe that failed ({k.probe_words or 'its spec'}) and why: {said}",
                command=shlex.join(["kubectl", "get", "pod", pod, *_kubectl_where(k), "-o",
                                    "jsonpath=" + _container_jsonpath(k, "livenessProbe")])
                if pod and k.container else None, evidence=evidence)]
    timeout = (k.probe.timeout or 1) if k.probe else 1
    out.append(Step(text=f"Fix the probe or what makes the process slow to answer it: a {timeout} s timeout a busy "
                         "exporter misses is raised (timeoutSeconds, failureThreshold) in "
                         f"{k.owner or 'the pod owner'}'s template; a probe that fails because the process hangs is "
                         "the process's bug (capture it with forensics capture --pod while it hangs)",
                    command=None, evidence=evidence))
    return out


def _eviction_steps(k: Kill, evidence: tuple[str, ...]) -> list[Step]:
    return [Step(text=f"See why the kubelet evicted it: {k.usage or 'the pod status names the resource'}; a pod that "
                      "uses more memory than it requests is evicted first when the node runs short: set its request "
                      f"to what it uses{' (' + k.owner + ')' if k.owner else ''}", command=None, evidence=evidence)]


def _sent_steps(k: Kill, evidence: tuple[str, ...]) -> list[Step]:
    if k.sender_pid:
        return [Step(text=f"Find what sent {k.signal or 'the signal'}: {k.sender} (pids as the killed process's PID "
                          "namespace saw them: run it there, in its container or on its host); a watchdog's or an "
                          "operator's kill is stopped or given its reason, nothing crashed",
                     command=f"ps -o pid,ppid,user,lstart,args -p {k.sender_pid}", evidence=evidence)]
    return [Step(text=f"Find what sent {k.signal or 'the signal'}: {k.sender or 'its sender is not in the core'}; "
                      "pid 0 is a process outside the container's PID namespace (the container runtime, the kubelet, "
                      "a node agent): the node's logs of that time name it", command=None, evidence=evidence)]


def _signaled_steps(k: Kill, evidence: tuple[str, ...]) -> list[Step]:
    return [Step(text=f"Find what sent {k.signal or 'the signal'} (exit {k.exit_code}): the pod's events (a kill "
                      "by the kubelet: a probe, an eviction, a deletion), the node's kernel log (the OOM killer "
                      "names the process it killed)", command=None, evidence=evidence)]


_STEPS = {KillKind.OOM: _memory_steps, KillKind.LIVENESS: _probe_steps, KillKind.EVICTED: _eviction_steps,
          KillKind.SENT: _sent_steps, KillKind.SIGNALED: _signaled_steps}


def _steps(g: Grounds, d: Decision) -> list[Step]:
    k = _kill(g)
    return _STEPS[k.kind](k, d.basis)


# ---- the claims --------------------------------------------------------------------------------------------

def _cause_claim(g: Grounds, d: Decision, k: Kill) -> Claim | None:
    """What the evidence says of why: the memory, the probe, the eviction's message, the sender."""
    if k.kind is KillKind.OOM and k.memory_limit:
        return Claim(text=f"The likely cause is its memory: it reached its limit of {k.memory_limit}"
                          + (f" (its request is {k.memory_request})" if k.memory_request else "") + ".",
                     evidence=has(d, "kill.memory"))
    if k.kind is KillKind.LIVENESS and (k.probe or k.messages):
        return Claim(text=f"Its liveness probe failed ({k.probe_words or 'the events say so'})"
                          + (f": {'; '.join(k.messages)}" if k.messages else "") + ".",
                     evidence=has(d, "kill.probe", "kill.events"))
    if k.kind is KillKind.EVICTED and k.usage:
        return Claim(text=f"The kubelet said: {k.usage}", evidence=has(d, "kill.memory"))
    if k.kind is KillKind.SENT:
        return Claim(text=f"No instruction of the process faulted: {k.signal} came from "
                          f"{k.sender or 'another process'}.", evidence=has(d, "kill", "core"))
    return None


def _claims(g: Grounds, d: Decision) -> list[Claim]:
    f, k = g.f, _kill(g)
    beside = len(d.causes) > 1  # a second cause, beside a crash the other cause's claims say
    no_core = "; a kill writes no core" if k.kind is not KillKind.SENT else ""
    head = f"Besides, {_who(f, k)} was {k.words}{no_core}." if beside else \
        f"Not a crash: {_who(f, k)} was {k.words}{no_core}."
    out = [Claim(text=head, evidence=has(d, "kill"))]
    why = _cause_claim(g, d, k)
    if why is not None and why.evidence:
        out.append(why)
    out.append(Claim(text=f"The team stops what killed it first ({k.kind.sender}): nothing of the kill is filed "
                          "upstream." if beside else
                          f"Nothing is filed upstream: the team stops what killed it ({k.kind.sender}).",
                     evidence=has(d, "kill")))
    return out


def _title(f: Facts, d: Decision) -> str:
    k = f.kill
    if k is None:  # (the class holds only with one)
        return f"{process_name(f)}: {d.words}"
    return f"{_who(f, k)} {k.words}: " + (d.words if len(d.causes) > 1 else "a kill, not a crash")


def _says(g: Grounds) -> str:
    return f"a kill: {_kill(g).words}"


RULE = IncidentRule(
    incident=IncidentClass.KILL, words="a kill: the process was stopped from outside, not a crash",
    criteria=(Criterion(rank=55, test=_decides),), routes=_routes, steps=_steps, claims=_claims,
    titles={ReportTemplate.RUNBOOK: _title}, accompanies=_accompanies, fix_order=0, says=_says,
    first_because="a process that keeps being killed restarts before any fix of what else is wrong can be seen "
                  "working")
