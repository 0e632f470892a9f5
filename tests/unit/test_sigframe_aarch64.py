"""AArch64 signal frames from bytes laid out as the arm64 kernel writes them (arch/arm64/kernel/signal.c):
the esr_context record, a handler without siginfo, frames that are not the kernel's."""
from __future__ import annotations

import struct

from forensics.analyze.sigframe_aarch64 import ESR_MAGIC, describe_esr, parse_signal_frame
from forensics.core.rtsigframe import FPSIMD_MAGIC, FRAME_SIZE
from forensics.model import CoreFile, CoreThread, Mapping
from forensics.text.analysis import _signal_line

MCONTEXT, REGS, RESERVED = 304, 312, 592
CORE = CoreFile(path="/nonexistent/core", size=0, pid=100, command="", args="", executable=None, build_id=None,
                signal=None, threads=(CoreThread(tid=100, signal=6, pc=0, sp=0),), libraries=(), nvml=None,
                abort_message=None, truncated=False, expected_size=0,
                mappings=(Mapping(start=0x400000, end=0x402000, offset=0, perms="r-xp", path="/bin/a"),
                          Mapping(start=0x7f0000, end=0x7f1000, offset=0, perms="rw-p", path=None)))


def kernel_frame(*, pc: int = 0x401000, fault_address: int = 0, esr: int | None = None, pstate: int = 0x60000000,
                 x: dict[int, int] | None = None) -> bytearray:
    frame = bytearray(FRAME_SIZE)
    struct.pack_into("<Q", frame, MCONTEXT, fault_address)
    for i, v in (x or {}).items():
        struct.pack_into("<Q", frame, REGS + 8 * i, v)
    struct.pack_into("<QQQ", frame, REGS + 31 * 8, 0x7ffd2000, pc, pstate)
    struct.pack_into("<II", frame, RESERVED, FPSIMD_MAGIC, 0x210)  # fpsimd_context: always first
    if esr is not None:
        struct.pack_into("<IIQ", frame, RESERVED + 0x210, ESR_MAGIC, 16, esr)
    return frame


def test_a_fault_without_siginfo_is_read_from_the_esr_and_fault_address():
    # GIVEN a frame the kernel pushed for a non-SA_SIGINFO handler (no siginfo) after a data abort: a write
    # at 0x10, translation fault level 2 (ESR 0x92000046)
    frame = kernel_frame(fault_address=0x10, esr=0x92000046)
    # WHEN it is parsed
    f = parse_signal_frame(CORE, bytes(frame), 0x7ffd0000, 0x7f00001000)
    # THEN SIGSEGV, SEGV_MAPERR at 0x10, read from the registers; the ESR and the fault address kept
    assert (f.signal.name, f.signal.code, f.signal.addr, f.signal_source) == ("SIGSEGV", 1, 0x10, "registers")
    assert f.esr == 0x92000046 and f.fault_address == 0x10 and f.trampoline == 0x7f00001000
    # and the text line names the syndrome
    assert "ESR 0x92000046: data abort, write, translation fault (level 2)" in _signal_line(f)


def test_a_permission_fault_on_a_mapped_page_is_accerr():
    f = parse_signal_frame(CORE, bytes(kernel_frame(fault_address=0x7f0010, esr=0x9200004F)), 0x7ffd0000)
    assert (f.signal.name, f.signal.code, f.signal.addr) == ("SIGSEGV", 2, 0x7f0010)
    assert describe_esr(0x8200000F) == "instruction abort, permission fault (level 3)"


def test_a_tgkill_without_readable_code_is_read_from_its_arguments():
    # x8 = 131 (tgkill), x1 = a thread of the process, x2 = SIGABRT; x0 is tgkill's result (0)
    regs = {0: 0, 1: 100, 2: 6, 8: 131}
    f = parse_signal_frame(CORE, bytes(kernel_frame(x=regs)), 0x7ffd0000, text=lambda addr, size: b"")
    assert (f.signal.name, f.signal.sender_pid, f.signal_source) == ("SIGABRT", 100, "registers")
    # after an svc (code readable): kill(pid, sig) too -- x8 = 129, x1 = the signal
    svc = bytes.fromhex("010000d4")
    f = parse_signal_frame(CORE, bytes(kernel_frame(x={1: 6, 8: 129})), 0x7ffd0000, text=lambda addr, size: svc)
    assert f.signal.name == "SIGABRT" and f.signal_source == "registers"


def test_bytes_that_are_not_the_kernels_frame_are_no_frame():
    good = kernel_frame()
    assert parse_signal_frame(CORE, bytes(good), 0x7ffd0000) is not None
    assert parse_signal_frame(CORE, bytes(good), 0x7ffd0008) is None  # not 16-byte aligned
    bad_pstate = kernel_frame(pstate=0x60000005)  # EL1h: not a user context
    assert parse_signal_frame(CORE, bytes(bad_pstate), 0x7ffd0000) is None
    not_code = kernel_frame(pc=0x7f0000)  # the interrupted pc in a data mapping
    assert parse_signal_frame(CORE, bytes(not_code), 0x7ffd0000) is None
    no_fpsimd = bytearray(good)
    no_fpsimd[RESERVED:RESERVED + 4] = b"\0\0\0\0"
    assert parse_signal_frame(CORE, bytes(no_fpsimd), 0x7ffd0000) is None
    # a siginfo whose fault address disagrees with the frame's fault_address is stale bytes, not a siginfo
    stale = kernel_frame(fault_address=0x10, esr=0x92000046)
    struct.pack_into("<iiiiQ", stale, 0, 11, 0, 1, 0, 0x7777)
    f = parse_signal_frame(CORE, bytes(stale), 0x7ffd0000)
    assert f.signal_source == "registers" and f.signal.addr == 0x10
