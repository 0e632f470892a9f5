"""A ctypes array overflowed by 24 bytes, and glibc catching it during a native call (any CPython 3.8+).

    python ctypes_overflow.py ORACLE [own-header]

``query(36)`` makes a 36-entry array of 40-byte records (1440 bytes: calloc'd, a malloc chunk),
writes 24 bytes of ``Z`` past its end (the next chunk's size word among them), then hands the
chunk after it to ``free()`` through ctypes: glibc aborts inside that call, with ``query``'s frame
(locals ``values``, ``count``, ``nxt``) on the stack.  ORACLE gets the array's address, its
usable size and the chunk after it, from glibc's own ``malloc_usable_size``.

``own-header``: in a worker thread (its own arena, as the exporter's collector), a record written at
``values[-1]`` instead (a driver's wrong index, the simulated NVML's ``heap-delayed`` fault): its last field
lands on the array chunk's own size word, which then reads 0x425 (NON_MAIN_ARENA kept), a chunk of 0x420
bytes too small for the array; nothing past the end is written.  glibc notices when the array dies
(ctypes' tp_dealloc frees it, no frame's local any more): the "next chunk" it checks is inside the array.
ORACLE also gets the word written.
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


def own_header(count, oracle):
    values = (Record * count)()
    usable = libc.malloc_usable_size(ctypes.addressof(values))
    word = 0x425
    with open(oracle, "w") as f:
        json.dump({"buffer": ctypes.addressof(values), "size": ctypes.sizeof(values), "usable": usable,
                   "chunk": ctypes.addressof(values) - 16, "size_word": word}, f)
    record = Record.from_address(ctypes.addressof(values) - ctypes.sizeof(Record))  # values[-1]
    record.value = word  # its last 8 bytes: the chunk's size word
    del values, record  # ctypes frees the array: glibc aborts here


if __name__ == "__main__":
    if sys.argv[2:] == ["own-header"]:
        import threading

        worker = threading.Thread(target=own_header, args=(36, sys.argv[1]), name="collector")
        worker.start()
        worker.join()
    query(36, sys.argv[1])
