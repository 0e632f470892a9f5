"""How the node side is deployed and watched: ``forensics agent manifest``'s objects (:mod:`.manifests`, and the
short-lived agent pod of ``capture --pod``), the Helm chart shipped as package data (``chart/``: its templates,
``values.schema.json``, the alert rules and the Grafana dashboard in ``chart/files/``) and its copy out of the wheel
(:mod:`.helmchart`, ``forensics agent chart``). Pure: no I/O but the chart's copy. Importing this package imports none
of them.
"""
from __future__ import annotations

__all__: list[str] = []
