"""The output formats every command shares: the JSON document and a file written new.

Below every package that writes results (analyze, verify-imports, capture, canary,
report): it imports nothing from forensics but the error tree.  ``json_document`` is
the contract of every ``--json`` (``SCHEMA_VERSION`` first-class, keys sorted);
:func:`write_new` never replaces a file unless asked.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import PurePath
from typing import Any

from .errors import OutputExists

__all__ = ["SCHEMA_VERSION", "to_jsonable", "json_document", "write_new", "escape_text"]

SCHEMA_VERSION = 1


def escape_text(text: str) -> str:
    r"""Text that came from a process or an image, with its control characters escaped (``\x1b``), for a
    terminal: an ESC sequence or a CR/LF inside a file name cannot rewrite or forge a line.

    >>> escape_text("/app/\x1b]0;pwned\x07nvitop\r\n[FORGED]")
    '/app/\\x1b]0;pwned\\x07nvitop\\x0d\\x0a[FORGED]'
    """
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums and paths as plain JSON values (addresses stay integers).

    >>> to_jsonable({"path": PurePath("/x"), "n": (1, 2)})
    {'path': '/x', 'n': [1, 2]}
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


def json_document(command: str, payload: dict[str, Any]) -> str:
    """One JSON document: ``schema_version`` and ``command`` first-class, keys sorted."""
    doc = {"schema_version": SCHEMA_VERSION, "command": command, **payload}
    return json.dumps(to_jsonable(doc), sort_keys=True, indent=2)


def write_new(path: str, text: str, force: bool) -> None:
    """Write a file; without ``force`` never replace an existing one (O_EXCL, no race).

    :raises OutputExists: when ``path`` exists and ``force`` is false
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError as e:
        raise OutputExists(path) from e
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
