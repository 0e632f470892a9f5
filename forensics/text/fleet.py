"""Text of ``forensics fleet``: the node-group table and the boundary lines."""
from __future__ import annotations

from ..fleet import FleetSummary
from ..output import count, escape_text

__all__ = ["format_fleet"]


def format_fleet(s: FleetSummary) -> list[str]:
    """The Markdown table and the boundary lines."""
    # the crashes by fingerprint, per group: the agents' (from Prometheus) or the bundles read (--bundles)
    with_fp = s.source is not None or bool(s.bundles)
    lines = [
        f"{count(s.pods, 'pod')} on {count(s.nodes, 'node')}, grouped by {', '.join(s.group_by)}"
        + (f"; restarts since {s.baseline}" if s.baseline else "") + (f"; from {s.source}" if s.source else "")
        + (f"; crashes from {', '.join(escape_text(b) for b in s.bundles)}" if s.bundles else ""),
        "",
        "| Node group | Nodes | Pods | Pods restarting | Restarts | Max | Exit 139 | Exit 134 | Exit 137 | Other | "
        "CrashLoopBackOff | Images |"
        + (" Fingerprints |" if with_fp else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if with_fp else ""),
    ]
    for g in s.groups:
        c = g.exit_codes
        images = ", ".join(f"{d.split('@')[-1][:19]} ({n})" for d, n in sorted(g.images.items(), key=lambda x: -x[1]))
        fps = ", ".join(f"{fp} x {n:,}" for fp, n in sorted(g.fingerprints.items(), key=lambda x: (-x[1], x[0])))
        lines.append(
            f"| {g.name} | {g.nodes} | {g.pods} | {g.pods_with_restarts} | {g.total_restarts:,} | {g.max_restarts} | "
            f"{c.get('139', 0)} | {c.get('134', 0)} | {c.get('137', 0)} | {c.get('other', 0)} | {g.crash_loop} | "
            f"{images or '-'} |"
            + (f" {fps or '-'} |" if with_fp else "")
        )
    lines.append("")
    if s.crashing_groups:
        lines.append("Crashes concentrate in: " + "; ".join(s.crashing_groups))
    if s.clean_groups:
        lines.append("Clean: " + "; ".join(s.clean_groups))
    for b in s.boundary:
        lines.append(f"Boundary: {b}")
    for fp, where in s.latest_bundles.items():
        lines.append(f"Newest bundle of {escape_text(fp)}: {escape_text(where)}")
    if s.mixed_images:
        lines.append("Mixed rollout: a container runs more than one image digest across pods")
    return lines
