"""``forensics agent keep``: the node agent's one privileged process, and everything it does.

The DaemonSet's pod splits the node side by privilege (docs/security.md, "The node agent's privilege split").
This module is the privileged part, the ``keeper`` container: it points ``kernel.core_pattern`` at the core
handler when the pod starts (the previous pattern recorded in ``CORE_DIR/handler.json``, as ``capture
--install-handler`` does), and writes the previous pattern back when the pod stops: SIGTERM, which the kubelet
sends on ``helm uninstall``, on a deleted DaemonSet, a rolling update, an evicted or drained pod and a node's
graceful shutdown. A removed agent never leaves the kernel piping cores to a handler nobody serves.

It parses nothing a crash controls: its only input is its own ``handler.json``. The untrusted bytes (cores, the
crashed process's memory and files) are read by the kernel-run handler, which bounds and names them, and by the
analyses ``agent serve`` runs in a sandbox (:mod:`forensics.sandbox`), both outside this process.
"""
from __future__ import annotations

import signal
import threading

from .pattern import install_handler, read_core_pattern, uninstall_handler

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["keep"]


def keep(core_dir: str, *, config: dict | None = None, proc: str = "/proc", stop: threading.Event | None = None,
         say: Callable[[str], None] = print) -> dict:
    """Install the handler, wait for SIGTERM / SIGINT (or ``stop``), then restore the pattern recorded at install.

    The previous pattern is written back only while the handler's is still the kernel's: a pattern another
    program set since (systemd-coredump's sysctl.d file applied again) is theirs and stays.

    :param config: the handler's disk bounds (``max_core_size``, ``budget``, ``min_free``, ``loop_limit``)
    :return: ``{"installed": ..., "restored": pattern or None, "left": the pattern left when not ours}``
    :raises NotRoot: when not root
    :raises CoreDirectoryError: when the directory cannot be made or its state written
    """
    stop = stop or threading.Event()
    # the handlers first: a SIGTERM during the install must still restore what the install replaced
    previous_handlers = {s: signal.signal(s, lambda signum, frame: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        installed = install_handler(core_dir, config=config, proc=proc)
        say(f"forensics agent keep: kernel.core_pattern is {installed['pattern']} (was {installed['previous']!r}, "
            f"recorded in {installed['state']}); restored when this pod stops")
        while not stop.wait(3600):
            pass
        return {"installed": installed["pattern"], **_restore(core_dir, installed["pattern"], proc=proc, say=say)}
    finally:
        for s, h in previous_handlers.items():
            signal.signal(s, h)


def _restore(core_dir: str, ours: str, *, proc: str = "/proc", say: Callable[[str], None] = print) -> dict:
    """Write back the pattern recorded at install when ``ours`` is still the kernel's; else leave it."""
    current = read_core_pattern(proc).strip()
    if current != ours.strip():
        say(f"forensics agent keep: kernel.core_pattern is {current!r}, set by another program since: left as it is")
        return {"restored": None, "left": current}
    r = uninstall_handler(core_dir, proc=proc)
    say(f"forensics agent keep: kernel.core_pattern restored to {r['restored']!r}")
    return {"restored": r["restored"], "left": None}
