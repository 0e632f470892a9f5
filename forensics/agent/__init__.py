"""The node agent: ``forensics agent serve``, the DaemonSet's long-running process on each GPU node.

- :mod:`.serve`: the watch loop -- each new crash analyzed once (:mod:`.sandboxed`: in its sandbox), the metrics
  (:mod:`.metricsserver` serves them), the Events (:mod:`.events`), the uploads (:mod:`.shipper`)
- :mod:`.nodeindex`: the crash index rebuilt from the bundles of the core directory; :mod:`.crashplaces` reads it
  for ``fleet --bundles``

Beside it, :mod:`forensics.capture` holds the kernel's handler and the captures (the agent reads what they write),
and :mod:`forensics.deploy` the manifests, the Helm chart, the alert rules and the dashboard that install and watch it.
Importing this package imports none of them.
"""
from __future__ import annotations

__all__: list[str] = []
