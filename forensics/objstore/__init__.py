"""Bundles in S3-compatible object storage: uploaded from the node, verified, and read back.

- :mod:`.client`: ``s3://`` URLs, the store's options, a boto3 client, its errors as ours
- :mod:`.transfer`: one file into one object (multipart, bounded memory, retried) and its verification
- :mod:`.upload`: a sealed bundle into the bucket, by cluster, node, namespace, pod, time and fingerprint
- :mod:`.fetch`: ``s3://`` inputs of ``analyze`` and ``report`` (a bundle, a core, a prefix of bundles) into the cache

boto3 is imported by these modules' functions, never by importing the package: a command that reads only
local files does not load it.
"""
from __future__ import annotations

__all__: list[str] = []
