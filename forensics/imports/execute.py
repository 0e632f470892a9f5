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
from ..subproc import OutputTooLarge, run_bounded
from .model import ExecutedModule, ExecuteResult, ModuleCheck, PythonSetup
from .rootfs import RootFS, norm

__all__ = ["PROBE", "StartupFailed", "run_probe_bwrap", "run_probe_nsenter", "compare", "startup_result"]

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


def _run(cmd: list[str], env: dict[str, str] | None, timeout: float, sandbox: str = "") -> dict:
    try:  # bounded: the image's own code runs in the probe and writes what it likes
        p = run_bounded(cmd, timeout=timeout, env=env, max_stdout=PROBE_MAX_OUTPUT)
    except subprocess.TimeoutExpired as e:
        raise ExecuteError("probe", f"timed out after {timeout:g}s",
                           hint="The image's interpreter did not finish importing the modules in time "
                                "(an import that blocks or loops at start-up); the static verdicts stand.") from e
    except OutputTooLarge as e:
        raise ExecuteError("probe", f"the image's interpreter wrote more than {PROBE_MAX_OUTPUT >> 20} MiB (stopped)",
                           hint="Code that runs at start-up in the image floods its output; the static verdicts "
                                "stand.") from e
    except OSError as e:
        raise ExecuteError(cmd[0], e.strerror or str(e)) from e
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(_MARK):
            return _clean_probe(line[len(_MARK):])
    tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-3:]
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


class StartupFailed(ExecuteError):
    """The image's interpreter ran and died before the probe's first line: the container would too."""

    def __init__(self, detail: str, returncode: int) -> None:
        super().__init__("the image's interpreter", f"failed at start-up (exit status {returncode}): {detail}",
                         hint="The image's own interpreter fails before running any code (its message is above); "
                              "the container's command fails the same way. Fix the image; the static verdicts "
                              "say what it would import once it starts.")
        self.returncode = returncode
        self.stderr_tail = detail
        self.command: list[str] = []  # the sandbox's command line, set by whoever ran it


_SANDBOX_FAILS = ("bwrap:", "nsenter:")


def run_probe_bwrap(root: str, setup: PythonSetup, env: dict[str, str], uid: int, gid: int, names: list[str],
                    *, timeout: float = 120.0) -> tuple[dict, list[str], list[str]]:
    """Run the probe in a bubblewrap sandbox over ``root``; returns (probe output, command, notes)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ExecuteError("bubblewrap", "bwrap is not on PATH (Debian/Ubuntu: apt-get install -y bubblewrap)")
    if len(setup.working_dir.encode("utf-8", "surrogateescape")) > 4095:
        raise ExecuteError("workdir", f"{setup.working_dir[:80]}...: longer than PATH_MAX (4096 bytes)",
                           hint="No runtime can enter this working directory; fix the image's WorkingDir.")
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
    interpreter = setup.entrypoint.interpreter
    if interpreter is None:
        raise ExecuteError("interpreter", "no Python interpreter in the image to run")
    cmd += ["--uid", str(uid), "--gid", str(gid), "--", interpreter, *_probe_args(setup, names)]
    try:
        return _run(cmd, None, timeout, "bubblewrap"), cmd, notes
    except StartupFailed as e:
        e.command = cmd
        raise


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
    return _run(cmd, dict(env), timeout, "nsenter"), cmd, []


def compare(fs: RootFS, setup: PythonSetup, checks: tuple[ModuleCheck, ...], probe: dict, method: str,
            command: list[str], notes: list[str], env: dict[str, str] | None = None) -> ExecuteResult:
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
    difference = _explain(setup, mods, run_path, probe, env)
    return ExecuteResult(method=method, command=tuple(command[:-3] + ["<probe>", command[-2], command[-1]]),
                         sys_path=tuple(run_path), modules=tuple(mods), sys_path_agrees=path_agrees,
                         notes=tuple(notes), difference=difference)


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
