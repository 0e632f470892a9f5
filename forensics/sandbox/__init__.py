"""How a parser of untrusted bytes runs: one place, every caller.

A core, a capture bundle or an image is somebody else's bytes, and the readers of them (libdw, gdb, our ELF, DWARF
and CPython readers) are large. Whoever runs one on such bytes with privilege -- ``agent serve`` on every node,
``analyze --sandbox`` for a user analyzing someone else's core as root -- runs it through the wrapper this package
is (``python -m forensics.sandbox [POLICY] -- COMMAND``), which confines itself and then execs the command:

1. the uid and gid (``--uid``/``--gid``): ``setgroups([])``, ``setresgid``, ``setresuid``; all three ids, so no
   capability stays (the caller keeps only CAP_SETUID and CAP_SETGID for this), and a ``setuid(0)`` that succeeds
   afterwards aborts it;
2. no_new_privs: nothing it execs gains privilege (set-user-ID files, file capabilities);
3. Landlock (:mod:`.landlock`): no write to the filesystem but beneath ``--write`` directories and into
   ``/dev/null``, no TCP bind or connect, no signal to (nor abstract socket of) a process outside the sandbox;
   left out, and said by :func:`landlock_abi`, on a kernel without it;
4. seccomp (:mod:`.seccomp`, the filter libseccomp builds): every call of :data:`DENIED` fails with its errno;
   sockets of any family but AF_UNIX unless ``--network``.

What it reads is left to file permissions (the uid it drops to reads what the world may, and the crash's files
through their group) and to the mounts it sees (a container's, or bubblewrap's for ``analyze --sandbox``).
docs/security.md says what this protects and what it does not.
"""
from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass

__all__ = ["Denied", "DENIED", "DEFAULT_UID", "Policy", "wrapper_argv", "confine", "ConfineError", "landlock_abi",
           "seccomp_rules"]

#: the uid and gid an on-node analysis drops to: no account on a node's host (distroless images' "nonroot")
DEFAULT_UID = 65532


@dataclass(frozen=True, slots=True, kw_only=True)
class Denied:
    """Calls the sandbox fails, with the errno they get and why a parser never needs them."""

    names: tuple[str, ...]
    errno: int
    why: str
    arg: int | None = None  # with ``flags``: only calls whose argument ``arg`` has one of these bits
    flags: tuple[int, ...] = ()


_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)  # NS CGROUP UTS
# IPC USER PID NET (CLONE_NEWTIME, 0x80, is clone's exit-signal byte: only unshare and clone3 take it)

#: the deny list (docs/security.md prints it): every call here fails with its errno inside the sandbox
DENIED: tuple[Denied, ...] = (
    Denied(names=("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd"),
           errno=errno.EPERM, why="another process's memory, descriptors or execution"),
    Denied(names=("mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
                  "fsmount", "fspick", "mount_setattr"), errno=errno.EPERM, why="the filesystem's layout"),
    Denied(names=("unshare", "setns"), errno=errno.EPERM, why="namespaces: a user namespace is the usual first step "
           "from a parser's bug to the kernel's attack surface"),
    Denied(names=("clone",), errno=errno.EPERM, why="a thread or a process, yes; one in new namespaces, no",
           arg=0, flags=_CLONE_NEW),
    Denied(names=("clone3",), errno=errno.ENOSYS, why="its flags lie in memory a filter cannot read: ENOSYS makes "
           "glibc (pthread_create, posix_spawn) fall back to clone, whose flags the filter reads"),
    Denied(names=("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"),
           errno=errno.EPERM, why="kernel interfaces with a history of exploits; io_uring's calls bypass this filter"),
    Denied(names=("keyctl", "add_key", "request_key"), errno=errno.EPERM, why="the kernel's keyrings"),
    Denied(names=("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
                  "swapon", "swapoff", "acct", "iopl", "ioperm", "quotactl", "syslog", "settimeofday",
                  "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
                  "open_by_handle_at", "name_to_handle_at", "fanotify_init"),
           errno=errno.EPERM, why="the machine's administration: modules, reboot, clocks, names, handles"),
)
_AF_UNIX = 1


def seccomp_rules(*, network: bool = False):
    """The rules of :data:`DENIED`, and without ``network`` the sockets of any family but AF_UNIX."""
    from .seccomp import Rule

    rules = []
    for d in DENIED:
        for name in d.names:
            if d.flags:
                rules += [Rule(name, d.errno, arg=d.arg, mask=bit) for bit in d.flags]
            else:
                rules.append(Rule(name, d.errno))
    if not network:
        rules += [Rule(name, errno.EPERM, arg=0, not_value=_AF_UNIX) for name in ("socket", "socketpair")]
    return rules


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What a sandboxed command may do beyond reading what its ids may read."""

    uid: int | None = None  # drop to it (and to ``gid``); None: keep the ids (bubblewrap's user namespace maps them)
    gid: int | None = None
    writable: tuple[str, ...] = ()  # directories it may write beneath (its output)
    scratch: str | None = None  # a directory made (mode 700) once the ids are dropped, and writable: its own
    network: bool = False  # sockets of every family (a fetcher, never a parser)

    def args(self) -> list[str]:
        out = []
        if self.uid is not None:
            out += ["--uid", str(self.uid), "--gid", str(self.uid if self.gid is None else self.gid)]
        for w in self.writable:
            out += ["--write", w]
        if self.scratch is not None:
            out += ["--scratch", self.scratch]
        return [*out, *(["--network"] if self.network else [])]


def wrapper_argv(policy: Policy, argv: list[str], *, python: str | None = None) -> list[str]:
    """The command line that runs ``argv`` confined by ``policy`` (this package's ``__main__``)."""
    return [python or sys.executable, "-m", "forensics.sandbox", *policy.args(), "--", *argv]


def landlock_abi() -> int:
    """The Landlock ABI the sandbox applies on this kernel (0: none: writes are bounded by file permissions only)."""
    from .landlock import abi_version

    return abi_version()


class ConfineError(Exception):
    """The sandbox could not be set up: the command is not run."""


def confine(policy: Policy) -> dict:
    """Confine the calling process (it is about to exec what it runs): ids, no_new_privs, Landlock, seccomp.

    :return: what was applied: ``{"uid", "gid", "landlock": ABI or 0, "seccomp": True, "skipped": [...]}``
    :raises ConfineError: any step failed (nothing may then run)
    """
    from .landlock import restrict
    from .seccomp import SeccompUnavailable, build

    try:
        rules = seccomp_rules(network=policy.network)
        filt = build(rules)  # before the ids change: the library loads as whoever runs this
    except SeccompUnavailable as e:
        raise ConfineError(f"seccomp: {e.strerror or e}") from e
    try:
        if policy.uid is not None:
            gid = policy.uid if policy.gid is None else policy.gid
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(policy.uid, policy.uid, policy.uid)
            if policy.uid != 0:
                try:
                    os.setuid(0)
                except PermissionError:
                    pass
                else:
                    raise ConfineError("uid 0 could be taken back after the drop")
        writable = policy.writable
        if policy.scratch is not None:  # made by the ids it runs as: only they may write it
            os.mkdir(policy.scratch, 0o700)
            writable = (*writable, policy.scratch)
        _set_no_new_privs()
        abi = restrict(writable, network=policy.network)
        filt.load()
    except OSError as e:
        raise ConfineError(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")) from e
    finally:
        filt.close()
    return {"uid": os.getuid(), "gid": os.getgid(), "landlock": abi, "seccomp": True, "skipped": list(filt.skipped)}


def _set_no_new_privs() -> None:
    import ctypes

    pr_set_no_new_privs = 38
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
