"""The pointer glibc's ``free()`` was given, read from the crashing thread's unwound frames.

While glibc checks the chunk it is freeing, its free path keeps the pointer in a register or a stack
slot; where, pc range by pc range, is what libc's DWARF (Debian's ``libc6-dbg``) says of each of its
variables -- ``_int_free``'s ``p`` in %rbx at its call of ``malloc_printerr`` (2.36), ``_int_free_chunk``'s
``p`` on 2.43, whose ``free()`` tail-calls it and leaves no frame.  The unwinder recovers each caller
frame's callee-saved registers (:class:`~forensics.model.FrameRegisters`), and
:func:`find_freed_pointer` evaluates the location of every variable of
:data:`~forensics.heap.debuginfo.FREE_POINTERS` at its frame's pc with them, innermost frame first: what
gdb's ``frame function _int_free``, ``print p`` shows, with no register guessed.  A location that needs
what the unwind does not know (a caller-saved register in a caller frame, a value on function entry)
gives nothing; the stack's words remain the fallback (:mod:`forensics.heap.anatomy`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from forensics.heap.debuginfo import DebugInfoError, cached_free_pointer_locations
from forensics.heap.layout import SIZE_SZ
from forensics.model import FrameRegisters
from forensics.records import record

__all__ = ["FreedPointer", "evaluate_location", "find_freed_pointer", "MAX_OPS"]

MAX_OPS = 64  # operations of one DWARF expression evaluated
_MASK = (1 << 64) - 1


@record
class FreedPointer:
    """The chunk a free-path function of glibc was working on, as its frame's registers and libc's DWARF say."""

    chunk: int  # the chunk's address (mchunkptr)
    function: str  # the glibc function whose variable held it (_int_free, _int_free_chunk, __libc_free, ...)
    variable: str  # its variable (p, mem, e)
    frame: int  # the frame's index in the crashing thread's native stack
    where: str  # where the value was: "register rbx", "the stack at 0x7ffd...", "rbx + 16"

    @property
    def words(self) -> str:
        """Where it was found, in words: ``_int_free's p (register rbx of frame #5)``."""
        return f"{self.function}'s {self.variable} ({self.where} of frame #{self.frame}; libc's DWARF location)"


def _leb128(data: bytes, pos: int, signed: bool) -> tuple[int, int]:
    """The LEB128 number at ``pos`` and the position after it (IndexError past the end)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if signed and byte & 0x40:
                value -= 1 << shift
            return value, pos


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    return _leb128(data, pos, False)


def _sleb(data: bytes, pos: int) -> tuple[int, int]:
    return _leb128(data, pos, True)


_CONSTS = {0x08: (1, False), 0x09: (1, True), 0x0A: (2, False), 0x0B: (2, True), 0x0C: (4, False),
           0x0D: (4, True), 0x0E: (8, False), 0x0F: (8, True)}  # DW_OP_const1u ... DW_OP_const8s


def _decode(expr: bytes) -> list[tuple[str, int]] | None:
    """A DWARF expression as (operation, operand) pairs, in the few operations a pointer's location uses:
    ``reg``, ``breg`` (register + offset; the operand packs both), ``fbreg``, ``cfa``, ``const``, ``plus_uconst``,
    ``plus``, ``minus``, ``dup``, ``deref``, ``stack_value``.  None for any other operation (``DW_OP_entry_value``,
    ``DW_OP_piece``, ...: a value the core does not hold here) or a truncated expression."""
    ops: list[tuple[str, int]] = []
    pos = 0
    try:
        while pos < len(expr) and len(ops) <= MAX_OPS:
            op = expr[pos]
            pos += 1
            if 0x50 <= op <= 0x6F:  # DW_OP_reg0-31: the value is in the register
                ops.append(("reg", op - 0x50))
            elif op == 0x90:  # DW_OP_regx
                number, pos = _uleb(expr, pos)
                ops.append(("reg", number))
            elif 0x70 <= op <= 0x8F or op == 0x92:  # DW_OP_breg0-31, DW_OP_bregx: the register plus an offset
                number = op - 0x70
                if op == 0x92:
                    number, pos = _uleb(expr, pos)
                offset, pos = _sleb(expr, pos)
                ops.append(("breg", number << 64 | (offset & _MASK)))
            elif op == 0x91:  # DW_OP_fbreg
                offset, pos = _sleb(expr, pos)
                ops.append(("fbreg", offset))
            elif 0x30 <= op <= 0x4F:  # DW_OP_lit0-31
                ops.append(("const", op - 0x30))
            elif op in _CONSTS:
                size, signed = _CONSTS[op]
                if pos + size > len(expr):
                    return None
                ops.append(("const", int.from_bytes(expr[pos:pos + size], "little", signed=signed) & _MASK))
                pos += size
            elif op in (0x10, 0x11, 0x23):  # DW_OP_constu, DW_OP_consts, DW_OP_plus_uconst
                value, pos = (_sleb if op == 0x11 else _uleb)(expr, pos)
                ops.append(("plus_uconst" if op == 0x23 else "const", value & _MASK))
            else:
                name = _SIMPLE.get(op)
                if name is None:
                    return None
                ops.append((name, 0))
    except IndexError:
        return None
    return ops if len(ops) <= MAX_OPS else None


#: operations without an operand: DW_OP_call_frame_cfa, DW_OP_plus, DW_OP_minus, DW_OP_dup, DW_OP_deref,
#: DW_OP_stack_value
_SIMPLE = {0x9C: "cfa", 0x22: "plus", 0x1C: "minus", 0x12: "dup", 0x06: "deref", 0x9F: "stack_value"}


def _signed(offset: int) -> str:
    offset = offset - (1 << 64) if offset >= 1 << 63 else offset
    return f" {'+' if offset >= 0 else '-'} {abs(offset)}" if offset else ""


def _step(op: str, arg: int, stack: list[int], said: list[str], register: Callable[[int], int | None],
          frame_base: int | None, cfa: int | None, read_u64: Callable[[int], int | None]) -> bool:
    """Apply one operation to ``stack`` (and say what it read in ``said``); False when it needs what is not
    known."""
    value: int | None
    if op == "breg":
        value = register(arg >> 64)
        if value is None:
            return False
        stack.append((value + arg) & _MASK)
        said.append(f"register {arg >> 64}{_signed(arg & _MASK)}")
    elif op in ("fbreg", "cfa"):
        base = frame_base if op == "fbreg" else cfa
        if base is None:
            return False
        stack.append((base + arg) & _MASK)
        said.append("CFA" + _signed(arg & _MASK))
    elif op == "const":
        stack.append(arg)
    elif op == "plus_uconst":
        stack.append((stack.pop() + arg) & _MASK)
    elif op in ("plus", "minus"):
        b, a = stack.pop(), stack.pop()
        stack.append((a + b if op == "plus" else a - b) & _MASK)
    elif op == "dup":
        stack.append(stack[-1])
    elif op == "deref":
        value = read_u64(stack.pop())
        if value is None:
            return False
        stack.append(value)
    else:  # "reg" or "stack_value" anywhere but at the end: not a pointer's plain location
        return False
    return True


def evaluate_location(expr: bytes, register: Callable[[int], int | None], *, cfa: int | None = None,
                      frame_base_cfa: bool = False,
                      read_u64: Callable[[int], int | None] = lambda _a: None) -> tuple[int, str] | None:
    """The value a DWARF location expression gives a pointer-sized variable, and where it was, or None when
    it needs what is not known (a register the unwind lost, the value on entry, a piece of one).

    :param register: a DWARF register number -> its value in the frame, or None when not known there
    :param cfa: the frame's canonical frame address (its caller's stack pointer), for ``DW_OP_fbreg`` and
        ``DW_OP_call_frame_cfa``
    :param frame_base_cfa: whether the function's frame base is its CFA (``DW_AT_frame_base``)
    :param read_u64: an address -> the 8 bytes there (None: not in the core), for a variable in memory

    >>> evaluate_location(bytes([0x53]), {3: 0x5000}.get)  # DW_OP_reg3
    (20480, 'register 3')
    >>> evaluate_location(bytes([0x73, 0x70, 0x9f]), {3: 0x5010}.get)  # DW_OP_breg3 -16; DW_OP_stack_value
    (20480, 'register 3 - 16')
    >>> evaluate_location(bytes([0xa3, 0x01, 0x54, 0x9f]), {4: 1}.get) is None  # DW_OP_entry_value
    True
    """
    ops = _decode(expr)
    if not ops:
        return None
    if ops[0][0] == "reg":
        value = register(ops[0][1]) if len(ops) == 1 else None
        return (value, f"register {ops[0][1]}") if value is not None else None
    value_on_stack = ops[-1][0] == "stack_value"
    stack: list[int] = []
    said: list[str] = []
    frame_base = cfa if frame_base_cfa else None
    try:
        for op, arg in ops[:-1] if value_on_stack else ops:
            if not _step(op, arg, stack, said, register, frame_base, cfa, read_u64):
                return None
    except IndexError:  # an operation on an empty stack
        return None
    if not stack:
        return None
    if value_on_stack:
        return stack[-1], " ".join(said) or "a constant"
    value = read_u64(stack[-1])  # a memory location: the variable is stored there
    return (value, f"the stack at 0x{stack[-1]:x}") if value is not None else None


def _register_name(names: Sequence[str], text: str) -> str:
    """``register 3`` -> ``register rbx`` (its name on the core's machine)."""
    out: list[str] = []
    for word in text.split(" "):
        out.append(names[int(word)] if word.isdigit() and int(word) < len(names) and out and out[-1] == "register"
                   else word)
    return " ".join(out)


def find_freed_pointer(glibc, frames: Sequence[FrameRegisters], names: Sequence[str], *,
                       in_libc: Callable[[int], bool], read_u64: Callable[[int], int | None],
                       problems: list[str] | None = None) -> FreedPointer | None:
    """The chunk glibc's free (or realloc) path was given, from the innermost frame in libc whose free-path
    variable's location the frame's registers resolve; None without libc's DWARF or such a frame.

    :param glibc: the located glibc (:class:`forensics.heap.locate.Glibc`: its debug file, load bias, text)
    :param frames: the crashing thread's physical frames with their registers, innermost first
    :param names: the core's machine's register names by DWARF number
    :param in_libc: whether a pc is in libc's mapping
    :param read_u64: reads 8 bytes of the core (None: not in the core)
    :param problems: collects why libc's DWARF could not be read
    """
    if not frames or glibc.debug_file is None or glibc.malloc_anchor is None:
        return None
    ours = [f for f in frames if in_libc(f.pc if f.activation else f.pc - 1)]
    if not ours:
        return None
    try:
        variables = cached_free_pointer_locations(glibc.debug_file, glibc.build_id or "unknown", glibc.malloc_anchor)
    except DebugInfoError as e:
        if problems is not None:
            problems.append(f"libc's DWARF locations of the pointer being freed could not be read: {e}")
        return None
    by_sp = {f.index: f for f in frames}
    order = sorted(by_sp)
    for frame in ours:
        pc = frame.pc - glibc.bias - (0 if frame.activation else 1)
        regs = dict(frame.registers)

        def register(n: int, regs: dict[str, int] = regs) -> int | None:
            return regs.get(names[n]) if n < len(names) else None
        outer = next((by_sp[i] for i in order if i > frame.index), None)
        # a frame's CFA is its caller's stack pointer as the unwind restored it
        cfa = outer.register(names[_sp_number(names)]) if outer is not None else None
        for var in variables:
            for low, high, expr in var["locations"]:
                if not low <= pc < high:
                    continue
                found = evaluate_location(
                    bytes.fromhex(expr), register, cfa=cfa,
                    frame_base_cfa=bool(var["frame_base_cfa"]), read_u64=read_u64)
                if found is None:
                    continue
                value, where = found
                chunk = value - 2 * SIZE_SZ if var["points_at"] == "user" else value
                if value < 0x10000 or chunk & 0xF:
                    continue
                return FreedPointer(chunk=chunk, function=var["function"], variable=var["variable"],
                                    frame=frame.index, where=_register_name(names, where))
    return None


def _sp_number(names: Sequence[str]) -> int:
    return names.index("rsp") if "rsp" in names else names.index("sp")
