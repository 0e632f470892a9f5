"""Run a command in a user namespace of its own, where no further user namespace can be made.

    python tests/userns.py [--max-user-namespaces N] -- COMMAND...

A container under a runtime's default seccomp profile cannot make user namespaces (unshare and clone with
CLONE_NEWUSER are refused); ``user.max_user_namespaces=0`` refuses them the same way to every process on the
machine, which other test runs and CI on it rely on (bwrap, unshare). This sets it inside a user namespace of the
command's own, so the refusal reaches the command and its children only (the host's value is untouched): the
namespace maps every uid and gid onto itself (root runs this), so files, ``setresuid`` and ``/proc/PID/status``
read from the host see the same ids; ``user.max_user_namespaces`` is counted per user namespace, and making one
inside is refused with ENOSPC, as with the machine-wide setting.

The parent writes the maps (only a process outside may write a map of more than its own id), forwards SIGTERM,
SIGINT and SIGHUP to the command, and exits with its status.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

CLONE_NEWUSER = 0x10000000
WHOLE = "0 0 4294967295"


def main(argv: list[str]) -> int:
    limit = 0
    if argv[:1] == ["--max-user-namespaces"]:
        limit, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(go_w)
            if libc.unshare(CLONE_NEWUSER) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
            os.write(ready_w, b"1")
            if os.read(go_r, 1) != b"1":
                raise OSError("the parent did not map the namespace")
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write(str(limit))
            os.execvp(argv[0], argv)
        except BaseException as e:  # noqa: BLE001 - the child's one report before it ends
            print(f"userns: {e}", file=sys.stderr)
        os._exit(127)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"1":
        for name, text in (("uid_map", WHOLE), ("setgroups", "allow"), ("gid_map", WHOLE)):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        os.write(go_w, b"1")
    os.close(go_w)
    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):  # ended already (a signal to the whole group reached it)
            os.kill(pid, signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status) % 256
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
