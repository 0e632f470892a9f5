"""``forensics canary``: a bounded scrape soak of a Prometheus endpoint, with pass/fail.

An asyncio HTTP/1.1 client (keep-alive when the server allows it; https with a CA file or unverified; a
bearer token read from a file, sent to the URL's origin only) runs ``concurrency`` workers, each starting
a scrape every ``interval`` seconds as Prometheus does (0: back to back), until ``requests`` scrapes are
done or ``duration`` has passed, whichever is first — both are bounded.  It sends Prometheus' Accept
(OpenMetrics first) and Accept-Encoding (gzip, inflated to MAX_BODY at most).  Bodies are validated with
prometheus_client's exposition parser for their Content-Type (every distinct body up to a budget per
second, so validation never throttles the soak; the result says how many were
parsed).  With a pid or a pod it also watches for exits, restarts and new cores.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import ssl
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field
from collections.abc import Callable

from .errors import CanaryError, ForensicsError, ProcessGone
from .kubectl import KubeOptions, get_json
from .output import json_document

__all__ = [
    "describe_wait_status",
    "describe_returncode",
    "CanaryResult",
    "PodWatch",
    "Thresholds",
    "parse_exposition",
    "run_canary",
    "judge",
    "expected_crashes",
    "fleet_hint",
    "read_pod_state",
    "canary_document",
    "MAX_REQUESTS",
    "DEFAULT_TIMEOUT",
    "scrape_timeout",
    "PROMETHEUS_ACCEPT",
    "ScrapeOptions",
]

MAX_REQUESTS = 10_000_000
DEFAULT_TIMEOUT = 10.0  # Prometheus' scrape_timeout, when the interval is not shorter
MAX_BODY = 64 * 1024 * 1024
PARSE_BUDGET_PER_S = 20  # distinct bodies parsed per second of soak, at most
MAX_TOKEN = 64 * 1024
# What Prometheus (2.x) asks a target for: OpenMetrics first, then the text format
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeOptions:
    """How each scrape is made, as Prometheus' scrape config says it.

    ``interval``: seconds between the starts of one worker's scrapes (``scrape_interval``; 0: as fast as the
    target answers, a load test).  ``bearer_token_file``: ``authorization.credentials_file`` -- its token is
    sent to the URL's origin only (redirects are not followed) and never shown.
    """

    interval: float = 0.0
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: str | None = None




@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    min_success: float = 1.0
    max_p99: float | None = None  # seconds
    expect: tuple[str, ...] = ()  # metric families that must be present


@dataclass
class CanaryResult:
    url: str
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    body_min: int = 0
    body_max: int = 0
    body_total: int = 0
    elapsed: float = 0.0
    concurrency: int = 1
    parsed_bodies: int = 0
    invalid_bodies: int = 0
    invalid_example: str | None = None
    families: dict[str, int] = field(default_factory=dict)  # family -> samples in the last parsed body
    nan_samples: dict[str, int] = field(default_factory=dict)  # family -> NaN samples in the last parsed body
    missing_families: list[str] = field(default_factory=list)
    content_types: dict[str, int] = field(default_factory=dict)  # Content-Type of the 200 answers -> count
    gzip_bodies: int = 0  # 200 answers that came gzip-encoded (decoded before they are judged)
    interval: float = 0.0
    process_events: list[str] = field(default_factory=list)  # exits, restarts, new cores
    new_cores: list[str] = field(default_factory=list)
    stopped_early: str | None = None  # why the soak ended before its requests / duration were done
    interrupted: bool = False  # Ctrl-C: the figures are those of the scrapes made until then
    verdict: str = ""
    reasons: list[str] = field(default_factory=list)
    hint: str | None = None

    @property
    def success_rate(self) -> float:
        return self.ok / self.requests if self.requests else 0.0

    def percentile(self, p: float) -> float | None:
        if not self.latencies:
            return None
        xs = sorted(self.latencies)
        k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
        return xs[k]

    @property
    def rate(self) -> float:
        return self.requests / self.elapsed if self.elapsed else 0.0


def parse_exposition(body: str, content_type: str = "text/plain") -> tuple[dict[str, int], dict[str, int]]:
    """(samples per family, NaN samples per family) of a Prometheus text or OpenMetrics exposition
    (by its ``content_type``).

    :raises ValueError: when the text is not valid exposition format
    """
    if content_type.split(";")[0].strip().lower() == "application/openmetrics-text":
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, int] = {}
    nans: dict[str, int] = {}
    for fam in text_string_to_metric_families(body):
        families[fam.name] = families.get(fam.name, 0) + len(fam.samples)
        n = sum(1 for s in fam.samples if math.isnan(s.value))
        if n:
            nans[fam.name] = nans.get(fam.name, 0) + n
    return families, nans


def _split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path?query) of an http:// or https:// URL."""
    u = urllib.parse.urlsplit(url)
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme not in ("http", "https") or not u.hostname or port == -1:
        raise CanaryError(f"{url!r} is not an http:// or https:// URL")
    return u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80), \
        (u.path or "/") + (f"?{u.query}" if u.query else "")


class _Target:
    """The URL's connection and the request Prometheus would send it (token, gzip, Accept)."""

    def __init__(self, url: str, opts: ScrapeOptions, timeout: float) -> None:
        scheme, self.host, self.port, path = _split_url(url)
        self.ssl: ssl.SSLContext | None = None
        if scheme == "https":
            try:
                self.ssl = ssl.create_default_context(cafile=opts.ca_file)
            except (OSError, ssl.SSLError) as e:
                why = getattr(e, "strerror", None) or e
                raise CanaryError(f"{opts.ca_file}: cannot load the CA file: {why}") from e
            if opts.insecure_skip_verify:
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE
        elif opts.ca_file or opts.insecure_skip_verify:
            raise CanaryError("--ca-file and --insecure-skip-verify go with an https:// URL")
        host = f"[{self.host}]" if ":" in self.host else self.host
        head = (f"GET {path} HTTP/1.1\r\nHost: {host}:{self.port}\r\nAccept: {PROMETHEUS_ACCEPT}\r\n"
                f"Accept-Encoding: gzip\r\nUser-Agent: forensics-canary\r\n"
                f"X-Prometheus-Scrape-Timeout-Seconds: {timeout:g}\r\n")
        if opts.bearer_token_file:
            head += f"Authorization: Bearer {_read_token(opts.bearer_token_file)}\r\n"
        self.request = (head + "\r\n").encode()

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, ssl=self.ssl,
                                             server_hostname=self.host if self.ssl else None)


def _read_token(path: str) -> str:
    """The bearer token in ``path`` (surrounding white space stripped); never put in a message."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN + 1)
    except OSError as e:
        raise CanaryError(f"{path}: cannot read the bearer token: {e.strerror or e}") from e
    token = raw.strip()
    if len(raw) > MAX_TOKEN or not token or any(c < 0x21 or c > 0x7E for c in token):
        raise CanaryError(f"{path}: not a bearer token (one line of printable ASCII, at most {MAX_TOKEN} bytes)")
    return token.decode("ascii")


def _gunzip(body: bytes) -> bytes:
    """A gzip body decoded, at most MAX_BODY bytes of it (a bomb is refused, not inflated)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, MAX_BODY + 1)
    except zlib.error as e:
        raise ValueError(f"gzip body not decodable: {e}") from e
    if len(out) > MAX_BODY or d.unconsumed_tail:
        raise ValueError("decompressed body over the size limit")
    return out


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool, dict[str, str]]:
    """(status, body, keep-alive, headers) of one HTTP/1.x response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    keep = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            total += size
            if total > MAX_BODY:
                raise ValueError("body over the size limit")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        return status, b"".join(chunks), keep, headers
    if "content-length" in headers:
        n = int(headers["content-length"])
        if n > MAX_BODY:
            raise ValueError("body over the size limit")
        return status, await reader.readexactly(n), keep, headers
    body = await reader.read(MAX_BODY)
    return status, body, False, headers


def _record_answer(result: CanaryResult, status: int, body: bytes, headers: dict[str, str],
                   on_body: Callable[[bytes, str], None]) -> None:
    """One answer into the result: a 200's body decoded (gzip) and judged, any other status counted."""
    if status != 200:
        key = f"HTTP {status}"
        if 300 <= status < 400:
            key += " (redirect: not followed, give the final URL)"
        result.errors[key] = result.errors.get(key, 0) + 1
        return
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding == "gzip":
        body = _gunzip(body)
        result.gzip_bodies += 1
    elif encoding != "identity":
        raise ValueError(f"Content-Encoding {encoding[:40]!r} not asked for")
    result.ok += 1
    ctype = headers.get("content-type", "")
    result.content_types[ctype[:200]] = result.content_types.get(ctype[:200], 0) + 1
    n = len(body)
    result.body_total += n
    result.body_min = n if result.body_min == 0 else min(result.body_min, n)
    result.body_max = max(result.body_max, n)
    on_body(body, ctype)


async def _soak(target: _Target, requests: int, concurrency: int, duration: float, timeout: float,
                result: CanaryResult, on_body: Callable[[bytes, str], None], stop: dict,
                on_failure: Callable[[], None] | None = None, interval: float = 0.0) -> None:
    deadline = time.monotonic() + duration
    issued = 0

    async def worker(k: int) -> None:
        nonlocal issued
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        next_start = time.monotonic() + interval * k / concurrency  # spread, as Prometheus spreads its targets
        # A flag as well as cancellation: asyncio.wait_for can swallow a cancel that races a
        # finished connect (3.11), and a refused connect finishes at once.
        while issued < requests and not stop["now"]:
            if next_start >= deadline:  # no scrape starts after the deadline, but the watch lasts until it
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                break
            if next_start > time.monotonic():
                await asyncio.sleep(next_start - time.monotonic())
                continue  # the stop flag and the request count may have changed meanwhile
            issued += 1
            next_start = time.monotonic() + interval
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.wait_for(target.connect(), timeout)
                reader, writer = conn
                writer.write(target.request)
                status, body, keep, headers = await asyncio.wait_for(_read_response(reader), timeout)
                result.requests += 1
                result.latencies.append(time.perf_counter() - t0)
                _record_answer(result, status, body, headers, on_body)
                if not keep:
                    writer.close()
                    conn = None
            except ssl.SSLCertVerificationError as e:
                # the set-up is wrong, not the target: no soak can be judged
                stop["now"] = True
                stop["fatal"] = f"certificate verify failed ({e.verify_message or e.reason}): give the server's " \
                                "CA with --ca-file (or --insecure-skip-verify)"
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError) as e:
                result.requests += 1
                result.latencies.append(time.perf_counter() - t0)
                key = type(e).__name__ if not isinstance(e, OSError) or not e.strerror else e.strerror
                if isinstance(e, ValueError) and str(e):
                    key = str(e)[:120]
                result.errors[key] = result.errors.get(key, 0) + 1
                if conn is not None:
                    conn[1].close()
                conn = None
                if on_failure is not None:
                    on_failure()  # a failed scrape is the first sign of a dead target: look now, not at the next tick
                await asyncio.sleep(0.001)  # a refused connection must not spin
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))


def describe_wait_status(status: int) -> str:
    """A wait(2) status as a person reads it (``/proc/PID/stat`` field 52 of a zombie holds it).

    >>> describe_wait_status(6 | 0x80), describe_wait_status(11), describe_wait_status(3 << 8)
    ('killed by SIGABRT (core dumped), exit status 134', 'killed by SIGSEGV, exit status 139', 'exited with status 3')
    """
    import signal as _signal

    sig = status & 0x7F
    if sig:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}{' (core dumped)' if status & 0x80 else ''}, exit status {128 + sig}"
    return f"exited with status {(status >> 8) & 0xFF}"


def describe_returncode(returncode: int) -> str:
    """A :class:`subprocess.Popen` return code as a person reads it (a signal is negative there).

    >>> describe_returncode(-6), describe_returncode(139), describe_returncode(3)
    ('killed by SIGABRT, exit status 134', 'exited with status 139', 'exited with status 3')
    """
    return describe_wait_status(-returncode if returncode < 0 else (returncode & 0xFF) << 8)


class _ExitListener:
    """The kernel's process events (the proc connector, ``NETLINK_CONNECTOR``): the wait status of the watched
    process when it exits, whoever reaps it -- a shell, a container runtime or an init reaps at once, leaving
    no zombie whose ``/proc/PID/stat`` holds it.  Needs CAP_NET_ADMIN in the initial network namespace; where
    the kernel refuses, ``status`` stays None (the zombie is then the only witness)."""

    _EXIT = 0x80000000  # PROC_EVENT_EXIT

    def __init__(self, pid: int) -> None:
        import socket
        import struct
        import threading

        self.pid = pid
        self.status: int | None = None
        self._closed = False
        self._sock = None
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 11)  # NETLINK_CONNECTOR
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.bind((0, 1))  # CN_IDX_PROC
            # nlmsghdr (NLMSG_DONE), cn_msg (CN_IDX_PROC, CN_VAL_PROC), PROC_CN_MCAST_LISTEN
            sock.send(struct.pack("=IHHII", 40, 3, 0, 0, 0) + struct.pack("=IIIIHH", 1, 1, 0, 0, 4, 0)
                      + struct.pack("=I", 1))
            sock.settimeout(0.2)
        except (OSError, AttributeError):
            return
        self._sock = sock
        threading.Thread(target=self._read, name="forensics-exit-listener", daemon=True).start()

    def _read(self) -> None:
        import struct

        sock = self._sock
        assert sock is not None
        while not self._closed:
            try:
                data = sock.recv(8192)
            except TimeoutError:
                continue
            except OSError:  # ENOBUFS (events dropped), or closed: keep listening until closed
                if self._closed:
                    return
                continue
            # nlmsghdr (16) + cn_msg (20) + proc_event: what, cpu, timestamp (16) + exit_proc_event
            if len(data) >= 68 and struct.unpack_from("=I", data, 36)[0] == self._EXIT:
                pid, tgid, code = struct.unpack_from("=iiI", data, 52)
                if pid == tgid == self.pid:
                    self.status = code
                    return

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            self._sock.close()


class _Watch:
    """Watches a local process (pid) for exit and new core files in its working directory."""

    def __init__(self, pid: int | None, core_dirs: list[str]) -> None:
        self.pid = pid
        self.name = f"pid {pid}"
        self.core_dirs = list(core_dirs)
        self.exits: _ExitListener | None = None
        if pid is not None:
            try:
                self.core_dirs.append(os.readlink(f"/proc/{pid}/cwd"))
            except OSError as e:
                raise ProcessGone(pid, e.strerror or "") from e
            self.exits = _ExitListener(pid)
        self.before = self._cores()
        self.alive = True

    def _cores(self) -> set[str]:
        out = set()
        for d in self.core_dirs:
            try:
                for name in os.listdir(d):
                    if name == "core" or name.startswith("core."):
                        p = os.path.join(d, name)
                        out.add(f"{p}@{os.stat(p).st_mtime_ns}")
            except OSError:
                pass
        return out

    def poll(self, result: CanaryResult) -> None:
        if self.pid is not None and self.alive and self.exits is not None and self.exits.status is not None:
            self.alive = False
            result.process_events.append(f"pid {self.pid} died during the run: "
                                         f"{describe_wait_status(self.exits.status)}")
        if self.pid is not None and self.alive and not os.path.exists(f"/proc/{self.pid}"):
            time.sleep(0.05)  # the kernel's exit event may trail the reaping by a moment
            if self.exits is not None and self.exits.status is not None:
                self.poll(result)
                return
            self.alive = False
            result.process_events.append(f"pid {self.pid} exited during the run (its exit status is gone: its "
                                         "parent reaped it, and the kernel's process events were not readable)")
        if self.pid is not None and self.alive:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] == "Z":
                    self.alive = False
                    how = describe_wait_status(int(fields[49])) if len(fields) > 49 else "its status is gone"
                    result.process_events.append(f"pid {self.pid} died during the run: {how}")
            except (OSError, ValueError, IndexError):
                pass

    def finish(self, result: CanaryResult) -> None:
        self.poll(result)
        if self.exits is not None:
            self.exits.close()
        if self.pid is None and not self.core_dirs:
            return
        new = sorted(self._cores() - self.before)
        result.new_cores = [c.rsplit("@", 1)[0] for c in new]
        for c in result.new_cores:
            result.process_events.append(f"new core: {c}")


class PodWatch:
    """Watches a pod through ``probe`` (a kubectl read: ``{"restarts", "exit_code", "reason", "running"}``).

    The probe runs in a thread, at most once per ``interval`` seconds and at once after a failed
    scrape, so a slow API server never stalls the soak.  The pod is dead for the soak once its
    restarts went up or its container stopped running.
    """

    def __init__(self, name: str, probe: Callable[[], dict], *, interval: float = 2.0) -> None:
        import threading

        self.pid = None
        self.name = f"pod {name}"
        self.probe = probe
        self.interval = interval
        self.before = probe()
        self.last = self.before
        self.alive = True
        self._thread: threading.Thread | None = None
        self._t = time.monotonic()
        self._threading = threading

    def _run(self) -> None:
        with contextlib.suppress(ForensicsError):  # the API server did not answer this time: the next probe tells
            self.last = self.probe()

    def poll(self, result: CanaryResult, *, now: bool = False) -> None:
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            self._judge(result)
        if self._thread is None and self.alive and (now or time.monotonic() - self._t >= self.interval):
            self._t = time.monotonic()
            self._thread = self._threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _judge(self, result: CanaryResult) -> None:
        if not self.alive:
            return
        b, a = self.before, self.last
        if a["restarts"] > b["restarts"]:
            self.alive = False
            result.process_events.append(
                f"{self.name} restarted {a['restarts'] - b['restarts']} times during the run "
                f"(last exit code {a['exit_code']}, {a['reason']})")
        elif not a.get("running", True):
            self.alive = False
            result.process_events.append(f"{self.name}: its container stopped running during the run ({a['reason']})")

    def finish(self, result: CanaryResult) -> None:
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self.alive:
            self._run()
        self._judge(result)


def run_canary(url: str, *, requests: int = 1000, concurrency: int = 10, duration: float = 60.0,
               timeout: float = 10.0, pid: int | None = None, core_dirs: tuple[str, ...] = (),
               thresholds: Thresholds = Thresholds(), stop_on_exit: bool = True,
               pod_watch: PodWatch | None = None, scrape: ScrapeOptions = ScrapeOptions()) -> CanaryResult:
    """Soak ``url`` and judge the result against ``thresholds``.

    :param stop_on_exit: end the soak as soon as the watched ``pid`` (or pod) dies: scrapes of a dead
        target only add connection failures
    :param pod_watch: watch a pod's restarts (``--pod``) instead of a local process
    :param scrape: how each scrape is made (interval, TLS, bearer token)
    :raises CanaryError: for a certificate the CA does not vouch for (before anything is judged)
    """
    _check_soak(url, requests, concurrency, duration, timeout, scrape.interval)
    target = _Target(url, scrape, timeout)
    result = CanaryResult(url=url, concurrency=concurrency, interval=scrape.interval)
    watch: PodWatch | _Watch | None
    if pod_watch is not None:
        watch = pod_watch
    else:
        watch = _Watch(pid, list(core_dirs)) if (pid is not None or core_dirs) else None
    on_body = _BodyParser(result)
    stop: dict = {"now": False}

    def check_watch(failed: bool = False) -> None:
        if watch is None or stop["now"]:
            return
        if isinstance(watch, PodWatch):
            watch.poll(result, now=failed)
        else:
            watch.poll(result)
        if stop_on_exit and not watch.alive:
            stop["now"] = True  # the watched process died: the soak has its answer
            result.stopped_early = result.stopped_early or f"{watch.name} died: scraping stopped"

    async def main() -> None:
        task = asyncio.ensure_future(_soak(target, requests, concurrency, duration, timeout, result, on_body, stop,
                                           (lambda: check_watch(True)) if watch is not None else None,
                                           scrape.interval))
        while not task.done():
            check_watch()
            if stop["now"]:
                task.cancel()
                break
            await asyncio.wait([task], timeout=0.1)
        with contextlib.suppress(asyncio.CancelledError):  # cancelled by us, above
            await task

    def on_sigint(signum, frame) -> None:
        if result.interrupted:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        # Ctrl-C: the scrapes made so far are still a result; the caller prints it and exits 130
        result.interrupted = True
        result.stopped_early = "interrupted (Ctrl-C)"
        stop["now"] = True

    import signal
    import threading

    old_int = None
    if threading.current_thread() is threading.main_thread():
        old_int = signal.signal(signal.SIGINT, on_sigint)
    t0 = time.perf_counter()
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        result.interrupted = True
        result.stopped_early = "interrupted (Ctrl-C)"
    finally:
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)
    result.elapsed = time.perf_counter() - t0
    if watch is not None:
        watch.finish(result)
    _raise_fatal(url, stop)
    return judge(result, thresholds)


def _raise_fatal(url: str, stop: dict) -> None:
    """A set-up mistake met while scraping (a certificate the CA does not vouch for) as one error line."""
    if stop.get("fatal"):
        raise CanaryError(f"{url}: TLS: {stop['fatal']}")


def scrape_timeout(interval: float, timeout: float | None = None) -> float:
    """Seconds one scrape may take: ``timeout`` when given, else Prometheus' default scrape_timeout (10 s) lowered
    to a shorter ``interval``, as Prometheus lowers an unset scrape_timeout to the scrape_interval.

    >>> scrape_timeout(15.0), scrape_timeout(5.0), scrape_timeout(0.0), scrape_timeout(5.0, 2.0)
    (10.0, 5.0, 10.0, 2.0)
    """
    if timeout is not None:
        return timeout
    return min(DEFAULT_TIMEOUT, interval) if interval > 0 else DEFAULT_TIMEOUT


def _check_soak(url: str, requests: int, concurrency: int, duration: float, timeout: float = 10.0,
                interval: float = 0.0) -> None:
    if not (1 <= requests <= MAX_REQUESTS):
        raise _option_error(f"--requests must be between 1 and {MAX_REQUESTS}")
    if not (1 <= concurrency <= 10_000):
        raise _option_error("--concurrency must be between 1 and 10000")
    if not (0 < duration <= 7 * 86400):
        raise _option_error("--duration must be more than 0 seconds and at most 7 days")
    if not (0 <= interval <= 86400):
        raise _option_error("--interval must be between 0 and 86400 seconds")
    if not (0 < timeout <= 86400):
        raise _option_error("--timeout must be more than 0 seconds and at most 86400")
    if interval and timeout > interval:
        raise _option_error(f"--timeout {timeout:g} is longer than --interval {interval:g} (Prometheus refuses a "
                            "scrape_timeout over its scrape_interval)",
                            "Give --timeout at most --interval, or leave it out: it then follows a shorter --interval, "
                            "as Prometheus lowers an unset scrape_timeout to the scrape_interval.")
    _split_url(url)


def _option_error(what: str, hint: str = "") -> CanaryError:
    """A value of canary's options it cannot use: the hint is about the options, not the URL."""
    e = CanaryError(what)
    e.help_text = hint or "See forensics canary --help for each option's range."
    return e


class _BodyParser:
    """Parses each distinct body once, at most PARSE_BUDGET_PER_S a second: the families of the latest."""

    def __init__(self, result: CanaryResult) -> None:
        self.result = result
        self.seen: set[bytes] = set()
        self.start = time.monotonic()
        self.parsed = 0

    def __call__(self, body: bytes, content_type: str = "text/plain") -> None:
        result = self.result
        digest = hashlib.blake2b(body + b"\0" + content_type.encode("latin-1", "replace"), digest_size=16).digest()
        if digest in self.seen:
            return
        now = time.monotonic()
        if self.parsed >= PARSE_BUDGET_PER_S * max(1.0, now - self.start) and result.parsed_bodies > 0:
            return
        self.seen.add(digest)
        self.parsed += 1
        result.parsed_bodies += 1
        try:
            fams, nans = parse_exposition(body.decode("utf-8"), content_type)
        except (ValueError, UnicodeDecodeError) as e:
            result.invalid_bodies += 1
            result.invalid_example = result.invalid_example or f"{type(e).__name__}: {e}"[:200]
            return
        result.families, result.nan_samples = fams, nans


def judge(result: CanaryResult, t: Thresholds) -> CanaryResult:
    """Fill the verdict (PASS/FAIL) and its reasons."""
    reasons = []
    if result.success_rate < t.min_success:
        reasons.append(f"success rate {result.success_rate:.4f} < {t.min_success}")
    p99 = result.percentile(99)
    if t.max_p99 is not None and p99 is not None and p99 > t.max_p99:
        reasons.append(f"p99 latency {p99 * 1000:.1f} ms > {t.max_p99 * 1000:.1f} ms")
    if result.invalid_bodies:
        reasons.append(f"{result.invalid_bodies} bodies are not valid exposition format")
    result.missing_families = [f for f in t.expect if f not in result.families]
    if result.missing_families:
        reasons.append("missing metric families: " + ", ".join(result.missing_families))
    if result.process_events:
        reasons.append("process: " + "; ".join(result.process_events))
    if result.requests == 0:
        reasons.append("no request completed")
    result.reasons = reasons
    result.verdict = "INTERRUPTED" if result.interrupted else "FAIL" if reasons else "PASS"
    return result


def expected_crashes(fleet_doc: dict, duration_s: float) -> tuple[float, float] | None:
    """(crashes per pod-hour in the crashing groups, crashes expected for one pod in ``duration_s``)."""
    f = fleet_doc.get("fleet") or {}
    hours = f.get("observed_hours")
    groups = [g for g in f.get("groups") or [] if g.get("pods_with_restarts")]
    if not hours or not groups:
        return None
    pods = sum(g["pods"] for g in groups)
    restarts = sum(g["total_restarts"] for g in groups)
    rate = restarts / (pods * hours)
    return rate, rate * duration_s / 3600


def fleet_hint(fleet_doc: dict, elapsed: float) -> str | None:
    """What a ``forensics fleet --json`` document says of a soak of ``elapsed`` seconds: too short to
    expect 3 crashes of one pod at the crash rate the fleet saw (and how long would be), else None.

    >>> fleet_hint({"fleet": {"observed_hours": 10, "groups": [{"pods_with_restarts": 1, "pods": 2,
    ...             "total_restarts": 4}]}}, 600)  # doctest: +NORMALIZE_WHITESPACE
    'the fleet crashes 0.20 times per pod-hour; this 600s run expected 0.03 crashes of one pod:
    run at least 900 minutes to expect 3'
    """
    exp = expected_crashes(fleet_doc, elapsed)
    if exp is None:
        return None
    rate, n = exp
    if n >= 3:
        return None
    need = 3 / rate * 3600 if rate else float("inf")
    return (f"the fleet crashes {rate:.2f} times per pod-hour; this {elapsed:.0f}s run expected "
            f"{n:.2f} crashes of one pod: run at least {need / 60:.0f} minutes to expect 3")


def read_pod_state(pod: str, opts: KubeOptions) -> dict:
    """A pod's restarts and last exit as :class:`PodWatch` probes them, read through the one kube client.

    :raises ForensicsError: when the pod does not exist (or kubectl fails: KubeError)
    """
    from .fleet import parse_pods

    recs = parse_pods(get_json(opts, f"get pod/{pod}", ["get", f"pod/{pod}"]))
    if not recs:
        raise ForensicsError(f"pod {pod} not found")
    r = recs[0]
    return {"restarts": r.restarts, "exit_code": r.last_exit_code, "reason": r.last_reason or r.waiting_reason,
            "running": r.waiting_reason is None}


def canary_document(result: CanaryResult) -> str:
    """``forensics canary --json``: the result with a summary; the raw latencies stand as percentiles."""
    doc = json.loads(json_document("canary", {"canary": result, "summary": {
        "verdict": result.verdict, "success_rate": result.success_rate, "rate_per_s": result.rate,
        "p50": result.percentile(50), "p95": result.percentile(95), "p99": result.percentile(99),
        "max": max(result.latencies) if result.latencies else None}}))
    doc["canary"].pop("latencies", None)
    return json.dumps(doc, sort_keys=True, indent=2)
