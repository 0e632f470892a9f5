"""AArch64 cores made on this x86_64 machine: arm64 Debian roots run under qemu-user.

``guest_root("bookworm")`` is a cached arm64 Debian root (:func:`tests.roots.build_root` with
``arch="arm64"``: unpacked with ``mmdebstrap --variant=extract``, keyed and locked as every root)
holding the suite's CPython, its ``-dbg`` build and ``libc6-dbg``.  :func:`make_guest_core`
crashes a tests/crashers program in it: bubblewrap makes the root ``/`` (read-only), the static
``qemu-aarch64-static`` is bound in under ``/run`` and runs the guest interpreter, so no
binfmt_misc registration (machine-wide state) is needed.  qemu-user writes the guest's core
itself -- ``qemu_PROG_DATE-TIME_PID.core`` in the working directory, an AArch64 ELF core with
NT_PRSTATUS per thread, NT_PRPSINFO and NT_AUXV, without NT_FILE or NT_SIGINFO --
whatever kernel.core_pattern says; the kernel's core of qemu itself is kept to its notes and
removed.  ``libcrash.so`` is cross-compiled with ``aarch64-linux-gnu-gcc`` (into an ``arm64/`` directory).

The x86_64 twin of a guest core is :func:`tests.crashers.make_core.make_core` of the same
scenario.

qemu's default CPU (``max``) has pointer authentication: Debian's arm64 builds of unstable sign
their return addresses (``paciasp``), and qemu writes no NT_ARM_PAC_MASK, so gdb-multiarch
cannot unwind such a core ("Register 69 is not available").  ``cpu="cortex-a72"`` (no PAC)
makes a core gdb-multiarch unwinds, the oracle of :func:`gdb_multiarch_stacks`; the same
program under the two CPUs runs the same code at the same addresses.

The Python stacks' oracle is pystack 1.7.2's own aarch64 wheel (PyPI), unpacked into the forensics cache
(:func:`pystack_wheel_dir`) and run under qemu in the suite's root, which has its C++ runtime (:data:`PYSTACK_DEPS`):
:func:`pystack_guest_stacks` returns what tests/oracles.py's ``pystack_stacks`` does on x86_64.

A guest core names ``arm64/libcrash.so`` at its host path; :func:`analysis_sysroot` makes the
sysroot an analysis needs: the root hard-linked (the cache is never written) plus such files.

Usable from a shell, too::

    python tests/arm64.py root bookworm
    python tests/arm64.py core bookworm segv OUT_DIR
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.crashers.make_core import EXPORTER, SCENARIOS, build_libcrash, crash_for_core
from tests.roots import RootUnavailable, build_root, sandbox_command

__all__ = [
    "ARCH",
    "SUITES",
    "QEMU_IN_ROOT",
    "CROSS_CC",
    "GuestUnavailable",
    "guest_problem",
    "root_packages",
    "guest_root",
    "guest_python",
    "guest_command",
    "build_guest_libcrash",
    "make_guest_core",
    "analysis_sysroot",
    "gdb_multiarch_stacks",
    "PYSTACK_VERSION",
    "PYSTACK_DEPS",
    "pystack_wheel_dir",
    "pystack_guest_stacks",
]

ARCH = "arm64"
#: each suite's CPython (``python3.X`` and its ``-dbg`` build, ``python3.Xd``)
SUITES: Mapping[str, str] = {"bookworm": "3.11", "trixie": "3.13", "sid": "3.14"}
QEMU = "qemu-aarch64-static"
#: where the static qemu binary is bound inside the root
QEMU_IN_ROOT = "/run/qemu-aarch64-static"
CROSS_CC = "aarch64-linux-gnu-gcc"


class GuestUnavailable(RootUnavailable):
    """This machine cannot run arm64 guests: qemu-user, the cross compiler or bubblewrap is missing."""


def guest_problem() -> str | None:
    """Why arm64 guests cannot run here (a test should skip), or None when they can."""
    for tool, package in ((QEMU, "qemu-user-static"), (CROSS_CC, "gcc-aarch64-linux-gnu"),
                          ("bwrap", "bubblewrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y {package}; bash .ci/setup does it)"
    return None


def root_packages(suite: str) -> list[str]:
    """The packages of ``suite``'s arm64 root: its CPython, the -dbg build, libc6-dbg, and what pystack's wheel
    links (:data:`PYSTACK_DEPS`): one root per suite serves the tests and the oracle (a root costs a build)."""
    version = SUITES[suite]
    return [f"python{version}", f"python{version}-dbg", "libc6-dbg", *PYSTACK_DEPS]


def guest_root(suite: str, *, extra: Sequence[str] = (), cache: Path | None = None) -> Path:
    """The cached arm64 root of ``suite`` (built once).

    :param extra: more packages (a different list is a different root)
    :raises RootUnavailable: when there is no cached root and none can be built here
    """
    return build_root(suite, [*root_packages(suite), *extra], arch=ARCH, cache=cache)


def guest_python(suite: str, *, debug: bool = False) -> str:
    """The interpreter's path inside ``suite``'s root (``python3.11`` or the -dbg ``python3.11d``)."""
    return f"/usr/bin/python{SUITES[suite]}{'d' if debug else ''}"


def guest_command(root: Path, argv: Sequence[str], *, cwd: Path, binds: Sequence[Path] = ()) -> list[str]:
    """``argv`` (paths inside ``root``) run by qemu-user with ``root`` as ``/``; ``cwd`` and ``binds`` are
    bound read-write at their host paths (see :func:`tests.roots.sandbox_command`).

    :raises GuestUnavailable: when qemu-aarch64-static is not installed
    """
    qemu = shutil.which(QEMU)
    if qemu is None:
        raise GuestUnavailable(f"{QEMU} is not installed (apt-get install -y qemu-user-static)")
    return sandbox_command(root, [QEMU_IN_ROOT, *argv], cwd=cwd, binds=binds, tools=((Path(qemu), QEMU_IN_ROOT),))


def build_guest_libcrash(directory: Path) -> Path:
    """``directory/arm64/libcrash.so``: tests/crashers/libcrash.c cross-compiled for AArch64 (once), under the x86_64
    build's own file name, in a directory of its own: a fingerprint names the object (``function:libcrash.so:...``),
    and one bug in one library has one fingerprint on both machines.

    :raises GuestUnavailable: when the cross compiler is not installed
    """
    if shutil.which(CROSS_CC) is None:
        raise GuestUnavailable(f"{CROSS_CC} is not installed (apt-get install -y gcc-aarch64-linux-gnu)")
    return build_libcrash(Path(directory) / "arm64", cc=CROSS_CC)


def make_guest_core(
    directory: Path,
    root: Path,
    python: str,
    scenario: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    cpu: str | None = None,
) -> Path:
    """Crash ``exporter.py`` (tests/crashers) under qemu-user in ``root`` and return qemu's core of it.

    :param directory: where arm64/libcrash.so is built (once) and the run directory is made
    :param root: an arm64 root (:func:`guest_root`)
    :param python: the interpreter inside the root (:func:`guest_python`)
    :param scenario: one of tests.crashers.make_core.SCENARIOS
    :param env: extra environment variables for the guest
    :param cpu: qemu's CPU model (``QEMU_CPU``; default ``max``, with pointer authentication)
    :raises GuestUnavailable: when qemu-user or the cross compiler is missing
    :raises CoreNotWritten: when the guest did not die of a signal or qemu wrote no core
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    problem = guest_problem()
    if problem:
        raise GuestUnavailable(problem)
    directory = Path(directory).resolve()
    lib = build_guest_libcrash(directory)
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-arm64-{scenario}-", dir=directory))
    qemu = shutil.which(QEMU)
    assert qemu is not None
    env = dict(env or {})
    if cpu is not None:
        env["QEMU_CPU"] = cpu
    return crash_for_core([QEMU_IN_ROOT, python, str(EXPORTER), str(lib), scenario], run_dir, env=env, root=root,
                          binds=(EXPORTER, lib), tools=((Path(qemu), QEMU_IN_ROOT),), timeout=timeout, guest=True,
                          what=f"qemu {python} exporter.py {scenario}")


def analysis_sysroot(root: Path, dest: Path, files: Sequence[Path] = ()) -> Path:
    """``dest``: ``root`` hard-linked (copied where hard links cannot be made), plus each of ``files`` at its
    own absolute path inside it -- the crashed machine's filesystem as ``--sysroot`` takes it."""
    import subprocess

    dest = Path(dest)
    if subprocess.run(["cp", "-al", str(root), str(dest)], capture_output=True, timeout=300).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-a", str(root), str(dest)], check=True, capture_output=True, timeout=600)
    for f in files:
        target = dest / Path(f).resolve().relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dest


def gdb_multiarch_stacks(sysroot: Path, executable: str, core: Path, *, timeout: float = 300) -> dict[int, list]:
    """gdb-multiarch's backtrace of every thread of ``core`` (the oracle of the native stacks): ``{tid:
    [function or None, ...]}``, innermost first, inlined functions as frames of their own.

    :param executable: the program's path inside ``sysroot``
    """
    import re
    import subprocess

    cmd = ["gdb-multiarch", "-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex", f"set sysroot {sysroot}",
           "-ex", "set width 0", "-ex", f"file {sysroot}{executable}", "-ex", f"core-file {core}",
           "-ex", "thread apply all bt"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    stacks: dict[int, list] = {}
    frames: list | None = None
    for line in out.splitlines():
        thread = re.match(r"Thread \d+ \((?:Thread 0x[0-9a-f]+ )?\(?LWP (\d+)\)", line)
        if thread:
            frames = stacks.setdefault(int(thread.group(1)), [])
            continue
        frame = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \(", line)
        if frame and frames is not None:
            frames.append(None if frame.group(1) == "??" else frame.group(1))
    return stacks


PYSTACK_VERSION = "1.7.2"
#: what pystack's wheel links beyond the root's CPython: its bundled elfutils are C++-free, its extension is not
PYSTACK_DEPS = ("libstdc++6",)
#: the CPython tag of pystack's aarch64 wheel for each suite's interpreter (3.12+ share the abi3 wheel)
_PYSTACK_TAGS = {"3.11": "cp311", "3.13": "abi3", "3.14": "abi3"}
_PYSTACK_SCRIPT = """
import json, sys
from pystack.engine import NativeReportingMode, get_process_threads_for_core
threads = get_process_threads_for_core(sys.argv[1], sys.argv[2], sys.argv[3] or None,
                                       native_mode=NativeReportingMode.OFF, locals=True)
# an unbound local of 3.14 (PyStackRef_NULL: tag bits over 0) is one pystack 1.7.2 shows as an object at 0x0
print(json.dumps({t.tid: [[f.code.scope, f.code.filename, f.code.location.lineno,
                           sorted(k for k, v in {**f.arguments, **f.locals}.items()
                                  if v != "<invalid object at 0x0>")] for f in reversed(list(t.frames))]
                  for t in threads}))
"""


def pystack_wheel_dir(suite: str, *, cache: Path | None = None) -> Path:
    """pystack's aarch64 manylinux wheel for ``suite``'s CPython, downloaded from PyPI once and unpacked into
    ``<forensics cache>/arm64/pystack-VERSION-TAG`` (a directory for the guest's PYTHONPATH).

    :raises GuestUnavailable: when the wheel is neither cached nor downloadable (no network, no PyPI)
    """
    import subprocess
    import zipfile

    from tests.roots import _locked, _roots_dir

    base = _roots_dir(cache).parent / "arm64"
    base.mkdir(parents=True, exist_ok=True)
    tag = _PYSTACK_TAGS[SUITES[suite]]
    final = base / f"pystack-{PYSTACK_VERSION}-{tag}"
    if (final / "pystack").is_dir():
        return final
    with _locked(base / f".{final.name}.lock"):
        if (final / "pystack").is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=base))
        try:
            version = "3.12" if tag == "abi3" else SUITES[suite]
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--platform", "manylinux_2_28_aarch64", "--python-version", version, "-d", str(tmp),
                   f"pystack=={PYSTACK_VERSION}"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            wheels = list(tmp.glob("pystack-*.whl"))
            if r.returncode != 0 or len(wheels) != 1:
                raise GuestUnavailable(f"cannot download pystack {PYSTACK_VERSION}'s aarch64 wheel: "
                                       f"{(r.stderr or r.stdout).strip()[-500:]}")
            unpacked = tmp / "unpacked"
            with zipfile.ZipFile(wheels[0]) as z:
                z.extractall(unpacked)
            for member in (unpacked / "pystack.libs").iterdir():  # zipfile drops the mode: the libraries are run
                member.chmod(0o755)
            os.rename(unpacked, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def pystack_guest_stacks(root: Path, suite: str, core: Path, *, lib_dirs: Sequence[Path] = (), debug: bool = False,
                         timeout: float = 600) -> dict[int, list[tuple[str, str, int | None, list[str]]]]:
    """pystack's Python stacks of ``core``, pystack's aarch64 build run under qemu in ``root`` (one with
    :data:`PYSTACK_DEPS`): ``{tid: [(function, file, line, names of its arguments and locals), ...]}``,
    innermost first.  A local pystack shows as ``<invalid object at 0x0>`` is left out: on 3.14 that is an
    unbound local (``PyStackRef_NULL``, whose tag bits pystack 1.7.2 strips to an object at 0), which
    forensics, as CPython's own ``locals()``, does not list.

    :param lib_dirs: host directories of libraries the core names outside the root (arm64/libcrash.so's)
    :param debug: the core is of the -dbg interpreter (pystack runs under the release one either way)
    :raises RuntimeError: when pystack fails (its output is in the message)
    """
    import json
    import subprocess

    wheel = pystack_wheel_dir(suite)
    core = Path(core).resolve()
    argv = [guest_python(suite), "-c", _PYSTACK_SCRIPT, str(core), guest_python(suite, debug=debug),
            ":".join(str(d) for d in lib_dirs)]
    cmd = guest_command(root, argv, cwd=core.parent, binds=(wheel, *lib_dirs))
    env = dict(os.environ, PYTHONPATH=str(wheel))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"pystack under qemu exited {r.returncode}: {r.stderr[-3000:]}")
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    return {int(tid): [(f, file, line, names) for f, file, line, names in frames] for tid, frames in doc.items()}


def _main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "root":
        print(guest_root(argv[1]))
        return 0
    if len(argv) == 4 and argv[0] == "core":
        suite, scenario, out = argv[1:]
        os.makedirs(out, exist_ok=True)
        print(make_guest_core(Path(out), guest_root(suite), guest_python(suite), scenario))
        return 0
    print("usage: arm64.py root SUITE | arm64.py core SUITE SCENARIO OUT_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
