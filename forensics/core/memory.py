"""Open a core file once and read the crashed process's memory from it.

:meth:`CoreMemory.open` checks the file (missing, a directory, compressed, not a
core, another machine), keeps it open and parses the ELF header, program
headers and notes.  :class:`CoreMemory` then reads virtual addresses through the
PT_LOAD segments, with ``pread`` into windows of :data:`WINDOW` bytes of which
the :data:`KEEP` last used are kept: the file is never mapped, so an analysis
costs the memory its reads need, not the core's size (a 2 GB core of a small
process analyzes in a 1 GB address space).

What is readable:

* the bytes of a segment that the kernel wrote (``p_filesz``) and that are
  still in the file: a core cut short by the size limit or a full disk ends
  early, and the bytes past its end are not readable;
* the rest of a segment (up to ``p_memsz``) only for anonymous memory of a
  complete core, as zeros, which is how gdb reads such memory.  The undumped
  part of a file-backed mapping (a library's text) is in the file, not in the
  core, and is not readable here.

Addresses that are not readable raise :class:`MemoryNotInCore`.
"""
from __future__ import annotations

import bisect
import errno
import os
import stat
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from forensics.records import record
from forensics.core import elf
from forensics.core.arch import ArchSpec, spec_for
from forensics.errors import CoreNotFound, CoreReadError, InputUnreadable, NotACoreFile

__all__ = ["MemoryNotInCore", "Segment", "CoreLayout", "CoreMemory", "CoreFileReader", "WINDOW", "KEEP"]

_HEAD_SIZE = 4096
WINDOW = 16 << 10  # bytes of the core file read at a time
KEEP = 256  # windows kept, the last used: 4 MiB


class CoreFileReader:
    """Bytes of an open file at an offset: through windows of :data:`WINDOW` bytes, the :data:`KEEP` last used
    kept (most reads are small and near the last one); a read longer than a window is read on its own."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._windows: OrderedDict[int, bytes] = OrderedDict()

    def window(self, offset: int) -> tuple[int, bytes]:
        """The window holding file offset ``offset``: (its start offset, its bytes; fewer at the file's end)."""
        start = offset - offset % WINDOW
        data = self._windows.get(start)
        if data is None:
            data = self._pread(start, WINDOW)
            self._windows[start] = data
            if len(self._windows) > KEEP:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(start)
        return start, data

    def __getitem__(self, key: slice) -> bytes:
        lo, hi = key.start, key.stop
        if hi - lo > WINDOW:
            return self._pread(lo, hi - lo)
        start, data = self.window(lo)
        if hi <= start + WINDOW:
            return data[lo - start:hi - start]
        return data[lo - start:] + self.window(start + WINDOW)[1][:hi - start - WINDOW]

    def _pread(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        chunks = []
        while size:
            chunk = os.pread(self.fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        self._windows.clear()
        os.close(self.fd)

class MemoryNotInCore(LookupError):
    """An address range the core does not hold (internal to forensics.core and its callers)."""

    def __init__(self, addr: int, size: int = 1) -> None:
        super().__init__(f"0x{addr:x} (+{size}) is not in the core")
        self.addr = addr
        self.size = size


@record
class Segment:
    """A PT_LOAD segment as the reader uses it."""

    vaddr: int
    memsz: int
    offset: int  # where the segment's bytes start in the core file
    present: int  # bytes of it actually in the file (<= p_filesz; less when the core is truncated)
    zero_fill: bool  # whether the bytes past ``present`` read as zeros
    flags: int

    @property
    def end(self) -> int:
        return self.vaddr + self.memsz


@record
class CoreLayout:
    """What the ELF structure of a core file says, before any memory is read."""

    size: int
    expected_size: int  # max(p_offset + p_filesz): what a complete core would measure
    phdrs: tuple[elf.ProgramHeader, ...]
    notes: tuple[elf.Note, ...]
    file_mappings: tuple[elf.FileMapping, ...]
    page_size: int
    problems: tuple[str, ...] = ()  # what was malformed and read around (the analysis is then partial)
    machine: int = elf.EM_X86_64  # the ELF header's e_machine (check_core_header accepted it)

    @property
    def truncated(self) -> bool:
        return self.size < self.expected_size

    @property
    def spec(self) -> ArchSpec:
        """The machine's registers and layouts."""
        found = spec_for(self.machine)
        assert found is not None, "check_core_header accepts only the machines of forensics.core.arch"
        return found


class CoreMemory:
    """Memory of the crashed process, read from a core file.

    Use :meth:`open` and a ``with`` block::

        with CoreMemory.open("core") as mem:
            mem.read_u64(0x7F00_0000_1000)

    The constructor takes the file's bytes (a :class:`CoreFileReader`) plus the segments; tests may pass bytes.
    """

    def __init__(
        self,
        buffer: bytes | CoreFileReader,
        segments: Sequence[Segment],
        *,
        path: str = "",
        layout: CoreLayout | None = None,
    ) -> None:
        self._buf = buffer
        self._segments = tuple(sorted(segments, key=lambda s: s.vaddr))
        self._starts = [s.vaddr for s in self._segments]
        self.path = path
        self.layout: CoreLayout | None = layout

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str) -> CoreMemory:
        """Check and open a core file.

        :raises CoreNotFound: when the path does not exist
        :raises InputUnreadable: when this user may not read it
        :raises NotACoreFile: when it is a directory, empty, compressed, text or another ELF type
        :raises UnsupportedTarget: when it is a core of another machine or a 32-bit core
        :raises CoreReadError: when it cannot be read, or is cut short before its notes
        """
        path = os.fspath(path)
        try:
            st = os.stat(path)
        except FileNotFoundError as e:
            raise CoreNotFound(path) from e
        except NotADirectoryError as e:
            raise CoreNotFound(path) from e
        except PermissionError as e:
            raise InputUnreadable(path) from e
        except OSError as e:
            raise CoreReadError(path, e.strerror or str(e)) from e
        if stat.S_ISDIR(st.st_mode):
            raise NotACoreFile(path, "a directory")
        if not stat.S_ISREG(st.st_mode):
            raise NotACoreFile(path, "not a regular file (a pipe, socket or device)")
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            head = os.pread(fd, _HEAD_SIZE, 0)
            if head[:4] != elf.ELF_MAGIC:
                what, hint = elf.identify_non_elf(head, path)
                raise NotACoreFile(path, what, hint)
            try:
                header = elf.parse_elf_header(head)
            except ValueError as e:
                raise CoreReadError(path, f"truncated inside the ELF header ({len(head)} bytes)") from e
            elf.check_core_header(header, path)
            reader = CoreFileReader(fd, os.fstat(fd).st_size)
        except BaseException as e:
            if fd >= 0:
                os.close(fd)
            if not isinstance(e, OSError) or isinstance(e, (NotACoreFile, CoreReadError)):
                raise
            if e.errno == errno.ENOENT:
                raise CoreNotFound(path) from e
            if e.errno == errno.EACCES:
                raise InputUnreadable(path) from e
            raise CoreReadError(path, e.strerror or str(e)) from e
        try:
            layout = _read_layout(path, reader, header, reader.size)
        except BaseException:
            reader.close()
            raise
        return cls(reader, _segments(layout), path=path, layout=layout)

    def with_file_mappings(self, file_mappings: tuple[elf.FileMapping, ...]) -> None:
        """Name the mappings of a core that has no NT_FILE (from the dynamic linker's list, :mod:`.linkmap`):
        the layout and which bytes past a segment's dumped part read as zeros follow them."""
        assert self.layout is not None
        self.layout = replace(self.layout, file_mappings=file_mappings)
        self._segments = tuple(sorted(_segments(self.layout), key=lambda s: s.vaddr))
        self._starts = [s.vaddr for s in self._segments]

    def close(self) -> None:
        if isinstance(self._buf, CoreFileReader):
            self._buf.close()

    def __enter__(self) -> CoreMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    def read(self, addr: int, size: int) -> bytes:
        """Read ``size`` bytes at virtual address ``addr``.

        :raises MemoryNotInCore: when any byte of the range is not in the core
        """
        return self._read(addr, size, partial=False)

    def read_prefix(self, addr: int, size: int) -> bytes:
        """Read up to ``size`` bytes at ``addr``, stopping at the first byte not in the core."""
        return self._read(addr, size, partial=True)

    def _read(self, addr: int, size: int, *, partial: bool) -> bytes:
        if size <= 0:
            return b""
        out = []
        pos, left = addr, size
        while left:
            i = bisect.bisect_right(self._starts, pos) - 1
            if i < 0 or pos >= self._segments[i].end:
                break
            seg = self._segments[i]
            rel = pos - seg.vaddr
            n = min(left, seg.end - pos)
            if rel < seg.present:
                n = min(n, seg.present - rel)
                start = seg.offset + rel
                out.append(self._buf[start : start + n])
            elif seg.zero_fill:
                out.append(bytes(n))
            else:
                break
            pos += n
            left -= n
        if left and not partial:
            raise MemoryNotInCore(addr, size)
        return out[0] if len(out) == 1 else b"".join(out)

    def view(self, addr: int, span: int | None = None) -> tuple[int, memoryview] | None:
        """A view of bytes around ``addr`` in the segment holding it, as the file has them: ``(the view's start
        address, view)``; None when ``addr`` is not in such bytes.  From a core file: the window of
        :data:`WINDOW` bytes holding ``addr``, cut to the segment; with ``span``, up to ``span`` bytes from
        ``addr`` read at once (not kept among the windows: one long sequential walk).

        For readers that walk a large region in small steps (the heap walker).
        """
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        seg = self._segments[i]
        if not seg.vaddr <= addr < seg.vaddr + seg.present:
            return None
        if not isinstance(self._buf, CoreFileReader):
            return seg.vaddr, memoryview(self._buf)[seg.offset:seg.offset + seg.present]
        if span is not None and span > WINDOW:
            n = min(span, seg.vaddr + seg.present - addr)
            return addr, memoryview(self._buf._pread(seg.offset + addr - seg.vaddr, n))
        start, data = self._buf.window(seg.offset + addr - seg.vaddr)
        lo = max(start, seg.offset)
        hi = min(start + len(data), seg.offset + seg.present)
        return seg.vaddr + lo - seg.offset, memoryview(data)[lo - start:hi - start]

    def is_readable(self, addr: int, size: int) -> bool:
        """Whether :meth:`read` of this range would succeed."""
        try:
            self.read(addr, size)
        except MemoryNotInCore:
            return False
        return True

    def read_u64(self, addr: int) -> int:
        """Read a little-endian 64-bit unsigned integer."""
        return int.from_bytes(self.read(addr, 8), "little")

    def read_u32(self, addr: int) -> int:
        """Read a little-endian 32-bit unsigned integer."""
        return int.from_bytes(self.read(addr, 4), "little")

    def read_cstring(self, addr: int, limit: int = 4096) -> bytes:
        """Read a NUL-terminated string (without the NUL), at most ``limit`` bytes.

        Reading stops at the NUL, at ``limit``, or where readable memory ends.

        :raises MemoryNotInCore: when the first byte is not readable
        """
        chunks = []
        pos, left = addr, limit
        while left > 0:
            n = min(left, 4096 - (pos & 4095))
            chunk = self.read_prefix(pos, n)
            if not chunk and pos == addr:
                raise MemoryNotInCore(addr, 1)
            nul = chunk.find(b"\x00")
            if nul >= 0:
                chunks.append(chunk[:nul])
                break
            chunks.append(chunk)
            if len(chunk) < n:
                break
            pos += n
            left -= n
        return b"".join(chunks)


def _read_layout(path: str, mm: CoreFileReader, header: elf.ElfHeader, size: int) -> CoreLayout:
    phnum = header.phnum
    if phnum == elf.PN_XNUM:
        if header.shoff + elf.SHDR64_SIZE > size:
            raise CoreReadError(path, "truncated before the notes (no section header with the segment count)")
        phnum = elf.parse_xnum_phnum(mm[header.shoff : header.shoff + elf.SHDR64_SIZE])
    ph_end = header.phoff + phnum * elf.PHDR64_SIZE
    if ph_end > size:
        raise CoreReadError(path, f"truncated before the notes: {size} bytes, program headers end at {ph_end}")
    phdrs = elf.parse_program_headers(mm[header.phoff : ph_end], phnum)
    note_phdrs = [p for p in phdrs if p.type == elf.PT_NOTE]
    if not note_phdrs:
        raise CoreReadError(path, "no PT_NOTE segment: the core holds no threads or registers")
    expected = elf.core_extent(phdrs, ph_end)
    if note_phdrs[0].offset >= size:
        raise CoreReadError(
            path, f"truncated before the notes: {size} of {expected} bytes, notes start at {note_phdrs[0].offset}"
        )
    notes, problems = _read_notes(mm, note_phdrs, size)
    file_mappings: tuple[elf.FileMapping, ...] = ()
    page_size = 4096
    for n in notes:
        if n.type == elf.NT_FILE and n.name == b"CORE":
            try:
                file_mappings = elf.parse_nt_file(n.desc)
            except ValueError as e:
                # the threads, registers and memory are still there: read on, with no file names
                problems.append(f"malformed NT_FILE note ({e}): the mappings have no file names, "
                                "no library is named or checked")
            page_size = elf.parse_nt_file_page_size(n.desc)
            break
    return CoreLayout(
        size=size,
        expected_size=expected,
        phdrs=phdrs,
        notes=tuple(notes),
        file_mappings=file_mappings,
        page_size=page_size,
        problems=tuple(problems),
        machine=header.machine,
    )


def _read_notes(
    mm: CoreFileReader, note_phdrs: list[elf.ProgramHeader], size: int
) -> tuple[list[elf.Note], list[str]]:
    """The notes of the PT_NOTE segments, at most :data:`elf.MAX_NOTE_BYTES` of them read and
    :data:`elf.MAX_NOTES` kept, and a problem for each bound met (the notes past it are missing)."""
    spans = [(p.offset, max(0, min(p.offset + p.filesz, size) - p.offset)) for p in note_phdrs]
    total = sum(n for _, n in spans)
    problems = []
    if total > elf.MAX_NOTE_BYTES:
        problems.append(f"the PT_NOTE segments hold {total} bytes, over the bound of {elf.MAX_NOTE_BYTES}: "
                        f"only the first {elf.MAX_NOTE_BYTES} were read, the notes past them are missing")
    notes: list[elf.Note] = []
    budget = elf.MAX_NOTE_BYTES
    for offset, n in spans:
        take = min(n, budget)
        budget -= take
        data = mm[offset : offset + take] if take else b""
        for note in elf.iter_notes(data):
            if len(notes) == elf.MAX_NOTES:
                problems.append(f"more than {elf.MAX_NOTES} notes: the notes past them were not read")
                return notes, problems
            notes.append(note)
        cut = elf.cut_note(data) if take == n else None  # a note cut by the byte bound is said above
        if cut is not None:
            problems.append(f"a note at byte {cut[0]} of a PT_NOTE segment of {n} bytes claims {cut[1]} bytes, past "
                            "the segment's end: it and the notes after it are missing")
    return notes, problems


def _segments(layout: CoreLayout) -> list[Segment]:
    # a core without NT_FILE (qemu-user's) says nothing of which undumped bytes are a file's: none reads as zeros
    # until its mappings are named (CoreMemory.with_file_mappings)
    named = bool(layout.file_mappings) or any(n.type == elf.NT_FILE and n.name == b"CORE" for n in layout.notes)
    complete = not layout.truncated and named
    files = sorted((m.start, m.end) for m in layout.file_mappings)
    starts = [s for s, _ in files]

    def file_backed(lo: int, hi: int) -> bool:
        i = bisect.bisect_right(starts, lo) - 1
        if i >= 0 and files[i][1] > lo:
            return True
        return i + 1 < len(files) and files[i + 1][0] < hi

    out = []
    for p in layout.phdrs:
        if p.type != elf.PT_LOAD or p.memsz == 0:
            continue
        present = max(0, min(p.filesz, layout.size - p.offset))
        out.append(
            Segment(
                vaddr=p.vaddr,
                memsz=p.memsz,
                offset=p.offset,
                present=present,
                zero_fill=complete and bool(p.flags & elf.PF_R) and not file_backed(p.vaddr, p.vaddr + p.memsz),
                flags=p.flags,
            )
        )
    return out
