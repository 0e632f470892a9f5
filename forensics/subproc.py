"""Run another program and read what it writes, bounded in time and in bytes.

``subprocess.run(capture_output=True)`` keeps everything a program writes until it exits: an image's
interpreter (verify-imports' probe runs the image's own code), a kubectl answering for a cluster, or a
tool stuck in a loop can fill this process's memory before the timeout comes.  :func:`run_bounded`
reads both pipes as the program writes them: standard output whole up to ``max_stdout`` (past it the
program's process group is killed and :class:`OutputTooLarge` raised: a cut answer is no answer), the
last ``max_stderr`` bytes of standard error (the tail is what says why), and it gives up ``timeout``
seconds after the start, killing the group (:class:`subprocess.TimeoutExpired`, as ``subprocess.run``
raises it, with what was read so far).  A program stuck in the kernel that even SIGKILL does not stop is
not waited for past two more seconds.
"""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO

__all__ = ["OutputTooLarge", "run_bounded", "kill_children", "DEFAULT_MAX_STDOUT", "DEFAULT_MAX_STDERR"]

DEFAULT_MAX_STDOUT = 64 << 20
DEFAULT_MAX_STDERR = 1 << 20
_CHUNK = 1 << 16


class OutputTooLarge(subprocess.SubprocessError):
    """The program wrote more than ``limit`` bytes on standard output (it was killed)."""

    def __init__(self, cmd: list[str], limit: int) -> None:
        size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"
        super().__init__(f"{os.path.basename(cmd[0])} wrote more than {size} (stopped)")
        self.cmd = cmd
        self.limit = limit


def _kill_group(proc: subprocess.Popen) -> None:
    try:  # its own session: the whole group, so no child keeps a pipe open
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: not waited for past 2 s
        proc.wait(timeout=2)


def _feed(proc: subprocess.Popen, sel: selectors.BaseSelector, pending: memoryview) -> memoryview:
    """What is left of standard input after one write that does not block; at its end, stdin closed."""
    assert proc.stdin is not None
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[:_CHUNK]):]
    except BlockingIOError:
        return pending
    except BrokenPipeError:  # it stopped reading: the rest is not wanted
        pending = pending[:0]
    if not pending:
        sel.unregister(proc.stdin)
        proc.stdin.close()
    return pending


def _take(data: bytes, out: bytearray, sink: BinaryIO | None, taken: int, limit: int) -> int:
    """Standard output as it is read: copied to ``sink`` (the caller's file), else kept in ``out``; the bytes
    read so far (a chunk that passes ``limit`` is neither written nor kept)."""
    taken += len(data)
    if taken > limit:
        return taken
    if sink is None:
        out += data
    else:
        sink.write(data)
    return taken


def _keep_tail(err: bytearray, data: bytes, most: int) -> None:
    err += data
    if len(err) > 2 * most:  # the tail kept, trimmed now and then
        del err[:-most]


def run_bounded(cmd: list[str], *, timeout: float, input: str | None = None, env: dict[str, str] | None = None,
                cwd: str | None = None, max_stdout: int = DEFAULT_MAX_STDOUT, max_stderr: int = DEFAULT_MAX_STDERR,
                stdout: BinaryIO | None = None,
                preexec_fn: Callable[[], None] | None = None,
                pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``cmd``'s exit status, standard output and the tail of its standard error, as text (undecodable bytes
    replaced).  Standard input is ``input`` or nothing (/dev/null).  With ``stdout`` (a file of the caller's)
    the program's standard output is copied there as it comes, within the same ``max_stdout`` (the result's
    ``stdout`` is empty).  The program runs in a session of its own (``preexec_fn`` runs after that, in the
    child, as :class:`subprocess.Popen`'s); ``pass_fds`` stay open in it.

    :raises OSError: the program could not be started
    :raises subprocess.TimeoutExpired: it ran past ``timeout`` seconds (killed); ``output`` holds what it wrote
    :raises OutputTooLarge: its standard output passed ``max_stdout`` bytes (killed)
    """
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd, start_new_session=True, preexec_fn=preexec_fn, pass_fds=pass_fds)
    out = bytearray()
    taken = 0  # bytes of standard output read
    err = bytearray()
    pending = memoryview(input.encode()) if input is not None else None
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        if proc.stdout is not None:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE, None)
        try:
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    _kill_group(proc)
                    raise subprocess.TimeoutExpired(cmd, timeout, output=out.decode(errors="replace"),
                                                    stderr=err.decode(errors="replace"))
                for key, _ in sel.select(min(left, 1.0)):
                    if key.data is None:  # standard input
                        assert pending is not None
                        pending = _feed(proc, sel, pending)
                        continue
                    data = os.read(key.fd, _CHUNK)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    if key.data is err:
                        _keep_tail(err, data, max_stderr)
                    elif (taken := _take(data, out, stdout, taken, max_stdout)) > max_stdout:
                        _kill_group(proc)
                        raise OutputTooLarge(cmd, max_stdout)
        except BaseException:  # Ctrl-C, SIGTERM (Terminated): its session gets neither from us or the terminal
            _kill_group(proc)
            raise
        finally:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()
    try:
        code = proc.wait(timeout=max(deadline - time.monotonic(), 0) + 2)
    except subprocess.TimeoutExpired:  # closed its pipes but did not exit
        _kill_group(proc)
        raise subprocess.TimeoutExpired(cmd, timeout, output=out.decode(errors="replace")) from None
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, code, out.decode(errors="replace"),
                                       err[-max_stderr:].decode(errors="replace"))


def kill_children(grace: float = 2.0) -> list[int]:
    """Kill every child of this process -- with the process group it leads, when it leads one of its own (a
    program started in a session of its own) -- and reap them: what an interrupted command started does not
    outlive it with parent 1, whichever ``finally`` the signal came too early or too late for (between fork
    and ``Popen`` returning).  A child stuck in the kernel is not waited for past ``grace`` seconds.

    :return: the PIDs killed
    """
    me, my_group = os.getpid(), os.getpgid(0)
    killed = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read(4096)
        except OSError:
            continue
        rest = data[data.rfind(b")") + 1:].split()
        if len(rest) < 3 or not rest[1].isdigit() or int(rest[1]) != me:
            continue
        pid, group = int(name), int(rest[2])
        with contextlib.suppress(OSError):
            if group == pid and group != my_group:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    deadline = time.monotonic() + grace
    left = set(killed)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    left.discard(pid)
            except ChildProcessError:
                left.discard(pid)
        if left:
            time.sleep(0.01)
    return killed
