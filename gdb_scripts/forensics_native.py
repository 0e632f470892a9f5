"""GDB script: native backtraces of every thread, as one JSON line.

Loaded with ``source`` into a gdb that has the executable and the core loaded
(forensics.gdb drives it through GDB/MI).  Defines the command
``forensics-native``, which prints one line::

    FORENSICS-NATIVE-JSON: {"threads": [{"num": 1, "lwp": 1234, "frames": [...]}, ...]}

Each frame: ``{"pc", "function", "offset", "library", "file", "line"}``;
innermost first.  Nothing here runs code in the inferior (it is a core).
Bounded: at most MAX_FRAMES frames per thread and MAX_THREADS threads; an
unwinding error ends that thread's list and is reported in its ``error``.
"""
import json

import gdb

MAX_FRAMES = 512
MAX_THREADS = 4096
MARKER = "FORENSICS-NATIVE-JSON: "


def _library(pc, cache):
    """Path of the object file that contains pc (a shared library or the executable)."""
    key = pc >> 12
    if key in cache:
        return cache[key]
    name = gdb.solib_name(pc)
    if name is None and _in_main(pc):
        # Outside every shared library: the executable's own text, unless it is the vdso or
        # JIT code, which no section of the executable covers.
        name = gdb.current_progspace().filename
    cache[key] = name
    return name


_MAIN_RANGES = []


def _load_main_ranges():
    del _MAIN_RANGES[:]
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
            try:
                _MAIN_RANGES.append((int(lo, 16), int(hi, 16)))
            except ValueError:
                pass


def _in_main(pc):
    return any(lo <= pc < hi for lo, hi in _MAIN_RANGES)


def _symbol_offset(frame, pc):
    """The function's name and pc's offset into it, from debug info or the minimal symbol."""
    fn = frame.function()
    if fn is not None:
        try:
            start = int(fn.value().address)
            return frame.name() or fn.name, pc - start
        except (gdb.error, TypeError, ValueError):
            return frame.name() or fn.name, None
    name = frame.name()
    if name is None:
        return None, None
    try:
        # "malloc_printerr + 23 in section .text of /lib/x86_64-linux-gnu/libc.so.6"
        text = gdb.execute("info symbol 0x%x" % pc, to_string=True)
        head = text.split(" in section ")[0]
        if " + " in head:
            return name, int(head.rsplit(" + ", 1)[1])
        return name, 0
    except (gdb.error, ValueError):
        return name, None


def _frames(thread, libcache):
    frames = []
    error = None
    try:
        frame = gdb.newest_frame()
    except gdb.error as e:
        return frames, "no frame: %s" % e
    index = 0
    while frame is not None and index < MAX_FRAMES:
        try:
            pc = frame.pc()
            # For caller frames, pc is a return address: look up pc - 1 so that a call that is
            # the last instruction of a function is attributed to that function.
            lookup = pc if index == 0 or frame.type() != gdb.NORMAL_FRAME or pc == 0 else pc - 1
            name, offset = _symbol_offset(frame, lookup)
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
                    "library": _library(lookup, libcache),
                    "file": file,
                    "line": line,
                }
            )
            index += 1
            frame = frame.older()
        except (gdb.error, ValueError, OverflowError, TypeError) as e:
            # a damaged stack can yield absurd frames: stop this thread, keep what was read
            error = "unwinding stopped at frame %d: %s" % (index, e)
            break
    if frame is not None and index >= MAX_FRAMES:
        error = "stopped after %d frames" % MAX_FRAMES
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
            error = "unwinding stopped: %s" % reason
    return frames, error


class ForensicsNative(gdb.Command):
    """forensics-native: print every thread's native backtrace as one JSON line."""

    def __init__(self):
        super().__init__("forensics-native", gdb.COMMAND_STACK)

    def invoke(self, arg, from_tty):
        _load_main_ranges()
        inferior = gdb.selected_inferior()
        out = []
        libcache = {}
        selected = gdb.selected_thread()
        threads = sorted(inferior.threads(), key=lambda t: t.num)[:MAX_THREADS]
        for thread in threads:
            try:
                thread.switch()
            except gdb.error as e:
                out.append({"num": thread.num, "lwp": thread.ptid[1], "frames": [], "error": str(e)})
                continue
            frames, error = _frames(thread, libcache)
            out.append({"num": thread.num, "lwp": thread.ptid[1], "frames": frames, "error": error})
        if selected is not None and selected.is_valid():
            selected.switch()
        gdb.write(MARKER + json.dumps({"threads": out}, separators=(",", ":")) + "\n")
        gdb.flush()


ForensicsNative()
gdb.write("FORENSICS: native script loaded\n")
