"""Ground truth for ``--execute``: run the image's own interpreter as the runtime would and ask it.

Images: bubblewrap over the unpacked root (read-only), new user/pid/net/ipc/uts
namespaces (no network), the image's WorkingDir, Env and User.  Processes:
``nsenter`` into the process's mount namespace with its root, cwd, uid/gid and
environment.  The interpreter runs with the command's own options and ``-c``
and a probe printing, for each module, the file it imports and its
``__version__``; for a script the probe puts the script's directory first, as
CPython does for ``python script.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

from ..errors import ExecuteError
from .model import ExecutedModule, ExecuteResult, ModuleCheck, PythonSetup
from .rootfs import RootFS, norm

__all__ = ["PROBE", "run_probe_bwrap", "run_probe_nsenter", "compare"]

_MARK = "FORENSICS-PROBE "
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
    out["modules"][n] = r
sys.stdout.write("\n" + "FORENSICS-PROBE " + json.dumps(out) + "\n")
sys.stdout.flush()
"""


def _probe_args(setup: PythonSetup, names: list[str]) -> list[str]:
    entry = setup.entrypoint
    script_dir = ""
    if entry.mode == "script" and not setup.safe_path and setup.sys_path:
        script_dir = setup.sys_path[0].path
    return [*entry.flags, "-c", PROBE, json.dumps(names), script_dir]


def _run(cmd: list[str], env: dict[str, str] | None, timeout: float) -> dict:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise ExecuteError("probe", f"timed out after {timeout:g}s") from e
    except OSError as e:
        raise ExecuteError(cmd[0], e.strerror or str(e)) from e
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-3:]
    raise ExecuteError("probe", " | ".join(tail))


def run_probe_bwrap(root: str, setup: PythonSetup, env: dict[str, str], uid: int, gid: int, names: list[str],
                    *, timeout: float = 120.0) -> tuple[dict, list[str], list[str]]:
    """Run the probe in a bubblewrap sandbox over ``root``; returns (probe output, command, notes)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ExecuteError("bubblewrap", "bwrap is not on PATH (Debian/Ubuntu: apt-get install -y bubblewrap)")
    notes = []
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
           "--ro-bind", root, "/"]
    for mnt, opt in (("/proc", "--proc"), ("/dev", "--dev"), ("/tmp", "--tmpfs")):
        if not os.path.isdir(root + mnt) or os.path.islink(root + mnt):
            notes.append(f"{mnt} absent in the image: not mounted in the sandbox")
        elif mnt == "/tmp" and os.listdir(root + mnt):
            # a runtime shows the image's /tmp as it is (code can live there): keep it, read-only
            notes.append("/tmp holds files in the image: kept as it is (read-only), not replaced by a tmpfs")
        else:
            cmd += [opt, mnt]
    cmd += ["--chdir", setup.working_dir, "--clearenv"]
    for k, v in sorted(env.items()):
        cmd += ["--setenv", k, v]
    cmd += ["--uid", str(uid), "--gid", str(gid), "--", setup.entrypoint.interpreter, *_probe_args(setup, names)]
    return _run(cmd, None, timeout), cmd, notes


def run_probe_nsenter(pid: int, interpreter: str, setup: PythonSetup, env: dict[str, str], uid: int, gid: int,
                      names: list[str], *, timeout: float = 120.0) -> tuple[dict, list[str], list[str]]:
    """Run the probe inside process ``pid``'s mount namespace, root and cwd, as its uid/gid, with its environment."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise ExecuteError("nsenter", "nsenter is not on PATH (util-linux)")
    if os.geteuid() != 0:
        raise ExecuteError("nsenter", "entering another process's namespaces needs root")
    cmd = [nsenter, "-t", str(pid), "-m", "-r", "-w", "-S", str(uid), "-G", str(gid), "--",
           interpreter, *_probe_args(setup, names)]
    return _run(cmd, dict(env), timeout), cmd, []


def compare(fs: RootFS, setup: PythonSetup, checks: tuple[ModuleCheck, ...], probe: dict, method: str,
            command: list[str], notes: list[str]) -> ExecuteResult:
    """Does the interpreter agree with the static answer, module by module and on sys.path?"""

    def same(a: str | None, b: str | None) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return (fs.resolve(norm(a)) or norm(a)) == (fs.resolve(norm(b)) or norm(b))

    mods = []
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
        mods.append(ExecutedModule(module=c.module, file=run_file, version=version, error=err, agrees=agrees,
                                   static_file=static_file, static_version=c.static_version))
    static_path = [e.path for e in setup.sys_path]
    run_path = [norm(p) for p in probe.get("sys_path", [])]
    path_agrees = [norm(p) for p in static_path] == run_path
    if not path_agrees:
        missing = [p for p in run_path if p not in map(norm, static_path)]
        extra = [p for p in map(norm, static_path) if p not in run_path]
        notes = notes + [f"sys.path differs: interpreter has {missing or 'nothing more'}, "
                         f"static analysis has {extra or 'nothing more'} (order may differ)"]
    return ExecuteResult(method=method, command=tuple(command[:-3] + ["<probe>", command[-2], command[-1]]),
                         sys_path=tuple(run_path), modules=tuple(mods), sys_path_agrees=path_agrees,
                         notes=tuple(notes))
