"""A crash sample that never imports ``threading`` (so no thread has a Python name).

usage: bare.py LIBCRASH.so

``query`` calls into libcrash.so, which writes through a near-NULL pointer (SIGSEGV).
"""
import ctypes
import sys


def query(lib):
    return lib.forensics_bad_write(0)


def main():
    if "threading" in sys.modules:  # the point of this sample: the main thread has no Python name
        raise SystemExit("threading was imported at start-up")
    query(ctypes.CDLL(sys.argv[1]))


main()
