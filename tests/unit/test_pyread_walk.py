"""forensics.pyread's bounded reads and walkers over a hand-built process image (a real CoreMemory on bytes)."""
from __future__ import annotations

import struct

import pytest

from forensics.core.memory import CoreMemory, Segment
from forensics.pyread.layouts import build_layout
from forensics.model import PyFrame
from forensics.pyread.objects import MAX_READ, BadObject, Budget, CodeCache, Limits, Objects, Reader, WalkCut
from forensics.pyread.walk import walk_frame_objects

MAX_FRAMES = Limits().frames

BASE = 0x10000
UNICODE_TYPE, BYTES_TYPE, CODE_TYPE = 0x1000, 0x1100, 0x1200


class Image:
    """A bytearray mapped at BASE, read through a real CoreMemory."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)

    def put(self, addr: int, data: bytes) -> None:
        self.buf[addr - BASE : addr - BASE + len(data)] = data

    def u64(self, addr: int, value: int) -> None:
        self.put(addr, struct.pack("<Q", value))

    def memory(self) -> CoreMemory:
        seg = Segment(vaddr=BASE, memsz=len(self.buf), offset=0, present=len(self.buf), zero_fill=False, flags=6)
        return CoreMemory(bytes(self.buf), [seg])


def put_ascii(img: Image, layout, addr: int, text: str) -> None:
    img.u64(addr + layout.ob_type_off, UNICODE_TYPE)
    img.u64(addr + layout.uni_length_off, len(text))
    state = 0
    for name, value in (("kind", 1), ("compact", 1), ("ascii", 1)):
        bit, _ = layout.uni_state_bits[name]
        state |= value << bit
    word_at = min(b for b, _ in layout.uni_state_bits.values()) // 8 // 4 * 4
    img.put(addr + word_at, struct.pack("<I", state >> (word_at * 8)))
    img.put(addr + layout.ascii_size, text.encode() + b"\0")


def objects_for(layout, img: Image, limits: Limits | None = None) -> Objects:
    return Objects(layout, Reader(img.memory(), Budget(limits or Limits())),
                   {"PyUnicode_Type": UNICODE_TYPE, "PyBytes_Type": BYTES_TYPE, "PyCode_Type": CODE_TYPE})


@pytest.mark.parametrize("minor", [8, 10, 12, 13])
def test_read_ascii_str(minor):
    layout = build_layout(3, minor)
    img = Image(0x1000)
    put_ascii(img, layout, BASE + 0x100, "collect")
    objs = objects_for(layout, img)
    assert objs.read_str(BASE + 0x100) == "collect"
    assert objs.read_str(BASE + 0x100, max_chars=3) == "col..."
    assert objs.str_equals(BASE + 0x100, "collect") and not objs.str_equals(BASE + 0x100, "collecT")


def test_wrong_type_and_bad_pointers_raise_bad_object():
    layout = build_layout(3, 12)
    img = Image(0x1000)
    img.u64(BASE + 0x100 + layout.ob_type_off, BYTES_TYPE)
    objs = objects_for(layout, img)
    with pytest.raises(BadObject, match="not a unicode"):
        objs.read_str(BASE + 0x100)
    rd = objs.rd
    with pytest.raises(BadObject, match="NULL"):
        rd.ptr(0)
    with pytest.raises(BadObject, match="not in the core"):
        rd.ptr(0x4141414141414141)
    with pytest.raises(BadObject, match="not in the core"):
        rd.read(BASE + 0xFFC, 8)  # runs off the end of the mapping
    with pytest.raises(BadObject, match="too large"):
        rd.read(BASE, MAX_READ + 1)
    assert not CodeCache(objs).is_code(0x4141414141414141)


def frame_image(layout, count: int, *, cycle_to: int | None = None) -> tuple[Image, int]:
    """``count`` PyFrameObjects (3.10 layout) linked by f_back, sharing one code object."""
    size = 0x100
    img = Image(0x1000 + count * size)
    code = BASE + 0x200
    img.u64(code + layout.ob_type_off, CODE_TYPE)
    name, fname, table = BASE + 0x400, BASE + 0x500, BASE + 0x600
    put_ascii(img, layout, name, "loop")
    put_ascii(img, layout, fname, "x.py")
    img.u64(table + layout.ob_type_off, BYTES_TYPE)
    img.u64(table + layout.ob_size_off, 2)
    img.put(table + layout.bytes_sval_off, bytes([100, 1]))
    for field, value in ((layout.code_name, name), ("co_filename", fname), (layout.code_table, table)):
        img.u64(code + layout.offset("PyCodeObject", field), value)
    img.put(code + layout.offset("PyCodeObject", "co_firstlineno"), struct.pack("<i", 41))
    first = BASE + 0x1000
    for i in range(count):
        addr = first + i * size
        nxt = first + (i + 1) * size if i + 1 < count else 0
        if i + 1 == count and cycle_to is not None:
            nxt = first + cycle_to * size
        img.u64(addr + layout.offset("PyFrameObject", "f_back"), nxt)
        img.u64(addr + layout.offset("PyFrameObject", "f_code"), code)
        img.put(addr + layout.offset("PyFrameObject", "f_lasti"), struct.pack("<i", 3))
    return img, first


def test_frame_chain_is_read_with_lines():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 3)
    objs = objects_for(layout, img)
    frames, error = walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
    assert error is None
    code = BASE + 0x200
    assert frames == [PyFrame(function="loop", file="x.py", line=42, is_entry=True, frame_address=first + i * 0x100,
                              code_address=code) for i in range(3)]


def test_frame_cycle_stops_with_the_address():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 4, cycle_to=1)
    objs = objects_for(layout, img)
    frames, error = walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
    assert len(frames) == 4
    assert error == f"frame cycle at 0x{first + 0x100:x}"


def test_frame_chain_is_capped():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, MAX_FRAMES + 10)
    objs = objects_for(layout, img)
    frames, error = walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
    assert len(frames) == MAX_FRAMES
    assert error == f"stopped after {MAX_FRAMES} frames"


def test_bad_code_object_gives_an_unknown_frame_and_goes_on():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 2)
    img.u64(first + layout.offset("PyFrameObject", "f_code"), 0x4141414141414141)
    objs = objects_for(layout, img)
    frames, error = walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
    assert frames[0].function == "<unknown>" and frames[1].function == "loop"
    assert frames[0].code_address == 0x4141414141414141
    assert "code: 0x4141414141414141 is not in the core" in error


def test_the_whole_walk_is_cut_at_its_read_bound():
    # GIVEN a frame chain far longer than the walk's memory-read budget allows
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 600)
    objs = objects_for(layout, img, Limits(reads=500))
    # WHEN it is walked
    # THEN the walk stops with a WalkCut naming the bound (the walker turns it into the record's ``cut``)
    with pytest.raises(WalkCut, match="cut at the walk's bound of 500 memory reads"):
        walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
    assert objs.rd.budget.reads == 501


def test_the_whole_walk_is_cut_at_its_frame_bound_across_threads():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 40)
    objs = objects_for(layout, img, Limits(total_frames=70))
    codes = CodeCache(objs)
    frames, error = walk_frame_objects(layout, objs.rd, codes, first, MAX_FRAMES)  # one thread: 40 frames
    assert len(frames) == 40 and error is None
    with pytest.raises(WalkCut, match="cut at the walk's bound of 70 frames in all"):
        walk_frame_objects(layout, objs.rd, codes, first, MAX_FRAMES)  # a second thread: past 70 in all


def test_the_whole_walk_is_cut_at_its_time_bound():
    layout = build_layout(3, 10)
    img, first = frame_image(layout, 2000)
    objs = objects_for(layout, img, Limits(seconds=0.0))
    with pytest.raises(WalkCut, match="cut at the walk's time bound of 0 s"):
        walk_frame_objects(layout, objs.rd, CodeCache(objs), first, MAX_FRAMES)
