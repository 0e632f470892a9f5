"""The fingerprint is "the same bug" (issue #27): one program, crashed under every CPython the suite has
(this machine's 3.8-3.13 and Debian unstable's 3.13-3.15, release and debug builds, in the sid root),
gives one fingerprint for each bug, and two bugs give two.

Real kernel cores of tests/crashers/same_bug.py: a method on a thread faulting in a native library
(3.11+ name its frames ``Poller.read_label``, ``Thread.run``; 3.8-3.10 ``read_label``, ``run``), a C
extension of the standard library faulting (``_ctypes.cpython-38-...so`` to ``_ctypes.cpython-315d-...so``),
a C assertion (glibc's message starts with argv[0]'s name: ``python3``, ``python3.14d``, a venv's
``python``), a native library's own thread faulting in one of two functions, and a NULL write with and
without faulthandler.
"""
from __future__ import annotations

import subprocess

import pytest

from forensics.analyze import analyze_core
from forensics.analyze.fingerprint import fingerprint, fingerprint_basis_v3
from forensics.views.signature import signature
from forensics.model import CrashKind, FaultKind, HandlerKind, LibraryStatus
from tests.conftest import PYTHONS, SAME_BUG


@pytest.fixture(scope="module")
def venv_python(same_bug, tmp_path_factory) -> str:
    """A venv of the newest interpreter here: its ``bin/python`` is what glibc's messages name."""
    newest = list(PYTHONS)[-1]
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([PYTHONS[newest], "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


EXPECTED = {
    "thread-method": ("pc:libcrash.so", "python:same_bug.py:read_label", "python:same_bug.py:poll",
                      "python:threading.py:run"),
    "c-extension": ("pc:_ctypes.so", "python:same_bug.py:read_counter"),
    "assert": ("abort:libcrash.c:<line>: forensics_assert: Assertion `channels > 0' failed.",
               "python:same_bug.py:check_channels"),
}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_one_bug_one_fingerprint_under_every_interpreter(same_bug, venv_python, mode):
    # GIVEN one bug crashed under every interpreter the suite has (and, for the newest here, from a venv)
    got = {key: same_bug.analysis(key, mode) for key in same_bug.keys}
    got["venv"] = same_bug.analysis(list(PYTHONS)[-1], mode, python=venv_python)
    # THEN each is the bug's class, read whole
    for key, a in got.items():
        assert a.crash.kind is (CrashKind.ABORT if mode == "assert" else CrashKind.SEGV), key
        assert a.fingerprint_partial is None, (key, a.fingerprint_partial)
    # and they have one fingerprint, whose basis names the bug without a version, tag or program name
    assert len({a.fingerprint for a in got.values()}) == 1, {k: a.fingerprint_basis for k, a in got.items()}
    basis = next(iter(got.values())).fingerprint_basis
    assert set(EXPECTED[mode]) <= set(basis), basis
    # the previous definition's key stays readable beside it, so a fleet can map its stored keys
    for a in got.values():
        assert a.fingerprint_v3 == fingerprint(fingerprint_basis_v3(a.snapshot, a.crash)[0])


@pytest.mark.parametrize("method", ["libdw", "gdb", "direct"])
def test_two_functions_of_a_native_librarys_thread_are_two_bugs(same_bug, method):
    # GIVEN a native library's own thread (no Python frames) faulting in one of two functions, near NULL
    # both times, under every interpreter, read by each native method
    kw = {"libdw": {}, "gdb": {"method": "gdb", "native_method": "gdb"}, "direct": {"method": "direct"}}[method]
    prints = {}
    for which, function in (("native-a", "forensics_poll_events"), ("native-b", "forensics_update_clocks")):
        got = {key: same_bug.analysis(key, which, **kw) for key in same_bug.keys}
        for key, a in got.items():
            assert a.fingerprint_partial is None, (key, a.fingerprint_partial)
            # THEN the basis holds the faulting function and the one below it
            assert a.fingerprint_basis[-2:] == (f"native:libcrash.so:{function}",
                                                "native:libcrash.so:forensics_native_worker"), a.fingerprint_basis
        # and one fingerprint per function, whatever the interpreter
        (prints[which],) = {a.fingerprint for a in got.values()}
    # and two functions are two bugs
    assert prints["native-a"] != prints["native-b"]


def test_faulthandler_on_and_off_give_one_fingerprint(same_bug):
    # GIVEN a write to address 0, with faulthandler (PYTHONFAULTHANDLER=1) and without, under every interpreter
    for key in same_bug.keys:
        plain = same_bug.analysis(key, "null")
        handled = same_bug.analysis(key, "null", faulthandler=True)
        assert "Fatal Python error: Segmentation fault" in \
            (same_bug.core(key, "null", faulthandler=True).parent / ".stderr").read_text()
        # THEN faulthandler's core is the same SIGSEGV at address 0 (near NULL), not an "unknown signal"
        crash = handled.crash
        assert (crash.kind, crash.signal_name, crash.fault_address, crash.fault_kind) == \
            (CrashKind.SEGV, "SIGSEGV", 0, FaultKind.NEAR_NULL), (key, crash)
        assert (plain.crash.fault_address, plain.crash.fault_kind) == (0, FaultKind.NEAR_NULL)
        # faulthandler is named as the handler that ran, and re-raised: no second fault
        assert crash.handler is not None and crash.handler.kind is HandlerKind.FAULTHANDLER, (key, crash.handler)
        assert crash.then is None
        # and the fingerprint is the one without faulthandler
        assert handled.fingerprint == plain.fingerprint and handled.fingerprint_partial is None, \
            (key, handled.fingerprint_basis, plain.fingerprint_basis)


def test_a_fault_inside_a_sigusr1_handler_is_the_handlers(same_bug):
    # GIVEN a SIGUSR1 handler (a reporter's "dump your state") that writes through NULL, run when
    # forensics_raise raised SIGUSR1, under every interpreter
    got = {key: same_bug.analysis(key, "usr1-handler") for key in same_bug.keys}
    for key, a in got.items():
        crash = a.crash
        # THEN the crash is the SIGSEGV, inside the SIGUSR1 handler, attributed to the handler's own frame
        assert (crash.kind, crash.fault_address, crash.then) == (CrashKind.SEGV, 0, None), (key, crash)
        assert crash.handling is not None and crash.handling.signal_name == "SIGUSR1"
        assert crash.handling.name == "forensics_on_usr1", crash.handling
        sig = signature(a)
        assert "in its SIGUSR1 handler forensics_on_usr1 (libcrash.so)" in sig, sig
        assert "forensics_raise" not in sig and "(the signal came at dump_state (same_bug.py:" in sig, sig
        # and the fingerprint says which signal was handled and whose frame faulted, not where it arrived
        assert a.fingerprint_basis[2] == "handling:SIGUSR1"
        assert a.fingerprint_basis[-1] == "native:libcrash.so:forensics_on_usr1", a.fingerprint_basis
        assert a.fingerprint_partial is None
    assert len({a.fingerprint for a in got.values()}) == 1


@pytest.mark.parametrize("scenario", ["ill", "fpe"])
def test_sigill_and_sigfpe_addresses_are_the_faulting_instruction(cores, newest_python, scenario):
    # GIVEN a ud2 (SIGILL, si_code ILL_ILLOPN: 2, SEGV_ACCERR's value) and a division by zero (SIGFPE)
    a = analyze_core(str(cores.get(newest_python, scenario)))
    crash = a.crash
    # THEN the address is called the faulting instruction's, not a data access ("not-writable", "mapped")
    assert crash.fault_address == a.snapshot.core.threads[0].pc
    assert crash.fault_kind is FaultKind.INSTRUCTION
    assert f"at 0x{crash.fault_address:x} (instruction)" in signature(a)
    # and no data-access word enters the fingerprint; the previous basis keeps its own word, readable
    assert "fault:instruction" in a.fingerprint_basis
    assert "fault:instruction" in a.fingerprint_v3_basis


def test_a_truncated_cores_hint_blames_the_truncation_and_shows_its_command_line_cut(same_bug, newest_python,
                                                                                     tmp_path):
    # GIVEN a core cut to a third (a size limit, a full disk), its process's command line longer than the
    # 80 bytes the core's process record keeps
    core = same_bug.core(newest_python, "thread-method")
    cut = tmp_path / "core.cut"
    with open(core, "rb") as f:
        cut.write_bytes(f.read(core.stat().st_size // 3))
    from click.testing import CliRunner

    from forensics.cli import cli

    r = CliRunner().invoke(cli, ["analyze", str(cut)], catch_exceptions=False)
    # THEN nothing blames debug symbols: what is missing is memory
    assert r.exit_code == 4, r.output
    assert "-dbg" not in r.output and "DWARF" not in r.output and "debug symbols" not in r.output, r.output
    assert "the core is truncated" in r.output
    # and the command line is shown as cut, not as if it were whole
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("Command:")]
    whole = f"{PYTHONS[newest_python]} {SAME_BUG} {same_bug.lib} thread-method"
    assert len(whole) > 80 and whole.startswith(line.split(None, 1)[1][:79])
    assert line.endswith("... (cut: the core's process record keeps 80 bytes, and the stack that holds the "
                         "whole line is not in the core)"), line


def test_abort_message_is_read_from_the_core_without_the_crashed_libc(same_bug, cores, request):
    # GIVEN Debian unstable's cores (glibc 2.43) analyzed here, where /usr/lib/x86_64-linux-gnu/libc.so.6 is
    # another build (left out, so __abort_msg cannot be looked up in it), and with the root as --sysroot
    root = request.getfixturevalue("sid_root")
    for key in [k for k in same_bug.keys if k.startswith("sid-")]:
        core = str(same_bug.core(key, "assert"))
        without, with_root = analyze_core(core), analyze_core(core, sysroot=str(root))
        libc = next(lib for lib in without.snapshot.core.libraries if lib.name == "libc.so.6")
        assert libc.status is LibraryStatus.MISMATCH, libc
        # THEN glibc's message is read from the core's own memory all the same: one class, one fingerprint
        assert without.crash.abort_message == with_root.crash.abort_message
        assert without.crash.abort_message.endswith("forensics_assert: Assertion `channels > 0' failed."), key
        assert without.fingerprint == with_root.fingerprint and without.fingerprint_partial is None, \
            (key, without.fingerprint_basis, with_root.fingerprint_basis, without.fingerprint_partial)
    # and a heap corruption's message, which makes the class
    heap = analyze_core(str(cores.get("sid-3.14", "heap-prev")))
    assert heap.crash.abort_message == "double free or corruption (!prev)"
    assert heap.crash.kind is CrashKind.HEAP_CORRUPTION
    assert heap.fingerprint == analyze_core(str(cores.get("sid-3.14", "heap-prev")), sysroot=str(root)).fingerprint


def test_signal_frames_read_without_the_crashed_libc(same_bug, request):
    # GIVEN Debian unstable's cores analyzed here without --sysroot: libc.so.6 here is another build, whose
    # trampoline bytes lie elsewhere, and the core holds no page of libc's text
    request.getfixturevalue("sid_root")
    for key in [k for k in same_bug.keys if k.startswith("sid-")]:
        handled = analyze_core(str(same_bug.core(key, "null", faulthandler=True)))
        usr1 = analyze_core(str(same_bug.core(key, "usr1-handler")))
        # THEN faulthandler's signal frame is found by its shape: the fault is the SIGSEGV at address 0
        (sf,) = handled.snapshot.crashed_thread.signal_frames
        assert sf.signal.name == "SIGSEGV" and sf.alternate_stack, (key, sf)
        crash = handled.crash
        assert (crash.signal_name, crash.fault_address, crash.fault_kind) == ("SIGSEGV", 0, FaultKind.NEAR_NULL), key
        # and the SIGUSR1 handler's fault is inside the SIGUSR1 handler (its signal read from the tgkill
        # registers, not guessed from a stale trap number)
        assert usr1.crash.handling is not None and usr1.crash.handling.signal_name == "SIGUSR1", (key, usr1.crash)
        assert usr1.crash.kind is CrashKind.SEGV and usr1.crash.fault_address == 0
        # the unwinder stops in libc without its file, so which Python frames ran in the handler is not
        # known: both fingerprints say they are partial rather than hash the wrong frames
        assert handled.fingerprint_partial and usr1.fingerprint_partial
