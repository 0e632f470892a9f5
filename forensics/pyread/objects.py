"""Bounded reads of CPython objects from a core: str, bytes, int, dict, instance dicts, code objects.

Every read goes through :class:`Reader`, which checks the range against the
core's segments (via :class:`~forensics.core.CoreMemory`) and caps its size; a
pointer that leads outside the core, a NULL, or an object of the wrong type
raises :class:`BadObject`, which the walker records and steps past.  Nothing
here loops without a bound: strings, line tables, dicts and ints have caps.
"""
from __future__ import annotations

import struct
import time

from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.records import record
from forensics.pyread.layouts import Layout, Struct
from forensics.pyread.linetable import line_from_linetable_310, line_from_lnotab, line_from_locations

__all__ = ["BadObject", "WalkCut", "Limits", "Budget", "Reader", "Objects", "CodeCache", "MAX_READ"]

MAX_READ = 1 << 22  # no single read of more than 4 MiB
MAX_STR_CHARS = 4096
MAX_LINETABLE_BYTES = 1 << 20
MAX_DICT_ENTRIES = 1 << 16
MAX_LONG_DIGITS = 8

DICT_KEYS_GENERAL = 0
TPFLAGS_INLINE_VALUES = 1 << 2  # 3.13
TPFLAGS_MANAGED_DICT = 1 << 4  # 3.11+

_PTR = struct.Struct("<Q")


class BadObject(Exception):
    """A pointer or object that cannot be read as what it should be (outside the core, NULL, wrong type)."""


class WalkCut(Exception):
    """The whole walk reached one of its bounds (:class:`Limits`); not a fault of one object."""


@record
class Limits:
    """Bounds of one walk of an interpreter state, whatever the core holds.

    A real process stays far inside them (the default recursion limit is 1,000 frames);
    a crafted or corrupted state (a thread list through self-referencing words) reaches
    one, and the walk stops there, keeping what it read and saying which bound cut it.
    """

    interpreters: int = 64
    threads: int = 4096  # thread states, all interpreters together
    frames: int = 4096  # frames of one thread's chain (shims included)
    total_frames: int = 100_000  # frames of all threads together
    reads: int = 2_000_000  # memory reads
    seconds: float = 30.0  # wall time


class Budget:
    """Counts the walk's memory reads and watches its clock; raises :class:`WalkCut` at a bound."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.reads = 0
        self.frames = 0
        self._deadline = time.monotonic() + limits.seconds

    def spend_read(self) -> None:
        self.reads += 1
        if self.reads > self.limits.reads:
            raise WalkCut(f"cut at the walk's bound of {self.limits.reads:,} memory reads")
        if not self.reads & 255 and time.monotonic() > self._deadline:
            raise WalkCut(f"cut at the walk's time bound of {self.limits.seconds:g} s")

    def spend_frame(self) -> None:
        self.frames += 1
        if self.frames > self.limits.total_frames:
            raise WalkCut(f"cut at the walk's bound of {self.limits.total_frames:,} frames in all")


class Reader:
    """Reads of the crashed process's memory, bounded by the core's segments, by :data:`MAX_READ`
    per read and by the walk's :class:`Budget`."""

    def __init__(self, mem: CoreMemory, budget: Budget | None = None) -> None:
        self._read = mem.read
        self.budget = budget or Budget(Limits())

    def read(self, addr: int, size: int) -> bytes:
        if not addr:
            raise BadObject("NULL pointer")
        if size <= 0:
            return b""
        if size > MAX_READ:
            raise BadObject(f"read of {size} bytes at 0x{addr:x} is too large")
        self.budget.spend_read()
        try:
            return self._read(addr, size)
        except MemoryNotInCore:
            raise BadObject(f"0x{addr:x} is not in the core") from None

    def ptr(self, addr: int) -> int:
        return _PTR.unpack(self.read(addr, 8))[0]

    def ptr_array(self, addr: int, count: int) -> list[int]:
        if count <= 0:
            return []
        return list(struct.unpack(f"<{count}Q", self.read(addr, count * 8)))

    def struct(self, st: Struct, addr: int) -> dict[str, int]:
        """The fields of the struct at ``addr`` (an error names ``addr``, not the first field's address)."""
        if not addr:
            raise BadObject("NULL pointer")
        try:
            return st.decode(self.read(addr + st.start, st.size))
        except BadObject:
            raise BadObject(f"0x{addr:x} is not in the core") from None


def _uint(buf: bytes, off: int, size: int, signed: bool = False) -> int:
    return int.from_bytes(buf[off:off + size], "little", signed=signed)


class Objects:
    """Decoding of the few CPython object kinds the walk needs.

    :param types: addresses of ``PyCode_Type``, ``PyUnicode_Type``, ... in the process
        (None for one not found: that check is skipped)
    """

    def __init__(self, layout: Layout, reader: Reader, types: dict[str, int | None]) -> None:
        self.L = layout
        self.rd = reader
        self.types = types

    def check_type(self, addr: int, hdr: bytes, type_name: str) -> None:
        want = self.types.get(type_name)
        if want and _uint(hdr, self.L.ob_type_off, 8) != want:
            raise BadObject(f"object at 0x{addr:x} is not a {type_name[2:-5].lower()}")

    def _bits(self, buf: bytes, name: str) -> int:
        bit, size = self.L.uni_state_bits[name]
        word = int.from_bytes(buf[bit // 8:(bit + size + 7) // 8 + 1], "little")
        return (word >> (bit % 8)) & ((1 << size) - 1)

    # -- str, bytes, int ----------------------------------------------------------------------

    def str_header(self, addr: int) -> tuple[bytes, int]:
        """(header bytes, length) of a str object."""
        hdr = self.rd.read(addr, self.L.compact_size)
        self.check_type(addr, hdr, "PyUnicode_Type")
        return hdr, _uint(hdr, self.L.uni_length_off, 8, True)

    def read_str(self, addr: int, max_chars: int = MAX_STR_CHARS, hdr: bytes | None = None,
                 length: int | None = None) -> str:
        L = self.L
        if hdr is None or length is None:
            hdr, length = self.str_header(addr)
        if length < 0:
            raise BadObject(f"str at 0x{addr:x} has a negative length")
        kind = self._bits(hdr, "kind")
        if kind not in (1, 2, 4):
            raise BadObject(f"str at 0x{addr:x} has kind {kind}")
        if self._bits(hdr, "compact"):
            data = addr + (L.ascii_size if self._bits(hdr, "ascii") else L.compact_size)
        else:
            data = self.rd.ptr(addr + L.uni_data_off)
        count = min(length, max_chars)
        raw = self.rd.read(data, count * kind) if count else b""
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        text = raw.decode(codec, errors="replace")
        return text + ("..." if length > count else "")

    def str_equals(self, addr: int, expected: str) -> bool:
        try:
            hdr, length = self.str_header(addr)
            if length != len(expected):
                return False
            return self.read_str(addr, len(expected), hdr, length) == expected
        except BadObject:
            return False

    def read_bytes(self, addr: int, max_bytes: int) -> bytes:
        L = self.L
        hdr = self.rd.read(addr, L.bytes_sval_off)
        self.check_type(addr, hdr, "PyBytes_Type")
        size = _uint(hdr, L.ob_size_off, 8, True)
        if size < 0 or size > max_bytes:
            raise BadObject(f"bytes at 0x{addr:x} has size {size}")
        return self.rd.read(addr + L.bytes_sval_off, size) if size else b""

    def read_int(self, addr: int) -> int:
        L = self.L
        hdr = self.rd.read(addr, L.long_digit_off)
        self.check_type(addr, hdr, "PyLong_Type")
        if L.long_tag_off is not None:  # 3.12+: lv_tag = ndigits << 3 | sign
            tag = _uint(hdr, L.long_tag_off, 8)
            ndigits, sign = tag >> 3, 1 - (tag & 3)
        else:
            size = _uint(hdr, L.ob_size_off, 8, True)
            ndigits, sign = abs(size), (size > 0) - (size < 0)
        if ndigits > MAX_LONG_DIGITS:
            raise BadObject(f"int at 0x{addr:x} has {ndigits} digits")
        if not ndigits:
            return 0
        dsize = L.long_digit_size
        raw = self.rd.read(addr + L.long_digit_off, ndigits * dsize)
        value = 0
        for i in reversed(range(ndigits)):
            value = (value << L.long_digit_bits) | _uint(raw, i * dsize, dsize)
        return sign * value

    # -- dicts ----------------------------------------------------------------------------------

    def keys_items(self, keys_addr: int, values_addr: int = 0) -> list[tuple[int, int]]:
        """(key, value) pointers of a keys table; values from a split array when given."""
        L, rd = self.L, self.rd
        k = rd.struct(L.keys, keys_addr)
        nentries = k["dk_nentries"]
        if L.new_dict_keys:
            if k["dk_log2_size"] > 30 or k["dk_log2_index_bytes"] > 34:
                raise BadObject(f"dict keys at 0x{keys_addr:x} look corrupt")
            entries = keys_addr + L.keys_indices_off + (1 << k["dk_log2_index_bytes"])
            if k["dk_kind"] == DICT_KEYS_GENERAL or L.entry_unicode is None:
                esize, key_off, value_off = L.entry_general
            else:
                esize, key_off, value_off = L.entry_unicode
            capacity = 1 << k["dk_log2_size"]
        else:
            size = k["dk_size"]
            if size <= 0 or size > (1 << 30):
                raise BadObject(f"dict keys at 0x{keys_addr:x} look corrupt")
            ixsize = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
            entries = keys_addr + L.keys_indices_off + size * ixsize
            esize, key_off, value_off = L.entry_general
            capacity = size
        if nentries < 0 or nentries > capacity:
            raise BadObject(f"dict keys at 0x{keys_addr:x}: {nentries} entries for size {capacity}")
        nentries = min(nentries, MAX_DICT_ENTRIES)
        if not nentries:
            return []
        buf = rd.read(entries, nentries * esize)
        split = rd.ptr_array(values_addr, nentries) if values_addr else None
        out = []
        for i in range(nentries):
            key = _PTR.unpack_from(buf, i * esize + key_off)[0]
            value = split[i] if split is not None else _PTR.unpack_from(buf, i * esize + value_off)[0]
            if key and value:
                out.append((key, value))
        return out

    def dict_items(self, addr: int) -> list[tuple[int, int]]:
        hdr = self.rd.read(addr, self.L.ob_type_off + 8)
        self.check_type(addr, hdr, "PyDict_Type")
        d = self.rd.struct(self.L.dict, addr)
        values = d["ma_values"]
        if values:
            values += self.L.values_off
        return self.keys_items(d["ma_keys"], values)

    def dict_get_str(self, addr: int, name: str) -> int | None:
        for key, value in self.dict_items(addr):
            if self.str_equals(key, name):
                return value
        return None

    def instance_dict_items(self, obj: int) -> list[tuple[int, int]]:
        """(key, value) pointers of an instance's attributes, any layout (3.8-3.13)."""
        L, rd = self.L, self.rd
        tp = rd.ptr(obj + L.ob_type_off)
        t = rd.struct(L.type, tp)
        flags = t["tp_flags"]
        if L.family >= 311 and flags & TPFLAGS_MANAGED_DICT:
            if L.family == 311:  # dict at obj-3 words, values at obj-4 words
                dict_addr = rd.ptr(obj - 3 * 8)
                if dict_addr:
                    return self.dict_items(dict_addr)
                values = rd.ptr(obj - 4 * 8)
                return self.keys_items(rd.ptr(tp + L.ht_cached_keys_off), values + L.values_off) if values else []
            if L.family == 312:  # tagged dict-or-values at obj-3 words
                dorv = rd.ptr(obj - 3 * 8)
                if dorv & 1:
                    return self.keys_items(rd.ptr(tp + L.ht_cached_keys_off), dorv + 1 + L.values_off)
                return self.dict_items(dorv) if dorv else []
            dict_addr = rd.ptr(obj + L.managed_dict_off)  # 3.13
            if dict_addr:
                return self.dict_items(dict_addr)
            if flags & TPFLAGS_INLINE_VALUES:
                values = obj + t["tp_basicsize"]
                if L.values_valid is not None and not rd.read(values + L.values_valid, 1)[0]:
                    return []
                return self.keys_items(rd.ptr(tp + L.ht_cached_keys_off), values + L.values_off)
            return []
        off = t["tp_dictoffset"]
        if off <= 0:
            return []  # no dict, or a var-sized object (not the case for Thread)
        dict_addr = rd.ptr(obj + off)
        return self.dict_items(dict_addr) if dict_addr else []


class CodeCache:
    """Name, file and line table of code objects, read once per address."""

    def __init__(self, objects: Objects) -> None:
        self.O = objects
        self.L = objects.L
        self._cache: dict[int, dict] = {}

    def is_code(self, addr: int) -> bool:
        want = self.O.types.get("PyCode_Type")
        try:
            return bool(addr) and (not want or self.O.rd.ptr(addr + self.L.ob_type_off) == want)
        except BadObject:
            return False

    def get(self, addr: int) -> dict:
        info = self._cache.get(addr)
        if info is None:
            info = self._cache[addr] = self._read(addr)
        return info

    def _read(self, addr: int) -> dict:
        """Fields of one code object; a bad field degrades only that field."""
        L = self.L
        c = self.O.rd.struct(L.code, addr)
        want = self.O.types.get("PyCode_Type")
        if want and c["ob_type"] != want:
            raise BadObject(f"0x{addr:x} is not a code object")
        info = {"name": "<unknown>", "file": "<unknown>", "first": c["co_firstlineno"],
                "table": None, "lines": {}, "error": None,
                "units": addr + L.code_units_off if L.code_units_off is not None else None}
        readers = (
            ("name", L.code_name, self.O.read_str),
            ("file", "co_filename", self.O.read_str),
            ("table", L.code_table, lambda a: self.O.read_bytes(a, MAX_LINETABLE_BYTES)),
        )
        for key, field, reader in readers:
            try:
                info[key] = reader(c[field])
            except BadObject as exc:
                info["error"] = info["error"] or f"code 0x{addr:x} {field}: {exc}"
        return info

    def line(self, info: dict, lasti: int) -> int | None:
        """Line of instruction ``lasti`` (bytes for 3.8/3.9, code units after)."""
        if lasti < 0:
            return info["first"]
        if info["table"] is None:
            return None
        lines = info["lines"]
        if lasti not in lines:
            fam = self.L.family
            line: int | None
            try:
                if fam == 38:
                    line = line_from_lnotab(info["table"], info["first"], lasti)
                elif fam == 310:
                    line = line_from_linetable_310(info["table"], info["first"], lasti * 2)
                else:
                    line = line_from_locations(info["table"], info["first"], lasti)
            except IndexError:  # a truncated location table
                line = None
            lines[lasti] = line
        return lines[lasti]
