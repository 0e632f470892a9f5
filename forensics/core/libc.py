"""The message glibc printed before it aborted ("double free or corruption (!prev)").

``__libc_message`` (used by ``malloc_printerr``, ``assert`` and the fortify
checks) stores its text in a fresh ``mmap`` and points libc's ``__abort_msg`` at
it::

    struct abort_msg_s { unsigned int size; char msg[]; };

The symbol's address comes from libc's dynamic symbol table: from the libc file
when it is the build that crashed, else from libc's image in the core (only when
the kernel dumped those pages, e.g. ``coredump_filter`` bit 2).  The pointer and
the message are then read from the core.

Without either -- a core analyzed on another machine, whose libc is another build or none, and
the kernel's default ``coredump_filter``, which dumps only the first page of libc's symbol
tables -- the pointer is found in libc's writable image, which every core holds (its data,
RELRO and ``.bss``, where ``__abort_msg`` lives): the one word there that points at the start
of an anonymous page holding an ``abort_msg_s`` -- its ``size`` a whole number of pages, the
mapping ``__libc_message`` made, then text and its NUL inside it (:func:`scan_abort_message`).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from forensics.core import elf
from forensics.core.image import ElfImage
from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.model import Library, LibraryStatus, Mapping

__all__ = ["is_libc", "find_libc", "find_abort_message", "parse_abort_message", "scan_abort_message"]

ABORT_MSG_SYMBOL = "__abort_msg"
MAX_MESSAGE = 4096
MAX_SCAN = 4 << 20  # bytes of libc's writable image searched for the pointer
_MAX_MSG_PAGES = 64  # abort_msg_s.size: __libc_message maps the message's length, rounded up to pages


def is_libc(path: str) -> bool:
    """Whether a path names the C library (``libc.so.6``, ``libc-2.31.so``).

    >>> is_libc("/lib/x86_64-linux-gnu/libc.so.6"), is_libc("/usr/lib/libcrypto.so.3")
    (True, False)
    """
    name = path.rsplit("/", 1)[-1]
    return name.startswith("libc.so") or name.startswith("libc-")


def find_libc(libraries: Iterable[Library]) -> Library | None:
    """The C library among the mapped libraries, or None (a static program)."""
    for lib in libraries:
        if is_libc(lib.path):
            return lib
    return None


def parse_abort_message(raw: bytes) -> str:
    """Decode the bytes of ``abort_msg_s.msg``: stop at NUL, drop the trailing newline.

    >>> parse_abort_message(b"free(): invalid pointer\\n\\x00junk")
    'free(): invalid pointer'
    """
    return raw.split(b"\x00", 1)[0][:MAX_MESSAGE].decode("utf-8", errors="replace").rstrip("\n")


def find_abort_message(mem: CoreMemory, libraries: Iterable[Library], page_size: int = 4096,
                       mappings: tuple[Mapping, ...] = ()) -> str | None:
    """Read glibc's abort message from the core, or None (no libc, no message, not readable).

    :param mem: the core's memory
    :param libraries: the mapped libraries, with their resolved files and status
    :param page_size: the process's page size
    :param mappings: the core's mappings (to search libc's writable image when the symbol cannot be
        looked up: no libc file of the crashed build here)
    """
    libc = find_libc(libraries)
    if libc is None:
        return None
    in_core = ElfImage.from_memory(mem, libc.base, page_size)
    address = None
    if libc.file_path is not None and libc.status in (LibraryStatus.OK, LibraryStatus.UNVERIFIED):
        on_disk = ElfImage.from_file(libc.file_path)
        value = on_disk.find_dynamic_symbol(ABORT_MSG_SYMBOL) if on_disk is not None else None
        if on_disk is not None and value is not None:
            if in_core is not None:
                bias = in_core.bias
            else:
                loads = [p.vaddr for p in on_disk.phdrs if p.type == elf.PT_LOAD]
                bias = libc.base - ((loads[0] if loads else 0) & ~(page_size - 1))
            address = bias + value
    if address is None and in_core is not None:
        value = in_core.find_dynamic_symbol(ABORT_MSG_SYMBOL)
        if value is not None:
            address = in_core.bias + value
    if address is None:
        return scan_abort_message(mem, libc, mappings, page_size) if mappings else None
    try:
        pointer = mem.read_u64(address)
        if pointer == 0:
            return None
        raw = mem.read_cstring(pointer + 4, MAX_MESSAGE)
    except MemoryNotInCore:
        return None
    return parse_abort_message(raw) or None


def scan_abort_message(mem: CoreMemory, libc: Library, mappings: tuple[Mapping, ...],
                       page_size: int = 4096) -> str | None:
    """glibc's abort message found without ``__abort_msg``'s address: through the one pointer in libc's
    writable image (its file's writable mappings and the anonymous ``.bss`` right after them, at most
    :data:`MAX_SCAN` bytes) to the start of an anonymous, writable page that reads as an ``abort_msg_s``
    (see the module docstring); None when there is none, or more than one message."""
    regions = _writable_image(libc, mappings)
    anon = sorted((m for m in mappings if m.path is None and "w" in m.perms), key=lambda m: m.start)
    starts = [m.start for m in anon]
    found: set[str] = set()
    budget = MAX_SCAN
    for m in regions:
        size = min(m.end - m.start, budget)
        budget -= size
        data = mem.read_prefix(m.start, size)
        for off in range(0, len(data) - 7, 8):
            pointer = int.from_bytes(data[off:off + 8], "little")
            if pointer & (page_size - 1) or not pointer:
                continue
            i = bisect.bisect_right(starts, pointer) - 1
            if i < 0 or pointer >= anon[i].end:
                continue
            message = _read_abort_msg(mem, pointer, page_size)
            if message:
                found.add(message)
                if len(found) > 1:
                    return None  # two candidates: not one message to trust
    return found.pop() if found else None


def _writable_image(libc: Library, mappings: tuple[Mapping, ...]) -> list[Mapping]:
    """libc's mappings the core holds past its first page (its data, and RELRO: relocated, then made
    read-only) and the anonymous one right after its last mapping (the rest of ``.bss``)."""
    own = [m for m in mappings if m.path == libc.path]
    if not own:
        return []
    out = [m for m in own if m.offset > 0 and "x" not in m.perms and m.in_core]
    after = next((m for m in mappings if m.start == own[-1].end), None)
    if after is not None and after.path is None and "w" in after.perms:
        out.append(after)
    return out


def _read_abort_msg(mem: CoreMemory, pointer: int, page_size: int) -> str | None:
    """The message of an ``abort_msg_s`` at ``pointer``, or None when it does not read as one."""
    try:
        size = int.from_bytes(mem.read(pointer, 4), "little")
        if not size or size % page_size or size > _MAX_MSG_PAGES * page_size:
            return None
        raw = mem.read_cstring(pointer + 4, min(MAX_MESSAGE, size - 4))
    except MemoryNotInCore:
        return None
    text = parse_abort_message(raw)
    if len(raw) >= size - 4 or not text or not text.isprintable():
        return None
    return text
