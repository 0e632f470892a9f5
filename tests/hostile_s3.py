"""A hostile S3 endpoint on 127.0.0.1 for the tests of the object-store readers: the parts of the S3 REST API the
readers use (ListObjectsV2, GetObject, HeadObject; path-style, signatures not checked), served from a dict, with
the attacks of issue #37 switched on per bucket or per key.

- ``listing``: ``"endless"`` (a new continuation token and the same page, forever), ``"endless-new"`` (a new
  token and ``page_size`` new keys, forever), ``"repeat"`` (tokens ``a b a b …``), ``"stuck"`` (the token asked
  for, given back), or None (honest pages of ``page_size`` keys);
- ``drip``: keys whose GET sends its headers and then one byte every ``drip_every`` seconds;
- ``redirect``: keys (or ``"*"``: every request) answered ``307`` to themselves;
- ``error``: keys answered ``500`` with this S3 error message (a server quoting a secret back).

An object's value is its bytes, or a function making them at each request (forty records of 16 MiB are not
held at once by the test).

Every request is recorded (method, path, query) in :attr:`HostileS3.asked`.
"""
from __future__ import annotations

import contextlib
import http.server
import threading
import urllib.parse
from xml.sax.saxutils import escape

__all__ = ["HostileS3", "upload_record"]


def upload_record(*, fingerprint: str, node: str, time: object, pad: int = 0) -> bytes:
    """An ``UPLOAD.json`` as ``forensics upload`` writes it (keys sorted, ``place`` after ``items``), its
    ``items`` padded with ``pad`` bytes of item records (a record of 16 MiB is a bundle of ~80,000 objects)."""
    import json

    long = "d/" * 170  # ~800 bytes an item: 16 MiB within the 20,000 objects a bundle's record may list

    def item(i: int) -> dict:
        return {"in_manifest": True, "key": f"x/{long}{i:08d}", "path": f"objects/{long}{i:08d}",
                "sha256": f"{i:064x}", "size": i, "verified_by": "sha256"}

    one = len(json.dumps({"items": [item(0), item(1)]}, indent=2)) - len(json.dumps({"items": [item(0)]}, indent=2))
    items = [item(i) for i in range(pad // one)]
    doc = {"bundle": "x/", "items": items, "not_as_sealed": [], "objects": [],
           "place": {"cluster": "c", "crash_id": "id", "fingerprint": fingerprint, "namespace": "ns", "node": node,
                     "pod": "p", "time": "TIME"}, "schema_version": 1, "uploaded_at": 1.0}
    text = json.dumps(doc, indent=2, sort_keys=True)
    return text.replace('"TIME"', time if isinstance(time, str) else json.dumps(time)).encode()


class HostileS3(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, object]] = {}  # bucket -> key -> bytes, or a function making them
        self.listing: dict[str, str | None] = {}  # bucket -> attack on its listing
        self.page_size = 1000
        self.drip: set[tuple[str, str]] = set()
        self.drip_every = 2.0
        self.redirect: set[tuple[str, str] | str] = set()
        self.error: dict[tuple[str, str], str] = {}
        self.asked: list[tuple[str, str, dict]] = []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with contextlib.suppress(OSError):
                    server._answer(self, "GET")

            def do_HEAD(self):
                with contextlib.suppress(OSError):
                    server._answer(self, "HEAD")

        super().__init__(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def env(self, base: dict[str, str], **extra: str) -> dict[str, str]:
        """``base`` without its AWS_ variables, naming this endpoint and made-up credentials."""
        env = {k: v for k, v in base.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID="AKIAHOSTILETEST00001",
                   AWS_SECRET_ACCESS_KEY="hostile-test-secret-0123456789", AWS_REGION="us-east-1",
                   AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null",
                   AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1")
        env.update(extra)
        return env

    def handle_error(self, request, client_address) -> None:
        pass  # a client that left mid-answer: what the tests make it do

    def close(self) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()

    # -- answers -----------------------------------------------------------------------------------------------

    def _answer(self, h, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        bucket, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
        self.asked.append((method, url.path, query))
        if "*" in self.redirect or (bucket, key) in self.redirect:
            h.send_response(307)
            h.send_header("Location", f"{self.endpoint}{h.path}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if not key:
            self._list(h, bucket, query)
            return
        if (bucket, key) in self.error:
            body = (f"<Error><Code>InternalError</Code><Message>{escape(self.error[bucket, key])}</Message>"
                    "</Error>").encode()
            h.send_response(500)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body if method == "GET" else b"")
            return
        data = self.objects.get(bucket, {}).get(key)
        if callable(data):
            data = data()
        if data is None:
            body = b"" if method == "HEAD" else (b"<Error><Code>NoSuchKey</Code><Message>no such key</Message>"
                                                  b"</Error>")
            h.send_response(404)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.send_header("ETag", f'"{abs(hash(data)):x}"')
        h.end_headers()
        if method == "HEAD":
            return
        if (bucket, key) in self.drip:
            for i in range(len(data)):
                if self.stop.wait(self.drip_every if i else 0):
                    return
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
            return
        h.wfile.write(data)

    def _list(self, h, bucket: str, query: dict) -> None:
        prefix = query.get("prefix", "")
        keys = sorted(k for k in self.objects.get(bucket, {}) if k.startswith(prefix))
        token = query.get("continuation-token")
        attack = self.listing.get(bucket)
        sizes = {}
        if attack is None:
            start = int(token) if token and token.isdigit() else 0
            page = keys[start:start + self.page_size]
            nxt = str(start + self.page_size) if start + self.page_size < len(keys) else None
        elif attack == "endless-new":
            n = int(token[1:]) if token else 0
            page = [f"{prefix}junk/{n:09d}/{i:05d}" for i in range(self.page_size)]
            sizes = dict.fromkeys(page, 1)
            nxt = f"t{n + 1}"
        else:
            page = keys[:self.page_size]
            n = sum(1 for m, _p, _q in self.asked if m == "GET" and not _p.strip("/").count("/"))
            nxt = {"endless": f"t{n}", "repeat": "ab"[n % 2], "stuck": token or "t0"}[attack]
        contents = "".join(f"<Contents><Key>{escape(k)}</Key><Size>{sizes.get(k, 1)}</Size>"
                           f"<ETag>\"e\"</ETag><StorageClass>STANDARD</StorageClass></Contents>" for k in page)
        body = (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
                f'2006-03-01/"><Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>'
                f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{self.page_size}</MaxKeys>"
                f"<IsTruncated>{'true' if nxt else 'false'}</IsTruncated>{contents}"
                + (f"<NextContinuationToken>{escape(nxt)}</NextContinuationToken>" if nxt else "")
                + "</ListBucketResult>").encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
