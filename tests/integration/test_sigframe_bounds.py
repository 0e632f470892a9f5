"""The signal-frame reader's bounds (forensics.analyze.sigframe) on real kernel cores: how many nested signal
frames a thread's stack is read for (MAX_NESTED), and how much of a text mapping is searched for the sigreturn
trampoline's bytes (MAX_TEXT)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from click.testing import CliRunner

from forensics.analyze import analyze_core
from forensics.analyze.sigframe import (
    MAX_NESTED,
    MAX_TEXT,
    SIGRETURN_TRAMPOLINE,
    find_trampolines,
    read_signal_frames,
    text_trampolines,
)
from forensics.analyze.stacks import build_threads
from forensics.cli import cli
from forensics.analyze import registers_only
from forensics.core import open_core
from forensics.core.memory import CoreMemory
from tests.crashers.make_core import HERE, build_libcrash, crash_for_core

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

NESTED_C = r"""
#include <signal.h>
#include <string.h>
static volatile int depth;
static void on_usr1(int sig) {
    (void)sig;
    if (++depth < %(handlers)d)
        raise(SIGUSR1);              /* SA_NODEFER: delivered again inside this handler */
    else
        *(volatile int *)0 = 0;      /* SIGSEGV in the innermost handler: the kernel writes the core */
}
int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGUSR1, &sa, 0);
    raise(SIGUSR1);
    return 0;
}
"""

# a static program (no C library mapped: its own text is searched) with the trampoline's bytes near the start
# of its text, then MAX_TEXT + 1 MiB of nops, then glibc's __restore_rt (libc.a is linked after this object)
BIG_TEXT_C = r"""
__asm__(".text\n.globl early_trampoline\nearly_trampoline:\n\tmov $15, %%rax\n\tsyscall\n"
        ".fill %(fill)d, 1, 0x90\n");
int main(void) { return *(volatile int *)0; }
"""


def _crash(tmp_path, name: str, source: str, *cflags: str):
    (tmp_path / f"{name}.c").write_text(source)
    exe = tmp_path / name
    p = subprocess.run(["gcc", "-O0", "-g", *cflags, "-o", str(exe), str(tmp_path / f"{name}.c")],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "-static" in cflags and "cannot find -lc" in p.stderr:
        pytest.skip("no static C library (Debian: libc6-dev)")
    assert p.returncode == 0, p.stderr
    run = tmp_path / f"run-{name}"
    run.mkdir()
    return exe, crash_for_core([str(exe)], run)


def test_signal_frames_past_the_nesting_bound_are_not_read(tmp_path, core_pattern):
    # GIVEN a real core of a program that died in the 12th of 12 nested SIGUSR1 handlers
    handlers = MAX_NESTED + 4
    _exe, core = _crash(tmp_path, "nested", NESTED_C % {"handlers": handlers})
    analysis = analyze_core(str(core))
    (thread,) = analysis.snapshot.threads
    trampolines = [i for i, f in enumerate(thread.native_frames) if f.symbol == "__restore_rt"]
    assert len(trampolines) == handlers, [f.symbol for f in thread.native_frames]  # libdw went through all 12
    # THEN the reader stops at MAX_NESTED: the innermost 8, each at its trampoline frame, innermost first
    assert len(thread.signal_frames) == MAX_NESTED
    assert [sf.native_index for sf in thread.signal_frames] == trampolines[:MAX_NESTED]
    assert [sf.signal.name for sf in thread.signal_frames] == ["SIGUSR1"] * MAX_NESTED
    addresses = [sf.address for sf in thread.signal_frames]
    assert addresses == sorted(addresses)
    # and the cut is said: on the thread, as a warning, and the analysis is partial (the frames below the 8th
    # handler ran in a handler too, and the first signal is not known)
    assert thread.signal_frames_cut and f"more than {MAX_NESTED} signal handlers nested" in thread.signal_frames_cut
    assert any(w.startswith(f"thread {thread.tid}: more than {MAX_NESTED}") for w in analysis.snapshot.warnings)
    assert not analysis.snapshot.is_complete
    r = CliRunner().invoke(cli, ["analyze", str(core)])
    assert r.exit_code == 4 and f"(more than {MAX_NESTED} signal handlers nested" in r.stdout, r.output


def test_signal_frames_up_to_the_nesting_bound_are_all_read(tmp_path, core_pattern):
    # GIVEN a real core of a program that died in the 8th of 8 nested handlers (the bound, not past it)
    _exe, core = _crash(tmp_path, "nested8", NESTED_C % {"handlers": MAX_NESTED})
    analysis = analyze_core(str(core))
    (thread,) = analysis.snapshot.threads
    # THEN all 8 are read and nothing is said to be cut
    assert len(thread.signal_frames) == MAX_NESTED and thread.signal_frames_cut is None
    assert analysis.snapshot.is_complete, analysis.snapshot.warnings


def test_text_past_the_search_bound_is_not_searched_for_the_trampoline(tmp_path, core_pattern):
    # GIVEN a real core of a static program whose text maps more than MAX_TEXT bytes, the trampoline's bytes
    # at its start and glibc's __restore_rt past MAX_TEXT (the kernel dumps none of that text: it is read
    # from the file)
    exe, core_path = _crash(tmp_path, "bigtext", BIG_TEXT_C % {"fill": MAX_TEXT + (1 << 20)}, "-static")
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    symbols = {parts[2]: int(parts[0], 16) for parts in map(str.split, nm.splitlines()) if len(parts) == 3}
    early, restore_rt = symbols["early_trampoline"], symbols["__restore_rt"]
    core = open_core(str(core_path))
    text = next(m for m in core.mappings if m.path == str(exe) and "x" in m.perms)
    assert text.size > MAX_TEXT and restore_rt - text.start > MAX_TEXT > early - text.start
    with open(exe, "rb") as f:  # glibc's is the same instruction pair
        f.seek(text.offset + restore_rt - text.start)
        assert f.read(len(SIGRETURN_TRAMPOLINE)) == SIGRETURN_TRAMPOLINE
    # WHEN the trampolines are searched for by their bytes
    with CoreMemory.open(str(core_path)) as mem:
        found = find_trampolines(core, mem)
    # THEN only the first MAX_TEXT bytes were searched: the early copy is found, glibc's past the bound is not
    assert found == (early,)


class CountingMemory(CoreMemory):
    """The core reader, counting the bytes each read returns."""

    bytes_read = 0

    def read(self, addr: int, size: int) -> bytes:
        data = super().read(addr, size)
        self.bytes_read += len(data)
        return data

    def read_prefix(self, addr: int, size: int) -> bytes:
        data = super().read_prefix(addr, size)
        self.bytes_read += len(data)
        return data


def test_each_stack_is_searched_only_up_to_its_own_top(tmp_path, core_pattern, sid_root):
    # GIVEN a real core of Debian unstable's CPython 3.15 (glibc 2.43: thread stacks with no guard mapping, so
    # the kernel merged them into one mapping) with 40 threads waiting and the main thread faulting
    threads = 40
    lib = build_libcrash(tmp_path)
    script = HERE / "many_threads.py"
    run = tmp_path / "run-many"
    run.mkdir()
    path = crash_for_core(["/usr/bin/python3.15", str(script), str(lib), str(threads)], run, root=sid_root,
                          binds=(script, lib), timeout=120)
    core = open_core(str(path), sysroot=str(sid_root))
    assert len(core.threads) == threads + 1
    merged = max(sum(1 for t in core.threads if m.contains(t.sp)) for m in core.mappings)
    assert merged >= 3, "no stacks merged into one mapping: this core tests nothing"
    with CountingMemory.open(str(path)) as counting:
        text = text_trampolines(core, counting)
        assert text
        counting.bytes_read = 0
        # WHEN each thread's stack is searched for signal frames
        per_thread = {}
        for t in build_threads(core, registers_only(core), None):
            before = counting.bytes_read
            frames, cut = read_signal_frames(core, counting, t, text)
            per_thread[t.tid] = counting.bytes_read - before
            assert frames == () and cut is None  # no thread ran a handler
    # THEN each search read the stack in use (under 256 KiB: the main thread's [stack] mapping, or a thread's
    # stack up to its TCB), not SCAN_LIMIT (16 MiB) of the stacks above it
    assert max(per_thread.values()) < 256 << 10, per_thread
    assert sum(per_thread.values()) < 2 << 20, sum(per_thread.values())
