"""Load report inputs: JSON documents written by other forensics commands, and capture bundles.

Each input is recognised by its ``command`` field (``analyze``, ``analyze-batch``,
``verify-imports``, ``reproduce``, ``fleet``) or, for a directory, by its
bundle manifest.  Every file read is listed with its sha256 for the report's
evidence section.  Reading is bounded: a file larger than MAX_INPUT_BYTES is refused, and so are inputs
that together are more than :func:`max_total_bytes` (MAX_TOTAL_BYTES, FORENSICS_MAX_REPORT_BYTES): every
byte read into memory counts, the JSON documents, a bundle's files and its bug report's decompressed text.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .. import rootpath
from ..bundle import MANIFEST, check_manifest, layout, read_bundle_file
from ..bundle.documents import DOCUMENT_KEYS, CaptureDocuments
from ..errors import ForensicsError, InputUnreadable, ReportInputError, check_input_exists

__all__ = ["Evidence", "EvidenceItem", "load_evidence", "MAX_INPUT_BYTES", "MAX_TOTAL_BYTES",
           "max_total_bytes"]

MAX_INPUT_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 1 << 30  # bytes of all of a report's inputs together (FORENSICS_MAX_REPORT_BYTES)


def max_total_bytes() -> int:
    """The bound on a report's inputs together: FORENSICS_MAX_REPORT_BYTES, else MAX_TOTAL_BYTES."""
    try:
        return max(1, int(os.environ.get("FORENSICS_MAX_REPORT_BYTES") or MAX_TOTAL_BYTES))
    except ValueError:
        return MAX_TOTAL_BYTES


class _Budget:
    """What is left of the inputs' total: each read asks for at most that much (and one byte more, to tell)."""

    def __init__(self) -> None:
        self.total = max_total_bytes()
        self.left = self.total

    def limit(self, n: int) -> int:
        """How many bytes a read of at most ``n`` may ask for: past the budget by one byte at most."""
        return min(n, self.left + 1)

    def take(self, path: str, n: int) -> None:
        if n > self.left:
            raise ReportInputError(path, f"the report's inputs together are more than {self.total} bytes "
                                         "(FORENSICS_MAX_REPORT_BYTES)")
        self.left -= n
#: what report reads: the ``command`` of another command's --json (analyze of a directory writes analyze-batch), and
#: capture bundles; ReportInputError's hint names exactly these (tests/integration/test_report_inputs.py)
KINDS = ("analyze", "analyze-batch", "verify-imports", "reproduce", "fleet", "capture")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceItem:
    path: str
    kind: str
    sha256: str  # of what was read and verified; "" when it could not be (``problem`` says why)
    size: int
    problem: str = ""


@dataclass
class Evidence:
    """The documents a report is made from, by kind, in the order given."""

    docs: dict[str, list[dict]] = field(default_factory=dict)
    items: list[EvidenceItem] = field(default_factory=list)

    def first(self, kind: str) -> dict | None:
        docs = self.docs.get(kind)
        return docs[0] if docs else None

    def all(self, kind: str) -> list[dict]:
        return self.docs.get(kind, [])

    def captures(self) -> list[CaptureDocuments]:
        """The capture bundles, each read into its record (:class:`~forensics.bundle.documents.CaptureDocuments`:
        the one way report reads a bundle's documents)."""
        return [CaptureDocuments.from_json(d) for d in self.all("capture")]


def _read_json(path: str, budget: _Budget) -> tuple[dict, bytes]:
    """The document at ``path`` and the bytes it was parsed from (read once: what is hashed is what was read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(budget.limit(MAX_INPUT_BYTES + 1))
    except PermissionError:
        raise InputUnreadable(path) from None
    except OSError as e:
        raise ReportInputError(path, f"cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ReportInputError(path, f"more than the {MAX_INPUT_BYTES} byte limit")
    budget.take(path, len(data))
    return _parse_json(path, data), data


def _parse_json(path: str, data: bytes, shape: type = dict):
    """The JSON document ``data`` holds, of ``shape`` (an object, or a list for a bundle's events)."""
    if len(data) > MAX_INPUT_BYTES:
        raise ReportInputError(path, f"{len(data)} bytes is over the {MAX_INPUT_BYTES} byte limit")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ReportInputError(path, f"not JSON ({e.__class__.__name__})") from e
    if not isinstance(doc, shape):
        raise ReportInputError(path, "a JSON document must be an object" if shape is dict else
                                     f"a JSON document of this item must be a {shape.__name__}")
    return doc


_BUNDLE_TEXT = (("kernel_log", layout.KERNEL_LOG), ("nvidia_smi", layout.NVIDIA_SMI),
                ("os_release_node", layout.NODE_OS_RELEASE), ("os_release_image", layout.PROCESS_OS_RELEASE),
                ("bug_report_note", layout.BUG_REPORT_NOTE))
_BUG_REPORT = layout.BUG_REPORT_LOGS
MAX_TEXT = 64 * 1024


BUG_REPORT_READ = 4 << 20  # decompressed bytes of nvidia-bug-report.log(.gz) read for its facts


def _read_bug_report(bundle: str, rel: str, budget: _Budget) -> tuple[str, str] | None:
    """(its path, the start of it) for NVIDIA's bug report at ``rel`` in the bundle, read inside the bundle
    only, decompressed as a stream and cut at BUG_REPORT_READ bytes (its nvidia-smi -q and kernel log
    sections come early); None when the bundle has no such file, "" as the text when it cannot be read."""
    import gzip
    import zlib

    root = os.path.abspath(bundle)
    try:
        fd, inside = rootpath.open_in_root_as(root, rel)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            return None
        path = root.rstrip("/") + inside  # symlinks resolved inside the bundle: it names the file read
        try:
            if rel.endswith(".gz"):
                with gzip.open(raw, "rb") as f:
                    data = f.read(budget.limit(BUG_REPORT_READ))
            else:
                data = raw.read(budget.limit(BUG_REPORT_READ))
        except (OSError, EOFError, zlib.error):
            return path, ""
    budget.take(path, len(data))
    return path, data.decode("utf-8", "replace")


def _load_bundle(p: str, ev: Evidence, budget: _Budget) -> dict:
    """A capture bundle (``forensics capture``, the core handler) as one evidence document.

    Its files are read inside the bundle only (:func:`forensics.bundle.read_bundle_file`): a
    symlink in a bundle never leads the report to a file of the machine that reads it.
    """
    root = Path(p)
    def read(rel: str, limit: int) -> bytes | None:
        data = read_bundle_file(p, rel, budget.limit(limit))
        if data is not None:
            budget.take(str(root / rel), min(len(data), limit))
        return data

    manifest_bytes = read(MANIFEST, MAX_INPUT_BYTES + 1)
    if manifest_bytes is None:
        raise ReportInputError(p, f"a directory without a capture bundle {MANIFEST}")
    manifest = str(root / MANIFEST)
    doc: dict = {"command": "capture", "_bundle_dir": str(root.resolve()),
                 "manifest": _parse_json(manifest, manifest_bytes)}
    for key, rel, shape in DOCUMENT_KEYS:
        data = read(rel, MAX_INPUT_BYTES + 1)
        if data is not None:
            doc[key] = _parse_json(str(root / rel), data, shape)
    for key, rel in _BUNDLE_TEXT:
        data = read(rel, MAX_TEXT)
        if data is not None:
            doc[key] = data.decode("utf-8", "replace")
    for rel in _BUG_REPORT:
        found = _read_bug_report(p, rel, budget)
        if found is not None:
            doc["bug_report_file"], doc["bug_report_text"] = found  # NVIDIA's own file: attached as it is, after review
            break
    # hashed now (a hash the report states is one it verified), each file once, inside the inputs' budget
    good, bad = check_manifest(p, doc["manifest"], take=lambda rel, n: budget.take(str(root / rel), n))
    for rel, digest, size in good:
        ev.items.append(EvidenceItem(path=str(root / rel), kind="capture", sha256=digest, size=size))
    for rel, why in bad:
        ev.items.append(EvidenceItem(path=str(root / rel), kind="capture", sha256="", size=0,
                                     problem=f"{why}: does not match the bundle's manifest"))
    if bad:
        doc["manifest_problems"] = [f"{rel}: {why}" for rel, why in bad]
    ev.items.append(EvidenceItem(path=manifest, kind="capture", sha256=hashlib.sha256(manifest_bytes).hexdigest(),
                                 size=len(manifest_bytes)))
    return doc


def _check_artifact(path: str, kind: str, doc: dict) -> None:
    """Read a document of another command into its record once, here at the edge: one that this version cannot
    read (another or no schema_version, a value of the wrong type) is refused in one line naming its file,
    before anything is redacted or written."""
    from ..errors import ArtifactFormatError
    from ..fleet import load_fleet
    from ..format import load_analysis, load_batch
    from ..imports.format import load_import_report
    from ..reproduce import load_reproduce

    loaders = {"analyze": load_analysis, "analyze-batch": load_batch, "reproduce": load_reproduce,
               "verify-imports": load_import_report, "fleet": load_fleet}
    if kind in loaders:
        try:
            loaders[kind](doc)
        except ArtifactFormatError as e:
            raise ReportInputError(path, str(e)) from None


def load_evidence(paths: list[str]) -> Evidence:
    """Read every input; raise :class:`ReportInputError` for one that is not evidence."""
    ev = Evidence()
    budget = _Budget()
    for p in paths:
        check_input_exists(p, hint=ReportInputError.help_text)  # what report reads: KINDS, in words
        if os.path.isdir(p):
            doc = _load_bundle(p, ev, budget)
            kind = "capture"
        else:
            doc, data = _read_json(p, budget)
            command = doc.get("command")
            if not isinstance(command, str) or command not in KINDS:
                raise ReportInputError(p, f"unknown document kind {command!r} (expected one of {', '.join(KINDS)})")
            kind = command
            _check_artifact(p, kind, doc)
            ev.items.append(EvidenceItem(path=p, kind=kind, sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
        ev.docs.setdefault(kind, []).append(doc)
    if not ev.items:
        raise ForensicsError("no evidence given")
    return ev
