"""DEBUGINFOD_URLS on analyze's default path: Debian's debuginfod serves a directory of debug files.

A C program is built with DWARF, its debug file split off (``objcopy --only-keep-debug``) into a
directory that ``debuginfod -F`` indexes, and the program stripped of everything (``strip --strip-all``:
no symbol table either) before it crashes.  Without a server its frames have no name; with
``DEBUGINFOD_URLS`` naming the server (and no ``--debuginfod``: libdw unwinds, not gdb) they are named
with their source lines.  debuginfod has no option to listen on loopback only, so it runs in a network
namespace of its own (``unshare --net``: only ``lo`` there), and so does the analysis that asks it.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FORENSICS = Path(sys.executable).parent / "forensics"
CRASHER_C = r"""
#include <stdlib.h>
__attribute__((noinline)) static void write_through(volatile int *p) { *p = 42; }
__attribute__((noinline)) void crash_in_debuginfod_test(int depth) {
    if (depth > 0) { crash_in_debuginfod_test(depth - 1); return; }
    write_through((volatile int *)16);
}
int main(void) { crash_in_debuginfod_test(2); return 0; }
"""
#: in the namespace: loopback up, debuginfod on it, wait until it serves the build-id, then the analysis with
#: DEBUGINFOD_URLS and without
SCRIPT = r"""
set -e
ip link set lo up
# the server without DEBUGINFOD_URLS: it would ask itself for what it has not indexed yet, and wait on itself
DEBUGINFOD_URLS= debuginfod -F -p "$PORT" -d "$WORK/db.sqlite" -t 0 -g 0 "$WORK/debug" >"$WORK/debuginfod.log" 2>&1 &
server=$!
trap 'kill -KILL $server; wait $server 2>/dev/null || true' EXIT
"$PYTHON" - <<'EOF'
import os, sys, time, urllib.request, urllib.error
url = f"http://127.0.0.1:{os.environ['PORT']}/buildid/{os.environ['BUILD_ID']}/debuginfo"
for _ in range(600):
    try:
        urllib.request.urlopen(url, timeout=5).read(1)
        sys.exit(0)
    except (OSError, urllib.error.URLError):
        time.sleep(0.1)
sys.exit("debuginfod never served " + url)
EOF
eval "$ANALYSES"
"""
#: the analyses of the default-path test: with DEBUGINFOD_URLS, and without
WITH_AND_WITHOUT = """
"$FORENSICS" analyze --json "$CORE" >"$OUT/with.json"
DEBUGINFOD_URLS= "$FORENSICS" analyze --json "$CORE" >"$OUT/without.json" || true
"""
#: the analyses of the size-bound test: DEBUGINFOD_MAXSIZE one byte short of the debug file, then its size
SIZE_BOUND = """
DEBUGINFOD_MAXSIZE=$((SIZE - 1)) DEBUGINFOD_CACHE_PATH="$OUT/short" "$FORENSICS" analyze --json "$CORE" \
    >"$OUT/short.json" || true
DEBUGINFOD_MAXSIZE=$SIZE DEBUGINFOD_CACHE_PATH="$OUT/exact" "$FORENSICS" analyze --json "$CORE" >"$OUT/exact.json"
"""

pytestmark = [
    pytest.mark.skipif(shutil.which("debuginfod") is None, reason="Debian's debuginfod is not installed "
                                                                   "(apt-get install debuginfod)"),
    pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                       reason="debuginfod runs in a network namespace of its own: unshare, as root"),
    pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objcopy") is None, reason="no gcc / binutils"),
]


def _build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line)


def _unlimited_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.fixture(scope="module")
def stripped_core(tmp_path_factory, core_pattern):
    d = tmp_path_factory.mktemp("debuginfod-server")
    (d / "crasher.c").write_text(CRASHER_C)
    full = d / "crasher-full"
    subprocess.run(["gcc", "-g", "-O1", "-o", str(full), str(d / "crasher.c")], check=True)
    (d / "debug").mkdir()
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(d / "debug" / "crasher.debug")], check=True)
    run = d / "run"
    run.mkdir()
    exe = run / "crasher"
    subprocess.run(["strip", "--strip-all", "-o", str(exe), str(full)], check=True)
    p = subprocess.run([str(exe)], cwd=run, preexec_fn=_unlimited_core, capture_output=True)
    assert p.returncode == -11
    cores = [f for f in run.iterdir() if f.name.startswith("core")]
    if not cores:
        pytest.skip("the crash left no core in its directory (core size limit or pattern)")
    return d, cores[0], _build_id(exe)


def _serve_and_analyze(stripped_core, out: Path, analyses: str, **extra: str) -> None:
    """Run debuginfod on the debug directory in a network namespace of its own, then ``analyses`` (shell) there."""
    d, core, build_id = stripped_core
    import socket

    with socket.socket() as s:  # a free port number (in the namespace every port is free: any will do)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORK": str(d), "OUT": str(out), "PORT": str(port), "BUILD_ID": build_id,
           "CORE": str(core), "PYTHON": sys.executable, "FORENSICS": str(FORENSICS),
           "FORENSICS_CACHE": str(out / "cache"), "DEBUGINFOD_URLS": f"http://127.0.0.1:{port}",
           "DEBUGINFOD_CACHE_PATH": str(out / "client"), "ANALYSES": analyses, **extra}
    r = subprocess.run(["unshare", "--net", "bash", "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr + (d / "debuginfod.log").read_text()[-2000:]


def _crashed_frames(path: Path) -> list[dict]:
    analysis = json.loads(path.read_text())["analysis"]
    return [f for t in analysis["snapshot"]["threads"] if t["is_crashed"] for f in t["native_frames"]]


def test_default_path_fetches_debug_info_from_debuginfod_urls(stripped_core, tmp_path):
    build_id = stripped_core[2]
    # WHEN the stripped program's core is analyzed on the default path with DEBUGINFOD_URLS set
    _serve_and_analyze(stripped_core, tmp_path, WITH_AND_WITHOUT)
    analysis = json.loads((tmp_path / "with.json").read_text())["analysis"]
    frames = _crashed_frames(tmp_path / "with.json")
    # THEN libdw (not gdb) named the stripped program's frames from the served debug file, with source lines
    assert analysis["snapshot"]["native_method"] == "libdw"
    named = [f for f in frames if f["symbol"] and "crash_in_debuginfod_test" in f["symbol"]]
    assert named and all(f["file"] and f["file"].endswith("crasher.c") for f in named), frames
    assert any(f["symbol"] and "write_through" in f["symbol"] for f in frames), frames
    # AND the file was kept in libdebuginfod's cache (DEBUGINFOD_CACHE_PATH), checked to be that build's
    assert (tmp_path / "client" / build_id / "debuginfo").is_file()
    # AND without DEBUGINFOD_URLS (offline, as before) the same frames have no name
    off_frames = _crashed_frames(tmp_path / "without.json")
    assert not any(f["symbol"] and "crash_in_debuginfod_test" in f["symbol"] for f in off_frames), off_frames


def test_a_debug_file_over_debuginfod_maxsize_is_not_fetched(stripped_core, tmp_path):
    """DEBUGINFOD_MAXSIZE bounds one file as libdebuginfod's does: a larger one is refused, nothing kept."""
    d, _core, build_id = stripped_core
    size = (d / "debug" / "crasher.debug").stat().st_size
    # WHEN the core is analyzed with DEBUGINFOD_MAXSIZE one byte short of the served file, then equal to it
    _serve_and_analyze(stripped_core, tmp_path, SIZE_BOUND, SIZE=str(size))
    # THEN one byte short: the file is refused, the frames have no name, the cache holds nothing of it
    short = _crashed_frames(tmp_path / "short.json")
    assert not any(f["symbol"] and "crash_in_debuginfod_test" in f["symbol"] for f in short), short
    assert not (tmp_path / "short" / build_id).exists()
    # AND at its size it is fetched, kept and used
    exact = _crashed_frames(tmp_path / "exact.json")
    assert any(f["symbol"] and "crash_in_debuginfod_test" in f["symbol"] for f in exact), exact
    assert (tmp_path / "exact" / build_id / "debuginfo").stat().st_size == size
