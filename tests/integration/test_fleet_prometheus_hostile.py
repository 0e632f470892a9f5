"""What a broken or hostile server on Prometheus' URL may answer: a clear one-line error each (#13: Prometheus answers).

A real HTTP server on 127.0.0.1, made here, answers ``/api/v1/query`` with one wrong shape at a time: JSON that
is not an object, a success without data, data that is not a vector, a series whose labels are not strings, a
sample that is not [time, value], NaN, an answer past the size bound.  ``fleet --prometheus`` used to end in
"internal error" (AttributeError, KeyError, TypeError, ValueError) for each of these.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from forensics.cli import cli

ANSWERS = {
    "a list": [],
    "no status": {"data": {}},
    "success without data": {"status": "success"},
    "data a string": {"status": "success", "data": "x"},
    "a matrix": {"status": "success", "data": {"resultType": "matrix", "result": []}},
    "result an object": {"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}},
    "a series a string": {"status": "success", "data": {"resultType": "vector", "result": ["x"]}},
    "labels not strings": {"status": "success", "data": {"resultType": "vector",
                                                          "result": [{"metric": {"node": 7}, "value": [1, "1"]}]}},
    "no value": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
    "value not a number": {"status": "success", "data": {"resultType": "vector",
                                                          "result": [{"metric": {}, "value": [1, "many"]}]}},
    "NaN": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "NaN"]}]}},
    "scalar of nothing": {"status": "success", "data": {"resultType": "scalar", "result": None}},
    "an error with an object": {"status": "error", "errorType": {"x": [1]}, "error": ["y"] * 10000},
    "deep JSON": "[" * 100000 + "]" * 100000,
    "over the size bound": None,  # 65 MiB of JSON
}


class _Server:
    def __init__(self, answer):
        body = (json.dumps(answer) if not isinstance(answer, str) else answer).encode() if answer is not None else None

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if body is None:
                    chunk = b" " * (1 << 20)
                    self.wfile.write(b'{"status": "success", "data": {"resultType": "vector", "result": []}')
                    for _ in range(65):
                        self.wfile.write(chunk)
                    self.wfile.write(b"}")
                else:
                    self.wfile.write(body)

            do_GET = do_POST

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("case", list(ANSWERS))
def test_a_hostile_answer_is_one_clear_error(case):
    server = _Server(ANSWERS[case])
    try:
        # WHEN fleet reads the fleet from it
        r = CliRunner().invoke(cli, ["fleet", "--prometheus", server.url])
    finally:
        server.close()
    # THEN one clear error, never an internal one
    assert r.exit_code == 1, (r.exit_code, r.output)
    errors = [line for line in r.stderr.splitlines() if line.startswith("forensics: error: prometheus:")]
    assert len(errors) == 1 and "internal error" not in r.stderr, r.stderr
    assert len(errors[0]) < 600
