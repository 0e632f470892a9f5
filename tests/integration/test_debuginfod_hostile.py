"""A hostile debuginfod (a server these tests start on 127.0.0.1) cannot hold ``forensics analyze``, and what a
killed fetch leaves is removed; the debug files live in libdebuginfod's cache, shared with eu-stack.

The core is gcore's, of a stripped C program waiting in ``pause()`` (no core_pattern needed): its frames are
named only from the debug file a server sends.  The times measured are printed (``-s`` shows them), and
asserted only against the issue's generous bounds.
"""
from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

FORENSICS = Path(sys.executable).parent / "forensics"
WAITER_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) void forensics_waits_here(void) { puts("ready"); fflush(stdout); pause(); }
int main(void) { forensics_waits_here(); return 0; }
"""

pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objcopy") is None, reason="no gcc / binutils"),
    pytest.mark.skipif(shutil.which("gcore") is None, reason="gdb's gcore is not installed"),
]


def _build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line)


@pytest.fixture(scope="module")
def waiter_core(tmp_path_factory):
    """(core, stripped executable, its debug file, its build-id)"""
    d = tmp_path_factory.mktemp("debuginfod-hostile")
    (d / "waiter.c").write_text(WAITER_C)
    full = d / "waiter-full"
    subprocess.run(["gcc", "-g", "-O1", "-Wl,--build-id", "-o", str(full), str(d / "waiter.c")], check=True)
    debug = d / "served" / "waiter.debug"  # not beside the executable: libdwfl looks for EXE.debug there
    debug.parent.mkdir()
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(debug)], check=True)
    exe = d / "waiter"
    subprocess.run(["strip", "--strip-all", "-o", str(exe), str(full)], check=True)
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        r = subprocess.run(["gcore", "-o", str(d / "core"), str(proc.pid)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            pytest.skip(f"gcore could not attach: {r.stderr.strip()[-300:]}")
    finally:
        proc.kill()
        proc.wait()
    return d / f"core.{proc.pid}", exe, debug, _build_id(exe)


class _Server(http.server.ThreadingHTTPServer):
    """A debuginfod on 127.0.0.1: ``mode`` says how it answers every request (``drip-body``: a 64 MiB
    Content-Length then one byte every 2 s; ``drip-headers``: the status line one byte every 2 s; ``serve``: the
    debug files it was given by build-id, 404 for others)."""

    daemon_threads = True

    def __init__(self, mode: str, files: dict[str, Path] | None = None):
        self.mode, self.files, self.asked = mode, files or {}, []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.asked.append(self.path)
                with contextlib.suppress(OSError):  # the client left: what it is tested for
                    getattr(server, "_" + server.mode.replace("-", "_"))(self)

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def _drip(self, h, data: bytes) -> None:
        for i in range(len(data)):
            if self.stop.wait(2.0 if i else 0):
                return
            h.wfile.write(data[i:i + 1])
            h.wfile.flush()

    def _drip_body(self, h) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(64 << 20))
        h.end_headers()
        h.wfile.flush()
        self._drip(h, b"\x7fELF" + bytes(1 << 20))

    def _drip_headers(self, h) -> None:
        self._drip(h, b"HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n")

    def _serve(self, h) -> None:
        parts = h.path.strip("/").split("/")
        f = self.files.get(parts[1]) if len(parts) == 3 and parts[0] == "buildid" else None
        if f is None or parts[2] != "debuginfo":
            h.send_error(404)
            return
        data = f.read_bytes()
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


@pytest.fixture
def serve():
    servers = []

    def start(mode: str, files: dict[str, Path] | None = None) -> _Server:
        s = _Server(mode, files)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop.set()
        s.shutdown()
        s.server_close()


def _env(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "DEBUGINFOD_URLS": url, "DEBUGINFOD_CACHE_PATH": str(tmp_path / "debuginfod"),
            "FORENSICS_CACHE": str(tmp_path / "cache"), **extra}


def _partial_files(tmp_path: Path) -> list[str]:
    d = tmp_path / "debuginfod" / ".forensics-tmp"
    return sorted(os.listdir(d)) if d.is_dir() else []


def _wait_for(predicate, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the fetch to start")
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["drip-body", "drip-headers"])
def test_a_dripping_server_is_left_at_debuginfod_maxtime(waiter_core, serve, tmp_path, mode):
    core, _exe, _debug, build_id = waiter_core
    server = serve(mode)
    # WHEN the core is analyzed with DEBUGINFOD_MAXTIME=5 against a server that drips one byte every 2 s
    started = time.monotonic()
    r = subprocess.run([str(FORENSICS), "analyze", "--json", str(core)], capture_output=True, text=True,
                       env=_env(tmp_path, server.url, DEBUGINFOD_MAXTIME="5"), timeout=300)
    took = time.monotonic() - started
    print(f"\n{mode}: analyze left the dripping server after {took:.1f} s (DEBUGINFOD_MAXTIME=5)")
    # THEN the analysis ends, well before 15 s, with its unnamed frames: the server asked once (a server that
    # timed out is not asked again for the other libraries), nothing partial left
    assert r.returncode == 0, r.stderr
    assert server.asked and len(server.asked) == 1, server.asked
    assert took < 15, took
    assert _partial_files(tmp_path) == []
    assert not (tmp_path / "debuginfod" / build_id / "debuginfo").exists()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_fetch_ends_the_process_promptly(waiter_core, serve, tmp_path, sig, code):
    core, *_ = waiter_core
    server = serve("drip-body")
    proc = subprocess.Popen([str(FORENSICS), "analyze", str(core)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path, server.url, DEBUGINFOD_MAXTIME="600"))
    try:
        # GIVEN a fetch under way: the server asked, its temporary file written
        _wait_for(lambda: server.asked and _partial_files(tmp_path))
        time.sleep(0.5)
        # WHEN the process gets the signal
        sent = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        took = time.monotonic() - sent
        print(f"\n{sig.name} during a fetch: exit {rc} after {took:.2f} s")
    finally:
        proc.kill()
        proc.wait()
    # THEN it ends with the documented code, well before 10 s, its partial file removed
    assert rc == code, proc.stderr.read() if proc.stderr else ""
    assert took < 10, took
    assert _partial_files(tmp_path) == []


def test_what_a_killed_fetch_leaves_is_removed_by_the_next_run(waiter_core, serve, tmp_path):
    core, exe, debug, build_id = waiter_core
    dripping = serve("drip-body")
    proc = subprocess.Popen([str(FORENSICS), "analyze", str(core)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env(tmp_path, dripping.url, DEBUGINFOD_MAXTIME="600"))
    try:
        _wait_for(lambda: dripping.asked and _partial_files(tmp_path))
        time.sleep(0.5)
        # GIVEN a fetch SIGKILLed midway: its partial file is left behind (nothing could remove it)
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    left = _partial_files(tmp_path)
    assert len(left) == 1 and left[0].startswith(".debuginfo.") and left[0].endswith(".tmp"), left
    # WHEN the next analysis runs, against a server that has the debug file
    good = serve("serve", {build_id: debug})
    r = subprocess.run([str(FORENSICS), "analyze", "--json", str(core)], capture_output=True, text=True,
                       env=_env(tmp_path, good.url), timeout=300)
    assert r.returncode == 0, r.stderr
    # THEN the dead fetch's file is gone, and the debug file is kept in libdebuginfod's layout, read-only
    assert _partial_files(tmp_path) == []
    kept = tmp_path / "debuginfod" / build_id / "debuginfo"
    assert kept.read_bytes() == debug.read_bytes()
    assert kept.stat().st_mode & 0o777 == 0o400
    assert "forensics_waits_here" in r.stdout


def _closed_port() -> str:
    with socket.socket() as s:  # bound, never listening, closed: a connection there is refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.skipif(shutil.which("eu-stack") is None, reason="elfutils' eu-stack is not installed")
def test_eu_stack_reads_the_debug_file_forensics_fetched(waiter_core, serve, tmp_path):
    core, exe, debug, build_id = waiter_core
    closed = _closed_port()
    eu_stack = ["eu-stack", f"--core={core}", f"--executable={exe}"]
    # GIVEN eu-stack, without the file, names no frame of the stripped program (the oracle can fail)
    before = subprocess.run(eu_stack, capture_output=True, text=True, env=_env(tmp_path, closed), timeout=120)
    assert "forensics_waits_here" not in before.stdout
    # WHEN forensics fetches it from a server into DEBUGINFOD_CACHE_PATH
    server = serve("serve", {build_id: debug})
    r = subprocess.run([str(FORENSICS), "analyze", "--json", str(core)], capture_output=True, text=True,
                       env=_env(tmp_path, server.url), timeout=300)
    assert r.returncode == 0 and "forensics_waits_here" in r.stdout, r.stderr
    # THEN eu-stack, its DEBUGINFOD_URLS at a closed port, names the frames from that file
    after = subprocess.run(eu_stack, capture_output=True, text=True, env=_env(tmp_path, closed), timeout=120)
    assert "forensics_waits_here" in after.stdout, after.stdout + after.stderr


@pytest.mark.skipif(shutil.which("debuginfod-find") is None, reason="libdebuginfod's debuginfod-find is not installed")
def test_forensics_reads_the_debug_file_libdebuginfod_fetched(waiter_core, serve, tmp_path):
    core, exe, debug, build_id = waiter_core
    server = serve("serve", {build_id: debug})
    # GIVEN libdebuginfod's own client fetched the file into DEBUGINFOD_CACHE_PATH
    (tmp_path / "debuginfod").mkdir()
    got = subprocess.run(["debuginfod-find", "debuginfo", build_id], capture_output=True, text=True,
                         env=_env(tmp_path, server.url), timeout=120)
    assert got.returncode == 0, got.stderr
    assert Path(got.stdout.strip()) == tmp_path / "debuginfod" / build_id / "debuginfo"
    # WHEN forensics analyzes the core with its servers unreachable
    r = subprocess.run([str(FORENSICS), "analyze", "--json", str(core)], capture_output=True, text=True,
                       env=_env(tmp_path, _closed_port()), timeout=300)
    # THEN it names the frames from libdebuginfod's file, asking nobody
    assert r.returncode == 0 and "forensics_waits_here" in r.stdout, r.stderr
    assert len(server.asked) == 1


def test_a_build_id_every_server_lacks_is_not_asked_again_for_cache_miss_s(waiter_core, serve, tmp_path):
    core, _exe, _debug, build_id = waiter_core
    server = serve("serve", {})  # 404 for everything
    run = [str(FORENSICS), "analyze", "--json", str(core)]
    # WHEN two analyses run one after the other against a server that has nothing
    for _ in range(2):
        r = subprocess.run(run, capture_output=True, text=True, env=_env(tmp_path, server.url), timeout=300)
        assert r.returncode == 0, r.stderr
    # THEN the first left libdebuginfod's negative entry (an empty file) and the second did not ask again
    miss = tmp_path / "debuginfod" / build_id / "debuginfo"
    assert miss.is_file() and miss.stat().st_size == 0
    assert server.asked.count(f"/buildid/{build_id}/debuginfo") == 1, server.asked
    # AND once cache_miss_s has passed (libdebuginfod's setting, in the cache) it is asked again
    (tmp_path / "debuginfod" / "cache_miss_s").write_text("0")
    os.utime(miss, (time.time() - 5, time.time() - 5))
    r = subprocess.run(run, capture_output=True, text=True, env=_env(tmp_path, server.url), timeout=300)
    assert server.asked.count(f"/buildid/{build_id}/debuginfo") == 2, server.asked


def test_a_home_that_cannot_be_written_falls_back_to_the_forensics_cache(waiter_core, serve, tmp_path):
    """A container's read-only root: libdebuginfod's default (~/.cache/debuginfod_client) cannot be made, and
    DEBUGINFOD_CACHE_PATH is not given: the file is fetched into forensics' own cache, in the same layout."""
    core, _exe, debug, build_id = waiter_core
    server = serve("serve", {build_id: debug})
    env = _env(tmp_path, server.url, HOME="/proc")  # nothing can be made under /proc, root or not
    del env["DEBUGINFOD_CACHE_PATH"]
    env.pop("XDG_CACHE_HOME", None)
    r = subprocess.run([str(FORENSICS), "analyze", "--json", str(core)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and "forensics_waits_here" in r.stdout, r.stderr
    assert (tmp_path / "cache" / "debuginfod" / build_id / "debuginfo").read_bytes() == debug.read_bytes()
