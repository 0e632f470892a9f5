"""double_free: one heap chunk freed twice, glibc's own check catching the second free (no compiler needed).

    python double_free.py MODE SIZE ORACLE [BALLAST_MB]

Every mode frees one pointer twice; what glibc says depends on the neighbours the chunk has by then, so
each mode arranges them (malloc and free are libc's own, called through ctypes; the frames around
the second free are CPython's, ctypes' and libffi's):

MODE      tcache       SIZE fits a tcache bin: "free(): double free detected in tcache 2"
          fasttop      the tcache of SIZE's bin filled first, so the chunk goes to a fastbin and is its first
                       entry: "double free or corruption (fasttop)" (glibc before 2.43: no fastbins there)
          top          the chunk borders the top chunk, so its first free merges it into the top:
                       "double free or corruption (top)"
          prev         the chunk after it is in use: its first free puts it on the unsorted list and
                       clears that neighbour's PREV_INUSE: "double free or corruption (!prev)"
          merged       the chunk after it is free already: its first free merges the two into one free
                       chunk on the unsorted list, "(!prev)" again
          merged-back  the chunk before it is free already: its first free merges it into that one, whose
                       header now covers it; "(!prev)"
          dealloc      a ctypes buffer (a Python object owning SIZE bytes that CPython malloc'd) freed by
                       libc.free, then by ctypes' tp_dealloc when the object dies: the message is whatever
                       the interpreter's heap around the buffer makes it
SIZE      bytes asked of malloc (tcache and fasttop: up to 1032 and 120; the others above the tcache)
ORACLE    a JSON file written before the frees: the pointer freed twice ("mem"), its chunk's size
          (``malloc_usable_size`` + 8) and the neighbours arranged
BALLAST_MB  MiB of 4 KiB malloc chunks kept alive before the frees (bench/heap.py's big heap)

The oracle is written before the first free, so no malloc of Python's own runs between the two frees.
"""
import ctypes
import json
import sys

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
M_TRIM_THRESHOLD = -1
KEEP = []


def chunk_size(mem):
    return libc.malloc_usable_size(mem) + 8


def adjacent(size, count):
    """``count`` malloc(size) results whose chunks lie one right after the other, the chunk before the first
    in use (its PREV_INUSE set: no first free merges backward unless the mode arranges it)."""
    for _ in range(256):
        run = [libc.malloc(size) for _ in range(count)]
        KEEP.extend(run)
        if all(run[i + 1] == run[i] + chunk_size(run[i]) for i in range(count - 1)) and size_word(run[0]) & 1:
            return run
    sys.exit(2)


def size_word(mem):
    return ctypes.c_size_t.from_address(mem - 8).value


def setup(mode, size):
    """(the pointer to free twice, the frees that arrange its neighbours first, what the oracle says)."""
    if mode in ("tcache", "dealloc"):
        return libc.malloc(size), [], {}
    if mode == "fasttop":
        fill = [libc.malloc(size) for _ in range(7)]
        p, _guard = adjacent(size, 2)  # a chunk after it: it is not the top's neighbour
        return p, fill, {"tcache_filled": 7}
    if mode == "top":
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # its first free must not give the merged top back to the kernel
        p = libc.malloc(size)
        top = p + chunk_size(p)  # the top chunk's user pointer: its size word is the top's
        if size_word(top) & ~7 < 0x1000:
            sys.exit(2)
        return p, [], {"top": top - 16}
    if mode == "prev":
        p, q = adjacent(size, 2)
        return p, [], {"next": q - 16}
    if mode == "merged":
        p, q, _guard = adjacent(size, 3)  # the guard keeps q from merging into the top
        return p, [q], {"next": q - 16, "merged_size": chunk_size(p) + chunk_size(q)}
    if mode == "merged-back":
        o, p, _guard = adjacent(size, 3)
        return p, [o], {"before": o - 16, "merged_size": chunk_size(o) + chunk_size(p)}
    sys.exit(f"unknown mode {mode}")


def main():
    mode, size, oracle = sys.argv[1], int(sys.argv[2], 0), sys.argv[3]
    ballast = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    for _ in range(ballast << 8):
        KEEP.append(libc.malloc(4000))  # a 4 KiB chunk each, written by nobody: a heap walk visits each
    if mode == "dealloc":
        buf = ctypes.create_string_buffer(size)
        p = ctypes.addressof(buf)
        first, extra = [], {}
    else:
        p, first, extra = setup(mode, size)
    with open(oracle, "w") as f:
        json.dump({"mode": mode, "python": sys.executable, "mem": p, "chunk": p - 16, "chunk_size": chunk_size(p),
                   **extra}, f)
    for q in first:
        libc.free(q)
    libc.free(p)  # the first free
    if mode == "dealloc":
        del buf  # ctypes' tp_dealloc frees its buffer again: glibc aborts here
    libc.free(p)  # the second: glibc aborts here
    sys.exit(3)


if __name__ == "__main__":
    main()
