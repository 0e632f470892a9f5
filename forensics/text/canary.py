"""Text of ``forensics canary``: the verdict and the numbers behind it."""
from __future__ import annotations

from ..canary import CanaryResult
from ..output import count

__all__ = ["format_canary"]


def format_canary(r: CanaryResult) -> list[str]:
    """The verdict first, then latency, bodies, errors, why it failed, and the fleet hint."""

    def ms(x):
        return "-" if x is None else f"{x * 1000:.1f} ms"

    pace = f"one every {r.interval:g}s" if r.interval else f"{r.rate:.0f}/s"
    lines = [
        f"{r.verdict}: {r.url}: {count(r.requests, 'scrape')} in {r.elapsed:.1f}s ({pace}, concurrency "
        f"{r.concurrency}), "
        f"success {r.success_rate:.2%}",
        f"latency p50 {ms(r.percentile(50))}, p95 {ms(r.percentile(95))}, p99 {ms(r.percentile(99))}, "
        f"max {ms(max(r.latencies) if r.latencies else None)}",
        f"body {r.body_min}-{r.body_max} bytes; {r.parsed_bodies} distinct bodies parsed, {r.invalid_bodies} invalid; "
        f"{count(len(r.families), 'metric family', 'metric families')}",
    ]
    if r.content_types:
        kinds = ", ".join(f"{k or '(no Content-Type)'}: {v}" for k, v in sorted(r.content_types.items()))
        lines.append(f"format: {kinds}; gzip {r.gzip_bodies} of {r.ok}")
    if r.errors:
        lines.append("errors: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())))
    if r.nan_samples:
        lines.append("NaN samples: " + ", ".join(f"{k}: {v}" for k, v in sorted(r.nan_samples.items())))
    if r.stopped_early:
        lines.append(f"stopped early: {r.stopped_early}")
    for reason in r.reasons:
        lines.append(f"so far: {reason}" if r.interrupted else f"FAIL because {reason}")
    if r.hint:
        lines.append(f"hint: {r.hint}")
    return lines
