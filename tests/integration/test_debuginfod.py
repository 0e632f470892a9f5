"""--debuginfod: gdb fetches a stripped library's debug info from a debuginfod server (a stand-in on 127.0.0.1).

The stand-in serves ``GET /buildid/<id>/debuginfo`` from a directory, as the debuginfod
protocol names it; nothing else runs, and it records what was asked.
"""
from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.crashers.make_core import CoresUnavailable, build_stripped_libcrash, make_core
from tests.pythons import discover_pythons

pytestmark = [pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed"),
              pytest.mark.skipif(shutil.which("objcopy") is None, reason="binutils (objcopy) not installed")]


class _Debuginfod(http.server.ThreadingHTTPServer):
    def __init__(self, files: dict[str, Path]):
        self.files, self.asked = files, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(h):
                self.asked.append(h.path)
                parts = h.path.strip("/").split("/")
                wanted = len(parts) == 3 and parts[0] == "buildid" and parts[2] == "debuginfo"
                f = self.files.get(parts[1]) if wanted else None
                if f is None:
                    h.send_response(404)
                    h.end_headers()
                    return
                data = f.read_bytes()
                h.send_response(200)
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)

        super().__init__(("127.0.0.1", 0), Handler)


def _build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line)


@pytest.fixture(scope="module")
def stripped_crash(tmp_path_factory, core_pattern):
    pythons = discover_pythons()
    if not pythons:
        pytest.skip("no pyenv CPython found")
    python = pythons[max(pythons, key=lambda v: tuple(map(int, v.split("."))))]
    d = tmp_path_factory.mktemp("debuginfod")
    stripped, debug = build_stripped_libcrash(d)
    try:
        core = make_core(d, python, "heap-prev", libcrash=stripped)
    except CoresUnavailable as e:
        pytest.skip(str(e))
    return core, _build_id(stripped), debug


def _culprit(args, core, monkeypatch, tmp_path) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)  # libdebuginfod makes its cache directory, not its parents
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(tmp_path / "client-cache"))  # gdb's client cache: fresh
    r = CliRunner().invoke(cli, ["analyze", "--json", *args, str(core)], catch_exceptions=False)
    doc = json.loads(r.stdout)["analysis"]
    crashed = next(t for t in doc["snapshot"]["threads"] if t["is_crashed"])
    return next(f for f in crashed["native_frames"] if (f["symbol"] or "").startswith("forensics_heap"))


def test_debug_info_comes_from_the_server_only_when_asked(stripped_crash, monkeypatch, tmp_path):
    core, build_id, debug = stripped_crash
    server = _Debuginfod({build_id: debug})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # without --debuginfod: the stripped library names its function but has no file:line, and no request went out
        frame = _culprit([], core, monkeypatch, tmp_path / "a")
        assert frame["file"] is None and frame["line"] is None
        assert server.asked == []
        # with it: gdb asked the server for that build-id and the frame has its source line
        url = f"http://127.0.0.1:{server.server_address[1]}"
        frame = _culprit(["--debuginfod", url], core, monkeypatch, tmp_path / "b")
        assert f"/buildid/{build_id}/debuginfo" in server.asked
        assert frame["file"].endswith("libcrash.c") and frame["line"] > 0
    finally:
        server.shutdown()
        server.server_close()
