"""The Python an image runs, and the sys.path CPython builds for it, worked out without running it.

:func:`command_line` turns Entrypoint/Cmd (or ``--entrypoint``, or a process's
cmdline) into argv, unwrapping ``sh -c``, ``env`` and init wrappers;
:func:`describe_command` finds the interpreter on the image's PATH (through
shebangs and symlinks, inside the root only) and reads its options;
:func:`compute_python_setup` builds sys.path the way CPython's getpath and
``site`` do: sys.path[0] (the working directory for ``-m``/``-c``, the script's
directory for a script, none under PYTHONSAFEPATH/-P/-I), PYTHONPATH, the
stdlib, site-packages (venv, user site, Debian's dist-packages) and ``.pth``
files, including the ``import`` lines whose effect can be read statically and the
finders that editable installs' import lines put on ``sys.meta_path``.
"""
from __future__ import annotations

import re
import shlex

from .finders import imported_module, parse_finder_module
from .model import EditableFinder, Entrypoint, ImageConfig, PathEntry, PathOrigin, PthFile, PythonSetup
from .rootfs import RootFS, join, norm

__all__ = [
    "DEFAULT_PATH",
    "command_line",
    "describe_command",
    "compute_python_setup",
    "parse_pth",
    "apply_pth_imports",
    "runtime_env",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what Docker/containerd set
_INIT_WRAPPERS = {"tini", "tini-static", "dumb-init", "catatonit", "docker-init"}
_SHELLS = {"sh", "bash", "dash", "ash", "zsh", "busybox"}
_PY_NAME = re.compile(r"^python(\d+(?:\.\d+)?)?[dmu]*$")
_FLAG_LETTERS = set("bBdEhiIOPqsSuvVxR")


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _dirname(path: str) -> str:
    d = path.rstrip("/").rsplit("/", 1)[0]
    return d or "/"


def command_line(config: ImageConfig, override: str | None = None) -> tuple[tuple[str, ...], dict[str, str], list[str]]:
    """argv the runtime executes, extra environment from ``env``/shell assignments, and notes.

    >>> command_line(ImageConfig(entrypoint=("/bin/sh", "-c", "exec env A=1 python3 -m x")))[:2]
    (('python3', '-m', 'x'), {'A': '1'})
    """
    notes: list[str] = []
    if override is not None:
        argv = shlex.split(override)
    else:
        argv = list(config.entrypoint) + list(config.cmd) if config.entrypoint else list(config.cmd)
    extra: dict[str, str] = {}
    for _ in range(8):
        if not argv:
            break
        base = _base(argv[0])
        if base in _INIT_WRAPPERS:
            argv = argv[1:]
            while argv and argv[0].startswith("-"):
                if argv.pop(0) == "--":
                    break
            notes.append(f"init wrapper {base} unwrapped")
        elif base == "env":
            argv = argv[1:]
            while argv and (argv[0].startswith("-") or "=" in argv[0]):
                a = argv.pop(0)
                if a in ("-i", "--ignore-environment", "-"):
                    notes.append("env -i clears the environment: the image's Env does not reach Python")
                    extra["\0clear"] = "1"
                elif a in ("-u", "--unset") and argv:
                    extra["\0unset:" + argv.pop(0)] = "1"
                elif "=" in a and not a.startswith("-"):
                    k, _, v = a.partition("=")
                    extra[k] = v
        elif base in _SHELLS and len(argv) >= 3 and argv[1].startswith("-") and argv[1].endswith("c"):
            script = argv[2]
            try:
                lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
                lexer.whitespace_split = True
                tokens = list(lexer)
            except ValueError:
                notes.append("shell command could not be parsed; analysed as written")
                break
            cut = next((i for i, t in enumerate(tokens) if t and set(t) <= set(";&|")), len(tokens))
            tokens = tokens[:cut]
            while tokens and (tokens[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0])):
                t = tokens.pop(0)
                if t != "exec":
                    k, _, v = t.partition("=")
                    extra[k] = v
            notes.append(f"shell form: analysed the first command of {script!r}")
            argv = tokens
        else:
            break
    return tuple(argv), extra, notes


def runtime_env(config: ImageConfig, extra: dict[str, str], home: str | None) -> dict[str, str]:
    """The environment the container's process gets: image Env, PATH and HOME defaults, wrapper assignments."""
    env = {} if extra.get("\0clear") else dict(config.env)
    if "\0clear" not in extra:
        env.setdefault("PATH", DEFAULT_PATH)
        env.setdefault("HOME", home or "/")
    for k, v in extra.items():
        if k.startswith("\0unset:"):
            env.pop(k[len("\0unset:"):], None)
        elif not k.startswith("\0"):
            env[k] = v
    return env


def _which(fs: RootFS, name: str, path_var: str, cwd: str) -> str | None:
    if "/" in name:
        p = join(cwd, name)
        return p if fs.is_file(p) else None
    for d in path_var.split(":"):
        p = join(cwd, (d or ".") + "/" + name)
        n = fs.stat(p)
        if n is not None and n.kind == "file" and n.mode & 0o111:
            return p
    return None


def _version_from_names(*names: str | None) -> str | None:
    for n in names:
        if not n:
            continue
        m = _PY_NAME.match(_base(n))
        if m and m.group(1) and "." in m.group(1):
            return m.group(1)
    return None


def _parse_python_args(args: list[str]) -> tuple[str, str | None, tuple[str, ...]]:
    """(mode, target, flags) from the interpreter's arguments."""
    flags: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return ("script", args[i + 1], tuple(flags)) if i + 1 < len(args) else ("interactive", None, tuple(flags))
        if a == "-":
            return "interactive", None, tuple(flags)
        if a.startswith("--"):
            if a == "--check-hash-based-pycs":
                i += 1
            i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            j = 1
            while j < len(a):
                ch = a[j]
                if ch in "mc":
                    rest = a[j + 1:] or (args[i + 1] if i + 1 < len(args) else None)
                    return ("module" if ch == "m" else "command"), rest, tuple(flags)
                if ch in "WX":
                    if j + 1 == len(a):
                        i += 1
                    break
                if ch == "O" or ch in _FLAG_LETTERS:
                    flags.append("-" + ch)
                j += 1
            i += 1
            continue
        return "script", a, tuple(flags)
    return "interactive", None, tuple(flags)


def describe_command(fs: RootFS, argv: tuple[str, ...], env: dict[str, str], workdir: str) -> tuple[Entrypoint, list[str]]:
    """Which interpreter runs, how (``-m``/script/``-c``) and with which options.

    When the command is not Python (or there is none), the analysis assumes
    ``python3 -c`` from the image's PATH: sys.path[0] is then the working
    directory, the case that shadows most.
    """
    notes: list[str] = []
    path_var = env.get("PATH", DEFAULT_PATH)
    exe = argv[0] if argv else None
    found = _which(fs, exe, path_var, workdir) if exe else None
    if found is not None:
        real = fs.resolve(found)
        if _PY_NAME.match(_base(found)) or (real and _PY_NAME.match(_base(real))):
            mode, target, flags = _parse_python_args(list(argv[1:]))
            return _entry(fs, argv, found, mode, target, flags, None), notes
        head = fs.read(real, 1 << 20) if real else None
        if head is not None and head.startswith(b"#!"):
            line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
            parts = line.split()
            if parts and _base(parts[0]) == "env":
                parts = [p for p in parts[1:] if not p.startswith("-")]
            if parts:
                interp = _which(fs, parts[0], path_var, workdir)
                if interp and (_PY_NAME.match(_base(parts[0])) or _PY_NAME.match(_base(fs.resolve(interp) or ""))):
                    _, _, flags = _parse_python_args(parts[1:])
                    return _entry(fs, argv, interp, "script", found, flags, found), notes
                if interp is None:
                    notes.append(f"{found}: interpreter {parts[0]!r} from its #! line is not in the image")
        notes.append(f"{exe!r} is not a Python interpreter or Python script; assuming `python3 -c` "
                     "(sys.path[0] = the working directory)")
    elif exe:
        notes.append(f"{exe!r} not found on the image's PATH ({path_var}); assuming `python3 -c`")
    else:
        notes.append("the image has no Entrypoint or Cmd; assuming `python3 -c`")
    for name in ("python3", "python"):
        interp = _which(fs, name, path_var, workdir)
        if interp:
            e = _entry(fs, argv, interp, "command", None, (), None)
            return Entrypoint(argv=e.argv, interpreter=e.interpreter, interpreter_real=e.interpreter_real,
                              version=e.version, mode="not-python", target=None, flags=()), notes
    notes.append("no python3 on the image's PATH")
    return Entrypoint(argv=tuple(argv), interpreter=None, interpreter_real=None, version=None,
                      mode="not-python", target=None), notes


def _entry(fs: RootFS, argv, interp: str, mode: str, target: str | None, flags, via) -> Entrypoint:
    real = fs.resolve(interp)
    version = _version_from_names(real, interp)
    if version is None and real:
        # python3 -> python3.11 chains: walk the links by hand to see every name
        p, seen = interp, 0
        while seen < 40:
            n = fs.lstat(fs.resolve(p, follow_last=False) or p)
            if n is None or n.kind != "symlink":
                break
            p = join(_dirname(p), n.target)
            version = _version_from_names(p)
            if version:
                break
            seen += 1
    if version is None and real:
        version = _landmark_version(fs, _dirname(real))
    return Entrypoint(argv=tuple(argv), interpreter=interp, interpreter_real=real, version=version, mode=mode,
                      target=target, flags=tuple(flags), via_shebang=via)


def _landmark_version(fs: RootFS, start: str) -> str | None:
    d = start
    while True:
        parent = _dirname(d)
        for lib in (parent.rstrip("/") + "/lib",):
            versions = [n[6:] for n in fs.listdir(lib) if re.match(r"^python3\.\d+$", n)
                        and fs.exists(f"{lib}/{n}/os.py")]
            if len(versions) == 1:
                return versions[0]
        if d == "/":
            return None
        d = parent


def _find_prefix(fs: RootFS, exe_dir: str, version: str) -> str | None:
    """CPython's landmark search: the first ancestor ``P`` of the executable's directory with lib/pythonX.Y/os.py."""
    d = exe_dir
    while True:
        parent = _dirname(d)
        for landmark in ("os.py", "os.pyc"):
            if fs.is_file(f"{parent.rstrip('/')}/lib/python{version}/{landmark}"):
                return parent
        if d == "/":
            return None
        d = parent


def _read_pyvenv(fs: RootFS, interp: str) -> tuple[str, dict[str, str]] | None:
    for d in (_dirname(interp), _dirname(_dirname(interp))):
        text = fs.read_text(d.rstrip("/") + "/pyvenv.cfg", 1 << 16)
        if text is not None:
            cfg = {}
            for line in text.splitlines():
                k, sep, v = line.partition("=")
                if sep:
                    cfg[k.strip().lower()] = v.strip()
            return d, cfg
    return None


def parse_pth(text: str, sitedir: str) -> tuple[list[str], list[str], list[tuple[int, str]]]:
    """A .pth file's path lines (made absolute against ``sitedir``) and import lines, in file order.

    Returns (paths, import lines, ordered ops) where ops are ``(0, path)`` / ``(1, import line)``.

    >>> parse_pth("# c\\n../legacy\\nimport sys; sys.path.insert(0, '/opt/x')\\n", "/s/site-packages")[:2]
    (['/s/legacy'], ["import sys; sys.path.insert(0, '/opt/x')"])
    """
    paths, imports, ops = [], [], []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith(("import ", "import\t")):
            imports.append(line.rstrip())
            ops.append((1, line.rstrip()))
            continue
        p = join(sitedir, line.rstrip())
        paths.append(p)
        ops.append((0, p))
    return paths, imports, ops


_INSERT_RE = re.compile(r"sys\.path\.insert\(\s*(-?\d+)\s*,\s*(?:r?)(['\"])(.*?)\2\s*\)")
_APPEND_RE = re.compile(r"sys\.path\.append\(\s*(?:r?)(['\"])(.*?)\1\s*\)")


def apply_pth_imports(line: str, path: list[str], state: dict) -> bool:
    """Apply an ``import`` line of a .pth file to ``path`` if its effect is readable; False if it is not.

    Understood: ``sys.path.insert(N, 'literal')``, ``sys.path.append('literal')``, and setuptools'
    easy-install idiom (``sys.__plen`` / ``sys.__egginsert``) that moves eggs to the front.
    Lines that do not mention sys.path are taken to leave it alone.
    """
    handled = False
    if "sys.__plen" in line and "len(sys.path)" in line and "__egginsert" not in line:
        state["plen"] = len(path)
        handled = True
    if "__egginsert" in line and "sys.__plen" in line:
        plen = state.get("plen", len(path))
        new = path[plen:]
        del path[plen:]
        p = state.get("egginsert", 0)
        path[p:p] = new
        state["egginsert"] = p + len(new)
        handled = True
    for m in _INSERT_RE.finditer(line):
        idx = int(m.group(1))
        path.insert(idx if idx >= 0 else len(path) + idx, norm(m.group(3)) if m.group(3).startswith("/") else m.group(3))
        handled = True
    for m in _APPEND_RE.finditer(line):
        path.append(norm(m.group(2)) if m.group(2).startswith("/") else m.group(2))
        handled = True
    if handled:
        return True
    return "sys.path" not in line and "__plen" not in line


def _truthy(v: str | None) -> bool:
    return bool(v)


def compute_python_setup(fs: RootFS, entry: Entrypoint, env: dict[str, str], workdir: str,
                         *, arch_triplet: str = "x86_64-linux-gnu") -> PythonSetup:
    """sys.path for ``entry`` as CPython would build it in this root, with where each entry comes from."""
    notes: list[str] = []
    version = entry.version
    flags = set(entry.flags)
    isolated = "-I" in flags
    ignore_env = isolated or "-E" in flags
    env_ = {} if ignore_env else env
    if entry.interpreter is None or version is None:
        return PythonSetup(entrypoint=entry, prefix=None, working_dir=workdir, safe_path=False, sys_path=(),
                           notes=("no Python interpreter found in the image",))
    minor = tuple(int(x) for x in version.split("."))
    safe_path = isolated or "-P" in flags or _truthy(env_.get("PYTHONSAFEPATH"))
    if safe_path and minor < (3, 11):
        if "-P" in flags or (_truthy(env_.get("PYTHONSAFEPATH")) and not isolated):
            notes.append(f"PYTHONSAFEPATH/-P has no effect on Python {version} (added in 3.11): "
                         "sys.path[0] is still set")
        safe_path = isolated
    no_user_site = isolated or "-s" in flags or _truthy(env_.get("PYTHONNOUSERSITE"))
    no_site = "-S" in flags

    venv = _read_pyvenv(fs, entry.interpreter)
    base_exe_dir = _dirname(entry.interpreter_real or entry.interpreter)
    if venv is not None:
        venv_dir, cfg = venv
        home = cfg.get("home")
        if home:
            base_exe_dir = _dirname(fs.resolve(join(home, _base(entry.interpreter))) or (home.rstrip("/") + "/x"))
        notes.append(f"virtual environment {venv_dir} (home = {home})")
    pythonhome = env_.get("PYTHONHOME")
    if pythonhome:
        prefix = norm(pythonhome.split(":")[0])
        exec_prefix = norm(pythonhome.split(":")[1]) if ":" in pythonhome else prefix
        notes.append(f"PYTHONHOME={pythonhome} sets the prefix")
    else:
        prefix = _find_prefix(fs, base_exe_dir, version)
        if prefix is None:
            notes.append(f"no lib/python{version}/os.py above {base_exe_dir}: the standard library was not found")
            prefix = _dirname(base_exe_dir)
        exec_prefix = prefix

    entries: list[tuple[str, PathOrigin, str]] = []
    if not ignore_env and env.get("PYTHONPATH") is not None and env.get("PYTHONPATH") != "":
        for p in env["PYTHONPATH"].split(":"):
            if p == "":
                entries.append((workdir, PathOrigin.PYTHONPATH,
                                "empty PYTHONPATH entry: the working directory (even under PYTHONSAFEPATH)"))
            else:
                entries.append((join(workdir, p), PathOrigin.PYTHONPATH, ""))
    ver_nodot = version.replace(".", "")
    lib = f"{prefix.rstrip('/')}/lib"
    entries.append((f"{lib}/python{ver_nodot}.zip", PathOrigin.STDLIB, ""))
    entries.append((f"{lib}/python{version}", PathOrigin.STDLIB, ""))
    entries.append((f"{exec_prefix.rstrip('/')}/lib/python{version}/lib-dynload", PathOrigin.STDLIB, ""))

    path = [e[0] for e in entries]
    origins = {e[0]: (e[1], e[2]) for e in entries}
    pths: list[PthFile] = []
    finders: list[EditableFinder] = []
    if not no_site:
        site_dirs: list[tuple[str, PathOrigin]] = []
        prefixes: list[str] = []
        user_enabled = not no_user_site
        if venv is not None:
            prefixes = [venv[0]]
            if venv[1].get("include-system-site-packages", "false").lower() == "true":
                prefixes.append(prefix)
            else:
                user_enabled = False
        else:
            prefixes = [prefix] if exec_prefix == prefix else [prefix, exec_prefix]
        if user_enabled:
            base = env_.get("PYTHONUSERBASE") or (env.get("HOME", "/").rstrip("/") + "/.local")
            usite = f"{norm(base)}/lib/python{version}/site-packages"
            if fs.is_dir(usite):
                site_dirs.append((usite, PathOrigin.USER_SITE))
        for pre in prefixes:
            pre = pre.rstrip("/") or ""
            debian = pre == "/usr" and fs.is_dir("/usr/lib/python3/dist-packages") and venv is None
            if debian:
                cands = [f"/usr/local/lib/python{version}/dist-packages", "/usr/lib/python3/dist-packages",
                         f"/usr/lib/python{version}/dist-packages"]
            else:
                cands = [f"{pre}/lib/python{version}/site-packages"]
                lib64 = f"{pre}/lib64/python{version}/site-packages"
                # platlibdir=lib64 builds (Fedora) search lib64 first; a venv's lib64 -> lib link is the same dir
                if fs.is_dir(lib64) and fs.resolve(lib64) != fs.resolve(cands[0]):
                    cands.insert(0, lib64)
            for c in cands:
                if fs.is_dir(c) and all(c != s for s, _ in site_dirs):
                    site_dirs.append((c, PathOrigin.SITE))
        state: dict = {}
        for sitedir, origin in site_dirs:
            if sitedir not in path:
                path.append(sitedir)
                origins[sitedir] = (origin, "")
            for name in fs.listdir(sitedir):
                if not name.endswith(".pth") or name.startswith("."):
                    continue
                pth_path = f"{sitedir}/{name}"
                text = fs.read_text(pth_path, 1 << 20)
                if text is None:
                    notes.append(f"{pth_path}: could not be read")
                    continue
                added, imports, ops = parse_pth(text, sitedir)
                kept, unevaluated = [], []
                for kind, item in ops:
                    if kind == 0:
                        if item not in path and fs.exists(item):
                            path.append(item)
                            origins[item] = (PathOrigin.PTH, pth_path)
                            kept.append(item)
                    else:
                        before = list(path)
                        if not apply_pth_imports(item, path, state):
                            unevaluated.append(item)
                        finder = _editable_finder(fs, sitedir, pth_path, item)
                        if finder is not None:
                            finders.append(finder)
                            if finder.path_placeholder and finder.path_placeholder not in path:
                                path.append(finder.path_placeholder)
                        for p in path:
                            if p not in before and p not in origins:
                                origins[p] = (PathOrigin.PTH_IMPORT, pth_path)
                if unevaluated:
                    notes.append(f"{pth_path}: import line(s) with effects on sys.path not evaluated statically "
                                 f"({len(unevaluated)}); --execute gives the ground truth")
                pths.append(PthFile(path=pth_path, paths=tuple(kept), imports=tuple(imports),
                                    unevaluated=tuple(unevaluated)))
    # sys.path[0] is inserted after site ran (pymain_run_python)
    if not safe_path:
        if entry.mode == "script" and entry.target:
            script = join(workdir, entry.target)
            real = fs.resolve(script) or script
            p0 = _dirname(real)
            path.insert(0, p0)
            origins.setdefault(p0, (PathOrigin.SCRIPT_DIR, f"directory of {real}"))
            first_origin = (PathOrigin.SCRIPT_DIR, f"directory of {real}")
        else:
            path.insert(0, workdir)
            how = {"module": "-m", "command": "-c", "interactive": "interactive/stdin",
                   "not-python": "assumed -c"}.get(entry.mode, entry.mode)
            first_origin = (PathOrigin.WORKDIR, f"working directory ({how})")
    out: list[PathEntry] = []
    for i, p in enumerate(path):
        origin, note = (first_origin if (i == 0 and not safe_path) else origins.get(p, (PathOrigin.PTH_IMPORT, "")))
        out.append(PathEntry(path=p, origin=origin, exists=fs.exists(p), note=note))
    return PythonSetup(entrypoint=entry, prefix=prefix, working_dir=workdir, safe_path=safe_path,
                       sys_path=tuple(out), pth_files=tuple(pths), notes=tuple(notes), finders=tuple(finders))


def _editable_finder(fs: RootFS, sitedir: str, pth_path: str, line: str) -> EditableFinder | None:
    """The meta-path finder a .pth import line installs (an editable install), read from its module."""
    module = imported_module(line)
    if module is None:
        return None
    module_file = f"{sitedir}/{module}.py"
    source = fs.read_text(module_file, 1 << 20)
    if source is None:
        return None
    finder = parse_finder_module(source, pth=pth_path, module_file=module_file)
    if finder is None or (finder.style == "setuptools" and f"{module}.install()" not in line):
        return None
    return finder
