"""forensics analyze: one core or bundle in detail, or many cores folded into distinct crashes."""
from __future__ import annotations

import click

from ..argspec import INPUT
from ..options import FrontDoor, click_argument, click_options, common_of
from .analyze_run import OPTIONS, run

__all__ = ["analyze"]


# the options from analyze_run's table, which the click-free fast path reads too: nothing spelled here
@click.command("analyze", cls=FrontDoor, common=common_of(OPTIONS))
@click_argument(INPUT)
@click_options(OPTIONS)
def analyze(inputs, **options):
    """Analyze a core: signal, abort message, every thread's native and Python stack.

    INPUTS is one core or capture bundle, or several cores / bundles / directories of
    them (a core handler's directory) for batch triage: a table of distinct crashes by
    fingerprint.  An s3://BUCKET/KEY input is a bundle, a core or a prefix of bundles (a
    batch) in a bucket, fetched into the forensics cache first.

    \b
    Exit codes: 0 analysed; 1 error (bad input, see the message; a bundle
    that kept no core); 2 usage; 3 batch with unreadable cores; 4 partial
    result (no native unwinder, no Python stacks, a truncated core, or
    --method / --native-method both found a disagreement; in a batch: any
    core's analysis partial).
    """
    run(inputs, **options)
