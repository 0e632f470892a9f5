"""The capture bundle's one home: its layout, its records, reading it and writing it.

- :mod:`.layout`: the name of every item (``00-identity.json`` ... ``MANIFEST.json``) and of the core
  directory's files; no other module spells one
- :mod:`.read`: the manifest, the items (read inside the bundle only), the core and the sysroot that
  makes it analyzable
- :mod:`.write`: a new bundle directory, its items written atomically, its manifest
- :mod:`.record`: the core handler's record of a crash, its core's state, the core directory's index
  entries, as records with ``to_json`` / ``from_json``
- :mod:`.documents`: the documents ``report`` reads of a bundle (the process snapshot, the pod's scheduling
  state) as records, read once, a document of the wrong shape read in part and said so

Importing the package loads the layout and the reader (what ``analyze`` needs of a bundle); the writer is
imported by the writers (capture, the core handler).
"""
from __future__ import annotations

from .layout import CORE_NAMES, MANIFEST
from .read import (
    bundle_crash_time,
    bundle_no_core_reason,
    bundle_sysroot,
    check_manifest,
    decompress_core,
    find_core_in_bundle,
    find_object_store,
    has_manifest,
    is_bundle,
    prune_bundle_cache,
    read_bundle_file,
    read_bundle_json,
    read_crash_record,
    read_manifest,
    sha256_file,
    verify_manifest,
)

__all__ = [
    "CORE_NAMES", "MANIFEST", "bundle_crash_time", "bundle_no_core_reason", "bundle_sysroot", "check_manifest",
    "decompress_core", "find_core_in_bundle", "find_object_store", "has_manifest", "is_bundle",
    "prune_bundle_cache", "read_bundle_file", "read_bundle_json", "read_crash_record", "read_manifest", "sha256_file",
    "verify_manifest",
]
