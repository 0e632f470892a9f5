"""Text of ``forensics reproduce``: the NVML seen, one block per reproducer run, the conclusion."""
from __future__ import annotations

from ..reproduce import ReproduceResult

__all__ = ["format_reproduce"]


def format_reproduce(result: ReproduceResult, *, nvml_label: str | None = None) -> list[str]:
    """Lines for people; ``nvml_label`` names the library when the runs did not report one."""
    lines = []
    for r in result.runs:
        lines.append(f"{r.name:>6}: {r.outcome} in {r.seconds:.1f}s  ({r.run_dir})")
        if r.verdict and r.verdict != r.outcome:
            lines.append(f"        VERDICT: {r.verdict}")
        if r.signature:
            lines.append(f"        core {r.core}: {r.signature}")
        elif r.core_note:
            lines.append(f"        {r.core_note}")
    m = result.main_thread
    if m is not None:
        lines.append(f"{'c':>6}: {m.outcome} in {m.seconds:.1f}s from the main thread, the same calls  ({m.run_dir})")
    h = result.environment
    if h.get("driver"):
        lines.insert(0, f"NVML {h.get('nvml', '?')}, driver {h.get('driver', '?')}, {h.get('gpu', '?')} "
                        f"({h.get('libnvidia-ml', nvml_label or 'loader default')})")
    lines.append(f"conclusion: {result.conclusion}")
    return lines
