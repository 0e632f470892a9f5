"""snapshot -> analysis: the crash, its fingerprint and the findings an on-call engineer reads (``analyze``'s judge),
and the heap's findings once glibc's heap was read.

Public through :mod:`forensics.analyze` (``analyze_snapshot``, ``check_snapshot``, ``check_nested_faults``,
``heap_findings``).
"""
from __future__ import annotations

import dataclasses

from ..model import Analysis, Crash, CrashKind, Finding, HeapReport, LibraryStatus, ProcessSnapshot, Severity
from .classify import classify_crash, is_python_process
from .memfaults import check_past_end_of_file, check_stack_overflow
from .fingerprint import FINGERPRINT_VERSION, fingerprint, fingerprint_basis, fingerprint_basis_v3

__all__ = ["analyze_snapshot", "check_snapshot", "check_nested_faults", "heap_findings", "with_fingerprint"]


def check_snapshot(snapshot: ProcessSnapshot, crash: Crash) -> tuple[Finding, ...]:
    """Findings an on-call engineer should read, each with its evidence."""
    core = snapshot.core
    out: list[Finding] = []
    # the first fault's thread, judged by what ran before any signal handler (a crash reporter's
    # handler on top is not where the crash happened)
    crashed = next((t for t in snapshot.threads if t.tid == crash.tid), None) if crash.tid is not None else None
    if crash.kind is CrashKind.HEAP_CORRUPTION:
        out.append(
            Finding(
                rule="heap-corruption-detected-late",
                severity=Severity.WARNING,
                summary="glibc found the heap corrupted when this thread freed or allocated memory; "
                "the code that overwrote the heap may have run earlier, elsewhere",
                evidence=tuple(x for x in (crash.abort_message,) if x),
                tid=crash.tid,
            )
        )
    if crash.is_sent:
        who = f"{crash.sender.label} with {crash.sender.call}" if crash.sender is not None else "another process"
        out.append(Finding(
            rule="signal-sent", severity=Severity.WARNING,
            summary=(f"{crash.signal_name} was sent by {who} and ended the process (a watchdog's, an operator's or "
                     f"the container runtime's kill): no instruction of it faulted, and the stacks say only where "
                     f"each thread was"),
            evidence=(f"si_code {_code(crash)}, si_pid {crash.sender.pid if crash.sender else '?'}, si_uid "
                      f"{crash.sender.uid if crash.sender and crash.sender.uid is not None else '?'}",),
            tid=crash.tid))
    out.extend(f for f in (check_stack_overflow(snapshot, crash), check_past_end_of_file(snapshot, crash))
               if f is not None)
    out.extend(check_nested_faults(snapshot, crash))
    if core.nvml is not None:
        out.append(
            Finding(
                rule="nvml-library",
                severity=Severity.INFO,
                summary=f"libnvidia-ml loaded: {core.nvml.path} (driver {core.nvml.driver_version or 'unknown'})",
                evidence=(f"build-id {core.nvml.build_id or 'unknown'}",),
            )
        )
        if crashed is not None and any("libnvidia-ml" in (f.library_name or "")
                                       for f in crashed.interrupted_native_frames):
            out.append(
                Finding(
                    rule="crash-inside-nvml",
                    severity=Severity.WARNING,
                    summary="the crashing thread was inside libnvidia-ml when it died",
                    tid=crashed.tid,
                )
            )
    for lib in core.libraries:
        if lib.status in (LibraryStatus.MISMATCH, LibraryStatus.MISSING):
            out.append(
                Finding(
                    rule=f"library-{lib.status.value}",
                    severity=Severity.WARNING,
                    summary=f"{lib.path}: {lib.status.value}",
                    evidence=(f"core build-id {lib.build_id}", f"file {lib.file_path} build-id {lib.file_build_id}"),
                )
            )
    if snapshot.native_disagreements:
        out.append(
            Finding(
                rule="native-methods-disagree",
                severity=Severity.ERROR,
                summary="libdw and gdb give different native stacks",
                evidence=snapshot.native_disagreements,
            )
        )
    if snapshot.method_disagreements:
        out.append(
            Finding(
                rule="python-methods-disagree",
                severity=Severity.ERROR,
                summary="the gdb walker and the direct reader give different Python stacks",
                evidence=snapshot.method_disagreements,
            )
        )
    if core.problems:
        out.append(Finding(rule="core-malformed", severity=Severity.ERROR,
                           summary="the core has malformed or unreadable parts; what they held is missing",
                           evidence=core.problems))
    if core.truncated:
        out.append(
            Finding(
                rule="core-truncated",
                severity=Severity.ERROR,
                summary=f"core truncated at {core.size} of {core.expected_size} bytes",
            )
        )
    return tuple(out)


def _code(crash: Crash) -> str:
    return str(crash.sender.code) if crash.sender is not None else "?"


def check_nested_faults(snapshot: ProcessSnapshot, crash: Crash) -> list[Finding]:
    """Findings about a fault after the first one (a crash reporter's handler, another thread) and about
    handlers that ran: why the exit status is what it is, and which thread came first."""
    from ..views.signature import describe_thread

    out: list[Finding] = []
    then = crash.then
    frames = [sf for t in snapshot.threads for sf in t.signal_frames]
    evidence = tuple(
        f"tid {t.tid}: {sf.signal.name} delivered at 0x{sf.address:x} (interrupted at 0x{sf.pc:x}"
        f"{', on the alternate signal stack' if sf.alternate_stack else ''}; signal from {sf.signal_source})"
        for t in snapshot.threads for sf in t.signal_frames
    )
    if then is not None and then.handler is not None:
        out.append(Finding(
            rule="fault-in-signal-handler", severity=Severity.WARNING,
            summary=(f"the {then.handler.signal_name} handler {then.handler.label} faulted ({then.signal_name}) "
                     f"while the process was dying of its first fault ({crash.kind.value}): investigate the first "
                     f"fault; the handler's fault turned exit status {128 + (crash.signal or 0)} into "
                     f"{128 + then.signal}"),
            evidence=evidence, tid=then.tid))
    elif then is not None:
        threads = {t.tid: t for t in snapshot.threads}
        first = describe_thread(threads[crash.tid]) if crash.tid in threads else "a thread the core does not name"
        late = describe_thread(threads[then.tid]) if then.tid in threads else f"tid {then.tid}"
        out.append(Finding(
            rule="fault-order", severity=Severity.WARNING,
            summary=(f"{first} came first: glibc had written its heap-corruption message (the thread was in its "
                     f"abort path) when {late} received the fatal {then.signal_name}"),
            evidence=tuple(x for x in (crash.abort_message,) if x), tid=crash.tid))
    elif crash.handler is not None and crash.is_sent:
        out.append(Finding(
            rule="signal-handler-ran", severity=Severity.INFO,
            summary=(f"the {crash.handler.signal_name} handler {crash.handler.label} ran and raised "
                     f"{crash.signal_name} again: the process ended on the signal it was sent"),
            evidence=evidence, tid=crash.tid))
    elif crash.handler is not None:
        out.append(Finding(
            rule="signal-handler-ran", severity=Severity.INFO,
            summary=(f"the {crash.handler.signal_name} handler {crash.handler.label} ran and re-raised "
                     f"{crash.signal_name}: the crash is the first fault, unchanged"),
            evidence=evidence, tid=crash.tid))
    elif frames:
        out.append(Finding(rule="signal-handler-running", severity=Severity.INFO,
                           summary="a signal handler was running when the process died", evidence=evidence))
    return out


def analyze_snapshot(snapshot: ProcessSnapshot) -> Analysis:
    """Judge a snapshot: the crash (its first fault), its fingerprint, the findings.  A heap abort's
    fingerprint is made again once its heap is read (:func:`with_fingerprint`)."""
    crash = classify_crash(snapshot.core, snapshot.threads, python_process=is_python_process(snapshot.core))
    return with_fingerprint(Analysis(snapshot=snapshot, crash=crash, fingerprint=None, fingerprint_basis=(),
                                     findings=check_snapshot(snapshot, crash)))


def with_fingerprint(analysis: Analysis) -> Analysis:
    """The analysis with its fingerprint (:func:`~.fingerprint.fingerprint_basis`, read with its heap when it has
    one) and the previous definition's key beside it; none for a snapshot or a signal another process sent."""
    snapshot, crash = analysis.snapshot, analysis.crash
    if crash.kind in (CrashKind.SNAPSHOT, CrashKind.SENT_SIGNAL):  # no crash: no crash fingerprint
        return dataclasses.replace(analysis, fingerprint=None, fingerprint_basis=(), fingerprint_partial=None,
                                   fingerprint_version=None, fingerprint_v3=None, fingerprint_v3_basis=())
    basis, partial = fingerprint_basis(snapshot, crash, analysis.heap)
    basis_v3, _ = fingerprint_basis_v3(snapshot, crash)
    return dataclasses.replace(analysis, fingerprint=fingerprint(basis), fingerprint_basis=basis,
                               fingerprint_partial=partial, fingerprint_version=FINGERPRINT_VERSION,
                               fingerprint_v3=fingerprint(basis_v3), fingerprint_v3_basis=basis_v3)


def heap_findings(report: HeapReport, tid: int | None) -> tuple[Finding, ...]:
    """The heap's findings: the buffer that overflowed and who wrote past it; why the heap was not read."""
    out = []
    c = report.corruption
    if c is not None and c.overflowed is not None:
        where = f"the chunk at 0x{c.overflowed.address:x} (usable {c.usable_size} bytes)"
        if c.owner is not None:
            where = f"{c.owner.name} ({c.owner.object.type_name}, {c.owner.object.size} bytes)" + (
                f" in {c.owner.function}" if c.owner.function else "")
        length = f"{'' if c.overflow_exact else 'at least '}{c.overflow_length} bytes"
        out.append(Finding(
            rule="heap-buffer-overflow",
            severity=Severity.ERROR,
            summary=f"{where} was written {length} past its end, over the header glibc rejected",
            evidence=(f"verdict: {c.verdict.value}: {c.verdict_reason}", *c.inconsistencies),
            tid=tid,
        ))
    elif c is not None and c.rejected is not None:
        out.append(Finding(rule="heap-chunk-rejected", severity=Severity.ERROR,
                           summary=f"glibc rejected the chunk at 0x{c.rejected.address:x}: {c.check}",
                           evidence=c.inconsistencies + c.problems, tid=tid))
    for problem in report.problems:
        out.append(Finding(rule="heap-unreadable", severity=Severity.WARNING, summary=problem))
    return tuple(out)
