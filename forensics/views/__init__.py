"""Views of an analysis: what an ``Analysis`` record says, in the words and orders people read it.

:mod:`.signature` (the one line that says what happened, the exit status explained, a thread named),
:mod:`.names` (a native function's name as people and fingerprints read it: C++ demangled, libc's variants),
:mod:`.frames` (the first fault's frames, the merged native-and-Python stack, the frames past the abort
machinery) and :mod:`.pyframes` (where a Python frame's file lies: the standard library, site-packages, the
program).  They sit beside the records (:mod:`forensics.model`), below the pipeline that builds an analysis
(:mod:`forensics.analyze`) and below every reader of one: a reader of an analysis's JSON (``report``,
``analyze``'s renderers) loads no core reader.
"""
from __future__ import annotations

__all__: list[str] = []
