"""A real Prometheus for the tests: Debian's ``prometheus`` package, unpacked into the forensics cache.

The package is not installed (its maintainer scripts would start a server on every interface as a
service): ``apt-get download`` fetches it and ``dpkg-deb -x`` unpacks it into
``<cache>/tools/prometheus-<version>``, keyed by the package version, built under an exclusive lock
and renamed into place.  A ``prometheus`` on PATH is used first.  ``python -m tests.prometheus_env``
(run by ``.ci/setup``) fetches it ahead of the tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.toolcache import cached_tool, tools_dir

__all__ = ["PrometheusUnavailable", "prometheus_binary"]


class PrometheusUnavailable(RuntimeError):
    """No prometheus binary here and none can be fetched (no apt, no mirror): a test should skip."""


def _candidate_version() -> str:
    try:
        out = subprocess.run(["apt-cache", "policy", "prometheus"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PrometheusUnavailable(f"apt-cache: {e}") from e
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            v = line.split(":", 1)[1].strip()
            if v and v != "(none)":
                return v
    raise PrometheusUnavailable("apt knows no prometheus package (run apt-get update)")


def prometheus_binary() -> str:
    """The path of a prometheus server binary.

    :raises PrometheusUnavailable: when there is none and it cannot be fetched
    """
    found = shutil.which("prometheus")
    if found:
        return found
    existing = sorted(tools_dir().glob("prometheus-*/usr/bin/prometheus"))
    try:
        version = _candidate_version()
    except PrometheusUnavailable:
        if existing:
            return str(existing[-1])
        raise
    return cached_tool(f"prometheus-{version.replace(':', '_')}", "usr/bin/prometheus",
                       lambda work: _fetch(work, version))


def _fetch(work: Path, version: str) -> Path:
    os.chmod(work, 0o755)  # apt's download user writes here
    p = subprocess.run(["apt-get", "download", f"prometheus={version}"], cwd=work, capture_output=True,
                       text=True, timeout=600)
    debs = list(work.glob("prometheus_*.deb"))
    if p.returncode or not debs:
        raise PrometheusUnavailable(f"apt-get download prometheus: {p.stderr.strip()[-300:]}")
    tree = work / "root"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True, timeout=300)
    if not (tree / "usr/bin/prometheus").is_file():
        raise PrometheusUnavailable("the prometheus package holds no usr/bin/prometheus")
    return tree


if __name__ == "__main__":
    try:
        print(prometheus_binary())
    except PrometheusUnavailable as e:
        print(f"prometheus_env: {e}", file=sys.stderr)
        sys.exit(1)
