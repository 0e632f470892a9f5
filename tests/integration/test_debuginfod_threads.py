"""Two threads of one analysis asking for the same debug file at once (the libdw unwinder runs in a thread of
its own beside the Python reader, and both look up the executable's): a real HTTP server on 127.0.0.1 serving
a real debug file by build-id, slowly enough that the two requests overlap."""
from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objcopy") is None,
                                reason="no gcc / binutils")


@pytest.fixture
def served_debug_file(tmp_path):
    (tmp_path / "p.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-g", "-Wl,--build-id", "-o", str(tmp_path / "p"), str(tmp_path / "p.c")], check=True)
    debug = tmp_path / "p.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(tmp_path / "p"), str(debug)], check=True)
    out = subprocess.run(["readelf", "-n", str(debug)], capture_output=True, text=True, check=True).stdout
    build_id = next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line)
    data = debug.read_bytes()
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            if self.path != f"/buildid/{build_id}/debuginfo":
                self.send_error(404)
                return
            time.sleep(0.5)  # a server a little slow to answer: both requests are in flight together
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", build_id, data, requests
    finally:
        server.shutdown()
        server.server_close()


def test_two_threads_fetching_one_debug_file_both_get_it(served_debug_file, tmp_path, monkeypatch):
    """The two fetches wrote one temporary name (the pid's): the second failed to create it and, failing,
    deleted the first's, so neither kept the file and the build-id was remembered as missing -- the
    executable's frames went unnamed in about one analysis in ten."""
    from forensics.core import debuginfod

    url, build_id, data, requests = served_debug_file
    monkeypatch.setenv("DEBUGINFOD_URLS", url)
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(tmp_path / "cache"))
    monkeypatch.setattr(debuginfod, "_missed", set())
    # WHEN two threads ask for the same build-id at once
    got: list[str | None] = []
    threads = [threading.Thread(target=lambda: got.append(debuginfod.fetch_debuginfo(build_id))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # THEN both get the one kept file, fetched once, and nothing else is left in its cache entry
    dest = tmp_path / "cache" / build_id / "debuginfo"
    assert got == [str(dest), str(dest)]
    assert dest.read_bytes() == data and requests == [f"/buildid/{build_id}/debuginfo"]
    assert os.listdir(dest.parent) == ["debuginfo"]
    assert Path(dest).stat().st_mode & 0o777 == 0o400  # libdebuginfod's mode
