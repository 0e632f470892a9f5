"""find_argv_pointers on hand-built initial stacks (the real-core case is in test_core_reader)."""
from __future__ import annotations

import struct

from forensics.core.argv import find_argv_pointers

BASE = 0x7FFD_0000_0000
AUXV = struct.pack("<6Q", 6, 4096, 31, BASE + 0x800, 0, 0)


def stack(words, pad=0):
    """[pad zero bytes] words auxv, then room for the strings up to BASE+0x1000."""
    head = bytes(pad) + struct.pack(f"<{len(words)}Q", *words) + AUXV
    return head + bytes(0x1000 - len(head))


def test_argc_argv_envp():
    a = [BASE + 0x400, BASE + 0x410, BASE + 0x420]
    e = [BASE + 0x500]
    got = find_argv_pointers(stack([3, *a, 0, *e, 0]), BASE, AUXV)
    assert got == a


def test_no_environment():
    a = [BASE + 0x400]
    assert find_argv_pointers(stack([1, *a, 0, 0]), BASE, AUXV) == a


def test_leading_garbage_and_alignment():
    a = [BASE + 0x400, BASE + 0x408]
    window = stack([0xDEAD, 2, *a, 0, 0], pad=16)
    assert find_argv_pointers(window, BASE, AUXV) == a
    # the vector is 8-byte aligned on the stack; a misaligned copy is not it
    assert find_argv_pointers(b"\0" * 4 + window, BASE, AUXV) is None


def test_auxv_not_in_window():
    assert find_argv_pointers(b"\0" * 4096, BASE, AUXV) is None
    assert find_argv_pointers(stack([1, BASE, 0, 0]), BASE, b"") is None


def test_words_that_are_not_a_vector():
    # envp terminator missing
    assert find_argv_pointers(stack([1, BASE + 0x400, 0, BASE + 0x500]), BASE, AUXV) is None
    # a pointer outside the window
    assert find_argv_pointers(stack([1, 0x1234, 0, 0]), BASE, AUXV) is None
    # argc disagrees with the number of pointers, and the window ends first
    assert find_argv_pointers(stack([5, BASE + 0x400, 0, 0]), BASE, AUXV) is None


def test_last_copy_of_the_vector_is_used():
    a = [BASE + 0x400]
    first = struct.pack("<4Q", 1, BASE + 0x10, 0, 0) + AUXV
    window = first + struct.pack("<4Q", 1, *a, 0, 0) + AUXV + bytes(0x1000)
    assert find_argv_pointers(window, BASE, AUXV) == a
