"""``forensics capture --pid PID``: arm a live process on this node and write the capture bundle.

Arming: RLIMIT_CORE of the process raised to unlimited (``prlimit``) and read back from
``/proc/PID/limits``; ``/proc/PID/coredump_filter`` set (``--full`` adds file-backed
mappings); kernel.core_pattern explained for this process (:mod:`.pattern`).  The bundle
holds, in on-call order, identity, the node's kubelet / runtime / device-plugin lines, the
kernel's NVRM / Xid lines and nvidia-smi output when present, and the process snapshot.
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import (CoreDirectoryError, ForensicsError, LimitNotRaised, NotRoot, ProcessExited, ProcessGone,
                      UnsafeContainerPath)
from ..pidstat import check_still_running, check_user_process, read_pid_stat
from ..subproc import run_bounded
from ..procfs import open_in_root

if TYPE_CHECKING:  # imported where they are used: each command loads only what it needs
    from .identity import ContainerIdentity
    from .pattern import Destination
    from .snapshot import Snapshot

__all__ = [
    "DEFAULT_FILTER",
    "FULL_FILTER",
    "ArmResult",
    "arm_process",
    "capture_pid",
    "read_kernel_log",
    "read_node_logs",
    "read_nvidia_smi",
    "read_os_release",
    "run_nvidia_bug_report",
    "redact_bug_report",
    "is_driver_line",
    "redacted",
    "process_secrets",
    "find_container_pids",
    "find_pod_pids",
    "find_pod_shims",
    "scan_pod",
    "capture_waiting_pod",
]

#: coredump_filter bits (core(5)): 0 anon private, 1 anon shared, 2 file private, 3 file shared,
#: 4 ELF headers, 5 private huge, 6 shared huge.  0x33 is the kernel's default.
DEFAULT_FILTER = 0x33
FULL_FILTER = DEFAULT_FILTER | 0x4 | 0x8
# The NVIDIA driver's own kernel lines: NVRM (with its Xid reports), NVSwitch SXid, and the lines of its
# modules and devices ("nvidia-nvlink: ...", "nvidia-modeset: ...", "nvidia 0000:18:00.0: ...",
# "nvidia_uvm: ...").  Nothing else: other processes' segfaults and our own handler's lines are noise
# in an upstream report (issue #19: 332 of 400 lines were).
_DRIVER_LINE = re.compile(r"^\s*(?:NVRM\b|S?Xid\b|nvidia(?:[-_][a-z0-9]+)*(?=[:\s\[(])|nv_peer_mem\b)"
                          r"|\bNVRM:|\bS?Xid \(", re.I)


def is_driver_line(msg: str, pid: int | None = None) -> bool:
    """A kernel log message from the NVIDIA driver, or (with ``pid``) the kernel's fault line for that process.

    >>> is_driver_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.")
    True
    >>> is_driver_line("nvidia-nvlink: Nvlink Core is being initialized, major device number 234")
    True
    >>> is_driver_line("python[8753]: segfault at 7f8a37720000 ip 00007f8a377287e2 sp 00007ffd error 6")
    False
    >>> is_driver_line("python[8753]: segfault at 10 ip 00007f8a377287e2 sp 00007ffd error 6", pid=8753)
    True
    >>> is_driver_line("forensics-core-handler[7859]: pid 8522 (crasher) SIGABRT: core kept")
    False
    """
    if _DRIVER_LINE.search(msg):
        return True
    return (pid is not None
            and bool(re.search(rf"\[{pid}\]: (?:segfault at|general protection|trap )|traps: \S+\[{pid}\]", msg)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmResult:
    pid: int
    rlimit_core_before: tuple[str, str]
    rlimit_core_after: tuple[str, str]  # read back from /proc/PID/limits
    coredump_filter_before: str | None
    coredump_filter_after: str | None
    core_pattern: str
    destination: Destination
    snapshot: Snapshot
    bundle: str


def _limits_core(pid: int) -> tuple[str, str]:
    from ..procfs import parse_limits, read_proc_text

    return parse_limits(read_proc_text(pid, "limits")).get("Max core file size", ("?", "?"))


def _own_process(pid: int) -> bool:
    """Whether ``pid`` runs as this user, real, effective and saved uid alike (what prlimit(2) asks without
    CAP_SYS_RESOURCE)."""
    try:
        st = os.stat(f"/proc/{pid}")
        with open(f"/proc/{pid}/status", "rb") as f:
            uids = next((line.split()[1:5] for line in f.read(1 << 16).splitlines() if line.startswith(b"Uid:")), [])
    except OSError:
        return False
    me = os.getuid()
    return st.st_uid == me and len(uids) == 4 and all(u.isdigit() and int(u) == me for u in uids[:3])


def arm_process(pid: int, *,
                coredump_filter: int = DEFAULT_FILTER) -> tuple[tuple[str, str], tuple[str, str], str | None,
                                                                str | None]:
    """Raise RLIMIT_CORE to unlimited and set coredump_filter; the before / after values read back.

    Without CAP_SYS_RESOURCE the hard limit cannot go up: the soft limit is raised to it.  A process of one's
    own user needs no root for that (prlimit(2) and its coredump_filter are the owner's).

    :raises NotRoot: when not root and the process is another user's
    :raises ProcessGone: when the process does not exist
    :raises LimitNotRaised: when the hard limit is 0 and cannot be raised
    :raises ForensicsError: when the limit reads back as anything but soft == hard > 0
    """
    if not os.path.isdir(f"/proc/{pid}"):
        raise ProcessGone(pid)
    if os.geteuid() != 0 and not _own_process(pid):
        raise NotRoot(f"raising RLIMIT_CORE of process {pid}, another user's")
    check_user_process(pid)
    before = _limits_core(pid)
    inf = resource.RLIM_INFINITY
    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (inf, inf))
    except ProcessLookupError as e:
        raise ProcessGone(pid, "exited before its limit was raised") from e
    except PermissionError as e:
        # no CAP_SYS_RESOURCE: the soft limit can still go up to the hard one
        try:
            _, hard = resource.prlimit(pid, resource.RLIMIT_CORE)
            if hard == 0:
                raise LimitNotRaised(pid, before[1],
                                     "raising it needs CAP_SYS_RESOURCE, which this process lacks") from e
            resource.prlimit(pid, resource.RLIMIT_CORE, (hard, hard))
        except ProcessLookupError as e2:
            raise ProcessGone(pid, "exited before its limit was raised") from e2
        except PermissionError as e2:  # another user's process: prlimit(2) then needs CAP_SYS_RESOURCE too
            raise LimitNotRaised(pid, before[1], "setting another user's limits needs CAP_SYS_RESOURCE, "
                                 "which this process lacks") from e2
    after = _limits_core(pid)
    if after[0] != after[1] or after[0] == "0":
        raise ForensicsError(f"process {pid}: RLIMIT_CORE reads back as {after[0]}/{after[1]}")
    fpath = f"/proc/{pid}/coredump_filter"
    try:
        with open(fpath) as f:
            f_before = f.read().strip()
        with open(fpath, "w") as f:
            f.write(f"0x{coredump_filter:x}")
        with open(fpath) as f:
            f_after = f.read().strip()
    except (FileNotFoundError, ProcessLookupError) as e:
        raise ProcessExited(pid, "its arming") from e
    if int(f_after, 16) != coredump_filter:
        raise ForensicsError(f"process {pid}: coredump_filter reads back as {f_after}, not 0x{coredump_filter:x}")
    return before, after, f_before, f_after


def read_kernel_log(limit: int = 400, *, pid: int | None = None) -> list[str]:
    """The NVIDIA driver's kernel log lines (NVRM, Xid, its modules), newest last; with ``pid``, also that
    process's own fault line (``segfault at``, ``general protection``, ``traps:``)."""
    lines: list[str] = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return _dmesg_fallback(limit, pid)
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:  # the end of the kernel's buffer
                break
            except OSError as e:
                if e.errno == 32:  # EPIPE: a record was overwritten; go on
                    continue
                break
            if not rec:
                break
            text = rec.decode(errors="replace")
            _, _, msg = text.partition(";")
            msg = msg.split("\n", 1)[0]
            if is_driver_line(msg, pid):
                lines.append(msg)
    finally:
        os.close(fd)
    return lines[-limit:]


def _dmesg_fallback(limit: int, pid: int | None = None) -> list[str]:
    """``dmesg``'s driver lines, when /dev/kmsg cannot be opened; a line saying why when neither reads."""
    if not shutil.which("dmesg"):
        return ["(kernel log not read: /dev/kmsg cannot be opened and there is no dmesg)"]
    try:
        out = run_bounded(["dmesg"], timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [f"(kernel log not read: /dev/kmsg cannot be opened and dmesg failed: {e})"]
    # dmesg prefixes "[  12.345678] ": judge the message after it
    return [x for x in out.splitlines() if is_driver_line(re.sub(r"^\[[\s\d.]+\]\s*", "", x), pid)][-limit:]


_DEVICE_PLUGIN_LOGS = ("nvidia-device-plugin", "gpu-operator", "nvidia-driver", "dcgm")
_MAX_LOG_TAIL = 256 << 10
_MAX_LOG_FILES = 32


def read_node_logs(ids: list[str], limit: int = 400, *, host_root: str = "/") -> dict[str, str]:
    """kubelet, container runtime and NVIDIA device-plugin lines this node offers (journald, /var/log/containers).

    :param host_root: the node's filesystem as seen here (``/``, or ``/proc/1/root`` in the agent pod):
        journald is read from its journal directory, container logs through it with their symlinks
        resolved inside it (they point at ``/var/log/pods/...`` on the node)
    """
    out: dict[str, str] = {}
    ids = [i for i in ids if i]
    on_node = host_root in ("", "/")
    journal_dirs = [] if on_node else [d for d in (f"{host_root}/var/log/journal", f"{host_root}/run/log/journal")
                                        if os.path.isdir(d)]
    if shutil.which("journalctl") and (on_node or journal_dirs):
        for unit in ("kubelet", "containerd", "crio", "docker"):
            cmd = ["journalctl", "-u", unit, "--since", "-2h", "--no-pager", "-o", "short-iso", "-n", "5000"]
            for d in journal_dirs:
                cmd += ["-D", d]
            try:
                p = run_bounded(cmd, timeout=20)
            except (OSError, subprocess.SubprocessError) as e:  # said in the file, as nvidia-smi's failures are
                out[f"{unit}.log"] = f"(not read: journalctl failed: {e})\n"
                continue
            text = [x for x in p.stdout.splitlines() if not x.startswith("-- ")]
            if not text:
                continue
            hits = [x for x in text if any(i in x for i in ids) or "nvidia" in x.lower()] if ids else text
            out[f"{unit}.log"] = "\n".join((hits or text)[-limit:]) + "\n"
    root = "/" if on_node else host_root
    try:
        fd = open_in_root(root, "/var/log/containers", os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, UnsafeContainerPath):  # not a Kubernetes node (or no container logged yet)
        return out
    try:
        names = sorted(os.listdir(fd))
    finally:
        os.close(fd)
    wanted = [n for n in names if any(k in n for k in _DEVICE_PLUGIN_LOGS) or any(i and i in n for i in ids)]
    for name in wanted[:_MAX_LOG_FILES]:
        kind = "device-plugin" if any(k in name for k in _DEVICE_PLUGIN_LOGS) else "container"
        try:
            fd = open_in_root(root, f"/var/log/containers/{name}")
        except FileNotFoundError:  # rotated away since the listing, or a link to nothing inside the root
            continue
        except (OSError, UnsafeContainerPath) as e:
            out[f"{kind}-{name}"] = f"(not read: {e})\n"
            continue
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, _MAX_LOG_TAIL, max(0, size - _MAX_LOG_TAIL))
        except OSError as e:
            out[f"{kind}-{name}"] = f"(not read: {e.strerror or e})\n"
            continue
        finally:
            os.close(fd)
        out[f"{kind}-{name}"] = data.decode(errors="replace")
    return out


def read_nvidia_smi(timeout: float = 20.0) -> str | None:
    """``nvidia-smi -q``, or a line saying why not; None when there is no nvidia-smi.

    Never waits past ``timeout`` (+2 s): on a node in trouble nvidia-smi can hang in the driver, where
    even SIGKILL takes no effect, and ``subprocess.run`` would then wait for it forever.
    """
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:  # bounded: the group killed at the timeout, no more than 2 s waited for a process stuck in the driver
        p = run_bounded([exe, "-q"], timeout=timeout, max_stdout=SMI_MAX_OUTPUT)
    except subprocess.TimeoutExpired as e:
        return f"nvidia-smi -q did not finish in {timeout:g} s (killed); its output so far:\n{e.output or ''}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}\n"
    out, err = p.stdout, p.stderr
    return out + (f"\n[stderr]\n{err}" if err else "")


OS_RELEASE_MAX = 16 << 10
#: the most of ``nvidia-smi -q`` read (~15 KiB a GPU)
SMI_MAX_OUTPUT = 16 << 20


def redacted(text: str, secrets: frozenset[str] = frozenset()) -> bytes:
    """``text`` with its secrets masked by their structure (URL credentials, tokens, key blocks, secret-like
    names), and the values in ``secrets`` (the captured process's: :func:`process_secrets`) wherever they
    appear, as UTF-8: what the node's text evidence (logs, nvidia-smi) is written into a bundle as."""
    from ..redact import Redactor

    return Redactor(secrets=set(secrets)).text(text).encode()  # whole: a private-key block spans lines


def process_secrets(cmdline: bytes, environ: bytes) -> frozenset[str]:
    """The secret values a process's argv and environment give away (``--token VALUE``, ``DB_PW=...``): the node's
    text is masked with them too, since no later reader of the bundle can learn them from its redacted files."""
    from ..redact import Redactor
    from ..procfs import for_people, parse_cmdline, parse_environ

    r = Redactor()  # the values as the bundle records them (snapshot.py): a byte that was not UTF-8 as U+FFFD
    r.learn({"cmdline": [for_people(a) for a in parse_cmdline(cmdline)],
             "environ": {for_people(k): for_people(v) for k, v in parse_environ(environ).items()}})
    return frozenset(r.secrets)


def read_os_release(root: str) -> str | None:
    """``/etc/os-release`` (else ``/usr/lib/os-release``) as the root ``root`` sees it, bounded; None when absent.

    ``root`` is ``/`` (this node), ``/proc/1/root`` (the node from the agent pod) or ``/proc/PID/root`` (a
    container's image): the file is opened inside it one component at a time, its symlinks resolved there.
    """
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            fd = open_in_root(root, path)
        except (OSError, UnsafeContainerPath):  # probing: the next of the two places
            continue
        try:
            if not os.path.isfile(f"/proc/self/fd/{fd}"):
                continue
            data = os.read(fd, OS_RELEASE_MAX)
        except OSError:  # as above
            continue
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")
    return None


BUG_REPORT_TIMEOUT = 180.0  # NVIDIA: "typically quick", rarely up to an hour; a capture does not wait that long
BUG_REPORT_MAX = 64 << 20  # bytes of nvidia-bug-report.log.gz kept
# decompressed bytes of it redacted and kept (the masking reads 0.5-1 MB/s: two minutes at most; reports run
# 5-50 MB, and the nvidia-smi -q and kernel log sections NVIDIA reads first come early)
BUG_REPORT_TEXT_MAX = 64 << 20
_BUG_REPORT_PIECE = 1 << 20


def run_nvidia_bug_report(out_dir: str, *, timeout: float = BUG_REPORT_TIMEOUT, max_bytes: int = BUG_REPORT_MAX,
                          secrets: frozenset[str] = frozenset()) -> tuple[str | None, str]:
    """Run ``nvidia-bug-report.sh --safe-mode`` when the node has it; bounded in time and size.

    The script writes ``nvidia-bug-report.log.gz`` into ``out_dir`` (its working directory is a
    private directory there).  It runs in its own session and is killed, with everything it started,
    at ``timeout``; an output over ``max_bytes`` is not kept.

    :return: (path of the kept ``.gz`` or None, a line saying what happened)
    """
    exe = shutil.which("nvidia-bug-report.sh")
    if not exe:
        return None, "nvidia-bug-report.sh is not installed on this node"
    work = os.path.join(out_dir, ".nvidia-bug-report")
    os.makedirs(work, exist_ok=True)
    target = os.path.join(work, "nvidia-bug-report.log")
    try:  # its own session, killed with its children at the timeout (one stuck in the driver is left)
        p = run_bounded([exe, "--safe-mode", "--output-file", target], timeout=timeout, cwd=work)
        note = f"nvidia-bug-report.sh --safe-mode exited {p.returncode}"
    except subprocess.TimeoutExpired:
        note = f"nvidia-bug-report.sh --safe-mode did not finish in {timeout:g} s (killed)"
    except (OSError, subprocess.SubprocessError) as e:  # not started, or its progress output past the bound
        shutil.rmtree(work, ignore_errors=True)
        return None, f"nvidia-bug-report.sh failed: {getattr(e, 'strerror', None) or e}"
    produced = next((os.path.join(work, n) for n in ("nvidia-bug-report.log.gz", "nvidia-bug-report.log")
                     if os.path.isfile(os.path.join(work, n))), None)
    kept = None
    if produced is None:
        note += "; it wrote no report"
    elif note.endswith("(killed)"):
        note += "; its partial output is not kept"
    else:
        size = os.path.getsize(produced)
        if size > max_bytes:
            note += f"; its report ({size} bytes) is over the {max_bytes} byte limit and is not kept"
        else:
            kept = os.path.join(out_dir, "nvidia-bug-report.log.gz")
            note += f"; report of {size} bytes {redact_bug_report(produced, kept, secrets=secrets)}"
            if not os.path.isfile(kept):
                kept = None
    shutil.rmtree(work, ignore_errors=True)
    return kept, note


def redact_bug_report(src: str, dest: str, *, max_text: int = BUG_REPORT_TEXT_MAX,
                      secrets: frozenset[str] = frozenset()) -> str:
    """Write ``src`` (NVIDIA's bug report, gzip or plain) to ``dest`` (gzip) with its secrets masked by
    their structure, as the node's other text is (:class:`~forensics.redact.StreamRedactor`): the report
    holds the node's journal and syslog, where any service may have logged a token or a password.

    A stream: decompressed, masked and recompressed one piece at a time, never whole.  At most
    ``max_text`` decompressed bytes are kept (the rest is said dropped, never kept unmasked); a stream
    that breaks keeps what was read before the break.  ``src`` is removed in every case: the unmasked
    report never stays in a bundle.

    :return: what was kept, for the bundle's note: "kept, secrets masked (N: kinds)" and any cut
    """
    import gzip
    import zlib

    from ..redact import StreamRedactor

    red = StreamRedactor(secrets)  # the captured process's values too: its command line may be in the report
    read = 0
    cut = ""
    tmp = dest + ".part"
    try:
        with open(src, "rb") as raw, gzip.open(tmp, "wb", compresslevel=6) as out:
            magic = raw.read(2)
            raw.seek(0)
            source = gzip.open(raw, "rb") if magic == b"\x1f\x8b" else raw  # noqa: SIM115 - closed by the with below
            with source:
                while True:
                    try:
                        piece = source.read(min(_BUG_REPORT_PIECE, max_text - read + 1))
                    except (OSError, EOFError, zlib.error) as e:
                        cut = f"; its stream breaks after {read} bytes ({e}): what came before is kept"
                        break
                    if not piece:
                        break
                    if read + len(piece) > max_text:
                        piece = piece[: max_text - read]
                        cut = f"; only its first {max_text} bytes are kept (the redaction bound), the rest is dropped"
                    read += len(piece)
                    out.write(red.feed(piece.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
                    if cut:
                        break
            out.write(red.close().encode("utf-8", "surrogateescape"))
        os.replace(tmp, dest)
    except OSError as e:
        for p in (tmp, dest):
            with contextlib.suppress(FileNotFoundError):  # the stream broke before either was written
                os.unlink(p)
        return f"not kept: it could not be redacted ({e.strerror or e})" + _remove_unmasked(src, dest)
    masked = sum(red.counts.values())
    kinds = ", ".join(f"{n} {what}" for what, n in sorted(red.counts.items()))
    return f"kept, secrets masked by structure ({masked}{': ' + kinds if kinds else ''}){cut}" + _remove_unmasked(
        src, dest)


def _remove_unmasked(src: str, dest: str) -> str:
    """Remove NVIDIA's unmasked report; what to add to the bundle's note when it stays."""
    if os.path.abspath(src) == os.path.abspath(dest):
        return ""
    try:
        os.unlink(src)
    except FileNotFoundError:  # already gone
        return ""
    except OSError as e:
        return f"; the unmasked report {src} could not be removed ({e.strerror or e}): remove it by hand"
    return ""


def _pids_where(match, proc: str = "/proc") -> list[int]:
    """The PIDs whose cgroup identity satisfies ``match``, oldest first."""
    from .identity import parse_cgroup

    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/cgroup") as f:
                ident = parse_cgroup(f.read(1 << 20))  # bounded as scan_pod's read
        except OSError:  # exited since the listing
            continue
        if match(ident):
            found.append(int(name))
    return sorted(found)


def find_container_pids(container_id: str, proc: str = "/proc") -> list[int]:
    """The PIDs whose cgroup names ``container_id`` (full or a 12+ hex prefix), oldest first.

    Never by hostname: a container's processes are found by the runtime's cgroup names.
    """
    cid = container_id.split("://")[-1].lower()
    return _pids_where(lambda i: bool(i.container_id) and len(cid) >= 12 and i.container_id.startswith(cid), proc)


def find_pod_pids(pod_uid: str, proc: str = "/proc") -> list[int]:
    """The PIDs in the cgroups of pod ``pod_uid`` (its sandbox, its other containers), oldest first."""
    want = pod_uid.replace("_", "-").lower()
    return _pids_where(lambda i: bool(i.pod_uid) and i.pod_uid.replace("_", "-").lower() == want, proc)


def _shim_id(proc: str, name: str) -> str | None:
    """The ``-id`` of a containerd shim (``containerd-shim-runc-v2 ... -id SANDBOX``), None for any other process."""
    try:
        with open(f"{proc}/{name}/cmdline", "rb") as f:
            argv = f.read(8192).decode(errors="replace").split("\0")
    except OSError:  # exited since the listing
        return None
    if not argv or not os.path.basename(argv[0]).startswith("containerd-shim"):
        return None
    return next((argv[i + 1].lower() for i, a in enumerate(argv[:-1]) if a == "-id"), None)


def find_pod_shims(sandbox_ids: list[str], proc: str = "/proc") -> list[int]:
    """The container runtime's shim processes of a pod (``containerd-shim-runc-v2 ... -id SANDBOX``), by its
    sandbox's container ID: runc starts each new container of the pod from it, so it inherits the shim's limits."""
    ids = {i.lower() for i in sandbox_ids if i}
    return sorted(int(n) for n in os.listdir(proc) if n.isdigit() and _shim_id(proc, n) in ids)


def scan_pod(pod_uid: str, proc: str = "/proc") -> tuple[list[tuple[int, ContainerIdentity]], list[int]]:
    """One walk of /proc for a pod: ``(its processes with their identity, oldest first; its runtime shims)``.

    The processes are those in the pod's cgroups (:func:`find_pod_pids`); the shims those whose ``-id`` is the
    container ID of one of them (:func:`find_pod_shims`: the sandbox's is among them), each process's cgroup and
    command line read once.
    """
    from .identity import parse_cgroup

    want = pod_uid.replace("_", "-").lower()
    members: list[tuple[int, ContainerIdentity]] = []
    shims: list[tuple[int, str]] = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/cgroup", "rb") as f:
                ident = parse_cgroup(f.read(1 << 20).decode(errors="replace"))
        except OSError:  # exited since the listing
            continue
        if ident.pod_uid and ident.pod_uid.replace("_", "-").lower() == want:
            members.append((int(name), ident))
        shim = _shim_id(proc, name)
        if shim is not None:
            shims.append((int(name), shim))
    ids = {i.container_id.lower() for _, i in members if i.container_id}
    return sorted(members, key=lambda m: m[0]), sorted(pid for pid, sid in shims if sid in ids)


def capture_waiting_pod(pod_uid: str, *, core_dir: str, host_root: str = "/") -> tuple[str, dict]:
    """A pod whose container is not running (CrashLoopBackOff): arm what can be armed and write the bundle.

    No process of the container runs to raise a limit on. What can be armed is what its next start
    inherits: runc starts it from the pod's runtime shim (containerd's, found by the pod sandbox's
    container ID), so the shim's RLIMIT_CORE is raised (read back) and the next container gets it; without
    a shim to find, the limit of the pod's running processes (its sandbox) says what it will get. The
    node's core handler (kernel.core_pattern) is inherited as it is. The bundle holds that verdict, the
    node's logs and kernel lines.
    :return: (bundle directory, the arming record)
    """
    from ..bundle import layout
    from ..bundle.record import Identity
    from ..bundle.write import BundleWriter, new_bundle_dir
    from .pattern import destination_payload, explain_next_start, read_core_pattern

    members, shims = scan_pod(pod_uid)  # one walk of /proc: the pod's processes, and its shims by their -id
    pids = [pid for pid, _ in members]
    armed: list[dict] = []
    notes: list[str] = []
    limit, limit_from = None, None
    for shim in shims:
        try:
            before, after, _, _ = arm_process(shim, coredump_filter=DEFAULT_FILTER)
        except ForensicsError as e:
            notes.append(f"the pod's runtime shim (pid {shim}) could not be armed: {e}")
            continue
        armed.append({"pid": shim, "what": "the pod's container runtime shim (new containers of the pod inherit its "
                                            "limits)", "rlimit_core_before": before, "rlimit_core_after": after})
        limit, limit_from = after[0], f"inherited from the pod's runtime shim, pid {shim}, raised from {before[0]}"
    if limit is None:
        for pid in pids:
            try:
                limit = _limits_core(pid)[0]
                limit_from = (f"the RLIMIT_CORE of pid {pid} of the same pod (its sandbox), from which the runtime "
                              "starts it")
                break
            except OSError:  # gone: the next process of the pod (none left: the limit is said unknown)
                continue
    pattern = read_core_pattern()
    dest = explain_next_start(pattern, limit, limit_from=limit_from)
    arming = {"armed": armed, "why": "the container is not running: its next start is armed through what it inherits",
              "notes": notes, "pod_pids": pids, "rlimit_core_next": limit, "rlimit_core_next_from": limit_from,
              "core_pattern": pattern, "destination": destination_payload(dest)}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bdir = new_bundle_dir(os.path.join(core_dir, layout.BUNDLES), f"{stamp}-pod{pod_uid[:8]}")
    w = BundleWriter(bdir)
    w.add_json(layout.IDENTITY, Identity(kind="capture-waiting", node=socket.gethostname(), captured_at=time.time(),
                                         pod_uid=pod_uid, core_dir=os.path.abspath(core_dir)).to_json(),
               "who was captured: node, pod UID, time (the container was not running)")
    for name, text in read_node_logs([pod_uid], host_root=host_root).items():
        w.add_bytes(layout.node_log(name), text.encode(), f"node log lines ({name})")
    node_os = read_os_release(host_root)
    if node_os is not None:
        w.add_bytes(layout.NODE_OS_RELEASE, node_os.encode(), "the node's /etc/os-release")
    w.add_bytes(layout.KERNEL_LOG, ("\n".join(read_kernel_log()) + "\n").encode(),
                "kernel log lines of the NVIDIA driver (NVRM, Xid, its modules)")
    w.add_json(layout.PROCESS_ARMING, arming,
               "arming of a container that is not running: core_pattern and what its next start gets")
    w.write_manifest()
    return bdir, arming


def capture_pid(
    pid: int,
    *,
    core_dir: str,
    full: bool = False,
    coredump_filter: int | None = None,
    bundle_parent: str | None = None,
    host_root: str = "/",
    extra_items: dict | None = None,
    bug_report: bool = True,
    kernel_log: bool = True,
) -> ArmResult:
    """Arm process ``pid`` and write its capture bundle under ``bundle_parent`` (default ``CORE_DIR/bundles``).

    The bundle holds the node's and the process's os-release, the driver's kernel log lines,
    ``nvidia-smi -q`` and (``bug_report``, when the node has it) ``nvidia-bug-report.sh --safe-mode``'s
    report, each bounded in time and size.

    :param kernel_log: read this machine's kernel log (False for a simulated node: the demo's driver is not this
        machine's, and its kernel log lines would be another GPU's, or a test's)
    :raises NotRoot, ProcessGone: see :func:`arm_process`
    :raises CoreDirectoryError: when the bundle cannot be written
    """
    from ..bundle import layout
    from ..bundle.record import Identity
    from ..bundle.write import BundleWriter, new_bundle_dir
    from .pattern import destination_payload, explain_destination, read_core_pattern
    from .snapshot import RawProcFiles, read_snapshot, snapshot_payload

    filt = coredump_filter if coredump_filter is not None else (FULL_FILTER if full else DEFAULT_FILTER)
    who = read_pid_stat(pid)  # the process that is captured: not one that exits meanwhile, nor its PID's next owner
    try:
        before, after, f_before, f_after = arm_process(pid, coredump_filter=filt)
        raw = RawProcFiles()
        snap = read_snapshot(pid, host_root=host_root, raw=raw)
    except ProcessGone as e:
        if who is None or isinstance(e, ProcessExited):
            raise
        raise ProcessExited(pid, "its capture") from e
    learned = process_secrets(raw.cmdline, raw.environ)
    pattern = read_core_pattern()
    dest = explain_destination(pattern, snap)
    parent = bundle_parent or os.path.join(core_dir, layout.BUNDLES)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bdir: str | None = None
    try:
        bdir = new_bundle_dir(parent, f"{stamp}-pid{pid}")
        w = BundleWriter(bdir)
        ident = snap.identity
        w.add_json(layout.IDENTITY, Identity(
            kind="capture", node=socket.gethostname(), pid=pid, captured_at=time.time(), comm=snap.comm, exe=snap.exe,
            pod_uid=ident.pod_uid, container_id=ident.container_id, runtime=ident.runtime, qos_class=ident.qos_class,
            image=snap.image, core_dir=os.path.abspath(core_dir),
        ).to_json(), "who was captured: node, pid, pod UID, container ID, image, time")
        for rel, (obj, what) in (extra_items or {}).items():
            w.add_json(rel, obj, what)
        for name, text in read_node_logs([ident.pod_uid or "", ident.container_id or ""], host_root=host_root).items():
            w.add_bytes(layout.node_log(name), redacted(text, learned), f"node log lines ({name}), secrets masked")
        node_os = read_os_release(host_root)
        if node_os is not None:
            w.add_bytes(layout.NODE_OS_RELEASE, node_os.encode(), "the node's /etc/os-release")
        if kernel_log:
            w.add_bytes(layout.KERNEL_LOG, redacted("\n".join(read_kernel_log(pid=pid)) + "\n", learned),
                        "kernel log lines of the NVIDIA driver (NVRM, Xid, its modules) and of this process's faults")
        smi = read_nvidia_smi()
        if smi is not None:
            w.add_bytes(layout.NVIDIA_SMI, redacted(smi, learned), "nvidia-smi -q, secrets masked")
        if bug_report:
            kept, note = run_nvidia_bug_report(os.path.join(bdir, layout.KERNEL_DIR), secrets=learned)
            if kept:
                w.note_file(f"{layout.KERNEL_DIR}/{os.path.basename(kept)}", f"NVIDIA's bug report: {note}")
            w.add_bytes(layout.BUG_REPORT_NOTE, (note + "\n").encode(), "what nvidia-bug-report.sh did")
        image_os = read_os_release(f"/proc/{pid}/root")
        if image_os is not None:
            w.add_bytes(layout.PROCESS_OS_RELEASE, image_os.encode(),
                        "the process's /etc/os-release (its image's distribution), read inside its root")
        w.add_json(layout.PROCESS_ARMING, {
            "rlimit_core_before": before, "rlimit_core_after": after,
            "coredump_filter_before": f_before, "coredump_filter_after": f_after,
            "core_pattern": pattern, "destination": destination_payload(dest),
        }, "arming: RLIMIT_CORE and coredump_filter before/after (read back), core_pattern and where the core goes")
        w.add_json(layout.PROCESS_SNAPSHOT, snapshot_payload(snap),
                   "process snapshot: limits, cgroup identity, mapped objects with build-ids, NVML origin, Python")
        for name, data in raw.files.items():
            w.add_bytes(layout.process_file(name), data, f"/proc/PID/{name} as read")
        w.write_manifest()
    except CoreDirectoryError:
        raise
    except OSError as e:
        # The process IS armed (its limit was raised and read back); what was written stays.
        raise CoreDirectoryError(
            bdir or parent,
            f"writing the capture bundle failed ({e.strerror or e}); the process is armed "
            f"(core limit {after[0]}), and the items written so far stay",
        ) from e
    check_still_running(who, f"its capture (what it says of the core would be about a process gone; the bundle "
                             f"written so far stays: {bdir})")
    return ArmResult(pid=pid, rlimit_core_before=before, rlimit_core_after=after, coredump_filter_before=f_before,
                     coredump_filter_after=f_after, core_pattern=pattern, destination=dest, snapshot=snap, bundle=bdir)
