"""Text of ``forensics capture``: a process armed (node mode), the core handler installed and uninstalled.

(``capture --pod``'s lines are still made by :mod:`forensics.capture.pod`, and the core's
destination by :func:`forensics.capture.pattern.format_destination`.)
"""
from __future__ import annotations

import os
import shlex
from typing import Any

from ..capture.node import ArmResult
from ..capture.pattern import destination_payload, format_destination

__all__ = ["format_armed", "format_installed", "format_uninstalled", "pattern_owner"]


def format_armed(r: ArmResult) -> list[str]:
    """``capture --pid``: what was armed, where the core will go (and why not), the bundle written."""
    lines = [
        f"process {r.pid} ({r.snapshot.comm}) armed",
        f"RLIMIT_CORE:     {r.rlimit_core_before[0]}/{r.rlimit_core_before[1]} -> "
        f"{r.rlimit_core_after[0]}/{r.rlimit_core_after[1]} (read back from /proc/{r.pid}/limits)",
        f"coredump_filter: {r.coredump_filter_before} -> {r.coredump_filter_after}",
        f"core_pattern:    {r.core_pattern}",
    ]
    lines += format_destination(destination_payload(r.destination))
    ident = r.snapshot.identity
    if ident.container_id:
        lines.append(f"container:       {ident.container_id[:12]} ({ident.runtime or 'runtime ?'}) pod "
                     f"{ident.pod_uid or '-'}")
    if r.snapshot.nvml:
        n = r.snapshot.nvml
        lines.append(f"NVML:            {n.path} (inode {n.inode}, build-id {n.build_id or '?'}, version "
                     f"{n.version or '?'})")
        lines.append(f"                 {n.verdict}")
    lines.append(f"Wrote {r.bundle}")
    return lines


def format_installed(r: dict[str, Any]) -> list[str]:
    """``capture --install-handler``: the pattern set, the one it replaced (whose it was), where that is recorded
    and how it comes back.

    >>> format_installed({"pattern": "|/f core-handler", "state": "/c/handler.json",
    ...                   "previous": "|/lib/systemd/systemd-coredump %P %u"})[1]
    'previous:     |/lib/systemd/systemd-coredump %P %u (systemd-coredump)'
    """
    core_dir = shlex.quote(os.path.dirname(r["state"]))
    return [f"core_pattern: {r['pattern']}", f"previous:     {r['previous']} ({pattern_owner(r['previous'])})",
            f"recorded in:  {r['state']}", f"restore it:   forensics capture --uninstall-handler --core-dir {core_dir}"]


def pattern_owner(pattern: str) -> str:
    """Whose a core_pattern is, in a few words: the program it pipes to, or where it writes files.

    >>> pattern_owner("|/usr/share/apport/apport -p%p -s%s"), pattern_owner("core")
    ('apport', "core files named 'core', in the crashing process's directory")
    """
    if pattern.startswith("|"):
        program = pattern[1:].split()[0] if pattern[1:].split() else ""
        return os.path.basename(program) or "a pipe to no program"
    if "/" in pattern:
        return f"core files written to {pattern!r}"
    return f"core files named {pattern!r}, in the crashing process's directory"


def format_uninstalled(r: dict[str, Any]) -> list[str]:
    """``capture --uninstall-handler``: the pattern restored."""
    return [f"core_pattern restored: {r['restored']}"]
