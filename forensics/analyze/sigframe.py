"""Signal frames: where a thread was running a signal handler, and what the handler interrupted.

To run a handler, the x86-64 Linux kernel pushes an ``rt_sigframe`` below the interrupted
stack pointer (or on the thread's alternate signal stack) and points the handler's return
address at the sigreturn trampoline, glibc's ``__restore_rt`` (``mov $15,%rax; syscall``)::

    +0    pretcode       the handler's return address: the trampoline
    +8    struct ucontext   uc_flags, uc_link, uc_stack, uc_mcontext (the interrupted registers), uc_sigmask
    +312  struct siginfo    the signal that was delivered (signo, code, address or sender)

A handler that faults (a crash reporter reading through a bad pointer while glibc aborts)
leaves that frame on the stack under its own frames: the core then holds both signals.
:func:`find_signal_frames` finds the frames from the core alone, whichever unwinder made the
native frames or none: the trampoline is known by its symbol in the unwound frames and by its
bytes in the C library's text (so an unnamed ``__restore_rt`` counts), and each thread's stack
is searched, from its stack pointer up, for a return address equal to a trampoline whose
frame reads as a kernel signal frame.  When native frames were unwound, a frame is kept only
where the unwinder saw the trampoline followed by the interrupted instruction (a stale copy
of a frame long returned from never is); the frame's index there splits the native stack,
and the evaluation-loop frames above it split the Python stack (:func:`split_python_frames`).
:func:`name_handler` names what ran on top: a native symbol, the Python callable of a
ctypes/cffi callback, or faulthandler.

AArch64 cores (EM_AARCH64) are read by :mod:`forensics.analyze.sigframe_aarch64`: the arm64 kernel's
frame (its siginfo, then the ucontext with fault_address, x0-x30, sp, pc, pstate and the esr record),
found by its shape, the trampoline the vDSO's ``__kernel_rt_sigreturn``; the functions here choose by
the core's machine (``CoreFile.arch``).

Pure over records plus bounded reads of the core (and of the C library's text); no gdb.
"""
from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Callable
from dataclasses import replace

from ..core import elf
from ..core.memory import CoreMemory, MemoryNotInCore
from . import sigframe_aarch64 as a64
from ..model import (
    Arch,
    CoreFile,
    CoreThread,
    HandlerKind,
    LibraryStatus,
    Mapping,
    NativeFrame,
    SignalFrame,
    SignalHandler,
    SigInfo,
    Thread,
)

__all__ = [
    "SIGRETURN_TRAMPOLINE",
    "MAX_NESTED",
    "SCAN_LIMIT",
    "TextReader",
    "find_trampolines",
    "text_trampolines",
    "shape_trampolines",
    "parse_signal_frame",
    "signal_from_registers",
    "find_signal_frames",
    "read_signal_frames",
    "attach_signal_frames",
    "split_python_frames",
    "name_handler",
]

#: ``mov $0xf,%rax; syscall``: rt_sigreturn, the body of glibc's (and musl's) ``__restore_rt``
SIGRETURN_TRAMPOLINE = bytes.fromhex("48c7c00f0000000f05")
TRAMPOLINE_SYMBOLS = frozenset({"__restore_rt", "restore_rt"})
MAX_NESTED = 8  # signal frames per thread
SCAN_LIMIT = 16 << 20  # bytes of one stack searched from the stack pointer up, at most
SCAN_STEP = 64 << 10  # bytes of stack read at a time
MAX_TEXT = 64 << 20  # bytes of one library's text searched for the trampoline
MAX_TRAMPOLINES = 16

_UC = 8  # struct ucontext, after the return address
_UC_STACK = _UC + 16  # stack_t: ss_sp, ss_flags (+ padding), ss_size
_MCONTEXT = _UC + 40  # struct sigcontext: r8-r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags, ...
_RSP = 15 * 8
_SIGINFO = _UC + 304  # after uc_mcontext (256 bytes) and uc_sigmask (8)
FRAME_SIZE = _SIGINFO + 128
_SS_ONSTACK, _SS_DISABLE = 1, 2
_MAX_UC_FLAGS = 0x100  # UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS and room to grow

_text_cache: dict[tuple, tuple[int, ...]] = {}


def _is_aarch64(core: CoreFile) -> bool:
    return core.arch is Arch.AARCH64


def find_trampolines(core: CoreFile, mem: CoreMemory, threads: tuple[Thread, ...] = (), *,
                     text: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The addresses of the sigreturn trampolines in the process.

    From the unwound frames named ``__restore_rt``, and from the bytes of the C library's (and the
    executable's, for a static program) executable mappings: read from the core where the kernel
    dumped them, else from the library file the core reader checked (same build-id).

    :param text: :func:`text_trampolines` of this core, when searched already (None: searched here)
    """
    if _is_aarch64(core):
        names = {f.pc: f.symbol for t in threads for f in t.native_frames if f.symbol}
        return tuple(sorted({*a64.find_trampolines(core, mem, names), *(text or ())}))
    found: set[int] = set()
    for t in threads:
        for f in t.native_frames:
            if f.symbol in TRAMPOLINE_SYMBOLS:
                found.add(f.pc)
    for address in text_trampolines(core, mem) if text is None else text:
        found.add(address)
        if len(found) >= MAX_TRAMPOLINES:
            break
    if not found:
        found.update(shape_trampolines(core, mem))
    return tuple(sorted(found))


#: bytes of the crashed thread's stack searched for a frame of the kernel's shape when the trampoline's
#: bytes cannot be read (its C library another build, or none, and its text not in the core)
SHAPE_SCAN = 1 << 20


def shape_trampolines(core: CoreFile, mem: CoreMemory) -> tuple[int, ...]:
    """Trampolines known by the frames that return to them, for a core whose C library's text cannot be
    read (analyzed on another machine, without ``--sysroot``): a word on the crashed thread's stack, from its
    stack pointer up (:data:`SHAPE_SCAN` bytes), that points into the C library's executable mappings (the
    executable's for a static program) and whose bytes read as a signal frame the kernel pushed --
    :func:`parse_signal_frame`'s checks, and the FPU state the kernel puts just above every x86-64 signal
    frame (64-byte aligned, within 128 bytes past its end), which stale stack bytes do not have."""
    from ..core.libc import is_libc

    regs = next((t for t in core.threads if t.tid == core.crashed_tid), None)
    if regs is None or not regs.sp:
        return ()
    paths = {lib.path for lib in core.libraries if is_libc(lib.path)} or {core.executable or ""}
    code = [(m.start, m.end) for m in core.mappings if m.path in paths and "x" in m.perms]
    stack = core.find_mapping(regs.sp)
    if not code or stack is None:
        return ()
    pos = regs.sp & ~7
    data = mem.read_prefix(pos, min(stack.end - pos, SHAPE_SCAN))
    text = TextReader(core, mem)
    found: list[int] = []
    for i, word in enumerate(memoryview(data[: len(data) & ~7]).cast("Q")):
        if not any(lo <= word < hi for lo, hi in code) or word in found:
            continue
        address = pos + 8 * i
        raw = data[8 * i: 8 * i + FRAME_SIZE]
        fpstate = struct.unpack_from("<Q", raw, _MCONTEXT + 23 * 8)[0] if len(raw) == FRAME_SIZE else 0
        if fpstate % 64 or not address + FRAME_SIZE <= fpstate <= address + FRAME_SIZE + 128:
            continue
        if parse_signal_frame(core, raw, address, text) is not None:
            found.append(word)
            if len(found) >= MAX_TRAMPOLINES:
                break
    return tuple(found)


def text_trampolines(core: CoreFile, mem: CoreMemory) -> tuple[int, ...]:
    """The trampolines found by their bytes in the C library's text -- or, for a program that maps no C
    library (a static one), in the executable's.  One analysis searches once (its snapshot and its
    unwinding both ask) and passes the result on."""
    from ..core.libc import is_libc

    if _is_aarch64(core):
        return a64.find_trampolines(core, mem)
    text = TextReader(core, mem)
    wanted = [lib for lib in core.libraries if is_libc(lib.path)] or [
        lib for lib in core.libraries if lib.path == core.executable]
    found: list[int] = []
    for lib in wanted:
        for m in core.mappings:
            if m.path == lib.path and "x" in m.perms:
                found.extend(m.start + offset for offset in text.matches(m))
                if len(found) >= MAX_TRAMPOLINES:
                    break
    return tuple(found[:MAX_TRAMPOLINES])


class TextReader:
    """Reads code bytes of the process: from the core where the kernel dumped them, else from the object
    file the core reader checked (a library's text is not in a core by default).  Bounded, cached."""

    def __init__(self, core: CoreFile, mem: CoreMemory) -> None:
        self.core = core
        self.mem = mem
        # only a file of the build that ran (another build's bytes are at other offsets: a wrong trampoline)
        self._files = {lib.path: lib.file_path for lib in core.libraries
                       if lib.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED)}

    def __call__(self, addr: int, size: int) -> bytes:
        data = self.mem.read_prefix(addr, size)
        if len(data) == size:
            return data
        m = self.core.find_mapping(addr)
        if m is None or m.path is None or addr + size > m.end:
            return b""
        return _read_file(self._files.get(m.path), m.offset + (addr - m.start), size)

    def matches(self, m: Mapping) -> tuple[int, ...]:
        """Offsets of the sigreturn trampoline's bytes in mapping ``m``."""
        size = min(m.size, MAX_TEXT)
        data = self.mem.read_prefix(m.start, size)
        if len(data) == size:
            return _pattern_offsets(data)
        path = self._files.get(m.path or "")
        key = _file_key(path, m.offset, size)
        if key is None:
            return ()
        if key not in _text_cache:
            if len(_text_cache) > 64:
                _text_cache.clear()
            _text_cache[key] = _pattern_offsets(_read_file(path, m.offset, size))
        return _text_cache[key]


def _file_key(path: str | None, offset: int, size: int) -> tuple | None:
    """The text cache's key: what is at ``path`` now (:func:`forensics.core.symtab.file_identity`) and the
    range read; None when there is no file to read."""
    from ..core.symtab import file_identity

    identity = file_identity(path)
    if identity is None or len(identity) == 1:  # no path, or nothing there to stat
        return None
    return (*identity, offset, size)


def _read_file(path: str | None, offset: int, size: int) -> bytes:
    # the offset is the core's (NT_FILE's page offset): any value up to 2**76 is possible
    if path is None or not 0 <= offset < 1 << 62 or size <= 0:
        return b""
    try:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), size, offset)
    except (OSError, ValueError, OverflowError):
        return b""


def _pattern_offsets(data: bytes) -> tuple[int, ...]:
    out: list[int] = []
    i = data.find(SIGRETURN_TRAMPOLINE)
    while i >= 0 and len(out) < MAX_TRAMPOLINES:
        out.append(i)
        i = data.find(SIGRETURN_TRAMPOLINE, i + 1)
    return tuple(out)


def parse_signal_frame(core: CoreFile, raw: bytes, address: int,
                       text: Callable[[int, int], bytes] | None = None) -> SignalFrame | None:
    """The signal frame whose bytes (``FRAME_SIZE`` of them, from its return-address slot) are ``raw``,
    or None when they do not read as one the kernel pushed.

    The kernel writes the siginfo only for an ``SA_SIGINFO`` handler; for any other (``signal()``,
    faulthandler, a ctypes callback) that slot holds whatever the stack held, so the signal is then
    read from the interrupted registers (:func:`signal_from_registers`).

    :param text: reads code bytes at an address (to see whether the interrupted instruction follows
        a ``syscall``); None: not known

    >>> frame = bytearray(FRAME_SIZE)
    >>> struct.pack_into("<Q", frame, 0, 0x7f0000001000)       # the trampoline
    >>> struct.pack_into("<Q", frame, 8, 7)                    # uc_flags
    >>> struct.pack_into("<QQ", frame, _MCONTEXT + _RSP, 0x7ffd00002000, 0x401000)  # rsp, rip
    >>> struct.pack_into("<iiii", frame, _SIGINFO, 6, 0, -6, 0) # SIGABRT, SI_TKILL, from pid 1
    >>> struct.pack_into("<i", frame, _SIGINFO + 16, 1)
    >>> from forensics.model import Mapping
    >>> core = CoreFile(path="core", size=0, pid=1, command="", args="", executable=None, build_id=None,
    ...     signal=None, threads=(), libraries=(), nvml=None, abort_message=None, truncated=False,
    ...     expected_size=0, mappings=(Mapping(start=0x400000, end=0x402000, offset=0, perms="r-xp", path="/a"),))
    >>> f = parse_signal_frame(core, bytes(frame), 0x7ffd00001000)
    >>> f.signal.name, f.signal_source, hex(f.pc), hex(f.sp)
    ('SIGABRT', 'siginfo', '0x401000', '0x7ffd00002000')
    """
    if len(raw) < FRAME_SIZE:
        return None
    pretcode, uc_flags, uc_link = struct.unpack_from("<QQQ", raw, 0)
    ss_sp, ss_flags, ss_size = struct.unpack_from("<QixxxxQ", raw, _UC_STACK)
    regs = struct.unpack_from("<24Q", raw, _MCONTEXT)
    rsp, rip, fpstate = regs[15], regs[16], regs[23]
    if uc_flags >= _MAX_UC_FLAGS or uc_link != 0 or ss_flags & ~(_SS_ONSTACK | _SS_DISABLE | 0x80000000):
        return None
    if fpstate and not address < fpstate <= address + (1 << 20):
        return None  # the kernel puts the FPU state just above the frame, or nowhere
    if not rsp or not rip:
        return None
    where = core.find_mapping(rip)
    if where is None or "x" not in where.perms:
        return None  # the interrupted instruction must be in executable memory
    # a thread that signalled itself (glibc's abort and raise end in tgkill) was interrupted right after that
    # syscall, and its registers name the signal: that beats the siginfo slot, which holds whatever the
    # stack held unless the handler is SA_SIGINFO
    sent = _self_signal(core, regs, text)
    info, source = _siginfo(core, raw[_SIGINFO:FRAME_SIZE], trapno=regs[20])
    if sent is not None and (info is None or info.signo != sent.signo):
        info, source = sent, "registers"
    elif info is None:
        info, source = signal_from_registers(core, regs, text)
    on_alt = bool(ss_size) and not ss_flags & _SS_DISABLE and ss_sp <= address < ss_sp + ss_size
    code = text(rip - 2, 2) if text is not None else b""
    return SignalFrame(address=address, trampoline=pretcode, signal=info, signal_source=source, pc=rip, sp=rsp,
                       alternate_stack=on_alt, in_syscall=code == _SYSCALL if len(code) == 2 else None)


def _siginfo(core: CoreFile, raw: bytes, trapno: int) -> tuple[SigInfo | None, str]:
    """The frame's siginfo slot (:func:`.sigframe_aarch64.parse_siginfo_slot`), a fault's signal agreeing with
    the CPU's trap number in the frame's registers (else stale stack bytes, not a siginfo) and its address a
    user-space one."""
    def agrees(info: SigInfo) -> bool:
        if info.signo in _TRAPS_OF and trapno not in _TRAPS_OF[info.signo]:
            return False  # a fault the CPU did not raise
        return not (info.addr is not None and info.signo == _SIGSEGV and core.find_mapping(info.addr) is None
                    and info.addr >= (1 << 47))  # not a user-space address

    return a64.parse_siginfo_slot(raw, agrees)


_SIGILL, _SIGTRAP, _SIGABRT, _SIGBUS, _SIGFPE, _SIGSEGV = 4, 5, 6, 7, 8, 11
_TRAPS = {0: (_SIGFPE, 1), 6: (_SIGILL, 2), 13: (_SIGSEGV, 0x80), 17: (_SIGBUS, 1), 3: (_SIGTRAP, 1)}
_SYSCALL = b"\x0f\x05"
#: the x86 trap numbers each fault signal comes from (sigcontext's trapno): #DE, x87 #MF, SIMD #XM for
#: SIGFPE; #UD for SIGILL; #GP, #PF for SIGSEGV; #PF (a file mapping past its end), #AC for SIGBUS; #DB, #BP
_TRAPS_OF = {_SIGFPE: {0, 16, 19}, _SIGILL: {6}, _SIGSEGV: {13, 14}, _SIGBUS: {14, 17}, _SIGTRAP: {1, 3}}


def signal_from_registers(core: CoreFile, regs: tuple[int, ...], text: Callable[[int, int], bytes] | None
                          ) -> tuple[SigInfo, str]:
    """The signal a non-``SA_SIGINFO`` handler got, read from the interrupted registers.

    Interrupted right after a ``syscall`` that sent a signal to the process itself (glibc's
    ``raise``/``abort`` end in ``tgkill(pid, tid, sig)``, ``kill``/``tkill`` take ``(pid, sig)``): that
    signal.  Else the trap the CPU raised (``uc_mcontext.trapno``): a page fault at ``cr2`` is SIGSEGV
    (SIGBUS where the address is mapped with the needed access: a file mapping past its end),
    a divide error SIGFPE, an invalid opcode SIGILL, a general protection fault SIGSEGV.
    """
    rip = regs[16]
    err, trapno, cr2 = regs[19], regs[20], regs[22]
    sent = _self_signal(core, regs, text)
    if sent is not None:
        return sent, "registers"
    after_syscall = text is not None and text(rip - 2, 2) == _SYSCALL
    # a page fault at address 0 leaves cr2 0: a user-mode fault (error code bit 2) that did not follow a
    # syscall is one all the same (a NULL dereference, the commonest fault there is)
    if trapno == 14 and (cr2 or (err & 4 and not after_syscall)):
        m = core.find_mapping(cr2)
        writing = bool(err & 2)
        if m is not None and m.path and (("w" in m.perms) if writing else ("r" in m.perms)):
            return _info(_SIGBUS, 2, addr=cr2), "registers"  # BUS_ADRERR
        return _info(_SIGSEGV, 2 if err & 1 else 1, addr=cr2), "registers"  # SEGV_ACCERR / SEGV_MAPERR
    if trapno in _TRAPS and not after_syscall:
        signo, code = _TRAPS[trapno]
        return _info(signo, code, addr=None if code == 0x80 else rip), "registers"
    return _info(0, 0), "unknown"


def _self_signal(core: CoreFile, regs: tuple[int, ...], text: Callable[[int, int], bytes] | None
                 ) -> SigInfo | None:
    """The signal the thread sent itself, when it was interrupted right after a ``tgkill(pid, tid, sig)`` or
    ``kill``/``tkill(id, sig)`` syscall naming this process (its argument registers are still in place).

    Where the code bytes cannot be read (the C library another build, its text not in the core), the
    three arguments of ``tgkill`` -- this process, one of its threads, a signal -- say it alone; the
    two of ``kill``/``tkill`` are too common a pair of small numbers to."""
    rdi, rsi, rdx, rip = regs[8], regs[9], regs[12], regs[16]
    code = text(rip - 2, 2) if text is not None else b""
    if code != _SYSCALL and (code or text is None):
        return None
    tids = {t.tid for t in core.threads} | {core.pid}
    if rdi == core.pid and rsi in tids and 1 <= rdx <= 64:
        return _info(rdx, -6, sender=core.pid)
    if code and rdi in tids and 1 <= rsi <= 64:
        return _info(rsi, 0, sender=core.pid)
    return None


def _info(signo: int, code: int, *, addr: int | None = None, sender: int | None = None) -> SigInfo:
    return SigInfo(signo=signo, code=code, errno=0, name=elf.signal_name(signo) if signo else "unknown signal",
                   addr=addr, sender_pid=sender)


def _scan(core: CoreFile, mem: CoreMemory, regs: CoreThread, trampolines: tuple[int, ...],
          limit: int) -> list[SignalFrame]:
    """Signal frames from the thread's stack pointer up, innermost first: the lowest frame above it, then the
    lowest above the stack pointer it interrupted, and so on; at most ``limit``.  Each search ends at the top of
    the stack it starts on (:func:`_stack_top`) and reads in steps of :data:`SCAN_STEP`, so what it costs is
    the stack in use, not the mapping around it."""
    out: list[SignalFrame] = []
    pos = regs.sp & ~7
    needles = [t.to_bytes(8, "little") for t in trampolines]
    text = TextReader(core, mem)
    others = sorted(t.sp for t in core.threads if t.tid != regs.tid)
    while len(out) < limit:
        m = core.find_mapping(pos)
        if m is None:
            break
        best = _lowest_frame(core, mem, pos, _stack_top(m, pos, regs, others), needles, text)
        if best is None:
            break
        out.append(best)
        if best.sp <= best.address and core.find_mapping(best.sp) is m:
            break  # an interrupted stack pointer below its own frame on the same stack: stop here
        pos = best.sp & ~7
    return out


def _stack_top(m: Mapping, pos: int, regs: CoreThread, others: list[int]) -> int:
    """Where the stack holding ``pos`` ends, at most: the end of its mapping, no more than :data:`SCAN_LIMIT`
    above ``pos`` -- and, where the mapping holds more than one stack, the thread's own TCB and the next
    thread's stack pointer above ``pos``.

    glibc (and musl) put a thread's TCB (``fs_base``) at the top of the block its stack grows down in, and
    glibc 2.43 marks the guard page below a stack with ``MADV_GUARD_INSTALL`` instead of mapping it: the
    kernel then merges the stacks of many threads into one mapping, and a search bounded by the mapping
    alone reads every stack above this one.  Another thread's stack pointer is in a block above this one
    (or on an alternate stack, which a frame of this thread does not lie above either)."""
    top = min(m.end, pos + SCAN_LIMIT)
    if pos < regs.fs_base < top:
        top = regs.fs_base
    i = bisect.bisect_right(others, pos)
    if i < len(others) and others[i] < top:
        top = others[i]
    return top


def _lowest_frame(core: CoreFile, mem: CoreMemory, pos: int, top: int, needles: list[bytes],
                  text: TextReader) -> SignalFrame | None:
    """The lowest signal frame whose return-address slot lies in [``pos``, ``top``), read a step at a time."""
    while pos < top:
        data = mem.read_prefix(pos, min(top - pos, SCAN_STEP))  # pos is 8-aligned: no slot spans two steps
        best: SignalFrame | None = None
        for needle in needles:
            i = data.find(needle)
            while i >= 0 and (best is None or pos + i < best.address):
                if i % 8 == 0:
                    try:
                        raw = mem.read(pos + i, FRAME_SIZE)
                    except MemoryNotInCore:
                        raw = b""
                    frame = parse_signal_frame(core, raw, pos + i, text)
                    if frame is not None:
                        best = frame
                        break
                i = data.find(needle, i + 1)
        if best is not None or len(data) < min(top - pos, SCAN_STEP):
            return best
        pos += len(data)
    return None


def _match_frames(found: list[SignalFrame], frames: tuple[NativeFrame, ...], *,
                  aarch64: bool = False) -> list[SignalFrame]:
    """The frames the unwinder saw, each with the index of its trampoline frame: the trampoline's pc
    followed by the interrupted instruction.  A frame found on the stack that the unwinder did not
    pass through (a stale copy) is left out.

    AArch64: the trampoline's frame, in order, whatever follows it -- libdw resumes below qemu-user's
    sigtramp page (no CFI) from the frame's saved registers, but an elfutils without ``dwfl_frame_reg``
    goes on from the frame record the kernel pushed, the interrupted x29/x30, so the next frame is the
    interrupted function's caller, not its pc."""
    out = []
    start = 0
    for sf in found:
        for i in range(start, len(frames) - 1):
            if frames[i].pc == sf.trampoline and (frames[i + 1].pc == sf.pc or aarch64 and sf.trampoline):
                out.append(replace(sf, native_index=i))
                start = i + 1
                break
    return out


def find_signal_frames(core: CoreFile, mem: CoreMemory, thread: Thread,
                       trampolines: tuple[int, ...]) -> tuple[SignalFrame, ...]:
    """The signal frames on ``thread``'s stack, innermost first (see the module docstring): the innermost
    :data:`MAX_NESTED` (:func:`read_signal_frames` also says whether there were more)."""
    return read_signal_frames(core, mem, thread, trampolines)[0]


def read_signal_frames(core: CoreFile, mem: CoreMemory, thread: Thread,
                       trampolines: tuple[int, ...]) -> tuple[tuple[SignalFrame, ...], str | None]:
    """The signal frames on ``thread``'s stack, innermost first, and why the outer ones were not read (None:
    every one was).

    When the thread's native stack was unwound (more than its program counter), a frame is kept
    only where the unwinder passed through it, with the index of its trampoline frame.
    """
    aarch64 = _is_aarch64(core)
    if not trampolines and not aarch64:  # an AArch64 frame is known by its shape, its trampoline or not
        return (), None
    regs = next((t for t in core.threads if t.tid == thread.tid), None)
    if regs is None or not regs.sp:
        return (), None
    if aarch64:
        found = a64.scan_signal_frames(core, mem, regs, trampolines, MAX_NESTED + 1, _stack_top,
                                       TextReader(core, mem), SCAN_STEP)
    else:
        found = _scan(core, mem, regs, trampolines, MAX_NESTED + 1)  # one more: to know there were more
    if len(thread.native_frames) > 1:
        matched = _match_frames(found, thread.native_frames, aarch64=aarch64)
        if thread.native_error and len(matched) < len(found):
            # the unwinder stopped before it could pass through the outer ones: kept, not matched to frames
            last = matched[-1].address if matched else -1
            matched += [f for f in found if f.address > last]
        found = matched
    cut = None
    if len(found) > MAX_NESTED:
        found = found[:MAX_NESTED]
        cut = (f"more than {MAX_NESTED} signal handlers nested: the outer ones were not read, so the frames "
               "below the last handler shown still ran in a handler, and the first signal is not known")
    frames = tuple(found)
    if frames and all(f.native_index is not None for f in frames):
        frames = split_python_frames(thread, frames)
    return frames, cut


def split_python_frames(thread: Thread, frames: tuple[SignalFrame, ...]) -> tuple[SignalFrame, ...]:
    """Each signal frame with how many of the thread's Python frames ran above it (in its handler).

    Each evaluation-loop native frame above a signal frame ran one group of Python frames: up to
    and including the next entry frame (as :func:`forensics.views.frames.merge_frames` places them).
    """
    out = []
    for sf in frames:
        evals = sum(1 for f in thread.native_frames[: sf.native_index] if f.is_eval_frame and not _inlined(f))
        n = 0
        groups = 0
        while groups < evals and n < len(thread.py_frames):
            while n < len(thread.py_frames):
                n += 1
                if thread.py_frames[n - 1].is_entry:
                    break
            groups += 1
        out.append(replace(sf, py_index=n))
    return tuple(out)


def _inlined(f: NativeFrame) -> bool:
    return bool(getattr(f, "inlined", False))


def attach_signal_frames(core: CoreFile, threads: tuple[Thread, ...], *, mem: CoreMemory | None = None,
                         text: tuple[int, ...] | None = None) -> tuple[Thread, ...]:
    """``threads`` with their signal frames (:func:`find_signal_frames`).

    :param mem: the core's memory, open (None: the core is opened here; a core that cannot be reopened --
        removed meanwhile -- leaves the threads as they are)
    :param text: :func:`text_trampolines` of this core, when searched already
    """
    if mem is None:
        try:
            opened = CoreMemory.open(core.path)
        except Exception:  # noqa: BLE001 - the core was read a moment ago; without it there is nothing to add
            return threads
        with opened:
            return attach_signal_frames(core, threads, mem=opened, text=text)
    trampolines = find_trampolines(core, mem, threads, text=text)
    if not trampolines and not _is_aarch64(core):
        return threads
    out = []
    for t in threads:
        frames, cut = read_signal_frames(core, mem, t, trampolines)
        out.append(replace(t, signal_frames=frames, signal_frames_cut=cut))
    return tuple(out)


def name_handler(thread: Thread, frame: SignalFrame, *, python_process: bool = False) -> SignalHandler:
    """What ran on top of ``frame``: the Python callable of a ctypes/cffi callback, faulthandler, or the
    native function the kernel called (the frame just above the trampoline; unnamed: its library).

    faulthandler is named by its frames (``faulthandler_*``), or, where it tail-called ``raise``
    and left no frame of its own, by what it does: in a Python process, a handler on an alternate
    signal stack (CPython's only ``SA_ONSTACK`` handler) whose only frames are libc's, re-raising.

    :param python_process: whether the process runs CPython
    """
    name = frame.signal.name
    if frame.native_index is None:
        return SignalHandler(signal_name=name, kind=HandlerKind.UNKNOWN, name=None)
    above = thread.native_frames[: frame.native_index]
    if any((f.symbol or "").startswith("faulthandler_") for f in above):
        return SignalHandler(signal_name=name, kind=HandlerKind.FAULTHANDLER, name="faulthandler")
    inner = thread.signal_frames.index(frame) if frame in thread.signal_frames else 0
    start = (thread.signal_frames[inner - 1].py_index or 0) if inner > 0 else 0
    handler_frames = thread.py_frames[start:frame.py_index or 0]
    if handler_frames:  # Python code ran in the handler: a ctypes/cffi callback (or a C handler calling Python)
        from ..views.pyframes import describe_pyframe_parts

        qualified, where = describe_pyframe_parts(handler_frames[-1])  # the outermost: the callable itself
        return SignalHandler(signal_name=name, kind=HandlerKind.PYTHON_CALLBACK, name=qualified, where=where)
    if not above:
        return SignalHandler(signal_name=name, kind=HandlerKind.UNKNOWN, name=None)
    entry = above[-1]
    if python_process and frame.alternate_stack and all(f.is_libc for f in above):
        return SignalHandler(signal_name=name, kind=HandlerKind.FAULTHANDLER, name="faulthandler")
    if entry.symbol:
        return SignalHandler(signal_name=name, kind=HandlerKind.NATIVE, name=entry.symbol, where=entry.library_name)
    return SignalHandler(signal_name=name, kind=HandlerKind.NATIVE, name=None, where=entry.library_name)
