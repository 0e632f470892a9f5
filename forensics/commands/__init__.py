"""The commands of the ``forensics`` group, one module each, loaded when named.

:mod:`forensics.cli` holds the group, its one error handler and the table of command
names to modules; each module here defines ``command`` and imports what its work needs
inside the command body, so ``forensics --help`` loads no analysis code.  With the group,
these modules are the only ones that echo, prompt or exit, and they print only through
:func:`emit` (text lines), :func:`emit_json` (one document), :func:`echo` and :func:`warn`:
text has its control characters escaped there, whatever produced it (a thread name, an
image's file name, a pod name -- what a crashed container or a cluster user controls).
"""
from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from ..errors import ForensicsError
from ..output import escape_text, text_document, text_lines, write_new

__all__ = ["emit", "emit_document", "emit_json", "echo", "warn", "read_json_object"]


def emit(lines: Iterable[str], output: str | None, force: bool) -> None:
    """Print text ``lines`` to stdout, or write them to ``output`` (new unless ``force``) and say so on
    stderr.  Each line is one line: a CR, LF, ESC or other control character inside it is escaped, here
    and only here (:func:`~forensics.output.text_lines`; renderers yield raw lines)."""
    _write(text_lines(lines), output, force)


def emit_document(text: str, output: str | None, force: bool) -> None:
    """Print a document that is many lines by nature (a report's Markdown), or write it to ``output``:
    its line breaks and tabs kept, every other control character escaped -- the same text a file of it
    gets (:func:`~forensics.output.text_document`)."""
    _write(text_document(text), output, force)


def emit_json(document: str, output: str | None, force: bool) -> None:
    """Print one JSON document (:func:`~forensics.output.json_document`, which escapes every control
    character in its strings) or write it to ``output``."""
    _write(document + "\n", output, force)


def _write(text: str, output: str | None, force: bool) -> None:
    if output is None:
        _echo(text, err=False)
        return
    write_new(output, text, force)
    echo(f"Wrote {output}", err=True)


def echo(message: str = "", err: bool = False) -> None:
    """One line to stdout (or stderr), its control characters escaped."""
    _echo(escape_text(message) + "\n", err=err)


def _echo(text: str, *, err: bool) -> None:
    """``text`` written and flushed, as ``click.echo(text, nl=False)`` writes it -- without importing click
    (a start-up cost of every command) where the stream is one click writes to as it is: a text stream
    of an encoding other than ASCII.  The text has no ANSI sequence left for click to strip (every
    control character is escaped before it gets here)."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    encoding = getattr(stream, "encoding", None)
    if not encoding or _is_ascii(encoding) or not hasattr(stream, "buffer"):
        import click  # click re-wraps such a stream (UTF-8, errors replaced): let it

        click.echo(text, nl=False, err=err)
        return
    stream.write(text)
    stream.flush()


def _is_ascii(encoding: str) -> bool:
    import codecs

    try:
        return codecs.lookup(encoding).name == "ascii"
    except LookupError:
        return True


def warn(message: str) -> None:
    """``forensics: warning: MESSAGE`` on stderr, one line."""
    echo(f"forensics: warning: {message}", err=True)


def read_json_object(path: str) -> dict:
    """A JSON object from a file the user named (a saved ``kubectl ... -o json``, a ``--json`` output).

    :raises ForensicsError: when it cannot be read, is not JSON, or is not an object
    """
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ForensicsError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ForensicsError(f"{path}: expected a JSON object")
    return doc
