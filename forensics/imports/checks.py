"""What is wrong with an image as a whole, before (and besides) any module verdict.

* :func:`lookup_user` -- the image's ``User`` as the runtime resolves it against
  ``/etc/passwd`` and ``/etc/group`` (malformed lines skipped, as libc skips them);
* :func:`image_findings` -- the command cannot start (exit 127), no interpreter, an
  unknown user, an unpacked root with no image config, a command that is not
  Python, and the start-up problems the sys.path stages found;
* :func:`find_stray_trees` -- copies of the checked packages outside sys.path, which
  would shadow the installed ones if their directory were the working directory
  (what to look at when the working directory is not known).
"""
from __future__ import annotations

import os

from .layers import LayerFS
from .model import FindingKind, ImageInfo, PythonSetup, ReportFinding
from .rootfs import DirFS, RootFS

__all__ = ["lookup_user", "image_findings", "find_stray_trees"]

_MAX_WALK = 200_000  # directory entries a stray-tree search visits in an unpacked root
_SKIP_DIRS = {"/proc", "/sys", "/dev", "/run", "/usr/share", "/usr/include", "/var/cache", "/var/lib/apt",
              "/var/lib/dpkg", "/etc"}


def _ascii_int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def lookup_user(fs: RootFS, user: str) -> tuple[int, int, str | None, str | None]:
    """(uid, gid, home, problem) of an image's ``User`` (``name``, ``uid``, ``name:group``, ``uid:gid``),
    by the rules of runc's ``GetExecUser`` (moby/sys/user): no User is uid 0 (its /etc/passwd line, if any,
    gives gid and home; a scratch image with no /etc/passwd runs as 0:0); a numeric uid the image does not
    list runs as it is, with gid 0 unless User names a group; only a user or group *name* needs the file
    that lists it.

    ``problem`` says why the runtime would refuse to start the container (a name that
    /etc/passwd does not list); uid and gid are then 0.
    """
    name, _, group = (user or "").partition(":")
    uid = gid = None
    home = None
    problem = None
    passwd = fs.read_text("/etc/passwd", 4 << 20) or ""
    numeric = 0 if name == "" else _ascii_int(name)
    for line in passwd.splitlines():
        f = line.split(":")
        if len(f) < 7:
            continue
        puid, pgid = _ascii_int(f[2]), _ascii_int(f[3])
        if puid is None or pgid is None:
            continue  # a malformed line: getpwnam skips it too
        if (name and f[0] == name) or (numeric is not None and puid == numeric):
            uid, gid, home = puid, pgid, f[5]
            break
    if uid is None:
        if numeric is not None:
            # a uid the image does not list (or no User, and no line for uid 0): runtimes run it as is, gid 0
            uid, gid = numeric, 0
        else:
            problem = (f"User {name[:80]!r} is not in the image's /etc/passwd: the runtime refuses to start the "
                       "container (unable to find user)")
            uid, gid = 0, 0
    if group:
        g = _ascii_int(group)
        if g is not None:
            gid = g
        else:
            for line in (fs.read_text("/etc/group", 4 << 20) or "").splitlines():
                f = line.split(":")
                if len(f) >= 3 and f[0] == group and _ascii_int(f[2]) is not None:
                    gid = _ascii_int(f[2])
                    break
            else:
                problem = problem or (f"group {group[:80]!r} of User is not in the image's /etc/group: the runtime "
                                      "refuses to start the container")
    return uid, gid or 0, home, problem


def image_findings(info: ImageInfo, setup: PythonSetup | None, *, user_problem: str | None,
                   entrypoint_given: bool, workdir_given: bool, live: bool) -> list[ReportFinding]:
    """The findings about the image as a whole, most basic first.

    :param live: a running process (--pid): its command evidently started
    """
    out: list[ReportFinding] = []
    entry = setup.entrypoint if setup is not None else None
    if not info.has_config and not live:
        needs_workdir = entry is None or entry.mode in ("module", "command", "interactive", "not-python")
        if not entrypoint_given or (needs_workdir and not workdir_given and not (setup and setup.safe_path)):
            out.append(ReportFinding(
                kind=FindingKind.NO_CONFIG, source=info.ref,
                summary="no image config with this root: the verdict depends on the entrypoint and the working "
                        "directory, which are not known",
                fix="pass --entrypoint and --workdir as the container runs them (the image's Entrypoint/Cmd and "
                    "WorkingDir, or the pod's command and workingDir), or verify the image itself (oci:, "
                    "docker-archive:, a registry reference), or the bundle an unpacker wrote (umoci unpack: "
                    "dir:BUNDLE)"))
    if entry is not None and entry.exec_error and not live and info.has_config:
        out.append(ReportFinding(kind=FindingKind.ENTRYPOINT_NOT_FOUND, summary=entry.exec_error,
                                 fix="fix the image's Entrypoint/Cmd (Debian's interpreter is python3; python is "
                                     "only there with python-is-python3), or install what it names"))
    if user_problem and not live:
        out.append(ReportFinding(kind=FindingKind.USER_NOT_FOUND, summary=user_problem,
                                 fix="add the user to the image (useradd) or set User to a numeric uid[:gid]"))
    if setup is None or not setup.sys_path:
        out.append(ReportFinding(kind=FindingKind.NO_INTERPRETER,
                                 summary="no Python interpreter in the image: no module can be judged",
                                 fix="check the image reference (is this the application image?) or --entrypoint"))
        return out
    if entry is not None and entry.mode == "not-python" and not entry.exec_error and info.has_config and not live:
        out.append(ReportFinding(
            kind=FindingKind.UNCERTAIN, source=entry.argv[0] if entry.argv else None,
            summary=f"the command {entry.argv[0]!r} is not a Python interpreter or script: the verdicts assume "
                    "`python3 -c` from the working directory",
            fix="pass --entrypoint with the Python command it starts (e.g. \"python3 -m nvitop_exporter\")"))
    out += list(setup.findings)
    return out


def find_stray_trees(fs: RootFS, names: tuple[str, ...], on_path: set[str], *, limit: int = 20) -> list[str]:
    """Directories holding a package ``NAME/__init__.py`` (or ``NAME.py``) for one of ``names``, outside
    every sys.path entry: what would shadow the installed copy if it were the working directory."""
    want = set(names)
    found: list[str] = []

    inside = tuple(p.rstrip("/") + "/" for p in on_path if p.rstrip("/"))

    def consider(parent: str, child: str, is_dir: bool) -> None:
        stem = child if is_dir else (child[:-3] if child.endswith(".py") else None)
        if stem in want and parent not in on_path and not parent.startswith(inside) and len(found) < limit:
            f = f"{parent.rstrip('/')}/{child}" + ("/__init__.py" if is_dir else "")
            if fs.is_file(f):
                found.append(f)

    if isinstance(fs, LayerFS):
        for path, e in fs.entries.items():
            parent, _, child = path.rpartition("/")
            if child and (e.kind == "dir" or child.endswith(".py")) and not any(
                    (parent or "/") == s or (parent or "/").startswith(s + "/") for s in _SKIP_DIRS):
                consider(parent or "/", child, e.kind == "dir")
        return found
    if isinstance(fs, DirFS):
        seen = 0
        for dirpath, dirnames, filenames in os.walk(fs.root):
            rel = "/" if dirpath == fs.root else "/" + os.path.relpath(dirpath, fs.root)
            dirnames[:] = [d for d in dirnames if (rel.rstrip("/") + "/" + d) not in _SKIP_DIRS]
            seen += len(dirnames) + len(filenames)
            if seen > _MAX_WALK or len(found) >= limit:
                break
            for d in dirnames:
                consider(rel, d, True)
            for f in filenames:
                consider(rel, f, False)
    return found
