"""Landlock (landlock(7)): no write to the filesystem but beneath the directories given; no TCP; no signal or abstract
unix socket out of the sandbox.

Landlock needs no privilege and no namespace (it works inside an unprivileged container, Linux 5.13+); each ABI
version adds rights, and what this kernel's ABI does not know is left out (older kernels: fewer rights restricted,
never an error). The ruleset handles only writes: reading stays the business of file permissions and of the
container's (or bubblewrap's) mounts.
"""
from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["abi_version", "restrict"]

# the syscall numbers are the same on x86-64 and AArch64 (new syscalls share one table since Linux 5.1)
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _open_path(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:  # nothing there to write: no rule needed
        return None


def abi_version() -> int:
    """This kernel's Landlock ABI version; 0 when Landlock is not there (not built, not enabled, or refused by a
    seccomp profile)."""
    v = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return v if v > 0 else 0


def restrict(writable: list[str] | tuple[str, ...], *, files: tuple[str, ...] = ("/dev/null",),
             network: bool = False) -> int:
    """Restrict this thread (and what it execs) to writing beneath ``writable`` and into ``files``; without
    ``network``, no TCP bind or connect; no signal to, nor abstract unix socket of, a process outside.

    :return: the ABI version applied (0: Landlock is not there; nothing was restricted)
    :raises OSError: Landlock is there and refused the ruleset
    """
    abi = abi_version()
    if abi == 0:
        return 0
    libc = _libc()
    fs = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE
    if abi >= 2:
        fs |= _REFER
    if abi >= 3:
        fs |= _TRUNCATE
    attr = _RulesetAttr(handled_access_fs=fs,
                        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 and not network else 0,
                        scoped=(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct as this ABI knows it
    rs = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rs < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        file_rights = _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)
        for path, rights in [*((p, fs) for p in writable), *((p, file_rights) for p in files)]:
            fd = _open_path(path)
            if fd is None:
                continue
            try:
                rule = _PathBeneath(allowed_access=rights, parent_fd=fd)
                if libc.syscall(_ADD_RULE, rs, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.syscall(_RESTRICT_SELF, rs, ctypes.c_uint32(0)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, "landlock_restrict_self" + (" (needs no_new_privs)" if e == errno.EPERM else ""))
    finally:
        os.close(rs)
    return abi
