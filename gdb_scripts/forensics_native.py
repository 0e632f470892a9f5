"""GDB script: native backtraces of every thread, as one JSON line.

Loaded with ``source`` into a gdb that has the executable and the core loaded
(forensics.gdb drives it through GDB/MI).  Defines the command
``forensics-native``, which prints one line::

    FORENSICS-NATIVE-JSON: {"threads": [{"num": 1, "lwp": 1234, "frames": [...]}, ...]}

Each frame: ``{"pc", "function", "offset", "library", "file", "line", "inlined",
"tailcall"}``; innermost first.  An inlined frame shares its caller's pc and has
no offset of its own; a tail-call frame is one gdb reconstructed from the DWARF
call-site records (no return address of it is on the stack).  A physical
frame's offset is the pc's offset into its ELF (minimal) symbol, as ``info
symbol`` gives it, when that symbol starts where the function does.
Nothing here runs code in the inferior (it is a core).
Bounded: at most NATIVE_MAX_FRAMES frames per thread and NATIVE_MAX_THREADS
threads; an unwinding error ends that thread's list and is reported in its
``error``.  Every global name starts with ``NATIVE_`` or ``_native``: gdb's
Python scripts share one namespace, and forensics_python.py is loaded beside.
"""
import contextlib
import json

import gdb

NATIVE_MAX_FRAMES = 512
NATIVE_MAX_THREADS = 4096
NATIVE_MARKER = "FORENSICS-NATIVE-JSON: "


def _native_library(pc, cache):
    """Path of the object file that contains pc (a shared library or the executable)."""
    key = pc >> 12
    if key in cache:
        return cache[key]
    name = gdb.solib_name(pc)
    if name is None and _native_in_main(pc):
        # Outside every shared library: the executable's own text, unless it is the vdso or
        # JIT code, which no section of the executable covers.
        name = gdb.current_progspace().filename
    cache[key] = name
    return name


_NATIVE_MAIN_RANGES = []


def _native_load_main_ranges():
    del _NATIVE_MAIN_RANGES[:]
    try:
        text = gdb.execute("info files", to_string=True)
    except gdb.error:
        return
    in_exec = False
    for line in text.splitlines():
        if line.startswith("Local exec file:"):
            in_exec = True
            continue
        if line.startswith("Local core dump file:"):
            in_exec = False
            continue
        line = line.strip()
        if in_exec and line.startswith("0x") and " is " in line and " in " not in line:
            lo, _, hi = line.split(" is ")[0].partition(" - ")
            with contextlib.suppress(ValueError):  # a line of another shape: not a range
                _NATIVE_MAIN_RANGES.append((int(lo, 16), int(hi, 16)))


def _native_in_main(pc):
    return any(lo <= pc < hi for lo, hi in _NATIVE_MAIN_RANGES)


def _native_minimal_symbol(pc):
    """(name, offset) of the ELF symbol holding pc, from ``info symbol``; (None, None) when none does."""
    try:
        # "malloc_printerr + 23 in section .text of /lib/x86_64-linux-gnu/libc.so.6"
        text = gdb.execute(f"info symbol 0x{pc:x}", to_string=True)
    except gdb.error:
        return None, None
    if text.startswith("No symbol matches"):
        return None, None
    head = text.split(" in section ")[0]
    if " + " in head:
        name, _, off = head.rpartition(" + ")
        try:
            return name, int(off)
        except ValueError:
            return name, None
    return head.strip(), 0


def _native_symbol_offset(frame, pc):
    """The frame's function name (DWARF, else the minimal symbol) and pc's offset into its ELF symbol.

    The offset is given when the ELF symbol starts where the DWARF function does (not for the
    cold part of a split function, whose ELF symbol is another), or when there is no DWARF function.
    """
    name = frame.name()
    ms_name, ms_off = _native_minimal_symbol(pc)
    fn = frame.function()
    if fn is None:
        return name or ms_name, ms_off
    try:
        start = int(fn.value().address)
    except (gdb.error, TypeError, ValueError):
        return name or fn.name, None
    if ms_off is not None and pc - ms_off == start:
        return name or fn.name, ms_off
    return name or fn.name, None


def _native_frames(thread, libcache):
    frames = []
    error = None
    try:
        frame = gdb.newest_frame()
    except gdb.error as e:
        return frames, f"no frame: {e}"
    index = 0
    while frame is not None and index < NATIVE_MAX_FRAMES:
        try:
            pc = frame.pc()
            kind = frame.type()
            inlined = kind == gdb.INLINE_FRAME
            # For caller frames, pc is a return address: look up pc - 1 so that a call that is
            # the last instruction of a function is attributed to that function.  An inlined frame
            # shares its pc with the frame it is inlined into, and is looked up as that frame is.
            caller = index > 0 and (kind == gdb.NORMAL_FRAME or inlined) and pc != 0
            if inlined and frames and frames[-1]["pc"] == pc:
                caller = frames[-1]["_caller"]
            lookup = pc - 1 if caller else pc
            if inlined:
                name, offset = frame.name(), None
            else:
                name, offset = _native_symbol_offset(frame, lookup)
                if offset is not None and lookup != pc:
                    offset += 1
            sal = frame.find_sal()
            file = line = None
            if sal is not None and sal.symtab is not None:
                file = sal.symtab.filename
                line = sal.line or None
            frames.append(
                {
                    "pc": pc,
                    "function": name,
                    "offset": offset,
                    "library": _native_library(lookup, libcache),
                    "file": file,
                    "line": line,
                    "inlined": inlined,
                    "tailcall": kind == gdb.TAILCALL_FRAME,
                    "_caller": caller,
                }
            )
            index += 1
            frame = frame.older()
        except (gdb.error, ValueError, OverflowError, TypeError) as e:
            # a damaged stack can yield absurd frames: stop this thread, keep what was read
            error = f"unwinding stopped at frame {index}: {e}"
            break
    for f in frames:
        del f["_caller"]
    if frame is not None and index >= NATIVE_MAX_FRAMES:
        error = f"stopped after {NATIVE_MAX_FRAMES} frames"
    if error is None:
        reason = None
        try:
            last = gdb.newest_frame()
            while last.older() is not None:
                last = last.older()
            if last.unwind_stop_reason() not in (gdb.FRAME_UNWIND_NO_REASON, gdb.FRAME_UNWIND_OUTERMOST):
                reason = gdb.frame_stop_reason_string(last.unwind_stop_reason())
        except gdb.error:
            pass
        if reason:
            error = f"unwinding stopped: {reason}"
    return frames, error


class ForensicsNative(gdb.Command):
    """forensics-native: print every thread's native backtrace as one JSON line."""

    def __init__(self):
        super().__init__("forensics-native", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        _native_load_main_ranges()
        inferior = gdb.selected_inferior()
        out = []
        libcache = {}
        selected = gdb.selected_thread()
        threads = sorted(inferior.threads(), key=lambda t: t.num)[:NATIVE_MAX_THREADS]
        for thread in threads:
            try:
                thread.switch()
            except gdb.error as e:
                out.append({"num": thread.num, "lwp": thread.ptid[1], "frames": [], "error": str(e)})
                continue
            frames, error = _native_frames(thread, libcache)
            out.append({"num": thread.num, "lwp": thread.ptid[1], "frames": frames, "error": error, "method": "gdb"})
        if selected is not None and selected.is_valid():
            selected.switch()
        gdb.write(NATIVE_MARKER + json.dumps({"threads": out}, separators=(",", ":")) + "\n")
        gdb.flush()


ForensicsNative()
gdb.write("FORENSICS: native script loaded\n")
