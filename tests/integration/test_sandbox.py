"""The sandbox every on-node analysis runs in (forensics/sandbox/, #37 item 2), tried for real.

A probe program run through the sandbox's own wrapper (`python -m forensics.sandbox`, as `agent serve` runs each
analysis: the uid it drops to, a directory it may write) makes every call of the written deny list
(forensics.sandbox.DENIED: docs/security.md prints it), opens a TCP socket, reads /etc/shadow and writes outside its
directory: each is refused, with EPERM or EACCES (clone3: ENOSYS, so that glibc falls back to clone, as the list
says). The same probe run as root without the sandbox shows that each refusal is the sandbox's: there the calls fail
otherwise (bad arguments chosen so that nothing happens) and the socket, the read and the write succeed. Then a real
crash's bundle is analyzed by `agent serve`'s own code in the sandbox and as root without it: the same JSON but for
where the cache lies, with libdw and with gdb (pygdbmi) as the native unwinder.
"""
from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from forensics.sandbox import DENIED, seccomp_rules
from forensics.sandbox.seccomp import syscall_number
from tests.podruntime import searchable_view

FORENSICS = Path(sys.executable).parent / "forensics"
UID = 65532
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")

# Arguments that make each call fail harmlessly when nothing refuses it (EFAULT, EBADF, EINVAL, ESRCH...):
# the probe's control run, as root, must neither reboot nor rename the machine. None: a NULL pointer.
NOWHERE = 1 << 30  # a PID no process has
ARGS: dict[str, tuple] = {
    "ptrace": (2, NOWHERE, 0, 0), "process_vm_readv": (NOWHERE, None, 0, None, 0, 0),
    "process_vm_writev": (NOWHERE, None, 0, None, 0, 0), "process_madvise": (-1, None, 0, 0, 0),
    "kcmp": (NOWHERE, NOWHERE, 0, 0, 0), "pidfd_getfd": (-1, -1, 0),
    "mount": (None, None, None, 0, None), "umount2": (None, 0), "pivot_root": (None, None), "chroot": (None,),
    "move_mount": (-1, None, -1, None, 0), "open_tree": (-1, None, 0), "fsopen": (None, 0), "fsconfig": (-1, 0, None,
    None, 0), "fsmount": (-1, 0, 0), "fspick": (-1, None, 0), "mount_setattr": (-1, None, 0, None, 0),
    "unshare": (1,), "setns": (-1, 0), "clone3": (None, 0),
    "bpf": (-1, None, 0), "perf_event_open": (None, 0, -1, -1, 0), "userfaultfd": (-1,),
    "io_uring_setup": (0, None), "io_uring_enter": (-1, 0, 0, 0, None, 0), "io_uring_register": (-1, 0, None, 0),
    "keyctl": (-1, 0, 0, 0, 0), "add_key": (None, None, None, 0, 0), "request_key": (None, None, None, 0),
    "init_module": (None, 0, None), "finit_module": (-1, None, 0), "delete_module": (None, 0),
    "kexec_load": (0, 0, None, -1), "kexec_file_load": (-1, -1, 0, None, -1), "reboot": (0, 0, 0, None),
    "swapon": (None, 0), "swapoff": (None,), "acct": (b"",), "iopl": (4,), "ioperm": (1 << 16, 1, 1),
    "quotactl": (0, None, 0, None), "syslog": (-1, None, 0), "settimeofday": (None, b"\0" * 8),
    "clock_settime": (-1, None), "clock_adjtime": (-1, None), "adjtimex": (None,), "sethostname": (None, 65),
    "setdomainname": (None, 65), "open_by_handle_at": (-1, None, 0), "name_to_handle_at": (-1, None, None, None, 0),
    "fanotify_init": (0xFFFFFFFF, 0),
}
CLONE_SIGHAND = 0x00000800  # without CLONE_VM: EINVAL from any kernel that gets as far as reading the flags

PROBE = r'''
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
calls, out_dir, outside = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
def call(nr, args):
    ctypes.set_errno(0)
    conv = [ctypes.c_long(a) if isinstance(a, int) else ctypes.c_char_p(a.encode("latin-1"))
            if isinstance(a, str) else None for a in args]
    r = libc.syscall(ctypes.c_long(nr), *conv)
    return 0 if r >= 0 else ctypes.get_errno()
res = {name: call(nr, args) for name, nr, args in calls}
def attempt(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno
res["tcp socket"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
res["udp6 socket"] = attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close())
res["unix socket"] = attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
res["read /etc/shadow"] = attempt(lambda: open("/etc/shadow", "rb").close())
res["write outside"] = attempt(lambda: open(os.path.join(outside, "x"), "w").close())
res["write /tmp"] = attempt(lambda: open("/tmp/forensics-sandbox-probe-%d" % os.getpid(), "w").close())
res["write its output"] = attempt(lambda: open(os.path.join(out_dir, "ok"), "w").close())
status = open("/proc/self/status").read()
print(json.dumps({"results": res, "status": {l.split(":")[0]: l.split(":", 1)[1].strip()
                                              for l in status.splitlines()}}))
'''


def _calls() -> list[tuple[str, int, list]]:
    """(name, number, arguments) of every call the deny list names that this machine has."""
    out = []
    for d in DENIED:
        for name in d.names:
            nr = syscall_number(name)
            if nr is None:
                continue
            if name == "clone":
                out += [(f"clone {bit:#x}", nr, [bit | CLONE_SIGHAND, 0, 0, 0, 0]) for bit in d.flags]
                continue
            args = ARGS[name]
            out.append((name, nr, [a.decode("latin-1") if isinstance(a, bytes) else a for a in args]))
    return out


def _expected(name: str) -> int:
    base = name.split()[0]
    return next(d.errno for d in DENIED if base in d.names)


@pytest.fixture
def dirs():
    base = Path(tempfile.mkdtemp(prefix="fsbx", dir="/tmp"))
    base.chmod(0o755)
    out, outside = base / "out", base / "outside"
    out.mkdir()
    outside.mkdir()
    for d in (out, outside):
        d.chmod(0o777)  # writable by the dropped uid: what refuses a write is the sandbox, not the mode
    try:
        yield out, outside
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
        for p in Path("/tmp").glob("forensics-sandbox-probe-*"):
            p.unlink()


def _probe(prefix: list[str], out: Path, outside: Path) -> dict:
    calls = _calls()
    p = subprocess.run([*prefix, sys.executable, "-c", PROBE, json.dumps(calls), str(out), str(outside)],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_probe_in_the_sandbox_is_refused_every_call_of_the_deny_list(dirs):
    out, outside = dirs
    # GIVEN the wrapper agent serve runs each analysis through, dropping to the analyses' uid, writing only `out`
    wrapper = [sys.executable, "-m", "forensics.sandbox", "--uid", str(UID), "--write", str(out), "--"]
    # WHEN the probe runs in it (reachable to that uid: pytest's and /root's directories are private), and as root
    # without it
    sandboxed = _probe([*searchable_view(bind=[]), *wrapper], out, outside)
    control = _probe([], out, outside)
    # THEN it ran as the analyses do: another uid, no capability, no_new_privs, a seccomp filter
    st = sandboxed["status"]
    assert st["Uid"].split() == [str(UID)] * 4 and st["Gid"].split() == [str(UID)] * 4
    assert (st["CapEff"], st["CapPrm"], st["NoNewPrivs"], st["Seccomp"]) == ("0000000000000000",) * 2 + ("1", "2")
    # and every call of the deny list was refused with the errno the list gives it
    got, ctl = sandboxed["results"], control["results"]
    calls = [name for name, _, _ in _calls()]
    assert len(calls) >= 45, calls
    wrong = {n: (errno.errorcode.get(got[n], got[n]), errno.errorcode.get(_expected(n))) for n in calls
             if got[n] != _expected(n)}
    assert wrong == {}
    # and so were the network, /etc/shadow and every write but into its own directory
    assert (got["tcp socket"], got["udp6 socket"]) == (errno.EPERM, errno.EPERM)
    assert got["read /etc/shadow"] == errno.EACCES
    assert (got["write outside"], got["write /tmp"]) == (errno.EACCES, errno.EACCES)
    assert (got["unix socket"], got["write its output"]) == (0, 0)
    # and those refusals are the sandbox's: as root, without it, the calls fail otherwise (their arguments are bad)
    # and the socket, the read and the writes go through
    assert all(ctl[k] == 0 for k in ("tcp socket", "read /etc/shadow", "write outside", "write /tmp"))
    same = sorted(n for n in calls if ctl[n] == got[n])
    print(f"\n{len(calls)} calls; refused the same way without the sandbox (as root): {same or 'none'}")
    assert len(same) <= 3, same  # a kernel's lockdown may refuse iopl/ioperm/kexec_load to root too


def test_the_filter_is_libseccomps_for_this_architecture():
    # the filter builds here, and knows (nearly) every name of the list on this machine's architecture
    from forensics.sandbox.seccomp import build

    f = build(seccomp_rules())
    try:
        names = {n for d in DENIED for n in d.names}
        assert set(f.skipped) <= {"iopl", "ioperm"} and len(names) - len(f.skipped) >= 45, f.skipped
        r, w = os.pipe()
        f.export(w)  # the BPF program libseccomp wrote (what bubblewrap's --seccomp takes)
        os.close(w)
        bpf = os.read(r, 1 << 20)
        os.close(r)
        assert bpf and len(bpf) % 8 == 0  # whole sock_filter instructions
    finally:
        f.close()


# -- an analysis in the sandbox gives the same JSON as without it -------------------------------------------------

CRASHER = ("import ctypes, sys\n"
           "def parse(): ctypes.string_at(0)\n"
           "parse()\n")


@pytest.fixture(scope="module")
def crash_bundle(tmp_path_factory, core_pattern):
    """A real Python crash (SIGSEGV in ctypes), its kernel core, and the bundle the real core handler makes of it,
    in a directory the analyses' uid can reach."""
    d = tmp_path_factory.mktemp("sbx-crash")
    run = Path(tempfile.mkdtemp(prefix="run-", dir=d))
    p = subprocess.run([sys.executable, "-c", CRASHER], cwd=run, capture_output=True, timeout=60, preexec_fn=lambda:
                       resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
    assert p.returncode == -signal.SIGSEGV
    (core,) = list(run.iterdir())
    base = Path(tempfile.mkdtemp(prefix="fsbx", dir="/tmp"))
    base.chmod(0o755)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with open(core, "rb") as f:
            h = subprocess.run([str(FORENSICS), "core-handler", str(base / "cores"), str(live.pid), str(live.pid),
                                "11", str(int(time.time())), "18446744073709551615", "--min-free", "0"],
                               stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
        assert h.returncode == 0, h.stderr
        (crash,) = (base / "cores" / "crashes").iterdir()
        yield crash
    finally:
        live.kill()
        live.wait()
        subprocess.run(["rm", "-rf", str(base)], check=False)


SERVE_ONE = r'''
import json, sys
from forensics.agent.serve import ServeConfig, analyze_crash
crash, core_dir, scratch, method = sys.argv[1:5]
cfg = ServeConfig(core_dir=core_dir, node="n", events=False, scratch=scratch,
                  analyze_argv=[sys.executable, "-m", "forensics", "analyze", "--json", "--native-method", method])
print(analyze_crash(crash, cfg))
'''


def _without_cache(doc: dict, cache: str) -> dict:
    """``doc`` with its cache entry unnamed: where the core was decompressed (each run's own cache; the entry's key
    names the compressed core's identity, whose ctime the agent's grant of it to the sandbox's group moved) and when
    (the decompressed file's mtime)."""
    text = re.sub(re.escape(cache.rstrip("/")) + r"/bundles/[0-9a-f]+/", "CACHE/", json.dumps(doc))
    out = json.loads(text)
    out["snapshot"]["core"].pop("mtime")
    return out


@pytest.mark.parametrize("method", ["libdw", "gdb"])
def test_an_analysis_in_the_sandbox_gives_the_same_json_as_without(crash_bundle, tmp_path, method):
    core_dir = crash_bundle.parent.parent
    # GIVEN the crash analyzed as root, without a sandbox
    home = tmp_path / "plain"
    plain = subprocess.run([str(FORENSICS), "analyze", "--json", "--native-method", method, str(crash_bundle)],
                           capture_output=True, text=True, timeout=300,
                           env={"PATH": os.environ["PATH"], "HOME": str(home)})
    assert plain.returncode in (0, 3, 4), plain.stderr
    # WHEN agent serve's own code analyzes it, in the sandbox (its scratch made reachable to the analyses' uid)
    scratch = tmp_path / "agent"
    p = subprocess.run([*searchable_view(bind=[str(core_dir)], homes=[str(scratch)]), sys.executable, "-c",
                        SERVE_ONE, str(crash_bundle), str(core_dir), str(scratch), method],
                       capture_output=True, text=True, timeout=300, env={"PATH": os.environ["PATH"],
                                                                         "HOME": str(scratch)})
    assert p.stdout.strip() == "done", (p.stdout, p.stderr, (crash_bundle / "60-analysis").iterdir())
    written = json.loads((crash_bundle / "60-analysis" / "analysis.json").read_text())
    for name in ("analysis.json", "attempts.json"):
        (crash_bundle / "60-analysis" / name).unlink()
    # THEN it ran confined, and found the same, but for where each run's cache lies
    assert written["agent"]["sandbox"]["uid"] == UID and written["agent"]["sandbox"]["seccomp"] == "filter"
    ours = json.loads(plain.stdout)
    cache = [s for s in json.dumps(written).split('"') if "/.cache/forensics/bundles/" in s]
    assert cache, "the analysis names its decompressed core"
    sandbox_cache = cache[0].split("/bundles/")[0]
    assert _without_cache(written["analysis"], sandbox_cache) == _without_cache(
        ours["analysis"], str(home / ".cache/forensics"))


def test_analyze_sandbox_gives_the_same_json_and_writes_only_its_output(crash_bundle, tmp_path):
    # GIVEN someone else's crash, analyzed as root without and with --sandbox (bubblewrap, then the same wrapper)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    plain = subprocess.run([str(FORENSICS), "analyze", "--json", str(crash_bundle)], capture_output=True, text=True,
                           timeout=300, env=env)
    out = tmp_path / "out.json"
    boxed = subprocess.run([str(FORENSICS), "analyze", "--sandbox", "--json", "-o", str(out), str(crash_bundle)],
                           capture_output=True, text=True, timeout=300, env=env)
    # THEN the same exit status and JSON, but for where each run's cache lies, written where -o says
    assert boxed.returncode == plain.returncode, boxed.stderr
    doc = json.loads(out.read_text())
    cache = next(s for s in json.dumps(doc).split('"') if "/.cache/forensics/bundles/" in s).split("/bundles/")[0]
    assert _without_cache(doc["analysis"], cache) == _without_cache(json.loads(plain.stdout)["analysis"],
                                                                    str(tmp_path / "home/.cache/forensics"))
    assert not (crash_bundle / "60-analysis").exists() or not list((crash_bundle / "60-analysis").iterdir())


def test_analyze_sandbox_without_bubblewrap_is_one_error_line(crash_bundle, tmp_path):
    # GIVEN a PATH without bwrap; THEN one error line, its hint, exit 1, and no analysis outside a sandbox
    path = tmp_path / "bin"
    path.mkdir()
    for tool in ("gdb", "sh"):
        (path / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    p = subprocess.run([str(FORENSICS), "analyze", "--sandbox", "--json", str(crash_bundle)], capture_output=True,
                       text=True, timeout=120, env={"PATH": str(path), "HOME": str(tmp_path)})
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("forensics: error: --sandbox: bubblewrap (bwrap) is not on PATH\nforensics: hint: ")



# -- wherever forensics is installed: its interpreter and its code, under /tmp, behind links ---------------------------

def _installed_under(base: Path) -> Path:
    """This run's forensics installed anew beneath ``base``, reached through links that lie outside every directory a
    sandbox binds of itself: a virtual environment whose interpreter is a link to a link (in a directory of its own)
    to this run's base interpreter, its site-packages reading this installation's (forensics and its dependencies);
    returned: its interpreter through a link to the environment's directory (as pyenv's and pipx's are reached)."""
    venv = base / "venv"
    base_python = os.path.realpath(sys._base_executable)  # type: ignore[attr-defined]
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   capture_output=True)
    (base / "links").mkdir()
    (base / "links" / "python").symlink_to(base_python)
    for exe in (venv / "bin").glob("python*"):
        exe.unlink()
    (venv / "bin" / "python").symlink_to(base / "links" / "python")
    (site,) = (venv / "lib").glob("python3*/site-packages")
    import site as this_site

    package_parent = str(Path(__import__("forensics").__file__).resolve().parents[1])
    (site / "this-installation.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in this_site.getsitepackages()) + package_parent + "\n")
    (base / "alias").symlink_to(venv)
    return base / "alias" / "bin" / "python"


def test_analyze_sandbox_runs_wherever_forensics_is_installed(crash_bundle, tmp_path):
    # GIVEN forensics installed under /tmp (which the sandbox's view replaces by a tmpfs of its own), its interpreter
    # reached through links in directories nothing else binds
    base = Path(tempfile.mkdtemp(prefix="fsbx-install-", dir="/tmp"))
    try:
        python = _installed_under(base)
        where = subprocess.run([str(python), "-c", "import sys, forensics; print(sys.prefix)"], capture_output=True,
                               text=True, timeout=60, cwd="/")
        assert where.stdout.strip() == str(base / "alias"), where.stderr
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
        plain = subprocess.run([str(FORENSICS), "analyze", "--json", str(crash_bundle)], capture_output=True,
                               text=True, timeout=300, env=env)
        # WHEN that installation analyzes the crash in the sandbox
        out = tmp_path / "out.json"
        boxed = subprocess.run([str(python), "-m", "forensics", "analyze", "--sandbox", "--json", "-o", str(out),
                                str(crash_bundle)], capture_output=True, text=True, timeout=300, env=env, cwd="/")
        # THEN it ran there and found what the analysis without a sandbox found, but for where its cache lies
        assert boxed.returncode == plain.returncode, boxed.stderr
        doc = json.loads(out.read_text())
        cache = next(s for s in json.dumps(doc).split('"') if "/.cache/forensics/bundles/" in s).split("/bundles/")[0]
        assert _without_cache(doc["analysis"], cache) == _without_cache(json.loads(plain.stdout)["analysis"],
                                                                        str(tmp_path / "home/.cache/forensics"))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


AGENT_STARTS = r'''
import sys
from forensics.agent.serve import Agent, ServeConfig
Agent(ServeConfig(core_dir=sys.argv[1], node="n", events=False, scratch=sys.argv[2], metrics_port=0))
'''


def test_agent_serve_says_at_start_when_its_analyses_cannot_reach_the_installation(tmp_path):
    # GIVEN forensics installed beneath a directory only root may search (as an install under /root is), its
    # dependencies, the base interpreter and the agent's directories reachable by any uid (a view of their own)
    base = Path(tempfile.mkdtemp(prefix="fsbx-install-", dir="/tmp"))
    dirs = Path(tempfile.mkdtemp(prefix="fsbx-agent-", dir="/tmp"))
    try:
        dirs.chmod(0o755)
        (dirs / "cores").mkdir()
        python = _installed_under(base)
        import site

        view = searchable_view(bind=[*(d for d in site.getsitepackages() if os.path.isdir(d)),
                                     str(Path(__import__("forensics").__file__).resolve().parents[1])])

        def start() -> str:
            p = subprocess.run([*view, str(python), "-c", AGENT_STARTS, str(dirs / "cores"), str(dirs / "scratch")],
                               capture_output=True, text=True, timeout=120, cwd="/")
            assert p.returncode == 0, p.stderr
            return p.stderr

        # WHEN agent serve starts from it; THEN one line names the directory, what it hides, and the way out
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        said = start()
        assert (f"forensics agent serve: the analyses' uid {UID} cannot search {base}, on the way to this "
                "installation (the analyses' interpreter, its code) ") in said, said
        assert "every analysis will fail (make it searchable: chmod o+x, or install forensics where every uid may " \
               "read it" in said
        # WHEN the directory is made searchable; THEN nothing is said
        base.chmod(0o755)
        assert start() == ""
    finally:
        subprocess.run(["rm", "-rf", str(base), str(dirs)], check=False)

# -- a debuginfod server for the agent: fetched beside the analysis, never by it -----------------------------------

@pytest.fixture(scope="module")
def stripped_bundle(tmp_path_factory, core_pattern):
    """A crash in a stripped library (its debug file kept apart), and the bundle the real handler makes of it: the
    library stored by build-id, as a live process of the same pod mapped it."""
    from tests.crashers.make_core import CoresUnavailable, build_stripped_libcrash, make_core

    d = tmp_path_factory.mktemp("sbx-debuginfod")
    stripped, debug = build_stripped_libcrash(d)
    try:
        core = make_core(d, sys.executable, "heap-prev", libcrash=stripped)
    except CoresUnavailable as e:
        pytest.skip(str(e))
    base = Path(tempfile.mkdtemp(prefix="fsbx", dir="/tmp"))
    base.chmod(0o755)
    live = subprocess.Popen([sys.executable, "-c", f"import ctypes, sys, time; ctypes.CDLL({str(stripped)!r}); "
                             "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "ready"
        with open(core, "rb") as f:
            h = subprocess.run([str(FORENSICS), "core-handler", str(base / "cores"), str(live.pid), str(live.pid),
                                "6", str(int(time.time())), "18446744073709551615", "--min-free", "0"],
                               stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
        assert h.returncode == 0, h.stderr
        (crash,) = (base / "cores" / "crashes").iterdir()
        out = subprocess.run(["readelf", "-n", str(stripped)], capture_output=True, text=True).stdout
        build_id = next(line.split(":", 1)[1].strip() for line in out.splitlines() if "Build ID" in line)
        yield crash, build_id, debug
    finally:
        live.kill()
        live.wait()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_debuginfod_server_is_asked_by_the_fetcher_beside_the_sandboxed_analysis(stripped_bundle, tmp_path):
    import http.server
    import threading

    crash, build_id, debug = stripped_bundle
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.append(self.path)
            if self.path != f"/buildid/{build_id}/debuginfo":
                self.send_response(404)
                self.end_headers()
                return
            data = debug.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scratch = tmp_path / "agent"
    try:
        # GIVEN the agent given a debuginfod server (DEBUGINFOD_URLS in its environment)
        env = {"PATH": os.environ["PATH"], "HOME": str(scratch),
               "DEBUGINFOD_URLS": f"http://127.0.0.1:{server.server_address[1]}"}
        # WHEN its own code analyzes the crash in the sandbox (no network there)
        p = subprocess.run([*searchable_view(bind=[str(crash.parent.parent)], homes=[str(scratch)]), sys.executable,
                            "-c", SERVE_ONE, str(crash), str(crash.parent.parent), str(scratch), "libdw"],
                           capture_output=True, text=True, timeout=300, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert p.stdout.strip() == "done", (p.stdout, p.stderr)
    doc = json.loads((crash / "60-analysis" / "analysis.json").read_text())
    # THEN the fetcher beside it asked the server for the stripped library's debug file, and the analysis named the
    # crashed frame's source line from it
    assert f"/buildid/{build_id}/debuginfo" in asked
    crashed = next(t for t in doc["analysis"]["snapshot"]["threads"] if t["is_crashed"])
    frame = next(f for f in crashed["native_frames"] if (f["symbol"] or "").startswith("forensics_heap"))
    assert frame["file"].endswith("libcrash.c") and frame["line"] > 0, frame
    assert doc["agent"]["sandbox"]["seccomp"] == "filter"
