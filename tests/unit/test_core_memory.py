"""CoreMemory over an in-memory buffer: segment lookup, spanning reads, zero fill, truncation."""
from __future__ import annotations

import pytest

from forensics.core.memory import CoreMemory, MemoryNotInCore, Segment

BUF = bytes(range(256)) * 64  # 16 KiB "core file"


def seg(vaddr, memsz, offset, present, zero_fill=False, flags=4):
    return Segment(vaddr=vaddr, memsz=memsz, offset=offset, present=present, zero_fill=zero_fill, flags=flags)


@pytest.fixture
def mem():
    return CoreMemory(
        BUF,
        [
            seg(0x2000, 0x1000, 0x1000, 0x1000),  # fully present
            seg(0x3000, 0x1000, 0x2000, 0x800),  # file-backed: the tail is not in the core
            seg(0x1000, 0x1000, 0x0, 0x1000),  # given out of order
            seg(0x8000, 0x2000, 0x3000, 0x100, zero_fill=True),  # anonymous, complete core: zeros after
        ],
    )


def test_read_inside_one_segment(mem):
    assert mem.read(0x2010, 4) == BUF[0x1010:0x1014]
    assert mem.read_u32(0x2010) == int.from_bytes(BUF[0x1010:0x1014], "little")
    assert mem.read_u64(0x2010) == int.from_bytes(BUF[0x1010:0x1018], "little")


def test_read_spans_adjacent_segments(mem):
    assert mem.read(0x1FFC, 8) == BUF[0xFFC:0x1000] + BUF[0x1000:0x1004]


def test_bytes_not_written_to_the_core_are_unreadable(mem):
    assert mem.read(0x37F0, 0x10) == BUF[0x27F0:0x2800]
    with pytest.raises(MemoryNotInCore):
        mem.read(0x37F0, 0x20)
    assert not mem.is_readable(0x3800, 1)


def test_anonymous_tail_reads_as_zeros(mem):
    assert mem.read(0x80F0, 0x20) == BUF[0x30F0:0x3100] + bytes(0x10)
    assert mem.read(0x9FF0, 0x10) == bytes(0x10)
    assert not mem.is_readable(0x9FF0, 0x11)


@pytest.mark.parametrize("addr", [0, 0xFFF, 0x4000, 0x7FFF, 0xA000, 1 << 63])
def test_unmapped_addresses_raise(mem, addr):
    with pytest.raises(MemoryNotInCore) as e:
        mem.read(addr, 1)
    assert e.value.addr == addr
    assert isinstance(e.value, LookupError)


def test_read_cstring_stops_at_nul_limit_or_end_of_memory():
    data = b"hello\x00world" + b"x" * 5000
    m = CoreMemory(data, [seg(0x10000, 0x2000, 0, len(data))])
    assert m.read_cstring(0x10000) == b"hello"
    assert m.read_cstring(0x10006, limit=5) == b"world"
    assert m.read_cstring(0x10006) == (b"world" + b"x" * 5000)[:4096]
    assert m.read_cstring(0x11000, limit=10000) == data[0x1000:]  # ends where readable memory ends
    with pytest.raises(MemoryNotInCore):
        m.read_cstring(0x20000)


def test_read_of_zero_bytes_is_empty(mem):
    assert mem.read(0, 0) == b""


def test_read_prefix_stops_at_the_first_missing_byte(mem):
    assert mem.read_prefix(0x37F0, 0x100) == BUF[0x27F0:0x2800]
    assert mem.read_prefix(0x4000, 0x10) == b""
    assert mem.read_prefix(0x1FF0, 0x20) == BUF[0xFF0:0x1010]


def layout(size, phdrs, files=()):
    from forensics.core.memory import CoreLayout

    expected = max(p.offset + p.filesz for p in phdrs)
    return CoreLayout(size=size, expected_size=expected, phdrs=tuple(phdrs), notes=(), file_mappings=tuple(files),
                      page_size=4096)


def test_zero_fill_only_for_readable_anonymous_memory_of_a_complete_core():
    from forensics.core import elf
    from forensics.core.memory import _segments

    def load(vaddr, offset, filesz, memsz, flags=elf.PF_R | elf.PF_W):
        return elf.ProgramHeader(type=elf.PT_LOAD, flags=flags, offset=offset, vaddr=vaddr, filesz=filesz,
                                 memsz=memsz, align=4096)

    phdrs = [
        load(0x10000, 0x1000, 0x1000, 0x3000),  # anonymous, partly dumped
        load(0x20000, 0x2000, 0x1000, 0x5000, flags=elf.PF_R | elf.PF_X),  # a library: first page only
        load(0x30000, 0x3000, 0, 0x1000, flags=0),  # PROT_NONE guard
    ]
    lib = elf.FileMapping(start=0x20000, end=0x25000, offset=0, path="/lib/x.so")
    complete = {s.vaddr: s for s in _segments(layout(0x4000, phdrs, [lib]))}
    assert [complete[a].zero_fill for a in (0x10000, 0x20000, 0x30000)] == [True, False, False]
    assert complete[0x10000].present == 0x1000
    # the same core cut inside the second segment: nothing is zero-filled, present bytes shrink
    cut = {s.vaddr: s for s in _segments(layout(0x2800, phdrs, [lib]))}
    assert [cut[a].zero_fill for a in (0x10000, 0x20000, 0x30000)] == [False, False, False]
    assert (cut[0x10000].present, cut[0x20000].present) == (0x1000, 0x800)


def test_a_file_is_read_through_windows_as_its_bytes_read(tmp_path):
    # GIVEN a file of 3.5 windows of distinct bytes and two segments over it, one starting inside a window
    import os

    from forensics.core.memory import KEEP, WINDOW, CoreFileReader

    data = os.urandom(WINDOW * 7 // 2)
    (tmp_path / "f").write_bytes(data)
    tail = WINDOW * 3 // 2 - 0x1000  # the second segment's bytes in the file, from 0x1000 into the third window
    segs = [seg(0x100000, WINDOW * 2, 0, WINDOW * 2), seg(0x800000, WINDOW * 2, WINDOW * 2 + 0x1000, tail,
                                                          zero_fill=True)]
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    mem = CoreMemory(CoreFileReader(fd, len(data)), segs)
    ref = CoreMemory(data, segs)
    try:
        # THEN every read, across a window's end, longer than a window, into the zero fill, reads the same
        for addr, size in [(0x100000, 8), (0x100000 + WINDOW - 4, 8), (0x100000 + 10, WINDOW + 100),
                           (0x100000, WINDOW * 2), (0x800000 + WINDOW - 0x1000 - 4, 8), (0x800000 + tail - 8, 16),
                           (0x800000, WINDOW * 2)]:
            assert mem.read(addr, size) == ref.read(addr, size), (hex(addr), size)
        assert mem.read_prefix(0x100000 + WINDOW * 2 - 4, 64) == ref.read_prefix(0x100000 + WINDOW * 2 - 4, 64)
        # and a view is the window holding the address, cut to its segment
        start, view = mem.view(0x800000 + 8)
        assert start == 0x800000 and bytes(view) == data[WINDOW * 2 + 0x1000:WINDOW * 3]
        start, view = mem.view(0x100000 + WINDOW + 5)
        assert start == 0x100000 + WINDOW and bytes(view) == data[WINDOW:WINDOW * 2]
        assert len(mem._buf._windows) <= KEEP
    finally:
        mem.close()
