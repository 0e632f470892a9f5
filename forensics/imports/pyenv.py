"""The Python command an image runs, worked out without running it.

:func:`command_line` turns Entrypoint/Cmd (or ``--entrypoint``, or a process's
cmdline) into argv, unwrapping ``sh -c``, ``env`` and init wrappers;
:func:`describe_command` finds the interpreter on the image's PATH (through
shebangs and symlinks, inside the root only) and reads its options.  The
sys.path it then builds is :mod:`forensics.imports.syspath`'s.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import replace

from .model import Entrypoint, ImageConfig
from .rootfs import RootFS, join

__all__ = [
    "DEFAULT_PATH",
    "command_line",
    "describe_command",
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
            argv = _unwrap_env(argv[1:], extra, notes)
        elif base in _SHELLS and len(argv) >= 3 and argv[1].startswith("-") and argv[1].endswith("c"):
            tokens = _unwrap_shell(argv[2], extra, notes)
            if tokens is None:
                break
            argv = tokens
        else:
            break
    return tuple(argv), extra, notes


def _unwrap_env(argv: list[str], extra: dict[str, str], notes: list[str]) -> list[str]:
    """The command ``env`` runs: its options and assignments go into ``extra``."""
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
    return argv


def _unwrap_shell(script: str, extra: dict[str, str], notes: list[str]) -> list[str] | None:
    """The first command of ``sh -c SCRIPT`` (after ``exec`` and assignments, which go into ``extra``); None
    when the script does not parse."""
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        notes.append("shell command could not be parsed; analysed as written")
        return None
    cut = next((i for i, t in enumerate(tokens) if t and set(t) <= set(";&|")), len(tokens))
    tokens = tokens[:cut]
    while tokens and (tokens[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0])):
        t = tokens.pop(0)
        if t != "exec":
            k, _, v = t.partition("=")
            extra[k] = v
    notes.append(f"shell form: analysed the first command of {script!r}")
    return tokens


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


def describe_command(fs: RootFS, argv: tuple[str, ...], env: dict[str, str], workdir: str) -> tuple[Entrypoint,
                                                                                                    list[str]]:
    """Which interpreter runs, how (``-m``/script/``-c``) and with which options.

    When the command is not Python (or there is none), the analysis assumes
    ``python3 -c`` from the image's PATH: sys.path[0] is then the working
    directory, the case that shadows most.
    """
    notes: list[str] = []
    path_var = env.get("PATH", DEFAULT_PATH)
    exe = argv[0] if argv else None
    found = _which(fs, exe, path_var, workdir) if exe else None
    error = None  # why the runtime cannot start the command at all
    if found is not None:
        real = fs.resolve(found)
        node = fs.stat(found)
        if node is not None and not node.mode & 0o111:
            error = f"{found} is not executable: the runtime cannot start it (permission denied, exit 126)"
        if _PY_NAME.match(_base(found)) or (real and _PY_NAME.match(_base(real))):
            mode, target, flags = _parse_python_args(list(argv[1:]))
            e = _entry(fs, argv, found, mode, target, flags, None)
            return replace(e, exec_error=error), notes
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
                    e = _entry(fs, argv, interp, "script", found, flags, found)
                    return replace(e, exec_error=error), notes
                if interp is None:
                    error = error or (f"{found}: the interpreter of its #! line, {parts[0]!r}, is not in the image: "
                                      "the runtime cannot start it (no such file or directory, exit 127)")
        if error is None:
            notes.append(f"{exe!r} is not a Python interpreter or Python script; assuming `python3 -c` "
                         "(sys.path[0] = the working directory)")
    elif exe:
        error = (f"{exe!r} is not on the image's PATH ({path_var}): the container exits 127 "
                 "(executable file not found)") if "/" not in exe else \
                f"{exe} does not exist in the image: the container exits 127 (no such file or directory)"
    else:
        error = "the image has no Entrypoint or Cmd: the runtime has no command to run"
    if error:
        notes.append("the verdicts below assume `python3 -c` from the working directory")
    for name in ("python3", "python"):
        interp = _which(fs, name, path_var, workdir)
        if interp:
            e = _entry(fs, argv, interp, "command", None, (), None)
            return Entrypoint(argv=e.argv, interpreter=e.interpreter, interpreter_real=e.interpreter_real,
                              version=e.version, mode="not-python", target=None, flags=(), exec_error=error), notes
    notes.append("no python3 on the image's PATH")
    return Entrypoint(argv=tuple(argv), interpreter=None, interpreter_real=None, version=None,
                      mode="not-python", target=None, exec_error=error), notes


def _entry(fs: RootFS, argv, interp: str, mode: str, target: str | None, flags, via) -> Entrypoint:
    real = fs.resolve(interp)
    version = _version_from_names(real, interp)
    if version is None and real:
        # python3 -> python3.11 chains: walk the links by hand to see every name
        p, seen = interp, 0
        while seen < 40:
            n = fs.lstat(fs.resolve(p, follow_last=False) or p)
            if n is None or n.kind != "symlink" or n.target is None:
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
