"""Signals told by their origin, faults by their si_code read with their signal (issue #38 item 2).

Real kernel cores: a sleeping interpreter killed by this test with ``kill -SEGV`` / ``kill -ABRT`` (with and
without faulthandler), against crashes that must stay crashes (an assertion, a double free, a NULL write that
faulthandler raised again); C and Python recursion on a 256 KiB thread stack; a file mapping read past the end of
its truncated file (tests/crashers/overflow.py).
"""
from __future__ import annotations

import mmap
import os
import signal

import pytest

from forensics.analyze import analyze_core
from forensics.analyze.batch import group_entries
from forensics.views.signature import exit_explanation, signature
from forensics.model import BatchEntry, CrashKind, FaultKind, HandlerKind, SignalOrigin
from forensics.text.analysis import format_batch
from tests.crashers.make_core import HERE, make_killed_core

OVERFLOW = HERE / "overflow.py"


@pytest.fixture(scope="module")
def killed(cores, newest_python):
    """Cores of the newest interpreter here, sleeping, killed by this process: (signal, faulthandler) -> core."""
    made = {}

    def get(signo: int, faulthandler: bool = False):
        if (signo, faulthandler) not in made:
            env = {"PYTHONFAULTHANDLER": "1" if faulthandler else ""}
            made[signo, faulthandler] = make_killed_core(cores.base, cores.interpreter(newest_python).python, signo,
                                                         env=env)
        return made[signo, faulthandler]

    return get


@pytest.mark.parametrize("signo", [signal.SIGSEGV, signal.SIGABRT], ids=["kill-SEGV", "kill-ABRT"])
def test_a_signal_another_process_sent_is_no_crash(killed, signo):
    # GIVEN a sleeping interpreter this test killed with kill(2)
    a = analyze_core(str(killed(signo)))
    crash = a.crash
    # THEN the signal is told by its origin: sent, by this pid and uid, with kill(2) (SI_USER)
    assert (crash.kind, crash.origin) == (CrashKind.SENT_SIGNAL, SignalOrigin.SENT), crash
    assert crash.sender is not None and (crash.sender.pid, crash.sender.uid, crash.sender.code) == \
        (os.getpid(), os.getuid(), 0)
    assert crash.fault_address is None and crash.fault_kind is None
    # no crash: no crash class, no fingerprint, the exit explained as a kill
    assert not a.is_crash and a.fingerprint is None and a.fingerprint_basis == ()
    name = signal.Signals(signo).name
    sig = signature(a)
    assert sig.startswith(f"{name} sent by pid {os.getpid()} (uid {os.getuid()}) with kill(2) [sent-signal]: "
                          "not a crash; thread \"MainThread\" tid"), sig
    assert "sleep" in sig  # where it was: in time.sleep
    assert exit_explanation(a).startswith(f"exit status {128 + signo} ({name}): killed, not crashed -- pid "
                                          f"{os.getpid()} (uid {os.getuid()}) sent it with kill(2)")
    assert [f.rule for f in a.findings if f.rule == "signal-sent"] == ["signal-sent"]


def test_a_signal_faulthandler_raised_again_from_a_system_call_is_sent(killed):
    # GIVEN a sleeping interpreter with faulthandler on, killed with kill -SEGV: faulthandler's handler takes no
    # siginfo (the sender is not in the core), prints the tracebacks and raises SIGSEGV again (SI_TKILL, its own pid)
    a = analyze_core(str(killed(signal.SIGSEGV, faulthandler=True)))
    crash = a.crash
    # THEN the thread was in a system call when the signal came: no instruction of it faulted -- sent, sender unknown
    assert (crash.kind, crash.origin, crash.sender) == (CrashKind.SENT_SIGNAL, SignalOrigin.SENT, None), crash
    assert crash.handler is not None and crash.handler.kind is HandlerKind.FAULTHANDLER
    assert a.fingerprint is None
    assert signature(a).startswith("SIGSEGV sent by another process (which one the core cannot say: its handler "
                                   "faulthandler took no siginfo) [sent-signal]: not a crash")


@pytest.mark.parametrize("mode,kind,origin", [
    ("assert", CrashKind.ABORT, SignalOrigin.SELF),
    ("double-free-small", CrashKind.HEAP_CORRUPTION, SignalOrigin.SELF),
    ("null-faulthandler", CrashKind.SEGV, SignalOrigin.FAULT),
])
def test_crashes_stay_crashes(same_bug, newest_python, mode, kind, origin):
    # GIVEN an assertion (abort(): SIGABRT, SI_TKILL, its own pid), a double free (glibc's abort) and a NULL write
    # that faulthandler handled and raised again (SIGSEGV, SI_TKILL, its own pid)
    a = same_bug.analysis(newest_python, mode.removesuffix("-faulthandler"), faulthandler=mode.endswith("faulthandler"))
    # THEN each stays the crash it is, with its fingerprint
    assert (a.crash.kind, a.crash.origin, a.crash.sender) == (kind, origin, None), a.crash
    assert a.is_crash and a.fingerprint is not None
    assert "sent" not in signature(a)


def test_a_batch_counts_kills_apart_from_crashes(same_bug, killed, newest_python):
    # GIVEN a batch of one crash and two kills
    crash_core = same_bug.core(newest_python, "assert")
    entries = [BatchEntry(path=str(p), mtime=1.0, analysis=analyze_core(str(p)), error=None)
               for p in (crash_core, killed(signal.SIGSEGV), killed(signal.SIGABRT))]
    result = group_entries(entries)
    # THEN the kills are listed apart, not as bugs
    assert result.bugs == 1 and len(result.sent) == 2
    lines = list(format_batch(result))
    assert lines[0] == ("3 inputs: 1 core analyzed (0 partial), 1 distinct crash, 0 unreadable, 2 signals sent by "
                        "other processes (no crash), 0 files skipped (not cores)"), lines[0]
    assert lines[1].startswith("Found 1 bug (distinct fingerprints)"), lines[1]
    apart = lines[lines.index("Signals sent by other processes (killed, no crash, no fingerprint):") + 1:]
    assert f"SIGSEGV sent by pid {os.getpid()} (uid {os.getuid()}) with kill(2)" in apart[0]
    assert f"SIGABRT sent by pid {os.getpid()} (uid {os.getuid()}) with kill(2)" in apart[1]


@pytest.mark.parametrize("mode", ["c-recursion", "py-recursion"])
def test_recursion_on_a_small_thread_stack_is_a_stack_overflow(same_bug, newest_python, mode):
    # GIVEN C recursion, and Python recursion through a C builtin, on a thread whose stack is 256 KiB
    a = same_bug.analysis(newest_python, mode, script=OVERFLOW)
    crash = a.crash
    # THEN the fault in the guard page under the stack, beside the stack pointer, is a stack overflow
    assert (crash.kind, crash.fault_kind) == (CrashKind.SEGV, FaultKind.STACK_OVERFLOW), crash
    core = a.snapshot.core
    guard = core.find_mapping(crash.fault_address)
    stack = next(m for m in core.mappings if m.start == guard.end)  # what the kernel mapped right above the guard
    assert guard.perms.startswith("---") and "w" in stack.perms  # glibc's guard page under the thread's stack
    assert stack.size <= 256 * 1024
    sp = next(t.sp for t in core.threads if t.tid == crash.tid)
    assert abs(sp - crash.fault_address) < 4096
    assert "(stack-overflow)" in signature(a) and "not-writable" not in signature(a)
    # and the finding summarises what repeated on it
    (finding,) = [f for f in a.findings if f.rule == "stack-overflow"]
    if mode == "c-recursion":
        assert "C recursion: forensics_recurse (libcrash.so) called itself" in finding.summary, finding.summary
    else:
        assert "Python recursion: descend (overflow.py) called itself" in finding.summary, finding.summary
        assert 'thread "descender"' in finding.summary


def test_a_truncated_memmap_is_a_sigbus_past_the_end_of_the_named_file(same_bug, newest_python):
    # GIVEN a file of 2 pages mapped whole, truncated to 1 page, its second page read
    a = same_bug.analysis(newest_python, "memmap", script=OVERFLOW)
    core_path = same_bug.core(newest_python, "memmap", script=OVERFLOW)
    crash = a.crash
    # THEN a SIGBUS (BUS_ADRERR, si_code 2: not SEGV_ACCERR's "not-writable") past the end of the named file
    assert (crash.kind, crash.fault_kind) == (CrashKind.BUS, FaultKind.PAST_END_OF_FILE), crash
    data = core_path.parent / "samples.dat"
    assert os.path.getsize(data) == mmap.PAGESIZE  # the oracle: the file the process truncated
    sig = signature(a)
    assert f"(past-end-of-file: byte {mmap.PAGESIZE + 16:#x} of {data})" in sig, sig
    (finding,) = [f for f in a.findings if f.rule == "bus-past-end-of-file"]
    assert str(data) in finding.summary and f"byte {mmap.PAGESIZE + 16:,}" in finding.summary


def test_the_previous_definitions_keep_their_fault_words(same_bug, newest_python, cores):
    # GIVEN the faults whose kind has a new name (a guard page's "no-access"/"stack-overflow", SIGBUS's own codes)
    for a in (same_bug.analysis(newest_python, "c-recursion", script=OVERFLOW),
              same_bug.analysis(newest_python, "memmap", script=OVERFLOW)):
        # THEN the previous fingerprint definition still reads them with SIGSEGV's codes, as it did
        assert "fault:not-writable" in a.fingerprint_v3_basis, a.fingerprint_v3_basis
        # and the new definition names the kind
        assert f"fault:{a.crash.fault_kind.value}" in a.fingerprint_basis
