"""The C++ exception in flight on a crashed thread, read from the core: what ``std::terminate`` was called for.

An exception thrown through a ``noexcept`` function, or never caught, ends in ``std::terminate`` and
``abort()``: SIGABRT, and no message in glibc's ``__abort_msg`` (libstdc++'s verbose terminate handler writes
the type to stderr only).  The runtime keeps the exception in memory until the process dies: its
``__cxa_exception`` header right before the thrown object, ending in the ``_Unwind_Exception`` the unwinder
and the personality routine pass on the stack, whose first word is the exception class -- ``GNUCC++\\0``
(libstdc++; ``GNUCC++\\1`` a dependent exception: ``std::rethrow_exception``) or ``CLNGC++\\0`` (libc++abi).
Both runtimes put the header's ``exceptionType`` (a ``std::type_info*``) 80 bytes before the
``_Unwind_Exception`` on LP64 (libstdc++'s unwind-cxx.h; libc++abi's cxa_exception.h, which pads the header
at its start), and a dependent one's primary exception pointer at the same place, the primary's header 112
bytes before its object.  The type_info's name (``St12out_of_range``) is its second word.

:func:`read_cxx_exception` finds the header from the crashed thread's stack: a word on it that points at an
exception class.  Bounded: the words from the stack pointer up to :data:`STACK_WORDS`, read only for a thread
whose frames run the C++ runtime's throw or terminate machinery.
"""
from __future__ import annotations

from ..model import Arch, CxxException, NativeFrame
from ..modes import Unwinder
from ..views.names import RUNTIME_OBJECTS, demangle, is_runtime_frame

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core.memory import CoreMemory
    from ..model import CoreFile, Thread

__all__ = ["STACK_WORDS", "read_cxx_exception", "runs_cxx_runtime", "scan_caller_past_runtime", "sound_frames"]

#: how many words of the stack above the stack pointer are searched for the exception's header
STACK_WORDS = 8192
#: the exception class is one 64-bit number made of its 8 characters, the first the most significant: in memory
#: (little-endian) its bytes are the characters reversed
_CLASSES = {name[::-1]: found for name, found in (
    (b"GNUCC++\x00", ("libstdc++", False)), (b"GNUCC++\x01", ("libstdc++", True)),
    (b"CLNGC++\x00", ("libc++abi", False)), (b"CLNGC++\x01", ("libc++abi", True)))}
_TYPE_BEFORE_UNWIND = 80  # exceptionType (a dependent's primaryException) before the _Unwind_Exception
_HEADER_BEFORE_OBJECT = 112  # a primary exception's exceptionType before its thrown object
_UNWIND_SIZE = 32  # _Unwind_Exception: the thrown object follows it
_CXX_FRAMES = ("__cxa_throw", "__cxa_rethrow", "__cxa_call_terminate", "__gxx_personality_v0",
               "_Unwind_RaiseException", "_Unwind_Resume", "__cxxabiv1::__terminate", "std::terminate",
               "__cxa_begin_catch", "_ZSt9terminatev", "_ZN10__cxxabiv111__terminateEPFvvE")


def runs_cxx_runtime(thread: Thread) -> bool:
    """Whether the thread's frames run the C++ runtime's throw, unwind or terminate machinery."""
    for f in thread.native_frames:
        name = f.library_name or ""
        if f.symbol in _CXX_FRAMES or name.startswith(("libstdc++.so", "libc++abi.so", "libgcc_s.so")):
            return True
    return False


def _type_name(mem: CoreMemory, core: CoreFile, tinfo: int) -> str | None:
    """The type_info's name (its second word points at it): from the core, else from its library's file."""
    try:
        where = mem.read_u64(tinfo + 8)
    except (LookupError, ValueError, OSError):
        return None
    try:
        raw = mem.read_cstring(where, 512)
    except (LookupError, ValueError, OSError):
        raw = (core.read_from_file(where, 512) or b"").split(b"\0", 1)[0]
    name = raw.decode("ascii", "replace").lstrip("*")
    if not name or not all(c.isalnum() or c in "_$." for c in name):
        return None
    return name


def read_cxx_exception(mem: CoreMemory, core: CoreFile, thread: Thread) -> CxxException | None:
    """The C++ exception in flight on ``thread``, or None (no C++ runtime frames, no header found)."""
    if not runs_cxx_runtime(thread):
        return None
    regs = next((t for t in core.threads if t.tid == thread.tid), None)
    if regs is None:
        return None
    sp = regs.sp & ~7
    try:
        stack = mem.read_prefix(sp, STACK_WORDS * 8)
    except (LookupError, ValueError, OSError):
        return None
    seen: set[int] = set()
    for i in range(0, len(stack) - 7, 8):
        ptr = int.from_bytes(stack[i:i + 8], "little")
        if ptr in seen or ptr < 0x10000 or ptr % 8 or core.find_mapping(ptr) is None:
            continue
        seen.add(ptr)
        try:
            found = _CLASSES.get(mem.read(ptr, 8))
        except (LookupError, ValueError, OSError):
            continue
        if found is None:
            continue
        runtime, dependent = found
        try:
            head = mem.read_u64(ptr - _TYPE_BEFORE_UNWIND)
            obj = head if dependent else ptr + _UNWIND_SIZE
            tinfo = mem.read_u64(obj - _HEADER_BEFORE_OBJECT) if dependent else head
        except (LookupError, ValueError, OSError):
            continue
        mangled = _type_name(mem, core, tinfo)
        if mangled is None:
            continue
        return CxxException(type=demangle(mangled) or mangled, mangled=mangled, address=obj, runtime=runtime)
    return None


def sound_frames(frames, core: CoreFile) -> list[NativeFrame]:
    """The frames an unwinder found by their unwind tables: up to the first in no mapped object, and none past a
    frame whose object's file is not here (missing, another build): with no CFI to go on, what came after it is
    the unwinder's guess (a stale word of the stack)."""
    from ..model import LibraryStatus

    withheld = {lib.path for lib in core.libraries if lib.status in (LibraryStatus.MISSING, LibraryStatus.MISMATCH)}
    out: list[NativeFrame] = []
    for f in frames:
        if f.library is None:
            break
        out.append(f)
        if f.library in withheld:
            break
    return out


def _is_call_before(code: bytes, arch: Arch, ret: int = 0, core: CoreFile | None = None) -> bool:
    """Whether the 8 bytes right before a return address end in a call: x86-64 ``call rel32`` (E8) whose target
    is executable code, ``call *disp32(%rip)`` (FF 15), ``call *%reg`` (FF D0-D7, a REX prefix allowed),
    ``call *(%reg)``, ``call *disp8(%reg)``, ``call *disp32(%reg)`` (FF /2 with ModRM mod 0, 1, 2); AArch64
    ``bl`` or ``blr``."""
    if len(code) < 8:
        return False
    if arch is Arch.AARCH64:
        insn = int.from_bytes(code[-4:], "little")
        return (insn & 0xFC000000) == 0x94000000 or (insn & 0xFFFFFC1F) == 0xD63F0000
    if code[-5] == 0xE8:
        target = (ret + int.from_bytes(code[-4:], "little", signed=True)) & (2**64 - 1)
        m = core.find_mapping(target) if core is not None else None
        return m is not None and "x" in m.perms
    if code[-6] == 0xFF and code[-5] == 0x15:
        return True
    if code[-2] == 0xFF and (0xD0 <= code[-1] <= 0xD7 or (0x10 <= code[-1] <= 0x17 and code[-1] not in (0x14, 0x15))):
        return True
    if code[-3] == 0xFF and 0x50 <= code[-2] <= 0x57 and code[-2] != 0x54:
        return True
    return code[-6] == 0xFF and 0x90 <= code[-5] <= 0x97 and code[-5] != 0x94


def scan_caller_past_runtime(mem: CoreMemory, core: CoreFile, thread: Thread, *,
                             sysroot: str | None = None) -> NativeFrame | None:
    """The crashed thread's first return address outside the C and C++ runtimes, found on its stack where the
    unwinder stopped inside them (an abort analyzed without the crashed C library: no CFI to go past
    ``abort``), or None (the frames reach past the runtimes; nothing found).

    From the stack pointer up (:data:`STACK_WORDS` words at most), the first word pointing into executable code
    of an object that is not a runtime, right after a call instruction there (read from the core, else from the
    object's file when it is the build that ran; an address whose code cannot be read is passed over), whose
    function is named (else the first such address: a stale word on the stack is likelier where nothing names it).
    """
    frames = thread.native_frames
    if thread.native_method in (None, Unwinder.REGISTERS) and len(frames) <= 1:
        # no unwinder ran (its program counter only): the words above the stack pointer are the runtime frames'
        # own, stale return addresses among them (a heap abort's: libpython's insert_to_emptydict), no caller
        return None
    sound = sound_frames(frames, core)
    if not sound or not all(is_runtime_frame(f) for f in sound):
        return None
    regs = next((t for t in core.threads if t.tid == thread.tid), None)
    if regs is None:
        return None
    try:
        stack = mem.read_prefix(regs.sp & ~7, STACK_WORDS * 8)
    except (LookupError, ValueError, OSError):
        return None
    from ..core.symtab import symbol_at

    unnamed: NativeFrame | None = None
    for i in range(0, len(stack) - 7, 8):
        ret = int.from_bytes(stack[i:i + 8], "little") & core.code_address_mask
        m = core.find_mapping(ret - 1)
        if m is None or "x" not in m.perms or not m.path:
            continue
        if any(m.path.rsplit("/", 1)[-1].startswith(r) for r in RUNTIME_OBJECTS):
            continue
        try:
            code = mem.read(ret - 8, 8)
        except (LookupError, ValueError, OSError):
            code = core.read_from_file(ret - 8, 8) or b""
        if not _is_call_before(code, core.arch, ret, core):  # code not read: not known to be a return address
            continue
        name, path = symbol_at(core, ret - 1, sysroot=sysroot)
        frame = NativeFrame(index=len(frames), pc=ret, symbol=name, offset=None, library=path or m.path)
        if name is not None:
            return frame
        # a stale word of an object whose functions cannot be named (its file not here) is no better than a named
        # caller above it: the first named one wins, else the first found
        unnamed = unnamed or frame
    return unnamed
