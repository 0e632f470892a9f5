"""Debug files fetched by build-id from the debuginfod servers ``DEBUGINFOD_URLS`` names, into libdebuginfod's cache.

The variable eu-stack, gdb and drgn honour: a space-separated list of server URLs, each asked in turn
``GET URL/buildid/BUILDID/debuginfo`` (the debuginfod protocol).  Unset or empty, nothing is fetched and
no address is contacted (offline behaviour unchanged).  :func:`fetch_debuginfo` is the last resort of
:func:`forensics.core.debugfiles.find_debug_file`, so every reader of debug info (the libdw unwinder, gdb,
the heap reader, the Python walker) gets what a server has.

**Where files live** is libdebuginfod's cache, found as libdebuginfod finds it (:func:`debuginfod_cache_path`:
``DEBUGINFOD_CACHE_PATH``, else ``~/.debuginfod_client_cache`` when it exists, else
``$XDG_CACHE_HOME/debuginfod_client`` or ``~/.cache/debuginfod_client``; that default not writable, forensics' own
cache's ``debuginfod/``), in its layout: ``CACHE/BUILDID/debuginfo``,
mode 0400 in a 0700 directory; an empty file there is a miss every server answered 404, not asked again for
``cache_miss_s`` seconds.  So eu-stack and gdb on the node reuse what forensics fetched, and the reverse.  A
file is kept only when its own build-id note is the one asked for.

**Bounded as libdebuginfod bounds it**, with the same variables: ``DEBUGINFOD_TIMEOUT`` seconds to connect and
between bytes (default 10), ``DEBUGINFOD_MAXTIME`` seconds for one file (default 120), checked on every
receive of the connection, the TLS handshake, headers and body alike (each waits at most what is left of it),
``DEBUGINFOD_MAXSIZE`` bytes of one file (default 2 GiB; a larger one is refused); 1 GiB stays free on the
cache's file system.  A transfer is written to a temporary file under ``CACHE/.forensics-tmp/``, locked
(``flock``) while it is written and renamed into place; a process killed mid-fetch (SIGKILL, the OOM killer)
leaves it unlocked, and the next fetch of any process removes it.

**Cleaned** by libdebuginfod's own settings, in the files it keeps them in (``cache_clean_interval_s``, one day;
``max_unused_age_s``, one week: a file not read for that long is deleted), and, beyond what libdebuginfod does,
within a byte budget (``FORENSICS_DEBUGINFOD_CACHE_BYTES``, 8 GiB): after a fetch, the least recently used
build-ids go first, never one used in the last hour.

A server that timed out (connecting, between bytes, or past ``DEBUGINFOD_MAXTIME``) is not asked again by the
same process: one analysis waits for a hostile or unreachable server once, not once per library.  One fetch at
a time in a process: the libdw unwinder (in a thread of its own) and the Python reader ask for
the executable's debug file at the same moment, and the second then finds the first's file.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time

from forensics.cache import cache_path, prune_dir_lru
from forensics.core.buildid import read_build_id_from_file

__all__ = ["debuginfod_urls", "debuginfod_cache_path", "fetch_debuginfo", "sweep_partial_fetches",
           "clean_debuginfod_cache", "DEFAULT_TIMEOUT", "DEFAULT_MAXTIME", "DEFAULT_MAXSIZE",
           "DEFAULT_CACHE_BYTES", "TMP_DIR"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAXTIME = 120.0
DEFAULT_MAXSIZE = 2 << 30
DEFAULT_CACHE_BYTES = 8 << 30  # FORENSICS_DEBUGINFOD_CACHE_BYTES
MAX_URLS = 16
TMP_DIR = ".forensics-tmp"  # not a build-id: libdebuginfod's cleaner passes it by
_TMP_PREFIX, _TMP_SUFFIX = ".debuginfo.", ".tmp"
# libdebuginfod's settings files in the cache, and their defaults (debuginfod-client.c)
_CLEAN_INTERVAL = ("cache_clean_interval_s", 86400)
_MAX_UNUSED_AGE = ("max_unused_age_s", 604800)
_CACHE_MISS = ("cache_miss_s", 600)
_PRUNE_AGE = 3600.0  # a build-id used within the hour is never pruned for the budget (a reader may hold it)
_MAX_ENTRIES = 1 << 17  # build-ids looked at in one cleaning
_FREE_RESERVE = 1 << 30
_CHUNK = 1 << 16
_MAX_REDIRECTS = 8
_HEX = frozenset("0123456789abcdef")
_CACHED_NAMES = ("debuginfo", "executable")  # and source*: the files libdebuginfod's cleaner ages
_KEPT, _MISSING, _SLOW, _FAILED = "kept", "missing", "slow", "failed"  # what one server's answer was
_missed: set[str] = set()  # build-ids no server had, in this process
FETCHER_ENV = "FORENSICS_DEBUGINFOD_FD"  # fetchproxy.ENV: the analysis' end of a socket to its fetcher
_unresponsive: set[str] = set()  # servers that timed out in this process: not asked again by it
_fetching = threading.Lock()  # one fetch at a time in this process
_in_flight: set[str] = set()  # temporary files being written now (removed at exit if the fetch is cut)
_swept = False  # this process has removed dead fetches' temporary files and cleaned the cache


def debuginfod_urls() -> list[str]:
    """The http(s) servers of ``DEBUGINFOD_URLS``, in order (others, e.g. ``file://``, left out).

    >>> os.environ["DEBUGINFOD_URLS"] = "http://127.0.0.1:8002/ ftp://x https://127.0.0.1/d"
    >>> debuginfod_urls()
    ['http://127.0.0.1:8002', 'https://127.0.0.1/d']
    >>> del os.environ["DEBUGINFOD_URLS"]
    """
    urls = (os.environ.get("DEBUGINFOD_URLS") or "").split()
    return [u.rstrip("/") for u in urls if u.startswith(("http://", "https://"))][:MAX_URLS]


def debuginfod_cache_path() -> str:
    """libdebuginfod's cache directory, chosen by its rule: ``DEBUGINFOD_CACHE_PATH``; else
    ``$HOME/.debuginfod_client_cache`` when that exists (its old default); else ``debuginfod_client`` under
    ``$XDG_CACHE_HOME`` or ``$HOME/.cache``.

    >>> os.environ["DEBUGINFOD_CACHE_PATH"] = "/var/cache/debuginfod"
    >>> debuginfod_cache_path()
    '/var/cache/debuginfod'
    >>> del os.environ["DEBUGINFOD_CACHE_PATH"]
    """
    given = os.environ.get("DEBUGINFOD_CACHE_PATH")
    if given:
        return given
    home = os.environ.get("HOME") or "/"
    old = os.path.join(home, ".debuginfod_client_cache")
    if os.path.exists(old):
        return old
    xdg = os.environ.get("XDG_CACHE_HOME")
    return os.path.join(xdg if xdg else os.path.join(home, ".cache"), "debuginfod_client")


def _usable_cache_path() -> str:
    """:func:`debuginfod_cache_path`; but where it was not given (``DEBUGINFOD_CACHE_PATH``) and libdebuginfod's
    default cannot be written (a read-only home: a container's root filesystem), forensics' own cache
    (``debuginfod/`` under it, the same layout): the files are fetched still, only not shared."""
    root = debuginfod_cache_path()
    if os.environ.get("DEBUGINFOD_CACHE_PATH"):
        return root
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        if os.access(root, os.W_OK | os.X_OK):
            return root
    except OSError:
        pass
    return cache_path("debuginfod")


def _env_number(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if 0 < value < 1e12 else default


def fetch_debuginfo(build_id: str) -> str | None:
    """The debug file of ``build_id`` from the cache or the first server that has it; None when no server is
    named, none has it, or what one sent is not that build's (never an exception but the process's own
    SIGTERM/SIGINT: a missing debug file leaves frames unnamed, it does not end an analysis)."""
    global _swept
    build_id = build_id.lower()
    if not 4 <= len(build_id) <= 128 or not set(build_id) <= _HEX or build_id in _missed:
        return None
    if os.environ.get(FETCHER_ENV):  # in agent serve's sandbox: no network here, a fetcher beside it asks
        from .fetchproxy import ask

        with _fetching:  # one question at a time on the socket
            return ask(build_id, _env_number("DEBUGINFOD_MAXTIME", DEFAULT_MAXTIME) + 10)
    urls = debuginfod_urls()
    if not urls:
        return None
    with _fetching:
        if build_id in _missed:
            return None
        root = _usable_cache_path()
        if not _swept:  # once a process: what a killed fetch left, and libdebuginfod's cleaning when due
            _swept = True
            sweep_partial_fetches(root)
            clean_debuginfod_cache(root)
        return _fetch(build_id, urls, root)


def _fetch(build_id: str, urls: list[str], root: str) -> str | None:
    entry = os.path.join(root, build_id)
    dest = os.path.join(entry, "debuginfo")
    known, cached = _cached(dest, root, build_id)
    if known:
        if cached is None:
            _missed.add(build_id)
        return cached
    tmp_dir = os.path.join(root, TMP_DIR)
    try:
        os.makedirs(tmp_dir, mode=0o700, exist_ok=True)
    except OSError:
        return None
    deadline = time.monotonic() + _env_number("DEBUGINFOD_MAXTIME", DEFAULT_MAXTIME)
    all_missing = True
    for url in urls:
        if url in _unresponsive:
            all_missing = False
            continue
        got = _download(f"{url}/buildid/{build_id}/debuginfo", dest, tmp_dir, deadline)
        if got == _KEPT:
            if read_build_id_from_file(dest) == build_id:
                _prune(keep=entry, root=root)
                return dest
            _unlink_quietly(dest)  # another build's file: not this build's debug info
        elif got == _SLOW:
            _unresponsive.add(url)
        all_missing = all_missing and got == _MISSING
    if all_missing:  # every server said 404: libdebuginfod's negative entry, an empty file
        with contextlib.suppress(OSError):
            os.makedirs(entry, mode=0o700, exist_ok=True)
            os.close(os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o666))
    _missed.add(build_id)
    return None


def _cached(dest: str, root: str, build_id: str) -> tuple[bool, str | None]:
    """What the cache knows of ``build_id``: (True, ``dest``) when it holds that build's file; (True, None) for a
    recent miss (an empty file younger than ``cache_miss_s``); (False, None) when it has to be asked for (a
    stale miss or another build's file is deleted first)."""
    try:
        st = os.stat(dest)
    except PermissionError:  # an old 000-mode miss file libdebuginfod would delete too
        _unlink_quietly(dest)
        return False, None
    except OSError:
        return False, None
    if st.st_size > 0:
        if read_build_id_from_file(dest) == build_id:
            return True, dest
    elif time.time() - st.st_mtime <= _setting(root, *_CACHE_MISS)[0]:
        return True, None
    _unlink_quietly(dest)
    return False, None


def _download(url: str, dest: str, tmp_dir: str, deadline: float) -> str:
    """Stream ``url`` into ``dest`` before ``deadline`` and within the size bounds.

    :return: ``_KEPT``; ``_MISSING`` (404); ``_SLOW`` (timed out: connecting, between bytes or past the
        deadline); ``_FAILED`` (anything else).  Nothing is left but a kept file."""
    import tempfile
    import urllib.error

    maxsize = int(_env_number("DEBUGINFOD_MAXSIZE", DEFAULT_MAXSIZE))
    tmp = None
    try:
        st = os.statvfs(tmp_dir)
        room = min(maxsize, st.f_bavail * st.f_frsize - _FREE_RESERVE)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)  # 0600
        _in_flight.add(tmp)
        _lock_file(fd)  # held while written: a sweep removes only a file whose writer is gone
        with os.fdopen(fd, "wb") as out, _open_bounded(url, deadline) as resp:
            said = resp.headers.get("Content-Length")
            if said is not None and said.isdigit() and int(said) > room:
                return _FAILED
            n = 0
            while chunk := resp.read(_CHUNK):
                n += len(chunk)
                if n > room:
                    raise OSError("past DEBUGINFOD_MAXSIZE or the cache's room")
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), 0o400)  # libdebuginfod's: casually unwritable
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)  # made only for a file kept
            os.rename(tmp, dest)
        return _KEPT
    except urllib.error.HTTPError as e:
        return _MISSING if e.code == 404 else _FAILED
    except urllib.error.URLError as e:  # a refused redirect, or a connection that timed out
        return _SLOW if isinstance(e.reason, TimeoutError) else _FAILED
    except TimeoutError:  # between bytes, or past the deadline
        return _SLOW
    except (OSError, ValueError, _http_exception()):  # a cut transfer is an HTTPException
        return _FAILED
    finally:
        if tmp is not None:
            _in_flight.discard(tmp)
            if os.path.lexists(tmp):  # ours only, never another fetch's file
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _http_exception() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def _lock_file(fd: int) -> None:
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _remove_at_exit()


_at_exit_registered = False


def _remove_at_exit() -> None:
    """At the interpreter's exit (SIGTERM's 143, SIGINT's 130) remove the file a fetch in another thread is
    still writing: that thread is a daemon, its ``finally`` never runs."""
    global _at_exit_registered
    if not _at_exit_registered:
        import atexit

        atexit.register(_remove_in_flight)
        _at_exit_registered = True


def _remove_in_flight() -> None:
    for path in list(_in_flight):
        _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# -- one connection whose every receive is bounded by what is left of DEBUGINFOD_MAXTIME -----------------------

class _Bounded:
    """Each receive (and send) waits at most ``min(DEBUGINFOD_TIMEOUT, deadline - now)``: a server that drips
    one byte under every timeout still ends at the deadline, whatever reads the bytes (headers, chunks)."""

    bound: tuple[float, float] | None = None  # (deadline, timeout), set once connected

    def _wait_left(self) -> None:
        if self.bound is not None:
            deadline, timeout = self.bound
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("DEBUGINFOD_MAXTIME passed")
            self.settimeout(min(timeout, left))  # type: ignore[attr-defined]

    def recv(self, *args, **kwargs):
        self._wait_left()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def recv_into(self, *args, **kwargs):
        self._wait_left()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args, **kwargs):
        self._wait_left()
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _BoundedSocket(_Bounded, socket.socket):
    pass


def _open_bounded(url: str, deadline: float):
    """``urllib``'s response to ``GET url`` (proxies from the environment, at most 8 redirects, to http(s)
    only) over connections bounded by ``deadline``."""
    import http.client
    import urllib.request

    timeout = _env_number("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT)
    bound = (deadline, timeout)

    def connect(address, _timeout=None, source_address=None):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("DEBUGINFOD_MAXTIME passed")
        plain = socket.create_connection(address, min(timeout, left), source_address)
        sock = _BoundedSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.bound = bound
        return sock

    class Plain(http.client.HTTPConnection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class Tls(http.client.HTTPSConnection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = connect

        def connect(self):
            super().connect()  # the handshake waits at most the bound in force when it began
            if isinstance(self.sock, _Bounded):
                self.sock.bound = bound

    class PlainHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(Plain, req)

    context = _tls_context() if url.startswith("https://") else None

    class TlsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):  # a redirect to https from http gets its context here
            return self.do_open(Tls, req, context=context or _tls_context())

    class Redirects(urllib.request.HTTPRedirectHandler):
        max_redirections = _MAX_REDIRECTS

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            if not newurl.startswith(("http://", "https://")):
                return None  # libdebuginfod's curl follows http(s) only (file:// is not ours to read)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(PlainHandler(), TlsHandler(), Redirects())
    req = urllib.request.Request(url, headers={"User-Agent": "forensics"})
    return opener.open(req, timeout=timeout)


def _tls_context():
    import ssl

    class BoundedTls(_Bounded, ssl.SSLSocket):
        pass

    ctx = ssl.create_default_context()
    ctx.sslsocket_class = BoundedTls
    return ctx


# -- the cache's upkeep ----------------------------------------------------------------------------------------

def _setting(root: str, name: str, default: int) -> tuple[int, float]:
    """One of libdebuginfod's settings files in the cache, as it reads them: created with the default when
    missing or empty, its leading integer otherwise.  :return: (the value, the file's mtime)"""
    path = os.path.join(root, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError:
        return default, time.time()
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            os.write(fd, str(default).encode())
            return default, st.st_mtime
        text = os.read(fd, 64).decode("ascii", "replace").split()
        try:
            return int(text[0]) if text else default, st.st_mtime
        except ValueError:
            return default, st.st_mtime
    except OSError:
        return default, time.time()
    finally:
        os.close(fd)


def sweep_partial_fetches(root: str | None = None) -> list[str]:
    """Remove the temporary files of fetches that are no longer running (killed: SIGKILL, the OOM killer): a
    live fetch holds its file's lock.  :return: the files removed"""
    import fcntl

    tmp_dir = os.path.join(root or debuginfod_cache_path(), TMP_DIR)
    removed = []
    try:
        names = [n for n in os.listdir(tmp_dir) if n.startswith(_TMP_PREFIX) and n.endswith(_TMP_SUFFIX)]
    except OSError:
        return []
    for name in names[:_MAX_ENTRIES]:
        path = os.path.join(tmp_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while its writer lives
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _is_build_id(name: str) -> bool:
    return len(name) >= 4 and set(name) <= _HEX


def clean_debuginfod_cache(root: str | None = None, *, now: float | None = None) -> list[str]:
    """libdebuginfod's cleaning, with its settings: once ``cache_clean_interval_s`` has passed since the last
    (the file's mtime), delete the cached files not read for ``max_unused_age_s`` and the build-id
    directories left empty and as old.  :return: the paths deleted"""
    root = root or debuginfod_cache_path()
    interval, last = _setting(root, *_CLEAN_INTERVAL)
    now = time.time() if now is None else now
    if now - last < interval:
        return []
    with contextlib.suppress(OSError):
        os.utime(os.path.join(root, _CLEAN_INTERVAL[0]))
    max_age = _setting(root, *_MAX_UNUSED_AGE)[0]
    deleted = []
    try:
        with os.scandir(root) as it:
            entries = [e.path for e in itertools.islice(it, _MAX_ENTRIES)
                       if _is_build_id(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    for entry in entries:
        try:
            entry_mtime = os.lstat(entry).st_mtime  # before its files' deletion makes it new
            with os.scandir(entry) as it:
                for f in it:
                    if (f.name in _CACHED_NAMES or f.name.startswith("source")) and f.is_file(follow_symlinks=False) \
                            and now - f.stat(follow_symlinks=False).st_atime >= max_age:
                        os.unlink(f.path)
                        deleted.append(f.path)
            if now - entry_mtime >= max_age:
                os.rmdir(entry)  # only when empty
                deleted.append(entry)
        except OSError:
            continue
    return deleted


def _last_used(path: str) -> float:
    """When a build-id's files were last read or written (atime under relatime moves at most daily)."""
    latest = os.lstat(path).st_mtime
    with os.scandir(path) as it:
        for f in it:
            st = f.stat(follow_symlinks=False)
            latest = max(latest, st.st_atime, st.st_mtime)
    return latest


def _prune(*, keep: str, root: str) -> list[str]:
    try:
        budget = int(os.environ.get("FORENSICS_DEBUGINFOD_CACHE_BYTES") or DEFAULT_CACHE_BYTES)
    except ValueError:
        budget = DEFAULT_CACHE_BYTES
    return prune_dir_lru(root, budget, _PRUNE_AGE, keep=keep, is_entry=_is_build_id, last_used=_last_used)
