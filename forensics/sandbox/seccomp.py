"""A seccomp filter built by libseccomp (``libseccomp.so.2``, its C API through ctypes).

libseccomp writes the BPF program: it knows every architecture's syscall numbers and argument layout, checks the
architecture of each call (a call of another ABI -- i386's ``int 0x80`` on x86-64 -- ends the process), and orders
the comparisons. Nothing here writes BPF by hand. Its Python binding is not on PyPI (it is built from libseccomp's
source tree, or Debian's python3-seccomp for Debian's own interpreter), so neither this tool's virtual environment
nor the agent image's self-contained interpreter could load it; the C library is in every distribution (Debian's
libseccomp2, which systemd, apt and the container runtimes depend on).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno as errno_mod

__all__ = ["SeccompUnavailable", "Rule", "Filter", "build", "syscall_number", "ACT_ALLOW", "act_errno"]

ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_MASKED_EQ = 7
_CMP_NE = 1
_FLTATR_CTL_NNP = 3  # libseccomp sets no_new_privs itself when it loads the filter (its default: on)


def act_errno(code: int) -> int:
    """The action that fails a call with ``code``."""
    return _ACT_ERRNO | (code & 0xFFFF)


class SeccompUnavailable(OSError):
    """libseccomp cannot be loaded, or refused to build or load the filter."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Rule:
    """Fail ``name`` with ``code``: always, or only when argument ``arg`` masked by ``mask`` equals ``mask`` (a flag
    set), or only when argument ``arg`` is not ``value``."""

    __slots__ = ("name", "code", "arg", "mask", "not_value")

    def __init__(self, name: str, code: int, *, arg: int | None = None, mask: int | None = None,
                 not_value: int | None = None) -> None:
        self.name, self.code, self.arg, self.mask, self.not_value = name, code, arg, mask, not_value


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
        except OSError:
            try:
                lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
            except OSError as e:
                raise SeccompUnavailable(errno_mod.ENOENT, f"libseccomp.so.2 cannot be loaded ({e}): install "
                                         "libseccomp2") from None
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCmp)]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        _lib = lib
    return _lib


def syscall_number(name: str) -> int | None:
    """The native architecture's number of ``name``, as libseccomp knows it; None where it has none here."""
    nr = _library().seccomp_syscall_resolve_name(name.encode())
    return nr if nr >= 0 else None


class Filter:
    """A built filter: :meth:`load` installs it on the calling thread (inherited by its children and kept across
    execve); :meth:`export` writes its BPF program to a descriptor (bubblewrap's ``--seccomp FD``)."""

    def __init__(self, ctx: int, skipped: tuple[str, ...]) -> None:
        self._ctx = ctx
        self.skipped = skipped  # names this architecture (or this libseccomp) has no number for

    def load(self) -> None:
        rc = _library().seccomp_load(self._ctx)
        if rc < 0:
            raise SeccompUnavailable(-rc, f"seccomp_load: {errno_mod.errorcode.get(-rc, -rc)}")

    def export(self, fd: int) -> None:
        rc = _library().seccomp_export_bpf(self._ctx, fd)
        if rc < 0:
            raise SeccompUnavailable(-rc, f"seccomp_export_bpf: {errno_mod.errorcode.get(-rc, -rc)}")

    def close(self) -> None:
        if self._ctx:
            _library().seccomp_release(self._ctx)
            self._ctx = 0


def build(rules: list[Rule] | tuple[Rule, ...]) -> Filter:
    """A filter that allows every call but those ``rules`` fail.

    :raises SeccompUnavailable: libseccomp is missing, or refused a rule
    """
    lib = _library()
    ctx = lib.seccomp_init(ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable(errno_mod.ENOMEM, "seccomp_init failed")
    skipped = []
    try:
        lib.seccomp_attr_set(ctx, _FLTATR_CTL_NNP, 1)
        for r in rules:
            nr = syscall_number(r.name)
            if nr is None:
                skipped.append(r.name)
                continue
            if r.mask is not None:
                cmps = (_ArgCmp * 1)(_ArgCmp(r.arg, _CMP_MASKED_EQ, r.mask, r.mask))
                n = 1
            elif r.not_value is not None:
                cmps = (_ArgCmp * 1)(_ArgCmp(r.arg, _CMP_NE, r.not_value, 0))
                n = 1
            else:
                cmps, n = None, 0
            rc = lib.seccomp_rule_add_array(ctx, act_errno(r.code), nr, n, cmps)
            if rc < 0:
                raise SeccompUnavailable(-rc, f"seccomp_rule_add({r.name}): {errno_mod.errorcode.get(-rc, -rc)}")
    except BaseException:
        lib.seccomp_release(ctx)
        raise
    return Filter(ctx, tuple(skipped))
