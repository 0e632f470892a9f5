"""The output formats every command shares: the JSON document and a file written new.

Below every package that writes results (analyze, verify-imports, capture, canary,
report): it imports nothing from forensics but the error tree.  ``json_document`` is
the contract of every ``--json`` (``SCHEMA_VERSION`` first-class, keys sorted);
:func:`write_new` never replaces a file unless asked; :func:`escape_text` is the one
definition of text a terminal may be shown (every text line a command prints or writes
goes through it: names, paths and messages come from crashed processes, images and
clusters).
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import re

from .errors import OutputExists, OutputUnwritable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

__all__ = ["SCHEMA_VERSION", "to_jsonable", "json_document", "write_new", "check_output_path", "escape_text",
           "text_lines", "text_document", "STDOUT", "count"]

STDOUT = "-"  # ``-o -``: standard output, as every Unix tool reads it


def count(n: int, one: str, many: str | None = None) -> str:
    """A number and its noun, singular for 1: ``1 pod``, ``2 pods``, ``0 pods``.

    >>> count(1, "scrape"), count(3, "metric family", "metric families"), count(0, "node")
    ('1 scrape', '3 metric families', '0 nodes')
    """
    return f"{n} {one if n == 1 else many or one + 's'}"

SCHEMA_VERSION = 1

# What a terminal acts on or a reader cannot see: C0 and C1 controls, DEL, and every other
# character str.isprintable() refuses (line and paragraph separators, bidirectional overrides,
# zero-width characters, lone surrogates -- bytes that were not UTF-8).
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _escape_one(m: re.Match) -> str:
    c = m.group()
    if c.isprintable():
        return c
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): show the byte
        return f"\\x{o - 0xDC00:02x}"
    if o <= 0xFF:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def escape_text(text: str, keep: str = "") -> str:
    r"""Text that came from a process, an image or a cluster, as one line a terminal shows as it is:
    every character it would act on (ESC, CR, LF, BEL, backspace, C1 controls, bidirectional
    overrides...) written as a Python escape, so a file name cannot rewrite or forge a line.

    :param keep: characters to leave as they are: ``"\n\t"`` for a text that is many lines by
        nature (a log, nvidia-smi's output), never for a name, a path or a command line

    >>> escape_text("evil\x1b]0;title\x07\r\nThread 'MainThread' [FORGED]")
    "evil\\x1b]0;title\\x07\\x0d\\x0aThread 'MainThread' [FORGED]"
    >>> escape_text("caf\u00e9 \u202egnp.exe \udcff")
    'café \\u202egnp.exe \\xff'
    >>> escape_text("line 1\r\nline 2\x1b[2J\n", keep="\n\t")
    'line 1\\x0d\nline 2\\x1b[2J\n'
    """
    if keep:
        return _NOT_PRINTABLE.sub(lambda m: m.group() if m.group() in keep else _escape_one(m), text)
    return _NOT_PRINTABLE.sub(_escape_one, text)


def text_lines(lines: Iterable[str]) -> str:
    r"""Lines as the text a command prints or writes: each one line, every control character in it escaped.
    The output boundary of every text command (stdout and files alike); renderers yield raw lines.

    >>> text_lines(["a\tb", "c\x1b[2J"])
    'a\\x09b\nc\\x1b[2J\n'
    """
    return "".join(escape_text(line) + "\n" for line in lines)


def text_document(text: str) -> str:
    r"""A document that is many lines by nature (a report's Markdown, an attachment: a log, nvidia-smi -q) as
    it is printed or written: its line breaks and tabs kept, every other control character escaped.  The
    output boundary of ``report``: stdout, the report file and its attachments get the same text.

    >>> text_document("GPU\tH20\r\n\x1b[2J")
    'GPU\tH20\\x0d\n\\x1b[2J'
    """
    return escape_text(text, keep="\n\t")


#: the field names of each dataclass :func:`to_jsonable` has met (dataclasses.fields() is slow)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
#: the types that are JSON values as they are (exactly these: a str enum is an enum)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def to_jsonable(obj: Any, *, shared: tuple[type, ...] = ()) -> Any:
    """Dataclasses, enums and paths as plain JSON values (addresses stay integers).

    ``shared``: record types whose instances stand in several places of ``obj`` (the frames of threads stopped
    at the same pcs): each instance, and each tuple, becomes one JSON value, the same object wherever it stands
    -- for a result that is read, never changed in place (serialized, redacted into a new tree, learned from).

    >>> from pathlib import PurePath
    >>> to_jsonable({"path": PurePath("/x"), "n": (1, 2)})
    {'path': '/x', 'n': [1, 2]}
    """
    if shared:
        return _SharingWalk(shared).value(obj)
    t = type(obj)
    if t in _PLAIN:  # most of a document, returned before any other test (and in its container, uncalled)
        return obj
    if t is dict:
        return {k if type(k) is str else str(k): v if type(v) in _PLAIN else to_jsonable(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [v if type(v) in _PLAIN else to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELD_NAMES.get(t)
        if names is None:
            names = _FIELD_NAMES[t] = tuple(f.name for f in dataclasses.fields(obj))
        return {name: v if type(v := getattr(obj, name)) in _PLAIN else to_jsonable(v) for name in names}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, os.PathLike):  # pathlib's paths (not imported here: the analyze command has no use for it)
        return os.fsdecode(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


class _SharingWalk:
    """:func:`to_jsonable` with one JSON value per instance of the ``shared`` types (by identity)."""

    def __init__(self, shared: tuple[type, ...]) -> None:
        self.shared = frozenset(shared)
        self.memo: dict[int, Any] = {}  # id(a shared instance or a tuple) -> its value (the object lives in obj)

    def value(self, obj: Any) -> Any:
        t = type(obj)
        if t in _PLAIN:
            return obj
        if t is dict:
            return {k if type(k) is str else str(k): v if type(v) in _PLAIN else self.value(v) for k, v in obj.items()}
        if t is tuple and obj:  # a tuple of frames threads share: one list
            out = self.memo.get(id(obj))
            if out is None:
                out = self.memo[id(obj)] = [v if type(v) in _PLAIN else self.value(v) for v in obj]
            return out
        if t is list or t is tuple:
            return [v if type(v) in _PLAIN else self.value(v) for v in obj]
        if t in self.shared:
            out = self.memo.get(id(obj))
            if out is None:
                out = self.memo[id(obj)] = to_jsonable(obj)
            return out
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            names = _FIELD_NAMES.get(t)
            if names is None:
                names = _FIELD_NAMES[t] = tuple(f.name for f in dataclasses.fields(obj))
            return {name: v if type(v := getattr(obj, name)) in _PLAIN else self.value(v) for name in names}
        return to_jsonable(obj)  # an enum, a path, a dict or list of another type: nothing shared inside


def json_document(command: str, payload: dict[str, Any], *, redact: bool = True, learn_from: Any = None) -> str:
    """One JSON document: ``schema_version`` and ``command`` first-class, keys sorted; its secrets masked
    (:func:`~forensics.redact.redact_document`: a ``redaction`` member says what was) unless ``redact`` is
    false -- for a document redacted on its own terms (a report) or made only of our own configuration.
    ``learn_from``: evidence the document was made of, not in it (a command line), to learn secrets from."""
    doc = to_jsonable({"schema_version": SCHEMA_VERSION, "command": command, **payload})
    if redact:
        from .redact import redact_document

        doc = redact_document(doc, learn_from=learn_from)
    return json.dumps(doc, sort_keys=True, indent=2)


def check_output_path(path: str, option: str = "--output") -> None:
    """Say before any work is done that ``path`` cannot be written as a new file: its directory is missing
    (nothing is created for it) or not a directory, or it names a directory or a kernel file
    (``/proc/version``).  Whether it may be written is known only by writing (a device or a pipe, such as
    ``/dev/stdout``, is written with ``--force``).

    :raises OutputUnwritable: as above
    """
    import stat

    parent = os.path.dirname(path) or "."
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        raise OutputUnwritable(path, f"the directory {parent} does not exist", option) from None
    except OSError as e:
        raise OutputUnwritable(path, f"{parent}: {_reason(e)}", option) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputUnwritable(path, f"{parent} is not a directory", option)
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputUnwritable(path, "a directory", option)
    if stat.S_ISREG(st.st_mode) and os.path.realpath(path).startswith(("/proc/", "/sys/")):
        raise OutputUnwritable(path, "a file of the kernel's (/proc, /sys), not one to write a result into", option)


def _reason(e: OSError) -> str:
    """``permission denied``: strerror as one of our messages says it."""
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def write_new(path: str, text: str, force: bool, option: str = "--output") -> None:
    """Write a file; without ``force`` never replace an existing one (O_EXCL, no race).

    :raises OutputExists: when ``path`` exists and ``force`` is false
    :raises OutputUnwritable: when it cannot be written (no such directory, permission denied, read-only
        file system, no space left)
    """
    check_output_path(path, option)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError as e:
        raise OutputExists(path, option) from e
    except OSError as e:
        raise OutputUnwritable(path, _reason(e), option) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:  # no space left, a quota: what was written is cut short
        raise OutputUnwritable(path, f"{_reason(e)} (the file is incomplete)", option) from e
