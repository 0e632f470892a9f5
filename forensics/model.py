"""Typed records passed between the stages of forensics.

Data flows one way: core file -> :class:`CoreFile` -> :class:`ProcessSnapshot`
-> :class:`Analysis` -> rendered text / JSON.  Every record is frozen; derived
facts are properties, never stored fields.  This module imports nothing from
forensics but :func:`~forensics.records.record` (a frozen, slotted, keyword-only
dataclass made without compiling code: importing this module is most of a
command's start-up otherwise), so that every other module can import it.
"""
from __future__ import annotations

import enum
from bisect import bisect_right
from dataclasses import field

from forensics.modes import NativeMethod, StackMethod, Unwinder, UnwoundBy
from forensics.records import record

__all__ = [
    "Arch",
    "Source",
    "Severity",
    "CrashKind",
    "FaultKind",
    "SignalOrigin",
    "SignalSender",
    "LibraryStatus",
    "FrameKind",
    "NativeStack",
    "FrameRegisters",
    "DwarfLayout",
    "PythonStatus",
    "PythonMethod",
    "LayoutSource",
    "SigInfo",
    "SignalFrame",
    "HandlerKind",
    "SignalHandler",
    "LaterFault",
    "CoreThread",
    "Mapping",
    "Library",
    "NvmlLibrary",
    "CoreFile",
    "NativeFrame",
    "PyFrame",
    "PyThreadStack",
    "CxxException",
    "PythonStacks",
    "Thread",
    "ProcessSnapshot",
    "Crash",
    "Finding",
    "ChunkState",
    "OverflowVerdict",
    "HeapFailureKind",
    "NativeFree",
    "HeapChunk",
    "HeapBin",
    "HeapRegion",
    "HeapArena",
    "ThreadCache",
    "HeapSummary",
    "CtypesObject",
    "PyLocal",
    "BufferOwner",
    "NativeCall",
    "HeapCorruption",
    "HeapReport",
    "Analysis",
    "StoreEntry",
    "BatchEntry",
    "BatchGroup",
    "BatchResult",
]

_FRAME_KINDS_IN_LIBC = ("libc.so", "libc-", "ld-linux", "libpthread", "libm.so")
_LIBC_ABORT = ("libc.so", "libc-", "libc_malloc_debug")  # where abort() and malloc's checks run
_NVML = "libnvidia-ml"
# nvidia-ml-py's wrappers (pynvml.py; nvitop's libnvml.py wraps it): the caller that matters is above them
_BINDING_FILES = ("pynvml.py", "/api/libnvml.py", "libnvml.py")


class Arch(enum.Enum):
    """The machine a core was written on (its ELF ``e_machine``); each has its register set and layouts
    (:mod:`forensics.core.arch`)."""

    X86_64 = "x86-64"
    AARCH64 = "aarch64"


class Source(enum.Enum):
    """Where a snapshot came from."""

    CORE = "core"
    PID = "pid"


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class CrashKind(enum.Enum):
    """The class of a crash, decided from the signal and the abort message."""

    HEAP_CORRUPTION = "heap-corruption"  # glibc malloc detected a corrupted heap and aborted
    ABORT = "abort"  # SIGABRT for another reason (assert, std::terminate, Py_FatalError)
    SEGV = "segv"
    BUS = "bus"
    FPE = "fpe"
    ILL = "ill"
    OTHER_SIGNAL = "other-signal"
    # not a crash: a signal another process sent (kill(2), tgkill(2), sigqueue(3)) -- a watchdog's, an operator's,
    # the container runtime's; ``Crash.sender`` says who.  No crash fingerprint: the stacks say only where it was
    SENT_SIGNAL = "sent-signal"
    # not a crash: a core of a live process (gdb's gcore / generate-core-file), whose "signal" is the
    # stop gdb attached with (SIGSTOP), or none; no thread crashed, and it has no crash fingerprint
    SNAPSHOT = "snapshot"


class FaultKind(enum.Enum):
    """Where a faulting address points, judged against the core's mappings."""

    NEAR_NULL = "near-null"  # below 64 KiB: a NULL pointer plus an offset
    UNMAPPED = "unmapped"
    NOT_WRITABLE = "not-writable"  # SEGV_ACCERR in a readable, unwritable mapping: a write (a read would not fault)
    NOT_EXECUTABLE = "not-executable"
    NO_ACCESS = "no-access"  # SEGV_ACCERR in a mapping with no permission (PROT_NONE: a guard page), read or write
    STACK_OVERFLOW = "stack-overflow"  # in the guard below the faulting thread's stack, its stack pointer beside it
    PAST_END_OF_FILE = "past-end-of-file"  # SIGBUS BUS_ADRERR in a file mapping: no file behind the page (truncated)
    MISALIGNED = "misaligned"  # SIGBUS BUS_ADRALN: an access the CPU cannot make at that alignment
    HARDWARE_ERROR = "hardware-error"  # SIGBUS BUS_OBJERR, BUS_MCEERR_AR/AO: the memory itself failed (ECC, poison)
    MAPPED = "mapped"  # mapped with the needed permission (SEGV_PKUERR, races)
    INSTRUCTION = "instruction"  # SIGILL, SIGFPE: the address is the faulting instruction's, no data access
    UNKNOWN = "unknown"


class SignalOrigin(enum.Enum):
    """Who raised the signal the crash is about, from its siginfo's ``si_code`` and ``si_pid``."""

    FAULT = "fault"  # the kernel, for the thread's own instruction (si_code > 0: SEGV_MAPERR, BUS_ADRERR, SI_KERNEL)
    SELF = "self"  # the process itself: abort(), raise(), a handler raising a fault again (faulthandler)
    SENT = "sent"  # another process: kill(2), tgkill(2), sigqueue(3) with a pid that is not the process's own
    UNKNOWN = "unknown"  # no siginfo says (a handler without SA_SIGINFO, qemu-user's cores, no signal)


@record
class SignalSender:
    """The process that sent a signal (siginfo's ``si_pid`` and ``si_uid``, as the receiver's PID namespace sees
    them: pid 0 is a process outside it, such as the container runtime on the node)."""

    pid: int
    uid: int | None
    code: int  # SI_USER (0): kill(2); SI_TKILL (-6): tkill/tgkill(2); SI_QUEUE (-1): sigqueue(3)

    @property
    def call(self) -> str:
        """The system call the code says sent it: ``kill(2)``, ``tgkill(2)``, ``sigqueue(3)``."""
        return {0: "kill(2)", -6: "tgkill(2)", -1: "sigqueue(3)"}.get(self.code, f"si_code {self.code}")

    @property
    def label(self) -> str:
        """``pid 4242 (uid 1000)``; pid 0 is a process outside the receiver's PID namespace.

        >>> SignalSender(pid=4242, uid=1000, code=0).label, SignalSender(pid=0, uid=0, code=0).label
        ('pid 4242 (uid 1000)', 'pid 0 (uid 0: a process outside its PID namespace)')
        """
        uid = f"uid {self.uid}" if self.uid is not None else "uid unknown"
        return f"pid 0 ({uid}: a process outside its PID namespace)" if self.pid == 0 else f"pid {self.pid} ({uid})"


class LibraryStatus(enum.Enum):
    """How a library named in the core relates to the file that would be used to read it."""

    OK = "ok"  # found, and its build-id equals the one in the core's memory
    MISMATCH = "build-id-mismatch"  # found, but a different build: not the file that crashed
    MISSING = "missing"  # no file at that path (under the sysroot, or on this machine)
    UNVERIFIED = "unverified"  # found, but one of the two build-ids could not be read


class FrameKind(enum.Enum):
    """What a row of the merged (``--native``) view is."""

    NATIVE = "native"
    PYTHON = "python"


class PythonStatus(enum.Enum):
    """What became of the Python stacks of a core (the reason is the record's ``detail``)."""

    OK = "ok"  # every thread's stack read whole
    PARTIAL = "partial"  # stacks read, but one was cut short, or the walk reached one of its bounds
    NO_INTERPRETER = "no-interpreter"  # the runtime has no interpreter (not started yet, or finalized)
    NOT_PYTHON = "not-python"  # no object in the core defines _PyRuntime: not a CPython process
    NO_RUNTIME = "no-runtime"  # a CPython process whose _PyRuntime could not be located (files missing)
    UNSUPPORTED = "unsupported"  # _PyRuntime found, but no layout for its version or build
    FAILED = "failed"  # reading stopped before the first thread (the runtime's memory is not in the core)


class PythonMethod(enum.Enum):
    """Whose layout the Python stacks shown were walked with (``--method`` chooses; auto and both pick one)."""

    GDB = "gdb"  # CPython's DWARF, read by gdb
    DIRECT = "direct"  # the core's _Py_DebugOffsets and the table
    NONE = "none"  # no Python stacks


class LayoutSource(enum.Enum):
    """Where the struct layout the walker trusted came from."""

    DEBUG_OFFSETS = "debug-offsets"  # the _Py_DebugOffsets CPython 3.13+ publishes in the core, over the table
    TABLE = "table"  # layouts.json, generated from the DWARF of each version's builds
    DWARF = "dwarf"  # the DWARF of the core's own interpreter, read by gdb


@record
class SigInfo:
    """The signal that killed the process (NT_SIGINFO)."""

    signo: int
    code: int
    errno: int
    name: str
    addr: int | None = None  # si_addr for SIGSEGV, SIGBUS, SIGFPE, SIGILL
    sender_pid: int | None = None  # si_pid for signals sent by kill()/abort()
    sender_uid: int | None = None  # si_uid beside it (None where only the registers tell: a handler without SA_SIGINFO)


@record
class SignalFrame:
    """A signal frame on a thread's stack: the kernel delivered ``signal`` to a handler, which was still
    running (or had not returned) when the core was written.

    The kernel pushes an ``rt_sigframe`` (the handler's return address, the sigreturn trampoline
    ``__restore_rt``; the interrupted context's registers; the siginfo) and runs the handler on top of
    it.  Everything above the frame on the stack ran in the handler; everything below it was
    interrupted.
    """

    address: int  # where the frame lies (x86-64: its return-address slot; AArch64: its siginfo), on the thread's
    # stack or its signal stack
    trampoline: int  # the sigreturn trampoline the handler returns to (__restore_rt; __kernel_rt_sigreturn; 0: unknown)
    signal: SigInfo  # the signal delivered: the siginfo the kernel pushed, or what the registers tell
    signal_source: str  # "siginfo" (an SA_SIGINFO handler's), "registers" (inferred), "unknown" (signo 0)
    pc: int  # the interrupted instruction pointer (uc_mcontext.rip / .pc)
    sp: int  # the interrupted stack pointer (uc_mcontext.rsp / .sp)
    alternate_stack: bool  # the handler ran on an alternate signal stack (sigaltstack, SA_ONSTACK)
    native_index: int | None = None  # the trampoline's frame in the thread's native frames; None: not unwound
    py_index: int | None = None  # how many of the thread's Python frames (innermost first) ran in the handler
    fault_address: int | None = None  # AArch64: uc_mcontext.fault_address (the FAR; None when 0)
    esr: int | None = None  # AArch64: the esr_context record's syndrome (a fault the CPU raised; qemu-user writes none)
    # the interrupted instruction follows a system call's (syscall; svc #0): the thread was in the kernel, so no
    # instruction of its own faulted -- the signal came from a process (None: the code bytes were not read)
    in_syscall: bool | None = None


class HandlerKind(enum.Enum):
    """What a signal handler is."""

    NATIVE = "native"  # a C function (its symbol, or its library and offset)
    PYTHON_CALLBACK = "python-callback"  # a Python callable called through ctypes or cffi
    FAULTHANDLER = "faulthandler"  # Python's faulthandler: dumps the tracebacks and re-raises the signal
    UNKNOWN = "unknown"  # the native stack was not unwound, or the handler's frame is unreadable


@record
class SignalHandler:
    """The handler of a signal, as far as the core names it."""

    signal_name: str  # the signal it was handling (SIGABRT)
    kind: HandlerKind
    name: str | None  # the native symbol, the Python callable (its qualified name), or "faulthandler"
    where: str | None = None  # its library (native) or its file and line (Python callable)

    @property
    def label(self) -> str:
        """``on_abort (exporter.py:87)``, ``reporter_on_abort (libreporter.so)``, ``faulthandler``."""
        if self.kind is HandlerKind.FAULTHANDLER:
            return "faulthandler"
        name = self.name or "(unnamed)"
        return f"{name} ({self.where})" if self.where else name


@record
class LaterFault:
    """The fault that killed the process after the first one: raised inside a handler of the first
    fault's signal (``handler`` set), or by another thread (``handler`` None)."""

    signal: int
    signal_name: str
    fault_address: int | None
    fault_kind: FaultKind | None
    tid: int | None
    handler: SignalHandler | None


@record
class CoreThread:
    """One NT_PRSTATUS note: a thread as the kernel saw it at the crash."""

    tid: int
    signal: int
    pc: int
    sp: int
    fs_base: int = 0


@record
class Mapping:
    """One virtual memory area of the crashed process."""

    start: int
    end: int
    offset: int  # file offset (NT_FILE page offset * page size)
    perms: str  # "r-xp" style, from the PT_LOAD segment flags
    path: str | None  # None for anonymous memory
    in_core: int = 0  # bytes of this range present in the core file

    @property
    def size(self) -> int:
        return self.end - self.start

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end


@record
class Library:
    """An ELF object mapped in the process, with the build-id check against the file on disk."""

    path: str  # as the core names it
    base: int  # lowest mapped address
    build_id: str | None  # read from the core's memory
    file_path: str | None  # the file that would be used (sysroot / disk), None when missing
    file_build_id: str | None
    status: LibraryStatus
    # the name the dynamic linker loaded it by (link_map's l_name, a soname link: libnvidia-ml.so.1) when the
    # core has no NT_FILE and --sysroot resolved that to the file's own name, ``path``; else None
    loaded_as: str | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@record
class NvmlLibrary:
    """The libnvidia-ml.so that was mapped: the first question in every NVML crash."""

    path: str
    build_id: str | None
    driver_version: str | None
    version_source: str | None  # "file-name" or "version-string"


#: the last mappings :meth:`CoreFile.find_mapping` indexed and their starts (an analysis asks of one core's, a frame
#: at a time; a batch's next core replaces them)
_MAPPING_INDEX: list[tuple] = [((), [])]


def _mapping_starts(mappings: tuple[Mapping, ...]) -> list[int] | None:
    """The starts of ``mappings`` when they are sorted by address and apart (a core's are), for a search by
    bisection that finds what the scan in order finds; None otherwise."""
    indexed, starts = _MAPPING_INDEX[0]  # one tuple read at once: a thread may replace it meanwhile
    if indexed is mappings:
        return starts
    starts = [m.start for m in mappings]
    if any(m.end < m.start for m in mappings) or any(mappings[i].end > mappings[i + 1].start
                                                      for i in range(len(mappings) - 1)):
        starts = None
    _MAPPING_INDEX[0] = (mappings, starts)
    return starts


@record
class CoreFile:
    """What the core file itself says, read without gdb."""

    path: str
    size: int
    pid: int
    command: str  # pr_fname (15 chars)
    args: str  # the command line: argv from the stack, else pr_psargs (80 chars)
    executable: str | None  # AT_EXECFN / the first NT_FILE mapping of the main program
    build_id: str | None  # the executable's build-id from the core's memory
    signal: SigInfo | None
    threads: tuple[CoreThread, ...]
    mappings: tuple[Mapping, ...]
    libraries: tuple[Library, ...]
    nvml: NvmlLibrary | None
    abort_message: str | None
    truncated: bool
    expected_size: int  # what the program headers promise; > size when truncated
    mtime: float | None = None  # when the core file was last written (the kernel writes it at the crash)
    problems: tuple[str, ...] = ()  # malformed notes read around: what the core reader left out (partial)
    args_cut: bool = False  # ``args`` is pr_psargs cut at 80 bytes: the stack holding the whole line was not read
    arch: Arch = Arch.X86_64  # the crashed machine's, from the ELF header
    # where the names of the mapped files came from: "NT_FILE", "link_map" (the dynamic linker's list in the
    # core's memory, when the core has no NT_FILE: qemu-user's cores), or "" (neither)
    mappings_from: str = "NT_FILE"
    #: the bits of a code address that are the address: a return address AND this drops AArch64's
    #: pointer-authentication code (NT_ARM_PAC_MASK's instruction mask; without that note, the bits above 48)
    code_address_mask: int = 0xFFFF_FFFF_FFFF_FFFF
    #: AArch64: the process authenticated its return addresses (HWCAP_PACA) and the core has no NT_ARM_PAC_MASK
    #: (qemu-user's): libdw's stacks strip by the address width; gdb stops after the first frame
    pac_mask_missing: bool = False

    def code_address(self, value: int) -> int:
        """``value`` (a return address, a saved pc) without its pointer-authentication code.

        >>> hex(CoreFile(path="c", size=0, pid=1, command="", args="", executable=None, build_id=None, signal=None,
        ...              threads=(), mappings=(), libraries=(), nvml=None, abort_message=None, truncated=False,
        ...              expected_size=0, code_address_mask=(1 << 48) - 1).code_address(0x3a000055_00001234))
        '0x5500001234'
        """
        return value & self.code_address_mask

    @property
    def crashed_tid(self) -> int | None:
        # The kernel writes the dumping (signalled) thread's NT_PRSTATUS first.
        return self.threads[0].tid if self.threads else None

    def find_mapping(self, addr: int) -> Mapping | None:
        """The first mapping holding ``addr`` (None: none does)."""
        mappings = self.mappings
        starts = _mapping_starts(mappings)
        if starts is None:  # not sorted apart: the first that holds it, in order
            return next((m for m in mappings if m.contains(addr)), None)
        i = bisect_right(starts, addr) - 1
        return mappings[i] if i >= 0 and addr < mappings[i].end else None

    def read_from_file(self, addr: int, size: int) -> bytes | None:
        """Up to ``size`` bytes at ``addr`` of a file mapping the core did not dump (a library's read-only data),
        read from the library's file when it is the build that ran (OK or UNVERIFIED); None where it is not."""
        import os

        m = self.find_mapping(addr)
        if m is None or not m.path:
            return None
        lib = next((lib for lib in self.libraries if lib.path == m.path and lib.file_path
                    and lib.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED)), None)
        if lib is None or lib.file_path is None:
            return None
        try:
            with open(lib.file_path, "rb") as f:
                return os.pread(f.fileno(), min(size, m.end - addr), m.offset + (addr - m.start))
        except OSError:
            return None


@record
class NativeFrame:
    """One native frame.  An inlined frame shares its pc with the frame it was inlined into
    (the next one out) and has no offset of its own; a tail-call frame is one gdb reconstructed
    from DWARF call-site records, with no return address of its own on the stack."""

    index: int
    pc: int
    symbol: str | None  # the function (DWARF name, else the ELF symbol); None when unnamed ("??")
    offset: int | None  # pc - start of its ELF symbol, when that symbol starts where the function does
    library: str | None  # path of the object the pc is in
    file: str | None = None
    line: int | None = None
    inlined: bool = False
    tailcall: bool = False

    @property
    def library_name(self) -> str | None:
        return self.library.rsplit("/", 1)[-1] if self.library else None

    @property
    def is_libc(self) -> bool:
        name = self.library_name or ""
        return any(name.startswith(p) for p in _FRAME_KINDS_IN_LIBC)

    @property
    def is_eval_frame(self) -> bool:
        """True for the CPython evaluation loop, where Python frames are merged in."""
        return self.symbol in ("_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx") or self.is_tail_call_handler

    @property
    def is_tail_call_handler(self) -> bool:
        """True for an opcode handler of 3.14's tail-calling interpreter (clang builds): it runs inside one
        ``_PyEval_EvalFrameDefault`` call, above it on the native stack."""
        return self.symbol is not None and self.symbol.startswith("_TAIL_CALL_")

    @property
    def is_python_runtime(self) -> bool:
        name = self.library_name or ""
        return name.startswith("libpython") or name.startswith("python")

    @property
    def is_nvml(self) -> bool:
        """The frame is in the driver's NVML library (libnvidia-ml.so)."""
        return _NVML in (self.library_name or "")

    def describe(self, *, brief: bool = False) -> str:
        """The frame as one line, the one wording of analyze's text and the reports' stacks:
        ``#0   0x00007f... nvmlDeviceGetFieldValues+112 (libnvidia-ml.so.1) at /src/nvml.c:40``; ``brief``:
        without the address (it differs from run to run) and the source file's directory."""
        off = f"+{self.offset}" if self.offset else ""
        mark = " [inlined]" if self.inlined else (" [tail call]" if self.tailcall else "")
        src = self.file.rsplit("/", 1)[-1] if brief and self.file else self.file
        where = f" at {src}:{self.line}" if src and self.line else ""
        address = "" if brief else f"0x{self.pc:016x} "
        return f"#{self.index:<3} {address}{self.symbol or '??'}{off}{mark} ({self.library_name or '?'}){where}"


@record
class DwarfLayout:
    """CPython's struct layout as gdb read it from the DWARF of the core's interpreter (``forensics-layout``, parsed
    by :func:`forensics.gdb.parse_layout`), or why gdb could not: exactly one of ``table`` and ``error``."""

    table: dict | None = None  # one record in pyread/layouts.json's format (ptr_size, types, sizes, enums, symbols)
    objfile: str | None = None  # the file whose DWARF defines _PyRuntime, as gdb names it
    error: str | None = None  # why there is no table ("no DWARF for _PyRuntime ...")


@record
class FrameRegisters:
    """The registers an unwinder recovered in one physical frame: every register in the innermost frame, in
    its callers the callee-saved ones the callees' CFI restores.  A register the unwind cannot know in a
    frame (a caller-saved one, clobbered by the call it made) is absent, never a stale value."""

    index: int  # the physical frame's index in its stack's ``frames`` (inlined frames before it share its pc)
    pc: int
    activation: bool  # the pc is where the frame stopped (innermost, or interrupted by a signal), no return address
    registers: tuple[tuple[str, int], ...]  # (name, value), in the order of DWARF's register numbers

    def register(self, name: str) -> int | None:
        """The value of register ``name`` in this frame, or None when the unwind does not know it."""
        return next((v for n, v in self.registers if n == name), None)


@record
class NativeStack:
    """One thread's native stack as an unwinder returned it (libdw's, or gdb's ``forensics-native`` parsed):
    its frames innermost first, the library each names as the unwinder found it."""

    num: int  # the unwinder's number for the thread
    tid: int  # the LWP
    frames: tuple[NativeFrame, ...]
    error: str | None = None  # why the stack stops where it does (None: it ran to its end)
    method: Unwinder | None = None  # who unwound it (REGISTERS: its program counter only, not unwound)
    stopped_in_withheld: bool = False  # libdw stopped in an object whose file it was not given (gdb has none)
    # (frame index, file, line) where libdw's line-table row of the frame's address is not a statement: the
    # address' last statement row, the one gdb names (DWARF 5 location views give one address several rows)
    statement_rows: tuple[tuple[int, str, int], ...] = ()
    # the crashed thread's registers in each physical frame, innermost first (libdw; empty for other threads and
    # gdb's stacks): where glibc's free() kept the pointer it was given (forensics.heap)
    frame_registers: tuple[FrameRegisters, ...] = ()


@record
class PyFrame:
    function: str
    file: str
    line: int | None  # None when the line table could not be decoded
    is_entry: bool = True  # first Python frame of one _PyEval_EvalFrameDefault call
    # where the frame and its code object are in the process (for reading locals later)
    frame_address: int | None = None
    code_address: int | None = None
    interpreter_id: int | None = None  # the interpreter the frame runs in (0: the main one)
    locals: tuple[PyLocal, ...] = ()  # the bound fast locals (the crashing thread's frames; others: not read)


@record
class PyThreadStack:
    """One thread state of the interpreter, as the walker read it."""

    native_thread_id: int | None  # the LWP; None when the thread state does not say and it cannot be matched
    thread_id: int  # the threading ident (pthread_t)
    name: str | None  # threading's name for it
    holds_gil: bool
    frames: tuple[PyFrame, ...]  # innermost first
    error: str | None = None  # why this stack stopped short
    interpreter_id: int | None = None
    address: int = 0  # of the PyThreadState


@record
class PythonStacks:
    """The Python stacks of every thread of a core, as one walk of the interpreter state gave them."""

    status: PythonStatus
    detail: str = ""  # one line: why not OK (where reading stopped, what is missing)
    version: str | None = None  # "3.14.10"
    layout: str | None = None  # the layout trusted, in words ("_Py_DebugOffsets of 3.14.10 over table 3.14")
    layout_source: LayoutSource | None = None
    threads: tuple[PyThreadStack, ...] = ()
    gil_holder: int | None = None  # native thread id of the thread holding the GIL
    free_threaded: bool = False
    cut: str | None = None  # the bound of the walk that cut it short (threads, frames, reads, time)

    @property
    def is_whole(self) -> bool:
        return self.status is PythonStatus.OK


@record
class CxxException:
    """The C++ exception in flight on a thread: the one ``std::terminate`` was called for (thrown through a
    ``noexcept`` function, or never caught), read from the C++ runtime's exception header in the core."""

    type: str  # the thrown object's type, demangled (``std::out_of_range``), else as the runtime names it
    mangled: str  # its type_info's name (``St12out_of_range``): the ABI's own spelling, what a fingerprint hashes
    address: int  # the thrown object
    runtime: str  # "libstdc++" (GNUCC++) or "libc++abi" (CLNGC++), from the header's exception class


@record
class Thread:
    tid: int
    name: str | None  # the threading module's name, e.g. "metrics-server"
    is_crashed: bool
    holds_gil: bool
    native_frames: tuple[NativeFrame, ...]
    py_frames: tuple[PyFrame, ...]  # innermost first
    native_error: str | None = None  # why the native stack is missing or short (the unwinder's error, no native thread)
    native_method: Unwinder | None = None  # what unwound this thread (None: it has no native stack)
    python_error: str | None = None  # why the Python stack stopped short (a frame pointer that leaves the core)
    interpreter_id: int | None = None  # the interpreter its innermost Python frame runs in (0: the main one)
    is_main: bool = False  # the process's main thread (its tid is the pid), named or not
    signal_frames: tuple[SignalFrame, ...] = ()  # signal handlers running on this thread, innermost first
    cxx_exception: CxxException | None = None  # the C++ exception in flight (std::terminate's), the crashed thread's
    # where the unwinder stopped inside the C or C++ runtime (its file not here: no CFI past libc's abort), the first
    # return address on the stack above into code outside them (a call before it), its function named: the crashed
    # thread's, for an abort's culprit (analyze.cxx.scan_caller_past_runtime); None when the frames reach past them
    scanned_caller: NativeFrame | None = None
    # why the outer signal frames were not read (more nested than the reader's bound): the frames "below the
    # outermost handler" are then still inside a handler, and the first signal is not known
    signal_frames_cut: str | None = None

    @property
    def interrupted_native_frames(self) -> tuple[NativeFrame, ...]:
        """The native frames below the outermost signal frame: what ran before any handler; all of them
        when no handler ran, none when the frames were not unwound past the handler."""
        if not self.signal_frames:
            return self.native_frames
        index = self.signal_frames[-1].native_index
        return self.native_frames[index + 1:] if index is not None else ()

    @property
    def interrupted_py_frames(self) -> tuple[PyFrame, ...] | None:
        """The Python frames that ran before any handler; None when the split is unknown (the native
        stack, which tells handler and interrupted frames apart, was not unwound)."""
        if not self.signal_frames:
            return self.py_frames
        index = self.signal_frames[-1].py_index
        return self.py_frames[index:] if index is not None else None

    @property
    def is_python(self) -> bool:
        return bool(self.py_frames)

    @property
    def inside_nvml(self) -> bool:
        """The thread faulted inside libnvidia-ml: the innermost of its interrupted native frames past libc's
        abort machinery (abort, malloc's checks) is NVML's.  The one definition of "crashed inside NVML";
        an NVML call merely in progress further out is :attr:`nvml_on_stack`."""
        for f in self.interrupted_native_frames:
            if any(x in (f.library or "") for x in _LIBC_ABORT):
                continue
            return f.is_nvml
        return False

    @property
    def nvml_on_stack(self) -> bool:
        """An NVML call was in progress when the thread was interrupted (a frame of libnvidia-ml anywhere in
        its interrupted native frames)."""
        return any(f.is_nvml for f in self.interrupted_native_frames)

    @property
    def nvml_api(self) -> str | None:
        """The NVML entry point the thread was in: libnvidia-ml's ``nvml*`` frame, else nvidia-ml-py's wrapper
        of that name on the Python stack."""
        for f in self.interrupted_native_frames:
            if f.is_nvml and (f.symbol or "").startswith("nvml"):
                return f.symbol
        for p in self.interrupted_py_frames or ():
            if p.file.endswith("pynvml.py") and p.function.startswith("nvml"):
                return p.function
        return None

    @property
    def binding_caller(self) -> str | None:
        """The innermost Python function above the NVML binding's wrappers: the caller that matters."""
        for p in self.interrupted_py_frames or ():
            if not p.file.endswith(_BINDING_FILES):
                return p.function
        return None


@record
class ProcessSnapshot:
    """Everything read from one process (a core now; a live pid later)."""

    source: Source
    core: CoreFile
    threads: tuple[Thread, ...]
    python_version: str | None
    python_status: PythonStatus
    python_stack_status: str  # "ok", or in one line why Python stacks are missing or partial
    native_method: UnwoundBy  # what produced the native stacks (REGISTERS: program counters only)
    python_method: PythonMethod  # whose layout the Python stacks were walked with
    sysroot: str | None
    python_layout: str | None = None  # the layout trusted, in words (which debug offsets, which table record)
    requested_method: StackMethod = StackMethod.AUTO  # --method as asked
    method_disagreements: tuple[str, ...] = ()  # --method both: where gdb and direct differ
    warnings: tuple[str, ...] = ()
    requested_native_method: NativeMethod = NativeMethod.AUTO  # --native-method as asked
    native_disagreements: tuple[str, ...] = ()  # --native-method both: where libdw and gdb differ

    @property
    def pid(self) -> int:
        return self.core.pid

    @property
    def executable(self) -> str | None:
        return self.core.executable

    @property
    def is_complete(self) -> bool:
        """False when stacks are missing or cut short (no unwinder, no CPython symbols, a broken frame chain,
        signal handlers nested past the reader's bound), the methods disagree, or the core is truncated or had
        malformed notes."""
        native_ok = (self.native_method.unwound or self.requested_native_method is NativeMethod.NONE
                     or (self.requested_native_method is NativeMethod.AUTO
                         and self.requested_method is StackMethod.DIRECT))
        return (
            native_ok
            and self.python_status in (PythonStatus.OK, PythonStatus.NOT_PYTHON)
            and not any(t.python_error or t.signal_frames_cut for t in self.threads)
            and not self.core.truncated
            and not self.core.problems
            and not self.method_disagreements
            and not self.native_disagreements
        )

    @property
    def crashed_thread(self) -> Thread | None:
        for t in self.threads:
            if t.is_crashed:
                return t
        return None


@record
class Crash:
    """What the crash is: the first fault (its signal, class, glibc's message, where it pointed, its
    thread).  A crash reporter's handler that faulted afterwards, or another thread's fault that
    killed the process, is ``then``; the handler that ran for the first fault is ``handler``."""

    kind: CrashKind
    signal: int | None
    signal_name: str | None
    abort_message: str | None
    fault_address: int | None
    fault_kind: FaultKind | None
    tid: int | None
    handler: SignalHandler | None = None  # the handler that ran for the first fault (faulthandler, a reporter)
    then: LaterFault | None = None  # the fault that killed the process, when it is not the first
    # the handler the first fault happened in: one for a signal that is no fault (SIGUSR1, SIGTERM), whose own
    # frames (above its signal frame) are the fault's, not the frames it interrupted
    handling: SignalHandler | None = None
    origin: SignalOrigin = SignalOrigin.UNKNOWN  # who raised the first signal (SENT: another process; then no crash)
    sender: SignalSender | None = None  # who sent it, for origin SENT

    @property
    def is_sent(self) -> bool:
        """The signal was sent by another process (kill(2), tgkill(2), sigqueue(3)): a kill, not a crash."""
        return self.kind is CrashKind.SENT_SIGNAL

    @property
    def fatal_signal(self) -> int | None:
        """The signal the process died of (the core's)."""
        return self.then.signal if self.then is not None else self.signal

    @property
    def exit_status(self) -> int | None:
        """The status a shell or Kubernetes shows for the death: 128 + the fatal signal (139 = SIGSEGV,
        134 = SIGABRT); None for a snapshot."""
        if self.kind is CrashKind.SNAPSHOT or not self.fatal_signal:
            return None
        return 128 + self.fatal_signal

    @property
    def summary(self) -> str:
        parts = [self.signal_name or "no signal", self.kind.value]
        if self.sender is not None and self.is_sent:
            parts.append(f"sent by {self.sender.label}")
        if self.abort_message:
            parts.append(repr(self.abort_message))
        if self.fault_address is not None:
            parts.append(f"at 0x{self.fault_address:x} ({self.fault_kind.value if self.fault_kind else '?'})")
        return " ".join(parts)


@record
class Finding:
    rule: str
    severity: Severity
    summary: str
    evidence: tuple[str, ...] = ()
    tid: int | None = None


class ChunkState(enum.Enum):
    """What a glibc heap chunk is, as its header and its neighbour's say."""

    IN_USE = "in-use"
    FREE = "free"  # in an unsorted/small/large bin: the next chunk's PREV_INUSE is clear
    CACHED = "cached"  # in a tcache or fastbin list (glibc keeps these marked in use)
    TOP = "top"  # the arena's top chunk (the wilderness)
    MMAPPED = "mmapped"  # a chunk of its own mmap (IS_MMAPPED)
    UNKNOWN = "unknown"  # its header or its neighbour's could not be read or trusted


class OverflowVerdict(enum.Enum):
    """Who wrote past the end of the buffer that overflowed, as the core shows it."""

    DRIVER = "driver-wrote-past-buffer"  # the native callee wrote past a buffer sized for the count it got
    BINDING = "binding-count-too-large"  # the caller passed a count larger than its buffer
    # the buffer is a native library's own allocation, freed by that library inside the native call, and no
    # object of the Python side points into it: no buffer or count of the binding was involved
    LIBRARY = "library-own-buffer"
    UNDETERMINED = "undetermined"  # the core does not hold what decides it (the reason says what is missing)

    @property
    def words(self) -> str:
        """The verdict in words: the one wording of analyze's text and the reports."""
        return _VERDICT_WORDS[self.value]


_VERDICT_WORDS = {
    "driver-wrote-past-buffer": "the native library wrote past a correctly sized buffer (not the binding)",
    "binding-count-too-large": "the binding passed a count larger than its buffer (not the native library)",
    "library-own-buffer": "points at the native library that freed it (not the binding)",
    "undetermined": "undetermined from the heap",
}


class HeapFailureKind(enum.Enum):
    """What the heap corruption glibc caught was, whichever of its checks caught it: one kind for every glibc
    message of one bug (a double free reads ``(top)``, ``(!prev)``, ``(fasttop)`` or tcache's message by the
    neighbours the chunk had), the key a fingerprint reduces glibc's message to."""

    DOUBLE_FREE = "double-free"  # a chunk glibc already held as free was freed again
    OVERFLOW = "overflow"  # a write past a buffer (or over its chunk's own header) damaged a chunk header
    UNDETERMINED = "undetermined"  # the rejected chunk, or what damaged it, was not found in the core


@record
class HeapChunk:
    """One glibc malloc chunk: its header as read from the core."""

    address: int  # the chunk header (the pointer malloc returned, minus 16)
    size: int  # chunksize: the size field with its 3 flag bits cleared
    flags: int  # PREV_INUSE (1), IS_MMAPPED (2), NON_MAIN_ARENA (4)
    prev_size: int
    state: ChunkState = ChunkState.UNKNOWN
    arena: int | None = None

    @property
    def mem(self) -> int:
        """The address malloc returned for this chunk."""
        return self.address + 16

    @property
    def end(self) -> int:
        return self.address + self.size


@record
class HeapBin:
    """One glibc free list (a tcache bin, fastbin, or the unsorted/small/large bins), as walked."""

    kind: str  # "tcache" | "fastbin" | "unsorted" | "small" | "large"
    index: int
    chunk_size: int | None  # the size class (None for the unsorted and large bins)
    count: int  # entries walked before the list ended or broke
    broken_at: int | None = None  # the address that broke the list
    problem: str | None = None


@record
class HeapRegion:
    """One contiguous heap: the main arena's brk heap or one ``heap_info`` of a thread arena."""

    start: int
    end: int
    first_chunk: int
    chunks_in_use: int
    bytes_in_use: int
    chunks_free: int
    bytes_free: int
    walked_to: int  # where the chunk walk stopped (the top chunk, or the break)
    broken_at: int | None = None  # the chunk whose header stopped the walk
    problem: str | None = None


@record
class HeapArena:
    """A glibc arena (``struct malloc_state``) and its heaps."""

    address: int
    kind: str  # "main" | "thread"
    top: int
    top_size: int | None
    system_mem: int
    attached_threads: int
    heaps: tuple[HeapRegion, ...]
    bins: tuple[HeapBin, ...]  # the non-empty or broken fastbins and bins
    problems: tuple[str, ...] = ()


@record
class ThreadCache:
    """A thread's tcache (``tcache_perthread_struct``)."""

    tid: int
    address: int | None
    found_by: str  # how the thread's tcache pointer was found
    arena: int | None  # the thread's arena (``thread_arena``), when found
    bins: tuple[HeapBin, ...]  # non-empty or broken bins


@record
class HeapSummary:
    """The glibc heap of the process: ``analyze --heap``."""

    glibc_version: str | None
    version_source: str
    layout_source: str
    main_arena: int | None
    main_arena_source: str
    sbrk_base: int | None
    mmapped_chunks: int | None
    mmapped_bytes: int | None
    arenas: tuple[HeapArena, ...]
    tcaches: tuple[ThreadCache, ...]
    problems: tuple[str, ...] = ()


@record
class CtypesObject:
    """A ctypes instance (``CDataObject``) read from the core: what it is and where its buffer is."""

    address: int
    type_name: str  # e.g. "c_nvmlFieldValue_t_Array_36"
    kind: str  # "array" | "structure" | "union" | "simple" | "pointer" | "function" | "other"
    buffer: int  # b_ptr
    size: int  # b_size: bytes of the buffer
    length: int | None = None  # arrays: element count
    element_type: str | None = None
    element_size: int | None = None
    value: int | None = None  # integer simple types (c_int, c_uint, c_size_t...): the value


@record
class PyLocal:
    """One fast local of a Python frame."""

    name: str
    type_name: str
    address: int
    value: str | None = None  # a short rendering of ints, strs, None and sized containers
    ctypes: CtypesObject | None = None


@record
class BufferOwner:
    """The Python object whose buffer is the chunk that overflowed."""

    name: str  # the local's name
    function: str  # the frame's function
    file: str
    line: int | None
    object: CtypesObject


@record
class NativeCall:
    """A native call in progress on the crashing thread that was passed the overflowing buffer."""

    function: str | None  # the native function the ctypes function pointer points at
    library: str | None
    caller: str  # the Python function making the call
    file: str
    line: int | None
    arguments: tuple[str, ...]  # as found on the frame's value stack
    buffer_argument: int  # index into arguments
    count_argument: int | None  # index of the count, when one integer argument is there
    count: int | None


@record
class NativeFree:
    """The native code that called glibc's allocator when it aborted on the chunk (the crashing thread's frames)."""

    entry: str  # the allocator function called: "free", "realloc", ...
    function: str  # its caller: a symbol, or the program counter in hex
    library: str | None  # the caller's object file (None: not in a mapped file)
    call: str | None = None  # the outermost function of that library on the stack: the call it was inside
    python_caller: str | None = None  # the innermost Python frame: "function (file:line)"


@record
class HeapCorruption:
    """The anatomy of a heap corruption glibc detected: which chunk, which buffer, how far, and who."""

    message: str | None  # glibc's abort message
    check: str  # what glibc's check looked at, in words
    rejected: HeapChunk | None  # the chunk glibc was working on when it aborted
    rejected_found_by: str | None  # "register rbx" / "stack at 0x... (sp+0x38)" / "bin walk"
    damaged: HeapChunk | None  # the chunk whose header is inconsistent
    inconsistencies: tuple[str, ...]
    overflowed: HeapChunk | None  # the chunk right before the damaged header: the buffer that overflowed
    usable_size: int | None  # of the chunk that overflowed
    buffer_size: int | None  # of the buffer in it, when its owner says (a ctypes object's b_size)
    overflow_length: int | None  # bytes written past the buffer's end (its usable size when the buffer is unknown)
    overflow_past_usable: int | None  # bytes written past the chunk's usable size
    overflow_exact: bool  # False: at least this many
    overflow_basis: str  # how the length was measured
    first_bytes: str  # hex of the first bytes past the buffer's end
    owner: BufferOwner | None = None
    call: NativeCall | None = None
    verdict: OverflowVerdict = OverflowVerdict.UNDETERMINED
    verdict_reason: str = ""
    problems: tuple[str, ...] = ()
    freed_by: NativeFree | None = None  # Python processes: the native code whose free() glibc aborted in
    kind: HeapFailureKind = HeapFailureKind.UNDETERMINED  # what the corruption was (a double free, an overflow)

    @property
    def freed_in(self) -> str | None:
        """The base name of the object file whose free() glibc aborted in."""
        return (self.freed_by.library or "").rsplit("/", 1)[-1] or None if self.freed_by else None

    @property
    def verdict_words(self) -> str:
        """The verdict in words, naming the library whose own buffer it was when it is one."""
        if self.verdict is OverflowVerdict.LIBRARY and self.freed_in:
            return f"points at {self.freed_in}, not the binding"
        return self.verdict.words


@record
class HeapReport:
    """``Analysis.heap``: the corruption's anatomy (heap-corruption crashes) and the arena summary (--heap)."""

    corruption: HeapCorruption | None = None
    summary: HeapSummary | None = None
    problems: tuple[str, ...] = ()  # why the heap could not be read (no libc, unknown glibc, no arena)


@record
class StoreEntry:
    """``Analysis.store``: a core read from systemd-coredump's store (``/var/lib/systemd/coredump``)."""

    path: str  # the compressed file, as given (the analysis read its decompressed copy in the cache); "" for none
    compression: str  # zstd, lz4 or xz; "" for a crash the journal holds without a core to read
    # systemd-coredump's journal fields for it, COREDUMP_ dropped and lower-cased: unit, cmdline, signal, ...
    journal: tuple[tuple[str, str], ...] = ()
    journal_missing: str | None = None  # why the journal said nothing of it (no journalctl, no entry)
    # a crash without a core to read: the crashed thread's stack as systemd-coredump logged it ("#0  0x... fn (lib +
    # 0x...)"), the first frames
    stack: tuple[str, ...] = ()


@record
class Analysis:
    snapshot: ProcessSnapshot
    crash: Crash
    fingerprint: str | None  # None for a snapshot (no crash)
    fingerprint_basis: tuple[str, ...]  # the exact strings hashed, so a fingerprint can be explained
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    heap: HeapReport | None = None  # heap-corruption crashes, and any core with --heap
    fingerprint_partial: str | None = None  # why a part the definition uses was unavailable (then it differs)
    # the definition the fingerprint was made by (analyze.fingerprint.FINGERPRINT_VERSION; None: none, or an analysis
    # read back from a document written before the version was carried)
    fingerprint_version: int | None = None
    # the previous definition's (analyze.fingerprint.fingerprint_basis_v3), so stored keys map to the new ones
    fingerprint_v3: str | None = None
    fingerprint_v3_basis: tuple[str, ...] = ()
    # version 2's key, retired with version 4: no longer computed (None), kept when an analysis written by a version
    # that computed it (its fingerprint then a version 3 one) is read back
    fingerprint_v2: str | None = None
    fingerprint_v2_basis: tuple[str, ...] = ()
    store: StoreEntry | None = None  # a core from systemd-coredump's store: the file and its journal metadata

    @property
    def is_crash(self) -> bool:
        """A crash: not a snapshot of a live process (gcore), nor a signal another process sent (a kill)."""
        return self.crash.kind not in (CrashKind.SNAPSHOT, CrashKind.SENT_SIGNAL)

    @property
    def fault_thread(self) -> Thread | None:
        """The thread of the first fault (a crash reporter's handler that faulted on top is ``crash.then``),
        else the thread the core marks crashed, else the first."""
        threads = self.snapshot.threads
        if self.crash.tid is not None:
            for t in threads:
                if t.tid == self.crash.tid:
                    return t
        return self.snapshot.crashed_thread or (threads[0] if threads else None)


@record
class BatchEntry:
    """One input of a batch: a core that was analyzed, one that failed with its reason, or a bundle that
    kept no core (``no_core`` says why)."""

    path: str
    mtime: float  # when the crash happened: the bundle's record, else the core file's modification time
    analysis: Analysis | None
    error: str | None
    no_core: str | None = None  # a metadata-only bundle, or a crash the journal holds alone: why no core was kept
    store: StoreEntry | None = None  # a crash systemd-coredump's journal holds without a core: what it says

    @property
    def partial(self) -> str | None:
        """Why this core's analysis is partial (its fingerprint may then differ), or None when it is whole."""
        a = self.analysis
        if a is None or a.fingerprint is None:
            return None
        core = a.snapshot.core
        if core.truncated:
            return f"truncated core ({core.size:,} of {core.expected_size:,} bytes)"
        if core.problems:
            return f"malformed core: {core.problems[0]}"
        if a.fingerprint_partial:
            return a.fingerprint_partial
        if not a.snapshot.is_complete:
            return next(iter(a.snapshot.warnings), "incomplete stacks")
        return None


@record
class BatchGroup:
    fingerprint: str
    signature: str
    count: int
    first_seen: float
    last_seen: float
    example: str
    paths: tuple[str, ...]
    partial: tuple[str, ...] = ()  # "path: why" of each member whose analysis is partial
    fingerprints_v3: tuple[str, ...] = ()  # its members' keys by the previous definition (fingerprint_v3), sorted


@record
class BatchResult:
    groups: tuple[BatchGroup, ...]
    failed: tuple[BatchEntry, ...]
    total: int
    skipped: tuple[str, ...] = ()  # files in the directories given that are not cores (not analyzed)
    snapshots: tuple[BatchEntry, ...] = ()  # cores of live processes (gcore): no crash, no fingerprint
    metadata_only: tuple[BatchEntry, ...] = ()  # bundles whose core was not kept; crashes the journal holds alone
    sent: tuple[BatchEntry, ...] = ()  # cores of processes another process killed (a sent signal): no crash

    @property
    def metadata_bundles(self) -> tuple[BatchEntry, ...]:
        """The bundles whose core was not kept (the core handler's metadata-only crashes)."""
        return tuple(e for e in self.metadata_only if e.store is None)

    @property
    def journal_only(self) -> tuple[BatchEntry, ...]:
        """The crashes systemd-coredump's journal holds without a core to read."""
        return tuple(e for e in self.metadata_only if e.store is not None)

    @property
    def partial(self) -> int:
        """How many analyzed cores are partial."""
        return sum(len(g.partial) for g in self.groups)

    @property
    def bugs(self) -> int:
        """How many bugs the batch found: its distinct fingerprints (the fingerprint is "the same bug")."""
        return len(self.groups)

    @property
    def fingerprints_v3(self) -> int:
        """How many distinct keys the previous fingerprint definition gives the same cores (a fleet's stored keys)."""
        return len({k for g in self.groups for k in g.fingerprints_v3})
