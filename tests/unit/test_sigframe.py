"""Which signal a kernel signal frame says was delivered (forensics.analyze.sigframe.parse_signal_frame).

The kernel writes the siginfo slot only for an SA_SIGINFO handler; for any other it holds stale stack
bytes, which read as a plausible siginfo often enough: a C crash reporter installed with sa_handler was
classified SIGILL instead of glibc's SIGABRT in about one run of three.
"""
from __future__ import annotations

import struct

from forensics.analyze.sigframe import _MCONTEXT, _SIGINFO, FRAME_SIZE, parse_signal_frame
from forensics.model import CoreFile, CoreThread, Mapping

PID, RIP, FRAME_AT = 4242, 0x401002, 0x7FFD00001000
RDI, RSI, RDX, RSP, IP, ERR, TRAPNO, CR2 = 8, 9, 12, 15, 16, 19, 20, 22  # sigcontext's register slots


def core() -> CoreFile:
    thread = CoreThread(tid=PID, signal=6, pc=RIP, sp=0x7FFD00002000)
    return CoreFile(path="core", size=0, pid=PID, command="", args="", executable=None, build_id=None, signal=None,
                    threads=(thread,), libraries=(), nvml=None, abort_message=None, truncated=False, expected_size=0,
                    mappings=(Mapping(start=0x400000, end=0x402000, offset=0, perms="r-xp", path="/a"),))


def frame(regs: dict[int, int], siginfo: tuple[int, int, int] | None) -> bytes:
    """A frame as the kernel pushes it; ``siginfo`` is (signo, code, the address or the sender's pid)."""
    raw = bytearray(FRAME_SIZE)
    struct.pack_into("<Q", raw, 0, 0x7F0000001000)
    values = [0] * 24
    values[RSP], values[IP] = 0x7FFD00002000, RIP
    for k, v in regs.items():
        values[k] = v
    struct.pack_into("<24Q", raw, _MCONTEXT, *values)
    if siginfo is not None:
        signo, code, addr = siginfo
        struct.pack_into("<iiiiQ", raw, _SIGINFO, signo, 0, code, 0, addr)
    return bytes(raw)


def after_syscall(addr: int, n: int) -> bytes:
    return b"\x0f\x05" if (addr, n) == (RIP - 2, 2) else b"\x90" * n


def test_tgkill_registers_beat_stale_bytes_in_the_siginfo_slot():
    # GIVEN glibc's abort interrupted right after tgkill(pid, tid, SIGABRT), and stale bytes in the siginfo
    # slot that read as SIGILL/ILL_ILLOPN at a mapped address, under a page-fault trap number
    raw = frame({RDI: PID, RSI: PID, RDX: 6, TRAPNO: 14}, (4, 2, RIP))
    # WHEN the frame is read
    f = parse_signal_frame(core(), raw, FRAME_AT, after_syscall)
    # THEN the signal is the one the thread sent itself
    assert f is not None and (f.signal.name, f.signal_source) == ("SIGABRT", "registers")


def test_a_fault_the_cpu_did_not_raise_is_not_a_siginfo():
    # GIVEN no syscall before the interrupted instruction, a SIGILL "siginfo" and a page fault's trap number
    raw = frame({TRAPNO: 14, ERR: 4, CR2: 0x10}, (4, 2, RIP))
    f = parse_signal_frame(core(), raw, FRAME_AT, lambda a, n: b"\x90" * n)
    # THEN the trap decides: a SIGSEGV at cr2
    assert f is not None and (f.signal.name, f.signal.addr, f.signal_source) == ("SIGSEGV", 0x10, "registers")


def test_a_siginfo_that_agrees_with_the_trap_is_read():
    # GIVEN an SA_SIGINFO handler's frame: SIGSEGV/SEGV_MAPERR at 0x10 under a page-fault trap
    raw = frame({TRAPNO: 14, ERR: 4, CR2: 0x10}, (11, 1, 0x10))
    f = parse_signal_frame(core(), raw, FRAME_AT, lambda a, n: b"\x90" * n)
    assert f is not None and (f.signal.name, f.signal.addr, f.signal_source) == ("SIGSEGV", 0x10, "siginfo")


def test_a_siginfo_that_agrees_with_tgkill_is_the_siginfo():
    raw = frame({RDI: PID, RSI: PID, RDX: 6, TRAPNO: 14}, (6, -6, PID))  # SI_TKILL from this process
    f = parse_signal_frame(core(), raw, FRAME_AT, after_syscall)
    assert f is not None and (f.signal.name, f.signal_source) == ("SIGABRT", "siginfo")
