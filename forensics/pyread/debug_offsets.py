"""``_Py_DebugOffsets``: the struct offsets CPython 3.13+ publishes at the start of ``_PyRuntime``.

CPython's own out-of-process tools (``Modules/_remote_debugging_module.c``) read the
whole struct, then check its cookie (``xdebugpy``), that its version is the one they
were built for and that its free-threading flag is theirs.  We read cores of other
versions than our own, so the shape of the struct (which field sits where: it grows
from version to version) comes from the DWARF of each known version, recorded in
``layouts.json`` as ``debug_offsets_struct``.  :func:`parse_debug_offsets` reads the
struct whole with the shape of its own minor version, or, for a version newer than any
known, with the newest known shape, and refuses it unless it is self-consistent:

- the cookie, a ``PY_VERSION_HEX`` of 3.13 or later and a free-threading flag of 0 or 1;
- every section that states its struct's ``size`` has a plausible one (1 byte to 1 MiB),
  and every offset in it lies inside that size;
- ``runtime_state.size`` equals the size of the ``_PyRuntime`` symbol, when known.

The result never trusts more than it checked; a refusal says why in one line.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping

from forensics.records import record

__all__ = ["COOKIE", "DebugOffsets", "DebugOffsetsError", "shape_for", "parse_debug_offsets", "read_size"]

COOKIE = b"xdebugpy"
_MAX_STRUCT = 1 << 20
_MAX_READ = 1 << 16  # the whole struct: 760 bytes in 3.14; a shape past this is not believed


class DebugOffsetsError(ValueError):
    """The bytes at ``_PyRuntime`` are not a ``_Py_DebugOffsets`` this reader can trust."""


@record
class DebugOffsets:
    """One parsed ``_Py_DebugOffsets``."""

    version: int  # PY_VERSION_HEX of the interpreter that wrote it
    free_threaded: bool
    shape: str  # the table key whose recorded struct shape was used to read it ("3.14")
    values: Mapping[str, int]  # dotted name ("thread_state.next") -> value

    @property
    def minor(self) -> tuple[int, int]:
        return self.version >> 24, (self.version >> 16) & 0xFF

    def get(self, name: str) -> int | None:
        return self.values.get(name)


def _key_order(key: str) -> tuple[int, int]:
    major, minor = key.rstrip("td").split(".")
    return int(major), int(minor)


def shape_for(version: int, shapes: Mapping[str, Mapping[str, list[int]]]) -> tuple[str, Mapping[str, list[int]]]:
    """The recorded struct shape to read a ``_Py_DebugOffsets`` of ``version`` with.

    Its own minor version's shape when recorded, else the newest recorded one older than it.

    :param shapes: table key (``"3.14"``) -> ``{dotted name: [offset, size]}``
    :raises DebugOffsetsError: when no recorded shape is as old as ``version``
    """
    want = (version >> 24, (version >> 16) & 0xFF)
    known = sorted((k for k in shapes if _key_order(k) <= want), key=_key_order)
    exact = f"{want[0]}.{want[1]}"
    if exact in shapes:
        return exact, shapes[exact]
    if not known:
        raise DebugOffsetsError(f"no known _Py_DebugOffsets shape for {want[0]}.{want[1]}")
    return known[-1], shapes[known[-1]]


def read_size(shape: Mapping[str, list[int]]) -> int:
    """Bytes to read for a struct of this shape."""
    return max(off + size for off, size in shape.values())


def parse_debug_offsets(raw: bytes, shapes: Mapping[str, Mapping[str, list[int]]], *,
                        runtime_size: int | None = None) -> DebugOffsets | None:
    """The ``_Py_DebugOffsets`` at the start of ``raw``; None when there is no cookie (before 3.13).

    :param raw: the bytes at ``&_PyRuntime`` (at least the largest shape's size when available)
    :param shapes: the recorded shapes (see :func:`shape_for`)
    :param runtime_size: ``st_size`` of the ``_PyRuntime`` symbol, when known
    :raises DebugOffsetsError: when the cookie is there but the struct cannot be trusted

    >>> parse_debug_offsets(b"\\0" * 64, {}) is None
    True
    """
    if raw[:8] != COOKIE:
        return None
    if len(raw) < 24:
        raise DebugOffsetsError("the core holds only the first bytes of _Py_DebugOffsets")
    version, free_threaded = struct.unpack_from("<QQ", raw, 8)
    if version >> 24 != 3 or (version >> 16) & 0xFF < 13 or version >> 32:
        raise DebugOffsetsError(f"version field 0x{version:x} is not a CPython 3.13+ PY_VERSION_HEX")
    if free_threaded not in (0, 1):
        raise DebugOffsetsError(f"free_threaded field is {free_threaded}, not 0 or 1")
    key, shape = shape_for(version, shapes)
    size = read_size(shape)
    if size > _MAX_READ:
        raise DebugOffsetsError(f"the recorded {key} shape is {size} bytes long")
    if len(raw) < size:
        raise DebugOffsetsError(f"the core holds {len(raw)} of its {size} bytes")
    values = {name: int.from_bytes(raw[off:off + width], "little")  # in the struct's order
              for name, (off, width) in sorted(shape.items(), key=lambda kv: kv[1][0]) if name != "cookie"}
    _check(values, key, runtime_size)
    return DebugOffsets(version=version, free_threaded=bool(free_threaded), shape=key, values=values)


def _check(values: Mapping[str, int], key: str, runtime_size: int | None) -> None:
    sizes = {name[:-5]: v for name, v in values.items() if name.endswith(".size") and name.count(".") == 1}
    for section, size in sizes.items():
        if not 0 < size <= _MAX_STRUCT:
            raise DebugOffsetsError(f"{section}.size is {size} (read with the {key} shape)")
    for name, value in values.items():
        section, _, field = name.rpartition(".")
        if section in sizes and not field.endswith("size") and value >= sizes[section]:
            raise DebugOffsetsError(f"{name} is {value}, past {section}.size {sizes[section]} "
                                    f"(read with the {key} shape)")
    if runtime_size and sizes.get("runtime_state") not in (None, runtime_size):
        raise DebugOffsetsError(f"runtime_state.size {sizes['runtime_state']} is not the size of _PyRuntime "
                                f"({runtime_size})")
