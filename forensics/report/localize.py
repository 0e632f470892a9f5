"""Local paths out of upstream reports: a maintainer needs ``site-packages/nvitop/api/device.py``, not
``/root/.cache/forensics/venvs/incident/lib/python3.11/site-packages/nvitop/api/device.py``.

:class:`PathLocalizer` rewrites absolute paths in text: a path through ``site-packages`` or
``dist-packages`` keeps its part from there on; a path under one of this machine's own places --
home and temporary directories, the kubelet's pod directories, and the prefixes the report
learns from its evidence (where the evidence files, bundles and reproducer runs are, forensics'
cache and checkout) -- becomes ``<local>/NAME``, keeping its file name; any other path stays:
``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09`` names the driver's layout and
``/app/nvitop/__init__.py`` the image's (the shadowing a maintainer must see).  It counts what
it replaced, for the report's footer.  Upstream templates use it; the runbook keeps every path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["PathLocalizer", "LOCAL"]

LOCAL = "<local>"
#: this machine's places, whatever the evidence says: homes, temporary directories, the kubelet's pods
LOCAL_PREFIXES = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm", "/run/user", "/var/lib/kubelet")
# an absolute path: starts after a boundary, runs over path characters (no spaces, quotes, brackets)
_PATH = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.+@%=-]+/)*[\w.+@%=-]+/?")
_PACKAGES = re.compile(r"/(?:site|dist)-packages/")


@dataclass
class PathLocalizer:
    """Replaces local paths; ``counts`` says how many of each kind.

    >>> p = PathLocalizer(prefixes=("/work/main/demo",))
    >>> p.text('File "/root/.cache/v/lib/python3.11/site-packages/nvitop/api/device.py", line 1591')
    'File "site-packages/nvitop/api/device.py", line 1591'
    >>> p.text("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 and /work/main/demo/work/sim/libnvidia-ml.so.1")
    '/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 and <local>/libnvidia-ml.so.1'
    >>> p.text("/app/nvitop/__init__.py /tmp/x/core")
    '/app/nvitop/__init__.py <local>/core'
    >>> p.summary()
    ['1 site-packages path shortened to site-packages/…', '2 local paths replaced by <local>/NAME']
    """

    prefixes: tuple[str, ...] = ()  # learned from the evidence, beside LOCAL_PREFIXES
    counts: dict[str, int] = field(default_factory=dict)

    def is_local(self, path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in (*LOCAL_PREFIXES, *self.prefixes) if p)

    def _path(self, m: re.Match) -> str:
        path = m.group(0)
        pk = _PACKAGES.search(path)
        if pk:
            self.counts["packages"] = self.counts.get("packages", 0) + 1
            return path[pk.start() + 1:]
        if not self.is_local(path):
            return path
        name = path.rstrip("/").rsplit("/", 1)[-1]
        self.counts["local"] = self.counts.get("local", 0) + 1
        return f"{LOCAL}/{name}"

    def text(self, s: str) -> str:
        if not s or "/" not in s:
            return s
        return _PATH.sub(self._path, s)

    def summary(self) -> list[str]:
        out = []
        if self.counts.get("packages"):
            n = self.counts["packages"]
            out.append(f"{n} site-packages path{'s' if n != 1 else ''} shortened to site-packages/…")
        if self.counts.get("local"):
            n = self.counts["local"]
            out.append(f"{n} local path{'s' if n != 1 else ''} replaced by {LOCAL}/NAME")
        return out
