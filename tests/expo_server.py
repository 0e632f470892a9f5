"""A static Prometheus exposition served on 127.0.0.1 (HTTP/1.1 keep-alive), for canary tests and the bench.

Run as a module in a subprocess: ``python -m tests.expo_server PORT_FILE [--nan] [--status 200]``;
it writes the port it bound to PORT_FILE and serves until killed.
"""
from __future__ import annotations

import argparse
import http.server
import os
import socketserver

BODY = ("# HELP nvitop_gpu_utilization GPU utilization\n# TYPE nvitop_gpu_utilization gauge\n"
        + "".join(f'nvitop_gpu_utilization{{gpu="{i}"}} {10 * i}.0\n' for i in range(8)))
NAN = ("# TYPE nvitop_nvlink_throughput gauge\n"
       + "".join(f'nvitop_nvlink_throughput{{gpu="{i}",link="0"}} NaN\n' for i in range(8)))


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # clients closing kept-alive connections at the end of a soak are not errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port_file")
    ap.add_argument("--nan", action="store_true")
    ap.add_argument("--status", type=int, default=200)
    ap.add_argument("--garbage", action="store_true")
    a = ap.parse_args()
    body = (BODY + (NAN if a.nan else "")).encode()
    if a.garbage:
        body = b"this is { not exposition\n"

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self):
            self.send_response(a.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = _Server(("127.0.0.1", 0), Handler)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(tmp, a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
