"""systemd-coredump's store (``/var/lib/systemd/coredump``) read as it is: compressed cores and the journal.

systemd-coredump keeps each core compressed as it was built and configured (``Compress=``: zstd, lz4
or xz), named ``core.COMM.UID.BOOTID.PID.USEC.EXT``, and writes what it knew of the process to the
journal (``COREDUMP_UNIT``, ``COREDUMP_CMDLINE``, ``COREDUMP_SIGNAL``, ``COREDUMP_CONTAINER_CMDLINE``...).

- :func:`find_codec`: whether a file is a compressed ELF core (its magic, then the first bytes it
  decompresses to say ``ET_CORE``): what lets a batch over the store find its cores.
- :func:`open_store_core`: the core decompressed into ``CACHE/coredump/<key>/core``, keyed by the file's
  identity (real path, device, inode, size, times), reused while the file is unchanged; never a byte
  written beside it.  Bounded: no more than the core's own program headers say it holds, nor
  ``FORENSICS_MAX_CORE_BYTES`` (256 GiB), nor what would leave less than 1 GiB free in the cache; entries
  past ``FORENSICS_COREDUMP_CACHE_BYTES`` (8 GiB) are deleted, least recently used first, never one used in
  the last hour.
- :func:`read_journal`: the journal entry systemd-coredump wrote for the file, through
  ``journalctl -o json COREDUMP_FILENAME=...`` (bounded in time and bytes), from the system journal or the
  journal files in ``FORENSICS_JOURNAL_DIR`` (a node's ``/var/log/journal`` copied with its store).
- :func:`journal_only_crashes`: the crashes systemd-coredump logged whose core the store does not hold --
  not stored (``Storage=none``, larger than ``ProcessSizeMax=``/``ExternalSizeMax=``), in the journal only
  (``Storage=journal``), or deleted since -- with what the journal says of each (signal, executable, the
  crashed thread's stack, why there is no core), as ``coredumpctl list`` shows them: the newest
  :data:`MAX_JOURNAL_CRASHES`, through ``journalctl -o json MESSAGE_ID=...`` (bounded in time and bytes).
"""
from __future__ import annotations

import contextlib
import json
import os
import stat

from .cache import cache_path, prune_lru
from .digest import sha256
from .errors import CacheUnavailable, CoreReadError, ForensicsError
from .model import BatchEntry, StoreEntry

__all__ = ["find_codec", "open_store_core", "prune_cache", "read_journal", "store_entry", "CODECS", "JOURNAL_FIELDS",
           "DEFAULT_CACHE_BYTES", "is_store", "journal_only_crashes", "MAX_JOURNAL_CRASHES"]

#: magic -> codec name, for the three systemd-coredump writes
CODECS = {b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4", b"\xfd7zXZ\x00": "xz"}
DEFAULT_CACHE_BYTES = 8 << 30  # the decompressed cores kept (FORENSICS_COREDUMP_CACHE_BYTES)
_PRUNE_AGE = 3600.0
_ELF_CORE = b"\x7fELF"
#: what is kept of a journal entry: systemd-coredump's fields that say where and what crashed
JOURNAL_FIELDS = ("COREDUMP_UNIT", "COREDUMP_USER_UNIT", "COREDUMP_SLICE", "COREDUMP_CGROUP", "COREDUMP_CMDLINE",
                  "COREDUMP_EXE", "COREDUMP_COMM", "COREDUMP_PID", "COREDUMP_UID", "COREDUMP_GID",
                  "COREDUMP_SIGNAL", "COREDUMP_SIGNAL_NAME", "COREDUMP_TIMESTAMP", "COREDUMP_HOSTNAME",
                  "COREDUMP_CONTAINER_CMDLINE", "COREDUMP_PACKAGE_NAME", "COREDUMP_PACKAGE_VERSION",
                  "COREDUMP_FILENAME", "COREDUMP_TRUNCATED")
_JOURNAL_TIMEOUT = 10.0
_JOURNAL_MAX = 4 << 20  # bytes of journalctl's output read (an entry with its stack trace is some KiB)
_FIELD_MAX = 4096  # characters of one field kept
STORE_DIR = "/var/lib/systemd/coredump"
#: systemd's SD_MESSAGE_COREDUMP: the MESSAGE_ID of the entry systemd-coredump writes for each crash
_COREDUMP_MESSAGE_ID = "fc2e22bc6ee647b6b90729ab34a250b1"
MAX_JOURNAL_CRASHES = 500  # the newest crashes listed from the journal
_LIST_MAX = 32 << 20  # bytes of journalctl's output read for them
_STACK_FRAMES = 32  # frames kept of a crashed thread's stack, each at most _FRAME_MAX characters
_FRAME_MAX = 300
_JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")  # where journald keeps the system journal


def _magic_codec(head: bytes) -> str | None:
    return next((c for m, c in CODECS.items() if head.startswith(m)), None)


def find_codec(path: str) -> str | None:
    """``zstd``, ``lz4`` or ``xz`` when ``path`` is a regular file (or a link to one) holding a compressed ELF
    core, else None (the first bytes only are decompressed).

    >>> find_codec("/nonexistent") is None
    True
    """
    try:
        fin = open(path, "rb")  # noqa: SIM115 -- closed below, after the reader that wraps it
    except OSError:
        return None
    with fin:
        try:
            if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
                return None
            codec = _magic_codec(fin.read(8))
            if codec is None:
                return None
            from .core.unpack import damaged_errors, open_reader  # only for a file that starts as one

            fin.seek(0)
            try:
                head = open_reader(codec, fin).read(18)
            except damaged_errors():
                return None
        except (OSError, ImportError):
            return None
    # e_ident[EI_DATA] little endian, e_type (offset 16) ET_CORE
    return codec if len(head) == 18 and head[:4] == _ELF_CORE and head[16:18] == b"\x04\x00" else None


def _env_bytes(name: str, default: int) -> int:
    try:
        return max(1 << 20, int(os.environ.get(name) or default))
    except ValueError:
        return default


def _entry_key(st: os.stat_result, real: str) -> str:
    ident = f"{real}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return sha256(ident.encode()).hexdigest()[:32]


def open_store_core(path: str, codec: str | None = None) -> str:
    """The decompressed core of a compressed one (systemd-coredump's), in the forensics cache; made once.

    :param path: the compressed core (left untouched: nothing is written beside it)
    :param codec: what :func:`find_codec` said of it (read again when None)
    :return: the path of the decompressed core under ``CACHE/coredump``
    :raises CoreReadError: the stream is damaged, or would decompress past a bound
    :raises CacheUnavailable: the cache cannot take it
    """
    codec = codec or find_codec(path)
    if codec is None:
        raise CoreReadError(path, "not a zstd, lz4 or xz compressed core")
    try:
        st = os.stat(path)
    except OSError as e:
        raise CoreReadError(path, e.strerror or str(e)) from None
    entry = cache_path("coredump", _entry_key(st, os.path.realpath(path)))
    core = os.path.join(entry, "core")
    if os.path.isfile(core):
        with contextlib.suppress(OSError):
            os.utime(entry)  # recently used: not pruned under an analysis
        return core
    try:
        os.makedirs(entry, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CacheUnavailable(entry, f"cannot create it: {e.strerror or e}") from None
    _decompress(path, codec, core)
    prune_cache()
    return core


def _decompress(src: str, codec: str, dest: str) -> None:
    """Stream ``src`` into ``dest`` (a new file, mode 0600, renamed into place), bounded."""
    from .core.unpack import decompress_core_file

    try:
        decompress_core_file(src, dest, codec)
    except OSError as e:
        if isinstance(e, ForensicsError):
            raise
        raise CacheUnavailable(dest, f"cannot write it: {e.strerror or e}") from None


def prune_cache(budget: int | None = None) -> list[str]:
    """Delete the least recently used decompressed cores beyond ``budget`` bytes (default
    ``FORENSICS_COREDUMP_CACHE_BYTES`` or 8 GiB), never one used in the last hour.  :return: those deleted"""
    budget = budget if budget is not None else _env_bytes("FORENSICS_COREDUMP_CACHE_BYTES", DEFAULT_CACHE_BYTES)
    return prune_lru("coredump", budget, _PRUNE_AGE)


def read_journal(path: str) -> tuple[dict[str, str], str | None]:
    """(the ``COREDUMP_*`` fields systemd-coredump logged for ``path``, None) or ({}, why there are none).

    The entry is matched on ``COREDUMP_FILENAME``: the path given, and the same name under
    ``/var/lib/systemd/coredump`` (a store copied off its node keeps its names); the newest entry wins.
    """
    import subprocess

    from .subproc import OutputTooLarge, run_bounded

    wanted = {os.path.abspath(path), os.path.join(STORE_DIR, os.path.basename(path))}
    cmd = ["journalctl", "--no-pager", "-o", "json", "-r", "-n", "1"]
    journal_dir = os.environ.get("FORENSICS_JOURNAL_DIR")
    if journal_dir:
        cmd += ["-D", journal_dir]
    cmd += [f"COREDUMP_FILENAME={p}" for p in sorted(wanted)]
    try:
        r = run_bounded(cmd, timeout=_JOURNAL_TIMEOUT, max_stdout=_JOURNAL_MAX)
    except FileNotFoundError:
        return {}, "journalctl not found: no journal metadata"
    except OSError as e:
        return {}, f"journalctl could not run: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return {}, f"journalctl ran past {_JOURNAL_TIMEOUT:.0f} s"
    except OutputTooLarge:
        return {}, f"journalctl wrote more than {_JOURNAL_MAX:,} bytes"
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
    if r.returncode != 0 or not line:
        if r.returncode != 0 and r.stderr.strip():
            return {}, f"journalctl: {r.stderr.strip().splitlines()[-1]}"
        return {}, "no journal entry names this file (COREDUMP_FILENAME)"
    try:
        doc = json.loads(line)
    except ValueError:
        return {}, "journalctl's output is not JSON"
    return _fields(doc), None


def _fields(doc: object) -> dict[str, str]:
    """The kept fields of one ``journalctl -o json`` entry, as text (a field journalctl gives as bytes -- a list of
    numbers, when not UTF-8 -- decoded with replacement; a repeated field's values joined)."""
    out: dict[str, str] = {}
    if not isinstance(doc, dict):
        return out
    for name in JOURNAL_FIELDS:
        value = doc.get(name)
        if isinstance(value, list) and value and all(isinstance(b, int) for b in value):
            value = bytes(b & 0xFF for b in value[:_FIELD_MAX]).decode("utf-8", "replace")
        elif isinstance(value, list):
            value = " ".join(str(v) for v in value)
        if isinstance(value, str):
            out[name.removeprefix("COREDUMP_").lower()] = value[:_FIELD_MAX]
    return out


def store_entry(path: str, codec: str) -> StoreEntry:
    """What the store says of one compressed core: the file, its compression, the journal's fields."""
    fields, missing = read_journal(path)
    return StoreEntry(path=path, compression=codec, journal=tuple(fields.items()), journal_missing=missing)


def is_store(path: str) -> bool:
    """Whether ``analyze`` reads the directory ``path`` as systemd-coredump's store, with the crashes its journal
    holds alone: its real path is ``/var/lib/systemd/coredump``, or ``FORENSICS_JOURNAL_DIR`` names the journal of a
    store copied off its node.

    >>> is_store("/nonexistent")
    False
    """
    copied = bool(os.environ.get("FORENSICS_JOURNAL_DIR"))
    return os.path.isdir(path) and (copied or os.path.realpath(path) == STORE_DIR)


def _journal_missing() -> str | None:
    """Why there is no journal to read (one line), or None: journalctl must run, and the journal directory
    (``FORENSICS_JOURNAL_DIR``, else the system journal's) must hold journal files."""
    import shutil

    if shutil.which("journalctl") is None:
        return "journalctl not found"
    given = os.environ.get("FORENSICS_JOURNAL_DIR")
    for d in (given,) if given else _JOURNAL_DIRS:
        try:
            for entry in os.scandir(d):  # DIR/*.journal or DIR/MACHINE-ID/*.journal, as journald writes them
                if entry.name.endswith((".journal", ".journal~")):
                    return None
                if entry.is_dir(follow_symlinks=False) and any(
                        n.endswith((".journal", ".journal~")) for n in os.listdir(entry.path)[:10_000]):
                    return None
        except OSError as e:
            if given:
                return f"FORENSICS_JOURNAL_DIR {given}: {e.strerror or e}"
    return f"no journal files in {given}" if given else f"no journal files in {' or '.join(_JOURNAL_DIRS)}"


def _journalctl_lines(args: list[str]) -> tuple[list[str], str | None]:
    """journalctl's ``-o json`` lines for ``args`` (the system journal, or ``FORENSICS_JOURNAL_DIR``'s), bounded in time
    and bytes; or ([], why it could not be read)."""
    import subprocess

    from .subproc import OutputTooLarge, run_bounded

    cmd = ["journalctl", "--no-pager", "-o", "json"]
    journal_dir = os.environ.get("FORENSICS_JOURNAL_DIR")
    if journal_dir:
        cmd += ["-D", journal_dir]
    try:
        r = run_bounded(cmd + args, timeout=_JOURNAL_TIMEOUT * 3, max_stdout=_LIST_MAX)
    except FileNotFoundError:
        return [], "journalctl not found"
    except OSError as e:
        return [], f"journalctl could not run: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return [], f"journalctl ran past {_JOURNAL_TIMEOUT * 3:.0f} s"
    except OutputTooLarge:
        return [], f"journalctl wrote more than {_LIST_MAX:,} bytes"
    if r.returncode != 0:
        tail = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
        return [], f"journalctl: {tail}"
    return r.stdout.splitlines(), None


def _stack(message: object) -> tuple[str, ...]:
    """The first thread's frames of systemd-coredump's message ("Stack trace of thread N:" then "#0  0x... fn (lib
    + 0x...)" lines): the crashed thread's, which systemd-coredump lists first."""
    if not isinstance(message, str):
        return ()
    frames: list[str] = []
    in_stack = False
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("Stack trace of thread"):
            if in_stack:
                break
            in_stack = True
        elif in_stack and text.startswith("#"):
            frames.append(text[:_FRAME_MAX])
            if len(frames) == _STACK_FRAMES:
                break
        elif in_stack and frames:
            break
    return tuple(frames)


def _why_no_core(fields: dict[str, str], in_journal: bool, local: bool) -> str:
    """Why the store does not hold the core of a crash the journal logged, as ``coredumpctl info`` says it
    (``Storage:``)."""
    pid = fields.get("pid", "PID")
    if in_journal:
        return f"in the journal only (Storage=journal): coredumpctl dump {pid} --output FILE, then analyze FILE"
    filename = fields.get("filename")
    if filename:
        where = "deleted since (systemd-tmpfiles' age, MaxUse=/KeepFree=, or by hand)" if local else \
            "not in this copy of the store (deleted on its node, or not copied)"
        return f"{filename} {where}"
    cut = "; the core was cut at ProcessSizeMax=" if fields.get("truncated") == "1" else ""
    return f"not stored by systemd-coredump (Storage=none, or larger than its ProcessSizeMax=/ExternalSizeMax=){cut}"


def journal_only_crashes(store: str) -> tuple[list[BatchEntry], str | None]:
    """The crashes systemd-coredump logged whose core the directory ``store`` does not hold, newest
    :data:`MAX_JOURNAL_CRASHES` first, each a :class:`~forensics.model.BatchEntry` without an analysis whose
    ``no_core`` says why and whose ``store`` holds the journal's fields and the crashed thread's stack; and why the
    journal could not be read (one line), or None.

    A crash whose file the directory holds is not listed: it is read as a core.
    """
    missing = _journal_missing()
    if missing is not None:
        return [], missing
    base = ["-r", "-n", str(MAX_JOURNAL_CRASHES), f"MESSAGE_ID={_COREDUMP_MESSAGE_ID}"]
    # the entries' fields in full (--all: a stack longer than 4096 bytes), but never the core itself
    lines, why = _journalctl_lines(["--all", "--output-fields=" + ",".join((*JOURNAL_FIELDS, "MESSAGE")), *base])
    if why is not None:
        return [], why
    # which of them hold the core (Storage=journal): the field, shown as null past 4096 bytes without --all
    held, why = _journalctl_lines(["--output-fields=COREDUMP", *base])
    if why is not None:
        return [], why
    in_journal = set()
    for line in held:
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and "COREDUMP" in doc:
                in_journal.add(doc.get("__CURSOR"))
    try:
        present = set(os.listdir(store))
    except OSError:
        present = set()
    local = os.path.realpath(store) == STORE_DIR and not os.environ.get("FORENSICS_JOURNAL_DIR")
    out: list[BatchEntry] = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        fields = _fields(doc)
        filename = fields.get("filename")
        if filename and (os.path.basename(filename) in present or (local and os.path.exists(filename))):
            continue  # its core is in the store: read as a core
        try:
            when = int(fields.get("timestamp", "")) / 1e6
        except ValueError:
            when = 0.0
        why = _why_no_core(fields, doc.get("__CURSOR") in in_journal, local)
        out.append(BatchEntry(path=filename or f"journal:{fields.get('pid', '?')}@{fields.get('timestamp', '?')}",
                              mtime=when, analysis=None, error=None, no_core=why,
                              store=StoreEntry(path=filename or "", compression="", journal=tuple(fields.items()),
                                               stack=_stack(doc.get("MESSAGE")))))
    return out, None
