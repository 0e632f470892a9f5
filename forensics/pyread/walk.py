"""Walk interpreters -> thread states -> frames -> code objects, never trusting a pointer.

The walkers mirror ``gdb_scripts/forensics_python.py`` (same families, same
entry-frame rules, same caps) so both methods give the same stacks.  A pointer
that leaves the core, a cycle, or a chain past its cap ends that walk with an
``error`` naming the address; the frames read so far are kept and the other
threads are still read.  A thread's ``error`` is also one of the document's
problems, so the document is a partial result (``status`` ``error``) whose
``detail`` names the thread.
"""
from __future__ import annotations

from forensics.model import CoreFile
from forensics.pyread.layouts import Layout
from forensics.pyread.objects import BadObject, CodeCache, Objects, Reader

__all__ = ["MAX_INTERPRETERS", "MAX_THREADS", "MAX_FRAMES", "walk_frame_objects", "walk_interpreter_frames",
           "first_frame", "NativeIds", "thread_names", "read_gil", "thread_label", "walk_runtime"]

MAX_INTERPRETERS = 64
MAX_THREADS = 4096
MAX_FRAMES = 4096

FRAME_OWNED_BY_THREAD = 0
FRAME_OWNED_BY_GENERATOR = 1
FRAME_OWNED_BY_CSTACK = 3


def _frame_dict(info: dict, line: int | None, is_entry: bool) -> dict:
    return {"function": info["name"], "file": info["file"], "line": line, "is_entry": is_entry}


def _unknown_frame(is_entry: bool) -> dict:
    return {"function": "<unknown>", "file": "<unknown>", "line": None, "is_entry": is_entry}


def walk_frame_objects(layout: Layout, rd: Reader, codes: CodeCache, frame_addr: int) -> tuple[list, str | None]:
    """3.8-3.10: the PyFrameObject chain; one eval call per frame (every frame is an entry)."""
    frames: list[dict] = []
    seen: set[int] = set()
    error = None
    while frame_addr:
        if frame_addr in seen:
            error = f"frame cycle at 0x{frame_addr:x}"
            break
        if len(frames) >= MAX_FRAMES:
            error = f"stopped after {MAX_FRAMES} frames"
            break
        seen.add(frame_addr)
        try:
            f = rd.struct(layout.frame, frame_addr)
        except BadObject as exc:
            error = f"frame 0x{frame_addr:x}: {exc}"
            break
        try:
            info = codes.get(f["f_code"])
            if f["f_trace"] and f["f_lineno"] > 0:
                line = f["f_lineno"]
            else:
                line = codes.line(info, f["f_lasti"])
            frames.append(_frame_dict(info, line, True))
            error = error or info["error"]
        except BadObject as exc:
            error = error or f"frame 0x{frame_addr:x} code: {exc}"
            frames.append(_unknown_frame(True))
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


def walk_interpreter_frames(layout: Layout, rd: Reader, codes: CodeCache,
                            frame_addr: int) -> tuple[list, str | None]:
    """3.11-3.13: the _PyInterpreterFrame chain (C-stack shim frames skipped)."""
    chain: list[tuple[int, dict]] = []
    seen: set[int] = set()
    error = None
    complete = True
    while frame_addr:
        if frame_addr in seen:
            error, complete = f"frame cycle at 0x{frame_addr:x}", False
            break
        if len(chain) >= 2 * MAX_FRAMES:
            error, complete = f"stopped after {MAX_FRAMES} frames", False
            break
        seen.add(frame_addr)
        try:
            raw = rd.struct(layout.iframe, frame_addr)
        except BadObject as exc:
            error, complete = f"frame 0x{frame_addr:x}: {exc}", False
            break
        chain.append((frame_addr, raw))
        frame_addr = raw["previous"]

    frames: list[dict] = []
    for idx, (addr, raw) in enumerate(chain):
        owner = raw["owner"]
        if owner not in (FRAME_OWNED_BY_THREAD, FRAME_OWNED_BY_GENERATOR):
            continue  # C-stack shim (3.12+) or a frame that is not executing
        if "is_entry" in raw:  # 3.11
            is_entry = bool(raw["is_entry"])
        elif idx + 1 < len(chain):
            is_entry = chain[idx + 1][1]["owner"] == FRAME_OWNED_BY_CSTACK
        else:
            is_entry = complete
        code = raw[layout.iframe_code]
        if layout.family >= 313:
            code &= ~3  # f_executable may be any object: require a code object
            if not codes.is_code(code):
                continue
        try:
            info = codes.get(code)
            frames.append(_frame_dict(info, _iframe_line(layout, rd, codes, info, raw), is_entry))
            error = error or info["error"]
        except BadObject as exc:
            error = error or f"frame 0x{addr:x} code: {exc}"
            frames.append(_unknown_frame(is_entry))
        if len(frames) >= MAX_FRAMES:
            error = error or f"stopped after {MAX_FRAMES} frames"
            break
    return frames, error


def first_frame(layout: Layout, rd: Reader, ts: dict) -> int:
    """The innermost frame address of a thread state record (follows 3.11/3.12's cframe)."""
    if layout.family in (38, 310, 313):
        return ts[layout.tstate_frame]
    cframe = ts["cframe"]
    return rd.struct(layout.cframe, cframe)["current_frame"] if cframe else 0


def _thread_frames(layout: Layout, rd: Reader, codes: CodeCache, ts: dict) -> tuple[list, str | None]:
    try:
        first = first_frame(layout, rd, ts)
    except BadObject as exc:
        return [], f"cframe 0x{ts['cframe']:x}: {exc}"
    if layout.family in (38, 310):
        return walk_frame_objects(layout, rd, codes, first)
    return walk_interpreter_frames(layout, rd, codes, first)


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
    for key, thread in objects.dict_items(active):
        try:
            ident = objects.read_int(key)
            name = native = None
            for akey, avalue in objects.instance_dict_items(thread):
                if name is None and objects.str_equals(akey, "_name"):
                    name = objects.read_str(avalue)
                elif native is None and objects.str_equals(akey, "_native_id"):
                    try:
                        native = objects.read_int(avalue)
                    except BadObject:
                        pass  # None before the thread started
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
    else:
        base = rd.ptr(interp_addr + layout.gil_interp_ptr_off)
    g = rd.struct(layout.gil, base)
    return bool(g[layout.gil_locked]), g[layout.gil_holder]


def walk_runtime(doc: dict, layout: Layout, rd: Reader, objects: Objects, core: CoreFile, runtime: int) -> None:
    """Fill ``doc`` (status, detail, threads, GIL holder) from ``_PyRuntime`` at ``runtime``."""
    codes = CodeCache(objects)
    try:
        head = rd.ptr(runtime + layout.runtime_head.offset)
    except BadObject as exc:
        doc["status"], doc["detail"] = "error", f"_PyRuntime at 0x{runtime:x}: {exc}"
        return
    if not head:
        doc["status"] = "no-interpreter"
        doc["detail"] = "_PyRuntime.interpreters.head is NULL: no running CPython interpreter"
        return
    classic_ids = None
    if "native_thread_id" not in layout.tstate.names:
        classic_ids = NativeIds(core)
        if layout.runtime_main_thread is not None:
            try:
                classic_ids.add_hint(rd.ptr(runtime + layout.runtime_main_thread.offset), core.pid)
            except BadObject:
                pass
    problems: list[str] = []
    interp_addr, seen_interps = head, set()
    while interp_addr and len(seen_interps) < MAX_INTERPRETERS and interp_addr not in seen_interps:
        seen_interps.add(interp_addr)
        try:
            interp = rd.struct(layout.interp, interp_addr)
        except BadObject as exc:
            problems.append(f"interpreter 0x{interp_addr:x}: {exc}")
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
        _walk_threads(doc, layout, rd, codes, interp[layout.interp_head], names, classic_ids, locked, holder,
                      problems)
        if locked and holder and doc["gil_holder_native_id"] is None:
            try:  # the holder is not in this list (e.g. another interpreter's thread)
                ts = rd.struct(layout.tstate, holder)
                doc["gil_holder_native_id"] = ts.get("native_thread_id") or (
                    classic_ids.resolve(ts["thread_id"]) if classic_ids else None)
            except BadObject:
                pass
        interp_addr = interp["next"]
    if problems:
        doc["status"] = "error"
        doc["detail"] = "partial result: " + "; ".join(problems)


def thread_label(native: int | None, ident: int | None) -> str:
    """How a problem names a thread: its LWP when known, else its ``threading`` ident.

    >>> thread_label(4242, 139872)
    'tid 4242'
    >>> thread_label(None, 139872)
    'thread ident 139872'
    """
    return f"tid {native}" if native is not None else f"thread ident {ident}"


def _walk_threads(doc: dict, layout: Layout, rd: Reader, codes: CodeCache, tstate_addr: int, names: dict,
                  classic_ids: NativeIds | None, locked: bool | None, holder: int | None,
                  problems: list[str]) -> None:
    seen: set[int] = set()
    while tstate_addr:
        if tstate_addr in seen:
            problems.append(f"thread-state cycle at 0x{tstate_addr:x}")
            break
        if len(doc["threads"]) >= MAX_THREADS:
            problems.append(f"stopped after {MAX_THREADS} threads")
            break
        seen.add(tstate_addr)
        try:
            ts = rd.struct(layout.tstate, tstate_addr)
        except BadObject as exc:
            problems.append(f"thread state 0x{tstate_addr:x}: {exc}")
            break
        ident = ts["thread_id"]
        name = names.get(ident, (None, None))[0]
        native = ts.get("native_thread_id")
        if native is None and classic_ids is not None:
            native = classic_ids.resolve(ident)
        holds = bool(locked) and holder == tstate_addr
        if holds:
            doc["gil_holder_native_id"] = native
        frames, error = _thread_frames(layout, rd, codes, ts)
        doc["threads"].append({"native_thread_id": native, "thread_id": ident, "name": name,
                               "holds_gil": holds, "frames": frames, "error": error})
        if error:  # a stack that stopped short is a partial result, not an "ok" one
            problems.append(f"{thread_label(native, ident)}: {error}")
        tstate_addr = ts["next"]
