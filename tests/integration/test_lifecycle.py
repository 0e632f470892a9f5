"""Lifecycle: what forensics leaves behind when it is stopped, and what it says when its process goes.

Real commands in real processes (``python -m forensics``, in a session of their own, as a shell or a pod
runs them), real signals (SIGINT, SIGTERM), real children (the reproducer, the exporter, the unpacked root
of ``verify-imports --execute``) and a real process that exits while forensics reads it (it exits when
forensics opens one of its files: inotify tells it, so the moment is the same on every run).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED
from tests.helpers import ready_process

from .test_verify_imports_helpers import ImageFactory, host_python, wheel

ROOT = Path(__file__).resolve().parents[2]


def start_forensics(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "forensics", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def children_of(pid: int) -> list[int]:
    """Every descendant of ``pid`` (by /proc/*/stat's ppid)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            parents[int(name)] = int(data[data.rfind(b")") + 1:].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        todo += kids
    return out


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def signal_and_wait(proc: subprocess.Popen, sig: int) -> float:
    """Seconds from sending ``sig`` to the process's end (at most 60: TimeoutExpired past them)."""
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    return time.monotonic() - sent


def stop(proc: subprocess.Popen) -> str:
    """Its standard error (killed first, with its group, if it still runs)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate()[1]


# -- SIGTERM and SIGINT: the command's children go with it ------------------------------------------------

def test_sigterm_to_reproduce_kills_the_reproducer(tmp_path):
    python = host_python()
    if python is None:
        pytest.skip("CPython 3.11 (pyenv) not found")
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(lib),
                    str(wheel("nvidia-ml-py", "13.580.126"))], check=True, capture_output=True, timeout=300)
    # GIVEN reproduce running its Python reproducer for a long time
    p = start_forensics("reproduce", "--sim", "--python", python, "--iterations", "100000000", "--workdir",
                        str(tmp_path / "w"), env={"PYTHONPATH": f"{ROOT}:{lib}"})
    try:
        kids = wait_for(lambda: [c for c in children_of(p.pid) if b"nvml_nvlink" in cmdline(c)]
                        if p.poll() is None else None, 120, "the reproducer to start")
        # WHEN the command is sent SIGTERM (kill, systemd, a pod's deletion)
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        err = stop(p)
    # THEN it ends with 143 and one line, and the reproducer is not left running with parent 1
    left = [k for k in kids if alive(k)]
    for k in left:  # this test must not leave it either
        os.kill(k, signal.SIGKILL)
    assert p.returncode == EXIT_TERMINATED and err.endswith("forensics: terminated (SIGTERM)\n"), err
    assert not left


@pytest.fixture
def black_hole():
    """A TCP port on 127.0.0.1 that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["canary", "fleet --prometheus", "reproduce", "agent serve"])
def test_ctrl_c_ends_every_long_command_with_130(command, black_hole, tmp_path):
    # GIVEN a command that runs for a long time: scraping or asking a server that never answers, a reproducer
    # querying for 10^8 iterations, the node agent serving
    env = None
    if command == "canary":
        args = ["canary", f"http://127.0.0.1:{black_hole}/metrics", "--interval", "1", "--duration", "300"]
    elif command == "fleet --prometheus":
        args = ["fleet", "--prometheus", f"http://127.0.0.1:{black_hole}", "--deadline", "300"]
    elif command == "agent serve":
        (tmp_path / "cores").mkdir()
        args = ["agent", "serve", "--core-dir", str(tmp_path / "cores"), "--metrics-port", "0", "--no-events"]
    else:
        python = host_python()
        if python is None:
            pytest.skip("CPython 3.11 (pyenv) not found")
        lib = tmp_path / "lib"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(lib),
                        str(wheel("nvidia-ml-py", "13.580.126"))], check=True, capture_output=True, timeout=300)
        args = ["reproduce", "--sim", "--python", python, "--iterations", "100000000", "--workdir", str(tmp_path / "w")]
        env = {"PYTHONPATH": f"{ROOT}:{lib}"}
    p = start_forensics(*args, env=env)
    try:
        # (the command is at work: its child started, or a few seconds into its wait)
        if command == "reproduce":
            wait_for(lambda: [c for c in children_of(p.pid) if b"nvml_nvlink" in cmdline(c)] if p.poll() is None
                     else None, 120, "the reproducer to start")
        else:
            time.sleep(4)
        assert p.poll() is None, p.communicate()
        kids = children_of(p.pid)
        # WHEN it gets Ctrl-C (SIGINT, as a terminal sends it to the foreground process)
        took = signal_and_wait(p, signal.SIGINT)
    finally:
        err = stop(p)
    left = [k for k in kids if alive(k)]
    for k in left:  # this test must not leave them either
        os.kill(k, signal.SIGKILL)
    # THEN it ends with 130, as README's exit codes say of every command, and leaves no process behind
    assert p.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and not left, err
    # at once: not after a request's socket timeout (fleet --prometheus waited out its 30 s one, 26 s after Ctrl-C)
    print(f"{command}: ended {took:.2f} s after SIGINT")
    assert took < 10, f"{command} ended {took:.1f} s after Ctrl-C"


def test_sigterm_ends_fleet_prometheus_at_once_with_its_queries_in_flight(black_hole):
    # GIVEN fleet --prometheus asking a server that never answers: its queries in flight, in threads of their own
    p = start_forensics("fleet", "--prometheus", f"http://127.0.0.1:{black_hole}", "--deadline", "300")
    try:
        time.sleep(4)
        assert p.poll() is None, p.communicate()
        # WHEN it is sent SIGTERM (a pod's deletion, a CI job's timeout)
        took = signal_and_wait(p, signal.SIGTERM)
    finally:
        err = stop(p)
    # THEN it ends with 143 and its one line at once, not after the requests' 30 s socket timeout
    print(f"fleet --prometheus: ended {took:.2f} s after SIGTERM")
    assert p.returncode == EXIT_TERMINATED and err.endswith("forensics: terminated (SIGTERM)\n"), err
    assert took < 10, f"ended {took:.1f} s after SIGTERM"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_demo_stops_its_exporter(tmp_path, sig, core_pattern):
    # GIVEN the demo in its scrape phase (an exporter that would not crash for a long time)
    out = tmp_path / "demo"
    p = start_forensics("demo", "--out", str(out), "--fault-after", "1000000")
    try:
        exporter = wait_for(lambda: _exporter_in(out / "exporter") if p.poll() is None else "exited", 600,
                            "the exporter to start")
        assert exporter != "exited", stop(p)
        # verify-imports.json is written just before the scrapes begin (they go on for 60 s: no crash comes)
        wait_for(lambda: (out / "verify-imports.json").is_file() or p.poll() is not None, 300, "the scrape phase")
        time.sleep(2.0)
        assert p.poll() is None, stop(p)
        # WHEN it is interrupted (Ctrl-C reaches only forensics: the exporter runs in a session of its own)
        os.kill(p.pid, sig)
        p.wait(timeout=60)
    finally:
        err = stop(p)
    # THEN it stops (130 / 143) and the exporter stops with it
    try:
        assert p.returncode == (EXIT_INTERRUPTED if sig == signal.SIGINT else EXIT_TERMINATED), err
        wait_for(lambda: not alive(exporter), 5, "the exporter to be gone")
    finally:
        if alive(exporter):  # left behind: this test must not leave it too
            os.kill(exporter, signal.SIGKILL)


def _exporter_in(run_dir: Path) -> int | None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd") == str(run_dir) and b"nvitop_exporter" in cmdline(int(name)):
                    return int(name)
            except OSError:
                continue
    return None


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> ImageFactory:
    return ImageFactory(tmp_path_factory.mktemp("images"))


def test_sigterm_during_execute_removes_the_unpacked_root(images, tmp_path):
    from .test_verify_imports import bwrap_problem

    problem = bwrap_problem()
    if problem:
        pytest.skip(problem)
    ref = images.get("incident")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # GIVEN verify-imports --execute unpacking the image into TMPDIR
    p = start_forensics("verify-imports", ref, "--execute", env={"TMPDIR": str(tmp)})
    try:
        wait_for(lambda: any(os.scandir(d) for d in tmp.glob("forensics-rootfs-*/root")) or p.poll() is not None,
                 120, "the image to be unpacked")
        assert p.poll() is None, stop(p)
        # WHEN it is sent SIGTERM
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        err = stop(p)
    # THEN the unpacked root is gone with it
    assert p.returncode == EXIT_TERMINATED, err
    assert list(tmp.iterdir()) == []


# -- a process that exits while it is read ------------------------------------------------------------------

EXITS_WHEN_READ = """import ctypes, os, sys
import pynvml
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
assert fd >= 0 and libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x20 | 0x01) >= 0  # IN_OPEN | IN_ACCESS
print("ready", os.getpid(), flush=True)
os.read(fd, 4096)
os._exit(0)
"""


@pytest.fixture
def exits_when_read(tmp_path):
    """A process importing pynvml from a pip --target directory, which exits the moment another process
    opens a file in that directory."""
    python = host_python()
    if python is None:
        pytest.skip("CPython 3.11 (pyenv) not found")
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(lib),
                    str(wheel("nvidia-ml-py", "13.580.126"))], check=True, capture_output=True, timeout=300)
    for i in range(400):  # metadata forensics reads after its first look into lib: it is still reading when it exits
        d = lib / f"filler_{i}-1.0.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: filler-{i}\nVersion: 1.0\n")
        (d / "RECORD").write_text(f"filler_{i}.py,,\n")
    (tmp_path / "waiter.py").write_text(EXITS_WHEN_READ)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONPATH": str(lib),
           "PYTHONDONTWRITEBYTECODE": "1"}
    with ready_process([python, str(tmp_path / "waiter.py"), str(lib)], cwd=tmp_path, env=env) as (proc, words):
        yield proc


@pytest.mark.parametrize("command", [["verify-imports", "--pid"], ["capture", "--pid"]])
def test_a_process_that_exits_while_it_is_read_is_one_error(exits_when_read, command, tmp_path):
    if command[0] == "capture" and os.geteuid() != 0:
        pytest.skip("capture --pid needs root")
    proc = exits_when_read
    extra = ["--core-dir", str(tmp_path / "cores"), "-o", str(tmp_path / "bundles")] if command[0] == "capture" else []
    # WHEN forensics reads it, and it exits as forensics opens its files
    r = CliRunner().invoke(cli, [*command, str(proc.pid), *extra], catch_exceptions=False)
    proc.wait(timeout=10)
    # THEN one line says it exited during the command: no verdicts about a root that went with it
    assert r.exit_code == EXIT_ERROR, r.output
    assert r.stderr.startswith(f"forensics: error: process {proc.pid} exited during its "), r.stderr
    assert r.stderr.count("\n") == 2 and "forensics: hint:" in r.stderr
