"""Capture: arm a live process for a useful core, collect cores and their context on the node.

Submodules, one per step of a capture:

- :mod:`.identity`: pod, container and runtime from a cgroup path (v1 and v2; containerd,
  CRI-O, Docker naming)
- :mod:`.pattern`: ``kernel.core_pattern`` read with core(5) semantics; where this process's
  core will go; install and uninstall of the pipe handler
- :mod:`.arm`: ``forensics capture --pid``: raise RLIMIT_CORE, set ``coredump_filter``
- :mod:`.store`: the build-id keyed object store shared by every core in a directory
- :mod:`.handler`: ``forensics core-handler``, the program the kernel pipes cores to
- :mod:`.snapshot`: the process snapshot (NVML library and its origin, interpreter, libpython,
  nvitop / nvidia-ml-py files)
- :mod:`.pod`: ``forensics capture --pod`` through the one kube client (:mod:`forensics.kubectl`)
- :mod:`.agent`: the agent pod's side of ``capture --pod`` and the bundle's way back through its log
- :mod:`.keeper`: the DaemonSet's privileged keeper: the handler installed, the previous pattern restored

``/proc/PID`` is read, and paths inside a container's root resolved, by :mod:`forensics.procfs`. The node agent
(``agent serve``) is :mod:`forensics.agent`; the manifests and the Helm chart are :mod:`forensics.deploy`.

The bundle they write (its layout, records, writer and reader) is :mod:`forensics.bundle`'s.
Importing this package imports none of them: the core handler must start fast.
"""
from __future__ import annotations

__all__: list[str] = []
