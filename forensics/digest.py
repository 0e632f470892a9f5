"""SHA-256 without importing :mod:`hashlib` (the analysis path's fingerprints and cache names).

``import hashlib`` loads OpenSSL's libcrypto (its ``_hashlib``) and ``_blake2`` to offer every
algorithm: about a twentieth of what ``forensics analyze`` spent on a small core.  CPython's own
SHA-256 module (``_sha2`` from 3.12, ``_sha256`` before) gives the same digest at no such cost;
where neither exists this is hashlib's.
"""
from __future__ import annotations

import importlib

__all__ = ["sha256"]


def _constructor():
    for name in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
    from hashlib import sha256 as hashlib_sha256

    return hashlib_sha256


sha256 = _constructor()
"""``sha256(data=b"")``: a SHA-256 object with ``update`` and ``hexdigest``, as :func:`hashlib.sha256`."""
