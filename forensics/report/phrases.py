"""The crash in the few words a title and the reports' prose share: the process by name, how it failed, the
failing call and its query, one line of plain text (:func:`plain`)."""
from __future__ import annotations

import re

from .facts import Facts

__all__ = ["TITLE_MAX", "plain", "process_name", "failure", "failing_call", "query_words", "failure_line",
           "where_it_failed"]

TITLE_MAX = 256  # GitHub's limit for an issue title


def plain(s: str) -> str:
    """One line of plain text: control characters and newlines out, Markdown heading marks off the front."""
    s = re.sub(r"[\x00-\x1f\x7f]+", " ", s)
    s = re.sub(r"\s+", " ", s).strip()
    return s.lstrip("#").strip()[:TITLE_MAX]


def process_name(f: Facts) -> str:
    """``nvitop-exporter 1.5.0``, ``nvitop``, the executable's name, else "the process"."""
    cmd = f.process or ""
    if "nvitop_exporter" in cmd or "nvitop-exporter" in cmd:
        return f"nvitop-exporter {f.exporter}" if f.exporter else "nvitop-exporter"
    if "nvitop" in cmd:
        return f"nvitop {f.nvitop}" if f.nvitop else "nvitop"
    exe = cmd.split()[0].rsplit("/", 1)[-1] if cmd else ""
    return exe or "the process"


def failure(f: Facts) -> str:
    """How the process failed, as a verb phrase: ``aborts with heap corruption ("...")``, ``crashes with SIGSEGV``."""
    if f.kind == "snapshot":
        return "did not crash (a snapshot of the live process)"
    if f.kind == "heap-corruption" and f.abort_message:
        return f'aborts with heap corruption ("{f.abort_message}")'
    if f.abort_message:
        return f'aborts ("{f.abort_message}")'
    if f.signal:
        return f"crashes with {f.signal}"
    return "crashes"


def failing_call(f: Facts) -> str:
    """The NVML entry point on the crashing stack, else its first Python caller, else "an NVML call"."""
    return f.api or (f"{f.caller}()" if f.caller else "an NVML call")


def query_words(f: Facts) -> str:
    """`` (NVLink throughput, fields 138/139)``: what the failing query asked for ("" when that is not known)."""
    if not (f.query and f.query.what):
        return ""
    return f" ({f.query.what}" + (f", fields {'/'.join(map(str, f.query.fields))}" if f.query.fields else "") + ")"


def failure_line(f: Facts) -> str:
    """The process and how it failed, or that no crash was observed."""
    if f.has_crash or f.kind == "snapshot":
        return f"{process_name(f)} {failure(f)}"
    return f"{process_name(f)}: no crash observed"


def where_it_failed(f: Facts) -> str:
    """`` in nvmlDeviceGetFieldValues`` for a crash in a known call ("" otherwise)."""
    return f" in {failing_call(f)}" if f.has_crash and (f.api or f.caller) else ""
