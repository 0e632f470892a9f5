"""Plain text for people: every command's text output, rendered in one place, one module per command.

Renderers yield lines and never print: the commands print them through
:func:`forensics.commands.emit`, which escapes every line with :func:`forensics.output.escape_text`
(thread names, argv, file paths, pod names come from what a crashed process, an image or a cluster
user controls).  The JSON of every ``--json`` is :mod:`forensics.output`'s; reports' Markdown is
:mod:`forensics.report`'s.
"""
from __future__ import annotations

__all__: list[str] = []
