"""sys.path as CPython builds it for one command in one root, stage by stage, without running anything.

The stages are CPython's own, in its order (``Modules/getpath.py``, ``Lib/site.py``,
``Modules/main.c``); :func:`compute_python_setup` runs them:

1. :func:`find_prefixes` -- getpath: a venv's ``pyvenv.cfg`` and ``home``, PYTHONHOME, the
   standard library's landmark above the executable
2. :func:`base_path` -- getpath: PYTHONPATH, the stdlib zip, the stdlib, ``lib-dynload``
3. :func:`site_directories` -- ``site.main``: the venv's site directories, the user's, the
   system's, in the layout of the interpreter's own ``site.py``: upstream
   (``lib/pythonX.Y/site-packages``) or Debian's (``/usr/local/lib/pythonX.Y/dist-packages``,
   ``/usr/lib/python3/dist-packages``; in a venv also the venv's and the base's
   ``site-packages``)
4. :func:`add_site_dir` -- ``site.addsitedir``: each directory, then its ``.pth`` files (path
   lines, ``import`` lines read statically, the finders editable installs put on ``sys.meta_path``)
5. :func:`apply_customize` -- ``site.execsitecustomize`` / ``execusercustomize``: literal sys.path
   edits in ``sitecustomize.py`` / ``usercustomize.py`` (:mod:`forensics.imports.customize`)
6. :func:`insert_path0` -- ``pymain_run_python``: sys.path[0] (the working directory for ``-m``,
   ``-c`` and the REPL, the script's directory for a script, none under -P/-I/PYTHONSAFEPATH)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .customize import builtin_or_stdlib, evaluate_customize
from .finders import imported_module, parse_finder_module
from .model import (CustomizeFile, EditableFinder, Entrypoint, FindingKind, ModuleKind, PathEntry, PathOrigin,
                    PthFile, PythonSetup, ReportFinding, Resolution)
from .pysource import parse_source
from .resolve import find_module
from .rootfs import RootFS, join, norm

__all__ = [
    "Prefixes",
    "compute_python_setup",
    "find_prefixes",
    "base_path",
    "site_layout",
    "site_directories",
    "add_site_dir",
    "apply_customize",
    "insert_path0",
    "parse_pth",
    "apply_pth_imports",
]

_MAX_PTH = 1 << 20
_UTF8_CHARSETS = {"utf-8", "utf8"}


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _dirname(path: str) -> str:
    d = path.rstrip("/").rsplit("/", 1)[0]
    return d or "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefixes:
    """Stage 1: where the interpreter's installation is (sys.base_prefix) and the venv (sys.prefix)."""

    prefix: str  # the base installation: its lib/pythonX.Y is the standard library
    exec_prefix: str
    venv: str | None = None  # the venv directory (pyvenv.cfg), sys.prefix once site ran
    system_site: bool = True  # pyvenv.cfg include-system-site-packages (true outside a venv)
    stdlib_found: bool = True


@dataclass
class _Builder:
    """sys.path under construction, with where each entry comes from."""

    path: list[str] = field(default_factory=list)
    origins: dict[str, tuple[PathOrigin, str]] = field(default_factory=dict)
    pths: list[PthFile] = field(default_factory=list)
    finders: list[EditableFinder] = field(default_factory=list)
    customize: list[CustomizeFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    findings: list[ReportFinding] = field(default_factory=list)
    egg_state: dict = field(default_factory=dict)

    def add(self, p: str, origin: PathOrigin, note: str = "") -> None:
        self.path.append(p)
        self.origins.setdefault(p, (origin, note))

    def entries(self, fs: RootFS) -> tuple[PathEntry, ...]:
        return tuple(PathEntry(path=p, origin=self.origins.get(p, (PathOrigin.PTH_IMPORT, ""))[0], exists=fs.exists(p))
                     for p in self.path)


# -- stage 1 ---------------------------------------------------------------------------------------

def _find_landmark(fs: RootFS, exe_dir: str, version: str) -> str | None:
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


def find_prefixes(fs: RootFS, entry: Entrypoint, env: dict[str, str], notes: list[str]) -> Prefixes:
    """Stage 1 (getpath): the venv, PYTHONHOME, or the landmark search from the executable's directory."""
    version = entry.version or ""
    assert entry.interpreter is not None
    venv = _read_pyvenv(fs, entry.interpreter)
    base_exe_dir = _dirname(entry.interpreter_real or entry.interpreter)
    venv_dir, system_site = None, True
    if venv is not None:
        venv_dir, cfg = venv
        home = cfg.get("home")
        if home:
            base_exe_dir = _dirname(fs.resolve(join(home, _base(entry.interpreter))) or (home.rstrip("/") + "/x"))
        # site.venv(): anything but "true" (any case) means no system site packages
        system_site = cfg.get("include-system-site-packages", "false").lower() == "true"
        notes.append(f"virtual environment {venv_dir} (home = {home}"
                     + (", system site packages included)" if system_site else ")"))
    pythonhome = env.get("PYTHONHOME")
    if pythonhome:
        prefix = norm(pythonhome.split(":")[0])
        exec_prefix = norm(pythonhome.split(":")[1]) if ":" in pythonhome else prefix
        notes.append(f"PYTHONHOME={pythonhome} sets the prefix")
        return Prefixes(prefix=prefix, exec_prefix=exec_prefix, venv=venv_dir, system_site=system_site)
    landmark = _find_landmark(fs, base_exe_dir, version)
    found = landmark is not None
    if landmark is None:
        notes.append(f"no lib/python{version}/os.py above {base_exe_dir}: the standard library was not found")
    prefix = landmark if landmark is not None else _dirname(base_exe_dir)
    return Prefixes(prefix=prefix, exec_prefix=prefix, venv=venv_dir, system_site=system_site, stdlib_found=found)


# -- stage 2 ---------------------------------------------------------------------------------------

def base_path(b: _Builder, pre: Prefixes, version: str, env: dict[str, str], workdir: str) -> None:
    """Stage 2 (getpath): PYTHONPATH (an empty entry is the working directory), then the standard library."""
    pythonpath = env.get("PYTHONPATH")
    if pythonpath:
        for p in pythonpath.split(":"):
            if p == "":
                b.add(workdir, PathOrigin.PYTHONPATH, "empty PYTHONPATH entry: the working directory "
                                                      "(even under PYTHONSAFEPATH)")
            else:
                b.add(join(workdir, p), PathOrigin.PYTHONPATH)
    lib = f"{pre.prefix.rstrip('/')}/lib"
    b.add(f"{lib}/python{version.replace('.', '')}.zip", PathOrigin.STDLIB)
    b.add(f"{lib}/python{version}", PathOrigin.STDLIB)
    b.add(f"{pre.exec_prefix.rstrip('/')}/lib/python{version}/lib-dynload", PathOrigin.STDLIB)


# -- stage 3 ---------------------------------------------------------------------------------------

def site_layout(fs: RootFS, pre: Prefixes, version: str) -> str:
    """``debian`` when the interpreter's own site.py searches dist-packages (Debian, Ubuntu), else ``upstream``.

    Read from the standard library's site.py itself: a CPython built from source in /usr/local
    on a Debian base (the official python image) has upstream's site.py and no dist-packages.
    """
    text = fs.read_text(f"{pre.prefix.rstrip('/')}/lib/python{version}/site.py", 1 << 20)
    if text and '"dist-packages"' in text and "local/lib" in text:
        return "debian"
    return "upstream"


def _prefix_site_dirs(fs: RootFS, prefix: str, version: str, layout: str, in_venv: bool) -> list[str]:
    """``site.getsitepackages([prefix])`` of the interpreter's site.py."""
    pre = prefix.rstrip("/")
    if layout == "debian":
        out = [f"{pre}/lib/python{version}/site-packages"] if in_venv else []
        return out + [f"{pre}/local/lib/python{version}/dist-packages", f"{pre}/lib/python3/dist-packages",
                      f"{pre}/lib/python{version}/dist-packages"]
    out = [f"{pre}/lib/python{version}/site-packages"]
    lib64 = f"{pre}/lib64/python{version}/site-packages"
    # platlibdir=lib64 builds (Fedora) search lib64 first; a venv's lib64 -> lib link is the same directory
    if fs.is_dir(lib64) and fs.resolve(lib64) != fs.resolve(out[0]):
        out.insert(0, lib64)
    return out


def site_directories(fs: RootFS, pre: Prefixes, version: str, layout: str, env: dict[str, str],
                     user_enabled: bool) -> tuple[list[tuple[str, PathOrigin]], bool]:
    """Stage 3 (site.main): the site directories in the order site adds them, and whether
    usercustomize runs (ENABLE_USER_SITE).  Only existing directories are added, as site does."""
    dirs: list[tuple[str, PathOrigin]] = []
    prefixes: list[str] = []
    if pre.venv is not None:
        # site.venv(): the venv's own directories first, before the user's
        dirs += [(d, PathOrigin.SITE) for d in _prefix_site_dirs(fs, pre.venv, version, layout, True)]
        if pre.system_site:
            prefixes = [pre.prefix] if pre.exec_prefix == pre.prefix else [pre.prefix, pre.exec_prefix]
        else:
            user_enabled = False
    else:
        prefixes = [pre.prefix] if pre.exec_prefix == pre.prefix else [pre.prefix, pre.exec_prefix]
    if user_enabled:
        base = env.get("PYTHONUSERBASE") or (env.get("HOME", "/").rstrip("/") + "/.local")
        dirs.append((f"{norm(base)}/lib/python{version}/site-packages", PathOrigin.USER_SITE))
    for p in prefixes:
        dirs += [(d, PathOrigin.SITE) for d in _prefix_site_dirs(fs, p, version, layout, pre.venv is not None)]
    out, seen = [], set()
    for d, origin in dirs:
        if d not in seen and fs.is_dir(d):
            seen.add(d)
            out.append((d, origin))
    return out, user_enabled


# -- stage 4 ---------------------------------------------------------------------------------------

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
        path.insert(idx if idx >= 0 else len(path) + idx,
                    norm(m.group(3)) if m.group(3).startswith("/") else m.group(3))
        handled = True
    for m in _APPEND_RE.finditer(line):
        path.append(norm(m.group(2)) if m.group(2).startswith("/") else m.group(2))
        handled = True
    if handled:
        return True
    return "sys.path" not in line and "__plen" not in line


def _locale_charset(env: dict[str, str]) -> str | None:
    """The charset the container's locale names (LC_ALL, LC_CTYPE, LANG), None for C/POSIX/unset."""
    for k in ("LC_ALL", "LC_CTYPE", "LANG"):
        v = env.get(k)
        if v:
            return v.partition(".")[2].partition("@")[0].lower() or None
    return None


def _decode_pth(data: bytes, pth_path: str, version: str, env: dict[str, str], b: _Builder) -> str | None:
    """The text site reads from a .pth file, or None (with a finding) when site cannot read it."""
    minor = tuple(int(x) for x in version.split("."))
    try:
        # 3.13+ reads utf-8-sig; before, the locale's encoding, UTF-8 under a UTF-8 or C locale (UTF-8 mode)
        return data.decode("utf-8-sig" if minor >= (3, 13) else "utf-8")
    except UnicodeDecodeError as e:
        charset = _locale_charset(env)
        if charset and charset.replace("_", "-") not in _UTF8_CHARSETS:
            b.findings.append(ReportFinding(
                kind=FindingKind.UNCERTAIN, source=pth_path,
                summary=f"{pth_path} is not UTF-8; site decodes it with the locale's charset {charset!r}: not read"))
            return None
        b.findings.append(ReportFinding(
            kind=FindingKind.STARTUP_FAILS, source=pth_path,
            summary=(f"{pth_path} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}): Python "
                     f"{version} stops at start-up (\"Fatal Python error: init_import_site\") before running anything"),
            fix=f"re-encode {pth_path} as UTF-8, or remove it"))
        return None


def add_site_dir(fs: RootFS, b: _Builder, sitedir: str, origin: PathOrigin, version: str,
                 env: dict[str, str], note: str = "") -> None:
    """Stage 4 (site.addsitedir): the directory, then its .pth files in name order."""
    if sitedir not in b.path:
        b.add(sitedir, origin, note)
    for name in fs.listdir(sitedir):
        if not name.endswith(".pth") or name.startswith("."):
            continue
        pth_path = f"{sitedir}/{name}"
        data = fs.read(pth_path, _MAX_PTH)
        if data is None:
            b.notes.append(f"{pth_path}: could not be read")
            continue
        text = _decode_pth(data, pth_path, version, env, b)
        if text is None:
            continue
        added, imports, ops = parse_pth(text, sitedir)
        kept, unevaluated = [], []
        for kind, item in ops:
            if kind == 0:
                if item not in b.path and fs.exists(item):
                    b.add(item, PathOrigin.PTH, pth_path)
                    kept.append(item)
                continue
            before = list(b.path)
            if not apply_pth_imports(item, b.path, b.egg_state):
                unevaluated.append(item)
            finder = _editable_finder(fs, sitedir, pth_path, item)
            if finder is not None:
                b.finders.append(finder)
                if finder.path_placeholder and finder.path_placeholder not in b.path:
                    b.path.append(finder.path_placeholder)
            for p in b.path:
                if p not in before and p not in b.origins:
                    b.origins[p] = (PathOrigin.PTH_IMPORT, pth_path)
        if unevaluated:
            b.findings.append(ReportFinding(
                kind=FindingKind.UNCERTAIN, source=pth_path,
                summary=f"{pth_path}: {len(unevaluated)} import line(s) whose effect on sys.path was not evaluated"))
        b.pths.append(PthFile(path=pth_path, paths=tuple(kept), imports=tuple(imports), unevaluated=tuple(unevaluated)))


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


# -- stage 5 ---------------------------------------------------------------------------------------

def apply_customize(fs: RootFS, b: _Builder, version: str, triplet: str, env: dict[str, str],
                    user_enabled: bool) -> None:
    """Stage 5 (site.execsitecustomize, execusercustomize): each module found on sys.path as it is now,
    read statically; its literal sys.path edits applied, anything else it may do to imports noted."""
    for module in ("sitecustomize", "usercustomize") if user_enabled else ("sitecustomize",):
        res, _ = find_module(fs, b.entries(fs), module, version, triplet)
        if res is not None:
            _apply_one_customize(fs, b, module, res, version, triplet, env)


def _apply_one_customize(fs: RootFS, b: _Builder, module: str, res: Resolution, version: str, triplet: str,
                         env: dict[str, str]) -> None:
    """One customize module found on sys.path: its literal sys.path edits applied, the rest noted."""
    stdlib = {e for e in b.path if b.origins.get(e, (None,))[0] is PathOrigin.STDLIB}
    file = res.file
    if res.kind not in (ModuleKind.MODULE, ModuleKind.PACKAGE) or file is None or not file.endswith(".py"):
        b.findings.append(ReportFinding(kind=FindingKind.UNCERTAIN, source=res.file or res.path_entry,
                                        summary=f"{module} is {res.kind.value} {res.file or res.path_entry}: "
                                                "its effect on sys.path is not read"))
        return
    real = fs.resolve(file) or file
    text = fs.read_text(file, 1 << 20)
    tree = parse_source(text, file)
    shown = file + (f" -> {real}" if real != file else "")
    if tree is None or text is None:
        b.notes.append(f"{shown}: does not parse; site reports 'Error in {module}' and goes on")
        b.customize.append(CustomizeFile(module=module, path=file, stopped="does not parse"))
        return

    def classify(name: str) -> str | None:
        found, _ = find_module(fs, b.entries(fs), name, version, triplet)
        if found is None:
            return "stdlib" if builtin_or_stdlib(name) else None
        return "stdlib" if found.path_entry in stdlib else "code"

    def addsitedir(d: str) -> None:
        if fs.is_dir(d):
            add_site_dir(fs, b, norm(d) if d.startswith("/") else d, PathOrigin.SITECUSTOMIZE, version, env, shown)

    before = list(b.path)
    effect = evaluate_customize(tree, text, b.path, addsitedir=addsitedir, classify=classify)
    for p in b.path:
        if p not in before:
            b.origins.setdefault(p, (PathOrigin.SITECUSTOMIZE, shown))
    b.customize.append(CustomizeFile(module=module, path=file, edits=tuple(effect.edits),
                                     unevaluated=tuple(effect.unevaluated), stopped=effect.stopped))
    if effect.unevaluated:
        b.findings.append(ReportFinding(
            kind=FindingKind.UNCERTAIN, source=file,
            summary=f"{shown}: {len(effect.unevaluated)} statement(s) that may change sys.path not evaluated "
                    f"({effect.unevaluated[0]})"))


# -- stage 6 ---------------------------------------------------------------------------------------

def insert_path0(fs: RootFS, b: _Builder, entry: Entrypoint, workdir: str) -> tuple[PathOrigin, str]:
    """Stage 6 (pymain_run_python, after site ran): sys.path[0] and why it is there."""
    if entry.mode == "script" and entry.target:
        script = join(workdir, entry.target)
        real = fs.resolve(script) or script
        p0 = _dirname(real)
        b.path.insert(0, p0)
        b.origins.setdefault(p0, (PathOrigin.SCRIPT_DIR, f"directory of {real}"))
        return PathOrigin.SCRIPT_DIR, f"directory of {real}"
    b.path.insert(0, workdir)
    how = {"module": "-m", "command": "-c", "interactive": "interactive/stdin",
           "not-python": "assumed -c"}.get(entry.mode, entry.mode)
    return PathOrigin.WORKDIR, f"working directory ({how})"


def compute_python_setup(fs: RootFS, entry: Entrypoint, env: dict[str, str], workdir: str,
                         *, arch_triplet: str = "x86_64-linux-gnu") -> PythonSetup:
    """sys.path for ``entry`` as CPython would build it in this root, with where each entry comes from."""
    version = entry.version
    flags = set(entry.flags)
    isolated = "-I" in flags
    ignore_env = isolated or "-E" in flags
    env_ = {} if ignore_env else env
    if entry.interpreter is None or version is None:
        return PythonSetup(entrypoint=entry, prefix=None, working_dir=workdir, safe_path=False, sys_path=(),
                           notes=("no Python interpreter found in the image",))
    b = _Builder()
    minor = tuple(int(x) for x in version.split("."))
    safe_path = isolated or "-P" in flags or bool(env_.get("PYTHONSAFEPATH"))
    if safe_path and minor < (3, 11):
        if "-P" in flags or (env_.get("PYTHONSAFEPATH") and not isolated):
            b.notes.append(f"PYTHONSAFEPATH/-P has no effect on Python {version} (added in 3.11): "
                           "sys.path[0] is still set")
        safe_path = isolated
    user_enabled = not (isolated or "-s" in flags or env_.get("PYTHONNOUSERSITE"))

    pre = find_prefixes(fs, entry, env_, b.notes)  # 1
    base_path(b, pre, version, env_, workdir)  # 2
    layout = "upstream"
    if "-S" not in flags:
        layout = site_layout(fs, pre, version)
        dirs, user_enabled = site_directories(fs, pre, version, layout, env, user_enabled)  # 3
        for d, origin in dirs:
            add_site_dir(fs, b, d, origin, version, env)  # 4
        apply_customize(fs, b, version, arch_triplet, env, user_enabled)  # 5
    first = insert_path0(fs, b, entry, workdir) if not safe_path else None  # 6
    out: list[PathEntry] = []
    for i, p in enumerate(b.path):
        origin, note = first if (i == 0 and first) else b.origins.get(p, (PathOrigin.PTH_IMPORT, ""))
        out.append(PathEntry(path=p, origin=origin, exists=fs.exists(p), note=note))
    return PythonSetup(entrypoint=entry, prefix=pre.prefix, working_dir=workdir, safe_path=safe_path,
                       sys_path=tuple(out), pth_files=tuple(b.pths), notes=tuple(b.notes), finders=tuple(b.finders),
                       site_layout=layout, customize=tuple(b.customize), findings=tuple(b.findings))
