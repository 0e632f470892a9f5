"""``report --check``'s pass over what a written report would leak: a secret (by :class:`~forensics.redact.Redactor`'s
rules) or a raw control character (C0 but tab and line ends, DEL, C1, the bidirectional controls; an escape
sequence named: an OSC 8 hyperlink, an erase-line) in the report file or any attachment its front matter lists.

A report is edited by hand between ``report -o`` and its filing, and its attachments are files anyone can replace:
each finding is one problem, naming the file and the line.  An attachment is read inside the report's
directory only (:func:`forensics.rootpath.read_in_root`), at most :data:`MAX_ATTACHMENT` bytes.
"""
from __future__ import annotations

import re
from pathlib import Path

from .. import rootpath
from ..redact import MASK, Redactor

__all__ = ["check_leaks", "check_text_leaks", "MAX_ATTACHMENT"]

MAX_ATTACHMENT = 64 << 20  # bytes of one attachment read
MAX_FINDINGS = 200  # problems said a file (the rest counted in one more)
#: C0 but tab, line feed and carriage return; DEL; C1; the bidirectional embeddings, overrides, isolates and marks
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_OSC8 = re.compile("\x1b\\]8;")
_ERASE = re.compile("\x1b\\[[0-9;]*[JK]")


def _control_name(line: str, c: str) -> str:
    if c == "\x1b":
        if _OSC8.search(line):
            return "an escape sequence (an OSC 8 hyperlink: a link whose text says another address)"
        if _ERASE.search(line):
            return "an escape sequence (erase-line: it hides what is before it on a terminal)"
        return "an escape sequence (ESC)"
    if "\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069" or c in "\u061c\u200e\u200f":
        return f"a bidirectional control (U+{ord(c):04X}: text shown in another order than it is read)"
    return f"a raw control character (U+{ord(c):04X})"


def check_text_leaks(name: str, text: str) -> list[str]:
    """The secrets and raw control characters of ``text`` (the file ``name``), one problem a line and kind.

    >>> check_text_leaks("r.md", "ok\\nurl: https://bob:hunter2x@db/x\\n\\x1b[2Kdone")
    ['r.md:2: a secret (passwords in URLs)', 'r.md:3: an escape sequence (erase-line: it hides what is before it on a \
terminal)']
    """
    r = Redactor()
    out: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _CONTROL.search(line.rstrip("\r"))
        if m is not None:
            out.append(f"{name}:{n}: {_control_name(line, m.group(0))}")
        before = dict(r.counts)
        if r.text(line) != line:
            kinds = sorted(k for k, v in r.counts.items() if v != before.get(k, 0))
            out.append(f"{name}:{n}: a secret ({', '.join(kinds)})")
    if len(out) > MAX_FINDINGS:
        out = out[:MAX_FINDINGS] + [f"{name}: {len(out) - MAX_FINDINGS} more findings"]
    return out


def check_leaks(path: str, text: str, attachments: tuple[str, ...] | list[str]) -> list[str]:
    """:func:`check_text_leaks` over the report file ``path`` (its ``text``) and each attachment it lists (a path
    relative to the report's directory, read inside it); an attachment that cannot be read there is not this
    pass's to say (the check of attachments says a missing one).

    A value already masked (``[REDACTED]``) is no finding: ``report`` masks what it writes.
    """
    problems = check_text_leaks(Path(path).name, text)
    base = str(Path(path).parent)
    for a in attachments:
        try:
            data = rootpath.read_in_root(base, a, MAX_ATTACHMENT + 1)
        except OSError:
            continue
        if len(data) > MAX_ATTACHMENT:
            problems.append(f"{a}: over {MAX_ATTACHMENT:,} bytes: not checked for secrets and control characters")
            continue
        problems += check_text_leaks(a, data.decode("utf-8", "replace"))
    return [p for p in problems if MASK not in p]
