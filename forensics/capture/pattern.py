"""``kernel.core_pattern`` read with core(5) semantics, and the pipe handler's install / uninstall.

core(5), as the kernel implements it (fs/coredump.c):

- A pattern that starts with ``|`` is a pipe: the kernel runs the program in the *initial*
  namespaces (on the host, as root) and writes the core to its stdin.  RLIMIT_CORE is not
  enforced for a pipe (core(5)), with one exception in the kernel's code: a limit of exactly
  1 byte skips the dump (the guard against a handler that crashes itself).  The program
  gets the limit as ``%c`` and must honour it itself.
- A pattern that starts with ``@`` (Linux 6.16+) sends the core to a unix socket on the host.
- Any other pattern is a file path, expanded and opened by the crashing process's own
  kernel context: a relative path in its cwd, an absolute one from its root, both in *its*
  mount namespace.  In a container the core lands in the container's filesystem (and dies
  with the container) unless a volume is mounted there.  The core is not written when
  RLIMIT_CORE is below one page, and is cut at RLIMIT_CORE otherwise.  When the pattern
  has no ``%p`` and ``kernel.core_uses_pid`` is 1, ``.PID`` is appended.
- The whole pattern holds at most 128 bytes (CORENAME_MAX_SIZE).
"""
from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass

from ..bundle.layout import HANDLER_STATE
from ..errors import CoreDirectoryError, ForensicsError, NotRoot

__all__ = [
    "CORE_PATTERN",
    "CORENAME_MAX_SIZE",
    "Destination",
    "read_core_pattern",
    "expand_pattern",
    "explain_destination",
    "handler_pattern",
    "install_handler",
    "uninstall_handler",
    "destination_payload",
    "format_destination",
    "destination_survives",
    "explain_next_start",
]

CORE_PATTERN = "/proc/sys/kernel/core_pattern"
CORE_USES_PID = "/proc/sys/kernel/core_uses_pid"
CORENAME_MAX_SIZE = 128
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SPEC = re.compile(r"%(.)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """Whether, and where, a process's core will be written."""

    pattern: str
    kind: str  # "pipe", "socket", "file"
    will_dump: bool
    handler: str | None  # the pipe program (host path)
    handler_is_forensics: bool
    path_in_process: str | None  # the expanded file path, as the process sees it
    host_path: str | None  # where that file is on the host, when a host mount holds it
    persistent: bool | None  # survives the container (a volume / host path) or not
    reasons: tuple[str, ...]  # core(5) facts that decided it, in order
    free_bytes: int | None = None  # free space where a file core goes, for the process (None: not a file / unknown)
    core_estimate: int | None = None  # about how many bytes of disk its core takes (resident anonymous memory)

    @property
    def short_of_space(self) -> bool:
        """The core would be cut by the free space left where it goes."""
        return self.free_bytes is not None and self.core_estimate is not None and self.free_bytes < self.core_estimate

    @property
    def survives(self) -> bool:
        """The kernel writes the whole core where it outlives the process (and its container)."""
        return self.will_dump and self.persistent is not False and not self.short_of_space

    def describe(self) -> str:
        return "; ".join(self.reasons)


def read_core_pattern(proc: str = "/proc") -> str:
    with open(os.path.join(proc, "sys/kernel/core_pattern")) as f:
        return f.read().rstrip("\n")


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


def expand_pattern(pattern: str, values: dict[str, str]) -> str:
    """Expand ``%x`` specifiers that are known; unknown ones stay as ``%x``.

    >>> expand_pattern("core.%e.%p.%%", {"e": "python3", "p": "42"})
    'core.python3.42.%'
    """

    def sub(m: re.Match) -> str:
        c = m.group(1)
        if c == "%":
            return "%"
        return values.get(c, m.group(0))

    return _SPEC.sub(sub, pattern)


def _limit_bytes(value: str) -> int | None:
    return None if value == "unlimited" else int(value)


def explain_destination(pattern: str, snapshot, *, core_uses_pid: int | None = None) -> Destination:
    """Tell from core(5) semantics whether and where ``snapshot``'s process will dump core.

    :param pattern: kernel.core_pattern
    :param snapshot: a :class:`~forensics.capture.snapshot.Snapshot` of the process
    """
    from ..procfs import parse_mountinfo
    from ..procfs import find_mount, host_path_of_mount

    reasons: list[str] = []
    soft = snapshot.limits.get("Max core file size", ("0", "0"))[0]
    limit = _limit_bytes(soft)
    if pattern.startswith("|"):
        return _pipe_destination(pattern, soft, limit)
    if pattern.startswith("@"):
        reasons.append(f"core_pattern sends the core to the unix socket {pattern.lstrip('@')!r} on the host (Linux "
                       "6.16+)")
        return Destination(pattern=pattern, kind="socket", will_dump=True, handler=pattern.lstrip("@"),
                           handler_is_forensics=False, path_in_process=None, host_path=None, persistent=True,
                           reasons=tuple(reasons))
    # a file path, resolved in the crashing process's mount namespace and cwd
    values = {"p": str(snapshot.status.get("NSpid", str(snapshot.pid)).split()[-1]),
              "P": str(snapshot.pid), "e": (snapshot.comm or "")[:15].replace("/", "!"),
              "u": snapshot.status.get("Uid", "0").split()[0], "g": snapshot.status.get("Gid", "0").split()[0]}
    expanded = expand_pattern(pattern, values)
    if core_uses_pid is None:
        core_uses_pid = _read_int(CORE_USES_PID, 0)
    if "%p" not in pattern and core_uses_pid:
        expanded += f".{values['p']}"
        reasons.append("kernel.core_uses_pid=1 and the pattern has no %p: '.PID' is appended")
    if not expanded.startswith("/"):
        base = snapshot.cwd or "?"
        path = os.path.normpath(os.path.join(base, expanded))
        reasons.append(f"core_pattern {pattern!r} is a relative file name: written in the process's cwd {base}")
    else:
        path = expanded
        reasons.append(f"core_pattern {pattern!r} is an absolute path: resolved from the process's own root")
    will = True
    if limit is not None and limit < PAGE_SIZE:
        will = False
        reasons.append(f"RLIMIT_CORE is {soft} bytes, below one page: the kernel writes no core file")
    elif limit is not None:
        reasons.append(f"RLIMIT_CORE is {soft} bytes: the core file is cut there")
    else:
        reasons.append("RLIMIT_CORE is unlimited")
    host_path = None
    persistent = None
    if snapshot.in_container_namespace:
        mounts = parse_mountinfo(_read_text(f"/proc/{snapshot.pid}/mountinfo"))
        host_mounts = parse_mountinfo(_read_text("/proc/1/mountinfo") or _read_text("/proc/self/mountinfo"))
        m = find_mount(mounts, path)
        if m is not None:
            hp = host_path_of_mount(m, path, host_mounts)
            if m.mount_point == "/" or hp is None:
                persistent = False
                reasons.append(
                    f"the process is in its own mount namespace (a container): {path} is on its root filesystem "
                    f"({m.fstype} {m.source}), which dies with the container; mount a volume there to keep cores")
            else:
                host_path, persistent = hp, True
                reasons.append(f"in the container, {m.mount_point} is a mount of the host's "
                               f"{hp.rsplit(path[len(m.mount_point):], 1)[0] or '/'} ({m.fstype}): the core reaches "
                               f"the host at {hp}")
    else:
        host_path, persistent = path, True
        reasons.append("the process shares the host's mount namespace: the path is the host's")
    d = os.path.dirname(path)
    root = getattr(snapshot, "root", None) or f"/proc/{snapshot.pid}/root"
    free = estimate = None
    fd = _open_dir_in_root(root, d)
    if fd is None:
        will = False
        reasons.append(f"the directory {d} does not exist in the process's filesystem: no core is written")
    else:
        try:
            ok, free, why = _writable_for(fd, d, snapshot)
        finally:
            os.close(fd)
        reasons.extend(why)
        if not ok:
            will = False
        elif free is not None:
            estimate = _core_estimate(snapshot)
            if estimate is not None and free < estimate:
                reasons.append(f"only {free:,} bytes free in {d}, and the core takes about {estimate:,} "
                               "(the process's resident anonymous memory): the kernel writes a cut core")
    return Destination(pattern=pattern, kind="file", will_dump=will, handler=None, handler_is_forensics=False,
                       path_in_process=path, host_path=host_path, persistent=persistent, reasons=tuple(reasons),
                       free_bytes=free, core_estimate=estimate)


class _LimitsOnly:
    """What the pipe branch of :func:`explain_destination` reads of a snapshot: the limits."""

    def __init__(self, soft: str) -> None:
        self.limits = {"Max core file size": (soft, soft)}


def explain_next_start(pattern: str, rlimit_core: str | None, *, limit_from: str | None = None) -> Destination:
    """Where the core of a container that is not running now (CrashLoopBackOff) will go when it next starts and
    crashes: a pipe handler on the host takes it whatever its mount namespace; a file pattern writes it in the
    container's own filesystem, where it dies with the container.

    :param rlimit_core: the soft RLIMIT_CORE the next start is expected to get (None: unknown)
    :param limit_from: where that expectation comes from (said in the reasons)
    """
    if pattern.startswith("|"):
        d = explain_destination(pattern, _LimitsOnly(rlimit_core if rlimit_core is not None else "unlimited"))
        reasons = [f"the container is not running: its next start inherits kernel.core_pattern {pattern!r}"]
        if rlimit_core is None:
            reasons.append("its RLIMIT_CORE is not known here (no process of the pod runs): the handler keeps the core "
                           "only if it is at least one page")
        else:
            reasons.append(f"its RLIMIT_CORE is expected to be {rlimit_core}" + (f" ({limit_from})" if limit_from
                                                                                 else ""))
        reasons.extend(r for r in d.reasons if "RLIMIT_CORE" not in r or rlimit_core is not None)
        limit = _limit_bytes(rlimit_core) if rlimit_core is not None else None
        keeps = d.will_dump and d.handler_is_forensics and (limit is None or limit >= PAGE_SIZE)
        if d.handler_is_forensics and not keeps and d.will_dump:
            reasons.append("so the handler will keep its metadata only: raise the limit in the container's command "
                           "(ulimit -c unlimited) or in the runtime's default (containerd's LimitCORE)")
        if not d.handler_is_forensics:
            reasons.append("the handler is not forensics': what it keeps is up to it")
        return Destination(pattern=pattern, kind="pipe", will_dump=d.will_dump, handler=d.handler,
                           handler_is_forensics=d.handler_is_forensics, path_in_process=None, host_path=None,
                           persistent=True if keeps else (None if not d.handler_is_forensics else False),
                           reasons=tuple(reasons))
    if pattern.startswith("@"):
        return Destination(pattern=pattern, kind="socket", will_dump=True, handler=pattern.lstrip("@"),
                           handler_is_forensics=False, path_in_process=None, host_path=None, persistent=True,
                           reasons=(f"the container is not running: its next crash goes to the unix socket "
                                    f"{pattern.lstrip('@')!r} on the host",))
    return Destination(pattern=pattern, kind="file", will_dump=False, handler=None, handler_is_forensics=False,
                       path_in_process=None, host_path=None, persistent=False, reasons=(
                           f"the container is not running: its next crash is written by core_pattern {pattern!r} into "
                           "its own filesystem, where it dies with the container (and RLIMIT_CORE is usually 0 there)",
                           "install the node's core handler (forensics agent manifest | kubectl apply -f -) so the "
                           "next start's core is kept on the node"))


def _pipe_destination(pattern: str, soft: str, limit: int | None) -> Destination:
    """A ``|program`` pattern: the kernel runs the program on the host and pipes the core to it."""
    reasons: list[str] = []
    argv = pattern[1:].split()
    prog = argv[0] if argv else ""
    ours = prog.endswith("/forensics") and "core-handler" in argv
    will = limit != 1
    reasons.append(f"core_pattern pipes the core to {prog!r}, run by the kernel on the host (initial namespaces) "
                   "as root")
    reasons.append("RLIMIT_CORE is not enforced for a pipe (core(5)); the kernel skips the dump only when it is "
                   "exactly 1")
    if ours:
        if limit is not None and limit < PAGE_SIZE:
            reasons.append(f"forensics core-handler honours %c: RLIMIT_CORE {soft} < one page, so it keeps "
                           "metadata only")
        else:
            reasons.append(f"forensics core-handler honours %c: RLIMIT_CORE {soft}, the core is kept")
    if not os.path.isfile(prog):
        reasons.append(f"the handler {prog} does not exist: the kernel will log 'core_pattern ... failed' and no "
                       "core is written")
        will = False
    return Destination(pattern=pattern, kind="pipe", will_dump=will, handler=prog, handler_is_forensics=ours,
                       path_in_process=None, host_path=None, persistent=True if will else None,
                       reasons=tuple(reasons))


def destination_payload(dest: Destination) -> dict:
    """The destination as ``arming.json`` records it (what ``capture --pod`` reads back from the agent)."""
    return {"kind": dest.kind, "will_dump": dest.will_dump, "handler": dest.handler,
            "handler_is_forensics": dest.handler_is_forensics, "path_in_process": dest.path_in_process,
            "host_path": dest.host_path, "persistent": dest.persistent, "free_bytes": dest.free_bytes,
            "core_estimate": dest.core_estimate, "short_of_space": dest.short_of_space, "survives": dest.survives,
            "reasons": list(dest.reasons)}


def format_destination(d: dict) -> list[str]:
    """The verdict line and its reasons, from :func:`destination_payload`'s dict.

    >>> format_destination({"will_dump": True, "path_in_process": "/data/core", "host_path": "/data/core",
    ...                     "persistent": True, "short_of_space": False, "reasons": ["RLIMIT_CORE is unlimited"]})
    ['core:            WILL be written to /data/core', '  - RLIMIT_CORE is unlimited']
    """
    where = d.get("path_in_process")
    host = d.get("host_path")
    line = (f"core:            {'WILL' if d.get('will_dump') else 'will NOT'} be written"
            + (f" to {where}" if where else "")
            + (f" (host: {host})" if host and host != where else "")
            + (" -- LOST with the container" if d.get("persistent") is False else "")
            + (" -- CUT SHORT: not enough free space" if d.get("will_dump") and d.get("short_of_space") else ""))
    return [line] + [f"  - {x}" for x in d.get("reasons") or ()]


def destination_survives(d: dict) -> bool:
    """:attr:`Destination.survives` from the recorded dict (older records: will_dump and persistent)."""
    if "survives" in d:
        return bool(d["survives"])
    return bool(d.get("will_dump")) and d.get("persistent") is not False


def _open_dir_in_root(root: str, path: str) -> int | None:
    from ..procfs import open_in_root

    try:
        return open_in_root(root, path, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, ForensicsError):  # absent, or leading out of the root: the caller says no core goes there
        return None


_CAP_DAC_OVERRIDE = 1


def _writable_for(fd: int, path: str, snapshot) -> tuple[bool, int | None, list[str]]:
    """Can the kernel create the core in the directory open at ``fd``, as the crashing process?

    The kernel opens the core with the process's own filesystem credentials (core(5): the
    directory must be writable by it) on the process's mount: a read-only mount (a
    ``readOnlyRootFilesystem`` container, a read-only tmpfs), a directory its fsuid/fsgid may
    not write (without CAP_DAC_OVERRIDE), or a full filesystem means no core.
    :return: (writable, free bytes for it, reasons)
    """
    import stat as _stat

    why: list[str] = []
    try:
        vfs = os.fstatvfs(fd)
        st = os.fstat(fd)
    except OSError as e:
        return True, None, [f"{path}: cannot check it ({e.strerror or e})"]
    if vfs.f_flag & os.ST_RDONLY:
        return False, None, [f"{path} is on a read-only mount in the process's filesystem (readOnlyRootFilesystem, "
                             "a read-only volume): the kernel cannot create the core there, no core is written"]
    status = snapshot.status

    def ids(key: str) -> list[int]:
        try:
            return [int(x) for x in status.get(key, "").split()]
        except ValueError:  # not the kernel's format: no ids known
            return []

    uids, gids, groups = ids("Uid"), ids("Gid"), ids("Groups")
    fsuid = uids[3] if len(uids) > 3 else (uids[0] if uids else 0)
    fsgid = gids[3] if len(gids) > 3 else (gids[0] if gids else 0)
    try:
        cap_eff = int(status.get("CapEff", "0"), 16)
    except ValueError:
        cap_eff = 0
    if not cap_eff >> _CAP_DAC_OVERRIDE & 1:
        mode = st.st_mode
        if st.st_uid == fsuid:
            bits = (mode >> 6) & 7
        elif st.st_gid == fsgid or st.st_gid in groups:
            bits = (mode >> 3) & 7
        else:
            bits = mode & 7
        if bits & 3 != 3:
            return False, None, [f"{path} ({_stat.filemode(mode)}, owner {st.st_uid}:{st.st_gid}) is not writable by "
                                 f"the process (fsuid {fsuid}, fsgid {fsgid}, no CAP_DAC_OVERRIDE): no core is written"]
    # root's reserve is not the process's unless it has CAP_SYS_RESOURCE; f_bavail is what others get
    free = vfs.f_bavail * vfs.f_frsize
    if free < PAGE_SIZE:
        return False, free, [f"{path} has no free space ({free} bytes available): the kernel writes no core"]
    why.append(f"{path} is writable by the process, {free:,} bytes free")
    return True, free, why


def _core_estimate(snapshot) -> int | None:
    """Bytes of disk a core of the process takes: resident anonymous and shared memory (untouched pages are
    holes in the file), plus a page of headers and notes per mapping."""
    def kb(key: str) -> int | None:
        v = snapshot.status.get(key, "").split()
        return int(v[0]) * 1024 if v and v[0].isdigit() else None

    anon, shmem = kb("RssAnon"), kb("RssShmem")
    if anon is None:
        return None
    return anon + (shmem or 0) + PAGE_SIZE * (len(snapshot.objects) + 4)


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # gone (the process exited): no mounts known, the destination is judged without them
        return ""


def handler_pattern(core_dir: str, program: str | None = None) -> str:
    """The ``|`` pattern that runs ``forensics core-handler`` (at most 128 bytes).

    ``%P`` (PID on the host), ``%I`` (TID on the host), ``%s`` (signal), ``%t`` (time), ``%c`` (RLIMIT_CORE).

    :raises ForensicsError: when the program or directory path makes it longer than 128 bytes
    """
    program = program or _forensics_program()
    pattern = f"|{program} core-handler {core_dir} %P %I %s %t %c"
    if len(pattern.encode()) > CORENAME_MAX_SIZE - 1:
        raise ForensicsError(
            f"core_pattern would be {len(pattern.encode())} bytes; the kernel keeps {CORENAME_MAX_SIZE} with the NUL: "
            f"{pattern}", help_text="Install forensics (or its venv) and the core directory at shorter paths.")
    if any(c.isspace() for c in program + core_dir):
        raise ForensicsError(f"the handler path and core directory may not contain spaces: {program} {core_dir}")
    return pattern


def _forensics_program() -> str:
    """The absolute path of the ``forensics`` script of this installation (the kernel runs it with no PATH)."""
    import shutil
    import sys

    here = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "forensics")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("forensics")
    if found:
        return os.path.abspath(found)
    raise ForensicsError("cannot find the forensics script next to the interpreter or on PATH",
                         help_text="Install forensics (pip install .) so that the kernel can run its script.")


def install_handler(core_dir: str, *, program: str | None = None, config: dict | None = None,
                    proc: str = "/proc") -> dict:
    """Point kernel.core_pattern at ``forensics core-handler`` and record the previous pattern.

    The previous pattern is kept in ``CORE_DIR/handler.json`` (not overwritten by a second
    install, so uninstall restores the pattern from before forensics).

    :return: ``{"previous": ..., "pattern": ..., "state": path}``
    :raises NotRoot: when not root
    :raises CoreDirectoryError: when the directory cannot be made or written
    """
    if os.geteuid() != 0:
        raise NotRoot("installing the core handler (writing kernel.core_pattern)")
    core_dir = os.path.abspath(core_dir)
    try:
        os.makedirs(core_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CoreDirectoryError(core_dir, e.strerror or str(e)) from e
    pattern = handler_pattern(core_dir, program)
    current = read_core_pattern(proc)
    state_path = os.path.join(core_dir, HANDLER_STATE)
    state = _load_state(state_path)
    if not current.startswith(f"|{pattern[1:].split()[0]} core-handler"):
        state["previous_pattern"] = current
    state["pattern"] = pattern
    if config:
        state.setdefault("config", {}).update(config)
    from ..bundle.write import write_atomic

    try:
        write_atomic(state_path, json.dumps(state, indent=2, sort_keys=True).encode())
    except OSError as e:
        raise CoreDirectoryError(core_dir, e.strerror or str(e)) from e
    with open(os.path.join(proc, "sys/kernel/core_pattern"), "w") as f:
        f.write(pattern)
    return {"previous": state.get("previous_pattern", current), "pattern": pattern, "state": state_path}


def uninstall_handler(core_dir: str, *, proc: str = "/proc") -> dict:
    """Restore the core_pattern recorded by :func:`install_handler`.

    :raises ForensicsError: when nothing was recorded in the directory
    """
    if os.geteuid() != 0:
        raise NotRoot("uninstalling the core handler (writing kernel.core_pattern)")
    state_path = os.path.join(os.path.abspath(core_dir), HANDLER_STATE)
    state = _load_state(state_path)
    if "previous_pattern" not in state:
        raise ForensicsError(f"{state_path}: no recorded previous core_pattern",
                             help_text="Pass the --core-dir used with --install-handler.")
    previous = state["previous_pattern"]
    current = read_core_pattern(proc)
    with open(os.path.join(proc, "sys/kernel/core_pattern"), "w") as f:
        f.write(previous)
    state.pop("pattern", None)
    state.pop("previous_pattern", None)
    from ..bundle.write import write_atomic

    write_atomic(state_path, json.dumps(state, indent=2, sort_keys=True).encode())
    return {"restored": previous, "replaced": current}


def _load_state(path: str) -> dict:
    """The handler's state file; empty when there is none.  One that cannot be read is an error: writing over
    it would lose the core_pattern it recorded for --uninstall-handler to restore."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:  # never installed here
        return {}
    except (OSError, ValueError) as e:
        raise CoreDirectoryError(os.path.dirname(path), f"{os.path.basename(path)} cannot be read ({e}); it records "
                                 "the core_pattern to restore: fix or remove it") from e
    return data if isinstance(data, dict) else {}


def quote(s: str) -> str:
    return shlex.quote(s)
