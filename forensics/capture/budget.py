"""The core directory's crash index and its disk budget (used by the core handler).

``DIR/index.jsonl`` lists every crash the handler saw (appended under a lock);
:func:`enforce_budget` deletes the oldest cores when the directory is over its
budget, keeping all metadata, the newest core of each crash-loop key while they fit and the newest core of
each image always, then the stored objects that no remaining core uses.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import replace

from ..bundle.layout import CORE_DIR, CORE_TMP, CRASHES, INDEX, OBJECTS, RECORD, RESERVATIONS
from ..bundle.record import BudgetEvent, CoreState, CrashRecord, IndexEntry, RecordState, parse_index_line
from ..bundle.write import write_atomic
from .store import disk_usage

__all__ = ["enforce_budget", "collect_objects", "read_index", "read_index_since", "append_index", "free_bytes",
           "DirLock", "INDEX_SLACK", "INDEX_TAIL_MAX", "reserve", "release", "live_reservations", "start_time"]


class DirLock:
    def __init__(self, core_dir: str) -> None:
        self.fd = os.open(os.path.join(core_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def start_time(pid: int) -> str | None:
    """``/proc/PID/stat``'s start time (clock ticks since boot): with the pid, what names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
    except OSError:  # no such process
        return None
    fields = data[data.rfind(b")") + 2:].split()  # after the comm, which may hold spaces and parentheses
    return fields[19].decode() if len(fields) > 19 else None


def reserve(core_dir: str, loop: str, crash_id: str) -> str:
    """Say, under the directory lock, that this handler keeps a core of crash-loop count ``loop``: its file in
    ``DIR/.reservations``, named by the handler's pid and start time (a dead handler's is reclaimed).

    :raises OSError: when the file cannot be made (no inode left): the caller keeps metadata only
    """
    d = os.path.join(core_dir, RESERVATIONS)
    os.makedirs(d, exist_ok=True)
    me = os.getpid()
    path = os.path.join(d, f"{me}-{start_time(me)}-{loop}-{crash_id}")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


def release(path: str | None) -> None:
    """The handler is done (its index line appended): its reservation goes."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def live_reservations(core_dir: str) -> list[tuple[str, str]]:
    """``(loop, crash id)`` of each handler alive that keeps a core.  Call with the directory lock held.

    A reservation whose handler is gone (killed mid-stream: its pid no longer runs with that start time) is
    reclaimed: its unfinished core file (the space reserved for it) is deleted, its record finished as failed
    and its index line appended, so it neither holds the disk nor counts against the crash-loop limit for ever.
    """
    d = os.path.join(core_dir, RESERVATIONS)
    try:
        names = os.listdir(d)
    except FileNotFoundError:  # no core kept yet
        return []
    out: list[tuple[str, str]] = []
    for name in names:
        parts = name.split("-", 3)
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        pid, started, loop, crash_id = parts
        if start_time(int(pid)) == started:
            out.append((loop, crash_id))
            continue
        _reclaim(core_dir, crash_id, int(pid))
        release(os.path.join(d, name))
    return out


def _reclaim(core_dir: str, crash_id: str, pid: int) -> None:
    """A dead handler's crash: its half-written core deleted, its record and index line say so."""
    if "/" in crash_id or crash_id in (".", ".."):
        return
    crash = os.path.join(core_dir, CRASHES, crash_id)
    with contextlib.suppress(OSError):  # not made yet, or gone: nothing to give back
        os.unlink(os.path.join(crash, CORE_DIR, CORE_TMP))
    why = f"the core handler (pid {pid}) ended before it finished this crash: its unfinished core was deleted"
    rec = None
    with contextlib.suppress(OSError, ValueError), open(os.path.join(crash, RECORD)) as f:  # none: the index says it
        rec = CrashRecord.from_json(json.load(f))
    if rec is not None:
        rec = replace(rec, state=RecordState.DONE, core=replace(rec.core, state=CoreState.FAILED, file=None,
                                                                reasons=(*rec.core.reasons, why)))
        with contextlib.suppress(OSError):  # the index line still says it
            write_atomic(os.path.join(crash, RECORD), json.dumps(rec.to_json(), indent=2, sort_keys=True).encode())
    with contextlib.suppress(OSError):  # a full disk: the next pass of a live handler finds nothing more to do
        append_index(core_dir, IndexEntry(id=crash_id, time=rec.time if rec else None, pid=rec.pid if rec else None,
                                          signal=rec.signal if rec else None, key=rec.image_key if rec else None,
                                          crash_loop_key=None, core=None, state=CoreState.FAILED, reasons=(why,)))


def read_index(core_dir: str) -> list[IndexEntry | BudgetEvent]:
    """Every line of the index, oldest first: crashes' entries and budget passes (damage skipped)."""
    out: list[IndexEntry | BudgetEvent] = []
    try:
        with open(os.path.join(core_dir, INDEX), "rb") as f:
            for line in f:
                try:
                    e = parse_index_line(json.loads(line))
                except ValueError:  # a line torn by a handler killed mid-append: the others still count
                    continue
                if e is not None:
                    out.append(e)
    except FileNotFoundError:  # no crash yet
        pass
    return out


#: how much older than the window an entry may be and still follow a newer one in the index: a handler appends
#: its entry when it is done, after its crash's time by the time it took (a 32 GiB core streams for minutes)
INDEX_SLACK = 3600.0
INDEX_TAIL_MAX = 64 << 20  # bytes of the index read back from its end for one decision
_INDEX_LINE_MAX = 64 << 10  # an entry is a few hundred bytes: a longer "line" is damage, skipped


def read_index_since(core_dir: str, since: float, *, slack: float = INDEX_SLACK,
                     max_bytes: int = INDEX_TAIL_MAX) -> list[IndexEntry]:
    """The index's crash entries from its end back to the first one older than ``since - slack``, newest first.

    The core handler's decision while the kernel waits: the whole index (one line per crash, kept for ever:
    12,000 crashes of a crash loop are 6 MB, 100 ms to parse) is not read, only its tail, at most ``max_bytes``
    (past that, an older entry of the window is not counted: the crash-loop limit keeps a core more, never
    fewer).  A torn or overlong line is skipped.
    """
    out: list[IndexEntry] = []
    try:
        fd = os.open(os.path.join(core_dir, INDEX), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # no crash yet
        return out
    try:
        end = os.fstat(fd).st_size
        pos, carry, read = end, b"", 0
        while pos > 0 and read < max_bytes:
            n = min(1 << 20, pos, max_bytes - read)
            pos -= n
            read += n
            lines = (os.pread(fd, n, pos) + carry).split(b"\n")
            carry = b""
            if pos > 0 and b"\0" not in lines[0]:
                carry = lines.pop(0)  # the start of a line that began before this piece
                if len(carry) > _INDEX_LINE_MAX:
                    carry = b""  # no entry is this long: damage, dropped
            for line in reversed(lines):
                line = line[line.rfind(b"\0") + 1:]  # after zeros a crash left in the file (JSON has no NUL)
                if not line.strip() or len(line) > _INDEX_LINE_MAX:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:  # a line torn by a handler killed mid-append: the others still count
                    continue
                if not isinstance(e, dict):
                    continue
                t = e.get("time")
                if isinstance(t, (int, float)) and t < since - slack:
                    return out
                entry = IndexEntry.from_json(e)
                if entry is not None:
                    out.append(entry)
    finally:
        os.close(fd)
    return out


def append_index(core_dir: str, entry: IndexEntry | BudgetEvent) -> None:
    fd = os.open(os.path.join(core_dir, INDEX), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry.to_json(), sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize



def enforce_budget(core_dir: str, budget: int, *, object_grace: float = 3600.0) -> list[str]:
    """Delete the oldest cores until DIR fits ``budget``; the newest of each crash-loop key stays while the budget
    allows it, the newest of each image (or executable) always.

    Then, if DIR is still over budget, delete the stored objects that no remaining core uses
    (see :func:`collect_objects`).  Call with the directory lock held.  Metadata stays; each
    deleted core's record says so.
    :return: the crash ids whose core was deleted
    """
    if budget <= 0:
        return []
    total = disk_usage(core_dir)
    if total <= budget:
        return []
    deleted, unmarked, stuck = _delete_cores(core_dir, budget, total)
    freed = 0
    unreadable: list[str] = []
    if disk_usage(core_dir) > budget:
        freed = collect_objects(core_dir, grace=object_grace, unreadable=unreadable)
    if deleted or freed or stuck:
        # unmarked: their records still say "kept", the index is where the deletion is told; stuck: cores that
        # could not be deleted, the directory stays over its budget; unreadable: crashes whose objects were not
        # known to be in use when objects went
        append_index(core_dir, BudgetEvent(time=time.time(), deleted=tuple(deleted), objects_deleted=freed,
                                           records_not_updated=tuple(unmarked), not_deleted=tuple(stuck),
                                           records_unreadable=tuple(unreadable) if freed else ()))
    return deleted


def collect_objects(core_dir: str, *, grace: float = 3600.0, now: float | None = None,
                    unreadable: list[str] | None = None) -> int:
    """Delete stored objects that no crash with a core on disk names, unused for ``grace`` seconds.

    A handler copies objects before it writes its record, so a young unnamed object may belong
    to a crash still streaming: an object's mtime is refreshed whenever a crash uses it, and
    only objects older than ``grace`` go.  Leftover temporary copies older than ``grace`` go too.
    :param unreadable: filled with the crashes whose record could not be read (their objects count as unused)
    :return: the number of files deleted
    """
    now = time.time() if now is None else now
    used: set[str] = set()
    crashes = os.path.join(core_dir, CRASHES)
    try:
        names = os.listdir(crashes)
    except FileNotFoundError:  # no crash yet
        names = []
    for name in names:
        d = os.path.join(crashes, name)
        try:
            with open(os.path.join(d, RECORD)) as f:
                rec = CrashRecord.from_json(json.load(f))
        except (OSError, ValueError):
            rec = None
        if rec is None:
            if unreadable is not None:
                unreadable.append(name)
            continue
        if not rec.core.file or rec.core.state is CoreState.DELETED_FOR_BUDGET:
            continue
        used.update(rec.objects.values())
        used.update((rec.debug_files or {}).values())
    root = os.path.join(core_dir, OBJECTS)
    gone = 0
    for dirpath, _, files in os.walk(root):
        prefix = os.path.basename(dirpath)
        for name in files:
            p = os.path.join(dirpath, name)
            key = prefix + name
            try:
                if key in used or now - os.lstat(p).st_mtime < grace:
                    continue
                os.unlink(p)
                gone += 1
            except OSError:  # gone already (another handler's pass), or it stays until the next pass
                continue
    return gone


def _delete_cores(core_dir: str, budget: int, total: int) -> tuple[list[str], list[str], list[str]]:
    """(crash ids whose core was deleted, those of them whose record could not be marked so, those whose
    core could not be deleted: "ID: why")."""
    entries = [e for e in read_index(core_dir) if isinstance(e, IndexEntry) and e.core]
    newest: dict[str, str] = {}
    last: dict[str, str] = {}
    for e in entries:  # the index is in time order: the last of each crash-loop key wins
        newest[e.crash_loop_key or e.id] = e.id
        last[e.key or e.id] = e.id
    spared = set(newest.values())
    kept = set(last.values())
    # first the cores no crash-loop key needs, oldest first; then, while still over, the newest of each crash site
    # but the last of its image: a process that crashes at many sites on purpose (each site its own key) does not
    # hold the directory over its budget
    order = [e for e in entries if e.id not in spared] + [e for e in entries if e.id in spared and e.id not in kept]
    deleted: list[str] = []
    unmarked: list[str] = []
    stuck: list[str] = []
    for e in order:
        if total <= budget:
            break
        if e.core is None:
            continue
        core = os.path.join(core_dir, CRASHES, e.id, CORE_DIR, e.core)
        try:
            size = os.lstat(core).st_blocks * 512
            os.unlink(core)
        except FileNotFoundError:  # deleted by an earlier pass
            continue
        except OSError as err:
            stuck.append(f"{e.id}: {err.strerror or err}")
            continue
        total -= size
        deleted.append(e.id)
        if not _mark_core_deleted(os.path.join(core_dir, CRASHES, e.id)):
            unmarked.append(e.id)
    return deleted, unmarked, stuck


def _mark_core_deleted(crash_dir: str) -> bool:
    """Say in the crash's record that its core went for the budget; False when the record could not say it."""
    p = os.path.join(crash_dir, RECORD)
    try:
        with open(p) as f:
            doc = json.load(f)
        rec = CrashRecord.from_json(doc)
        if rec is None or not isinstance(doc.get("core"), dict):  # not a record it can say it in
            return False
        rec = replace(rec, core=rec.core.deleted_for_budget(time.time()))
        write_atomic(p, json.dumps(rec.to_json(), indent=2, sort_keys=True).encode())
    except (OSError, ValueError):  # told by the caller (records_not_updated)
        return False
    return True

