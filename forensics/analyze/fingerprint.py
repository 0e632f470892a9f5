"""Crash fingerprints: a short stable hash of what makes two crashes the same bug.

The basis is the crash class, glibc's abort message with addresses blanked, the
top meaningful native frames of the crashing thread (function and library
name, no addresses or offsets, which ASLR and rebuilds change) and its top
Python frames (function and file name, no line numbers, so a harmless edit
elsewhere in a file does not split one bug in two).
"""
from __future__ import annotations

import hashlib
import re

from ..model import Crash, Thread
from .classify import normalize_message
from .stacks import meaningful_native_frames

__all__ = ["fingerprint_basis", "fingerprint", "NATIVE_DEPTH", "PYTHON_DEPTH"]

NATIVE_DEPTH = 5
PYTHON_DEPTH = 5
_SO_VERSION = re.compile(r"\.so(\.[0-9.]+)?$")


def _lib(name: str | None) -> str:
    if not name:
        return "?"
    base = name.rsplit("/", 1)[-1]
    return _SO_VERSION.sub(".so", base)


def fingerprint_basis(crash: Crash, crashed: Thread | None) -> tuple[str, ...]:
    """The exact strings hashed, in order, so a fingerprint can always be explained."""
    basis = [f"kind:{crash.kind.value}", f"signal:{crash.signal_name or '-'}"]
    if crash.abort_message:
        basis.append(f"abort:{normalize_message(crash.abort_message)}")
    if crash.fault_kind is not None:
        basis.append(f"fault:{crash.fault_kind.value}")
    if crashed is not None:
        # gdb's reconstructed tail-call frames are left out: libdw does not make them, and a crash
        # must fingerprint the same whichever unwinder read it
        named = [f for f in meaningful_native_frames(crashed) if f.symbol and not f.tailcall]
        for f in named[:NATIVE_DEPTH]:
            basis.append(f"native:{_lib(f.library)}!{f.symbol}")
        for p in crashed.py_frames[:PYTHON_DEPTH]:
            basis.append(f"python:{p.file.rsplit('/', 1)[-1]}:{p.function}")
    return tuple(basis)


def fingerprint(basis: tuple[str, ...]) -> str:
    """12 hex digits of the SHA-256 of the basis.

    >>> fingerprint(("kind:segv", "signal:SIGSEGV"))
    'a605487ec8c3'
    """
    return hashlib.sha256("\n".join(basis).encode()).hexdigest()[:12]
