"""The message glibc printed before it aborted ("double free or corruption (!prev)").

``__libc_message`` (used by ``malloc_printerr``, ``assert`` and the fortify
checks) stores its text in a fresh ``mmap`` and points libc's ``__abort_msg`` at
it::

    struct abort_msg_s { unsigned int size; char msg[]; };

The symbol's address comes from libc's dynamic symbol table: from the libc file
when it is the build that crashed, else from libc's image in the core (only when
the kernel dumped those pages, e.g. ``coredump_filter`` bit 2).  The pointer and
the message are then read from the core.
"""
from __future__ import annotations

from collections.abc import Iterable

from forensics.core import elf
from forensics.core.image import ElfImage
from forensics.core.memory import CoreMemory, MemoryNotInCore
from forensics.model import Library, LibraryStatus

__all__ = ["is_libc", "find_libc", "find_abort_message", "parse_abort_message"]

ABORT_MSG_SYMBOL = "__abort_msg"
MAX_MESSAGE = 4096


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


def find_abort_message(mem: CoreMemory, libraries: Iterable[Library], page_size: int = 4096) -> str | None:
    """Read glibc's abort message from the core, or None (no libc, no message, not readable).

    :param mem: the core's memory
    :param libraries: the mapped libraries, with their resolved files and status
    :param page_size: the process's page size
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
        return None
    try:
        pointer = mem.read_u64(address)
        if pointer == 0:
            return None
        raw = mem.read_cstring(pointer + 4, MAX_MESSAGE)
    except MemoryNotInCore:
        return None
    return parse_abort_message(raw) or None
