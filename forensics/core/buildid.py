"""GNU build-ids: from an object's image in the core's memory, and from a file on disk.

The kernel's default ``coredump_filter`` (bit 4, "ELF headers") dumps the first
page of every mapped ELF object, which holds the ELF header, the program headers
and, in practice, the ``.note.gnu.build-id`` note; so the build-id of each
library as it was when the process crashed is in the core.  Comparing it with the
file that would be used to read symbols tells whether that file is the one that
crashed.
"""
from __future__ import annotations

from forensics.core.image import ElfImage
from forensics.core.memory import CoreMemory

__all__ = ["read_build_id_in_memory", "read_build_id_from_file", "read_build_id_from_fd"]


def read_build_id_in_memory(mem: CoreMemory, base: int, page_size: int = 4096) -> str | None:
    """The build-id of the ELF object mapped at ``base``, read from the core.

    :param mem: the core's memory
    :param base: the lowest address of the object's mappings (file offset 0)
    :param page_size: the process's page size (NT_FILE says it)
    :return: lowercase hex, or None when the header or note pages are not in the core
    """
    image = ElfImage.from_memory(mem, base, page_size)
    return image.build_id() if image is not None else None


def read_build_id_from_file(path: str) -> str | None:
    """The build-id of an ELF file on disk, or None (unreadable, not ELF64, no build-id note)."""
    image = ElfImage.from_file(path)
    return image.build_id() if image is not None else None


def read_build_id_from_fd(fd: int) -> str | None:
    """The build-id of the ELF file open on ``fd``, or None (unreadable, not ELF64, no build-id note)."""
    image = ElfImage.from_fd(fd)
    return image.build_id() if image is not None else None
