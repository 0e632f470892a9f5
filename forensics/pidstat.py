"""Who a PID is, from ``/proc/PID/stat``: its name, whether it is a kernel thread, and when it started.

Below every command that reads a live process (``capture --pid``, ``verify-imports --pid``):
it imports nothing from forensics but the error tree.  The start time (field 22, in clock ticks
since boot) tells the process that was read from one that exited meanwhile, or a new one that
got its PID: :func:`check_still_running` turns that into one error, not verdicts about a root
that vanished while it was read.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import KernelThread, ProcessExited

__all__ = ["PidStat", "parse_pid_stat", "read_pid_stat", "check_user_process", "check_still_running"]

_PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
_PF_EXITING = 0x00000004  # set as exit begins: its files, root and memory go before it is a zombie


@dataclass(frozen=True, slots=True, kw_only=True)
class PidStat:
    pid: int
    comm: str
    state: str
    flags: int
    start_time: int  # clock ticks after boot

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & _PF_KTHREAD)

    @property
    def exiting(self) -> bool:
        """Exited, or exiting (a zombie, or past the start of exit(2): its root may already be gone)."""
        return self.state in ("Z", "X", "x") or bool(self.flags & _PF_EXITING)


def parse_pid_stat(pid: int, data: bytes) -> PidStat | None:
    """``/proc/PID/stat``'s text as a record (None when it does not parse).  The name may hold spaces and
    parentheses: it runs from the first ``(`` to the last ``)``.

    >>> parse_pid_stat(2, b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0").kernel_thread
    True
    >>> parse_pid_stat(7, b"7 (a) b) R 1 7 7 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0").comm
    'a) b'
    """
    open_, close = data.find(b"("), data.rfind(b")")
    rest = data[close + 1:].split()
    if open_ < 0 or close < open_ or len(rest) < 20 or not rest[6].isdigit() or not rest[19].isdigit():
        return None
    return PidStat(pid=pid, comm=data[open_ + 1:close].decode(errors="replace"), state=rest[0].decode(errors="replace"),
                   flags=int(rest[6]), start_time=int(rest[19]))


def read_pid_stat(pid: int) -> PidStat | None:
    """The record of a running process, None when there is none (one that has exited or is exiting counts as
    gone: a zombie, or one whose exit has begun)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = parse_pid_stat(pid, f.read(4096))
    except OSError:
        return None
    return None if st is None or st.exiting else st


def check_user_process(pid: int) -> PidStat | None:
    """The process's record, checked to be a user process.

    :raises KernelThread: when ``pid`` is a kernel thread (kthreadd, a kworker)
    """
    st = read_pid_stat(pid)
    if st is not None and st.kernel_thread:
        raise KernelThread(pid, st.comm)
    return st


def check_still_running(before: PidStat | None, during: str) -> None:
    """:raises ProcessExited: when the process ``before`` describes has exited (or its PID is another's now)"""
    if before is None:
        return
    now = read_pid_stat(before.pid)
    if now is None or now.start_time != before.start_time:
        raise ProcessExited(before.pid, during)
