"""The fuzz target for the core reader (tests/fuzz_cores.py): seeded mutants of real kernel cores, each analysed
by the real command line through the harness the image fuzz shares (tests/fuzzing.py)."""
from __future__ import annotations

import time

from tests.fuzzing import fuzz_count, fuzz_seed, run_target
from tests.fuzz_cores import SEED_SCENARIOS


def test_fuzz_the_core_reader(cores, newest_python, tmp_path):
    """A few hundred mutants (FORENSICS_FUZZ_COUNT=N for more, FORENSICS_FUZZ_SEED=S for others): a result, a
    partial result or a clear one-line error each, within its time and memory bounds, with no control character
    on the terminal and nothing written but its -o file -- without gdb, and with gdb on every 20th."""
    # GIVEN real cores: a heap corruption, a SIGSEGV whose C crash reporter faults again, a Python-level abort
    seeds = [str(cores.get(newest_python, scenario, handler=handler)) for scenario, handler in SEED_SCENARIOS]
    count, seed = fuzz_count(), fuzz_seed()
    args = ["--count", str(count), "--seed", str(seed)] + [a for c in seeds for a in ("--core", c)]
    t = time.monotonic()
    # WHEN the fuzz target runs in a child under RLIMIT_AS, with a TMPDIR and a working directory that must stay
    # empty (THEN: run_target asserts no violation, nothing left behind, the sentinel untouched, memory bounded)
    summary = run_target("tests/fuzz_cores.py", args, tmp_path, count=count, timeout=max(900, count * 6))
    # every kind of outcome was reached: the mutants are not all refused at the header, nor all harmless
    assert {"ok", "partial", "error"} <= set(summary["summary"]), summary
    print(f"fuzz: {count} mutants, {summary['runs']} runs in {time.monotonic() - t:.0f}s: {summary['summary']}; "
          f"peak {summary['max_rss_mb']} MiB, slowest {summary['slowest']}")
