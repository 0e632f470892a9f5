"""Local paths out of upstream reports: a maintainer needs ``site-packages/nvitop/api/device.py``, not
``/root/.cache/forensics/venvs/incident/lib/python3.11/site-packages/nvitop/api/device.py``.

:class:`PathLocalizer` rewrites absolute paths in text: a path through ``site-packages`` or
``dist-packages`` keeps its part from there on; a path under the system's own directories
(``/usr``, ``/lib``, ``/etc``, ``/proc`` ...) stays, since it names the distribution's layout, not
this machine; any other absolute path (a home directory, a work or cache directory, a build
tree, a bundle) becomes ``<local>/NAME``, keeping its file name.  It counts what it replaced,
for the report's footer.  Upstream templates use it; the runbook keeps every path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PathLocalizer", "LOCAL"]

LOCAL = "<local>"
_SYSTEM = ("usr", "lib", "lib64", "lib32", "libx32", "bin", "sbin", "etc", "proc", "sys", "dev", "run", "boot")
# an absolute path: starts after a boundary, runs over path characters (no spaces, quotes, brackets)
_PATH = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.+@%=-]+/)*[\w.+@%=-]+/?")
_PACKAGES = re.compile(r"/(?:site|dist)-packages/")


@dataclass
class PathLocalizer:
    """Replaces local paths; ``counts`` says how many of each kind.

    >>> p = PathLocalizer()
    >>> p.text('File "/root/.cache/v/lib/python3.11/site-packages/nvitop/api/device.py", line 1591')
    'File "site-packages/nvitop/api/device.py", line 1591'
    >>> p.text("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 and /work/main/demo/work/sim/libnvidia-ml.so.1")
    '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 and <local>/libnvidia-ml.so.1'
    >>> p.text("/usr/local/lib/python3.11/site-packages/pynvml.py"), p.summary()
    ('site-packages/pynvml.py', ['2 site-packages paths shortened to site-packages/…', '1 local path replaced by <local>/NAME'])
    """

    counts: dict[str, int] = field(default_factory=dict)

    def _path(self, m: re.Match) -> str:
        path = m.group(0)
        pk = _PACKAGES.search(path)
        if pk:
            self.counts["packages"] = self.counts.get("packages", 0) + 1
            return path[pk.start() + 1:]
        first = path.lstrip("/").split("/", 1)[0]
        if first in _SYSTEM or path == "/":
            return path
        name = path.rstrip("/").rsplit("/", 1)[-1]
        self.counts["local"] = self.counts.get("local", 0) + 1
        return f"{LOCAL}/{name}"

    def text(self, s: str) -> str:
        if not s or "/" not in s:
            return s
        return _PATH.sub(self._path, s)

    def tree(self, value: Any) -> Any:
        """Every string of a JSON-like tree, localized (keys stay)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.tree(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.tree(v) for v in value)
        return value

    def summary(self) -> list[str]:
        out = []
        if self.counts.get("packages"):
            n = self.counts["packages"]
            out.append(f"{n} site-packages path{'s' if n != 1 else ''} shortened to site-packages/…")
        if self.counts.get("local"):
            n = self.counts["local"]
            out.append(f"{n} local path{'s' if n != 1 else ''} replaced by {LOCAL}/NAME")
        return out
