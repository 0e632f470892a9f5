"""systemd-coredump's store as analyze's input: real processes crashed into Debian's systemd-coredump.

systemd-coredump has two halves: the one the kernel runs through ``core_pattern`` (it reads what it can
of the process, then hands the core's pipe over the ``/run/systemd/coredump`` socket) and the one that
socket starts (``systemd-coredump@.service``, ``Accept=yes``: it compresses the core into
``/var/lib/systemd/coredump`` and logs ``COREDUMP_*`` to the journal).  Where systemd is not PID 1 (a
container, CI) the socket and journald are not there, so this test starts them as systemd would: the
journal by ``systemd-journald`` itself, the socket by ``systemd-socket-activate --seqpacket --accept``
(systemd's own tool for socket activation), each instance the real ``/lib/systemd/systemd-coredump``.
Where systemd runs them, theirs are used.  ``kernel.core_pattern`` is set to Debian's value
(``/usr/lib/sysctl.d/50-coredump.conf``) under the suite's lock and restored.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

FORENSICS = Path(sys.executable).parent / "forensics"
COREDUMP = "/lib/systemd/systemd-coredump"
STORE = Path("/var/lib/systemd/coredump")
SOCKET = "/run/systemd/coredump"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
_JOURNALD_SOCKETS = ("socket", "dev-log", "stdout", "io.systemd.journal")
#: Debian's kernel.core_pattern for systemd-coredump (/usr/lib/sysctl.d/50-coredump.conf)
PATTERN = f"|{COREDUMP} %P %u %g %s %t 9223372036854775808 %h %d"
CRASHER = "import ctypes, sys\nopen(sys.argv[1]).read()\nctypes.string_at(0)\n"  # waits on a FIFO, then SIGSEGV

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="kernel.core_pattern and systemd-coredump's store need root"),
    pytest.mark.skipif(not os.path.exists(COREDUMP), reason="Debian's systemd-coredump is not installed "
                                                            "(apt-get install systemd-coredump)"),
]


def _listening(path: str, kind: int) -> bool:
    """Whether a program listens on the unix socket ``path`` (a file left by one that ended does not)."""
    with socket.socket(socket.AF_UNIX, kind) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def _wait_for(path: str, kind: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not _listening(path, kind):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _start(cmd: list[str], path: str, kind: int, started: list[subprocess.Popen]) -> None:
    """Start ``cmd`` (the program that listens on ``path``), unless one already does; skip when it does not."""
    if _listening(path, kind):
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by one that ended
    started.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if not _wait_for(path, kind):
        pytest.skip(f"{cmd[0]} did not listen on {path}")


def _stop(started: list[subprocess.Popen]) -> None:
    for p in reversed(started):
        p.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def journald():
    """systemd's journald, listening on its sockets (started here when none is)."""
    started: list[subprocess.Popen] = []
    program = shutil.which("systemd-journald", path="/lib/systemd:/usr/lib/systemd")
    if program is None:
        pytest.skip("no systemd-journald to keep systemd-coredump's journal")
    try:
        _start([program], JOURNAL_SOCKET, socket.SOCK_DGRAM, started)
        yield
    finally:
        _stop(started)
        if started:  # the sockets ours left (journald makes four): the machine as it was, the next run starts its own
            for name in _JOURNALD_SOCKETS:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(os.path.dirname(JOURNAL_SOCKET), name))


@pytest.fixture(scope="module")
def systemd_coredump(journald):
    """journald and systemd-coredump's socket, as systemd would run them (started here when missing)."""
    started: list[subprocess.Popen] = []
    activate = shutil.which("systemd-socket-activate")
    if activate is None:
        pytest.skip("no systemd-socket-activate to run systemd-coredump's service as systemd does")
    try:
        _start([activate, "--seqpacket", "--accept", "-l", SOCKET, COREDUMP], SOCKET, socket.SOCK_SEQPACKET, started)
        yield
    finally:
        _stop(started)
        if started:
            with contextlib.suppress(OSError):
                os.unlink(SOCKET)


def _unlimited_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.fixture(scope="module")
def store_cores(systemd_coredump, core_pattern_lock, tmp_path_factory):
    """Two real Python processes crashed into systemd-coredump: {pid: the store file it wrote}."""
    tmp = tmp_path_factory.mktemp("coredumpd")
    before = set(STORE.iterdir()) if STORE.is_dir() else set()
    procs, fifos = [], []
    for i in range(2):
        fifo = tmp / f"go{i}"
        os.mkfifo(fifo)
        fifos.append(fifo)
        procs.append(subprocess.Popen([sys.executable, "-c", CRASHER, str(fifo)], preexec_fn=_unlimited_core,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    pattern = Path("/proc/sys/kernel/core_pattern")
    try:
        with core_pattern_lock.exclusive():  # no other test session crashes a process into this pattern meanwhile
            old = pattern.read_text()
            try:
                pattern.write_text(PATTERN)
                for fifo in fifos:
                    with open(fifo, "w") as f:
                        f.write("go\n")
                for p in procs:
                    p.wait(timeout=120)
            finally:
                pattern.write_text(old)
            assert pattern.read_text() == old
    finally:
        # a skip (the lock not had in time) or a failure leaves the crashers blocked on their FIFOs: end them
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [-signal.SIGSEGV] * 2
    # the socket's instance compresses and logs after the kernel is done: wait for both files and entries
    made: dict[int, Path] = {}
    deadline = time.monotonic() + 120
    while len(made) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        for f in set(STORE.iterdir()) - before if STORE.is_dir() else ():
            for p in procs:
                if f".{p.pid}." in f.name and not f.name.startswith(".#"):
                    made[p.pid] = f
    if len(made) < 2:
        pytest.fail(f"systemd-coredump stored {len(made)} of 2 cores in {STORE}")
    for f in made.values():  # its journal entry follows the file
        for _ in range(100):
            r = subprocess.run(["journalctl", "--no-pager", "-o", "json", f"COREDUMP_FILENAME={f}"],
                               capture_output=True, text=True, timeout=30)
            if r.stdout.strip():
                break
            time.sleep(0.2)
    try:
        yield made
    finally:
        for f in made.values():
            with contextlib.suppress(OSError):
                f.unlink()


def _analyze(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(FORENSICS), "analyze", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def test_the_store_analyzed_as_one_batch_with_its_journal_metadata(store_cores, tmp_path):
    # GIVEN systemd-coredump's store holding two real Python crashes (zstd, as Debian builds it)
    assert all(f.name.endswith(".zst") for f in store_cores.values()), store_cores
    listing = sorted(os.listdir(STORE))
    cache = tmp_path / "cache"
    # WHEN the store is analyzed as one batch
    r = _analyze("--json", str(STORE), env={"FORENSICS_CACHE": str(cache)})
    assert r.returncode in (0, 4), r.stderr
    doc = json.loads(r.stdout)
    rows = {row["path"]: row for row in doc["cores"]}
    # THEN each of our cores is analyzed, from the store, with what the journal says of it
    fingerprints = set()
    for pid, f in store_cores.items():
        row = rows[str(f)]
        assert row["error"] is None and row["fingerprint"], row
        fingerprints.add(row["fingerprint"])
        store = row["store"]
        assert store["path"] == str(f) and store["compression"] == "zstd"
        journal = dict(store["journal"])
        assert journal["pid"] == str(pid)
        assert journal["signal"] == "11" and journal["signal_name"] == "SIGSEGV"
        assert "ctypes.string_at(0)" in journal["cmdline"]
        assert journal["exe"] == os.path.realpath(sys.executable)
        assert journal["filename"] == str(f)
        assert int(journal["timestamp"]) > 0
    assert len(fingerprints) == 1  # the same crash twice: one row of the fingerprint table
    # AND nothing was written into the store: the cores were read decompressed in the cache
    assert sorted(os.listdir(STORE)) == listing
    assert len(list((cache / "coredump").iterdir())) >= 2


def test_one_store_core_in_text_names_its_file_and_journal(store_cores, tmp_path):
    pid, f = sorted(store_cores.items())[0]
    r = _analyze(str(f), env={"FORENSICS_CACHE": str(tmp_path / "cache")})
    assert r.returncode in (0, 4), r.stderr
    assert f"From:        {f} (zstd, systemd-coredump's store" in r.stdout
    journal = next(line for line in r.stdout.splitlines() if line.startswith("Journal:"))
    assert "signal_name=SIGSEGV" in journal and "cmdline=" in journal, journal


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


def _journal_entry(pid: int, timeout: float = 60.0) -> dict | None:
    """systemd-coredump's journal entry of the crash of ``pid`` (its COREDUMP_PID), once journald has it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["journalctl", "--no-pager", "-o", "json", "--all", f"COREDUMP_PID={pid}"],
                           capture_output=True, text=True, timeout=30)
        if r.stdout.strip():
            return json.loads(r.stdout.splitlines()[-1])
        time.sleep(0.3)
    return None


@pytest.fixture(scope="module")
def journal_only_crash(journald, plain_core, tmp_path_factory):
    """A real crash systemd-coredump logged with ``Storage=none``: (the crashed process' pid, its journal entry).

    Its service half (the socket's, systemd-coredump@.service) runs in a mount namespace of this test's own, where
    ``/etc/systemd/coredump.conf`` says ``Storage=none`` and ``/run/systemd/coredump`` is its socket (journald's
    sockets bound in as they are), so no other test's systemd-coredump and no machine-wide setting change.  The
    kernel's half is run in that namespace as the kernel runs it (the core on stdin, ``%P %u %g %s %t %c %h %d``)
    with a real kernel core of a crashed Python process, while a live process of the same program stands for its
    ``/proc/PID``, as the core handler's tests feed it; no kernel.core_pattern is written.
    """
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("systemd-socket-activate"):
        pytest.skip("no unshare / nsenter / systemd-socket-activate for systemd-coredump in a namespace of its own")
    ns = tmp_path_factory.mktemp("coredump-ns")
    (ns / "run-systemd" / "journal").mkdir(parents=True)
    (ns / "coredump.conf").write_text("[Coredump]\nStorage=none\n")
    setup = (f"mount --bind /run/systemd/journal {ns}/run-systemd/journal && "
             f"mount --rbind {ns}/run-systemd /run/systemd && "
             f"mount --bind {ns}/coredump.conf /etc/systemd/coredump.conf && "
             f"exec systemd-socket-activate --seqpacket --accept -l {SOCKET} {COREDUMP}")
    service = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fifo = ns / "go"
    os.mkfifo(fifo)
    stand_in = subprocess.Popen([sys.executable, "-c", CRASHER, str(fifo)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        if not _wait_for(str(ns / "run-systemd" / "coredump"), socket.SOCK_SEQPACKET):
            pytest.skip("systemd-coredump's socket did not listen in a mount namespace (no CAP_SYS_ADMIN?)")
        with open(plain_core, "rb") as core:
            r = subprocess.run(["nsenter", f"--mount=/proc/{service.pid}/ns/mnt", COREDUMP, str(stand_in.pid), "0",
                                "0", str(int(signal.SIGSEGV)), str(int(time.time())), "9223372036854775808",
                                socket.gethostname(), "1"], stdin=core, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        entry = _journal_entry(stand_in.pid)
        if entry is None:
            pytest.fail("systemd-coredump logged no journal entry of the crash")
        yield stand_in.pid, entry
    finally:
        stand_in.kill()  # (it waits on its FIFO: it never crashes itself)
        stand_in.wait()
        _stop([service])


def test_a_crash_whose_core_systemd_coredump_did_not_store_is_listed_from_its_journal(journal_only_crash, tmp_path):
    pid, entry = journal_only_crash
    assert "COREDUMP_FILENAME" not in entry  # Storage=none: the journal alone says it happened
    created = not STORE.exists()
    STORE.mkdir(parents=True, exist_ok=True)  # as systemd-tmpfiles makes it (coredump.conf's d line)
    try:
        # WHEN the store is analyzed (--json and text)
        env = {"FORENSICS_CACHE": str(tmp_path / "cache")}
        r = _analyze("--json", str(STORE), env=env)
        t = _analyze(str(STORE), env=env)
    finally:
        if created:
            with contextlib.suppress(OSError):
                STORE.rmdir()
    assert r.returncode in (0, 3, 4) and "Traceback" not in r.stderr, r.stderr
    # THEN the crash is a row of the batch: what the journal says, why no core, the crashed thread's stack
    (row,) = [row for row in json.loads(r.stdout)["cores"] if row["path"].startswith(f"journal:{pid}@")]
    assert row["error"] is None and row["fingerprint"] is None
    assert row["no_core"].startswith("not stored by systemd-coredump (Storage=none"), row
    journal = dict(row["store"]["journal"])
    assert journal["pid"] == str(pid) and journal["signal_name"] == "SIGSEGV" and journal["signal"] == "11"
    assert journal["exe"] == os.path.realpath(sys.executable) and CRASHER.splitlines()[0] not in journal["exe"]
    assert journal["timestamp"] == entry["COREDUMP_TIMESTAMP"]
    # AND its stack is the one coredumpctl shows of the crash (an independent reader of the same journal)
    info = subprocess.run(["coredumpctl", "--no-pager", "info", str(pid)], capture_output=True, text=True, timeout=60)
    assert "Storage: none" in info.stdout, info.stdout
    shown = info.stdout.split("Stack trace of thread", 1)[1].splitlines()[1:]
    frames = [line.strip() for line in itertools.takewhile(lambda x: x.strip().startswith("#"), shown)]
    assert frames and row["store"]["stack"] == frames[:32], (row["store"]["stack"], frames)
    # AND the text lists it with its signal, why there is no core, and its first frames
    assert t.returncode == r.returncode, t.stderr
    assert "Crashes systemd-coredump logged without a core to read" in t.stdout, t.stdout
    block = t.stdout.split(f"PID {pid} (", 1)[1]
    assert "SIGSEGV" in block.splitlines()[0] and "    no core: not stored by systemd-coredump (Storage=none" in block
    assert f"    {frames[0]}" in block


def test_a_store_copied_with_its_journal_lists_the_crash_and_a_missing_journal_is_one_line(journal_only_crash,
                                                                                            plain_core, tmp_path):
    pid, entry = journal_only_crash
    journal_dir = next((d for d in (Path("/var/log/journal"), Path("/run/log/journal"))
                        if list(d.glob("*/*.journal"))), None)
    assert journal_dir is not None
    copy = tmp_path / "store"
    copy.mkdir()
    env = {"FORENSICS_CACHE": str(tmp_path / "cache")}
    # GIVEN a copy of a node's store holding nothing, and the node's journal (FORENSICS_JOURNAL_DIR)
    r = _analyze("--json", str(copy), env={**env, "FORENSICS_JOURNAL_DIR": str(journal_dir)})
    # THEN the crash is listed from that journal
    assert r.returncode in (0, 3, 4) and "Traceback" not in r.stderr, r.stderr
    assert [row["no_core"] for row in json.loads(r.stdout)["cores"] if row["path"].startswith(f"journal:{pid}@")]
    # GIVEN the journal missing WHEN the empty copy is analyzed THEN one error line says so
    r = _analyze(str(copy), env={**env, "FORENSICS_JOURNAL_DIR": str(tmp_path / "no-journal")})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("forensics: error:")]
    assert len(errors) == 1 and f"{copy}: systemd-coredump's journal not read (FORENSICS_JOURNAL_DIR " \
                                f"{tmp_path / 'no-journal'}: No such file or directory)" in errors[0], r.stderr
    # AND with a core in the copy, the analysis goes on and one warning line says what is not listed
    (copy / "core.python3.0.0123456789abcdef0123456789abcdef.1.1796143713000000.zst").write_bytes(subprocess.run(
        ["zstd", "-q", "-c"], input=plain_core.read_bytes(), capture_output=True, check=True).stdout)
    r = _analyze("--json", str(copy), env={**env, "FORENSICS_JOURNAL_DIR": str(tmp_path / "no-journal")})
    assert r.returncode in (0, 4) and len(json.loads(r.stdout)["cores"]) == 1, r.stderr
    warned = [line for line in r.stderr.splitlines() if "systemd-coredump's journal not read" in line]
    assert len(warned) == 1 and warned[0].startswith("forensics: warning: ") and "not listed" in warned[0], r.stderr
