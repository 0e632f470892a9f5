"""Many threads, one fault: N Python threads wait on an event while the main thread writes near NULL
in libcrash.so (SIGSEGV).  What an analysis costs per thread is measured on its core.

usage: many_threads.py LIBCRASH.so N

Each thread waits in ``Event.wait`` (a futex wait in C, under a few Python frames); the process
crashes only once all N have started.
"""
import ctypes
import sys
import threading

LIB = ctypes.CDLL(sys.argv[1])
COUNT = int(sys.argv[2])


def serve(started, stop):
    started.release()
    stop.wait()


def main():
    started = threading.Semaphore(0)
    stop = threading.Event()
    for i in range(COUNT):
        threading.Thread(target=serve, args=(started, stop), name=f"worker-{i}", daemon=True).start()
    for _ in range(COUNT):
        started.acquire()
    LIB.forensics_bad_write(0)


main()
