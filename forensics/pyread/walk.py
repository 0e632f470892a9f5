"""The one walker: interpreters -> thread states -> frames -> code objects, never trusting a pointer.

Whatever gave the layout (the core's debug offsets, the table, gdb's DWARF), this is
the only code that walks a CPython interpreter state.  A pointer that leaves the core,
a cycle, a thread state that does not point back to its interpreter, or a chain past its
cap ends that walk with an ``error`` naming the address; the frames read so far are kept
and the other threads are still read.  The whole walk is bounded (:class:`~.objects.Limits`:
interpreters, threads, frames, memory reads, time); reaching a bound stops it where it is
and says so (:attr:`WalkResult.cut`).
"""
from __future__ import annotations

import contextlib

from forensics.model import CoreFile, PyFrame, PyThreadStack
from forensics.pyread.layouts import Layout
from forensics.pyread.objects import BadObject, CodeCache, Limits, Objects, Reader, WalkCut

__all__ = ["WalkResult", "walk_frame_objects", "walk_interpreter_frames", "first_frame", "NativeIds",
           "thread_names", "read_gil", "thread_label", "walk_runtime"]

#: frames in a row without a code object end a chain: it is not a frame chain (a real one has none)
MAX_BAD_RUN = 8
#: thread states in a row whose stacks broke end a thread list: it is not a thread list
MAX_BROKEN_THREADS = 16


class WalkResult:
    """What one walk found (the caller makes the :class:`~forensics.model.PythonStacks` of it)."""

    __slots__ = ("threads", "problems", "gil_holder", "no_interpreter", "cut")

    def __init__(self) -> None:
        self.threads: list[PyThreadStack] = []
        self.problems: list[str] = []  # each a partial result's reason
        self.gil_holder: int | None = None
        self.no_interpreter = False
        self.cut: str | None = None


def _frame(info: dict, line: int | None, is_entry: bool, addr: int, code: int, interp: int | None) -> PyFrame:
    return PyFrame(function=info["name"], file=info["file"], line=line, is_entry=is_entry,
                   frame_address=addr, code_address=code, interpreter_id=interp)


def _unknown_frame(is_entry: bool, addr: int, code: int | None, interp: int | None) -> PyFrame:
    return PyFrame(function="<unknown>", file="<unknown>", line=None, is_entry=is_entry, frame_address=addr,
                   code_address=code, interpreter_id=interp)


def walk_frame_objects(layout: Layout, rd: Reader, codes: CodeCache, frame_addr: int,
                       max_frames: int, interpreter_id: int | None = None) -> tuple[list[PyFrame], str | None]:
    """3.8-3.10: the PyFrameObject chain; one eval call per frame (every frame is an entry).  Each frame says
    ``interpreter_id``: the interpreter the thread state is of."""
    frames: list[PyFrame] = []
    seen: set[int] = set()
    error = None
    bad = 0
    while frame_addr:
        if frame_addr in seen:
            error = f"frame cycle at 0x{frame_addr:x}"
            break
        if len(frames) >= max_frames:
            error = f"stopped after {max_frames} frames"
            break
        seen.add(frame_addr)
        rd.budget.spend_frame()
        try:
            f = rd.struct(layout.frame, frame_addr)
        except BadObject as exc:
            error = f"frame 0x{frame_addr:x}: {exc}"
            break
        try:
            info = codes.get(f["f_code"])
            # a traced frame keeps its line in f_lineno; the others, in the line table at f_lasti
            line = f["f_lineno"] if f["f_trace"] and f["f_lineno"] > 0 else codes.line(info, f["f_lasti"])
            frames.append(_frame(info, line, True, frame_addr, f["f_code"], interpreter_id))
            error = error or info["error"]
            bad = 0
        except BadObject as exc:
            error = error or f"frame 0x{frame_addr:x} code: {exc}"
            frames.append(_unknown_frame(True, frame_addr, f["f_code"], interpreter_id))
            bad += 1
            if bad >= MAX_BAD_RUN:
                del frames[-bad:]
                error = f"{error}; stopped: {bad} frames in a row have no code object (not a frame chain)"
                break
        frame_addr = f["f_back"]
    return frames, error


def _iframe_line(layout: Layout, rd: Reader, codes: CodeCache, info: dict, raw: dict) -> int | None:
    frame_obj = raw["frame_obj"]
    if frame_obj:
        try:
            fo = rd.struct(layout.frameobj, frame_obj)
            if fo["f_trace"] and fo["f_lineno"] > 0:
                return fo["f_lineno"]
        except BadObject:
            pass
    instr = raw[layout.iframe_instr]
    if not instr or info["units"] is None:
        return None
    delta = instr - info["units"]
    if delta % 2:
        return None
    return codes.line(info, delta // 2)


def walk_interpreter_frames(layout: Layout, rd: Reader, codes: CodeCache, frame_addr: int,
                            max_frames: int, interpreter_id: int | None = None) -> tuple[list[PyFrame], str | None]:
    """3.11+: the _PyInterpreterFrame chain (C-stack shim frames mark entries and are skipped).  Each frame
    says ``interpreter_id``: the interpreter the thread state is of."""
    chain: list[tuple[int, dict]] = []
    seen: set[int] = set()
    error = None
    complete = True
    running = layout.running_owners
    shims = 0
    while frame_addr:
        if frame_addr in seen:
            error, complete = f"frame cycle at 0x{frame_addr:x}", False
            break
        if len(chain) >= max_frames:
            error, complete = f"stopped after {max_frames} frames", False
            break
        seen.add(frame_addr)
        rd.budget.spend_frame()
        try:
            raw = rd.struct(layout.iframe, frame_addr)
        except BadObject as exc:
            error, complete = f"frame 0x{frame_addr:x}: {exc}", False
            break
        chain.append((frame_addr, raw))
        shims = shims + 1 if raw["owner"] not in running else 0
        if shims >= MAX_BAD_RUN:  # one shim per evaluation call, and a call runs Python frames
            error, complete = f"stopped: {shims} frames in a row are not Python frames (not a frame chain)", False
            break
        frame_addr = raw["previous"]

    frames: list[PyFrame] = []
    bad = unknown = 0  # running frames in a row without a code object; of them, those shown as <unknown>
    for idx, (addr, raw) in enumerate(chain):
        if bad >= MAX_BAD_RUN:
            if unknown:
                del frames[-unknown:]
            error = (f"{error}; " if error else "") + (
                f"stopped: {bad} frames in a row have no code object (not a frame chain)")
            break
        if raw["owner"] not in running:
            continue  # a C-stack shim (3.12+), or a frame that is not executing
        if "is_entry" in raw:  # 3.11
            is_entry = bool(raw["is_entry"])
        elif idx + 1 < len(chain):
            is_entry = chain[idx + 1][1]["owner"] not in running
        else:
            is_entry = complete
        code = raw[layout.iframe_code]
        if layout.family >= 313:
            code &= ~3  # f_executable: any object (3.13), a tagged reference (3.14+); a code object is required
            if not codes.is_code(code):
                bad += 1
                continue
        try:
            info = codes.get(code)
            frames.append(_frame(info, _iframe_line(layout, rd, codes, info, raw), is_entry, addr, code,
                                 interpreter_id))
            error = error or info["error"]
            bad = unknown = 0
        except BadObject as exc:
            error = error or f"frame 0x{addr:x} code: {exc}"
            frames.append(_unknown_frame(is_entry, addr, code, interpreter_id))
            bad += 1
            unknown += 1
    return frames, error


def first_frame(layout: Layout, rd: Reader, ts: dict) -> int:
    """The innermost frame address of a thread state record (follows 3.11/3.12's cframe)."""
    if layout.family in (38, 310, 313):
        return ts[layout.tstate_frame]
    cframe = ts["cframe"]
    if not cframe or layout.cframe is None:  # the layout has a cframe struct for 3.11 and 3.12, the ones here
        return 0
    return rd.struct(layout.cframe, cframe)["current_frame"]


def _thread_frames(layout: Layout, rd: Reader, codes: CodeCache, ts: dict,
                   max_frames: int, interpreter_id: int | None) -> tuple[list[PyFrame], str | None]:
    try:
        first = first_frame(layout, rd, ts)
    except BadObject as exc:
        return [], f"cframe 0x{ts['cframe']:x}: {exc}"
    if layout.family in (38, 310):
        return walk_frame_objects(layout, rd, codes, first, max_frames, interpreter_id)
    return walk_interpreter_frames(layout, rd, codes, first, max_frames, interpreter_id)


class NativeIds:
    """pthread ident -> LWP for 3.8-3.10, whose thread states lack ``native_thread_id``.

    On x86-64 glibc a ``pthread_t`` is the address of the thread's TCB, which is
    the thread's ``fs_base`` register (NT_PRSTATUS): an exact mapping.  Hints
    (``Thread._native_id``, the main thread's ident -> the pid) fill the gaps.
    """

    def __init__(self, core: CoreFile) -> None:
        self.core_lwps = {t.tid for t in core.threads}
        self.by_fs_base = {t.fs_base: t.tid for t in core.threads if t.fs_base}
        self.hints: dict[int, int] = {}

    def add_hint(self, ident: int | None, lwp: int | None) -> None:
        if ident and lwp and (not self.core_lwps or lwp in self.core_lwps):
            self.hints.setdefault(ident, lwp)

    def resolve(self, ident: int) -> int | None:
        return self.by_fs_base.get(ident) or self.hints.get(ident)


def thread_names(layout: Layout, objects: Objects, modules_addr: int) -> dict[int, tuple[str | None, int | None]]:
    """``threading._active`` as ``{ident: (name, native_id)}``; {} when there is none."""
    mod = objects.dict_get_str(modules_addr, "threading")
    if not mod:
        return {}
    md_dict = objects.rd.ptr(mod + layout.md_dict_off)
    active = objects.dict_get_str(md_dict, "_active")
    if not active:
        return {}
    result = {}
    # the attribute names are interned: one str object per name for every thread, so each key's address is read once
    # (a core does not change; bounded, past which a key is read again)
    attr: dict[int, str] = {}

    def which(akey: int) -> str:
        found = attr.get(akey)
        if found is None:
            found = next((x for x in ("_name", "_native_id") if objects.str_equals(akey, x)), "")
            if len(attr) < 4096:
                attr[akey] = found
        return found

    for key, thread in objects.dict_items(active):
        try:
            ident = objects.read_int(key)
            name = native = None
            for akey, avalue in objects.instance_dict_items(thread):
                if name is None and which(akey) == "_name":
                    name = objects.read_str(avalue)
                elif native is None and which(akey) == "_native_id":
                    with contextlib.suppress(BadObject):  # None before the thread started
                        native = objects.read_int(avalue)
            result[ident] = (name, native)
        except BadObject:
            continue
    return result


def read_gil(layout: Layout, rd: Reader, runtime: int, interp_addr: int) -> tuple[bool | None, int | None]:
    """(locked, last holder's thread state address), or (None, None) when the layout has no GIL."""
    if layout.gil is None:
        return None, None
    if layout.gil_runtime_off is not None:
        base = runtime + layout.gil_runtime_off
    elif layout.gil_interp_ptr_off is not None:
        base = rd.ptr(interp_addr + layout.gil_interp_ptr_off)
    else:  # a layout with a GIL struct has one of the two
        return None, None
    g = rd.struct(layout.gil, base)
    return bool(g[layout.gil_locked]), g[layout.gil_holder]


def thread_label(native: int | None, ident: int | None) -> str:
    """How a problem names a thread: its LWP when known, else its ``threading`` ident.

    >>> thread_label(4242, 139872)
    'tid 4242'
    >>> thread_label(None, 139872)
    'thread ident 139872'
    """
    return f"tid {native}" if native is not None else f"thread ident {ident}"


def walk_runtime(layout: Layout, rd: Reader, objects: Objects, core: CoreFile, runtime: int) -> WalkResult:
    """Every interpreter's thread states and stacks, from ``_PyRuntime`` at ``runtime``.

    Never raises for what is in the core; a bound reached is :attr:`WalkResult.cut`.
    """
    result = WalkResult()
    try:
        _walk(result, layout, rd, objects, core, runtime)
    except WalkCut as exc:
        result.cut = str(exc)
    return result


def _classic_ids(layout: Layout, rd: Reader, core: CoreFile, runtime: int) -> NativeIds | None:
    """The map of thread idents to LWPs, for a layout whose thread states have no ``native_thread_id``."""
    if "native_thread_id" in layout.tstate.names:
        return None
    classic_ids = NativeIds(core)
    if layout.runtime_main_thread is not None:
        with contextlib.suppress(BadObject):
            classic_ids.add_hint(rd.ptr(runtime + layout.runtime_main_thread.offset), core.pid)
    return classic_ids


def _walk(result: WalkResult, layout: Layout, rd: Reader, objects: Objects, core: CoreFile, runtime: int) -> None:
    limits: Limits = rd.budget.limits
    codes = CodeCache(objects)
    try:
        head = rd.ptr(runtime + layout.runtime_head.offset)
    except BadObject as exc:
        result.problems.append(f"_PyRuntime at 0x{runtime:x}: {exc}")
        return
    if not head:
        result.no_interpreter = True
        return
    classic_ids = _classic_ids(layout, rd, core, runtime)
    interp_addr = head
    seen_interps: set[int] = set()
    while interp_addr:
        if interp_addr in seen_interps:
            result.problems.append(f"interpreter cycle at 0x{interp_addr:x}")
            break
        if len(seen_interps) >= limits.interpreters:
            result.cut = f"cut at the walk's bound of {limits.interpreters} interpreters"
            break
        seen_interps.add(interp_addr)
        try:
            interp = rd.struct(layout.interp, interp_addr)
        except BadObject as exc:
            result.problems.append(f"interpreter 0x{interp_addr:x}: {exc}")
            break
        try:
            names = thread_names(layout, objects, interp[layout.interp_modules])
        except BadObject:
            names = {}
        if classic_ids is not None:
            for ident, (_, native) in names.items():
                classic_ids.add_hint(ident, native)
        try:
            locked, holder = read_gil(layout, rd, runtime, interp_addr)
        except BadObject:
            locked, holder = None, None
        _walk_threads(result, layout, rd, codes, interp_addr, interp, names, classic_ids, locked, holder)
        if locked and holder and result.gil_holder is None:
            try:  # the holder is not in this list (e.g. another interpreter's thread)
                ts = rd.struct(layout.tstate, holder)
                result.gil_holder = ts.get("native_thread_id") or (
                    classic_ids.resolve(ts["thread_id"]) if classic_ids else None)
            except BadObject:
                pass
        if result.cut:
            break
        interp_addr = interp["next"]


def _walk_threads(result: WalkResult, layout: Layout, rd: Reader, codes: CodeCache, interp_addr: int,
                  interp: dict, names: dict, classic_ids: NativeIds | None, locked: bool | None,
                  holder: int | None) -> None:
    limits: Limits = rd.budget.limits
    tstate_addr = interp[layout.interp_head]
    seen: set[int] = set()
    broken = 0  # thread states in a row whose stack broke before its first frame
    while tstate_addr:
        if broken >= MAX_BROKEN_THREADS:
            result.problems.append(f"stopped: {broken} thread states in a row have no readable stack "
                                   "(not a thread list)")
            break
        if tstate_addr in seen:
            result.problems.append(f"thread-state cycle at 0x{tstate_addr:x}")
            break
        if len(result.threads) >= limits.threads:
            result.cut = f"cut at the walk's bound of {limits.threads} threads"
            break
        seen.add(tstate_addr)
        try:
            ts = rd.struct(layout.tstate, tstate_addr)
        except BadObject as exc:
            result.problems.append(f"thread state 0x{tstate_addr:x}: {exc}")
            break
        if "interp" in ts and ts["interp"] != interp_addr:
            # not one of this interpreter's thread states: the list is corrupt from here on
            result.problems.append(f"thread state 0x{tstate_addr:x} belongs to interpreter 0x{ts['interp']:x}, "
                                   f"not 0x{interp_addr:x}")
            break
        ident = ts["thread_id"]
        name = names.get(ident, (None, None))[0]
        native = ts.get("native_thread_id")
        if native is None and classic_ids is not None:
            native = classic_ids.resolve(ident)
        holds = bool(locked) and holder == tstate_addr
        if holds:
            result.gil_holder = native
        try:
            # each frame made with its interpreter's id (not copied with it after: 200 threads, 1,200 copies)
            frames, error = _thread_frames(layout, rd, codes, ts, limits.frames, interp.get("id"))
        except WalkCut:
            result.threads.append(PyThreadStack(native_thread_id=native, thread_id=ident, name=name,
                                                holds_gil=holds, frames=(), error="the walk was cut here",
                                                interpreter_id=interp.get("id"), address=tstate_addr))
            raise
        interp_id = interp.get("id")
        result.threads.append(PyThreadStack(native_thread_id=native, thread_id=ident, name=name, holds_gil=holds,
                                            frames=tuple(frames), error=error, interpreter_id=interp_id,
                                            address=tstate_addr))
        if error:  # a stack that stopped short is a partial result, not an "ok" one
            result.problems.append(f"{thread_label(native, ident)}: {error}")
        broken = broken + 1 if error and not frames else 0
        tstate_addr = ts["next"]
