"""A fault's kind from its si_code read with its signal, a signal's origin, and the agent's series for kills and
renamed fingerprints (issue #38 item 2), on hand-built records; the real cores are
tests/integration/test_signal_origin.py's."""
from __future__ import annotations

import signal

import pytest

from forensics.analyze.classify import classify_fault_address, is_stack_overflow, signal_origin
from forensics.bundle.record import CoreState
from forensics.agent.nodeindex import CrashEntry, _previous_fingerprint, group_crashes
from forensics.model import CoreFile, FaultKind, Mapping, SigInfo, SignalOrigin, SignalSender

PAGE = 0x1000
GUARD = Mapping(start=0x7F00_0000_0000, end=0x7F00_0000_1000, offset=0, perms="---p", path=None)
STACK = Mapping(start=0x7F00_0000_1000, end=0x7F00_0004_1000, offset=0, perms="rw-p", path=None)
TEXT = Mapping(start=0x40_0000, end=0x40_2000, offset=0, perms="r-xp", path="/usr/bin/prog")
RODATA = Mapping(start=0x40_2000, end=0x40_3000, offset=0x2000, perms="r--p", path="/usr/bin/prog")
DATAFILE = Mapping(start=0x7F10_0000_0000, end=0x7F10_0000_2000, offset=0, perms="r--s", path="/data/samples.dat")
MAIN_STACK = Mapping(start=0x7FFF_F000_0000, end=0x7FFF_F002_0000, offset=0, perms="rw-p", path=None)


def core(*mappings: Mapping) -> CoreFile:
    return CoreFile(path="core", size=0, pid=4242, command="", args="", executable=None, build_id=None, signal=None,
                    threads=(), mappings=tuple(sorted(mappings, key=lambda m: m.start)), libraries=(), nvml=None,
                    abort_message=None, truncated=False, expected_size=0)


C = core(GUARD, STACK, TEXT, RODATA, DATAFILE, MAIN_STACK)


@pytest.mark.parametrize("signo,code,addr,sp,kind", [
    # SIGSEGV: SEGV_ACCERR in a readable mapping is a write; in a PROT_NONE one, no access at all
    (signal.SIGSEGV, 2, RODATA.start + 8, None, FaultKind.NOT_WRITABLE),
    (signal.SIGSEGV, 2, GUARD.start + 8, None, FaultKind.NO_ACCESS),
    (signal.SIGSEGV, 1, 0x10, None, FaultKind.NEAR_NULL),
    (signal.SIGSEGV, 1, 0x1234_5678_0000, None, FaultKind.UNMAPPED),
    # the guard page under a thread's stack with the stack pointer beside it: a stack overflow
    (signal.SIGSEGV, 2, GUARD.end - 8, GUARD.end, FaultKind.STACK_OVERFLOW),
    # the gap under a growing stack (the main thread's), the stack pointer beside it
    (signal.SIGSEGV, 1, MAIN_STACK.start - 0x20, MAIN_STACK.start - 0x10, FaultKind.STACK_OVERFLOW),
    # the same addresses with the stack pointer far away: no overflow
    (signal.SIGSEGV, 2, GUARD.end - 8, STACK.end - 8, FaultKind.NO_ACCESS),
    (signal.SIGSEGV, 1, MAIN_STACK.start - 0x20, MAIN_STACK.end - 8, FaultKind.UNMAPPED),
    # SIGBUS's codes are its own: BUS_ADRERR (2, SEGV_ACCERR's number) in a file mapping is past its file's end
    (signal.SIGBUS, 2, DATAFILE.start + PAGE + 16, None, FaultKind.PAST_END_OF_FILE),
    (signal.SIGBUS, 1, STACK.start + 3, None, FaultKind.MISALIGNED),
    (signal.SIGBUS, 3, DATAFILE.start, None, FaultKind.HARDWARE_ERROR),
    (signal.SIGBUS, 4, DATAFILE.start, None, FaultKind.HARDWARE_ERROR),
])
def test_a_faults_kind_is_read_from_its_code_with_its_signal(signo, code, addr, sp, kind):
    assert classify_fault_address(C, addr, code, pc=TEXT.start, signo=signo, sp=sp) is kind


def test_a_guard_page_is_a_stack_overflow_only_right_under_a_writable_mapping():
    # a PROT_NONE mapping with nothing writable right above it (a reserved region, not a stack's guard)
    lone = core(Mapping(start=0x7F20_0000_0000, end=0x7F20_0000_1000, offset=0, perms="---p", path=None))
    assert not is_stack_overflow(lone, 0x7F20_0000_0F00, 0x7F20_0000_0F08)
    assert is_stack_overflow(C, GUARD.start + 0x10, GUARD.start + 0x18)


@pytest.mark.parametrize("code,pid,origin", [
    (0, 77, SignalOrigin.SENT),  # kill(2) from another process
    (-6, 77, SignalOrigin.SENT),  # tgkill(2)
    (-1, 77, SignalOrigin.SENT),  # sigqueue(3)
    (0, 0, SignalOrigin.SENT),  # a process outside the PID namespace (the container runtime)
    (-6, 4242, SignalOrigin.SELF),  # abort(), raise(), faulthandler's re-raise
    (0, 4242, SignalOrigin.SELF),  # os.kill(os.getpid(), ...)
    (1, None, SignalOrigin.FAULT),  # the kernel, for the thread's own instruction
    (0x80, None, SignalOrigin.FAULT),  # SI_KERNEL
    (-2, None, SignalOrigin.UNKNOWN),  # SI_TIMER: no sender pid
])
def test_a_signals_origin(code, pid, origin):
    info = SigInfo(signo=11, code=code, errno=0, name="SIGSEGV", sender_pid=pid, sender_uid=1000 if pid else 0)
    got, sender = signal_origin(info, 4242)
    assert got is origin
    assert (sender is not None) == (origin is SignalOrigin.SENT)
    if sender is not None:
        assert (sender.pid, sender.uid, sender.code) == (pid, 1000 if pid else 0, code)


def test_a_sender_is_named_with_its_call():
    assert SignalSender(pid=77, uid=1000, code=0).label == "pid 77 (uid 1000)"
    assert [SignalSender(pid=1, uid=0, code=c).call for c in (0, -6, -1)] == ["kill(2)", "tgkill(2)", "sigqueue(3)"]
    assert SignalSender(pid=0, uid=0, code=0).label == "pid 0 (uid 0: a process outside its PID namespace)"


def entry(id: str, **kw) -> CrashEntry:
    fields = dict(id=id, path=f"/cores/crashes/{id}", time=100.0, signal=11, signal_name="SIGSEGV", pod_uid="u",
                  container_id="c", image="img", loop_key=None, core_state=CoreState.KEPT, in_progress=False,
                  not_kept=(), analysis="done", analysis_failure=None, fingerprint="0123456789ab",
                  fingerprint_source="analysis", signature="SIGSEGV ...", crash_class="segv", nvml_build_id=None,
                  driver=None, namespace="monitoring", pod="exporter-0", container="exporter", image_digest=None,
                  previous_fingerprint="ba9876543210")
    fields.update(kw)
    return CrashEntry(**fields)  # type: ignore[arg-type]


def test_the_agent_counts_kills_apart_and_exports_the_previous_key(tmp_path):
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from forensics.agent.serve import Agent, IndexCollector, ServeConfig

    # GIVEN two crashes of one bug and a kill (a signal another process sent) in the agent's index
    agent = Agent(ServeConfig(core_dir=str(tmp_path / "cores"), node="gpu-a", events=False))
    registry = CollectorRegistry()
    registry.register(IndexCollector(agent))
    kill = entry("k", fingerprint=None, fingerprint_source=None, crash_class="sent-signal", signal=6,
                 signal_name="SIGABRT", previous_fingerprint=None, sender_uid=0)
    agent.index = group_crashes([entry("a"), entry("b"), kill])
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    # THEN the crashes are counted with the previous definition's key beside the fingerprint
    crashes = [s for s in families["forensics_crashes"].samples if s.name == "forensics_crashes_total"]
    assert [(s.labels["fingerprint"], s.labels["previous_fingerprint"], s.value) for s in crashes] == \
        [("0123456789ab", "ba9876543210", 2.0)]
    # and the kill in a family of its own, never as a crash
    (sent,) = [s for s in families["forensics_signals_sent"].samples if s.name == "forensics_signals_sent_total"]
    assert sent.value == 1 and sent.labels == {"forensics_node": "gpu-a", "signal": "SIGABRT", "sender_uid": "0",
                                               "namespace": "monitoring", "pod": "exporter-0",
                                               "container": "exporter", "image_digest": ""}
    assert families["forensics_signals_sent"].type == "counter"
    assert set(agent.index.groups) == {"0123456789ab"}
    assert agent.index.as_document()["sent_signals"] == 1


def test_the_previous_key_follows_the_analysis_version():
    assert _previous_fingerprint({"fingerprint_version": 4, "fingerprint_v3": "a" * 12}) == "a" * 12
    # written before the version was carried: a version 3 analysis, whose previous key is fingerprint_v2
    assert _previous_fingerprint({"fingerprint": "b" * 12, "fingerprint_v2": "c" * 12}) == "c" * 12
    assert _previous_fingerprint({"fingerprint": "b" * 12}) is None
