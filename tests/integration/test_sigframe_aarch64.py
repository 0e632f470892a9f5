"""AArch64 signal frames in real guest cores (issue #31 item 3): a handler running when the process died.

tests/crashers/nested_handler.c, cross-compiled for arm64, dies under qemu-user in the bookworm arm64 root
(tests/arm64.py) with a handler on its stack: a SIGABRT handler that faults (glibc's heap check, then a
read at 0x10), a SIGSEGV handler that aborts, a SIGABRT handler installed by signal() (no siginfo).
The core's records are read here with pyelftools, an oracle independent of forensics.core; the frames
are forensics.analyze.sigframe's, checked against the executable's symbols and the core's registers.
"""
from __future__ import annotations

import io
import os
import re
import resource
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from forensics.analyze.sigframe import MAX_NESTED, find_trampolines, read_signal_frames
from forensics.core.rtsigframe import FRAME_SIZE, SIGRETURN_TRAMPOLINE
from forensics.core.memory import CoreMemory, Segment
from forensics.model import Arch, CoreFile, CoreThread, Mapping, Thread
from tests.arm64 import CROSS_CC, guest_root

SOURCE = Path(__file__).resolve().parent.parent / "crashers" / "nested_handler.c"
MODES = ("abort-then-segv", "segv-then-abort", "plain-abort")


@pytest.fixture(scope="module")
def guest(tmp_path_factory, arm64_cores) -> tuple[Path, dict[str, Path]]:
    root = arm64_cores.root("bookworm")  # skips, saying why, without qemu-user or the mirror
    d = tmp_path_factory.mktemp("sigframe-arm64")
    exe = d / "nested_handler"
    subprocess.run([CROSS_CC, "-O1", "-g", "-Wall", "-o", str(exe), str(SOURCE)], check=True, timeout=120)
    cores = {}
    for mode in MODES:
        run = d / mode
        run.mkdir()
        proc = subprocess.run([shutil.which("qemu-aarch64-static") or "qemu-aarch64-static", "-L", str(root),
                               str(exe), mode], cwd=run, capture_output=True, timeout=120,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
        assert proc.returncode < 0, (mode, proc.returncode, proc.stderr)
        (cores[mode],) = run.glob("qemu_nested_handler_*.core")
        for host_core in run.glob("core*"):  # the host's core of qemu itself
            host_core.unlink()
    return exe, cores


def read_guest_core(path: Path) -> tuple[CoreFile, CoreMemory, list[tuple[int, ...]], dict[int, int]]:
    """The core's records, read with pyelftools: PT_LOADs as mappings, NT_PRSTATUS as threads (with all 34
    registers), NT_AUXV."""
    data = path.read_bytes()
    e = ELFFile(io.BytesIO(data))
    segs, maps, threads, regs, auxv = [], [], [], [], {}
    for s in e.iter_segments():
        if s["p_type"] == "PT_LOAD":
            fl = s["p_flags"]
            segs.append(Segment(vaddr=s["p_vaddr"], memsz=s["p_memsz"], offset=s["p_offset"], present=s["p_filesz"],
                                zero_fill=False, flags=fl))
            perms = ("r" if fl & 4 else "-") + ("w" if fl & 2 else "-") + ("x" if fl & 1 else "-") + "p"
            maps.append(Mapping(start=s["p_vaddr"], end=s["p_vaddr"] + s["p_memsz"], offset=0, perms=perms,
                                path=None, in_core=s["p_filesz"]))
        elif s["p_type"] == "PT_NOTE":
            for n in s.iter_notes():
                if n["n_type"] == "NT_PRSTATUS":
                    raw = n["n_descdata"]
                    r = struct.unpack_from("<34Q", raw, 112)
                    threads.append(CoreThread(tid=struct.unpack_from("<i", raw, 32)[0],
                                              signal=struct.unpack_from("<H", raw, 12)[0], pc=r[32], sp=r[31]))
                    regs.append(r)
                elif n["n_type"] == "NT_AUXV":
                    raw = n["n_descdata"]
                    auxv = dict(struct.unpack_from("<QQ", raw, i) for i in range(0, len(raw) - 15, 16))
    core = CoreFile(path=str(path), size=len(data), pid=threads[0].tid, command="", args="", executable=None,
                    build_id=None, signal=None, threads=tuple(threads), mappings=tuple(maps), libraries=(), nvml=None,
                    abort_message=None, truncated=False, expected_size=len(data), arch=Arch.AARCH64)
    return core, CoreMemory(data, segs, path=str(path)), regs, auxv


def e_machine(path: Path) -> str:
    with open(path, "rb") as f:
        return ELFFile(f)["e_machine"]


def symbol_range(exe: Path, core_auxv: dict, name: str) -> tuple[int, int]:
    """Where the executable's function ``name`` lies in the process (its load bias from AT_PHDR)."""
    with open(exe, "rb") as f:
        e = ELFFile(f)
        bias = core_auxv[3] - e["e_phoff"]  # AT_PHDR
        sym = e.get_section_by_name(".symtab").get_symbol_by_name(name)[0]
        return bias + sym["st_value"], bias + sym["st_value"] + sym["st_size"]


def frames_of(core: CoreFile, mem: CoreMemory, sp: int | None = None):
    t = core.threads[0]
    if sp is not None:
        core = CoreFile(**{**{f: getattr(core, f) for f in core.__dataclass_fields__},
                           "threads": (CoreThread(tid=t.tid, signal=t.signal, pc=t.pc, sp=sp),)})
    thread = Thread(tid=t.tid, name=None, is_crashed=True, holds_gil=False, native_frames=(), py_frames=())
    return read_signal_frames(core, mem, thread, find_trampolines(core, mem))


def test_a_faulting_sigabrt_handler_leaves_the_abort_frame_under_it(guest):
    exe, cores = guest
    # GIVEN the core of a process whose SIGABRT handler read through 0x10 while glibc aborted
    core, mem, regs, auxv = read_guest_core(cores["abort-then-segv"])
    assert e_machine(cores["abort-then-segv"]) == "EM_AARCH64"
    crashed = core.threads[0]
    lo, hi = symbol_range(exe, auxv, "on_abort")
    assert crashed.signal == 11 and lo <= crashed.pc < hi
    # WHEN its signal frames are read
    (frame,), cut = frames_of(core, mem)
    # THEN one frame: glibc's abort (tgkill from the process itself), siginfo written (SA_SIGINFO)
    assert cut is None
    assert (frame.signal.name, frame.signal.code, frame.signal.sender_pid) == ("SIGABRT", -6, core.pid)
    assert frame.signal_source == "siginfo" and frame.fault_address is None and frame.esr is None
    # on a 16-byte boundary at or above the handler's stack pointer; the interrupted sp above the whole frame
    assert frame.address % 16 == 0 and crashed.sp <= frame.address and frame.address + FRAME_SIZE <= frame.sp
    # the kernel's frame record after the frame holds the interrupted x29, x30 -- which the handler's x29 names
    assert regs[0][29] == frame.address + FRAME_SIZE
    # the interrupted pc is outside the executable (in libc), the trampoline is qemu's sigtramp page's
    exe_lo, _ = symbol_range(exe, auxv, "main")
    assert not core.find_mapping(frame.pc).contains(exe_lo)
    assert regs[0][30] == frame.trampoline and mem.read(frame.trampoline, 8) == SIGRETURN_TRAMPOLINE
    # and no frame lies above the interrupted stack pointer: a search from there finds none
    assert frames_of(core, mem, sp=frame.sp) == ((), None)


def test_an_aborting_sigsegv_handler_leaves_the_fault_and_its_address(guest):
    exe, cores = guest
    core, mem, _, auxv = read_guest_core(cores["segv-then-abort"])
    assert core.threads[0].signal == 6
    (frame,), _ = frames_of(core, mem)
    # THEN the first fault: SIGSEGV at 0x28 (SEGV_MAPERR), the same in the siginfo and uc_mcontext.fault_address
    assert (frame.signal.name, frame.signal.code, frame.signal.addr) == ("SIGSEGV", 1, 0x28)
    assert frame.fault_address == 0x28
    # the faulting store in main
    lo, hi = symbol_range(exe, auxv, "main")
    assert lo <= frame.pc < hi
    # qemu-user writes no esr_context record (the arm64 kernel does, for a fault): none is made up
    assert frame.esr is None


def test_a_handler_without_siginfo_is_read_from_the_registers(guest):
    _, cores = guest
    core, mem, _, _ = read_guest_core(cores["plain-abort"])
    (frame,), _ = frames_of(core, mem)
    # THEN SIGABRT, from the interrupted tgkill's arguments (x8 = 131, x1 = the thread, x2 = 6)
    assert frame.signal.name == "SIGABRT" and frame.signal.sender_pid == core.pid
    assert frame.signal_source in ("registers", "siginfo")


@pytest.mark.parametrize("handlers", [5, MAX_NESTED + 4], ids=lambda n: f"handlers={n}")
def test_nested_handlers_are_read_up_to_the_bound(handlers, tmp_path, arm64_cores):
    from forensics.analyze import analyze_core
    from tests.integration.test_sigframe_bounds import NESTED_C

    root = arm64_cores.root("bookworm")  # skips, saying why, without qemu-user or the mirror
    # GIVEN a SIGUSR1 handler (SA_NODEFER) that raises SIGUSR1 again, nested N deep, faulting in the innermost
    src, exe = tmp_path / "nested.c", tmp_path / "nested"
    src.write_text(NESTED_C % {"handlers": handlers})
    subprocess.run([CROSS_CC, "-O1", "-g", "-o", str(exe), str(src)], check=True, timeout=120)
    subprocess.run([shutil.which("qemu-aarch64-static") or "qemu-aarch64-static", "-L", str(root), str(exe)],
                   cwd=tmp_path, capture_output=True, timeout=120,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
    (core,) = tmp_path.glob("qemu_nested_*.core")
    # WHEN it is analyzed
    a = analyze_core(str(core), sysroot=str(root), exe=str(exe))
    frames = a.snapshot.crashed_thread.signal_frames
    # THEN every frame up to the bound is read, innermost first, each the SIGUSR1 the thread sent itself
    assert len(frames) == min(handlers, MAX_NESTED)
    assert {f.signal.name for f in frames} == {"SIGUSR1"} and all(f.address % 16 == 0 for f in frames)
    assert [f.address for f in frames] == sorted(f.address for f in frames)
    # and past it the thread says so (the analysis partial)
    cut = a.snapshot.crashed_thread.signal_frames_cut
    assert (cut is not None) == (handlers > MAX_NESTED)


def test_qemus_trampoline_page_is_in_no_object(guest):
    """qemu-user's sigreturn trampoline is an anonymous page, mapped just above the dynamic linker's data: the
    handler's return address is its first byte, and pc - 1 (a caller frame's call) is ld.so's last byte."""
    from forensics.analyze import analyze_core

    exe, cores = guest
    root = guest_root("bookworm")
    # GIVEN the core of a SIGABRT handler that faulted, analyzed with its root
    a = analyze_core(str(cores["abort-then-segv"]), sysroot=str(root), exe=str(exe))
    thread = a.snapshot.crashed_thread
    (sf,) = thread.signal_frames
    # WHEN the unwound frame at the trampoline is looked at
    tramp = [f for f in thread.native_frames if f.pc == sf.trampoline]
    _, mem, _, _ = read_guest_core(cores["abort-then-segv"])
    # THEN it is qemu's page (anonymous, executable, the sigreturn's bytes), and no object is named for it
    assert tramp and mem.read(sf.trampoline, 8) == SIGRETURN_TRAMPOLINE
    page = a.snapshot.core.find_mapping(sf.trampoline)
    assert page is not None and page.path is None and "x" in page.perms
    assert all(f.library is None and f.symbol is None for f in tramp), tramp


def _gdb_backtrace(root: Path, exe: Path, core: Path) -> list[str | None]:
    """gdb-multiarch's backtrace of the crashed thread: function names, innermost first, its signal frame
    ``<signal handler called>`` (gdb knows qemu's trampoline by its two instructions)."""
    out = subprocess.run(["gdb-multiarch", "-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex",
                          f"set sysroot {root}", "-ex", "set width 0", "-ex", f"file {exe}", "-ex",
                          f"core-file {core}", "-ex", "bt"], capture_output=True, text=True, timeout=300).stdout
    names: list[str | None] = []
    for line in out.splitlines():
        if re.match(r"#\d+\s+<signal handler called>", line):
            names.append("<signal handler called>")
            continue
        m = re.match(r"#(\d+)\s+(?:0x[0-9a-f]+ in )?(\S+) \(", line)
        if m and int(m.group(1)) == len(names):  # "Program terminated" repeats frame #0 first
            names.append(None if m.group(2) == "??" else m.group(2))
    return names


@pytest.mark.skipif(shutil.which("gdb-multiarch") is None, reason="gdb-multiarch is not installed")
@pytest.mark.parametrize("mode", ["abort-then-segv", "segv-then-abort"])
def test_the_frames_below_qemus_trampoline_are_the_interrupted_ones(mode, tmp_path, arm64_cores):
    """libdw has no CFI for qemu's trampoline page: it went on from the kernel's frame record (x29/x30) and
    gave the trampoline twice, then 0x1.  The unwind goes on from the registers the signal frame saved."""
    from forensics.analyze import analyze_core

    root = arm64_cores.root("bookworm")  # skips, saying why, without qemu-user or the mirror
    # GIVEN a handler running when the process died, in a core gdb-multiarch reads: a CPU without pointer
    # authentication (gdb cannot unwind a PAC core without the mask note) and a program gdb need not relocate
    exe = tmp_path / "nested_handler"
    subprocess.run([CROSS_CC, "-O1", "-g", "-no-pie", "-o", str(exe), str(SOURCE)], check=True, timeout=120)
    proc = subprocess.run([shutil.which("qemu-aarch64-static") or "qemu-aarch64-static", "-L", str(root),
                           str(exe), mode], cwd=tmp_path, capture_output=True, timeout=120,
                          env={**os.environ, "QEMU_CPU": "cortex-a72"},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
    assert proc.returncode < 0, proc.stderr
    (core,) = tmp_path.glob("qemu_nested_handler_*.core")
    # WHEN forensics unwinds it (libdw) and gdb-multiarch does
    thread = analyze_core(str(core), sysroot=str(root), exe=str(exe)).snapshot.crashed_thread
    theirs = _gdb_backtrace(root, exe, core)
    # THEN below the handler come the interrupted function and its callers down to _start, no trampoline again
    assert thread.native_method is not None and thread.native_method.value == "libdw" and not thread.native_error
    (sf,) = thread.signal_frames
    ours = [f.symbol for f in thread.native_frames if not f.inlined]
    assert thread.native_frames[sf.native_index].pc == sf.trampoline
    below = ours[sf.native_index + 1:]
    assert thread.native_frames[sf.native_index + 1].pc == sf.pc  # the interrupted pc, from uc_mcontext
    assert below[-1] == "_start" and None not in below, ours
    # and they are gdb's below its <signal handler called>, in order, to main (where gdb stops) -- gdb's one
    # frame more inside pthread_kill (__pthread_kill_internal) libdw misses above a handler as well
    gdb_below = theirs[theirs.index("<signal handler called>") + 1:]
    mine = below[:below.index("main") + 1]
    assert mine[0] == gdb_below[0] and gdb_below[-1] == "main", (mine, gdb_below)
    it = iter(gdb_below)
    assert all(name in it for name in mine), (mine, gdb_below)
    assert len(gdb_below) - len(mine) <= 1, (mine, gdb_below)
    if mode == "segv-then-abort":
        assert mine == gdb_below == ["main"]  # the faulting store in main
