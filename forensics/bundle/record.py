"""The bundle's records: the core handler's record of a crash (``metadata.json``), its core's state, and
the core directory's index entries (``index.jsonl``), each with ``to_json`` / ``from_json``.

The handler writes these records and the budget rewrites them; the agent, the node index and the bundle
reader read them.  All of them go through these classes: ``to_json`` writes the document the handler
always wrote (JSON is the contract: same keys, same values), ``from_json`` reads one back without trusting
it (a bundle is data from a node: a value of the wrong type reads as absent, never as an error).  A key
this version does not know is kept in ``extra`` and written back as it was, so rewriting a record loses
nothing another version put there.

>>> core = CoreRecord(state=CoreState.PENDING)
>>> core.to_json()
{'state': 'pending'}
>>> CoreRecord.from_json({"state": "kept", "file": "core.zst"}).state.has_core
True
"""
from __future__ import annotations

import enum
from dataclasses import field, replace

from ..records import record
from .layout import CORE_PARTIAL

__all__ = ["CoreState", "RecordState", "CoreStream", "CrashSite", "CoreRecord", "CrashRecord", "IndexEntry",
           "BudgetEvent", "Identity", "parse_index_line", "SHORTENED"]


class CoreState(enum.Enum):
    """What became of a crash's core (the record's ``core.state``, the index's ``state``)."""

    NONE = "none"  # the handler has not come to the core (its result only, never in a record)
    PENDING = "pending"  # the first record, written before the core streams in
    KEPT = "kept"  # whole, compressed
    TRUNCATED = "truncated"  # cut at the size bound, or the stream ended early: a valid zstd stream
    PARTIAL = "partial"  # the disk filled up: the zstd frame ends in the middle
    NOT_A_CORE = "not-a-core"  # the kernel's stream was empty or not an ELF core (kept as stream.zst)
    METADATA_ONLY = "metadata-only"  # not kept: RLIMIT_CORE, the crash-loop limit, the minimum free space
    DELETED_FOR_BUDGET = "deleted-for-budget"  # kept, then deleted to fit the directory's budget
    FAILED = "failed"  # the handler failed before it could say

    @property
    def has_core(self) -> bool:
        """A core is on disk to analyze (whole or not)."""
        return self in (CoreState.KEPT, CoreState.TRUNCATED, CoreState.PARTIAL)


class RecordState(enum.Enum):
    """The record's own state: written before the core streams in, rewritten when the handler is done."""

    IN_PROGRESS = "in-progress"
    DONE = "done"


#: the reason a core shortened to make room for the metadata gets
SHORTENED = "the disk filled up: the saved core was shortened to make room for the metadata"


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: object) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _strs(v: object) -> tuple[str, ...]:
    return tuple(str(x) for x in v if x is not None) if isinstance(v, list) else ()


def _str_map(v: object) -> dict[str, str]:
    return {k: x for k, x in v.items() if isinstance(k, str) and isinstance(x, str)} if isinstance(v, dict) else {}


def _dict_map(v: object) -> dict[str, dict] | None:
    """A JSON object of objects, as {str: dict}; None when absent."""
    return {k: x for k, x in v.items() if isinstance(k, str) and isinstance(x, dict)} if isinstance(v, dict) else None


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _enum(cls, v: object):
    try:
        return cls(v)
    except ValueError:
        return None


@record
class CoreStream:
    """What the kernel's stream was, judged against the ELF core's own headers."""

    kind: str | None  # "core" (whole), "short" (ended early), "not-a-core", "unchecked"
    bytes: int | None  # bytes received
    expected_bytes: int | None  # bytes the core's program headers claim
    reason: str | None  # for anything but a whole core

    def to_json(self) -> dict:
        return {"kind": self.kind, "bytes": self.bytes, "expected_bytes": self.expected_bytes, "reason": self.reason}

    @classmethod
    def from_json(cls, doc: object) -> CoreStream | None:
        if not isinstance(doc, dict):
            return None
        return cls(kind=_str(doc.get("kind")), bytes=_int(doc.get("bytes")),
                   expected_bytes=_int(doc.get("expected_bytes")), reason=_str(doc.get("reason")))


@record
class CrashSite:
    """The crashing thread's pc as the core's first bytes give it, without analysis (the crash-loop key's basis)."""

    signal: int | None = None
    pc: int | None = None
    module: str | None = None  # the file mapped at the pc
    module_offset: int | None = None

    def to_json(self) -> dict:
        return {"signal": self.signal, "pc": self.pc, "module": self.module, "module_offset": self.module_offset}

    @classmethod
    def from_json(cls, doc: object) -> CrashSite | None:
        if not isinstance(doc, dict):
            return None
        return cls(signal=_int(doc.get("signal")), pc=_int(doc.get("pc")), module=_str(doc.get("module")),
                   module_offset=_int(doc.get("module_offset")))


_CORE_KEYS = ("state", "file", "bytes_in", "bytes_kept", "bytes_compressed", "sha256_compressed", "reasons",
              "stream", "deleted_at")


@record
class CoreRecord:
    """The record's ``core``: what became of the core, its file in ``50-core`` and why it is not whole.

    A pending core (the first record) is its state alone; the handler's last record has every field.
    """

    state: CoreState | None  # None: a state this version does not know (``extra`` keeps the spelling)
    file: str | None = None  # its name in 50-core (None: nothing written)
    bytes_in: int | None = None  # bytes the kernel sent
    bytes_kept: int | None = None  # of them, fed to the compressor
    bytes_compressed: int | None = None  # on disk
    sha256_compressed: str | None = None  # of the file as written (None once shortened)
    reasons: tuple[str, ...] = ()  # why it is not whole, or not kept
    stream: CoreStream | None = None
    deleted_at: float | None = None  # when the budget deleted it
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        doc: dict = {"state": self.state.value} if self.state is not None else {}
        if self.state is not CoreState.PENDING:
            doc.update({"file": self.file, "bytes_in": self.bytes_in, "bytes_kept": self.bytes_kept,
                        "bytes_compressed": self.bytes_compressed, "sha256_compressed": self.sha256_compressed,
                        "reasons": list(self.reasons),
                        "stream": self.stream.to_json() if self.stream is not None else None})
        if self.deleted_at is not None:
            doc["deleted_at"] = self.deleted_at
        return {**doc, **self.extra}

    @classmethod
    def from_json(cls, doc: object) -> CoreRecord:
        d = doc if isinstance(doc, dict) else {}
        state = _enum(CoreState, d.get("state"))
        extra = {k: v for k, v in d.items() if k not in _CORE_KEYS or (k == "state" and state is None)}
        return cls(state=state, file=_str(d.get("file")), bytes_in=_int(d.get("bytes_in")),
                   bytes_kept=_int(d.get("bytes_kept")), bytes_compressed=_int(d.get("bytes_compressed")),
                   sha256_compressed=_str(d.get("sha256_compressed")), reasons=_strs(d.get("reasons")),
                   stream=CoreStream.from_json(d.get("stream")), deleted_at=_num(d.get("deleted_at")), extra=extra)

    @property
    def state_name(self) -> str | None:
        """The state as the record spells it, also one this version does not know."""
        if self.state is not None:
            return self.state.value
        return _str(self.extra.get("state")) or None

    def shortened(self, bytes_compressed: int) -> CoreRecord:
        """The core cut to make room for the metadata: partial, renamed, its digest no longer known.

        >>> CoreRecord(state=CoreState.KEPT, file="core.zst").shortened(10).reasons[-1] == SHORTENED
        True
        """
        reasons = self.reasons if SHORTENED in self.reasons else (*self.reasons, SHORTENED)
        return replace(self, state=CoreState.PARTIAL, file=CORE_PARTIAL, bytes_compressed=bytes_compressed,
                       sha256_compressed=None, reasons=reasons)

    def deleted_for_budget(self, at: float) -> CoreRecord:
        return replace(self, state=CoreState.DELETED_FOR_BUDGET, deleted_at=at)


_CRASH_KEYS = ("schema_version", "crash_id", "pid", "tid", "signal", "signal_name", "time", "rlimit_core", "node",
               "image_key", "identity", "state", "core", "objects", "config", "warnings", "crash_loop_key",
               "crash_pc", "debug_files", "objects_bytes", "objects_not_copied")


@record
class CrashRecord:
    """The core handler's record of one crash (``metadata.json``): written before the core streams in
    (state in-progress, core pending) so partial evidence survives a killed handler, rewritten when done."""

    crash_id: str | None
    pid: int | None
    tid: int | None
    signal: int | None
    signal_name: str | None
    time: float | None
    rlimit_core: int | None
    node: str | None
    image_key: str | None  # the container image (else the executable): what a crash loop repeats
    identity: dict | None  # the process snapshot's identity (pod, container, runtime) as it wrote it
    state: RecordState | None
    core: CoreRecord
    objects: dict[str, str] = field(default_factory=dict)  # path the process saw -> store key
    config: dict = field(default_factory=dict)  # the handler's bounds (HandlerConfig)
    warnings: tuple[str, ...] = ()
    crash_loop_key: str | None = None  # same image, signal and crash site (the budget's unit); not a fingerprint
    crash_pc: CrashSite | None = None
    debug_files: dict[str, str] | None = None  # path -> store key of its separate debug file
    objects_bytes: int | None = None  # disk the objects and debug files this crash stored new take (the budget's)
    # path -> {"build_id", "size", "why"}: mapped objects kept by build-id and size only (a memfd, a sparse file,
    # one over the handler's max_object_size): not copied
    objects_not_copied: dict[str, dict] | None = None
    schema_version: int = 1
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        doc = {
            "schema_version": self.schema_version, "crash_id": self.crash_id, "pid": self.pid, "tid": self.tid,
            "signal": self.signal, "signal_name": self.signal_name, "time": self.time,
            "rlimit_core": self.rlimit_core, "node": self.node, "image_key": self.image_key,
            "identity": self.identity, "state": self.state.value if self.state is not None else None,
            "core": self.core.to_json(), "objects": dict(self.objects), "config": dict(self.config),
            "warnings": list(self.warnings),
        }
        if self.crash_loop_key is not None:
            doc["crash_loop_key"] = self.crash_loop_key
        if self.crash_pc is not None:
            doc["crash_pc"] = self.crash_pc.to_json()
        if self.debug_files is not None:
            doc["debug_files"] = dict(self.debug_files)
        if self.objects_bytes is not None:
            doc["objects_bytes"] = self.objects_bytes
        if self.objects_not_copied:
            doc["objects_not_copied"] = {k: dict(v) for k, v in self.objects_not_copied.items()}
        return {**doc, **self.extra}

    @classmethod
    def from_json(cls, doc: object) -> CrashRecord | None:
        """The record a ``metadata.json`` holds; None when it is not a JSON object."""
        if not isinstance(doc, dict):
            return None
        g = doc.get
        state = _enum(RecordState, g("state"))
        extra = {k: v for k, v in doc.items() if k not in _CRASH_KEYS or (k == "state" and state is None)}
        return cls(
            schema_version=_int(g("schema_version")) or 1, crash_id=_str(g("crash_id")), pid=_int(g("pid")),
            tid=_int(g("tid")), signal=_int(g("signal")), signal_name=_str(g("signal_name")), time=_num(g("time")),
            rlimit_core=_int(g("rlimit_core")), node=_str(g("node")), image_key=_str(g("image_key")),
            identity=g("identity") if isinstance(g("identity"), dict) else None, state=state,
            core=CoreRecord.from_json(g("core")), objects=_str_map(g("objects")),
            config=_dict(g("config")), warnings=_strs(g("warnings")),
            crash_loop_key=_str(g("crash_loop_key")), crash_pc=CrashSite.from_json(g("crash_pc")),
            debug_files=_str_map(g("debug_files")) if isinstance(g("debug_files"), dict) else None,
            objects_bytes=_int(g("objects_bytes")),
            objects_not_copied=_dict_map(g("objects_not_copied")),
            extra=extra)

    @property
    def state_name(self) -> str | None:
        """The record's state as it spells it, also one this version does not know."""
        if self.state is not None:
            return self.state.value
        return _str(self.extra.get("state")) or None

    @property
    def loop_key(self) -> str | None:
        """The crash-loop key, also as records written before it was named for what it is spelled it."""
        return self.crash_loop_key or _str(self.extra.get("fingerprint"))

    @property
    def pod_uid(self) -> str | None:
        return _str((self.identity or {}).get("pod_uid"))

    @property
    def container_id(self) -> str | None:
        return _str((self.identity or {}).get("container_id"))


@record
class IndexEntry:
    """One crash's line in the core directory's ``index.jsonl``, appended when the handler is done."""

    id: str
    time: float | None
    pid: int | None
    signal: int | None
    key: str | None  # the record's image_key
    crash_loop_key: str | None
    core: str | None  # its file in 50-core (None: none written)
    state: CoreState | None
    reasons: tuple[str, ...] = ()
    pod_uid: str | None = None
    container_id: str | None = None

    def to_json(self) -> dict:
        return {"id": self.id, "time": self.time, "pid": self.pid, "signal": self.signal, "key": self.key,
                "crash_loop_key": self.crash_loop_key, "core": self.core,
                "state": self.state.value if self.state is not None else None, "reasons": list(self.reasons),
                "pod_uid": self.pod_uid, "container_id": self.container_id}

    @classmethod
    def from_json(cls, doc: object) -> IndexEntry | None:
        """The entry of an index line; None when it is not a crash's (a budget event, damage)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not doc["id"]:
            return None
        g = doc.get
        return cls(id=doc["id"], time=_num(g("time")), pid=_int(g("pid")), signal=_int(g("signal")), key=_str(g("key")),
                   # ("fingerprint": the key's name in indexes written before it was named for what it is)
                   crash_loop_key=_str(g("crash_loop_key")) or _str(g("fingerprint")), core=_str(g("core")),
                   state=_enum(CoreState, g("state")), reasons=_strs(g("reasons")), pod_uid=_str(g("pod_uid")),
                   container_id=_str(g("container_id")))


@record
class BudgetEvent:
    """A budget pass's line in ``index.jsonl``: the cores it deleted, what it could not do."""

    time: float | None
    deleted: tuple[str, ...] = ()  # crash ids whose core went
    objects_deleted: int = 0
    records_not_updated: tuple[str, ...] = ()  # their records still say "kept": the index tells the deletion
    not_deleted: tuple[str, ...] = ()  # "ID: why" of cores that could not be deleted
    records_unreadable: tuple[str, ...] = ()  # crashes whose objects were not known to be in use

    def to_json(self) -> dict:
        doc: dict = {"event": "budget", "deleted": list(self.deleted), "objects_deleted": self.objects_deleted,
                     "time": self.time}
        for name in ("records_not_updated", "not_deleted", "records_unreadable"):
            if getattr(self, name):
                doc[name] = list(getattr(self, name))
        return doc

    @classmethod
    def from_json(cls, doc: object) -> BudgetEvent | None:
        if not isinstance(doc, dict) or doc.get("event") != "budget":
            return None
        g = doc.get
        return cls(time=_num(g("time")), deleted=_strs(g("deleted")), objects_deleted=_int(g("objects_deleted")) or 0,
                   records_not_updated=_strs(g("records_not_updated")), not_deleted=_strs(g("not_deleted")),
                   records_unreadable=_strs(g("records_unreadable")))


def parse_index_line(doc: object) -> IndexEntry | BudgetEvent | None:
    """An index line as its record: a crash's entry, a budget pass, or None (damage, a kind not known)."""
    return IndexEntry.from_json(doc) or BudgetEvent.from_json(doc)


# the keys each writer of 00-identity.json writes (its ``kind``; the core handler's has none), in this order
_IDENTITY_KEYS = {
    "crash": ("crash_id", "node", "pid", "tid", "signal", "time", "comm", "exe", "image", "pod_uid", "container_id",
              "runtime"),
    "capture": ("kind", "node", "pid", "captured_at", "comm", "exe", "pod_uid", "container_id", "runtime",
                "qos_class", "image", "core_dir"),
    "capture-waiting": ("kind", "node", "captured_at", "pod_uid", "core_dir"),
}
# what capture --pod adds to the node's identity
_POD_KEYS = ("pod", "namespace", "pod_uid", "owners", "node_uid", "node", "container", "container_id", "agent_pod")
_IDENTITY_STR = ("crash_id", "node", "signal", "comm", "exe", "image", "pod_uid", "container_id", "runtime",
                 "qos_class", "core_dir", "pod", "namespace", "node_uid", "container", "agent_pod")


@record
class Identity:
    """Who was captured (``00-identity.json``): by the core handler at a crash (``kind`` "crash"), by
    ``capture --pid`` ("capture"), for a pod that is not running ("capture-waiting"); ``capture --pod`` adds
    the pod's side (``pod`` and the fields after it) to what the node wrote.

    >>> Identity(kind="capture-waiting", node="n", captured_at=1.0, pod_uid="u", core_dir="/c").to_json()
    {'kind': 'capture-waiting', 'node': 'n', 'captured_at': 1.0, 'pod_uid': 'u', 'core_dir': '/c'}
    """

    kind: str | None  # "crash", "capture", "capture-waiting"; None: no node identity (a pod bundle's alone)
    node: str | None = None  # the node's host name (a pod bundle: the pod's node)
    crash_id: str | None = None
    pid: int | None = None
    tid: int | None = None
    signal: str | None = None  # its name
    time: float | None = None  # of the crash
    captured_at: float | None = None
    comm: str | None = None
    exe: str | None = None
    image: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    qos_class: str | None = None
    core_dir: str | None = None
    pod: str | None = None  # capture --pod's side: the pod's name, ...
    namespace: str | None = None
    owners: tuple = ()  # the pod's owner references (a job...) as summarized
    node_uid: str | None = None
    container: str | None = None
    agent_pod: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        keys = _IDENTITY_KEYS.get(self.kind or "", ())
        if self.pod is not None:
            keys = (*keys, *(k for k in _POD_KEYS if k not in keys))
        return {**{k: list(self.owners) if k == "owners" else getattr(self, k) for k in keys}, **self.extra}

    @classmethod
    def from_json(cls, doc: object) -> Identity | None:
        if not isinstance(doc, dict):
            return None
        kind = _str(doc.get("kind")) or ("crash" if "crash_id" in doc else None)
        known = set(_IDENTITY_KEYS.get(kind or "", ())) | (set(_POD_KEYS) if "pod" in doc else set())
        owners = doc.get("owners")
        return cls(kind=kind, pid=_int(doc.get("pid")), tid=_int(doc.get("tid")), time=_num(doc.get("time")),
                   captured_at=_num(doc.get("captured_at")),
                   owners=tuple(owners) if isinstance(owners, list) else (),
                   extra={k: v for k, v in doc.items() if k not in known},
                   **{k: _str(doc.get(k)) for k in _IDENTITY_STR})

    def with_pod(self, **pod_side) -> Identity:
        """This identity with capture --pod's side (``pod``, ``namespace``, ``pod_uid``, ``owners``, ...)."""
        return replace(self, **pod_side)
