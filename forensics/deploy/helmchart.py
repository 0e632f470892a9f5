"""The node agent's Helm chart, shipped in the package as data (``forensics/deploy/chart/``), and a copy of it.

The chart renders the objects :func:`~.manifests.agent_objects` makes (``forensics agent manifest``) for the same
settings (tests/integration/test_helm_chart.py renders both and compares them); ``files/`` holds the Prometheus
rules and the Grafana dashboard it can install.  :func:`write_chart` (``forensics agent chart``) copies it out of an
installed wheel for ``helm install``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from ..errors import OutputExists, OutputUnwritable

__all__ = ["CHART_DIR", "chart_files", "write_chart"]

CHART_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chart")
_MAX_FILES = 64  # the chart's own files: a bound on the walk, not a limit anyone meets


def chart_files() -> list[str]:
    """The chart's files, relative to :data:`CHART_DIR`, sorted.

    >>> "Chart.yaml" in chart_files() and "files/forensics-alerts.yaml" in chart_files()
    True
    """
    out = []
    for root, dirs, files in os.walk(CHART_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.relpath(os.path.join(root, f), CHART_DIR) for f in files if not f.endswith(".pyc")]
        if len(out) > _MAX_FILES:
            raise RuntimeError(f"{CHART_DIR}: more than {_MAX_FILES} files")
    return sorted(out)


def write_chart(dest: str, *, force: bool = False, option: str = "--output") -> list[str]:
    """Copy the chart into the directory ``dest`` (made here; its parent must exist).

    :param force: write into an existing ``dest``, replacing the chart's files there (nothing else in it is
        touched; a file of the chart's is replaced, never written through a link)
    :return: the files written, relative to ``dest``
    :raises OutputExists: when ``dest`` exists and ``force`` is not given
    :raises OutputUnwritable: when ``dest``'s parent is missing or not writable, or ``dest`` (or a directory of
        the chart in it) is not a directory
    """
    files = chart_files()
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise OutputUnwritable(dest, "its directory does not exist", option)
    try:
        if os.path.lexists(dest):
            if not force:
                raise OutputExists(dest, option)
            _copy_into(dest, files, option)
        else:
            tmp = tempfile.mkdtemp(prefix=".forensics-chart-", dir=parent)
            try:
                _copy_into(tmp, files, option)
                os.chmod(tmp, 0o755)
                os.rename(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except OSError as e:
        if isinstance(e, (OutputExists, OutputUnwritable)):
            raise
        raise OutputUnwritable(dest, e.strerror or str(e), option) from e
    return files


def _copy_into(dest: str, files: list[str], option: str) -> None:
    if os.path.islink(dest) or not os.path.isdir(dest):
        raise OutputUnwritable(dest, "not a directory", option)
    for rel in files:
        d = dest
        for part in os.path.dirname(rel).split(os.sep) if os.path.dirname(rel) else []:
            d = os.path.join(d, part)
            if not os.path.lexists(d):
                os.mkdir(d, 0o755)
            elif os.path.islink(d) or not os.path.isdir(d):
                raise OutputUnwritable(d, "not a directory", option)
        target = os.path.join(dest, rel)
        fd, tmp = tempfile.mkstemp(prefix=".forensics-chart-", dir=os.path.dirname(target))
        try:
            with os.fdopen(fd, "wb") as out, open(os.path.join(CHART_DIR, rel), "rb") as src:
                shutil.copyfileobj(src, out)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)  # replaces a link at target, never writes through it
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
