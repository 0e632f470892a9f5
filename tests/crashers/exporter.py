"""A crash sample shaped like a GPU metrics exporter (works on CPython 3.8+).

usage: exporter.py LIBCRASH.so
           {heap-prev,heap-next-size,segv,py-abort,fpe,ill,bus,qsort-abort,string-at,sleep} [READY_FIFO]

EXPORTER_THREAD_NAME sets the sleeping thread's name (default "metrics-server").
EXPORTER_HANDLER installs a crash reporter before the scrape, one whose own code faults while the
process dies (the nested faults of issue #22): ``ctypes-abort`` (a ctypes callback as the SIGABRT
handler, reading memory through a bad pointer), ``c-abort`` (libreporter.so's SIGABRT handler,
dereferencing NULL), ``c-segv`` (libreporter.so's SIGSEGV handler, faulting again), ``faulthandler``
(Python's faulthandler: it prints the traceback and re-raises the same signal).  LIBREPORTER names
libreporter.so for the ``c-*`` handlers.
The ``sleep`` scenario does not crash: it signals READY_FIFO and sleeps in the same call stack, for
a gcore of a live process.
EXPORTER_SUBINTERPRETER=1 (CPython 3.12+) also runs a thread "sub-runner" that enters a
subinterpreter, which starts a thread "sub-worker" of its own; both sleep there.
EXPORTER_BALLAST_MB=N (default 0) keeps N MiB of written Python heap alive
before the crash, so the core is at least that big (for bench/analyze.py).
EXPORTER_HEAP_BALLAST_MB=N (default 0) keeps N MiB of 4 KiB objects alive: glibc heap chunks,
one every 4 KiB, that a walk of the heap visits one by one (for bench/analyze.py's --heap).

The main thread scrapes ``collect -> device_metrics -> nvlink_throughput ->
query_nvlink_throughput_counters``, which calls into a native library that
corrupts the heap (glibc aborts) or writes through a bad pointer (SIGSEGV),
while a second thread named "metrics-server" sleeps in ``serve_forever``.
``qsort-abort`` sorts through glibc's ``qsort`` with a Python comparison that
aborts: C and Python frames interleave, with glibc's inlined sort frames between.
"""
import ctypes
import os
import sys
import threading
import time

LIB = ctypes.CDLL(sys.argv[1])
SCENARIO = sys.argv[2]
_serving = threading.Event()
_OTHER_FAULTS = {
    "fpe": lambda: LIB.forensics_divide(0),
    "ill": lambda: LIB.forensics_trap(),
    "bus": lambda: LIB.forensics_bus(),
}
_ballast = []


def _sort_with_callback():
    libc = ctypes.CDLL(None)
    compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
    calls = []

    def compare(a, b):
        calls.append(1)
        if len(calls) == 5:
            os.abort()
        return a[0] - b[0]

    values = (ctypes.c_int * 64)(*range(64, 0, -1))
    libc.qsort(values, len(values), ctypes.sizeof(ctypes.c_int), compare_type(compare))


def serve_forever():
    _serving.set()
    while True:
        time.sleep(3600)


def query_nvlink_throughput_counters():
    if SCENARIO == "sleep":
        return time.sleep(3600)
    if SCENARIO == "segv":
        return LIB.forensics_bad_write(0)
    if SCENARIO in _OTHER_FAULTS:
        return _OTHER_FAULTS[SCENARIO]()
    if SCENARIO == "qsort-abort":
        return _sort_with_callback()
    if SCENARIO == "string-at":
        return ctypes.string_at(0x10, 8)  # the standard library's wrapper faults on the exporter's behalf
    if SCENARIO == "py-abort":
        return os.abort()  # from Python, holding the GIL: an abort that is not heap corruption
    return LIB.forensics_heap_overflow(0 if SCENARIO == "heap-prev" else 1)


def nvlink_throughput():
    return query_nvlink_throughput_counters()


def device_metrics():
    return nvlink_throughput()


def collect():
    return device_metrics()


def install_handler(kind):
    """A crash reporter that itself faults while the process dies (see the module docstring)."""
    if kind == "faulthandler":
        import faulthandler

        faulthandler.enable()
        return
    if kind in ("c-abort", "c-segv"):
        reporter = ctypes.CDLL(os.environ["LIBREPORTER"])
        _ballast.append(reporter)
        if kind == "c-abort":
            install = reporter.forensics_install_abort_handler
        else:
            install = reporter.forensics_install_segv_handler
        if install():
            raise SystemExit("sigaction failed")
        return
    if kind != "ctypes-abort":
        raise SystemExit(f"unknown EXPORTER_HANDLER {kind!r}")
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)

    def on_abort(signum):
        ctypes.string_at(0x10, 8)  # the reporter reads memory through a pointer the heap corruption broke

    callback = handler_type(on_abort)
    _ballast.append(callback)  # the callback lives as long as the process
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, handler_type)
    libc.signal(6, callback)


_SUB_CODE = """
import threading, time


def sub_worker():
    time.sleep(60 * 60)


def sub_serve(marker):
    threading.Thread(target=sub_worker, name="sub-worker").start()
    open(marker, "w").close()
    time.sleep(60 * 60)


sub_serve(MARKER)
"""


def enter_subinterpreter(marker):
    """The thread that enters a subinterpreter: its state in the main interpreter calls exec, its state in
    the subinterpreter starts a thread there and sleeps.  3.14's concurrent.interpreters, else the
    private modules of 3.13 (_interpreters) and 3.12 (_xxsubinterpreters)."""
    code = _SUB_CODE.replace("MARKER", repr(marker))
    try:
        from concurrent import interpreters
    except ImportError:
        try:
            import _interpreters as low
        except ImportError:
            import _xxsubinterpreters as low
        low.run_string(low.create(), code)
        return
    interpreters.create().exec(code)


def start_subinterpreter():
    marker = os.path.abspath("subinterpreter-ready")
    threading.Thread(target=enter_subinterpreter, args=(marker,), name="sub-runner", daemon=True).start()
    for _ in range(1000):  # up to 10 s
        if os.path.exists(marker):
            break
        time.sleep(0.01)
    time.sleep(0.05)  # let both threads reach time.sleep


def main():
    if os.environ.get("EXPORTER_SUBINTERPRETER"):
        start_subinterpreter()
    if os.environ.get("EXPORTER_HANDLER"):
        install_handler(os.environ["EXPORTER_HANDLER"])
    name = os.environ.get("EXPORTER_THREAD_NAME", "metrics-server")  # tests plant hostile names here
    server = threading.Thread(target=serve_forever, name=name, daemon=True)
    server.start()
    _serving.wait()
    ballast_mb = int(os.environ.get("EXPORTER_BALLAST_MB") or 0)
    if ballast_mb > 0:
        # every byte written, so each page is present and lands in the core
        _ballast.append(bytearray(b"\x01") * (ballast_mb << 20))
    heap_mb = int(os.environ.get("EXPORTER_HEAP_BALLAST_MB") or 0)
    if heap_mb > 0:
        _ballast.extend(bytes(4000) for _ in range(heap_mb << 8))  # 4000 bytes: a 4 KiB malloc chunk each
    time.sleep(0.05)  # let serve_forever reach time.sleep
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as fifo:
            fifo.write("ready\n")
    collect()


if __name__ == "__main__":
    main()
