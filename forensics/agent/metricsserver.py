"""The agent's metrics endpoint: ``GET /metrics`` over HTTP/1.x, bounded in threads, connections and time.

prometheus_client's ``start_http_server`` gives each connection a thread of its own and no read timeout, so
idle connections pile up threads until the pod's pids limit: scrapes stop, and the analysis the agent forks
cannot start.  Here the threads are made once, at start: one loop that accepts connections and reads their
request heads without blocking (a selector), and a fixed pool of workers that answers complete requests.

- an idle connection, or one that sends its head slower than ``timeout`` seconds in all, is closed;
- at most ``max_connections`` are open: past that the oldest is closed for the newest (a flood of idle
  sockets cannot keep a scrape out);
- a request head is at most 8 KiB; an answer is written within ``timeout`` seconds, then the connection closes.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import queue
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["MetricsServer", "HEALTH_PATH"]

HEALTH_PATH = "/healthz"  # a probe's path: the process's health, never the metrics

MAX_HEAD = 8192


class _Conn:
    __slots__ = ("sock", "head", "since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.head = bytearray()
        self.since = time.monotonic()


class MetricsServer:
    """Serve ``render()`` (bytes of ``content_type``) at ``/metrics`` and ``/`` on ``address:port``, and the
    process's health at ``/healthz``: ``200 ok`` while ``health()`` says None, else ``503`` and its reason (a
    probe's answer, never the metrics).

    :param workers: threads that answer requests (made at :meth:`start`, never more)
    :param max_connections: connections open at once (the oldest closed first past it)
    :param timeout: seconds a connection may take to send its request head, and to take its answer
    """

    def __init__(self, address: str, port: int, render: Callable[[], bytes], *, content_type: str,
                 workers: int = 2, max_connections: int = 256, timeout: float = 10.0,
                 health: Callable[[], str | None] | None = None) -> None:
        self.render = render
        self.health = health
        self.content_type = content_type
        self.workers = workers
        self.max_connections = max_connections
        self.timeout = timeout
        info = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.listener = socket.socket(info[0], socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(info[4])
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._ready: queue.Queue[tuple[socket.socket, bytes] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the accepting loop and the workers (all the threads this server will ever have)."""
        self._threads = [threading.Thread(target=self._accept_loop, name="metrics-accept", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"metrics-{i}", daemon=True)
                          for i in range(self.workers)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        for _ in range(self.workers):
            self._ready.put(None)
        for t in self._threads:
            t.join(timeout=self.timeout + 1)
        self.listener.close()

    def _accept_loop(self) -> None:
        conns: collections.OrderedDict[int, _Conn] = collections.OrderedDict()  # oldest first
        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ, None)
            while not self._stop.is_set():
                try:
                    for key, _ in sel.select(timeout=min(1.0, self.timeout / 2)):
                        if key.data is None:
                            self._accept(sel, conns)
                        else:
                            self._read_head(sel, conns, key.data)
                except Exception as e:  # noqa: BLE001 - the endpoint outlives one connection's oddity
                    print(f"forensics agent serve: metrics: {type(e).__name__}: {e}", file=sys.stderr)
                    time.sleep(0.1)
                now = time.monotonic()
                while conns and now - next(iter(conns.values())).since > self.timeout:  # idle, or too slow
                    self._drop(sel, conns, next(iter(conns)))
            for fd in list(conns):
                self._drop(sel, conns, fd)

    def _accept(self, sel: selectors.BaseSelector, conns: collections.OrderedDict[int, _Conn]) -> None:
        for _ in range(64):  # what is waiting now; the loop comes back for the rest
            try:
                sock, _addr = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and conns:
                    self._drop(sel, conns, next(iter(conns)))  # out of descriptors: the oldest makes room
                    continue
                return
            if len(conns) >= self.max_connections:
                self._drop(sel, conns, next(iter(conns)))
            sock.setblocking(False)
            conn = _Conn(sock)
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _read_head(self, sel: selectors.BaseSelector, conns: collections.OrderedDict[int, _Conn],
                   conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        conn.head += data
        if not data or len(conn.head) > MAX_HEAD:
            self._drop(sel, conns, conn.sock.fileno())
        elif b"\r\n\r\n" in conn.head or b"\n\n" in conn.head:
            sel.unregister(conn.sock)
            del conns[conn.sock.fileno()]
            conn.sock.setblocking(True)
            conn.sock.settimeout(self.timeout)
            self._ready.put((conn.sock, bytes(conn.head)))

    @staticmethod
    def _drop(sel: selectors.BaseSelector, conns: collections.OrderedDict[int, _Conn], fd: int) -> None:
        conn = conns.pop(fd)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        conn.sock.close()

    def _work(self) -> None:
        while True:
            job = self._ready.get()
            if job is None:
                return
            sock, head = job
            try:
                self._answer(sock, head)
            except OSError:  # the client went away, or took its answer too slowly
                pass
            except Exception as e:  # noqa: BLE001 - one request's failure never stops the endpoint
                print(f"forensics agent serve: metrics: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                sock.close()

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        line = head.split(b"\n", 1)[0].decode("latin-1").strip().split()
        method, path = (line[0], line[1]) if len(line) >= 2 else ("", "")
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            status, body, ctype = "405 Method Not Allowed", b"GET /metrics\n", "text/plain"
        elif path == HEALTH_PATH:
            try:
                why = self.health() if self.health is not None else None
            except Exception as e:  # noqa: BLE001 - a health check that fails says the process is not well
                why = type(e).__name__
            status, body, ctype = ("200 OK", b"ok\n", "text/plain") if why is None else \
                ("503 Service Unavailable", why.encode("utf-8", "replace")[:1024] + b"\n", "text/plain")
        elif path not in ("/metrics", "/"):
            status, body, ctype = "404 Not Found", b"GET /metrics\n", "text/plain"
        else:
            try:
                status, body, ctype = "200 OK", self.render(), self.content_type
            except Exception as e:  # noqa: BLE001 - said to the scraper, and the endpoint stays
                status, body, ctype = "500 Internal Server Error", f"{type(e).__name__}\n".encode(), "text/plain"
        out = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n").encode()
        sock.sendall(out + (body if method == "GET" else b""))  # within the socket's timeout, in all
