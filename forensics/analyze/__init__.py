"""core -> snapshot -> analysis: the ``forensics analyze`` library's public surface.

:func:`analyze_core` is the one entry point for a single core (:mod:`.pipeline`);
:func:`forensics.analyze.batch.analyze_many` folds many cores into fingerprints.  The concepts live one per
module: :mod:`.pipeline` (the run), :mod:`.reading` (the open core), :mod:`.choose` (which stacks are shown),
:mod:`.build` (stacks -> snapshot), :mod:`.findings` (snapshot -> ``Analysis``), :mod:`.enrich` (locals and
the heap); :mod:`.stacks`, :mod:`.native`, :mod:`.sigframe`, :mod:`.classify` and :mod:`.fingerprint` one
job each.  What an analysis says in words (its signature, its merged stacks) is :mod:`forensics.views`', below
this package, so that a reader of an analysis's JSON loads none of it.
"""
from __future__ import annotations

from .build import build_snapshot, registers_only
from .classify import is_python_process
from .enrich import with_crashed_locals, with_heap
from .findings import analyze_snapshot, check_nested_faults, check_snapshot, heap_findings
from .pipeline import analyze_core
from .reading import CoreReading

__all__ = ["analyze_core", "build_snapshot", "analyze_snapshot", "check_snapshot",
           "check_nested_faults", "is_python_process", "registers_only",
           "with_heap", "with_crashed_locals", "heap_findings", "CoreReading"]
