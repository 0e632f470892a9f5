"""Ground truth for ``--execute``: run the image's own interpreter as the runtime would and ask it.

The image's start-up code (``sitecustomize``, ``.pth`` import lines, ``PYTHONPATH``) runs in the probe, so
the probe gets no more than the container would.  Images: bubblewrap over the unpacked root (read-only), new
user/pid/net/ipc/uts/cgroup namespaces (no network), the image's WorkingDir, Env and User.  Processes: every
namespace of the process that differs from ours (user, mount, pid, net, ipc, uts, cgroup, time), its root and
cwd, its uid, gid and groups, its capability bounding set and no_new_privs (:data:`_ENTER`), or a refusal
that says why.  Both: the limits below (memory, file size, /tmp, processes).  The interpreter runs with the
command's own options and ``-c`` and a probe printing, for each module, the file it imports and its
``__version__``; for a script the probe puts the script's directory first, as CPython does for
``python script.py``.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ExecuteError, StartupFailed
from ..subproc import OutputTooLarge, run_bounded
from .dpkg import find_file_owners
from .model import ExecutedModule, ExecuteResult, ModuleCheck, PythonSetup
from .rootfs import RootFS, norm

__all__ = ["PROBE", "PROBE_LIMITS", "run_probe_bwrap", "run_probe_nsenter", "compare", "missing_of",
           "startup_result", "parse_credentials", "map_id", "limit_notes",
           "Credentials", "ProbeLimits"]

_MARK = "FORENSICS-PROBE "
#: the most of the probe's standard output read (its JSON is a few KiB a module; the image's code may print more)
PROBE_MAX_OUTPUT = 16 << 20
PROBE = r"""
import sys, json, os
names = json.loads(sys.argv[1]); script_dir = sys.argv[2]
if script_dir and sys.path and sys.path[0] == '':
    sys.path[0] = script_dir
out = {"sys_path": [p if p else os.getcwd() for p in sys.path], "modules": {}, "version": sys.version.split()[0]}
import importlib, importlib.util
for n in names:
    r = {}
    try:
        spec = importlib.util.find_spec(n)
    except BaseException as e:
        spec = None
        r["error"] = "%s: %s" % (type(e).__name__, e)
    if spec is None:
        r.setdefault("error", "not found")
    else:
        r["origin"] = spec.origin if spec.has_location else None
        r["locations"] = list(spec.submodule_search_locations or [])
        try:
            m = importlib.import_module(n)
            r["file"] = getattr(m, "__file__", None)
            v = getattr(m, "__version__", None)
            r["version"] = None if v is None else str(v)
        except BaseException as e:
            r["import_error"] = "%s: %s" % (type(e).__name__, e)
            if isinstance(e, ImportError) and isinstance(getattr(e, "name", None), str):
                r["import_error_name"] = e.name
    out["modules"][n] = r
# what put each entry there: the customize modules and the .pth files that name it
import site
custom = {}
for name in ("sitecustomize", "usercustomize"):
    m = sys.modules.get(name)
    f = getattr(m, "__file__", None)
    if f:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                custom[f] = fh.read(1 << 20)
        except OSError:
            pass
pths = {}
dirs = list(getattr(site, "getsitepackages", lambda: [])())
if getattr(site, "ENABLE_USER_SITE", False):
    dirs.append(site.getusersitepackages())
for d in dirs:
    try:
        names = sorted(os.listdir(d))
    except OSError:
        continue
    for nm in names:
        if nm.endswith(".pth"):
            try:
                with open(os.path.join(d, nm), encoding="utf-8", errors="replace") as fh:
                    pths[os.path.join(d, nm)] = fh.read(1 << 20)
            except OSError:
                pass
out["put_by"] = {}
for p in out["sys_path"]:
    who = [f for f, t in custom.items() if p in t] + [f for f, t in pths.items() if p in t]
    if who:
        out["put_by"][os.path.normpath(p)] = who
out["customize"] = sorted(custom)
sys.stdout.write("\n" + "FORENSICS-PROBE " + json.dumps(out) + "\n")
sys.stdout.flush()
"""


def _probe_args(setup: PythonSetup, names: list[str]) -> list[str]:
    entry = setup.entrypoint
    script_dir = ""
    if entry.mode == "script" and not setup.safe_path and setup.sys_path:
        script_dir = setup.sys_path[0].path
    return [*entry.flags, "-c", PROBE, json.dumps(names), script_dir]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeLimits:
    """What the probe's process tree may use: the image's start-up code runs in it and may be hostile."""

    data: int = 1 << 30  #: RLIMIT_DATA: heap and private writable memory (a 1.5 GB allocation fails)
    address_space: int = 8 << 30  #: RLIMIT_AS: every mapping, shared anonymous memory included
    file_size: int = 64 << 20  #: RLIMIT_FSIZE: the largest file it may write (EFBIG past it)
    tmpfs: int = 128 << 20  #: bubblewrap's --size of the image's /tmp and /dev/shm (ENOSPC past it)
    processes: int = 64  #: pids.max of a cgroup of its own (tasks: processes and threads)


PROBE_LIMITS = ProbeLimits()


def _limit_texts(limits: ProbeLimits) -> dict[str, str]:
    return {"memory": f"memory limit ({limits.data >> 20} MiB of data, RLIMIT_DATA; {limits.address_space >> 30} "
                      f"GiB of address space, RLIMIT_AS)",
            "file-size": f"file-size limit ({limits.file_size >> 20} MiB a file, RLIMIT_FSIZE)",
            "space": f"space limit (/tmp and /dev/shm {limits.tmpfs >> 20} MiB each)",
            "processes": f"process limit ({limits.processes} tasks)"}


_LIMIT_SIGNS = (("memory", "MemoryError"), ("file-size", "[Errno 27]"), ("space", "[Errno 28]"),
                ("processes", "[Errno 11]"))


def limit_notes(stderr: str, limits: ProbeLimits = PROBE_LIMITS) -> list[str]:
    r"""One note for each limit the image's start-up code ran into, from the interpreter's standard error (what
    ``site`` prints for a ``.pth`` line or a ``sitecustomize`` that raised), with where it was.

    >>> [n[-51:] for n in limit_notes("Error processing line 1 of /s/x.pth:\n  Traceback\nMemoryError\n")]
    [': MemoryError (Error processing line 1 of /s/x.pth)']
    """
    notes: list[str] = []
    texts = _limit_texts(limits)
    lines = stderr.splitlines()
    for kind, sign in _LIMIT_SIGNS:
        for i, line in enumerate(lines):
            if sign not in line:
                continue
            where = next((ln.strip().rstrip(":") for ln in reversed(lines[:i])
                          if ln.startswith(("Error processing line", "Error in sitecustomize",
                                            "Error in usercustomize"))), "")
            notes.append(f"start-up code hit the probe's {texts[kind]}: {line.strip()[:200]}"
                         + (f" ({where[:300]})" if where else ""))
            break
    return notes


class _ProbeCgroup:
    """A pids cgroup of the probe's own (cgroup v2 at /sys/fs/cgroup, else v1's pids hierarchy), at most
    ``limit`` tasks; what is still in it at the end is killed, and it is removed.  RLIMIT_NPROC cannot do this:
    it is not enforced for a task whose uid is root outside its user namespace (bubblewrap run by root maps
    the sandbox's user to root), so ``why`` says it when no cgroup can be made."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.path: str | None = None
        self.fd: int | None = None
        self.why = ""

    def __enter__(self) -> _ProbeCgroup:
        name = f"forensics-probe-{os.getpid()}-{secrets.token_hex(4)}"
        v2 = os.path.isfile("/sys/fs/cgroup/cgroup.controllers")
        base = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/pids"
        try:
            if v2:
                with open(f"{base}/cgroup.subtree_control", encoding="ascii") as f:
                    if "pids" not in f.read().split():
                        raise OSError(0, "the pids controller is not enabled at the cgroup root")
            os.mkdir(f"{base}/{name}", 0o700)
            self.path = f"{base}/{name}"
            with open(f"{self.path}/pids.max", "w", encoding="ascii") as f:
                f.write(str(self.limit))
            self.fd = os.open(f"{self.path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            self.why = f"no pids cgroup could be made under {base} ({e.strerror or e})"
            self.__exit__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.path is None:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"{self.path}/cgroup.procs", encoding="ascii") as f:
                    pids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
                break
            time.sleep(0.02)
        self.path = None


def _limited(cgroup: _ProbeCgroup, limits: ProbeLimits) -> Callable[[], None]:
    """The preexec function: into the cgroup, then the rlimits (inherited by bubblewrap, the helper and the
    interpreter); no core (SIGXFSZ's default action dumps one; CPython ignores it and gets EFBIG)."""
    fd = cgroup.fd

    def apply() -> None:
        if fd is not None:
            os.write(fd, b"0")
        for res, value in ((resource.RLIMIT_DATA, limits.data), (resource.RLIMIT_AS, limits.address_space),
                           (resource.RLIMIT_FSIZE, limits.file_size), (resource.RLIMIT_CORE, 0)):
            hard = resource.getrlimit(res)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (value, value))

    return apply


def _run(cmd: list[str], env: dict[str, str] | None, timeout: float, sandbox: str = "", *, input: str | None = None,
         limits: ProbeLimits = PROBE_LIMITS) -> tuple[dict, list[str]]:
    """The probe's answer and the notes about it (the limits it ran into, a limit that could not be set)."""
    with _ProbeCgroup(limits.processes) as cgroup:
        try:  # bounded: the image's own code runs in the probe and writes what it likes
            p = run_bounded(cmd, timeout=timeout, env=env, input=input, max_stdout=PROBE_MAX_OUTPUT,
                            preexec_fn=_limited(cgroup, limits))
        except subprocess.TimeoutExpired as e:
            raise ExecuteError("probe", f"timed out after {timeout:g}s",
                               hint="The image's interpreter did not finish importing the modules in time "
                                    "(an import that blocks or loops at start-up); the static verdicts stand.") from e
        except OutputTooLarge as e:
            raise ExecuteError("probe", f"the image's interpreter wrote more than {PROBE_MAX_OUTPUT >> 20} MiB "
                                        "(stopped)",
                               hint="Code that runs at start-up in the image floods its output; the static verdicts "
                                    "stand.") from e
        except subprocess.SubprocessError as e:  # the preexec function failed: no limits, so no probe
            raise ExecuteError("limits", f"the probe's limits could not be set ({e})") from e
        except OSError as e:
            raise ExecuteError(cmd[0], e.strerror or str(e)) from e
    notes = limit_notes(p.stderr, limits)
    if cgroup.why:
        notes.append(f"the probe's processes were not counted: {cgroup.why}")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(_MARK):
            return _clean_probe(line[len(_MARK):]), notes
    tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-3:]
    if sandbox and p.returncode == _ENTER_FAILED and _ENTER_MARK in p.stderr:
        why = next(ln for ln in reversed(p.stderr.splitlines()) if ln.startswith(_ENTER_MARK))
        raise ExecuteError("namespaces", f"not run: {why[len(_ENTER_MARK):].strip()}", hint=_REFUSED_HINT)
    if sandbox and p.returncode != 0 and any(s in p.stderr for s in _SANDBOX_FAILS):
        raise ExecuteError(sandbox, " | ".join(tail))
    raise StartupFailed(" | ".join(tail), p.returncode)


def _strs(v: object) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _clean_probe(text: str) -> dict:
    """The probe's JSON, typed: the image's own code runs in the same process and prints what it likes."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ExecuteError("probe", f"unreadable output from the image's interpreter: {str(e)[:120]}",
                           hint="Code that runs at start-up in the image wrote over the probe's output.") from None
    if not isinstance(doc, dict):
        raise ExecuteError("probe", "unreadable output from the image's interpreter",
                           hint="Code that runs at start-up in the image wrote over the probe's output.")
    mods: dict[str, dict[str, str | list[str] | None]] = {}
    modules, put = doc.get("modules"), doc.get("put_by")
    for name, r in (modules.items() if isinstance(modules, dict) else ()):
        if isinstance(name, str) and isinstance(r, dict):
            mods[name] = {k: (v if isinstance(v, str) else None) for k, v in r.items() if k != "locations"}
            mods[name]["locations"] = _strs(r.get("locations"))
    put_by = {k: _strs(v) for k, v in (put.items() if isinstance(put, dict) else ()) if isinstance(k, str)}
    return {"sys_path": _strs(doc.get("sys_path")), "modules": mods, "put_by": put_by,
            "customize": _strs(doc.get("customize"))}




_SANDBOX_FAILS = ("bwrap:",)


@functools.lru_cache(maxsize=4)
def _bwrap_sizes(bwrap: str) -> bool:
    """Does this bubblewrap take ``--size`` (a tmpfs's size)?"""
    try:
        p = run_bounded([bwrap, "--help"], timeout=10, max_stdout=1 << 20)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in p.stdout + p.stderr


def run_probe_bwrap(root: str, setup: PythonSetup, env: dict[str, str], uid: int, gid: int, names: list[str],
                    *, timeout: float = 120.0) -> tuple[dict, list[str], list[str]]:
    """Run the probe in a bubblewrap sandbox over ``root``, within :data:`PROBE_LIMITS`; returns (probe output,
    command, notes)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ExecuteError("bubblewrap", "bwrap is not on PATH (Debian/Ubuntu: apt-get install -y bubblewrap)")
    if len(setup.working_dir.encode("utf-8", "surrogateescape")) > 4095:
        raise ExecuteError("workdir", f"{setup.working_dir[:80]}...: longer than PATH_MAX (4096 bytes)",
                           hint="No runtime can enter this working directory; fix the image's WorkingDir.")
    notes = []
    size = ["--size", str(PROBE_LIMITS.tmpfs)] if _bwrap_sizes(bwrap) else []
    if not size:
        notes.append(f"this bubblewrap has no --size (0.8 has): /tmp and /dev/shm not bounded to "
                     f"{PROBE_LIMITS.tmpfs >> 20} MiB (each file still to {PROBE_LIMITS.file_size >> 20} MiB)")
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
           "--ro-bind", root, "/"]
    for mnt, opt in (("/proc", ["--proc"]), ("/dev", ["--dev"]), ("/tmp", [*size, "--tmpfs"])):
        if not os.path.isdir(root + mnt) or os.path.islink(root + mnt):
            notes.append(f"{mnt} absent in the image: not mounted in the sandbox")
        elif mnt == "/tmp" and os.listdir(root + mnt):
            # a runtime shows the image's /tmp as it is (code can live there): keep it, read-only
            notes.append("/tmp holds files in the image: kept as it is (read-only), not replaced by a tmpfs")
        else:
            cmd += [*opt, mnt]
        if mnt == "/dev" and cmd[-1] == "/dev":  # bubblewrap's /dev is a tmpfs of half the RAM: bounded /dev/shm,
            cmd += [*size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]  # the rest read-only
    cmd += ["--chdir", setup.working_dir, "--clearenv"]
    for k, v in sorted(env.items()):
        cmd += ["--setenv", k, v]
    interpreter = setup.entrypoint.interpreter
    if interpreter is None:
        raise ExecuteError("interpreter", "no Python interpreter in the image to run")
    cmd += ["--uid", str(uid), "--gid", str(gid), "--", interpreter, *_probe_args(setup, names)]
    try:
        probe, more = _run(cmd, None, timeout, "bubblewrap")
    except StartupFailed as e:
        e.command = cmd
        raise
    return probe, cmd, notes + more


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """A process's ids and capabilities as /proc/PID/status shows them to us (ids in our user namespace)."""

    uid: int  # effective
    gid: int
    groups: tuple[int, ...]
    cap_bounding: int
    cap_permitted: int


def parse_credentials(status: str) -> Credentials:
    r"""The effective uid and gid, the supplementary groups and two capability sets of /proc/PID/status.

    >>> c = parse_credentials("Uid:\t0\t1000\t0\t0\nGid:\t5\t5\t5\t5\nGroups:\t4 27 \nCapPrm:\t00000000000000ff\n"
    ...                       "CapBnd:\t000001ffffffffff\n")
    >>> c.uid, c.gid, c.groups, hex(c.cap_permitted & c.cap_bounding)
    (1000, 5, (4, 27), '0xff')
    """
    fields: dict[str, list[str]] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    try:
        return Credentials(uid=int(fields["Uid"][1]), gid=int(fields["Gid"][1]),
                           groups=tuple(int(g) for g in fields.get("Groups", [])),
                           cap_bounding=int(fields["CapBnd"][0], 16), cap_permitted=int(fields["CapPrm"][0], 16))
    except (KeyError, IndexError, ValueError) as e:
        raise ExecuteError("namespaces", f"not run: /proc/PID/status has no readable {e} line",
                           hint=_REFUSED_HINT) from None


def map_id(outside: int, id_map: str) -> int | None:
    r"""The id inside a user namespace of ``outside`` (an id in ours), by the namespace's uid_map or gid_map as we
    read it (``inside outside count`` a line); None when it is not mapped.

    >>> map_id(100000, "0 100000 65536\n"), map_id(0, "0 0 1\n"), map_id(5, "0 100000 65536\n")
    (0, 0, None)
    """
    for line in id_map.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            inside, start, count = map(int, parts)
            if start <= outside < start + count:
                return inside + outside - start
    return None


#: namespaces in the order they are entered: the user namespace last, while we still hold every capability in
#: the namespaces that own the others (a pod whose network namespace belongs to the host's user namespace)
_NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "time", "mnt", "user")
_ENTER_MARK = "forensics-enter: "
_ENTER_FAILED = 125
_REFUSED_HINT = ("--execute runs the process's own start-up code, so it runs it only inside all of the "
                 "process's namespaces with its credentials; where that cannot be done it runs nothing. Run "
                 "without --execute for the static verdicts.")
#: enter the namespaces of a process, take its root, cwd, ids and capability bounding set, set no_new_privs and
#: run its interpreter.  Run by our own interpreter (-I -S: nothing of the target's environment touches it);
#: the plan in argv[1], the environment for the interpreter on standard input.  nsenter cannot do this with
#: setpriv: the capabilities must be dropped after setns, inside the target's root, where no setpriv is.  Every
#: import is done before the first setns (the host's standard library is not in the target's root).
_ENTER = r"""
import ctypes, json, os, select, sys
libc = ctypes.CDLL(None, use_errno=True)
def oops(kind, value, tb):
    sys.stderr.write("forensics-enter: %s: %s\n" % (kind.__name__, value))
    sys.stderr.flush()
    os._exit(125)
sys.excepthook = oops
def fail(step, err):
    sys.stderr.write("forensics-enter: %s: %s\n" % (step, os.strerror(err)))
    sys.stderr.flush()
    os._exit(125)
def call(step, r):
    if r != 0:
        fail(step, ctypes.get_errno())
plan = json.loads(sys.argv[1]); argv = sys.argv[sys.argv.index("--") + 1:]
env = json.loads(sys.stdin.buffer.read(16 << 20))
try:
    null = os.open("/dev/null", os.O_RDONLY)
    proc = os.open("/proc/%d" % plan["pid"], os.O_RDONLY | os.O_DIRECTORY)
    with os.fdopen(os.open("stat", os.O_RDONLY, dir_fd=proc), "rb") as f:
        start = f.read(4096).rsplit(b")", 1)[-1].split()[19].decode()
    if start != plan["start"]:
        fail("process %d" % plan["pid"], 3)
    ns = [(name, os.open("ns/" + name, os.O_RDONLY, dir_fd=proc)) for name in plan["ns"]]
    root = os.open("root", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
    cwd = os.open("cwd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
except OSError as e:
    fail("opening /proc/%d/%s" % (plan["pid"], e.filename or ""), e.errno or 0)
os.dup2(null, 0)
try:
    os.setgroups(plan["groups"])
except OSError as e:
    fail("taking its groups", e.errno)
for name, fd in ns:
    call("entering its %s namespace" % name, libc.setns(fd, 0))
alive, held = os.pipe()
child = os.fork()
if child:
    st = os.waitpid(child, 0)[1]
    code = os.waitstatus_to_exitcode(st)
    os._exit(code if code >= 0 else 128 - code)
try:
    os.fchdir(root); os.chroot("."); os.fchdir(cwd)
except OSError as e:
    fail("entering its root", e.errno)
for cap in range(64):
    if not plan["caps"] >> cap & 1 and libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
        fail("dropping capability %d from the bounding set" % cap, ctypes.get_errno())
try:
    os.setresgid(plan["gid"], plan["gid"], plan["gid"]); os.setresuid(plan["uid"], plan["uid"], plan["uid"])
except OSError as e:
    fail("taking its uid %d / gid %d" % (plan["uid"], plan["gid"]), e.errno)
libc.prctl(47, 4, 0, 0, 0)
call("setting the parent-death signal", libc.prctl(1, 9, 0, 0, 0))
os.close(held)
if select.select([alive], [], [], 0)[0]:
    os._exit(125)
head = (ctypes.c_uint32 * 2)(0x20080522, 0); caps = (ctypes.c_uint32 * 6)()
call("reading capabilities", libc.capget(head, caps))
caps[2] = caps[5] = 0
call("clearing the inheritable capabilities", libc.capset(head, caps))
call("setting no_new_privs", libc.prctl(38, 1, 0, 0, 0))
try:
    os.execve(argv[0], argv, env)
except OSError as e:
    fail("running " + argv[0], e.errno)
"""


def _differing_namespaces(pid: int) -> list[str]:
    """The namespaces of ``pid`` that are not ours, in :data:`_NAMESPACES`'s order."""
    out = []
    for name in _NAMESPACES:
        try:
            ours = os.stat(f"/proc/self/ns/{name}")
        except FileNotFoundError:
            continue  # this kernel has no such namespace
        try:
            theirs = os.stat(f"/proc/{pid}/ns/{name}")
        except OSError as e:
            raise ExecuteError("namespaces", f"not run: /proc/{pid}/ns/{name}: {e.strerror or e}",
                               hint=_REFUSED_HINT) from e
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            out.append(name)
    return out


def _read_proc(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", encoding="ascii", errors="replace") as f:
            return f.read(1 << 20)
    except OSError as e:
        raise ExecuteError("namespaces", f"not run: /proc/{pid}/{name}: {e.strerror or e}",
                           hint=_REFUSED_HINT) from e


def _enter_plan(pid: int) -> dict:
    """What :data:`_ENTER` does for ``pid``: its namespaces, ids (inside its user namespace), groups (ours: set
    before entering), capability bounding set (what it has: bounding and permitted), its start time."""
    ns = _differing_namespaces(pid)
    cred = parse_credentials(_read_proc(pid, "status"))
    start = _read_proc(pid, "stat").rsplit(")", 1)[-1].split()[19:20]
    uid: int | None = cred.uid
    gid: int | None = cred.gid
    if "user" in ns:
        uid, gid = map_id(cred.uid, _read_proc(pid, "uid_map")), map_id(cred.gid, _read_proc(pid, "gid_map"))
    if uid is None or gid is None or not start:
        raise ExecuteError("namespaces", f"not run: the uid {cred.uid} / gid {cred.gid} of process {pid} is not "
                                         "mapped in its user namespace", hint=_REFUSED_HINT)
    return {"pid": pid, "start": start[0], "ns": ns, "uid": uid, "gid": gid, "groups": list(cred.groups),
            "caps": cred.cap_bounding & cred.cap_permitted}


def run_probe_nsenter(pid: int, interpreter: str, setup: PythonSetup, env: dict[str, str], uid: int, gid: int,
                      names: list[str], *, timeout: float = 120.0) -> tuple[dict, list[str], list[str]]:
    """Run the probe as process ``pid`` would start it: in all its namespaces, its root and cwd, its ids and
    groups, no capability it does not hold, no_new_privs, its environment, within :data:`PROBE_LIMITS`.

    ``uid`` and ``gid`` (what the caller read) must still be the process's.

    :raises ExecuteError: not root, or the process's namespaces or credentials cannot be taken (nothing ran)
    """
    if os.geteuid() != 0:
        raise ExecuteError("nsenter", "entering another process's namespaces needs root")
    plan = _enter_plan(pid)
    if "user" not in plan["ns"] and (plan["uid"], plan["gid"]) != (uid, gid):
        raise ExecuteError("namespaces", f"not run: process {pid} changed its uid/gid while it was read",
                           hint=_REFUSED_HINT)
    probe = [interpreter, *_probe_args(setup, names)]
    text = json.dumps(plan, sort_keys=True)
    cmd = [sys.executable, "-I", "-S", "-c", _ENTER, text, "--", *probe]
    shown = [sys.executable, "-I", "-S", "-c", "<forensics: enter the process>", text, "--", *probe]
    probe_out, notes = _run(cmd, None, timeout, "nsenter", input=json.dumps(env))
    ran = ", ".join(plan["ns"]) or "none (it shares ours)"
    notes.insert(0, f"ran in the process's namespaces ({ran}) as uid {plan['uid']} gid {plan['gid']}, "
                    f"capabilities {plan['caps']:#x}, no_new_privs")
    return probe_out, shown, notes


def compare(fs: RootFS, setup: PythonSetup, checks: tuple[ModuleCheck, ...], probe: dict, method: str,
            command: list[str], notes: list[str], env: dict[str, str] | None = None,
            files: RootFS | None = None) -> ExecuteResult:
    """Does the interpreter agree with the static answer, module by module and on sys.path?  ``files`` is the
    root whose package database says who provides what a failed import could not find (default ``fs``)."""

    def same(a: str | None, b: str | None) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return (fs.resolve(norm(a)) or norm(a)) == (fs.resolve(norm(b)) or norm(b))

    mods = []
    owners: dict[str, str | None] = {}  # a missing file's package, looked up once
    for c in checks:
        r = probe.get("modules", {}).get(c.module, {})
        static_file = c.resolved.file if c.resolved else None
        run_file = r.get("file") or r.get("origin")
        if c.resolved is None:
            agrees = r.get("error") == "not found"
        elif c.resolved.file is None:  # namespace package: compare the portions
            agrees = sorted(map(norm, r.get("locations", []))) == sorted(map(norm, c.resolved.search_locations))
        else:
            agrees = same(static_file, run_file)
        version = r.get("version")
        if agrees and c.static_version and version and c.static_version != version:
            agrees = False
        err = r.get("import_error") or (r.get("error") if r.get("error") != "not found" else None)
        lacks = missing_of(err, r.get("import_error_name")) if err else None
        mods.append(ExecutedModule(module=c.module, file=run_file, version=version, error=err, agrees=agrees,
                                   static_file=static_file, static_version=c.static_version, missing=lacks,
                                   provided_by=_provided_by(files or fs, lacks, owners) if lacks else None))
    static_path = [e.path for e in setup.sys_path]
    run_path = [norm(p) for p in probe.get("sys_path", [])]
    path_agrees = [norm(p) for p in static_path] == run_path
    if not path_agrees:
        missing = [p for p in run_path if p not in map(norm, static_path)]
        extra = [p for p in map(norm, static_path) if p not in run_path]
        notes = notes + [f"sys.path differs: interpreter has {missing or 'nothing more'}, "
                         f"static analysis has {extra or 'nothing more'} (order may differ)"]
    difference = _explain(setup, mods, run_path, probe, env)
    return ExecuteResult(method=method, command=tuple(command[:-3] + ["<probe>", command[-2], command[-1]]),
                         sys_path=tuple(run_path), modules=tuple(mods), sys_path_agrees=path_agrees,
                         notes=tuple(notes), difference=difference)


_SHARED_OBJECT = re.compile(r"^ImportError: ([\w.+-]+\.so[\w.]*): cannot open shared object file")


def missing_of(error: str, name: str | None = None) -> str | None:
    """What a failed import could not find, from its exception: the shared object the dynamic loader could not open
    (``libpthread.so.0``), or the module a ModuleNotFoundError names; None for another failure.

    >>> missing_of("ImportError: libpthread.so.0: cannot open shared object file: No such file or directory")
    'libpthread.so.0'
    >>> missing_of("ModuleNotFoundError: No module named 'prometheus_client'", "prometheus_client")
    "the module 'prometheus_client'"
    """
    m = _SHARED_OBJECT.match(error)
    if m:
        return m.group(1)
    if error.startswith("ModuleNotFoundError: ") and name:
        return f"the module {name!r}"
    return None


def _provided_by(fs: RootFS, missing: str, cache: dict[str, str | None]) -> str | None:
    """What the image's package database (dpkg) says of a missing shared object: the package that lists it, and
    whether the file is in the image (a later layer may have deleted it); None when it has nothing to say."""
    if missing in cache:
        return cache[missing]
    said = None
    if not missing.startswith("the module "):
        owners = find_file_owners(fs, missing)
        if owners:
            pkg, path = owners[0]
            where = "in the image" if fs.exists(path) else "not in the image (a layer deleted it)"
            said = f"dpkg: {pkg.name} {pkg.version} lists {path}, {where}"
        elif owners is not None:
            said = "dpkg: no installed package lists it"
    cache[missing] = said
    return said


def _entry_of(file: str, path: list[str]) -> int | None:
    """The sys.path position whose directory holds ``file`` (the longest match)."""
    best = None
    for i, p in enumerate(path):
        if file.startswith(p.rstrip("/") + "/") and (best is None or len(p) > len(path[best])):
            best = i
    return best


def _explain(setup: PythonSetup, mods: list[ExecutedModule], run_path: list[str], probe: dict,
             env: dict[str, str] | None) -> str | None:
    """Which sys.path entry made the interpreter import another file than the static analysis said,
    what put it there, and the fix."""
    static = [norm(e.path) for e in setup.sys_path]
    for m in mods:
        if m.agrees or not m.file:
            continue
        i = _entry_of(norm(m.file), run_path)
        if i is None:
            continue
        entry = run_path[i]
        put_by = (probe.get("put_by") or {}).get(entry) or []
        pythonpath = (env or {}).get("PYTHONPATH", "")
        if entry in static:
            where = f"the static analysis has it at sys.path[{static.index(entry)}], not [{i}]"
        else:
            where = "the static analysis does not have it"
        if put_by:
            who = f"it is named in {', '.join(put_by)}"
            fix = (f"make the edit a literal sys.path.insert/append in {put_by[0]} so that it can be read, or "
                   f"remove it (and {entry} if it holds a stale copy)")
        elif entry in pythonpath.split(":"):
            who = "it comes from PYTHONPATH"
            fix = f"remove {entry} from PYTHONPATH"
        else:
            customize = ", ".join(probe.get("customize") or []) or "no sitecustomize"
            who = (f"code that runs at start-up put it there ({customize}; .pth import lines; a module they "
                   "import)")
            fix = f"find what adds {entry} at start-up and remove it, or remove the stale copy in {entry}"
        return (f"{m.module}: the interpreter imports {m.file} through sys.path[{i}] = {entry}; {where}; "
                f"{who}. Fix: {fix}")
    return None


def startup_result(setup: PythonSetup, failure: StartupFailed, command: list[str], predicted: bool) -> ExecuteResult:
    """--execute's answer when the interpreter dies at start-up: ground truth too (the container dies the
    same way); it agrees with the static analysis when that predicted the failure."""
    return ExecuteResult(method="bubblewrap", command=tuple(command[:-3] + ["<probe>", command[-2], command[-1]]),
                         sys_path=(), modules=(), sys_path_agrees=predicted, startup_error=failure.stderr_tail,
                         notes=(("the static analysis predicted this failure",) if predicted else
                                ("the static analysis did not predict this failure",)))
