"""``forensics core-handler``: the program the kernel pipes a core to.

``kernel.core_pattern = |/…/forensics core-handler DIR %P %I %s %t %c``.  The kernel runs it
as root, on the host, with no environment, and writes the core to its stdin; the dying
process waits until stdin is read to the end.  The handler:

1. reads ``/proc/PID`` while the process still exists (the process exists until the core
   is fully read): what every crash's record holds, each file once and bounded, and opens every
   mapped ELF object through ``/proc/PID/map_files`` (their build-ids); nothing more before
2. the decision, under a lock on DIR, whether to keep the core: RLIMIT_CORE (``%c``) below one
   page keeps metadata only (as systemd-coredump does); so does the crash-loop limit (the
   first N cores per container image and signal per hour) and the minimum free space.  The
   record is written; for a kept core the process's root and mount namespace are held (two
   descriptors, nothing read);
3. streams stdin through zstd (constant memory) to ``50-core/.core.zst.tmp``, cutting it at
   the maximum core size (or ``%c``), nothing else meanwhile; on a full disk it releases a reserve
   made for a kept core, ends the zstd frame and keeps the metadata; judges the stream against
   the ELF core's own program headers (a stream that ended early is a truncated core; an empty,
   non-ELF or non-core stream is not a core) and renames it into place (``core.zst`` whole,
   ``core.truncated.zst`` cut or ended early, ``core.partial.zst`` when even the frame end did
   not fit, ``stream.zst`` for what is not a core), with the reason in the record and the index;
   then lets go of the pipe;
4. for a written core, the process gone: copies the mapped objects and the debug files found for
   them into the build-id store, resolves a Python process's imports in the root held for it;
   adds the node's side at crash time (NVRM / Xid kernel log lines, ``nvidia-smi -q`` for a kept
   core); writes the metadata and the manifest, then deletes the oldest cores beyond the
   directory's budget (metadata stays, and the newest core of each crash-loop key stays: same
   image, signal and crash site).

A dropped core costs the dying process none of the debug-file, object or import work.
Whatever fails, stdin is drained to the end (the kernel never waits on us) and the failure
goes to the kernel log (``/dev/kmsg``) and syslog.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..bundle import layout
from ..bundle.record import (CoreRecord, CoreState, CoreStream, CrashRecord, CrashSite, Identity, IndexEntry,
                             RecordState)
from ..output import escape_text
from .budget import (DirLock, append_index, enforce_budget, free_bytes, live_reservations, read_index_since, release,
                     reserve)
from .spool import (RESERVE, TAIL, Compressor, check_core_stream, compressed_bound, expected_core_bytes, headers_end,
                    make_reserve, with_room)

if TYPE_CHECKING:  # imported where they are used: the handler runs as the kernel's pipe, every import costs
    from ..bundle.write import BundleWriter
    from ..core.elf import FileMapping
    from .identity import ContainerIdentity
    from .snapshot import RawProcFiles, Snapshot
    from .spool import StreamVerdict

__all__ = ["HandlerConfig", "HandlerResult", "run_core_handler", "load_config", "drain", "log_kernel",
           "parse_core_head", "release_pipe"]

PAGE = 4096
_CHUNK = 1 << 20
_HEAD = 4 << 20
_F_SETPIPE_SZ = 1031


@dataclass
class HandlerConfig:
    """Bounds of a core directory (``DIR/handler.json`` ``config``; command-line options override)."""

    max_core_size: int = 32 << 30  # uncompressed bytes kept of one core; the rest is drained
    budget: int = 0  # total bytes of DIR; 0: no budget
    min_free: int = 1 << 30  # keep at least this much free on DIR's filesystem
    loop_limit: int = 5  # cores per (container image, signal) per hour; metadata for all
    loop_window: int = 3600
    level: int = 1  # zstd level
    threads: int = 1  # zstd worker threads: 1 overlaps compression with reading the pipe (0: same thread)
    object_grace: int = 3600  # an object no core uses may go (over budget) once unused this long
    max_objects: int = 4 << 30  # bytes of data one crash may add to the object store (mapped objects, debug files)
    max_object_size: int = 2 << 30  # a mapped object larger is kept by build-id and size only (not copied)
    smi_timeout: int = 15  # seconds for nvidia-smi -q at crash time (kept cores only)

    @classmethod
    def from_dict(cls, d: dict) -> HandlerConfig:
        c = cls()
        for k, v in d.items():
            if hasattr(c, k) and v is not None:
                setattr(c, k, int(v))
        return c


@dataclass
class HandlerResult:
    crash_dir: str | None = None
    core_path: str | None = None
    core_state: CoreState = CoreState.NONE
    reasons: list[str] = field(default_factory=list)
    bytes_in: int = 0
    bytes_kept: int = 0
    bytes_out: int = 0
    warnings: list[str] = field(default_factory=list)


def log_kernel(message: str, *, level: int = 3) -> None:
    """One line to the kernel log (``/dev/kmsg``) and to syslog; never raises.  The message names what the
    crashed process controls (its comm, its executable's path): control characters are escaped, so it
    cannot forge a second record or drive the terminal dmesg prints to."""
    line = escape_text(f"forensics-core-handler[{os.getpid()}]: {message}")
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"<{level}>{line}\n".encode(errors="replace")[:1000])
        finally:
            os.close(fd)
    except OSError:  # the kernel log line is a courtesy: the crash's record holds the facts
        pass
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            s.settimeout(0.5)
            s.connect("/dev/log")
            s.send(f"<{24 + level}>{line}".encode(errors="replace")[:2000])  # facility daemon
        finally:
            s.close()
    except OSError:  # no syslog on this node: the record holds the facts
        pass


def drain(fd: int) -> int:
    """Read ``fd`` to the end, discarding; bytes read (errors end it)."""
    n = 0
    buf = bytearray(_CHUNK)
    while True:
        try:
            k = os.readv(fd, [buf])
        except InterruptedError:  # a signal: read again
            continue
        except OSError:
            return n
        if k <= 0:
            return n
        n += k


def release_pipe(fd: int) -> None:
    """Close our end of the kernel's pipe (``fd`` then reads /dev/null): the core is in.

    With ``kernel.core_pipe_limit`` > 0 the kernel holds the dying process until every reader of the
    pipe has closed it, so this lets the process go while the handler still writes its record (and
    no child the handler starts inherits the pipe).
    """
    try:
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:  # no /dev/null: the pipe is released when the handler exits, moments later
        return
    try:
        os.dup2(null, fd)
    except OSError:  # as above
        pass
    finally:
        os.close(null)


def load_config(core_dir: str) -> HandlerConfig:
    try:
        with open(os.path.join(core_dir, layout.HANDLER_STATE)) as f:
            return HandlerConfig.from_dict(json.load(f).get("config") or {})
    except (OSError, ValueError, AttributeError):
        return HandlerConfig()


def parse_core_head(head: bytes) -> CrashSite:
    """From the first bytes of a core: signal, crashing thread's pc and the file it is in.

    :return: the crash site (its fields None when not found)
    """
    from ..core import elf
    from ..core.arch import X86_64, spec_for

    pc: int | None = None
    signal: int | None = None
    module: str | None = None
    module_offset: int | None = None
    spec = X86_64
    try:
        hdr = elf.parse_elf_header(head[: elf.EHDR64_SIZE])
        found = spec_for(hdr.machine)  # the registers' layout is the machine's (an arm64 node's)
        if found is None:
            raise ValueError(f"a core of machine {hdr.machine}")
        spec = found
        phdrs = elf.parse_program_headers(head[hdr.phoff : hdr.phoff + hdr.phnum * elf.PHDR64_SIZE], hdr.phnum)
    except (ValueError, struct.error, IndexError):  # not a core's header: nothing known (the stream's verdict says why)
        phdrs = ()
    files: tuple[FileMapping, ...] = ()
    for p in phdrs:
        if p.type != elf.PT_NOTE or p.offset + p.filesz > len(head):
            continue
        for note in elf.iter_notes(head[p.offset : p.offset + p.filesz]):
            try:
                if note.type == elf.NT_PRSTATUS and pc is None:
                    t = elf.parse_prstatus(note.desc, spec)
                    pc, signal = t.pc, t.signal
                elif note.type == elf.NT_FILE and not files:
                    files = elf.parse_nt_file(note.desc)
            except (ValueError, struct.error):  # a damaged note: the record's hint goes without it
                continue
    if pc is not None:
        for fm in files:
            if fm.start <= pc < fm.end:
                base = min((f.start for f in files if f.path == fm.path and f.offset == 0), default=fm.start)
                module, module_offset = fm.path, pc - base
                break
    return CrashSite(signal=signal, pc=pc, module=module, module_offset=module_offset)


def _crash_loop_key(key: str, signo: int, site: CrashSite) -> str:
    """What makes two cores "the same crash again" for the budget: the container image, the signal and
    the crashing pc's module and offset (read from the core's first bytes, without analysis).  Not
    analyze's fingerprint, which is computed from the whole analysis."""
    module = (site.module or "?").rsplit("/", 1)[-1]
    basis = f"{key}|{signo}|{module}|{site.module_offset}"
    return hashlib.sha256(basis.encode()).hexdigest()[:12]


def _crash_dir(core_dir: str, t: float, pid: int, signame: str) -> str:
    """A new directory for this crash under ``DIR/crashes`` (never an existing one)."""
    from ..bundle.write import new_bundle_dir

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
    return new_bundle_dir(os.path.join(core_dir, layout.CRASHES), f"{stamp}-{pid}-{signame}")


#: the largest mapped object stored (libtorch_cuda.so is 1-2 GB); a larger file mapped by the crashed process
#: (the container's to choose, a sparse one costs it nothing) is named in the record, not copied
_MEMFD = "/memfd:"  # how /proc/PID/maps names a memfd_create(2) file: memory, in no image, any size
_SPARSE_SLACK = 1 << 20  # holes a mapped file may have and still be copied (a library's file has none)


def _not_copied_why(path: str, fd: int, cfg: HandlerConfig) -> str | None:
    """Why a mapped object is kept by build-id and size only, not copied into the store: a memfd, a sparse file
    (one whose holes hide how large it is: a process can map terabytes of them), or one over
    ``cfg.max_object_size``; None to copy it."""
    from .store import data_bytes

    size = os.fstat(fd).st_size
    if path.startswith(_MEMFD):
        return "a memfd (memory, in no image)"
    if size > cfg.max_object_size:
        return f"{size} bytes, over max_object_size {cfg.max_object_size}"
    holes = size - data_bytes(fd)
    if holes > max(_SPARSE_SLACK, size // 16):
        return f"sparse ({holes} of its {size} bytes are holes)"
    return None


class _ObjectRoom:
    """What one crash may still add to the object store: each object at most ``cfg.max_object_size`` long, together
    at most ``cfg.max_objects`` bytes of data new to the store, none that would leave less than ``cfg.min_free``
    free or take the directory over ``cfg.budget``; a store that has it already costs nothing."""

    def __init__(self, store, cfg: HandlerConfig, core_dir: str, warnings: list) -> None:
        self.store, self.cfg, self.core_dir, self.warnings = store, cfg, core_dir, warnings
        self.added = 0  # disk taken by this crash's new copies (holes kept)
        self.data_added = 0
        self.usage: int | None = None  # the directory's, read once when a budget is set
        self.hashed = 0  # bytes read to key the objects without a build-id

    def fits(self, fd: int, key: str, what: str) -> bool:
        from .store import data_bytes, disk_usage

        cfg = self.cfg
        if self.store.has(key):
            return True
        size = os.fstat(fd).st_size
        if size > cfg.max_object_size:
            self.warnings.append(f"{what}: {size} bytes, over max_object_size {cfg.max_object_size}: not stored")
            return False
        data = data_bytes(fd)  # what a copy takes: a sparse file's holes stay holes
        why = None
        if self.data_added + data > cfg.max_objects:
            why = f"{data} bytes of data would take this crash's objects over {cfg.max_objects}"
        elif cfg.min_free > 0 and free_bytes(self.core_dir) - data < cfg.min_free:
            why = f"{data} bytes would leave less than {cfg.min_free} free"
        elif cfg.budget > 0:
            if self.usage is None:
                self.usage = disk_usage(self.core_dir)
            if self.usage + self.added + data > cfg.budget:
                why = f"{data} bytes would take {self.core_dir} over its budget {cfg.budget}"
        if why:
            self.warnings.append(f"{what}: {why}: not stored")
        return why is None

    def hashed_key(self, fd: int, what: str) -> str | None:
        """The store key of an object without a build-id (the sha256 of its bytes); None past ``cfg.max_objects``
        bytes hashed for this crash (a process mapping a thousand large files without one is not hashed for hours)."""
        from .store import key_of_fd

        size = os.fstat(fd).st_size
        if self.hashed + size > self.cfg.max_objects:
            self.warnings.append(f"{what}: no build-id, {size} bytes to hash over the {self.cfg.max_objects} "
                                 "bytes hashed a crash: not stored")
            return None
        self.hashed += size
        return key_of_fd(fd)

    def add(self, fd: int, key: str) -> None:
        from .store import data_bytes

        data = data_bytes(fd)
        n = self.store.add_from_fd(fd, key)
        if n:
            self.added += n
            self.data_added += data


def _copy_objects(store, fds, keys: dict, warnings: list, *, build_ids: dict[str, str | None], cfg: HandlerConfig,
                  core_dir: str, debug_fds=(), debug_keys: dict | None = None,
                  not_copied: dict | None = None) -> int:
    """The mapped objects, then their debug files, into the store, holes kept, as far as :class:`_ObjectRoom` lets.

    :param build_ids: the snapshot's build-id of each object (not read again); an object without one is keyed by
        the sha256 of its bytes
    :param not_copied: filled with the objects kept by build-id and size only (:func:`_not_copied_why`): neither
        hashed nor copied
    :return: the disk the new copies take (the record's ``objects_bytes``)
    """
    room = _ObjectRoom(store, cfg, core_dir, warnings)
    for entry, fd in fds:
        path = entry.path[: -len(" (deleted)")] if entry.deleted else entry.path
        try:
            why = _not_copied_why(path, fd, cfg)
            if why is not None:
                if not_copied is not None:
                    not_copied[entry.path] = {"build_id": build_ids.get(path), "size": os.fstat(fd).st_size,
                                              "why": why}
                warnings.append(f"object {path}: {why}: kept by build-id and size only")
                continue
            key = build_ids.get(path) or room.hashed_key(fd, f"object {path}")
            if key and room.fits(fd, key, f"object {path}"):
                room.add(fd, key)
                keys[entry.path] = key
        except OSError as e:
            warnings.append(f"object {path}: {e.strerror or e}")
    for path, build_id, fd in debug_fds:  # after the objects: a debug file is worth less than its object
        try:
            if room.fits(fd, f"{build_id}.debug", f"debug file of {path}"):
                room.add(fd, f"{build_id}.debug")
                if debug_keys is not None:
                    debug_keys[path] = f"{build_id}.debug"
        except OSError as e:
            warnings.append(f"debug file of {path}: {e.strerror or e}")
    return room.added


def run_core_handler(
    core_dir: str,
    pid: int,
    tid: int,
    signo: int,
    timestamp: float,
    rlimit_core: int | None,
    *,
    stdin_fd: int = 0,
    config: HandlerConfig | None = None,
    host_root: str = "/",
    argument_problems: list[str] | tuple[str, ...] = (),
) -> HandlerResult:
    """Handle one core.  Never raises for a problem with the crash; always drains ``stdin_fd``.

    :param rlimit_core: ``%c`` (None: unlimited / not given)
    :param argument_problems: what was wrong with the kernel's arguments (a bad ``%t`` replaced by the
        handler's clock...): recorded with the crash
    """
    result = HandlerResult()
    result.warnings.extend(f"argument: {p}" for p in argument_problems)
    object_fds: list = []
    held: list[_Crash] = []
    req = _Request(core_dir=core_dir, pid=pid, tid=tid, signo=signo, timestamp=timestamp, rlimit_core=rlimit_core,
                   stdin_fd=stdin_fd, host_root=host_root)
    try:
        _handle(req, config, result, object_fds, held)
    except BaseException as e:  # noqa: BLE001 - the dying process must never wait on us
        result.warnings.append(f"handler failed: {type(e).__name__}: {e}")
        log_kernel(f"pid {pid} signal {signo}: handler failed: {type(e).__name__}: {e}"
                   + (f" (what was saved is in {result.crash_dir})" if result.crash_dir else ""))
        if result.core_state in (CoreState.NONE, CoreState.PENDING):
            result.core_state = CoreState.FAILED
        with contextlib.suppress(Exception):  # the record is best effort here: the kernel log line says it
            _record_failure(req, held[0] if held else None, result, e)
    finally:
        result.bytes_in += drain(stdin_fd)
        release_pipe(stdin_fd)
        for crash in held:
            release(crash.reservation)
            if crash.core_fd >= 0:  # reserved, never streamed into (the handler failed first): its room goes back
                with contextlib.suppress(OSError):
                    os.close(crash.core_fd)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(crash.crash_dir, layout.CORE_DIR, layout.CORE_TMP))
        for _, fd in object_fds:
            with contextlib.suppress(OSError):  # read-only descriptors: nothing is lost if close fails
                os.close(fd)
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    """One core the kernel pipes: what core_pattern's %P %I %s %t %c said, and where it goes."""

    core_dir: str
    pid: int
    tid: int
    signo: int
    timestamp: float
    rlimit_core: int | None
    stdin_fd: int
    host_root: str


@dataclass
class _Crash:
    """A crash being handled: its directory, bundle and record, filled stage by stage."""

    req: _Request
    cfg: HandlerConfig
    result: HandlerResult
    object_fds: list
    signame: str
    crash_dir: str
    bundle: BundleWriter
    reserve: str | None = None  # room kept for the end of a kept core's frame on a full disk
    snapshot: Snapshot | None = None
    raw: RawProcFiles | None = None  # /proc/PID as read (for the bundle, and for the imports after the core)
    image_os: str | None = None  # the process's /etc/os-release
    image_key: str = "unknown"
    held_root: str | None = None  # /proc/self/fd/N: the process's root, held (with its mount namespace) after it
    held_error: str | None = None  # why it could not be held
    record: CrashRecord | None = None  # written before the core streams in (stage 2), rewritten at the end
    head: bytes = b""  # the core's first bytes, to the end of its program headers: read before the decision
    reservation: str | None = None  # DIR/.reservations/...: this handler keeps a core (the crash-loop limit counts it)
    core_fd: int = -1  # the core's file, its room reserved under the lock (stage 2), until stage 3 takes it
    why: list[str] = field(default_factory=list)  # why the core is not whole (or not kept)

    @property
    def crash_id(self) -> str:
        return os.path.basename(self.crash_dir)

    @property
    def identity(self) -> ContainerIdentity | None:
        return self.snapshot.identity if self.snapshot else None

    def write_record(self) -> None:
        from ..bundle.write import write_atomic

        assert self.record is not None
        # the warnings as they are now: each rewrite carries those added since
        rec = replace(self.record, warnings=tuple(self.result.warnings))
        path = os.path.join(self.crash_dir, layout.RECORD)
        data = json.dumps(rec.to_json(), indent=2, sort_keys=True, default=str).encode()
        try:
            write_atomic(path, data)
        except OSError as e:  # no inode for the temporary name: the record there rewritten in place
            if not _no_room(e) or not os.path.exists(path) or _inodes_free(self.crash_dir) != 0:
                raise
            _write_in_place(path, data)

    def shorten_core(self, bytes_compressed: int) -> None:
        """The saved core was cut to make room for the metadata: the record says so."""
        assert self.record is not None
        self.record = replace(self.record, core=self.record.core.shortened(bytes_compressed))


@dataclass
class _Streamed:
    """What stage 3 leaves: the core's file name (None: not kept), its first bytes' facts, the objects stored."""

    core_name: str | None = None
    head_info: CrashSite = field(default_factory=CrashSite)
    keys: dict[str, str] = field(default_factory=dict)
    debug_keys: dict[str, str] = field(default_factory=dict)
    not_copied: dict[str, dict] = field(default_factory=dict)  # objects kept by build-id and size only
    sha256: str | None = None
    stream: StreamVerdict | None = None  # what the kernel sent, against the core's own program headers
    objects_bytes: int = 0  # disk the objects and debug files stored new for this crash take


def _handle(req: _Request, config: HandlerConfig | None, result: HandlerResult, object_fds: list,
            held: list[_Crash]) -> None:
    # while the kernel waits (the dying process exists until its core is read), only what every crash's record
    # needs, then the decision, then for a kept core the hold on its root and the core itself; what a kept core
    # adds (objects, debug files, the Python imports, nvidia-smi) comes once the core is written and the pipe let go
    crash = _open_crash(req, config, result, object_fds)
    held.append(crash)
    _read_process(crash)  # 1. /proc/PID while it exists: the record's facts (bounded reads)
    crash.head = _read_head(req.stdin_fd)  # the core's own size, from its program headers
    keep = _decide(crash)  # 2. keep the core?
    _first_record(crash, keep)  # the record, written before the core: partial evidence survives a killed handler
    if keep:
        _hold_process(crash)  # its root and mount namespace, for what is read of it after the core
    streamed = _stream(crash, keep)  # 3. stream it
    _after_core(crash, streamed)  # the kept core's objects, debug files, Python imports; the node's side
    _finish(crash, streamed)  # 4. the record, the manifest, the index, the budget


def _open_crash(req: _Request, config: HandlerConfig | None, result: HandlerResult, object_fds: list) -> _Crash:
    from ..core.elf import signal_name
    from ..bundle.write import BundleWriter

    cfg = config or load_config(req.core_dir)
    signame = signal_name(req.signo) if req.signo else "SIG0"
    os.makedirs(req.core_dir, exist_ok=True)
    crash_dir = _crash_dir(req.core_dir, req.timestamp, req.pid, signame)
    result.crash_dir = crash_dir
    return _Crash(req=req, cfg=cfg, result=result, object_fds=object_fds, signame=signame, crash_dir=crash_dir,
                  bundle=BundleWriter(crash_dir))


def _read_process(crash: _Crash) -> None:
    """Stage 1: what every crash's record holds, read from /proc/PID while it exists (each read bounded, each file
    once): the snapshot (identity, limits, mapped objects with build-ids; a Python process's imports are left for
    after the core) and the image's os-release.  Nothing is written yet: the decision comes first."""
    from .snapshot import RawProcFiles, open_mapped_objects, read_snapshot
    from ..procfs import parse_maps, read_proc_text

    req, warnings = crash.req, crash.result.warnings
    pid = req.pid
    crash.raw = raw = RawProcFiles()
    try:
        maps_text = read_proc_text(pid, "maps", cut=warnings)
        crash.object_fds.extend(open_mapped_objects(pid, parse_maps(maps_text), warnings))
        crash.snapshot = read_snapshot(pid, host_root=req.host_root, object_fds=crash.object_fds, raw=raw,
                                       maps_text=maps_text, skip_python_modules=_MODULES_LATER)
    except Exception as e:  # noqa: BLE001 - metadata is best effort; the core still matters
        warnings.append(f"/proc/{pid}: {type(e).__name__}: {e}")
    try:
        from .node import read_os_release

        crash.image_os = read_os_release(f"/proc/{pid}/root")  # the image's distribution, while the process exists
    except Exception as e:  # noqa: BLE001
        warnings.append(f"/proc/{pid}/root/etc/os-release: {type(e).__name__}: {e}")
    crash.image_key = _image_key(crash.snapshot)


_MODULES_LATER = "looked for once the core is kept and written"
_MODULES_DROPPED = "not looked for: the core was not kept (metadata only)"


def _first_record(crash: _Crash, keep: bool) -> None:
    """The record, identity and process snapshot as stage 1 read them, written before the core is streamed."""
    import dataclasses

    from .snapshot import snapshot_payload

    req, warnings, bundle, raw = crash.req, crash.result.warnings, crash.bundle, crash.raw
    if not keep and crash.snapshot is not None and crash.snapshot.python is not None:
        crash.snapshot = dataclasses.replace(crash.snapshot, python=dataclasses.replace(
            crash.snapshot.python, modules_skipped=_MODULES_DROPPED))
    snapshot, identity, pid = crash.snapshot, crash.identity, req.pid
    crash.record = CrashRecord(
        crash_id=crash.crash_id, pid=pid, tid=req.tid, signal=req.signo, signal_name=crash.signame,
        time=req.timestamp, rlimit_core=req.rlimit_core, node=socket.gethostname(), image_key=crash.image_key,
        identity=snapshot_payload(snapshot)["identity"] if snapshot else None, state=RecordState.IN_PROGRESS,
        core=CoreRecord(state=CoreState.PENDING), objects={}, config=dict(crash.cfg.__dict__),
        warnings=tuple(warnings))
    crash.write_record()  # first: a directory with no inode left for the other files still has its record
    said = len(warnings)
    with _unless_no_room(warnings, layout.IDENTITY):
        bundle.add_json(layout.IDENTITY, Identity(
            kind="crash", crash_id=crash.crash_id, node=crash.record.node, pid=pid, tid=req.tid,
            signal=crash.signame, time=req.timestamp, comm=snapshot.comm if snapshot else None,
            exe=snapshot.exe if snapshot else None, image=snapshot.image if snapshot else None,
            pod_uid=identity.pod_uid if identity else None, container_id=identity.container_id if identity else None,
            runtime=identity.runtime if identity else None,
        ).to_json(), "who crashed: node, pid, signal, pod UID, container ID, image, time")
    if snapshot is not None:
        with _unless_no_room(warnings, layout.PROCESS_SNAPSHOT):
            _write_snapshot(crash)
        for name, data in (raw.files.items() if raw else ()):
            with _unless_no_room(warnings, layout.process_file(name)):
                bundle.add_bytes(layout.process_file(name), data, f"/proc/PID/{name} as read at crash time")
    if crash.image_os is not None:
        with _unless_no_room(warnings, layout.PROCESS_OS_RELEASE):
            bundle.add_bytes(layout.PROCESS_OS_RELEASE, crash.image_os.encode(),
                             "the process's /etc/os-release (its image's distribution), read inside its root")
    if len(warnings) != said:
        crash.write_record()


def _no_room(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _inodes_free(path: str) -> int | None:
    try:
        return os.statvfs(path).f_favail
    except OSError:  # not known
        return None


@contextlib.contextmanager
def _unless_no_room(warnings: list[str], item: str):
    """A bundle item written unless the disk has no room (space or inodes) for it: then a warning, and on: the
    record and the core are worth more."""
    try:
        yield
    except OSError as e:
        if not _no_room(e):
            raise
        warnings.append(f"{item}: not written ({e.strerror or e}; out of space or of inodes)")


def _write_snapshot(crash: _Crash) -> None:
    from .snapshot import snapshot_payload

    assert crash.snapshot is not None
    crash.bundle.add_json(layout.PROCESS_SNAPSHOT, snapshot_payload(crash.snapshot),
                          "process snapshot at crash time: limits, cgroup identity, mapped objects with build-ids, "
                          "NVML origin, the Python modules it imports")


def _hold_process(crash: _Crash) -> None:
    """A kept core's process: hold its root and its mount namespace (descriptors only, nothing read), so that its
    debug files and Python imports are looked for after the core is written, the process gone, as it saw them
    (the namespace held keeps its mounts: volumes, injected libraries)."""
    pid = crash.req.pid
    try:
        ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        crash.object_fds.append((None, ns))  # closed with the objects
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        crash.object_fds.append((None, root))
    except OSError as e:  # gone already: its debug files and imports are not looked for (the record says why)
        crash.held_error = f"its root could not be held ({e.strerror or e})"
        return
    crash.held_root = f"/proc/self/fd/{root}"


def _after_core(crash: _Crash, streamed: _Streamed) -> None:
    """Once the core is written and the pipe let go: a kept core's mapped objects and their debug files into the
    store, its Python imports resolved in the root held for it; then the node's side (kernel log lines, nvidia-smi
    for a kept core).  The dying process no longer waits on any of this."""
    from .store import ObjectStore

    req, cfg, result = crash.req, crash.cfg, crash.result
    written = result.core_path is not None and result.core_state is not CoreState.NOT_A_CORE
    if written:
        mapped = [(entry, fd) for entry, fd in crash.object_fds if entry is not None]
        snapshot = crash.snapshot
        debug_fds: list[tuple[str, str, int]] = []
        if snapshot is not None:
            from .debugfiles import open_debug_files

            debug_fds = open_debug_files(req.pid, [(o.path, o.build_id) for o in snapshot.objects], req.host_root,
                                         process_root=crash.held_root or "")
            crash.object_fds.extend((None, fd) for _, _, fd in debug_fds)  # closed with the objects
        build_ids = {o.path: o.build_id for o in snapshot.objects} if snapshot else {}
        streamed.objects_bytes = _copy_objects(ObjectStore(req.core_dir), mapped, streamed.keys, result.warnings,
                                               build_ids=build_ids, cfg=cfg, core_dir=req.core_dir,
                                               debug_fds=debug_fds, debug_keys=streamed.debug_keys,
                                               not_copied=streamed.not_copied)
        _resolve_imports(crash)
    elif crash.snapshot is not None and crash.snapshot.python is not None and _modules_pending(crash.snapshot):
        import dataclasses

        why = ("not looked for: the stream was not a core" if result.core_state is CoreState.NOT_A_CORE
               else "not looked for: no core was written")
        crash.snapshot = dataclasses.replace(crash.snapshot, python=dataclasses.replace(crash.snapshot.python,
                                                                                        modules_skipped=why))
        _write_snapshot(crash)
    _node_evidence(crash.bundle, result.warnings, nvidia_smi=result.core_path is not None, smi_timeout=cfg.smi_timeout,
                   pid=req.pid, host_root=req.host_root)


def _modules_pending(snapshot: Snapshot) -> bool:
    return snapshot.python is not None and snapshot.python.modules_skipped == _MODULES_LATER


def _resolve_imports(crash: _Crash) -> None:
    """A kept core's Python modules, as its process imports them, from the root held for it; the snapshot rewritten."""
    import dataclasses

    from .snapshot import resolve_python_modules

    snapshot = crash.snapshot
    if snapshot is None or not _modules_pending(snapshot) or crash.raw is None:
        return
    if crash.held_root is None:
        assert snapshot.python is not None
        crash.snapshot = dataclasses.replace(snapshot, python=dataclasses.replace(
            snapshot.python, modules_skipped=f"not looked for: {crash.held_error or 'its root was not held'}"))
    else:
        try:
            crash.snapshot = resolve_python_modules(snapshot, crash.raw, crash.held_root)
        except Exception as e:  # noqa: BLE001 - evidence is best effort; the core and record matter more
            crash.result.warnings.append(f"Python imports: {type(e).__name__}: {e}")
            return
    _write_snapshot(crash)


def _image_key(snapshot) -> str:
    """The container image, else the executable's build-id (else its path): what a crash loop repeats."""
    if snapshot is None:
        return "unknown"
    if snapshot.image:
        return snapshot.image
    exe_obj = next((o for o in snapshot.objects if o.path == snapshot.exe), None)
    return f"exe:{exe_obj.build_id}" if exe_obj and exe_obj.build_id else f"exe:{snapshot.exe}"


def _decide(crash: _Crash) -> bool:
    """Stage 2: keep the core, or metadata only (RLIMIT_CORE under a page, a crash loop, too little free space)."""
    req, why = crash.req, crash.why
    keep = True
    if req.rlimit_core is not None and req.rlimit_core < PAGE:
        keep = False
        why.append(f"RLIMIT_CORE {req.rlimit_core} < one page: metadata only (the process was not opted in)")
    # the lock only when the index or the free space is read: a crash RLIMIT_CORE drops does not wait for another
    # handler's budget pass
    if keep:
        with DirLock(req.core_dir):
            keep = _reserve_under_lock(crash)
    crash.result.reasons.extend(why)
    return keep


def _loop_id(crash: _Crash) -> str:
    """What the crash-loop limit counts: the image and the signal (a process cannot multiply it by its crash site)."""
    return hashlib.sha256(f"{crash.image_key}|{crash.req.signo}".encode()).hexdigest()[:12]


def _core_bound(crash: _Crash) -> tuple[int, str]:
    """The most bytes the compressed core can take (its own program headers' size, else the size bound), and how
    that was known."""
    req, cfg = crash.req, crash.cfg
    limit = cfg.max_core_size
    if req.rlimit_core is not None and req.rlimit_core >= PAGE:
        limit = min(limit, req.rlimit_core)
    expected = expected_core_bytes(crash.head)
    if expected is not None and expected <= limit:
        return compressed_bound(expected), f"a core of {expected:,} bytes"
    return compressed_bound(limit), f"a core of unknown size (at most {limit:,} bytes kept)"


def _reserve_under_lock(crash: _Crash) -> bool:
    """Under the directory lock: the crash-loop limit counted with the cores being written now, the free space
    with the room they reserved, and, for a kept core, its room reserved (its file made at its bound) before the
    lock goes: two crashes at once never both take the last core of the limit or the last bytes of the disk."""
    req, cfg, why = crash.req, crash.cfg, crash.why
    running = live_reservations(req.core_dir)
    if cfg.loop_limit >= 0:
        since = req.timestamp - cfg.loop_window
        n = sum(1 for e in read_index_since(req.core_dir, since)
                if e.key == crash.image_key and e.signal == req.signo and e.core and (e.time or 0) >= since)
        now = sum(1 for loop, _ in running if loop == _loop_id(crash))
        if n + now >= cfg.loop_limit:
            why.append(f"crash loop: {n} cores of {crash.image_key} {crash.signame} in the last {cfg.loop_window}s"
                       + (f" and {now} being written" if now else "") + f" (limit {cfg.loop_limit}): metadata only")
            return False
    bound, what = _core_bound(crash)
    if cfg.min_free > 0:
        free = free_bytes(req.core_dir)
        if free - bound - RESERVE < cfg.min_free:
            why.append(f"{free} bytes free on {req.core_dir}: {what} (up to {bound:,} compressed) would leave it "
                       f"below the minimum {cfg.min_free} (cores being written hold their room): metadata only")
            return False
    try:
        crash.reservation = reserve(req.core_dir, _loop_id(crash), crash.crash_id)
        crash.core_fd = _open_core_file(crash, bound)
    except OSError as e:
        release(crash.reservation)
        crash.reservation = None
        why.append(f"no room to create the core's file on {req.core_dir} ({e.strerror or e}; out of space or of "
                   "inodes): metadata only")
        return False
    return True


def _open_core_file(crash: _Crash, bound: int) -> int:
    """The core's file, its room reserved at ``bound`` bytes (allocated, so that no other crash takes it); without
    ``--min-free`` a disk that cannot hold the bound still gets what fits (cut, as before: no minimum was asked)."""
    sub = os.path.join(crash.crash_dir, layout.CORE_DIR)
    os.makedirs(sub, exist_ok=True)
    tmp = os.path.join(sub, layout.CORE_TMP)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        _fallocate(fd, bound)
    except OSError as e:
        if crash.cfg.min_free > 0 and e.errno in (errno.ENOSPC, errno.EDQUOT):
            os.close(fd)
            os.unlink(tmp)
            raise
        os.ftruncate(fd, 0)
        crash.result.warnings.append(f"core: its room ({bound:,} bytes) not reserved ({e.strerror or e})")
    return fd


def _fallocate(fd: int, size: int) -> None:
    """fallocate(2), never glibc's posix_fallocate, which on a filesystem without it writes a byte every block
    (minutes for a 32 GiB bound, while the dying process waits): there it raises EOPNOTSUPP."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if libc.fallocate(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _read_head(fd: int) -> bytes:
    """The core's first bytes, to the end of its program headers (at most 4 MiB): its size, known before the
    decision.  The kernel writes the headers first; what is read here goes to the core like the rest."""
    head = bytearray()
    want = 64
    while len(head) < want:
        try:
            chunk = os.read(fd, min(_CHUNK, _HEAD - len(head)))
        except InterruptedError:  # a signal: read again
            continue
        if not chunk:
            break
        head += chunk
        end = headers_end(bytes(head[:64]))
        want = min(_HEAD, end) if end is not None else 64
    return bytes(head)


def _stream(crash: _Crash, keep: bool) -> _Streamed:
    """Stage 3: stdin through zstd (cut at the size bound), nothing else while the kernel waits."""
    req, cfg, result, why = crash.req, crash.cfg, crash.result, crash.why
    limit = cfg.max_core_size
    if req.rlimit_core is not None and req.rlimit_core >= PAGE:
        limit = min(limit, req.rlimit_core)
    out = _Streamed()
    core_dir_sub = os.path.join(crash.crash_dir, layout.CORE_DIR)
    with contextlib.suppress(OSError) if not keep else contextlib.nullcontext():  # (a kept core's is made)
        os.makedirs(core_dir_sub, exist_ok=True)  # empty for a dropped core; no inode left: no matter
    tmp = os.path.join(core_dir_sub, layout.CORE_TMP)
    comp = None
    out_fd = -1
    if keep:
        crash.reserve = make_reserve(os.path.join(crash.crash_dir, layout.RESERVE))
        out_fd, crash.core_fd = crash.core_fd, -1  # made, its room reserved, under the lock
        comp = Compressor(out_fd, cfg.level, cfg.threads, crash.reserve)
    try:
        head, cut, tail = _pump(req.stdin_fd, comp, limit, req.rlimit_core, result, why, pre=crash.head)
        out.head_info = parse_core_head(bytes(head))
        # what the kernel sent, against the core's own program headers: a stream that ended early, random
        # bytes or an empty stdin is never recorded as a whole core
        stream = out.stream = check_core_stream(bytes(head), result.bytes_in, tail)
        if comp is not None:
            whole_frame = comp.finish()
            os.ftruncate(out_fd, comp.out)  # the room reserved and not used goes back
            try:
                os.fsync(out_fd)
            except OSError as e:  # the core may not be whole on disk after a power loss: the record says so
                result.warnings.append(f"core: fsync failed ({e.strerror or e}): it may not be on disk whole")
            os.close(out_fd)
            out_fd = -1
            _name_core(crash, out, comp, stream, cut=cut, whole_frame=whole_frame, tmp=tmp)
        else:
            result.core_state = CoreState.METADATA_ONLY
    finally:
        if out_fd >= 0:
            os.close(out_fd)
        if os.path.exists(tmp):
            os.unlink(tmp)
    if comp is not None and comp.reserve_path:
        comp._release_reserve()
    elif crash.reserve and os.path.exists(crash.reserve):
        os.unlink(crash.reserve)
    return out


def _name_core(crash: _Crash, out: _Streamed, comp: Compressor, stream: StreamVerdict, *, cut: bool,
               whole_frame: bool, tmp: str) -> None:
    """The written core's name and state: whole, truncated, partial (no frame end) or not a core at all."""
    result, why = crash.result, crash.why
    if stream.reason:
        why.append(stream.reason)
    if not whole_frame:
        out.core_name, state = layout.CORE_PARTIAL, CoreState.PARTIAL
        if not any("disk filled up" in w for w in why):  # the compressor held its output until the end
            why.append(f"the disk filled up while the core was written ({comp.out} compressed bytes on "
                       "disk): the zstd frame could not be ended")
    elif stream.kind == "not-a-core":
        out.core_name, state = (layout.NOT_A_CORE if result.bytes_in else None), CoreState.NOT_A_CORE
    elif cut or stream.kind == "short":
        out.core_name, state = layout.CORE_TRUNCATED, CoreState.TRUNCATED
    else:
        out.core_name, state = layout.CORE_WHOLE, CoreState.KEPT
    result.core_state = state
    if out.core_name is None:
        return
    core_dir_sub = os.path.dirname(tmp)
    os.rename(tmp, os.path.join(core_dir_sub, out.core_name))
    result.bytes_out = comp.out
    result.core_path = os.path.join(core_dir_sub, out.core_name)
    out.sha256 = comp.sha.hexdigest()
    crash.bundle.note_file(layout.core_item(out.core_name), "what the kernel sent, zstd-compressed (not a core)"
                           if state is CoreState.NOT_A_CORE else f"the core, zstd-compressed ({state.value})")


def _pump(stdin_fd: int, comp: Compressor | None, limit: int, rlimit_core: int | None, result: HandlerResult,
          why: list[str], *, pre: bytes = b"") -> tuple[bytearray, bool, bytes]:
    """Read the core from the pipe to its end: the first bytes kept aside, at most ``limit`` into ``comp``.

    :param pre: the first bytes, read already (for the decision)
    :return: (the first bytes, whether the core was cut, the last bytes: where a PN_XNUM core's
        segment count is)
    """
    # a bigger pipe: fewer wake-ups of the dying process (only now: /proc/PID has been read, and a
    # core smaller than the pipe would let the process go before that)
    with contextlib.suppress(OSError):  # above the node's pipe-max-size: the default pipe works, more slowly
        fcntl.fcntl(stdin_fd, _F_SETPIPE_SZ, _CHUNK)
    head = bytearray()
    buf = bytearray(max(_CHUNK, len(pre)))
    view = memoryview(buf)
    cut = False
    tail = b""
    buf[: len(pre)] = pre
    pending = len(pre)
    while True:
        if pending:
            k, pending = pending, 0
        else:
            try:
                k = os.readv(stdin_fd, [buf])
            except InterruptedError:  # a signal: read again
                continue
            if k <= 0:
                release_pipe(stdin_fd)
                return head, cut, tail
        result.bytes_in += k
        if len(head) < _HEAD:
            head += view[: min(k, _HEAD - len(head))]
        tail = bytes(view[k - TAIL: k]) if k >= TAIL else (tail + bytes(view[:k]))[-TAIL:]
        if comp is None or cut:
            continue
        take = min(k, limit - result.bytes_kept)
        if take > 0:
            if not comp.feed(view[:take]):
                cut = True
                why.append(f"the disk filled up after {result.bytes_kept + take} bytes of core")
            result.bytes_kept += take
        if take < k and not cut:
            cut = True
            why.append(f"core cut at {limit} bytes (maximum core size"
                       + (" / RLIMIT_CORE" if limit == rlimit_core else "") + ")")


def _finish(crash: _Crash, streamed: _Streamed) -> None:
    """Stage 4: the record, the manifest, the index entry, the budget; one line to the kernel log."""
    req, result, record, why, bundle = crash.req, crash.result, crash.record, crash.why, crash.bundle
    snapshot, identity, stream = crash.snapshot, crash.identity, streamed.stream
    assert stream is not None  # stage 3 judges every stream before it returns
    crash_loop_key = _crash_loop_key(crash.image_key, req.signo, streamed.head_info)
    assert record is not None  # written before the core
    crash.record = replace(
        record, state=RecordState.DONE, crash_loop_key=crash_loop_key, crash_pc=streamed.head_info,
        objects=streamed.keys or ({o.path: o.build_id for o in snapshot.objects if o.build_id} if snapshot else {}),
        debug_files=dict(streamed.debug_keys), objects_bytes=streamed.objects_bytes,
        objects_not_copied=dict(streamed.not_copied) or None,
        core=CoreRecord(state=result.core_state, file=streamed.core_name, bytes_in=result.bytes_in,
                        bytes_kept=result.bytes_kept, bytes_compressed=result.bytes_out,
                        sha256_compressed=streamed.sha256 if streamed.core_name else None, reasons=tuple(why),
                        stream=CoreStream(kind=stream.kind, bytes=stream.size, expected_bytes=stream.expected,
                                          reason=stream.reason)))

    def rewrite(bytes_compressed: int) -> None:  # the core shortened after the record was written: rewritten
        crash.shorten_core(bytes_compressed)
        crash.write_record()

    with_room(crash.write_record, result, crash.shorten_core)
    bundle.note_file(layout.RECORD, "the handler's record: decision, sizes, crash-loop key, objects by build-id")
    for rel in [r for r in bundle.items if r.startswith(layout.core_item(""))]:
        del bundle.items[rel]
    if result.core_path:  # the name may have changed to make room for the metadata
        bundle.note_file(layout.core_item(os.path.basename(result.core_path)),
                         f"the core, zstd-compressed ({result.core_state.value})")
    try:
        with_room(lambda: bundle.write_manifest({"crash_id": crash.crash_id}), result, rewrite)
    except OSError as e:
        result.warnings.append(f"manifest: {e}")

    def entry() -> IndexEntry:  # from the record as it is when written (a shortened core has its new name)
        assert crash.record is not None
        core = crash.record.core
        return IndexEntry(id=crash.crash_id, time=req.timestamp, pid=req.pid, signal=req.signo, key=crash.image_key,
                          crash_loop_key=crash_loop_key, core=core.file, state=core.state, reasons=core.reasons,
                          pod_uid=identity.pod_uid if identity else None,
                          container_id=identity.container_id if identity else None)

    with DirLock(req.core_dir):
        with_room(lambda: append_index(req.core_dir, entry()), result, rewrite)
        release(crash.reservation)  # its core counted by the index now, under the same lock
        crash.reservation = None
        deleted = enforce_budget(req.core_dir, crash.cfg.budget, object_grace=crash.cfg.object_grace)
    if deleted:
        result.reasons.append(f"budget: deleted the cores of {', '.join(deleted)}")
    reasons = crash.record.core.reasons
    log_kernel(f"pid {req.pid} ({snapshot.comm if snapshot else '?'}) {crash.signame}: core {result.core_state.value}"
               f" in {crash.crash_dir}" + (f" ({'; '.join(reasons)})" if reasons else ""), level=6)


def _record_failure(req: _Request, crash: _Crash | None, result: HandlerResult, err: BaseException) -> None:
    """The handler failed (a disk out of space or inodes...): the crash's record finished with the reason and its
    index line appended, never left ``in-progress``; on a disk with no inode left the record is rewritten in place."""
    why = f"the handler failed: {type(err).__name__}: {err}"
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        why += " (out of space or of inodes)"
    core_file = os.path.basename(result.core_path) if result.core_path else None
    reasons = (*(crash.why if crash else ()), why)
    if crash is not None and crash.record is not None:
        crash.record = replace(crash.record, state=RecordState.DONE, core=replace(
            crash.record.core, state=result.core_state, file=core_file, bytes_in=result.bytes_in,
            bytes_kept=result.bytes_kept, bytes_compressed=result.bytes_out, reasons=reasons))
        try:
            crash.write_record()
        except OSError:  # no inode for the temporary name: the record rewritten in place (if it was ever made)
            rec = replace(crash.record, warnings=tuple(result.warnings))
            with contextlib.suppress(OSError):  # never made: the index line says it
                _write_in_place(os.path.join(crash.crash_dir, layout.RECORD),
                                json.dumps(rec.to_json(), indent=2, sort_keys=True, default=str).encode())
    crash_id = crash.crash_id if crash else f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(req.timestamp))}-{req.pid}"
    entry = IndexEntry(id=crash_id, time=req.timestamp, pid=req.pid, signal=req.signo,
                       key=crash.image_key if crash else None, crash_loop_key=None, core=core_file,
                       state=result.core_state, reasons=reasons)
    with DirLock(req.core_dir):
        append_index(req.core_dir, entry)
        if crash is not None:
            release(crash.reservation)
            crash.reservation = None


def _write_in_place(path: str, data: bytes) -> None:
    """Overwrite an existing file without a new inode (a directory out of inodes); not atomic."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _node_evidence(bundle, warnings: list, *, nvidia_smi: bool, smi_timeout: float, pid: int | None = None,
                   host_root: str = "/") -> None:
    """The node's os-release and the driver's kernel log lines (always: cheap, non-blocking reads),
    ``nvidia-smi -q`` for kept cores.

    nvidia-smi is skipped for metadata-only crashes so that a crash loop does not run it hundreds of times;
    nvidia-bug-report.sh (minutes) is left to ``capture --pid`` / ``--pod``, which do not run in the
    kernel's crash path.
    """
    from .node import read_kernel_log, read_nvidia_smi, read_os_release, redacted

    try:
        node_os = read_os_release(host_root)
        if node_os is not None:
            bundle.add_bytes(layout.NODE_OS_RELEASE, node_os.encode(), "the node's /etc/os-release")
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the core and record matter more
        warnings.append(f"os-release: {type(e).__name__}: {e}")
    try:
        lines = read_kernel_log(pid=pid)
        bundle.add_bytes(layout.KERNEL_LOG, redacted("\n".join(lines) + "\n"),
                         "kernel log lines at crash time: the NVIDIA driver's (NVRM, Xid, its modules), this "
                         "process's fault")
    except Exception as e:  # noqa: BLE001 - evidence is best effort; the core and record matter more
        warnings.append(f"kernel log: {type(e).__name__}: {e}")
    if not nvidia_smi:
        return
    try:
        smi = read_nvidia_smi(timeout=smi_timeout)
        if smi is not None:
            bundle.add_bytes(layout.NVIDIA_SMI, redacted(smi), "nvidia-smi -q at crash time, secrets masked")
    except Exception as e:  # noqa: BLE001
        warnings.append(f"nvidia-smi: {type(e).__name__}: {e}")


def _parse_limit(value: str | None) -> int | None:
    if value in (None, "", "-1", "unlimited", str(2**64 - 1)):
        return None
    try:
        v = int(value)
    except ValueError:  # not a number: no limit known (as "unlimited")
        return None
    return None if v < 0 or v >= 2**63 else v
