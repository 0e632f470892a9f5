"""The commands of the ``forensics`` group, one module each, loaded when named.

:mod:`forensics.cli` holds the group, its one error handler and the table of command
names to modules; each module here defines ``command`` and imports what its work needs
inside the command body, so ``forensics --help`` loads no analysis code.  With the group,
these modules are the only ones that echo, prompt or exit.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import click

from ..errors import ForensicsError
from ..output import write_new

__all__ = ["emit", "read_json_object"]


def emit(lines: Iterable[str], output: str | None, force: bool) -> None:
    """Print ``lines`` to stdout, or write them to ``output`` (new unless ``force``) and say so on stderr."""
    text = "\n".join(lines) + "\n"
    if output is None:
        click.echo(text, nl=False)
        return
    write_new(output, text, force)
    click.echo(f"Wrote {output}", err=True)


def read_json_object(path: str) -> dict[str, Any]:
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
