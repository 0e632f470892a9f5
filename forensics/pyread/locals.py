"""Fast locals of a Python frame, ctypes objects among them, and the native call a frame is making.

Built on the walker's frame records (:class:`~forensics.model.PyFrame` carries the
frame's and its code object's addresses): nothing here walks frames.

* :func:`read_frame_locals` -- the names (``co_varnames``, 3.8-3.10;
  ``co_localsplusnames`` with their kinds, 3.11+) and the objects in the frame's
  ``localsplus`` slots (cells followed to their contents; 3.14's tagged stack
  references untagged), each described by :func:`describe_object`;
* :func:`read_ctypes_object` -- a ctypes instance (``CDataObject``: ``b_ptr``,
  ``b_size``, ``b_length``, the ``b_value`` of a simple type), recognised by its
  type's bases (``_ctypes.Array``, ``Structure``, ``Union``, ``_SimpleCData``,
  ``_Pointer``, ``CFuncPtr``); a ``byref()`` (``CArgObject``) keeps the object it points into;
* :func:`read_native_call` -- a ctypes call in progress in the innermost frame: the
  function pointer object and its arguments, as they lie on the frame's value stack
  during the call (the callable, then each argument), each validated as a live object.

Every read is bounded and validated through :class:`~forensics.pyread.objects.Reader`;
a slot that is not a readable object is skipped, never guessed.
"""
from __future__ import annotations

import struct
from dataclasses import replace

from forensics.model import BufferOwner, CoreFile, CtypesObject, NativeCall, PyLocal
from forensics.pyread.objects import BadObject, Reader
from forensics.records import record

__all__ = ["LocalsLayout", "LOCALS_LAYOUTS", "TypeNames", "CallArgument", "FrameCall", "read_frame_locals",
           "read_ctypes_object", "describe_object", "read_native_call", "match_native_call", "ThreadLocals",
           "read_thread_locals", "buffer_owners", "find_stack_owner", "OWNER_STACK_WINDOW", "MAX_LOCALS",
           "MAX_STACK", "python_pointers", "MAX_POINTERS"]

MAX_LOCALS = 512  # names read from one code object
MAX_STACK = 256  # value-stack slots scanned in one frame
MAX_BASES = 8  # tp_base links followed to recognise a ctypes type
_TP_NAME = 24  # PyTypeObject.tp_name: after PyObject_VAR_HEAD, every version
_TP_BASE = 256  # PyTypeObject.tp_base, 3.0 onwards
_CELL_REF = 16  # PyCellObject.ob_ref
# ctypes' CDataObject and PyCArgObject (Modules/_ctypes/ctypes.h), the same 3.8-3.14 on x86-64
_B_PTR, _B_SIZE, _B_LENGTH, _B_VALUE = 16, 40, 48, 80
_ARG_TAG, _ARG_VALUE, _ARG_OBJ = 24, 32, 48
CO_FAST_LOCAL, CO_FAST_CELL, CO_FAST_FREE = 0x20, 0x40, 0x80
_CTYPES_BASES = {"_ctypes.Array": "array", "_ctypes.Structure": "structure", "_ctypes.Union": "union",
                 "_ctypes._SimpleCData": "simple", "_ctypes._Pointer": "pointer", "_ctypes.CFuncPtr": "function",
                 "_ctypes.PyCFuncPtr": "function"}
_INT_CODES = {"c_byte": (1, True), "c_ubyte": (1, False), "c_short": (2, True), "c_ushort": (2, False),
              "c_int": (4, True), "c_uint": (4, False), "c_long": (8, True), "c_ulong": (8, False),
              "c_longlong": (8, True), "c_ulonglong": (8, False), "c_int8": (1, True), "c_uint8": (1, False),
              "c_int16": (2, True), "c_uint16": (2, False), "c_int32": (4, True), "c_uint32": (4, False),
              "c_int64": (8, True), "c_uint64": (8, False), "c_ssize_t": (8, True), "c_size_t": (8, False)}


@record
class LocalsLayout:
    """Where a CPython version keeps a frame's locals and value stack, and its code object's names."""

    interpreter_frames: bool  # 3.11+: _PyInterpreterFrame; else PyFrameObject
    localsplus: int  # offset of the first local slot in the frame
    valuestack: int | None = None  # 3.8-3.10: offset of f_valuestack (a pointer)
    co_nlocals: int | None = None  # 3.8-3.10: plain locals count
    co_varnames: int | None = None  # 3.8-3.10
    co_nlocalsplus: int | None = None  # 3.11+ (absent: the names tuple's length)
    co_localsplusnames: int | None = None  # 3.11+
    co_localspluskinds: int | None = None  # 3.11+ (a bytes object)
    co_stacksize: int | None = None
    tagged_slots: bool = False  # 3.14+: slots hold _PyStackRef (low bits are tags)
    instr: int | None = None  # 3.11+: prev_instr / instr_ptr (the call being made); 3.8-3.10: f_lasti
    lasti_units: int = 1  # 3.8-3.9: f_lasti counts bytes; 3.10: code units of 2 bytes
    co_code: int | None = None  # 3.8-3.10: the bytes object f_lasti indexes
    tuple_items: int = 24  # PyTupleObject.ob_item (3.14 put a cached hash before it: 32)


_FRAME_OBJECTS_38 = LocalsLayout(interpreter_frames=False, localsplus=360, valuestack=64, co_nlocals=28,
                                 co_varnames=72, co_stacksize=32, instr=104, co_code=48)
_INTERPRETER_FRAMES_312 = LocalsLayout(interpreter_frames=True, localsplus=72, co_stacksize=64, co_nlocalsplus=72,
                                       instr=56, co_localsplusnames=96, co_localspluskinds=104)
_TAGGED_314 = replace(_INTERPRETER_FRAMES_312, localsplus=80, tagged_slots=True, tuple_items=32)
#: per CPython version, from the DWARF of its builds (pyenv 3.8-3.13; Debian's python3.14/3.15-dbg):
#: tests/unit/test_pyread_locals.py checks them against gdb's ptype where those builds are
LOCALS_LAYOUTS: dict[tuple[int, int], LocalsLayout] = {
    (3, 8): _FRAME_OBJECTS_38,
    (3, 9): _FRAME_OBJECTS_38,
    (3, 10): replace(_FRAME_OBJECTS_38, localsplus=352, instr=96, lasti_units=2),
    (3, 11): replace(_INTERPRETER_FRAMES_312, co_stacksize=68, co_nlocalsplus=76),
    (3, 12): _INTERPRETER_FRAMES_312,
    (3, 13): _INTERPRETER_FRAMES_312,
    (3, 14): _TAGGED_314,
    (3, 15): _TAGGED_314,
}


@record
class CallArgument:
    """One argument of a native call on the value stack."""

    address: int
    text: str  # how it reads: "c_int(36)", "byref(values)", "<LP_struct_c_nvmlDevice_t at 0x...>"
    ctypes: CtypesObject | None = None
    points_into: int | None = None  # byref(): the object it points into
    pointer: int | None = None  # byref(): the address it passes (the object's buffer, plus the offset)
    integer: int | None = None  # an integer value (a Python int or a ctypes integer)


@record
class FrameCall:
    """A ctypes function pointer and its arguments, found on a frame's value stack."""

    function_object: int
    function_address: int | None  # the native function it calls
    type_name: str
    arguments: tuple[CallArgument, ...]
    argument_count_known: bool = True  # False: the call's oparg was not readable, stale slots may follow


def _untag(layout: LocalsLayout, value: int) -> int:
    return value & ~3 if layout.tagged_slots else value


class TypeNames:
    """Type objects' names: ``tp_name`` read from the core, or -- for a static type, whose name
    string lies in its library's read-only data, which cores leave out -- from that library's file
    (only a file whose build-id matched the core's).  A plain class: ``dataclass`` compiles its methods
    at import, a cost of every analysis."""

    __slots__ = ("rd", "core", "cache")

    def __init__(self, rd: Reader, core: CoreFile | None = None, cache: dict[int, str] | None = None) -> None:
        self.rd = rd
        self.core = core
        self.cache: dict[int, str] = {} if cache is None else cache

    def name(self, tp: int) -> str:
        """The name of the type object at ``tp``.

        :raises BadObject: when neither the core nor a verified file has it
        """
        if tp in self.cache:
            return self.cache[tp]
        ptr = self.rd.ptr(tp + _TP_NAME)
        try:
            text = _cstring(self.rd, ptr, 256)
        except BadObject:
            raw = self.core.read_from_file(ptr, 256) if self.core is not None else None
            if raw is None:
                raise
            text = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        if len(self.cache) < 65536:
            self.cache[tp] = text
        return text


def _type_name(rd, obj: int, names: TypeNames | None = None) -> tuple[int, str]:
    tp = rd.ptr(obj + 8)
    if names is not None:
        return tp, names.name(tp)
    return tp, _cstring(rd, rd.ptr(tp + _TP_NAME), 256)


def _is_object(names: TypeNames, addr: int) -> bool:
    """A plausible live object: aligned, a positive refcount, a type with a readable name."""
    if not addr or addr & 7:
        return False
    try:
        refcnt = names.rd.ptr(addr)
        if refcnt == 0 or refcnt > 1 << 48:
            return False
        _type_name(names.rd, addr, names)
        return True
    except BadObject:
        return False


def _ctypes_kind(names: TypeNames, tp: int) -> str | None:
    rd = names.rd
    for _ in range(MAX_BASES):
        if not tp:
            return None
        try:
            name = names.name(tp)
        except BadObject:
            return None
        if name in _CTYPES_BASES:
            return _CTYPES_BASES[name]
        try:
            tp = rd.ptr(tp + _TP_BASE)
        except BadObject:
            return None
    return None


def _cstring(rd, addr: int, limit: int) -> str:
    data = bytearray()
    pos = addr
    while len(data) < limit:
        n = min(64, limit - len(data))
        try:
            chunk = rd.read(pos, n)
        except BadObject:
            chunk = rd.read(pos, 1)
        nul = chunk.find(b"\0")
        if nul >= 0:
            data += chunk[:nul]
            break
        data += chunk
        pos += len(chunk)
    return data.decode("utf-8", "replace")


def read_ctypes_object(names: TypeNames, addr: int) -> CtypesObject | None:
    """The ctypes instance at ``addr``, or None when it is not one (or not readable)."""
    rd = names.rd
    try:
        tp = rd.ptr(addr + 8)
        kind = _ctypes_kind(names, tp)
        if kind is None:
            return None
        name = names.name(tp)
        b_ptr = rd.ptr(addr + _B_PTR)
        size = int.from_bytes(rd.read(addr + _B_SIZE, 8), "little", signed=True)
        b_length = int.from_bytes(rd.read(addr + _B_LENGTH, 8), "little", signed=True)
    except BadObject:
        return None
    if not 0 <= size <= 1 << 40:
        return None
    value = None
    element_type = element_size = None
    length: int | None = None  # an array's, when its size is a whole number of elements
    if kind == "array" and 0 <= b_length <= size and not (b_length and size % b_length):
        length = b_length
        element_size = size // length if length else None
        marker = f"_Array_{length}"
        element_type = name[: -len(marker)] if name.endswith(marker) else None
    base_name = name.split(".")[-1]
    if kind == "simple" and base_name in _INT_CODES and size == _INT_CODES[base_name][0]:
        try:
            value = int.from_bytes(rd.read(addr + _B_VALUE, size), "little", signed=_INT_CODES[base_name][1])
        except BadObject:
            value = None
    return CtypesObject(address=addr, type_name=name, kind=kind, buffer=b_ptr, size=size, length=length,
                        element_type=element_type, element_size=element_size, value=value)


def describe_object(names: TypeNames, objects, addr: int) -> PyLocal:
    """A local's value in a few words: its type, ints and short strs, container sizes, ctypes objects.

    The name is left empty for the caller to fill.
    """
    rd = names.rd
    try:
        _tp, type_name = _type_name(rd, addr, names)
    except BadObject as e:
        return PyLocal(name="", type_name="?", address=addr, value=f"<unreadable: {e}>")
    value: str | None = None
    ctypes_obj = None
    try:
        if type_name == "int":
            value = str(objects.read_int(addr))
        elif type_name == "str":
            text = objects.read_str(addr, 80)
            value = repr(text if len(text) < 80 else text[:77] + "...")
        elif type_name in ("NoneType", "bool"):
            value = type_name if type_name == "NoneType" else ("True" if rd.ptr(addr + 16) else "False")
        elif type_name in ("list", "tuple", "dict", "bytes", "bytearray"):
            # ob_size (list, tuple, bytes, bytearray) and ma_used (dict) are the word after the header
            value = f"len {int.from_bytes(rd.read(addr + 16, 8), 'little')}"
        else:
            ctypes_obj = read_ctypes_object(names, addr)
            if ctypes_obj is not None:
                value = _ctypes_text(ctypes_obj)
    except BadObject:
        value = None
    return PyLocal(name="", type_name=type_name, address=addr, value=value, ctypes=ctypes_obj)


def _ctypes_text(o: CtypesObject) -> str:
    if o.value is not None:
        return f"{o.type_name}({o.value})"
    if o.kind == "array" and o.length is not None:
        return f"{o.type_name}: {o.length} x {o.element_size} bytes at 0x{o.buffer:x}"
    return f"{o.type_name}: {o.size} bytes at 0x{o.buffer:x}"


def _names(rd, objects, layout: LocalsLayout, code: int) -> tuple[list[str], list[int]]:
    """The local names of a code object and their kinds (3.11+; plain locals before)."""
    if layout.interpreter_frames:
        assert layout.co_localsplusnames is not None and layout.co_localspluskinds is not None  # every 3.11+ row
        names_tuple = rd.ptr(code + layout.co_localsplusnames)
        count = int.from_bytes(rd.read(names_tuple + 16, 8), "little")
        if layout.co_nlocalsplus is not None:
            count = min(count, int.from_bytes(rd.read(code + layout.co_nlocalsplus, 4), "little"))
        count = min(count, MAX_LOCALS)
        kinds_obj = rd.ptr(code + layout.co_localspluskinds)
        kinds = list(objects.read_bytes(kinds_obj, count)) if kinds_obj else [CO_FAST_LOCAL] * count
    else:
        assert layout.co_varnames is not None and layout.co_nlocals is not None  # every 3.8-3.10 row
        names_tuple = rd.ptr(code + layout.co_varnames)
        count = min(int.from_bytes(rd.read(code + layout.co_nlocals, 4), "little"), MAX_LOCALS)
        kinds = [CO_FAST_LOCAL] * count
    items = rd.ptr_array(names_tuple + layout.tuple_items, count)
    names = []
    for p in items:
        try:
            names.append(objects.read_str(p, 100))
        except BadObject:
            names.append("?")
    return names, kinds[: len(names)]


def read_frame_locals(names_of: TypeNames, objects, layout: LocalsLayout, frame: int,
                      code: int) -> tuple[PyLocal, ...]:
    """The bound fast locals of the frame at ``frame`` running ``code`` (unbound ones are left out).

    :raises BadObject: when the code object's names or the frame's slots are not readable
    """
    rd = names_of.rd
    names, kinds = _names(rd, objects, layout, code)
    slots = rd.ptr_array(frame + layout.localsplus, len(names))
    out = []
    # kinds may be fewer than the names (a short read of co_localspluskinds): those names are left out
    for name, kind, raw in zip(names, kinds, slots, strict=False):
        obj = _untag(layout, raw)
        if not obj:
            continue
        if kind & (CO_FAST_CELL | CO_FAST_FREE):
            try:
                if _type_name(rd, obj, names_of)[1] == "cell":
                    obj = rd.ptr(obj + _CELL_REF)
            except BadObject:
                continue
            if not obj:
                continue
        d = describe_object(names_of, objects, obj)
        out.append(PyLocal(name=name, type_name=d.type_name, address=d.address, value=d.value, ctypes=d.ctypes))
    return tuple(out)


def _stack_slots(rd, layout: LocalsLayout, frame: int, code: int, nlocalsplus: int) -> list[int]:
    if layout.interpreter_frames:
        base = frame + layout.localsplus + 8 * nlocalsplus
    else:
        assert layout.valuestack is not None  # every 3.8-3.10 row
        base = rd.ptr(frame + layout.valuestack)
    depth = MAX_STACK
    if layout.co_stacksize is not None:
        depth = min(depth, int.from_bytes(rd.read(code + layout.co_stacksize, 4), "little"))
    return [_untag(layout, v) for v in rd.ptr_array(base, depth)] if depth > 0 else []


def _argument(names: TypeNames, objects, addr: int) -> CallArgument:
    rd = names.rd
    d = describe_object(names, objects, addr)
    if d.type_name == "CArgObject":
        try:
            tag = rd.read(addr + _ARG_TAG, 1)
            points_into = rd.ptr(addr + _ARG_OBJ)
            pointer = rd.ptr(addr + _ARG_VALUE)
        except BadObject:
            return CallArgument(address=addr, text="CArgObject")
        target = read_ctypes_object(names, points_into) if points_into else None
        what = target.type_name if target else f"0x{pointer:x}"
        return CallArgument(address=addr, text=f"byref({what})" if tag == b"P" else f"CArgObject({what})",
                            points_into=points_into or None, pointer=pointer or None)
    if d.type_name == "int":
        try:
            value = objects.read_int(addr)
        except BadObject:
            value = None
        return CallArgument(address=addr, text=str(value), integer=value)
    if d.ctypes is not None:
        return CallArgument(address=addr, text=_ctypes_text(d.ctypes), ctypes=d.ctypes, integer=d.ctypes.value)
    return CallArgument(address=addr, text=f"<{d.type_name}>" + (f" {d.value}" if d.value else ""))


def _call_oparg(rd, layout: LocalsLayout, frame: int, code: int) -> int | None:
    """The oparg of the instruction the frame is executing: a call's argument count."""
    if layout.instr is None:
        return None
    try:
        if layout.interpreter_frames:
            at = rd.ptr(frame + layout.instr)
        else:
            lasti = int.from_bytes(rd.read(frame + layout.instr, 4), "little", signed=True)
            if lasti < 0 or layout.co_code is None:
                return None
            at = rd.ptr(code + layout.co_code) + 32 + lasti * layout.lasti_units  # PyBytesObject.ob_sval
        return rd.read(at, 2)[1]
    except BadObject:
        return None


def read_native_call(names: TypeNames, objects, layout: LocalsLayout, frame: int, code: int,
                     nlocalsplus: int) -> FrameCall | None:
    """The ctypes call the frame is making, from its value stack: the deepest ctypes function pointer
    object there, and the live objects after it (its arguments); None when there is none.

    The value stack below the stack pointer is live; a call's callable and arguments sit at its top.
    Slots that are not readable objects are skipped (3.11-3.13 leave NULL markers beside callables).
    """
    rd = names.rd
    try:
        slots = _stack_slots(rd, layout, frame, code, nlocalsplus)
    except BadObject:
        return None
    for i, v in enumerate(slots):
        if not _is_object(names, v):
            continue
        fn = read_ctypes_object(names, v)
        if fn is None or fn.kind != "function":
            continue
        try:
            address = rd.ptr(fn.buffer) if fn.buffer else None
        except BadObject:
            address = None
        nargs = _call_oparg(rd, layout, frame, code)
        args: list[CallArgument] = []
        for w in slots[i + 1:]:
            if nargs is not None and len(args) >= nargs:
                break  # slots above the call's arguments are stale
            if not w:
                continue
            if not _is_object(names, w):
                break
            args.append(_argument(names, objects, w))
        return FrameCall(function_object=v, function_address=address, type_name=fn.type_name, arguments=tuple(args),
                         argument_count_known=nargs is not None)
    return None


def match_native_call(core: CoreFile, call: FrameCall, owner: BufferOwner, frame,
                      local_names: dict[int, str] | None = None, *, sysroot: str | None = None) -> NativeCall | None:
    """The :class:`~forensics.model.NativeCall` when ``call`` was passed ``owner``'s object (itself, a
    ``byref()`` of it, or a pointer to its buffer); None when it was not.

    :param local_names: object address -> the frame's local holding it, to name the arguments
    :param sysroot: the crashed machine's root, searched first for the library's debug file
    """
    obj = owner.object
    index = None
    for i, a in enumerate(call.arguments):
        if a.points_into == obj.address or (a.ctypes is not None and (
                a.ctypes.address == obj.address or (a.ctypes.kind == "pointer" and a.ctypes.buffer == obj.buffer))):
            index = i
            break
    if index is None:
        return None
    ints = [i for i, a in enumerate(call.arguments) if a.integer is not None and i != index]
    count_index = ints[0] if len(ints) == 1 else None
    from forensics.core.symtab import symbol_at  # (indexed once per object; its debug file's .symtab too)

    function, library = (symbol_at(core, call.function_address, sysroot=sysroot) if call.function_address
                         else (None, None))
    return NativeCall(
        function=function or (f"0x{call.function_address:x}" if call.function_address else None),
        library=library, caller=frame.function, file=frame.file, line=frame.line,
        arguments=tuple(_argument_text(a, local_names or {}) for a in call.arguments),
        buffer_argument=index, count_argument=count_index,
        count=call.arguments[count_index].integer if count_index is not None else None)


def _argument_text(a: CallArgument, local_names: dict[int, str]) -> str:
    if a.points_into and a.points_into in local_names:
        return f"byref({local_names[a.points_into]})"
    if a.address in local_names:
        return local_names[a.address]
    return a.text


@record
class ThreadLocals:
    """The fast locals of a thread's frames (innermost first) and the ctypes call its innermost frame is making."""

    frames: tuple[tuple[PyLocal, ...], ...]  # one tuple per frame of the input, () where unreadable
    call: FrameCall | None = None
    problem: str | None = None  # why they could not be read (None: they were)
    unread: tuple[int, ...] = ()  # the frames (indexes into ``frames``) whose locals could not be read


def _read_thread(core: CoreFile, frames, *, version: tuple[int, int], objects, reader) -> ThreadLocals:
    layout = LOCALS_LAYOUTS.get(version)
    if layout is None:
        return ThreadLocals(frames=tuple(() for _ in frames), problem=f"CPython {version[0]}.{version[1]}: "
                                                                     "no locals layout")
    names = TypeNames(reader, core)
    out: list[tuple[PyLocal, ...]] = []
    unread: list[int] = []
    call = None
    for depth, frame in enumerate(frames):
        faddr, caddr = getattr(frame, "frame_address", None), getattr(frame, "code_address", None)
        if not faddr or not caddr:
            out.append(())
            unread.append(depth)
            continue
        try:
            out.append(read_frame_locals(names, objects, layout, faddr, caddr))
        except BadObject:
            out.append(())
            unread.append(depth)
            continue
        if depth == 0:
            try:
                n = len(_names(reader, objects, layout, caddr)[0]) if layout.interpreter_frames else 0
                call = read_native_call(names, objects, layout, faddr, caddr, n)
            except BadObject:
                call = None
    return ThreadLocals(frames=tuple(out), call=call, unread=tuple(unread))


def read_thread_locals(core: CoreFile, frames, *, sysroot: str | None = None, mem=None,
                       interpreter=None) -> ThreadLocals:
    """The locals of a thread's Python frames (the walker's records, innermost first), with the interpreter's
    version and object readers set up the way the walker sets them up.  Never raises for what the core holds.

    :param mem: the core's memory, open (None: the core is opened here)
    :param interpreter: what :func:`forensics.pyread.find_interpreter` found in ``mem`` (None: found here)
    """
    if not any(getattr(f, "frame_address", None) for f in frames):
        return ThreadLocals(frames=tuple(() for _ in frames),
                            problem="the Python frames were read without their addresses in memory, so their variables "
                                    "(the ctypes buffers and counts passed to native code) could not be read")
    from forensics.core.memory import CoreMemory
    from forensics.errors import ForensicsError

    try:
        if mem is None:
            with CoreMemory.open(core.path) as opened:
                return read_thread_locals(core, frames, sysroot=sysroot, mem=opened, interpreter=interpreter)
        found = _objects_for(core, mem, sysroot, interpreter)
        if isinstance(found, str):
            return ThreadLocals(frames=tuple(() for _ in frames), problem=found)
        version, reader, objects = found
        return _read_thread(core, frames, version=version, objects=objects, reader=reader)
    except (ForensicsError, BadObject, ValueError) as e:
        return ThreadLocals(frames=tuple(() for _ in frames), problem=f"the frames' locals could not be read: {e}")


def _objects_for(core: CoreFile, mem, sysroot: str | None, interpreter=None):
    """(version, Reader, Objects) for this core's interpreter as the walker finds it, or why not (a string)."""
    from forensics.model import PythonStacks
    from forensics.pyread import find_interpreter
    from forensics.pyread.locate import TYPE_SYMBOLS
    from forensics.pyread.objects import Objects, Reader

    found = interpreter if interpreter is not None else find_interpreter(core, mem, sysroot=sysroot)
    if isinstance(found, PythonStacks):
        return found.detail or found.status.value
    reader = Reader(mem)
    objects = Objects(found.layout, reader, {n: found.binary.symbol(n) for n in TYPE_SYMBOLS})
    return (found.version.major, found.version.minor), reader, objects


def buffer_owners(core: CoreFile, frames, locals_: ThreadLocals, *,
                  sysroot: str | None = None) -> list[tuple[BufferOwner, NativeCall | None]]:
    """The ctypes objects with a buffer of their own among a thread's frame locals, each with the native
    call in progress it was passed to (the innermost frame's only: a ctypes call pushes no frame)."""
    out: list[tuple[BufferOwner, NativeCall | None]] = []
    for depth, (frame, locs) in enumerate(zip(frames, locals_.frames, strict=False)):
        local_names = {loc.address: loc.name for loc in locs}
        for loc in locs:
            o = loc.ctypes
            # a buffer of its own (malloc'd), not the object's inline b_value (pointers, small simple types)
            if o is None or o.kind == "function" or not o.buffer or o.size <= 0 or o.buffer == o.address + _B_VALUE:
                continue
            owner = BufferOwner(name=loc.name, function=frame.function, file=frame.file, line=frame.line, object=o)
            call = locals_.call if depth == 0 else None
            out.append((owner, match_native_call(core, call, owner, frame, local_names, sysroot=sysroot)
                        if call is not None else None))
    return out


#: bytes of a thread's stack searched for a ctypes object that owns a buffer (from its stack pointer up)
OWNER_STACK_WINDOW = 64 << 10


def find_stack_owner(core: CoreFile, tid: int | None, buffer: int, size: int, *,
                     sysroot: str | None = None, mem=None, interpreter=None) -> BufferOwner | None:
    """A ctypes object whose buffer lies in ``[buffer, buffer + size)``, held on thread ``tid``'s native stack
    -- one being deallocated (its ``PyCData_dealloc`` has it), or passed to a C function -- when no frame's
    local holds it any more.  None when there is none (or the interpreter cannot be read).

    The owner it returns has no frame: ``function`` is empty and ``file`` says where on the stack it was.

    :param mem: the core's memory, open (None: the core is opened here)
    :param interpreter: what :func:`forensics.pyread.find_interpreter` found in ``mem`` (None: found here)
    """
    thread = next((t for t in core.threads if t.tid == tid), None)
    if thread is None or not thread.sp:
        return None
    from forensics.core.memory import CoreMemory
    from forensics.errors import ForensicsError

    if mem is None:
        try:
            with CoreMemory.open(core.path) as opened:
                return find_stack_owner(core, tid, buffer, size, sysroot=sysroot, mem=opened, interpreter=interpreter)
        except (ForensicsError, ValueError):
            return None
    try:
        found = _objects_for(core, mem, sysroot, interpreter)
        if isinstance(found, str):
            return None
        _version, reader, _objects = found
        names = TypeNames(reader, core)
        mapping = core.find_mapping(thread.sp)
        end = min(thread.sp + OWNER_STACK_WINDOW, mapping.end if mapping else thread.sp + OWNER_STACK_WINDOW)
        data = mem.read_prefix(thread.sp, end - thread.sp)
        seen: set[int] = set()
        for i, v in enumerate(struct.unpack_from(f"<{len(data) // 8}Q", data)):
            if v in seen or v < 0x10000 or v & 7:
                continue
            seen.add(v)
            try:
                # the object's buffer pointer first: only an object whose buffer is in the range is read whole
                if not buffer <= reader.ptr(v + _B_PTR) < buffer + size:
                    continue
                o = read_ctypes_object(names, v)
            except BadObject:
                continue
            if o is not None and o.kind != "function" and buffer <= o.buffer < buffer + size:
                return BufferOwner(name=f"the {o.type_name} at 0x{v:x}", function="",
                                   file=f"native stack at 0x{thread.sp + 8 * i:x}", line=None, object=o)
    except (ForensicsError, ValueError):
        return None
    return None


def python_pointers(core: CoreFile, frames, locals_: ThreadLocals, *, mem=None) -> list[tuple[str, int, int]]:
    """What the Python side of a thread holds into native memory: ``(what, start, end)`` for each ctypes
    object's buffer among its frames' locals, each ctypes pointer's target, each int local (an
    ``addressof()``), and each argument of the native call in progress (a buffer, a ``byref()``, an
    integer).  The targets of pointers are read from the core (``mem``, open; None: opened here); one that
    cannot be read is left out.
    """
    out: list[tuple[str, int, int]] = []
    pointers: list[tuple[str, int]] = []  # (what, where the pointer value is stored)
    for frame, locs in zip(frames, locals_.frames, strict=False):
        for loc in locs:
            what = f"{loc.name} ({loc.type_name}, a local of {frame.function})"
            o = loc.ctypes
            if o is not None and o.kind == "pointer" and o.buffer:
                pointers.append((what, o.buffer))
            elif o is not None and o.kind != "function" and o.buffer and o.size > 0:
                out.append((what, o.buffer, o.buffer + o.size))
            elif loc.type_name == "int" and loc.value and loc.value.isdigit():
                out.append((what, int(loc.value), int(loc.value) + 1))
    call = locals_.call
    for i, a in enumerate(call.arguments if call is not None else ()):
        what = f"argument {i + 1} of the native call in progress ({a.text})"
        if a.pointer:
            out.append((what, a.pointer, a.pointer + 1))
        if a.integer is not None and a.integer > 0:
            out.append((what, a.integer, a.integer + 1))
        if a.ctypes is not None and a.ctypes.kind == "pointer" and a.ctypes.buffer:
            pointers.append((what, a.ctypes.buffer))
        elif a.ctypes is not None and a.ctypes.kind != "function" and a.ctypes.buffer and a.ctypes.size > 0:
            out.append((what, a.ctypes.buffer, a.ctypes.buffer + a.ctypes.size))
    if pointers and mem is not None:
        out.extend(_pointer_targets(mem, pointers))
    elif pointers:
        from forensics.core.memory import CoreMemory
        from forensics.errors import ForensicsError

        try:
            with CoreMemory.open(core.path) as opened:
                out.extend(_pointer_targets(opened, pointers))
        except (ForensicsError, ValueError, OSError):
            pass
    return out


def _pointer_targets(mem, pointers: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    out = []
    for what, at in pointers[:MAX_POINTERS]:
        raw = mem.read_prefix(at, 8)
        if len(raw) == 8 and (target := int.from_bytes(raw, "little")):
            out.append((what, target, target + 1))
    return out


#: ctypes pointers whose targets :func:`python_pointers` reads
MAX_POINTERS = 4096
