"""Faults a stack or a file mapping makes: what ``FaultKind`` names beyond a bad pointer.

usage: overflow.py LIBCRASH.so {c-recursion,py-recursion,memmap} [WORKDIR]

``c-recursion``: libcrash.so starts a thread with a 256 KiB stack whose C function calls itself until the
stack runs into its guard page; ``py-recursion``: a Python function on a thread with a 256 KiB stack
(``threading.stack_size``) recurses through a C builtin (``map``, so each level costs C stack too) with the
recursion limit raised, until the stack runs into its guard page; ``memmap``: a file of 2 pages is mapped
whole (``mmap``, read-only, as ``numpy.memmap(mode="r")`` maps it), truncated to 1 page by someone else, and
its second page read: SIGBUS, BUS_ADRERR, past the end of the file (kept in WORKDIR, so the core names it).
"""
import ctypes
import mmap
import os
import sys
import threading

LIB = ctypes.CDLL(sys.argv[1])
MODE = sys.argv[2]


def overflow_c_stack():
    return LIB.forensics_overflow_thread()


def descend(n):
    return sum(map(descend, [n + 1]))


def overflow_python_stack():
    sys.setrecursionlimit(1_000_000)
    threading.stack_size(256 * 1024)
    worker = threading.Thread(target=descend, args=(0,), name="descender")
    worker.start()
    worker.join()


def read_truncated_memmap(path):
    with open(path, "wb") as f:
        f.write(b"\x01" * 2 * mmap.PAGESIZE)
    with open(path, "r+b") as f:
        view = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE, access=mmap.ACCESS_READ)  # numpy.memmap(mode="r")
    os.truncate(path, mmap.PAGESIZE)  # another writer rewrote the file shorter
    return view[mmap.PAGESIZE + 16]


def main():
    if MODE == "c-recursion":
        overflow_c_stack()
    elif MODE == "py-recursion":
        overflow_python_stack()
    elif MODE == "memmap":
        read_truncated_memmap(os.path.join(sys.argv[3], "samples.dat"))
    raise SystemExit(f"{MODE}: did not crash")


main()
