"""A ctypes array overflowed by 24 bytes, and glibc catching it during a native call (any CPython 3.8+).

    python ctypes_overflow.py ORACLE

``query(36)`` makes a 36-entry array of 40-byte records (1440 bytes: calloc'd, a malloc chunk),
writes 24 bytes of ``Z`` past its end (the next chunk's size word among them), then hands the
chunk after it to ``free()`` through ctypes: glibc aborts inside that call, with ``query``'s frame
(locals ``values``, ``count``, ``nxt``) on the stack.  ORACLE gets the array's address, its
usable size and the chunk after it, from glibc's own ``malloc_usable_size``.
"""
import ctypes
import json
import sys

libc = ctypes.CDLL("libc.so.6")
libc.free.argtypes = [ctypes.c_void_p]
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]


class Record(ctypes.Structure):
    _fields_ = [("field_id", ctypes.c_uint), ("scope_id", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latency", ctypes.c_longlong), ("value_type", ctypes.c_int), ("status", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


def query(count, oracle):
    values = (Record * count)()
    usable = libc.malloc_usable_size(ctypes.addressof(values))
    nxt = ctypes.addressof(values) + usable + 8
    with open(oracle, "w") as f:
        json.dump({"buffer": ctypes.addressof(values), "size": ctypes.sizeof(values), "usable": usable,
                   "next": nxt, "overflow": 24}, f)
    ctypes.memset(ctypes.addressof(values) + ctypes.sizeof(values), 0x5A, 24)  # the overflow
    libc.free(nxt)  # glibc aborts here


if __name__ == "__main__":
    query(36, sys.argv[1])
