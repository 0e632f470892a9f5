"""verify-imports end to end: an image or a process -> :class:`~forensics.imports.model.ImportReport`.

:func:`verify_image` and :func:`verify_pid` do the I/O (open the image, read the
layers, read /proc); :func:`analyze_root` is the static analysis over any
:class:`~forensics.imports.rootfs.RootFS`.
"""
from __future__ import annotations

import ast
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace

from ..errors import ExecuteError, ImageRefError, StartupFailed
from ..pidstat import check_still_running, read_pid_stat
from .dists import check_requirements, find_distributions
from .execute import compare, run_probe_bwrap, run_probe_nsenter, startup_result
from .checks import find_stray_trees, image_findings, lookup_user
from .layers import LayerFS, default_capture, read_layers
from .layerstream import LayerLimits
from .model import (ExecuteResult, FindingKind, Guard, ImageConfig, ImageInfo, ImportReport, ManifestKind, ModuleCheck,
                    PathOrigin, Platform, PythonSetup, Transport, Verdict)
from .procfs import ProcessView, read_process
from .pyenv import command_line, describe_command, runtime_env
from .pysource import parse_source
from .resolve import find_module
from .rootfs import DirFS, RootFS, join, norm
from .syspath import compute_python_setup
from .sources import SkopeoOptions, host_platform, open_image, parse_image_ref
from .verdict import DIST_OF_MODULE, check_known_issues, classify_module
from .versions import normalize_name

__all__ = ["DEFAULT_MODULES", "VerifyOptions", "verify_image", "verify_pid", "verify_process", "analyze_root",
           "find_guards"]

DEFAULT_MODULES = ("nvitop", "nvitop_exporter", "pynvml")
_TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu",
             "s390x": "s390x-linux-gnu"}
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyOptions:
    modules: tuple[str, ...] = ()  # checked in addition to DEFAULT_MODULES (and what the entrypoint runs)
    only_modules: bool = False  # check exactly ``modules``
    entrypoint: str | None = None  # the whole command line, replacing Entrypoint + Cmd
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # added to / overriding the image's Env
    platform: Platform | None = None  # the platform to read from an image index; None: this machine's
    execute: bool = False
    driver: str | None = None
    skopeo: SkopeoOptions = field(default_factory=SkopeoOptions)
    limits: LayerLimits = field(default_factory=LayerLimits)


def _script_imports(fs: RootFS, path: str) -> list[str]:
    """Top-level names a script imports (absolute imports, not the stdlib)."""
    tree = parse_source(fs.read_text(path, 1 << 20), path)
    if tree is None:
        return []
    names = []
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in dict.fromkeys(names) if n not in stdlib and n != "__future__"]


def _module_for_extension(path: str, sys_path: list[str]) -> str | None:
    for entry in sorted(sys_path, key=len, reverse=True):
        prefix = entry.rstrip("/") + "/"
        if path.startswith(prefix):
            rel = path[len(prefix):]
            stem = rel.rsplit("/", 1)[-1].split(".", 1)[0]
            parts = rel.split("/")[:-1] + [stem]
            if all(p.isidentifier() for p in parts):
                return ".".join(parts)
    return None


def find_guards(fs: RootFS, setup: PythonSetup, env: dict[str, str] | None = None) -> list[Guard]:
    """``forensics guard`` modules that .pth import lines load (a ``FORENSICS_GUARD`` dict at module level).

    A guard is active unless ``env`` (the image's or the process's environment) sets its switch off.
    """
    import json as _json
    import re as _re

    from ..guard import GUARD_MARKER, SWITCHED_OFF

    out = []
    for pth in setup.pth_files:
        sitedir = pth.path.rsplit("/", 1)[0]
        for line in pth.imports:
            for name in _re.findall(r"import\s+([A-Za-z_][\w]*)", line):
                path = f"{sitedir}/{name}.py"
                text = fs.read_text(path, 1 << 20)
                if not text or GUARD_MARKER not in text:
                    continue
                tree = parse_source(text, path)
                if tree is None:
                    continue
                for node in tree.body:
                    if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == GUARD_MARKER
                                                             for t in node.targets)):
                        value = node.value
                        spec = None
                        if (isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Constant)
                                and isinstance(value.args[0].value, (str, bytes))):
                            try:
                                spec = _json.loads(value.args[0].value)
                            except (TypeError, ValueError, RecursionError):
                                spec = None
                        elif isinstance(value, ast.Dict):
                            try:
                                spec = ast.literal_eval(value)
                            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                                spec = None
                        if isinstance(spec, dict):
                            switch = str(spec.get("env", ""))
                            off = (env or {}).get(switch, "1").strip().lower() in SWITCHED_OFF
                            out.append(Guard(pth=pth.path, file=path,
                                             target=f"{spec.get('module', '?')}:{spec.get('attr', '?')}",
                                             env=switch, returns=_json.dumps(spec.get("returns")), active=not off))
    return out


def analyze_root(fs: RootFS, config: ImageConfig, info: ImageInfo, options: VerifyOptions, *,
                 argv: tuple[str, ...] | None = None, workdir: str | None = None,
                 env: dict[str, str] | None = None, interpreter: str | None = None,
                 loaded_extensions: tuple[str, ...] = ()) -> tuple[ImportReport, dict[str, str], tuple[int, int]]:
    """Static verdicts for ``fs``; returns (report, the runtime environment, (uid, gid)).

    ``argv``/``workdir``/``env``/``interpreter`` are given for a live process; for an image
    they come from the config (and ``options``).
    """
    report, run_env, ids = _analyze_once(fs, config, info, options, argv, workdir, env, interpreter,
                                         loaded_extensions)
    for _attempt in range(2):
        if not (isinstance(fs, LayerFS) and fs.misses):
            break
        fs.fetch(sorted(fs.misses))  # files the first pass did not keep: one targeted pass, then again
        report, run_env, ids = _analyze_once(fs, config, info, options, argv, workdir, env, interpreter,
                                             loaded_extensions)
    return report, run_env, ids


def _module_roles(fs: RootFS, entry, setup: PythonSetup, options: VerifyOptions, wd: str,
                  loaded_extensions: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """Which modules to check and why (role), and the extension modules a process has loaded."""
    roles: dict[str, str] = {} if options.only_modules else {m: "default" for m in DEFAULT_MODULES}
    for m in options.modules:
        roles.setdefault(m, "requested")
    if entry.mode == "module" and entry.target:
        roles.setdefault(entry.target, "entrypoint")
    if entry.mode == "script" and entry.target:
        for name in _script_imports(fs, join(wd, entry.target)):
            roles.setdefault(name, "entrypoint")
    loaded: dict[str, str] = {}
    for path in loaded_extensions:
        module = _module_for_extension(path, [e.path for e in setup.sys_path])
        if module and module not in loaded:
            loaded[module] = path
            roles.setdefault(module, "loaded")
    return roles, loaded


def _check_modules(fs: RootFS, setup: PythonSetup, roles: dict[str, str], loaded: dict[str, str], dists, files,
                   triplet: str) -> list[ModuleCheck]:
    checks: list[ModuleCheck] = []
    version = setup.entrypoint.version
    if version is None:  # compute_python_setup builds no sys.path without the interpreter's version
        return checks
    for m, role in roles.items():
        winner, cands = find_module(fs, setup.sys_path, m, version, triplet, setup.finders)
        check = replace(classify_module(m, winner, cands, setup, dists, files,
                                        lambda p: fs.read_text(p), lambda p: fs.read(p)), role=role)
        if m in loaded:
            lf = loaded[m]
            check = replace(check, loaded_file=lf)
            if check.resolved is None or (fs.resolve(check.resolved.file or "") or "") != (fs.resolve(lf) or lf):
                check = replace(check, verdict=Verdict.VERSION_MISMATCH,
                                reason=f"the process has {lf} loaded, but a fresh start would import "
                                       f"{check.resolved.file if check.resolved else 'nothing'}: "
                                       "the files changed since it started",
                                fix="restart the process after checking the image")
        checks.append(check)
    return checks


def _running_versions(dists, checks: list[ModuleCheck], notes: list[str]) -> tuple[dict[str, str], dict]:
    """normalized distribution name -> the version whose code imports (for the known issues), and the
    distributions whose imported code is not what pip recorded (for the requirement checks)."""
    versions: dict[str, str] = {}
    for d in dists:
        versions.setdefault(normalize_name(d.name), d.version)
    effective: dict[str, tuple[str, str]] = {}
    for c in checks:
        top = c.module.split(".")[0]
        if c.verdict is Verdict.CONFLICT:
            # the other owners' code never imports: facts keyed on their versions do not apply
            for d in c.owners:
                runs = c.distribution is not None and d.metadata_dir == c.distribution.metadata_dir
                if not runs and versions.pop(normalize_name(d.name), None) is not None:
                        notes.append(f"known issues of {d.label} not applied: its {top} never imports "
                                     f"({c.resolved.file if c.resolved else '?'} does)")
        dname = (c.distribution.name if c.distribution else
                 c.expected_distribution.name if c.expected_distribution else DIST_OF_MODULE.get(top))
        ver = c.effective_version
        if dname and ver and c.resolved is not None and c.module == top:
            n = normalize_name(dname)
            if versions.get(n) != ver:
                effective[n] = (ver, c.resolved.file or c.resolved.path_entry)
            versions[n] = ver
    return versions, effective


def _pip_view(dists, setup: PythonSetup) -> list:
    """The distributions ``pip check`` sees in the image: not those only the entrypoint's sys.path[0]
    (the working directory, the script's directory) holds -- pip's own sys.path[0] is elsewhere."""
    first = setup.sys_path[0] if setup.sys_path and not setup.safe_path else None
    if first is None or first.origin not in (PathOrigin.WORKDIR, PathOrigin.SCRIPT_DIR):
        return list(dists)
    if any(e.path == first.path for e in setup.sys_path[1:]):
        return list(dists)
    return [d for d in dists if d.location != first.path]


def _analyze_once(fs, config, info, options, argv, workdir, env, interpreter, loaded_extensions):
    live = interpreter is not None
    notes = list(fs.notes) if isinstance(fs, LayerFS) else []
    uid, gid, home, user_problem = lookup_user(fs, config.user)
    if argv is None:
        cfg = config
        if options.env:
            merged = dict(config.env)
            merged.update(dict(options.env))
            cfg = replace(config, env=tuple(merged.items()))
        argv, extra, cmd_notes = command_line(cfg, options.entrypoint)
        run_env = runtime_env(cfg, extra, home)
    else:
        cmd_notes = []
        run_env = dict(env or {})
    wd = norm(options.workdir or workdir or config.working_dir or "/")
    entry, more = describe_command(fs, argv, run_env, wd)
    cmd_notes += more
    if live:
        # a live process: the executable it runs is the truth; argv[0] is kept when it leads to the same
        # file (CPython finds a venv's pyvenv.cfg from argv[0], not from the resolved binary)
        real = fs.resolve(interpreter) or interpreter
        if entry.interpreter is None or fs.resolve(entry.interpreter) != real:
            entry = replace(entry, interpreter=interpreter, interpreter_real=real)
        entry = replace(entry, exec_error=None)
    arch = _architecture(info, options)
    triplet = _TRIPLETS.get(arch, "x86_64-linux-gnu")
    setup = compute_python_setup(fs, entry, run_env, wd, arch_triplet=triplet)
    setup = replace(setup, notes=tuple(cmd_notes) + setup.notes)
    findings = image_findings(info, setup, user_problem=user_problem, entrypoint_given=options.entrypoint is not None,
                              workdir_given=options.workdir is not None, live=live)
    roles, loaded = _module_roles(fs, entry, setup, options, wd, loaded_extensions)
    checks: list[ModuleCheck] = []
    dists: list = []
    if setup.sys_path:
        dists, files, dnotes = find_distributions(fs, setup.sys_path)
        notes += dnotes
        checks = _check_modules(fs, setup, roles, loaded, dists, files, triplet)
    if any(f.kind is FindingKind.NO_CONFIG for f in findings):
        on_path = {e.path for e in setup.sys_path}
        for tree in find_stray_trees(fs, tuple(roles), on_path):
            notes.append(f"{tree} lies outside sys.path: it would shadow the installed copy if "
                         f"{tree.rsplit('/', 2 if tree.endswith('/__init__.py') else 1)[0]} were the working "
                         "directory (-m, -c) or held the entrypoint script")
    versions, effective = _running_versions(dists, checks, notes)
    marker_env = {"python_version": entry.version or "", "python_full_version": (entry.version or "") + ".0",
                  "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
                  "platform_machine": _MACHINES.get(arch, arch), "implementation_name": "cpython",
                  "platform_python_implementation": "CPython"}
    problems = check_requirements(_pip_view(dists, setup), marker_env, effective) if dists else []
    hits = check_known_issues(versions, options.driver)
    guards = find_guards(fs, setup, run_env)
    report = ImportReport(image=info, config=config, python=setup, modules=tuple(checks), guards=tuple(guards),
                          distributions=tuple(dists), requirement_problems=tuple(problems), known_issues=tuple(hits),
                          driver=options.driver, warnings=tuple(info.warnings), findings=tuple(findings),
                          notes=tuple(notes))
    return report, run_env, (uid, gid)


def _architecture(info: ImageInfo, options: VerifyOptions) -> str:
    """The image's architecture (its config says it), else the one asked for, else this machine's."""
    if info.platform and info.platform.count("/") >= 1:
        return info.platform.split("/")[1]
    return (options.platform or host_platform()).architecture


def verify_image(ref: str, options: VerifyOptions | None = None) -> ImportReport:
    """Verify what Python imports in image ``ref`` (see :func:`~forensics.imports.sources.parse_image_ref`).

    :raises ImageRefError, ImageFormatError, LayerRejected, SkopeoNotFound, SkopeoError, ExecuteError:
        see :mod:`forensics.errors`
    """
    options = options or VerifyOptions()
    image_ref = parse_image_ref(ref)
    with open_image(image_ref, platform=options.platform, skopeo=options.skopeo) as opened:
        if opened.rootfs_dir is not None:
            fs: RootFS = DirFS(os.path.abspath(opened.rootfs_dir))
        else:
            keep = default_capture(DEFAULT_MODULES + tuple(options.modules))
            fs = read_layers(opened.blobs, limits=options.limits, capture=keep, description=str(image_ref))
        report, run_env, (uid, gid) = analyze_root(fs, opened.config, opened.info, options)
        if not options.execute:
            return report
        return replace(report, execute=_execute_image(fs, report, run_env, uid, gid))


def _execute_image(fs: RootFS, report: ImportReport, env: dict[str, str], uid: int, gid: int) -> ExecuteResult:
    setup = report.python
    if setup is None or setup.entrypoint.interpreter is None:
        raise ExecuteError("interpreter", "no Python interpreter in the image to run",
                           hint="Nothing to run: the static result above says what is missing.")
    names = [c.module for c in report.modules]
    predicted = any(f.kind is FindingKind.STARTUP_FAILS for f in report.findings)
    if isinstance(fs, DirFS):
        if not fs.is_dir(setup.working_dir):
            raise ExecuteError("workdir", f"{setup.working_dir} does not exist in {fs.root}",
                               hint="Pass --workdir with the directory the container starts in.")
        return _probe(fs, fs.root, setup, report, env, uid, gid, names, predicted)
    tmp = tempfile.mkdtemp(prefix="forensics-rootfs-")
    try:
        root = os.path.join(tmp, "root")
        os.mkdir(root, 0o755)
        try:
            assert isinstance(fs, LayerFS)  # a root is a directory (DirFS, probed in place) or an image's layers
            fs.extract(root)
            for d in ("proc", "dev", "tmp", setup.working_dir.strip("/")):
                if d and not os.path.lexists(os.path.join(root, d)):
                    os.makedirs(os.path.join(root, d), 0o755, exist_ok=True)  # the runtime creates these (WORKDIR too)
        except OSError as e:
            raise ExecuteError("unpack", f"the image cannot be unpacked here: {e.strerror or e} "
                                         f"({(e.filename or '')[len(root):][:120]})",
                               hint="Free space under $TMPDIR, or run without --execute (the static verdicts "
                                    "above do not need it).") from e
        result = _probe(fs, root, setup, report, env, uid, gid, names, predicted)
    finally:
        left = _rmtree(tmp)
    if left:  # an unpacked image can be GiBs: whoever runs this must know it is still there
        result = replace(result, notes=result.notes + (f"{tmp}: the unpacked image could not be removed whole "
                                                      f"({left} removals failed); remove it by hand",))
    return result


def _probe(fs: RootFS, root: str, setup: PythonSetup, report: ImportReport, env: dict[str, str], uid: int, gid: int,
           names: list[str], predicted: bool) -> ExecuteResult:
    try:
        probe, cmd, notes = run_probe_bwrap(root, setup, env, uid, gid, names)
    except StartupFailed as e:
        return startup_result(setup, e, e.command, predicted)
    # the image's package database is read from the unpacked root: the layer index keeps only the Python packages'
    # file lists, and a failed import asks after any package's file
    files = fs if isinstance(fs, DirFS) else DirFS(root)
    return compare(fs, setup, report.modules, probe, "bubblewrap", cmd, notes, env, files=files)


def _rmtree(path: str) -> int:
    """Remove an extracted image: iteratively (an image may nest thousands of directories deep, past
    Python's recursion limit), through directory descriptors (never following a link), making a
    read-only directory from the image's modes writable first.  Returns how many entries are left."""
    left = 0
    stack = [(path, False)]
    while stack:
        d, emptied = stack.pop()
        if emptied:
            try:
                os.rmdir(d)
            except OSError:
                left += 1
            continue
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            left += 1
            continue
        try:
            if os.fstat(fd).st_mode & 0o700 != 0o700:
                os.fchmod(fd, 0o700)
            entries = list(os.scandir(fd))
            stack.append((d, True))
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append((os.path.join(d, e.name), False))
                else:
                    try:
                        os.unlink(e.name, dir_fd=fd)
                    except OSError:
                        left += 1
        finally:
            os.close(fd)
    return left


def verify_pid(pid: int, options: VerifyOptions | None = None) -> ImportReport:
    """Verify what the live process ``pid`` imports, through /proc/PID (and, with execute, nsenter)."""
    options = options or VerifyOptions()
    who = read_pid_stat(pid)  # what its root says is true of it only while it runs: checked again at the end
    proc = read_process(pid)
    report, run_env, fs = _verify_view(proc, options)
    if options.execute:
        setup = report.python
        if setup is None or setup.entrypoint.interpreter is None:
            raise ExecuteError("interpreter", f"process {pid} does not run a Python interpreter")
        probe, cmd, notes = run_probe_nsenter(pid, setup.entrypoint.interpreter, setup, run_env, proc.uid, proc.gid,
                                              [c.module for c in report.modules])
        report = replace(report, execute=compare(fs, setup, report.modules, probe, "nsenter", cmd, notes, run_env))
    check_still_running(who, "its verification (its files were read from a root that went with it)")
    return report


def verify_process(proc: ProcessView, options: VerifyOptions | None = None) -> ImportReport:
    """Verify what the process ``proc`` describes imports, statically (no execute): its root may be a held
    descriptor's ``/proc/self/fd/N``, read after the process is gone (the core handler, after the core).
    ``options.execute`` is not done here: it needs the live process (:func:`verify_pid`)."""
    return _verify_view(proc, options or VerifyOptions())[0]


def _verify_view(proc: ProcessView, options: VerifyOptions) -> tuple[ImportReport, dict, RootFS]:
    fs = DirFS(proc.root)
    root = proc.root_seen if proc.root_seen != "/" else None
    info = ImageInfo(ref=f"pid:{proc.pid}", transport=Transport.PID, manifest_kind=ManifestKind.NONE, root=root)
    config = ImageConfig(working_dir=proc.cwd, env=proc.env, cmd=proc.argv, user=str(proc.uid))
    if options.entrypoint is not None:
        raise ImageRefError(f"pid:{proc.pid}", "--entrypoint does not apply to a live process (its cmdline is used)")
    report, run_env, _ = analyze_root(fs, config, info, options, argv=proc.argv, workdir=proc.cwd, env=dict(proc.env),
                                      interpreter=proc.exe, loaded_extensions=proc.extensions)
    return report, run_env, fs
