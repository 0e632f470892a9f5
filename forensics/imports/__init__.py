"""verify-imports: which files Python really imports in an image or a live process.

Image sources (OCI layouts, docker-archive tars, unpacked roots, registries via
skopeo), layer reading that trusts nothing, sys.path resolution as CPython does
it, pip metadata, verdicts (OK, SHADOWED, UNMANAGED, MISSING, VERSION-MISMATCH),
known version issues, and ``--execute`` ground truth.

>>> from forensics.imports import verify_image          # doctest: +SKIP
>>> verify_image("oci:/tmp/img:1.7.1").ok               # doctest: +SKIP
True
"""
from __future__ import annotations

__all__ = ["verify_image", "verify_pid", "VerifyOptions", "DEFAULT_MODULES"]


def __getattr__(name: str):  # lazily: `forensics --help` must not import the whole subpackage
    if name in __all__:
        from . import verify

        return getattr(verify, name)
    raise AttributeError(name)
