"""heap_overflow.c's twin for roots without a compiler: the same overflow through ctypes and glibc.

    python heap_overflow.py MODE REQUEST OVERFLOW FILL ORACLE [BALLAST_MB]

Same modes, arguments and oracle as ``heap_overflow.c`` (malloc, malloc_usable_size, memset
and free are libc's own, called through ctypes): the buffer and the chunk after it are two
``malloc(REQUEST)`` results that lie next to each other (pairs are tried until two do).
Runs on any Python 3 the roots carry (3.9 in bullseye).  BALLAST_MB: MiB of 4 KiB malloc chunks kept alive
first (bench/heap.py's big heap: the overflow then lies past them, near the top of the heap).
"""
import ctypes
import json
import sys
import threading

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]

KEEP = []


def run(mode, request, overflow, fill, oracle):
    for _ in range(64):
        buf = libc.malloc(request)
        nxt = libc.malloc(request)
        KEEP.extend((buf, nxt))
        usable = libc.malloc_usable_size(buf)
        if nxt == buf + usable + 8:
            break
    else:
        sys.exit(2)
    with open(oracle, "w") as f:
        json.dump({"buffer": buf, "request": request, "usable": usable, "next": nxt, "overflow": overflow,
                   "fill": fill, "adjacent": True}, f)
    ctypes.memset(buf, 0x11, request)
    ctypes.memset(buf + request, fill, overflow)  # the overflow
    libc.free(nxt if "free-next" in mode else buf)  # glibc aborts here


def main():
    mode, request, overflow, fill, oracle = sys.argv[1:6]
    for _ in range(int(sys.argv[6]) << 8 if len(sys.argv) > 6 else 0):
        KEEP.append(libc.malloc(4000))
    args = (mode, int(request, 0), int(overflow, 0), int(fill, 0), oracle)
    if mode.startswith("thread-"):
        t = threading.Thread(target=run, args=args, name="overflower")
        t.start()
        t.join()
    else:
        run(*args)


if __name__ == "__main__":
    main()
