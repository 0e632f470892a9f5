"""Two faults in two threads: a poller thread corrupts the heap and glibc aborts it, and while its
(slow) SIGABRT handler runs, the main thread dies of SIGSEGV -- the process exits 139.

usage: two_threads.py LIBCRASH.so LIBREPORTER.so

The core holds both: the main thread's SIGSEGV (the fatal signal) and the poller's signal frame for
the SIGABRT glibc's abort() sent, with glibc's message written; the heap corruption came first.
"""
import ctypes
import sys
import threading
import time

LIB = ctypes.CDLL(sys.argv[1])
REPORTER = ctypes.CDLL(sys.argv[2])


def poll_nvlink():
    LIB.forensics_heap_overflow(0)  # glibc aborts; the reporter's handler then takes its time


def main():
    if REPORTER.forensics_install_slow_abort_handler():
        raise SystemExit("sigaction failed")
    poller = threading.Thread(target=poll_nvlink, name="nvml-poller", daemon=True)
    poller.start()
    time.sleep(0.5)  # the poller is in its SIGABRT handler by now
    LIB.forensics_bad_write(0)


main()
