"""Nested faults (issue #22): a crash reporter's signal handler that faults while the process dies.

Real cores of exporter.py with a handler installed (tests/crashers: a ctypes callback, a C library's
handlers, Python's faulthandler), each compared with the same crash without the handler: the class,
the first part of the signature and the fingerprint are the first fault's; the fault in the handler
follows "; then"; the exit status the kernel gave the real process is explained.
"""
from __future__ import annotations

import json
import subprocess
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.analyze import analyze_core
from forensics.views.signature import exit_explanation, signature
from forensics.cli import cli
from forensics.errors import EXIT_OK
from forensics.model import CrashKind, FaultKind, HandlerKind
from forensics.modes import UnwoundBy
from tests.conftest import PYTHONS, python_params
from tests.crashers.make_core import TWO_THREADS, build_libcrash, build_libreporter, crash_for_core


def died_of(core: Path) -> int:
    """The signal the real process died of, as the crasher recorded it beside its core."""
    return int((core.parent / ".signal").read_text())


def same_tid(text: str) -> str:
    return re.sub(r"tid \d+", "tid N", text)


@pytest.fixture(scope="module")
def plain_heap(cores, newest_python):
    return analyze_core(str(cores.get(newest_python, "heap-prev")))


@pytest.fixture(scope="module")
def plain_segv(cores, newest_python):
    return analyze_core(str(cores.get(newest_python, "segv")))


@pytest.mark.parametrize("version", python_params())
def test_ctypes_handler_fault_is_a_heap_corruption_whose_handler_crashed(cores, version):
    # GIVEN a process whose SIGABRT handler (a ctypes callback, as crash reporters do) reads through a
    # bad pointer while glibc aborts on a heap overflow: the kernel saw SIGSEGV, exit status 139
    core = cores.get(version, "heap-prev", handler="ctypes-abort")
    plain = analyze_core(str(cores.get(version, "heap-prev")))
    assert died_of(core) == 11
    # WHEN it is analyzed
    a = analyze_core(str(core))
    crash = a.crash
    # THEN the crash is the first fault: glibc's heap corruption, in the exporter's call
    assert crash.kind is CrashKind.HEAP_CORRUPTION and crash.signal_name == "SIGABRT"
    assert crash.abort_message == "double free or corruption (!prev)"
    # the handler's fault comes after, named by the Python callable ctypes called
    assert crash.then is not None and crash.then.signal_name == "SIGSEGV"
    assert crash.then.fault_address == 0x10 and crash.then.fault_kind is FaultKind.NEAR_NULL
    assert crash.then.handler.kind is HandlerKind.PYTHON_CALLBACK
    assert crash.then.handler.name.endswith("on_abort") and crash.then.handler.where.startswith("exporter.py:")
    # the signature names both, the first fault exactly as without the handler
    sig = signature(a)
    first, _, then = sig.partition("; then ")
    assert same_tid(first) == same_tid(signature(plain))
    assert then.startswith("SIGSEGV at 0x10 (near-null) in the SIGABRT handler ")
    assert "on_abort (exporter.py:" in then and "at ctypes.string_at (ctypes/__init__.py:" in then
    # the fingerprint is the first fault's: equal to the same crash without the handler
    assert a.fingerprint == plain.fingerprint and a.fingerprint_partial is None
    # the exit status: what the kernel gave the process, and why it is not 134
    assert crash.exit_status == 128 + died_of(core) == 139
    assert exit_explanation(a).startswith("exit status 139 (SIGSEGV), not 134 (SIGABRT)")
    assert any(f.rule == "fault-in-signal-handler" for f in a.findings)
    # the thread's stacks are split at the kernel's signal frame, natively and in Python
    main = a.snapshot.crashed_thread
    (sf,) = main.signal_frames
    assert sf.signal.name == "SIGABRT"
    assert main.native_frames[sf.native_index].pc == sf.trampoline
    assert main.native_frames[sf.native_index + 1].pc == sf.pc  # the interrupted instruction, as gdb unwound it
    assert any(f.symbol == "malloc_printerr" for f in main.interrupted_native_frames)
    assert [p.function.rsplit(".", 1)[-1] for p in main.py_frames[: sf.py_index]] == ["string_at", "on_abort"]
    plain_frames = plain.snapshot.crashed_thread.py_frames
    assert [p.function for p in main.interrupted_py_frames] == [p.function for p in plain_frames]


def test_c_handler_that_dereferences_null(cores, newest_python, plain_heap):
    # GIVEN a C library's SIGABRT handler that dereferences NULL while glibc aborts
    core = cores.get(newest_python, "heap-prev", handler="c-abort")
    assert died_of(core) == 11
    a = analyze_core(str(core))
    # THEN heap corruption first, then SIGSEGV at 0 in the native handler, named by its symbol
    assert a.crash.kind is CrashKind.HEAP_CORRUPTION
    assert a.crash.then.handler.kind is HandlerKind.NATIVE
    assert (a.crash.then.handler.name, a.crash.then.handler.where) == ("forensics_reporter_on_abort", "libreporter.so")
    assert a.crash.then.fault_address == 0 and a.crash.then.fault_kind is FaultKind.NEAR_NULL
    first, _, then = signature(a).partition("; then ")
    assert same_tid(first) == same_tid(signature(plain_heap))
    assert then == "SIGSEGV at 0x0 (near-null) in the SIGABRT handler forensics_reporter_on_abort (libreporter.so)"
    assert a.fingerprint == plain_heap.fingerprint
    assert a.crash.exit_status == 139


def test_segv_handler_that_faults_again_keeps_the_first_address(cores, newest_python, plain_segv):
    # GIVEN a SIGSEGV handler (SA_SIGINFO) that faults again at 0x28 after the first fault at 0x10
    core = cores.get(newest_python, "segv", handler="c-segv")
    a = analyze_core(str(core))
    # THEN the crash keeps the first fault's address and kind; the second follows
    assert a.crash.kind is CrashKind.SEGV
    assert (a.crash.fault_address, a.crash.fault_kind) == (0x10, FaultKind.NEAR_NULL)
    assert (a.crash.then.fault_address, a.crash.then.signal_name) == (0x28, "SIGSEGV")
    assert a.crash.then.handler.name == "forensics_reporter_on_segv"
    (sf,) = a.snapshot.crashed_thread.signal_frames
    assert sf.signal_source == "siginfo" and sf.signal.addr == 0x10  # the kernel's own siginfo
    first, _, then = signature(a).partition("; then ")
    assert same_tid(first) == same_tid(signature(plain_segv))
    assert then.startswith("SIGSEGV at 0x28 (near-null) in the SIGSEGV handler forensics_reporter_on_segv")
    assert a.fingerprint == plain_segv.fingerprint
    assert a.crash.exit_status == 139 == 128 + died_of(core)


def test_faulthandler_leaves_the_analysis_unchanged(cores, newest_python, plain_heap):
    # GIVEN faulthandler enabled on a heap-corruption crash: it prints the Python traceback to stderr
    # and raises SIGABRT again (exit 134)
    core = cores.get(newest_python, "heap-prev", handler="faulthandler")
    stderr = (core.parent / ".stderr").read_text()
    assert "Fatal Python error: Aborted" in stderr and "query_nvlink_throughput_counters" in stderr
    assert died_of(core) == 6
    a = analyze_core(str(core))
    # THEN the analysis is the crash's own: class, signature, fingerprint; no second fault
    assert a.crash.kind is CrashKind.HEAP_CORRUPTION and a.crash.then is None
    assert same_tid(signature(a)) == same_tid(signature(plain_heap))
    assert a.fingerprint == plain_heap.fingerprint
    assert a.crash.exit_status == 134
    # and faulthandler is named as the handler that ran (on its alternate signal stack)
    assert a.crash.handler.kind is HandlerKind.FAULTHANDLER
    (sf,) = a.snapshot.crashed_thread.signal_frames
    assert sf.alternate_stack and sf.signal.name == "SIGABRT"


def test_signal_frames_are_found_without_an_unwinder(cores, newest_python):
    # GIVEN the ctypes-handler core read with no native unwinding at all: program counters only
    a = analyze_core(str(cores.get(newest_python, "heap-prev", handler="ctypes-abort")), native_method="none")
    # THEN the signal frame is still found, by the trampoline's bytes in libc and the kernel's frame
    # layout, and the crash is still classified by its first fault
    assert a.snapshot.native_method is UnwoundBy.REGISTERS
    (sf,) = a.snapshot.crashed_thread.signal_frames
    assert sf.signal.name == "SIGABRT" and sf.signal_source == "registers" and sf.native_index is None
    assert a.crash.kind is CrashKind.HEAP_CORRUPTION and a.crash.then.signal_name == "SIGSEGV"
    assert a.crash.exit_status == 139
    # but which Python frames ran in the handler is not known: the fingerprint says it is partial
    assert a.fingerprint_partial and "cannot be told apart" in a.fingerprint_partial


@pytest.mark.parametrize("handler,scenario", [("ctypes-abort", "heap-prev"), ("c-segv", "segv"),
                                              ("faulthandler", "heap-prev")])
def test_every_method_gives_the_first_faults_fingerprint(cores, newest_python, handler, scenario):
    # GIVEN a nested-fault core and the same crash without the handler
    core = str(cores.get(newest_python, scenario, handler=handler))
    plain = analyze_core(str(cores.get(newest_python, scenario))).fingerprint
    # WHEN it is read with libdw, gdb, and --method direct (which unwinds only the threads running a
    # handler, to split them)
    got = {
        "libdw": analyze_core(core),
        "gdb": analyze_core(core, native_method="gdb", method="gdb"),
        "direct": analyze_core(core, method="direct"),
    }
    # THEN one fingerprint, the plain crash's
    assert {k: a.fingerprint for k, a in got.items()} == dict.fromkeys(got, plain)
    assert all(a.fingerprint_partial is None for a in got.values())
    assert got["direct"].snapshot.native_method is UnwoundBy.LIBDW_REGISTERS


def test_cli_json_carries_the_exit_explanation(cores, newest_python):
    r = CliRunner().invoke(cli, ["analyze", "--json", str(cores.get(newest_python, "heap-prev", handler="c-abort"))])
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["exit_status"] == 139 and a["crash"]["then"]["signal_name"] == "SIGSEGV"
    assert "not 134 (SIGABRT)" in a["exit_explanation"]
    r = CliRunner().invoke(cli, ["analyze", str(cores.get(newest_python, "heap-prev", handler="c-abort"))])
    assert "--- SIGABRT (read from the interrupted registers) delivered here" in r.stdout


def test_report_explains_exit_139_and_tells_the_first_faults_stack(cores, newest_python, tmp_path):
    # GIVEN the analysis of the ctypes-handler core, as the incident's reports are made from it
    core = cores.get(newest_python, "heap-prev", handler="ctypes-abort")
    r = CliRunner().invoke(cli, ["analyze", "--json", "-o", str(tmp_path / "a.json"), str(core)])
    assert r.exit_code == EXIT_OK, r.stderr
    # WHEN the incident record and the NVIDIA report are written
    for template in ("runbook", "nvml"):
        CliRunner().invoke(cli, ["report", "--template", template, "-o", str(tmp_path / f"{template}.md"),
                                 str(tmp_path / "a.json")])
    runbook = (tmp_path / "runbook.md").read_text()
    nvml = (tmp_path / "nvml.md").read_text()
    # THEN the crash is told as the heap corruption, with why the exit status is 139 and not 134
    crash = runbook.split("## Crash", 1)[1]
    assert "aborts with heap corruption" in crash and "Exit status 139 (SIGSEGV), not 134 (SIGABRT)" in crash
    assert "| Exit status | exit status 139 (SIGSEGV), not 134 (SIGABRT)" in nvml
    # and the stacks it shows are the first fault's: the handler's callback is not the crash's caller
    traceback = crash.split("Most recent call last:", 1)[1].split("```", 1)[0]
    assert "query_nvlink_throughput_counters" in traceback and "on_abort" not in traceback


def test_another_threads_fault_after_the_heap_abort_says_which_came_first(cores, newest_python, tmp_path):
    # GIVEN a poller thread that corrupted the heap, aborted by glibc and still in its (slow) SIGABRT
    # handler, when the main thread dies of SIGSEGV: the kernel dumps the main thread's SIGSEGV (139)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    core = crash_for_core([PYTHONS[newest_python], str(TWO_THREADS), str(build_libcrash(tmp_path)),
                           str(build_libreporter(tmp_path))], run_dir)
    assert died_of(core) == 11
    for method in ("auto", "direct"):
        a = analyze_core(str(core), method=method)
        threads = {t.name: t for t in a.snapshot.threads}
        poller, main = threads["nvml-poller"], threads["MainThread"]
        # THEN the crash is the poller's heap corruption, which the core shows came first (its SIGABRT
        # signal frame, glibc's message written), and the main thread's SIGSEGV comes after
        assert main.is_crashed and not poller.is_crashed
        assert a.crash.kind is CrashKind.HEAP_CORRUPTION and a.crash.tid == poller.tid
        assert a.crash.handler.name == "forensics_reporter_slow_abort"
        assert (a.crash.then.signal_name, a.crash.then.tid, a.crash.then.handler) == ("SIGSEGV", main.tid, None)
        first, _, then = signature(a).partition("; then ")
        assert f'in thread "nvml-poller" tid {poller.tid} at poll_nvlink (two_threads.py:' in first
        assert then.startswith(f'SIGSEGV at 0x10 (near-null) in thread "MainThread" tid {main.tid} at main')
        order = next(f for f in a.findings if f.rule == "fault-order")
        assert order.summary.startswith(f'"nvml-poller" tid {poller.tid} came first')
        assert exit_explanation(a).startswith("exit status 139 (SIGSEGV), not 134 (SIGABRT)")
    assert analyze_core(str(core)).fingerprint == a.fingerprint  # whichever method read it


C_PROGRAM = r"""
#include <signal.h>
#include <stdlib.h>
#include <string.h>
/* usage: reporter [handler]: a heap overflow glibc aborts on; with "handler", a SIGABRT handler
   (a crash reporter) that dereferences NULL while the process dies */
static void on_abort(int signo) { volatile int *p = 0; *p = signo; }
static void *volatile keep;
int main(int argc, char **argv) {
    if (argc > 1) {
        struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_abort; sigaction(SIGABRT, &sa, 0);
    }
    unsigned char *a = malloc(0x500), *b = malloc(0x500);
    keep = b;
    memset(a, 0x41, 0x500 + 16);  /* over the next chunk's header */
    free(a);
    return 0;
}
"""


def test_c_program_whose_handler_faults_fingerprints_as_without_it(tmp_path, core_pattern):
    # GIVEN a C program (no Python) whose SIGABRT handler dereferences NULL during glibc's heap abort
    src = tmp_path / "reporter.c"
    src.write_text(C_PROGRAM)
    exe = tmp_path / "reporter"
    subprocess.run(["gcc", "-g", "-O0", "-o", str(exe), str(src)], check=True)
    runs = {}
    for name, argv in (("plain", [str(exe)]), ("handler", [str(exe), "handler"])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        runs[name] = crash_for_core(argv, run_dir)
    assert died_of(runs["plain"]) == 6 and died_of(runs["handler"]) == 11
    plain, nested = analyze_core(str(runs["plain"])), analyze_core(str(runs["handler"]))
    # THEN the same crash: heap corruption first, the handler's SIGSEGV after, one fingerprint
    assert nested.crash.kind is CrashKind.HEAP_CORRUPTION and nested.crash.then.handler.name == "on_abort"
    assert nested.fingerprint == plain.fingerprint and nested.fingerprint_partial is None
    assert "program:reporter" in nested.fingerprint_basis
    assert same_tid(signature(nested).partition("; then ")[0]) == same_tid(signature(plain))
