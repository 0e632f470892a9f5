"""systemd-coredump's store as analyze's input: a real Python crash's core, compressed as systemd-coredump
keeps it (zstd, lz4, xz; named core.COMM.UID.BOOTID.PID.USEC.EXT), read from the cache, never beside it."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

FORENSICS = Path(sys.executable).parent / "forensics"
CRASHER = "import ctypes, sys\nopen(sys.argv[1]).read()\nctypes.string_at(0)\n"  # waits on a FIFO, then SIGSEGV


def _unlimited_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _analyze(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(FORENSICS), "analyze", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def plain_core(tmp_path_factory, core_pattern) -> Path:
    """A real core of a crashed Python process, written by the kernel into its cwd (the suite's pattern)."""
    run = tmp_path_factory.mktemp("plain-core")
    fifo = run / "go"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c", CRASHER, str(fifo)], cwd=run, preexec_fn=_unlimited_core,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(fifo, "w") as f:
        f.write("go\n")
    assert p.wait(timeout=120) == -signal.SIGSEGV
    cores = [f for f in run.iterdir() if f.name.startswith("core")]
    if not cores:
        pytest.skip("the crash left no core in its directory (core size limit or pattern)")
    return cores[0]


@pytest.mark.parametrize("codec,compress", [("zst", ["zstd", "-q", "-c"]), ("lz4", ["lz4", "-q", "-c"]),
                                            ("xz", ["xz", "-c"])])
def test_each_compression_of_the_store_reads_as_the_plain_core(plain_core, tmp_path, codec, compress):
    # GIVEN a real core compressed as systemd-coredump writes it (built with zstd, lz4 or xz), in a store
    # copied off its node (no journal entry here names it)
    if shutil.which(compress[0]) is None:
        pytest.skip(f"no {compress[0]} program to make a {codec} core")
    other = tmp_path / "store"
    other.mkdir()
    name = f"core.python3.0.0123456789abcdef0123456789abcdef.{os.getpid()}.1796143713000000.{codec}"
    (other / name).write_bytes(subprocess.run(compress, input=plain_core.read_bytes(), capture_output=True,
                                              check=True).stdout)
    env = {"FORENSICS_CACHE": str(tmp_path / "cache")}
    want = json.loads(_analyze("--json", str(plain_core), env=env).stdout)["analysis"]["fingerprint"]
    assert want
    # WHEN its directory is analyzed
    r = _analyze("--json", str(other), env=env)
    doc = json.loads(r.stdout)
    # THEN the core is found and reads to the same crash; the journal's silence is said, not an error
    [row] = doc["cores"]
    assert row["fingerprint"] == want, r.stderr
    assert row["store"]["compression"] == {"zst": "zstd"}.get(codec, codec)
    assert row["store"]["journal"] == [] and "COREDUMP_FILENAME" in row["store"]["journal_missing"]
    assert os.listdir(other) == [name]  # nothing written beside it


def test_decompression_is_bounded_and_damage_is_one_line(plain_core, tmp_path):
    packed = tmp_path / "core.python3.0.0.1.2.zst"
    packed.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=plain_core.read_bytes(), capture_output=True,
                                      check=True).stdout)
    cache = tmp_path / "cache"
    # GIVEN a bound below the core's size WHEN it is analyzed THEN one line says so, and no core is left
    r = _analyze(str(packed), env={"FORENSICS_CACHE": str(cache), "FORENSICS_MAX_CORE_BYTES": str(1 << 20)})
    assert r.returncode == 1, r.stdout
    assert "decompresses to more than 1,048,576 bytes (FORENSICS_MAX_CORE_BYTES)" in r.stderr
    assert "Traceback" not in r.stderr
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    # GIVEN the stream damaged past its first frame's start THEN one line names the damage
    data = bytearray(packed.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    packed.write_bytes(bytes(data))
    r = _analyze(str(packed), env={"FORENSICS_CACHE": str(cache)})
    assert r.returncode == 1, r.stdout
    assert f"{packed}: cannot read core: damaged zstd stream" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
