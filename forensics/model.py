"""Typed records passed between the stages of forensics.

Data flows one way: core file -> :class:`CoreFile` -> :class:`ProcessSnapshot`
-> :class:`Analysis` -> rendered text / JSON.  Every record is frozen; derived
facts are properties, never stored fields.  This module imports nothing from
forensics so that every other module can import it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "Source",
    "Severity",
    "CrashKind",
    "FaultKind",
    "LibraryStatus",
    "FrameKind",
    "SigInfo",
    "CoreThread",
    "Mapping",
    "Library",
    "NvmlLibrary",
    "CoreFile",
    "NativeFrame",
    "PyFrame",
    "Thread",
    "ProcessSnapshot",
    "Crash",
    "Finding",
    "Analysis",
    "BatchEntry",
    "BatchGroup",
    "BatchResult",
]

_FRAME_KINDS_IN_LIBC = ("libc.so", "libc-", "ld-linux", "libpthread", "libm.so")


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
    NO_SIGNAL = "no-signal"  # a core made by gcore or generate-core-file of a live process


class FaultKind(enum.Enum):
    """Where a faulting address points, judged against the core's mappings."""

    NEAR_NULL = "near-null"  # below 64 KiB: a NULL pointer plus an offset
    UNMAPPED = "unmapped"
    NOT_WRITABLE = "not-writable"
    NOT_EXECUTABLE = "not-executable"
    MAPPED = "mapped"  # mapped with the needed permission (SEGV_PKUERR, stack guard, races)
    UNKNOWN = "unknown"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class SigInfo:
    """The signal that killed the process (NT_SIGINFO)."""

    signo: int
    code: int
    errno: int
    name: str
    addr: int | None = None  # si_addr for SIGSEGV, SIGBUS, SIGFPE, SIGILL
    sender_pid: int | None = None  # si_pid for signals sent by kill()/abort()


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreThread:
    """One NT_PRSTATUS note: a thread as the kernel saw it at the crash."""

    tid: int
    signal: int
    pc: int
    sp: int
    fs_base: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Library:
    """An ELF object mapped in the process, with the build-id check against the file on disk."""

    path: str  # as the core names it
    base: int  # lowest mapped address
    build_id: str | None  # read from the core's memory
    file_path: str | None  # the file that would be used (sysroot / disk), None when missing
    file_build_id: str | None
    status: LibraryStatus

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlLibrary:
    """The libnvidia-ml.so that was mapped: the first question in every NVML crash."""

    path: str
    build_id: str | None
    driver_version: str | None
    version_source: str | None  # "file-name" or "version-string"


@dataclass(frozen=True, slots=True, kw_only=True)
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

    @property
    def crashed_tid(self) -> int | None:
        # The kernel writes the dumping (signalled) thread's NT_PRSTATUS first.
        return self.threads[0].tid if self.threads else None

    def find_mapping(self, addr: int) -> Mapping | None:
        for m in self.mappings:
            if m.contains(addr):
                return m
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
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
        return self.symbol in ("_PyEval_EvalFrameDefault", "PyEval_EvalFrameEx")

    @property
    def is_python_runtime(self) -> bool:
        name = self.library_name or ""
        return name.startswith("libpython") or name.startswith("python")


@dataclass(frozen=True, slots=True, kw_only=True)
class PyFrame:
    function: str
    file: str
    line: int | None  # None when the line table could not be decoded
    is_entry: bool = True  # first Python frame of one _PyEval_EvalFrameDefault call


@dataclass(frozen=True, slots=True, kw_only=True)
class Thread:
    tid: int
    name: str | None  # the threading module's name, e.g. "metrics-server"
    is_crashed: bool
    holds_gil: bool
    native_frames: tuple[NativeFrame, ...]
    py_frames: tuple[PyFrame, ...]  # innermost first
    native_error: str | None = None  # why the native stack is missing or short (the unwinder's error, no native thread)
    native_method: str | None = None  # what unwound this thread: "libdw", "gdb", or None (program counter only)
    python_error: str | None = None  # why the Python stack stopped short (a frame pointer that leaves the core)

    @property
    def is_python(self) -> bool:
        return bool(self.py_frames)

    @property
    def in_free(self) -> bool:
        return any(f.symbol in ("free", "__libc_free", "_int_free", "cfree") for f in self.native_frames)

    @property
    def inside_nvml(self) -> bool:
        return any("libnvidia-ml" in (f.library_name or "") for f in self.native_frames)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSnapshot:
    """Everything read from one process (a core now; a live pid later)."""

    source: Source
    core: CoreFile
    threads: tuple[Thread, ...]
    python_version: str | None
    python_stack_status: str  # "ok", or why Python stacks are missing and how to get them
    native_method: str  # what produced the native stacks: "libdw", "gdb", "libdw+gdb" (gdb for the threads
    # libdw could not unwind), or "registers" (program counters only)
    python_method: str  # what produced the Python stacks: "gdb", "direct" or "none"
    sysroot: str | None
    requested_method: str = "auto"  # --method as asked
    method_disagreements: tuple[str, ...] = ()  # --method both: where gdb and direct differ
    warnings: tuple[str, ...] = ()
    requested_native_method: str = "auto"  # --native-method as asked
    native_disagreements: tuple[str, ...] = ()  # --native-method both: where libdw and gdb differ

    @property
    def pid(self) -> int:
        return self.core.pid

    @property
    def executable(self) -> str | None:
        return self.core.executable

    @property
    def is_complete(self) -> bool:
        """False when stacks are missing or cut short (no unwinder, no CPython symbols, a broken frame chain),
        the methods disagree, or the core is truncated."""
        native_ok = (self.native_method != "registers" or self.requested_native_method == "none"
                     or (self.requested_native_method == "auto" and self.requested_method == "direct"))
        return (
            native_ok
            and self.python_stack_status in ("ok", "not a Python process")
            and not any(t.python_error for t in self.threads)
            and not self.core.truncated
            and not self.method_disagreements
            and not self.native_disagreements
        )

    @property
    def crashed_thread(self) -> Thread | None:
        for t in self.threads:
            if t.is_crashed:
                return t
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Crash:
    kind: CrashKind
    signal: int | None
    signal_name: str | None
    abort_message: str | None
    fault_address: int | None
    fault_kind: FaultKind | None
    tid: int | None

    @property
    def summary(self) -> str:
        parts = [self.signal_name or "no signal", self.kind.value]
        if self.abort_message:
            parts.append(repr(self.abort_message))
        if self.fault_address is not None:
            parts.append(f"at 0x{self.fault_address:x} ({self.fault_kind.value if self.fault_kind else '?'})")
        return " ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    rule: str
    severity: Severity
    summary: str
    evidence: tuple[str, ...] = ()
    tid: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Analysis:
    snapshot: ProcessSnapshot
    crash: Crash
    fingerprint: str
    fingerprint_basis: tuple[str, ...]  # the exact strings hashed, so a fingerprint can be explained
    findings: tuple[Finding, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchEntry:
    """One input of a batch: a core that was analyzed, or one that failed with its reason."""

    path: str
    mtime: float
    analysis: Analysis | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchGroup:
    fingerprint: str
    signature: str
    count: int
    first_seen: float
    last_seen: float
    example: str
    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    groups: tuple[BatchGroup, ...]
    failed: tuple[BatchEntry, ...]
    total: int
