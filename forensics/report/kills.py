"""A process stopped from outside, as the evidence shows it (:class:`Kill`): the kernel's OOM killer at the
container's memory limit, the kubelet's eviction or its kill after a failed liveness probe, a signal another
process sent (the core's siginfo), or an exit status that says a signal (137 = 128 + SIGKILL, 143 = 128 +
SIGTERM) with no reason given.  No core is written for most of them: a kill is not a crash.

Pure: the analysis, the capture bundles and the fleet summaries in (:func:`read_kill`), :class:`Kill` or None
out.  The core's own word comes first (who sent its signal), then a pod's last termination and events, then the
fleet's counts.
"""
from __future__ import annotations

import enum

from ..bundle.documents import CaptureDocuments, ContainerSpec, PodContainer, PodEvent, ProbeSpec
from ..fleet.model import FleetSummary
from ..model import Analysis
from ..records import record

__all__ = ["KillKind", "Kill", "read_kill", "KILL_EXIT_CODES"]

#: the exit statuses of a process killed by a signal it did not catch: 128 + SIGKILL, 128 + SIGTERM
KILL_EXIT_CODES = {137: "SIGKILL", 143: "SIGTERM"}


class KillKind(enum.Enum):
    """Who stopped the process, as far as the evidence says."""

    OOM = "oom-killed"  # the kernel's OOM killer, at the container's memory limit (the kubelet's OOMKilled)
    EVICTED = "evicted"  # the kubelet evicted the pod (the node was short of memory, disk or PIDs)
    LIVENESS = "liveness-probe"  # the kubelet killed the container after its liveness probe failed
    SENT = "signal-sent"  # another process sent the signal (the core's si_code and si_pid)
    SIGNALED = "killed"  # an exit status that says a signal (137, 143), and no reason given

    @property
    def sender(self) -> str:
        """The likely sender, in words."""
        return {KillKind.OOM: "the kernel's OOM killer", KillKind.EVICTED: "the kubelet (an eviction)",
                KillKind.LIVENESS: "the kubelet (a failed liveness probe)", KillKind.SENT: "another process",
                KillKind.SIGNALED: "a signal from outside (its sender is not in the evidence)"}[self]


@record
class Kill:
    """The kill: how (``kind``), the signal and exit status, who sent it, where it ran, and what the evidence says
    of the likely cause -- the memory limit and request, what it used, the liveness probe's timings, the events."""

    kind: KillKind
    source: str  # what says so: "the core's siginfo", "the pod's last termination", "the fleet"
    signal: str | None = None
    exit_code: int | None = None
    sender: str | None = None  # "pid 4242 (uid 1000) with kill(2)"
    sender_pid: int | None = None
    pod: str | None = None  # "namespace/name"
    container: str | None = None
    owner: str | None = None  # "daemonset/exporter": what to change
    memory_limit: str | None = None
    memory_request: str | None = None
    usage: str | None = None  # what it used, where the evidence says (an eviction's message)
    probe: ProbeSpec | None = None
    messages: tuple[str, ...] = ()  # the events that tell it, "Reason: message"
    pods: int | None = None  # the fleet: pods whose last exit was this

    @property
    def words(self) -> str:
        """The kill in a phrase: ``OOM-killed by the kernel at its memory limit of 64Mi (exit 137, SIGKILL)``."""
        status = ", ".join(x for x in (f"exit {self.exit_code}" if self.exit_code is not None else "",
                                        self.signal or "") if x)
        status = f" ({status})" if status else ""
        if self.kind is KillKind.OOM:
            limit = f" at its memory limit of {self.memory_limit}" if self.memory_limit else " at its memory limit"
            return f"OOM-killed by the kernel{limit}{status}"
        if self.kind is KillKind.EVICTED:
            return f"evicted by the kubelet{status}"
        if self.kind is KillKind.LIVENESS:
            return f"killed by the kubelet after its liveness probe failed{status}"
        if self.kind is KillKind.SENT:
            return (f"killed by {self.signal or 'a signal'}, sent by {self.sender or 'another process'}"
                    + (f" (exit {self.exit_code})" if self.exit_code is not None else ""))
        return f"killed by {self.signal or 'a signal'} from outside" + (
            f" (exit {self.exit_code})" if self.exit_code is not None else "")

    @property
    def probe_words(self) -> str | None:
        """``HTTP GET /healthz on port metrics, every 10 s, 1 s to answer, 3 failures in a row`` (the API's
        defaults where the spec sets none)."""
        p = self.probe
        if p is None:
            return None
        return (f"{p.action}, every {p.period or 10} s, {p.timeout or 1} s to answer, {p.failures or 3} failures in a "
                f"row, first after {p.initial_delay or 0} s")


def read_kill(a: Analysis | None, caps: list[CaptureDocuments], fleets: list[FleetSummary]) -> Kill | None:
    """The kill the evidence shows (see the module docstring for the order); None when it shows none."""
    if a is not None and a.crash.is_sent:
        return _sent(a)
    for cap in caps:
        kill = _from_pod(cap)
        if kill is not None:
            return kill
    for fleet in fleets:
        kill = _from_fleet(fleet)
        if kill is not None:
            return kill
    return None


def _sent(a: Analysis) -> Kill:
    crash = a.crash
    sender = crash.sender
    return Kill(kind=KillKind.SENT, source="the core's siginfo (si_code, si_pid, si_uid)", signal=crash.signal_name,
                exit_code=crash.exit_status,
                sender=f"{sender.label} with {sender.call}" if sender is not None else None,
                sender_pid=sender.pid if sender is not None else None)


def _kind_of(c: PodContainer, cap: CaptureDocuments) -> KillKind | None:
    """How the pod's container was stopped, by its last termination, the pod's status and its events."""
    text = " ".join(f"{e.reason} {e.message}" for e in cap.events)
    if c.last_reason == "OOMKilled":
        return KillKind.OOM
    if cap.pod.reason == "Evicted" or any(e.reason == "Evicted" for e in cap.events):
        return KillKind.EVICTED
    if "liveness probe" in text.lower() and any(e.reason in ("Killing", "Unhealthy") for e in cap.events):
        return KillKind.LIVENESS
    if c.last_exit_code in KILL_EXIT_CODES:
        return KillKind.SIGNALED
    return None


def _events_of(kind: KillKind, events: tuple[PodEvent, ...]) -> tuple[str, ...]:
    wanted = {KillKind.OOM: ("OOMKilling", "OOMKilled", "Killing"), KillKind.EVICTED: ("Evicted", "Killing"),
              KillKind.LIVENESS: ("Unhealthy", "Killing")}.get(kind, ("Killing",))
    return tuple(f"{e.reason}: {e.message}" + (f" ({e.count} times)" if e.count and e.count > 1 else "")
                 for e in events if e.reason in wanted and e.message)[-5:]


def _from_pod(cap: CaptureDocuments) -> Kill | None:
    pod = cap.scheduling.pod
    # an evicted pod's containers may be gone from its status: the pod's own reason still says it
    for c in pod.containers or ((PodContainer(),) if cap.pod.reason == "Evicted" else ()):
        kind = _kind_of(c, cap)
        if kind is None:
            continue
        spec = next((s for s in cap.pod.containers if s.name == c.name), ContainerSpec())
        usage = cap.pod.message if kind is KillKind.EVICTED else None
        return Kill(kind=kind, source="the pod's last termination, status and events (capture --pod)",
                    signal=KILL_EXIT_CODES.get(c.last_exit_code or 0), exit_code=c.last_exit_code,
                    pod=f"{pod.namespace}/{pod.name}" if pod.name else None, container=c.name, owner=cap.pod.owner,
                    memory_limit=spec.memory_limit, memory_request=spec.memory_request, usage=usage,
                    probe=spec.liveness, messages=_events_of(kind, cap.events))
    return None


def _from_fleet(fleet: FleetSummary) -> Kill | None:
    oom = sum(g.reasons.get("OOMKilled", 0) for g in fleet.groups)
    evicted = sum(g.reasons.get("Evicted", 0) for g in fleet.groups)
    killed = {code: sum(g.exit_codes.get(str(code), 0) for g in fleet.groups) for code in KILL_EXIT_CODES}
    source = "the fleet's last terminations (fleet)"
    if oom:
        return Kill(kind=KillKind.OOM, source=source, signal="SIGKILL", exit_code=137, pods=oom)
    if evicted:
        return Kill(kind=KillKind.EVICTED, source=source, pods=evicted)
    for code, n in killed.items():
        if n:
            return Kill(kind=KillKind.SIGNALED, source=source, signal=KILL_EXIT_CODES[code], exit_code=code, pods=n)
    return None
