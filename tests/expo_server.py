"""A static Prometheus exposition served on 127.0.0.1 (HTTP/1.1 keep-alive), for canary tests and the bench.

Run as a module in a subprocess: ``python -m tests.expo_server PORT_FILE [--nan] [--status 200]
[--tls CERT KEY] [--log FILE] [--redirect URL] [--port N]``; it writes the port it bound to PORT_FILE and serves until
killed.  As prometheus_client does, it answers OpenMetrics when the Accept header asks for it and gzip when
Accept-Encoding allows it; ``--log`` appends each request's headers as a JSON line.
"""
from __future__ import annotations

import argparse
import gzip
import http.server
import json
import os
import socketserver
import ssl

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
    ap.add_argument("--port", type=int, default=0, help="the port to bind on 127.0.0.1 (0: any free one)")
    ap.add_argument("--nan", action="store_true")
    ap.add_argument("--status", type=int, default=200)
    ap.add_argument("--garbage", action="store_true")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--log")
    ap.add_argument("--redirect")
    ap.add_argument("--bomb", action="store_true", help="a gzip body that inflates past 64 MiB")
    a = ap.parse_args()
    body = (BODY + (NAN if a.nan else "")).encode()
    if a.garbage:
        body = b"this is { not exposition\n"
    bomb = gzip.compress(body + b"#" * (65 * 1024 * 1024), compresslevel=1) if a.bomb else b""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self):
            if a.log:
                with open(a.log, "a") as f:
                    f.write(json.dumps(dict(self.headers.items())) + "\n")
            if a.redirect:
                self.send_response(302)
                self.send_header("Location", a.redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            out, ctype = body, "text/plain; version=0.0.4; charset=utf-8"
            if "application/openmetrics-text" in self.headers.get("Accept", "") and not a.garbage:
                out, ctype = body + b"# EOF\n", "application/openmetrics-text; version=1.0.0; charset=utf-8"
            self.send_response(a.status)
            self.send_header("Content-Type", ctype)
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                out = bomb if a.bomb else gzip.compress(out)
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = _Server(("127.0.0.1", a.port), Handler)
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*a.tls)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(tmp, a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
