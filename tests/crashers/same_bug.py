"""One bug per mode, the same program under every CPython: the cores a fingerprint must not split.

usage: same_bug.py LIBCRASH.so {thread-method,c-extension,assert,native-a,native-b,null,usr1-handler,
                                double-free-small,double-free-large,dispatch-sum,dispatch-count,
                                throw-parse,throw-config}

``thread-method``: a method on a thread (``Poller.read_label``, run by ``Thread.run``) calls into
libcrash.so, which writes near NULL; ``c-extension``: a C extension of the standard library
(``_ctypes``: its ``c_int`` getter) reads address 0x10; ``assert``: a C assertion fails in libcrash.so
(glibc's message names the program); ``native-a`` / ``native-b``: a thread libcrash.so starts itself
(no Python frames on it) faults in one of two functions; ``null``: libcrash.so writes to address 0
(with ``PYTHONFAULTHANDLER=1`` faulthandler handles it and raises SIGSEGV again); ``usr1-handler``: a
SIGUSR1 handler in libcrash.so writes through NULL, run when ``forensics_raise`` raised SIGUSR1;
``double-free-small`` / ``double-free-large``: libcrash.so releases one buffer twice, 64 bytes (glibc: "free():
double free detected in tcache 2") or 1280 bytes (glibc: "double free or corruption (top)" or "(!prev)", by
the heap around it) -- one bug;
``dispatch-sum`` / ``dispatch-count``: one generic Python dispatcher calls libcrash.so's ``forensics_sum_keys``
(reads NULL+0) or ``forensics_count_names`` (reads NULL+0x10) with NULL -- two bugs; ``throw-parse`` /
``throw-config``: libthrower.so (beside LIBCRASH.so) throws ``std::out_of_range`` from ``app::parse_header``
or ``app::ParseError`` from ``app::read_config`` through a ``noexcept`` entry point -- two bugs.
"""
import ctypes
import os
import sys
import threading

LIB = ctypes.CDLL(sys.argv[1])
MODE = sys.argv[2]


class Poller:
    def read_label(self):
        return LIB.forensics_bad_write(0)

    def poll(self):
        return self.read_label()


def read_counter():
    return ctypes.c_int.from_address(0x10).value


def check_channels():
    return LIB.forensics_assert(0)


def start_native_worker():
    return LIB.forensics_native_thread(0 if MODE == "native-a" else 1)


def write_null():
    return LIB.forensics_bad_write(-0x10)


def dump_state():
    if LIB.forensics_install_usr1_handler():
        raise SystemExit("sigaction failed")
    return LIB.forensics_raise(10)  # SIGUSR1


def release_buffers():
    return LIB.forensics_double_free(ctypes.c_size_t(64 if MODE == "double-free-small" else 1280))


def dispatch(function, *args):
    return getattr(LIB, function)(*args)


def throw(which):
    thrower = ctypes.CDLL(os.path.join(os.path.dirname(sys.argv[1]), "libthrower.so"))
    return thrower.thrower_parse_header(b"x") if which == "throw-parse" else thrower.thrower_read_config(2)


def main():
    if MODE == "thread-method":
        worker = threading.Thread(target=Poller().poll, name="poller")
        worker.start()
        worker.join()
    elif MODE == "c-extension":
        read_counter()
    elif MODE == "assert":
        check_channels()
    elif MODE in ("native-a", "native-b"):
        start_native_worker()
    elif MODE == "null":
        write_null()
    elif MODE == "usr1-handler":
        dump_state()
    elif MODE in ("double-free-small", "double-free-large"):
        release_buffers()
    elif MODE in ("dispatch-sum", "dispatch-count"):
        dispatch("forensics_sum_keys" if MODE == "dispatch-sum" else "forensics_count_names", None)
    elif MODE in ("throw-parse", "throw-config"):
        throw(MODE)
    raise SystemExit(f"{MODE}: did not crash")


main()
