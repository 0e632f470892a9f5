"""Make real core files from the crash samples (no pytest dependency).

``make_core(directory, python, scenario)`` builds ``libcrash.so`` from
``libcrash.c`` (once per directory), runs ``exporter.py`` under ``python`` with
RLIMIT_CORE raised, waits for it to die, and returns the core the kernel wrote in
the process's working directory.  It needs ``kernel.core_pattern`` to be a plain
file name (``core``, ``core.%p``): :func:`core_pattern_problem` says why not
otherwise, and :func:`make_core` raises :class:`CoresUnavailable` with that
reason (a test should skip).  When the process dies but no core appears,
:class:`CoreNotWritten` says so (a test should fail).

Usable from a shell, too::

    python tests/crashers/make_core.py OUT_DIR /path/to/python3 heap-prev
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "SCENARIOS",
    "CoresUnavailable",
    "CoreNotWritten",
    "core_pattern_problem",
    "build_libcrash",
    "build_stripped_libcrash",
    "build_libreporter",
    "build_thrower",
    "make_core",
    "crash_for_core",
    "make_gcore",
    "make_killed_core",
    "QEMU_CORE_GLOB",
    "EXPORTER",
    "BARE",
    "TWO_THREADS",
    "HANDLERS",
]

HERE = Path(__file__).resolve().parent
LIBCRASH_C = HERE / "libcrash.c"
LIBREPORTER_C = HERE / "libreporter.c"
EXPORTER = HERE / "exporter.py"
BARE = HERE / "bare.py"
TWO_THREADS = HERE / "two_threads.py"
SCENARIOS = ("heap-prev", "heap-next-size", "segv", "py-abort", "fpe", "ill", "bus", "qsort-abort", "string-at")
#: crash reporters exporter.py installs (EXPORTER_HANDLER), whose own code faults as the process dies
HANDLERS = ("ctypes-abort", "c-abort", "c-segv", "faulthandler")
_CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


class CoresUnavailable(RuntimeError):
    """This machine cannot write cores where the helper can find them."""


class CoreNotWritten(RuntimeError):
    """The sample crashed (or did not) but no core file appeared."""


def core_pattern_problem() -> str | None:
    """Why cores cannot be collected from the process's cwd here, or None when they can."""
    try:
        pattern = _CORE_PATTERN.read_text().strip()
    except OSError as e:
        return f"cannot read {_CORE_PATTERN}: {e}"
    if pattern.startswith("|"):
        return f"kernel.core_pattern pipes cores to a program ({pattern.split()[0]}), not to a file"
    if not pattern or "/" in pattern:
        return f"kernel.core_pattern is {pattern!r}, not a plain file name in the process's cwd"
    return None


def build_libcrash(directory: Path, *, cflags: Sequence[str] = (), name: str = "libcrash.so",
                   cc: str | None = None) -> Path:
    """Build ``libcrash.so`` into ``directory`` unless it is already there.

    :param cflags: extra compiler flags (a different set makes a different build-id)
    :param cc: the compiler (default: ``$CC`` or gcc); a cross compiler builds it for another machine
    """
    return _build_library(directory, LIBCRASH_C, cflags=cflags, name=name, cc=cc)


def build_stripped_libcrash(directory: Path) -> tuple[Path, Path]:
    """``libcrash.so`` without its DWARF (``directory/stripped/libcrash.so``) and its debug file apart
    (``directory/libcrash.debug``), from a full build in ``directory/full``: what a debuginfod server serves."""
    full = build_libcrash(Path(directory) / "full")
    debug = Path(directory) / "libcrash.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(full), str(debug)], check=True)
    stripped = Path(directory) / "stripped" / "libcrash.so"
    stripped.parent.mkdir(exist_ok=True)
    subprocess.run(["objcopy", "--strip-debug", str(full), str(stripped)], check=True)
    return stripped, debug


def build_thrower(directory: Path) -> Path:
    """Build ``libthrower.so`` (C++ throwers behind ``noexcept`` C entry points) into ``directory`` unless it is
    there."""
    return _build_library(directory, HERE / "thrower.cpp", cflags=(), name="libthrower.so",
                          cc=os.environ.get("CXX", "g++"))


def build_libreporter(directory: Path) -> Path:
    """Build ``libreporter.so`` (C signal handlers that fault) into ``directory`` unless it is there."""
    return _build_library(directory, LIBREPORTER_C, cflags=(), name="libreporter.so")


def _build_library(directory: Path, source: Path, *, cflags: Sequence[str], name: str, cc: str | None = None) -> Path:
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / name
    if out.exists():
        return out
    cc = cc or os.environ.get("CC", "gcc")
    tmp = directory / f".{name}.tmp{os.getpid()}"
    cmd = [cc, "-shared", "-fPIC", "-g", "-O2", "-w", *cflags, "-o", str(tmp), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"building {name} failed: {' '.join(cmd)}\n{proc.stderr}")
    tmp.replace(out)  # atomic: a concurrent builder sees a whole file or none
    return out


#: the file name qemu-user gives the core it writes of its guest (``qemu_PROG_DATE-TIME_PID.core``)
QEMU_CORE_GLOB = "qemu_*.core"


def _child_setup(coredump_filter: int | None):
    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        if coredump_filter is not None:
            with open("/proc/self/coredump_filter", "w") as f:
                f.write(f"0x{coredump_filter:x}")

    return setup


def make_core(
    directory: Path,
    python: str | os.PathLike[str],
    scenario: str,
    *,
    preload: Sequence[str | os.PathLike[str]] = (),
    coredump_filter: int | None = None,
    libcrash: Path | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    handler: str | None = None,
) -> Path:
    """Crash ``exporter.py`` and return the path of its core.

    :param directory: where libcrash.so is built (once) and the run directory is made
    :param python: the interpreter to run the sample with
    :param scenario: one of :data:`SCENARIOS`
    :param preload: extra shared objects to map into the process (``LD_PRELOAD``)
    :param coredump_filter: a value for ``/proc/self/coredump_filter`` (default: inherited, 0x33)
    :param libcrash: a prebuilt libcrash.so to use instead of building one
    :param env: extra environment variables for the crashing process
    :param root: a root filesystem (tests/roots.py) to run ``python`` in, a path inside it; the
        run directory, exporter.py and libcrash.so are bound at their host paths
    :param handler: one of :data:`HANDLERS`: a crash reporter that faults while the process dies
    :raises CoresUnavailable: when kernel.core_pattern does not write to the cwd
    :raises CoreNotWritten: when the process did not die of a signal or left no core
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    problem = core_pattern_problem()
    if problem:
        raise CoresUnavailable(problem)
    directory = Path(directory).resolve()
    lib = Path(libcrash) if libcrash is not None else build_libcrash(directory)
    label = scenario + (f"-{handler}" if handler else "")
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{label}-", dir=directory))
    extra_env = dict(env or {})
    if preload:
        extra_env["LD_PRELOAD"] = " ".join(str(p) for p in preload)
    binds: tuple[Path, ...] = (EXPORTER, lib)
    if handler is not None:
        if handler not in HANDLERS:
            raise ValueError(f"unknown handler {handler!r}; choose from {', '.join(HANDLERS)}")
        extra_env["EXPORTER_HANDLER"] = handler
        if handler.startswith("c-"):
            reporter = build_libreporter(directory)
            extra_env["LIBREPORTER"] = str(reporter)
            binds += (reporter,)
    return crash_for_core([os.fspath(python), str(EXPORTER), str(lib), scenario], run_dir, env=extra_env,
                          root=root, binds=binds, coredump_filter=coredump_filter, timeout=timeout,
                          what=f"{python} exporter.py {label}")


def crash_for_core(
    argv: Sequence[str],
    run_dir: Path,
    *,
    env: dict[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    binds: Sequence[Path] = (),
    coredump_filter: int | None = None,
    timeout: float = 60.0,
    what: str | None = None,
    outputs: Sequence[str] = (),
    tools: Sequence[tuple[Path, str]] = (),
    guest: bool = False,
) -> Path:
    """Run ``argv`` in the empty directory ``run_dir`` with RLIMIT_CORE raised; return the core it leaves.

    The core is the file the run leaves in ``run_dir`` that is not one of ``outputs`` (names the
    program writes there itself).  Beside it go ``.stderr`` (what the process said as it died:
    faulthandler's traceback) and ``.signal`` (the signal it died of).

    :param env: extra environment variables (over this process's, without PYTHONHOME)
    :param root: a root filesystem (tests/roots.py) to run it in; ``run_dir`` and ``binds`` are bound
        at their host paths, ``tools`` at theirs under /run
    :param guest: ``argv`` is a qemu-user command: the core is the one qemu writes of its guest
        (:data:`QEMU_CORE_GLOB`; kernel.core_pattern plays no part), and the kernel's core of qemu
        itself is kept down to its notes (coredump_filter 0) and removed
    :raises CoresUnavailable: when kernel.core_pattern does not write to the cwd (not for a guest)
    :raises CoreNotWritten: when the process did not die of a signal or left no core
    """
    problem = None if guest else core_pattern_problem()
    if problem:
        raise CoresUnavailable(problem)
    if guest:
        coredump_filter = 0
    what = what or " ".join(argv)
    full_env = dict(os.environ)
    full_env.pop("PYTHONHOME", None)
    full_env.update(env or {})
    argv = list(argv)
    if root is not None:
        from tests.roots import sandbox_command

        argv = sandbox_command(Path(root), argv, cwd=run_dir, binds=tuple(binds), tools=tuple(tools))
    proc = subprocess.Popen(
        argv,
        cwd=run_dir,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_child_setup(coredump_filter),
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    signo = -proc.returncode
    if root is not None and proc.returncode > 128:  # bwrap exits 128 + the signal its child died of
        signo = proc.returncode - 128
    cores = sorted(p for p in run_dir.iterdir() if p.is_file() and p.name not in outputs)
    if guest:
        for host_core in [p for p in cores if not p.match(QEMU_CORE_GLOB)]:
            host_core.unlink()
        cores = [p for p in cores if p.match(QEMU_CORE_GLOB)]
    (run_dir / ".stderr").write_bytes(err)
    (run_dir / ".signal").write_text(f"{signo}\n")
    if signo <= 0:
        raise CoreNotWritten(
            f"{what} exited with status {proc.returncode} instead of dying of a signal:\n"
            + err.decode(errors="replace")[-2000:]
        )
    if not cores:
        sig = signal.Signals(signo).name
        raise CoreNotWritten(
            f"{what} died of {sig} but no core appeared in {run_dir} "
            f"(core_pattern {_CORE_PATTERN.read_text().strip()!r}; check RLIMIT_CORE, free disk, and that "
            "the directory is writable)"
        )
    return cores[0]


def _wait_ready(fifo: Path, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until the sample writes "ready" into ``fifo`` (never blocks on a sample that died)."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while b"ready" not in got:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.poll() is not None else ""
                raise CoreNotWritten(f"the sleeping sample did not get ready (status {proc.poll()}): {err}")
            with contextlib.suppress(BlockingIOError):
                got += os.read(fd, 64)
            time.sleep(0.02)
    finally:
        os.close(fd)


def make_gcore(directory: Path, python: str | os.PathLike[str], *, timeout: float = 60.0) -> Path:
    """A core of a live process, made by gdb's ``gcore``: ``exporter.py`` in its ``sleep`` scenario
    (same threads, same call stack as a crash, but sleeping), waited for through a FIFO, then
    killed.  :raises CoreNotWritten: when gcore wrote nothing
    """
    directory = Path(directory).resolve()
    lib = build_libcrash(directory)
    run_dir = Path(tempfile.mkdtemp(prefix="run-gcore-", dir=directory))
    fifo = run_dir / "ready"
    os.mkfifo(fifo)
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    proc = subprocess.Popen([os.fspath(python), str(EXPORTER), str(lib), "sleep", str(fifo)], cwd=run_dir,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_ready(fifo, proc, timeout)
        time.sleep(0.1)  # let the main thread reach time.sleep
        out = run_dir / "core"
        gcore = subprocess.run(["gcore", "-o", str(out), str(proc.pid)], capture_output=True, text=True,
                               timeout=timeout)
        written = out.with_name(f"core.{proc.pid}")
        if not written.is_file():
            raise CoreNotWritten(f"gcore {proc.pid} wrote no core: {gcore.stdout[-1000:]} {gcore.stderr[-1000:]}")
        return written
    finally:
        proc.kill()
        proc.wait()


def make_killed_core(directory: Path, python: str | os.PathLike[str], signo: int, *, env: dict[str, str] | None = None,
                     timeout: float = 60.0) -> Path:
    """A core of a process another process killed: ``exporter.py`` in its ``sleep`` scenario, waited for
    through a FIFO, then sent ``signo`` by this process (``kill(2)``: SI_USER, this pid, this uid).

    :param env: extra environment variables (``PYTHONFAULTHANDLER=1``: faulthandler handles the signal and
        raises it again)
    :raises CoresUnavailable: when kernel.core_pattern does not write to the cwd
    :raises CoreNotWritten: when the process did not die of ``signo`` or left no core
    """
    problem = core_pattern_problem()
    if problem:
        raise CoresUnavailable(problem)
    directory = Path(directory).resolve()
    lib = build_libcrash(directory)
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-killed-{signo}-", dir=directory))
    fifo = run_dir / "ready"
    os.mkfifo(fifo)
    full_env = dict(os.environ)
    full_env.pop("PYTHONHOME", None)
    full_env.update(env or {})
    proc = subprocess.Popen([os.fspath(python), str(EXPORTER), str(lib), "sleep", str(fifo)], cwd=run_dir,
                            env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_child_setup(None))
    try:
        _wait_ready(fifo, proc, timeout)
        time.sleep(0.1)  # let the main thread reach time.sleep
        proc.send_signal(signo)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    (run_dir / ".stderr").write_bytes(err or b"")
    cores = [p for p in run_dir.iterdir() if p.is_file() and p.name.startswith("core")]
    if proc.returncode != -signo or not cores:
        raise CoreNotWritten(f"{python} exporter.py sleep, sent signal {signo}, exited {proc.returncode} "
                             f"with cores {cores}: {(err or b'').decode(errors='replace')[-1000:]}")
    return cores[0]


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: make_core.py OUT_DIR PYTHON SCENARIO")
    print(make_core(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
