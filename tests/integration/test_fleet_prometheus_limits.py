"""``fleet --prometheus`` against a server that redirects, answers huge or drips (#33: other readers).

Real HTTP servers on 127.0.0.1, made here:
- one that redirects every request to another origin (another port: a server of its own that records what
  reaches it): the bearer token and the basic-auth password used to follow a 301/302/303 there;
- one whose every answer is 12 MiB of real series: the queries run in parallel and each answer was read up to
  64 MiB, the answers together unbounded (three 58 MiB answers took 660 MB);
- one that drips its headers or its answer a byte at a time: each socket operation had a timeout, the run none.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from forensics.fleet.prom import PromAuth, PromClient

TOKEN = "s3cr3t-bearer-token-planted"
PASSWORD = "planted-basic-password"
VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "1"]}]}}


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 whose POST and GET run ``respond(handler)``; records each request's path
    and Authorization header."""

    def __init__(self, respond):
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
                with contextlib.suppress(OSError):  # the client went away
                    respond(self)

            do_GET = do_POST

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(h, status=200, body=b"", headers=()):
    h.send_response(status)
    for k, v in headers:
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _run(tmp_path, *args, env=None):
    """``forensics ARGS`` as a process: (exit status, stderr, its peak resident memory in MiB).

    The peak is the process's own VmHWM read as it exits (wait4's ru_maxrss would count this test process's
    memory from before the exec)."""
    hwm = tmp_path / "hwm"
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: open({str(hwm)!r}, 'w').write(open('/proc/self/status').read()))\n"
            "sys.argv = ['forensics', *sys.argv[1:]]\n"
            "from forensics.cli import main\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    peak = next((int(line.split()[1]) / 1024 for line in hwm.read_text().splitlines() if line.startswith("VmHWM:")),
                float("nan")) if hwm.exists() else float("nan")
    return p.returncode, p.stderr, peak


def _one_error(stderr):
    errors = [line for line in stderr.splitlines() if line.startswith("forensics: error: prometheus:")]
    assert len(errors) == 1 and "internal error" not in stderr and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("auth", ["bearer", "basic"])
def test_credentials_never_follow_a_redirect_to_another_origin(tmp_path, status, auth):
    # GIVEN a server that redirects every request to another origin (another port), which answers like Prometheus
    with _Server(lambda h: _answer(h, body=json.dumps(VECTOR).encode())) as other, \
            _Server(lambda h: _answer(h, status, headers=[("Location", f"{other.url}{h.path}")])) as first:
        token = tmp_path / "token"
        token.write_text(TOKEN)
        args = ["--bearer-token-file", str(token)] if auth == "bearer" else []
        env = {"FORENSICS_PROMETHEUS_BASIC_AUTH": f"admin:{PASSWORD}"} if auth == "basic" else {}
        # WHEN fleet reads the fleet from the first
        rc, stderr, _ = _run(tmp_path, "fleet", "--prometheus", first.url, *args, env=env)
    # THEN no Authorization header (nor any request) reaches the other origin, and the run says why in one line
    assert first.seen and all(a is not None for _, _, a in first.seen)
    assert [a for _, _, a in other.seen if a is not None] == []
    assert rc == 1
    line = _one_error(stderr)
    assert "another origin" in line and f"127.0.0.1:{other.port}" in line, line
    assert TOKEN not in stderr and PASSWORD not in stderr


def test_a_redirect_within_the_origin_is_followed_with_the_query_and_the_credentials(tmp_path):
    # GIVEN Prometheus behind a path prefix, its root redirecting there (a proxy's habit)
    def respond(h):
        if h.path.startswith("/prom/"):
            _answer(h, body=json.dumps(VECTOR).encode())
        else:
            _answer(h, 302, headers=[("Location", f"/prom{h.path}")])

    token = tmp_path / "token"
    token.write_text(TOKEN)
    with _Server(respond) as server:
        # WHEN a query is asked at the root
        got = PromClient(server.url, PromAuth(bearer_token_file=str(token))).query("up")
    # THEN it is asked again, as a POST with the token, at the prefix
    assert got == [({}, 1.0)]
    assert [(m, p) for m, p, _ in server.seen] == [("POST", "/api/v1/query"), ("POST", "/prom/api/v1/query")]
    assert all(a == f"Bearer {TOKEN}" for _, _, a in server.seen)


def _huge_vector(mib: int) -> bytes:
    series = [{"metric": {"node": f"node-{i:08d}", "label_nvidia_com_gpu_product": "NVIDIA-H20"}, "value": [1, "1"]}
              for i in range(mib * (1 << 20) // 100)]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()


def test_huge_answers_are_bounded_together(tmp_path):
    # GIVEN a server whose every answer is 12 MiB of series (each under the old bound of one answer)
    body = _huge_vector(12)
    with _Server(lambda h: _answer(h, body=body)) as server:
        # WHEN fleet reads the fleet from it
        rc, stderr, peak = _run(tmp_path, "fleet", "--prometheus", server.url)
    # THEN one clear error when the answers together pass the bound, the memory held bounded with them: 32 MiB of
    # answers, of which at most two whole ones parsed (~90 MiB each for this shape) — 61-230 MiB as the reads
    # interleave; 468 MiB before, every answer read, parsed and kept whole
    assert rc == 1
    line = _one_error(stderr)
    assert "in all" in line, line
    assert peak < 320, f"peak resident memory {peak:.0f} MiB"


@pytest.mark.parametrize("where", ["headers", "answer"])
def test_a_dripping_server_cannot_hold_the_run_past_its_deadline(tmp_path, where):
    # GIVEN a server that sends a byte of its headers, or of its answer, every 0.2 s for as long as it is let
    stop = threading.Event()

    def respond(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        if where == "answer":
            h.wfile.write(b"Content-Type: application/json\r\n\r\n" + b'{"status": "success", "data": ')
        else:
            h.wfile.write(b"X-Drip: ")
        h.wfile.flush()
        while not stop.is_set():
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.2)

    with _Server(respond) as server:
        # WHEN fleet reads the fleet from it with a deadline of 3 s
        try:
            rc, stderr, _ = _run(tmp_path, "fleet", "--prometheus", server.url, "--deadline", "3")
        finally:
            stop.set()
    # THEN it ends with one clear line naming the deadline (the process's own timeout, 120 s, never reached)
    assert rc == 1
    line = _one_error(stderr)
    assert "within 3 s" in line and "--deadline" in line, line


def test_the_deadline_counts_from_the_start_of_the_run():
    # GIVEN a server that answers each request after 0.8 s
    def respond(h):
        time.sleep(0.8)
        _answer(h, body=json.dumps(VECTOR).encode())

    with _Server(respond) as server:
        client = PromClient(server.url, deadline=2)
        # WHEN three requests are asked one after the other
        client.query("up")
        client.query("up")
        # THEN the third, which would end past the run's 2 s, is refused, though each took less than 2 s
        with pytest.raises(Exception, match="within 2 s"):
            client.query("up")

