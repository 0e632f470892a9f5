"""Session-wide checks and real-core fixtures.

Cores are made by the kernel from real crashing processes (tests/crashers), once
per (CPython version, scenario) and shared by every test of the session.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.pythons import WANTED, discover_pythons  # noqa: E402

PYTHONS = discover_pythons()


#: The quick loop, ``pytest -m quick`` (docs/testing.md): every unit test, and a few real-process tests that reach
#: the packages unit tests do not (a real core analyzed, gdb opened on it, an image verified with --execute, a
#: reproducer crashing, a report, a canary, the node's handler and agent, the sandbox; none that waits for the
#: machine-wide core_pattern lock another session may hold).
#: ``tests/unit/test_quick_loop.py`` holds it to every package of forensics.
QUICK = (
    "tests/unit/",
    "tests/integration/test_cli_analyze.py::test_json_document",
    "tests/integration/test_cli_analyze.py::test_full_paths_name_each_python_file_as_an_editor_opens_it",
    "tests/integration/test_debug.py::test_debug_print_is_a_gdb_command_showing_the_crashed_threads_python_frames",
    "tests/integration/test_user_errors.py",
    "tests/integration/test_verify_imports.py::test_execute_fails_a_module_the_images_interpreter_cannot_import",
    "tests/integration/test_reproducers.py::test_c_header_comes_first_when_the_first_call_crashes",
    "tests/integration/test_report.py::test_check_reports_unfilled_fields_and_json",
    "tests/integration/test_canary.py::test_healthy_endpoint_passes_with_figures",
    "tests/integration/test_fleet.py::test_incident_fleet_cross_comparison",
    "tests/integration/test_guard_compose.py::test_the_runbooks_command_works_without_env_or_out",
    "tests/integration/test_capture_handler.py::test_handler_fed_a_real_core_like_the_kernel",
    "tests/integration/test_sandbox.py::test_analyze_sandbox_gives_the_same_json_and_writes_only_its_output",
)


def in_quick_loop(nodeid: str) -> bool:
    """Whether a test (by its pytest node id) is in :data:`QUICK`: a directory, a file, or a test with every
    parametrization of it."""
    return any(nodeid.startswith(q) if q.endswith("/") else
               nodeid == q or nodeid.startswith(q + ("::" if q.endswith(".py") else "[")) for q in QUICK)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if in_quick_loop(item.nodeid):
            item.add_marker(pytest.mark.quick)


def pytest_sessionstart(session: pytest.Session) -> None:
    problems = []
    for tool, fix in (("gdb", "apt-get install -y gdb"), ("gcc", "apt-get install -y gcc")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing: {fix} (or run: bash .ci/setup)")
    if problems:
        pytest.exit("; ".join(problems), returncode=1)


def python_params(versions=WANTED, sid=()):
    """pytest params for each wanted CPython of this machine (a missing one is skipped with its reason),
    then each of Debian unstable's builds in ``sid`` (``"3.14d"``: crashed inside the sid root)."""
    out = []
    for v in versions:
        if v in PYTHONS:
            out.append(pytest.param(v, id=f"python={v}"))
        else:
            skip = pytest.mark.skip(reason=f"CPython {v} not found on this machine")
            out.append(pytest.param(v, id=f"python={v}", marks=skip))
    out += [pytest.param(f"sid-{b}", id=f"python=sid-{b}") for b in sid]
    return out


#: Debian unstable's builds the tests crash inside the sid root: release and debug (``d``) of each
SID_BUILDS = ("3.13", "3.13d", "3.14", "3.14d", "3.15", "3.15d")


@dataclass(frozen=True)
class Interpreter:
    """One CPython build the tests crash: this machine's (``3.12``) or one inside the sid root (``sid-3.14d``)."""

    key: str
    version: str  # "3.14"
    python: str  # the path to run (inside ``root`` when there is one)
    root: Path | None = None

    @property
    def executable(self) -> str:
        """The interpreter's file on this machine."""
        return str(self.root / self.python.lstrip("/")) if self.root else self.python

    @property
    def debug_build(self) -> bool:
        return self.python.endswith("d")

    def gdb_py(self) -> str | None:
        """CPython's own python-gdb.py for this build (the py-bt oracle), or None."""
        if self.root is None:
            found = sorted(Path(self.python).parent.glob(f"python{self.version}*-gdb.py"))
            return str(found[0]) if found else None
        auto = self.root / "usr/share/gdb/auto-load"
        names = ([f"usr/bin/python{self.version}-dbg-gdb.py", f"usr/bin/python{self.version}d-gdb.py"]
                 if self.debug_build else [f"usr/bin/python{self.version}-gdb.py",
                                           f"usr/lib/x86_64-linux-gnu/libpython{self.version}.so.1.0-gdb.py"])
        return next((str(auto / n) for n in names if (auto / n).is_file()), None)


class CoreFactory:
    """Makes real kernel cores on demand and caches them for the session."""

    def __init__(self, base: Path, sid_root=None) -> None:
        self.base = base
        self._sid_root = sid_root  # a callable giving the sid root (built or found on first use)
        self._cache: dict[tuple[str, str, int, str | None], Path] = {}

    def interpreter(self, key: str) -> Interpreter:
        if key.startswith("sid-"):
            build = key[4:]
            return Interpreter(key=key, version=build.rstrip("d"), python=f"/usr/bin/python{build}",
                               root=self._sid_root())
        return Interpreter(key=key, version=key, python=PYTHONS[key])

    def get(self, version: str, scenario: str, copy: int = 0, handler: str | None = None) -> Path:
        """A core of ``scenario`` under ``version`` (``3.12``: this machine's; ``sid-3.14``: Debian's, in the
        sid root); ``handler`` installs a crash reporter that faults as the process dies
        (tests/crashers/make_core.py HANDLERS)."""
        from tests.crashers.make_core import make_core

        key = (version, scenario, copy, handler)
        if key not in self._cache:
            # one directory: libcrash.so is built once, each crash gets its own run directory
            interp = self.interpreter(version)
            self._cache[key] = make_core(self.base, interp.python, scenario, handler=handler, root=interp.root)
        return self._cache[key]


class CorePatternLock:
    """kernel.core_pattern is one per machine: test sessions share it through a lock file.

    A session that makes cores holds the lock shared from the first test that asks for
    :func:`core_pattern`; a test that points core_pattern at a handler for a moment holds
    it exclusive for that window (:meth:`exclusive`), so another session on the machine
    never crashes a process into it, nor saves and later "restores" that momentary
    pattern.  CI runs one session; this is for a developer's machine running several.

    flock has no writer preference and sessions hold the shared lock for their whole
    life, so a blocking upgrade could wait forever while other sessions come and go
    (and two sessions upgrading at once wait on each other).  :meth:`exclusive` therefore
    tries for a bounded time and then skips, naming the reason: the machine-wide setting
    is held by another test session, an external thing this session cannot have.  A test
    takes it before it starts anything that lives a bounded time (a ``sleep 120`` standing
    in for a pod): a wait of up to ``WAIT_S`` had outlived them, and the lock had late made
    the test fail instead of skip.
    """

    PATH = "/tmp/forensics-tests-core-pattern.lock"
    WAIT_S = float(os.environ.get("FORENSICS_TEST_CORE_PATTERN_WAIT", "300"))

    def __init__(self) -> None:
        import fcntl

        self._fcntl = fcntl
        self.fd = os.open(self.PATH, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    @contextlib.contextmanager
    def exclusive(self):
        import time

        fcntl = self._fcntl
        deadline = time.monotonic() + self.WAIT_S
        while True:
            try:
                # a failed non-blocking conversion drops the shared lock (flock(2)): take it back
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                fcntl.flock(self.fd, fcntl.LOCK_SH)
                if time.monotonic() >= deadline:
                    pytest.skip(f"another test session on this machine holds kernel.core_pattern "
                                f"(lock {self.PATH}) for over {self.WAIT_S:.0f} s")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_SH)

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def short_core_dir():
    """A core directory under /tmp with a short name: a ``|`` core_pattern naming it and the venv's forensics
    must fit the kernel's 128 bytes, which pytest's tmp_path (and a CI checkout's path) can exceed."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="fc", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def core_pattern_lock():
    lock = CorePatternLock()
    try:
        yield lock
    finally:
        lock.close()


@pytest.fixture(scope="session")
def core_pattern(core_pattern_lock):
    """Cores land in the crashing process's cwd.

    When kernel.core_pattern pipes cores elsewhere (systemd-coredump, apport) and we
    are root, set it to ``core`` for the session and restore the old value after;
    otherwise skip the tests that need real cores, saying why.  The value is the
    machine-wide :class:`CorePatternLock`.
    """
    from tests.crashers.make_core import core_pattern_problem

    problem = core_pattern_problem()
    if not problem:
        yield core_pattern_lock
        return
    path = Path("/proc/sys/kernel/core_pattern")
    if os.geteuid() != 0:
        pytest.skip(f"{problem}; run as root to let the tests set it to 'core' for the session")
    old = path.read_text()
    path.write_text("core")
    try:
        yield core_pattern_lock
    finally:
        path.write_text(old)


@pytest.fixture(scope="session")
def cores(tmp_path_factory: pytest.TempPathFactory, core_pattern, request) -> CoreFactory:
    return CoreFactory(tmp_path_factory.mktemp("cores"), sid_root=lambda: request.getfixturevalue("sid_root"))


class SameBugCores:
    """Cores of tests/crashers/same_bug.py (and of tests/crashers/overflow.py: ``script``), one per (interpreter,
    mode, faulthandler), made on first use and shared by the session; and their analyses.  ``keys``: this
    machine's interpreters, and Debian unstable's builds in the sid root when it can be built or found (asked for
    on first use of ``keys`` only: a test of this machine's newest interpreter never waits for the root)."""

    def __init__(self, cores: CoreFactory, request) -> None:
        from tests.crashers.make_core import build_libcrash

        self.factory = cores
        self.lib = build_libcrash(cores.base)
        self._request = request
        self._keys: list[str] | None = None
        self._cores: dict[tuple, Path] = {}
        self._analyses: dict[tuple, object] = {}

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            try:
                self._request.getfixturevalue("sid_root")
                sid = [f"sid-{b}" for b in SID_BUILDS]
            except pytest.skip.Exception:
                sid = []  # this machine's interpreters only: Debian's root could not be built or found
            self._keys = list(PYTHONS) + sid
        return self._keys

    def core(self, key: str, mode: str, *, faulthandler: bool = False, python: str | None = None,
             script: Path | None = None, lib: Path | None = None) -> Path:
        """A core of ``mode`` under interpreter ``key`` (``python``: another path to run it by, a venv's;
        ``script``: another crasher taking the same arguments, with a work directory after them; ``lib``:
        another build of libcrash.so, libthrower.so beside it for the ``throw-*`` modes)."""
        import tempfile

        from tests.crashers.make_core import build_thrower, crash_for_core

        script = script or SAME_BUG
        lib = lib or self.lib
        k = (key, mode, faulthandler, python, script, lib)
        if k not in self._cores:
            interp = self.factory.interpreter(key)
            run = Path(tempfile.mkdtemp(prefix=f"run-same-{mode}-", dir=self.factory.base))
            env = {"PYTHONFAULTHANDLER": "1"} if faulthandler else {"PYTHONFAULTHANDLER": ""}
            extra = [str(run)] if script != SAME_BUG else []
            binds = (script, lib, build_thrower(lib.parent)) if mode.startswith("throw") else (script, lib)
            self._cores[k] = crash_for_core([python or interp.python, str(script), str(lib), mode, *extra],
                                            run, env=env, root=interp.root, binds=binds, outputs=("samples.dat",))
        return self._cores[k]

    def analysis(self, key: str, mode: str, *, faulthandler: bool = False, python: str | None = None,
                 script: Path | None = None, lib: Path | None = None, **kw):
        from forensics.analyze import analyze_core

        k = (key, mode, faulthandler, python, script, lib, tuple(sorted(kw.items())))
        if k not in self._analyses:
            root = self.factory.interpreter(key).root
            core = self.core(key, mode, faulthandler=faulthandler, python=python, script=script, lib=lib)
            self._analyses[k] = analyze_core(str(core), sysroot=str(root) if root else None, **kw)
        return self._analyses[k]


#: the crasher whose modes are one bug each, whatever interpreter runs it (tests/crashers/same_bug.py)
SAME_BUG = ROOT / "tests" / "crashers" / "same_bug.py"


@pytest.fixture(scope="session")
def same_bug(cores, request) -> SameBugCores:
    if not PYTHONS:
        pytest.skip("no CPython 3.8-3.13 found on this machine")
    return SameBugCores(cores, request)


@pytest.fixture(scope="session")
def newest_python() -> str:
    for v in reversed(WANTED):
        if v in PYTHONS:
            return v
    pytest.skip("no CPython 3.8-3.13 found on this machine")


#: the Debian unstable root the tests crash CPython 3.13-3.15 in (tests/roots.py); 3.13 is Debian's build of it
SID_PACKAGES = ("python3.13", "python3.13-dbg", "python3.14", "python3.14-dbg", "python3.15", "python3.15-dbg",
                "libc6-dbg")


@pytest.fixture(scope="session")
def sid_root() -> Path:
    """A cached Debian unstable root with CPython 3.13-3.15 (release and -dbg) and glibc's debug files."""
    from tests.roots import RootUnavailable, build_root

    try:
        return build_root("sid", SID_PACKAGES)
    except RootUnavailable as e:
        pytest.skip(f"no Debian unstable root: {e}")


class GuestCoreFactory:
    """AArch64 cores of tests/crashers/exporter.py, crashed under qemu-user in the cached arm64 roots
    (tests/arm64.py), made once per (suite, scenario) and shared by the session."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._roots: dict[str, Path] = {}
        self._sysroots: dict[str, Path] = {}
        self._cache: dict[tuple[str, str, bool, str | None], Path] = {}

    def root(self, suite: str) -> Path:
        """The arm64 root of ``suite`` (tests/arm64.py SUITES); skips when it cannot be had here."""
        from tests.arm64 import guest_problem, guest_root
        from tests.roots import RootUnavailable

        problem = guest_problem()
        if problem:
            pytest.skip(f"no arm64 guests here: {problem}")
        if suite not in self._roots:
            try:
                self._roots[suite] = guest_root(suite)
            except RootUnavailable as e:
                pytest.skip(f"no arm64 {suite} root: {e}")
        return self._roots[suite]

    def core(self, suite: str, scenario: str, *, debug: bool = False, cpu: str | None = None) -> Path:
        """qemu's core of exporter.py's ``scenario`` under ``suite``'s CPython (``debug``: its -dbg build;
        ``cpu``: qemu's CPU model, tests/arm64.py)."""
        from tests.arm64 import guest_python, make_guest_core

        key = (suite, scenario, debug, cpu)
        if key not in self._cache:
            self._cache[key] = make_guest_core(self.base, self.root(suite), guest_python(suite, debug=debug), scenario,
                                               cpu=cpu)
        return self._cache[key]

    def sysroot(self, suite: str) -> Path:
        """The sysroot an analysis of this factory's cores takes: the root plus arm64/libcrash.so."""
        from tests.arm64 import analysis_sysroot, build_guest_libcrash

        if suite not in self._sysroots:
            lib = build_guest_libcrash(self.base)
            self._sysroots[suite] = analysis_sysroot(self.root(suite), self.base / f"sysroot-{suite}", [lib])
        return self._sysroots[suite]


@pytest.fixture(scope="session")
def arm64_cores(tmp_path_factory: pytest.TempPathFactory, core_pattern_lock) -> GuestCoreFactory:
    """Guest cores: qemu-user writes them itself whatever kernel.core_pattern says, but the kernel still
    dumps qemu (its notes only), so this holds the session's share of the core_pattern lock."""
    return GuestCoreFactory(tmp_path_factory.mktemp("arm64-cores"))
