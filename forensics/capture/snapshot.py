"""The process snapshot, taken when a process is armed and again when it crashes.

Read from ``/proc/PID`` while the process exists: identity (cgroup), namespaces, limits,
status, cmdline and environment (secrets redacted), cwd, every mapped ELF object with its
build-id and where it comes from (the mount that holds it: a bind mount from the host, as
the NVIDIA container toolkit injects the driver's libraries, or a file of the image), the
libnvidia-ml.so that is mapped compared with the host driver, the interpreter, libpython
and the nvitop / nvidia-ml-py files the interpreter would import.

Mapped objects are opened through ``/proc/PID/map_files/<range>`` (the file the process
really mapped, whatever its path now names); other files inside the container through
:func:`~forensics.procfs.open_in_root`, never following a symlink out of its root.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass, field

from ..core.buildid import read_build_id_from_fd, read_build_id_from_file
from ..errors import ProcessGone, UnsafeContainerPath
from ..procfs import (
    MapEntry,
    MountEntry,
    decode,
    for_people,
    parse_cmdline,
    parse_environ,
    parse_limits,
    parse_maps,
    parse_mountinfo,
    parse_status,
    read_proc_text,
)
from .identity import ContainerIdentity, parse_cgroup, read_image_name
from ..procfs import MountIndex, open_in_root

__all__ = [
    "MappedObject",
    "NvmlInfo",
    "PythonInfo",
    "Snapshot",
    "RawProcFiles",
    "read_snapshot",
    "resolve_python_modules",
    "process_view_of",
    "MAX_HASHED_SOURCE",
    "MAX_MAPPED_FILES",
    "open_mapped_objects",
    "read_host_driver_version",
    "snapshot_payload",
]

_ELF_MAGIC = b"\x7fELF"
_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)")
_PYEXE = re.compile(r"python(\d+\.\d+)?$")
_HOST_NVML_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64")
_PROC_FILES = ("maps", "mountinfo", "cgroup", "status", "limits", "coredump_filter")


@dataclass(frozen=True, slots=True, kw_only=True)
class MappedObject:
    """One ELF file mapped by the process."""

    path: str  # as /proc/PID/maps names it (inside the process's mount namespace)
    dev: str
    inode: int
    size: int | None
    build_id: str | None
    mount_point: str | None  # the mount (in the process's namespace) that holds the file
    fstype: str | None
    bind_source: str | None  # the host path when that mount is a bind mount of a host file or directory
    injected: bool  # a file or directory bind-mounted into the container (not part of its image)


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlInfo:
    """The libnvidia-ml.so the process mapped and whether it is the host driver's own."""

    path: str
    inode: int
    build_id: str | None
    version: str | None
    version_source: str | None  # "file-name" or "version-string"
    origin: str  # "injected-from-host" (bind mount) or "image" (a file of the container image) or "host" (no container)
    bind_source: str | None
    host_driver_version: str | None  # /proc/driver/nvidia/version
    host_library: str | None
    host_library_build_id: str | None
    matches_host: bool | None  # None when there is nothing to compare with
    verdict: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonInfo:
    interpreter: str | None
    interpreter_build_id: str | None
    libpython: str | None
    libpython_build_id: str | None
    version: str | None
    # nvitop / nvidia-ml-py: {module, distribution, path, sha256, version, verdict, origin, how}
    modules: tuple[dict, ...]
    modules_skipped: str | None = None  # why ``modules`` was not looked for (empty without meaning "none found")


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """What /proc said about a process at one moment."""

    pid: int
    taken_at: float
    comm: str | None
    exe: str | None
    cmdline: tuple[str, ...]
    cwd: str | None
    environ: dict[str, str]  # redacted
    status: dict[str, str]
    limits: dict[str, tuple[str, str]]
    coredump_filter: str | None
    identity: ContainerIdentity
    image: str | None
    in_container_namespace: bool  # its mount namespace differs from PID 1's
    namespaces: dict[str, str]
    objects: tuple[MappedObject, ...]
    nvml: NvmlInfo | None
    python: PythonInfo | None
    warnings: tuple[str, ...] = field(default=())


@dataclass
class RawProcFiles:
    """The /proc files as read: ``files`` kept verbatim in the bundle; the rest (secrets unredacted) only in memory,
    to resolve the process's imports later (:func:`process_view_of`)."""

    files: dict[str, bytes] = field(default_factory=dict)
    cmdline: bytes = b""
    environ: bytes = b""
    links: dict[str, str | None] = field(default_factory=dict)  # readlink of /proc/PID/{root,cwd,exe}


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # the snapshot records the field as unknown (None)
        return None


def _map_entries_by_file(maps: tuple[MapEntry, ...]) -> list[MapEntry]:
    """The first mapping of each mapped file (by device and inode)."""
    seen: set[tuple[str, int]] = set()
    out = []
    for m in maps:
        if not m.is_file:
            continue
        key = (m.dev, m.inode)
        if key in seen:
            continue
        seen.add(key)
        out.append(m)
    return out


#: the most mapped files opened (and held) for one process: a process with PyTorch maps ~1,000 objects; one
#: that maps 65,000 files (each its own) would cost a descriptor, a build-id and a mount lookup each
MAX_MAPPED_FILES = 4096


def open_mapped_objects(pid: int, maps: tuple[MapEntry, ...],
                        warnings: list[str] | None = None) -> list[tuple[MapEntry, int]]:
    """Open every mapped ELF file through ``/proc/PID/map_files``: ``[(entry, fd)]``.

    Holding the descriptors keeps the files readable after the process is gone; at most
    :data:`MAX_MAPPED_FILES` files are opened (the rest said in ``warnings``).  Files
    that are not ELF (locale archives, fonts) are skipped; one that cannot be opened or read is
    said in ``warnings`` (its build-id and bytes are then not captured).
    """
    out: list[tuple[MapEntry, int]] = []
    files = _map_entries_by_file(maps)
    if len(files) > MAX_MAPPED_FILES and warnings is not None:
        warnings.append(f"{len(files)} files mapped: the first {MAX_MAPPED_FILES} opened, the rest not captured")
    for m in files[:MAX_MAPPED_FILES]:
        try:
            fd = os.open(f"/proc/{pid}/map_files/{m.range}", os.O_RDONLY)
        except OSError as e:
            if warnings is not None:
                warnings.append(f"{m.path}: not opened through /proc/{pid}/map_files ({e.strerror or e})")
            continue
        try:
            if os.pread(fd, 4, 0) != _ELF_MAGIC:
                os.close(fd)
                continue
        except OSError as e:
            os.close(fd)
            if warnings is not None:
                warnings.append(f"{m.path}: not read through /proc/{pid}/map_files ({e.strerror or e})")
            continue
        out.append((m, fd))
    return out


def read_host_driver_version(host_proc: str = "/proc") -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version``, or None without a driver."""
    try:
        with open(os.path.join(host_proc, "driver/nvidia/version"), "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:  # no NVIDIA driver loaded
        return None
    m = re.search(r"Kernel Module(?: for [^ ]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def _nvml_version_of_fd(fd: int, path: str) -> tuple[str | None, str | None]:
    from ..core.nvml import find_driver_version_string, parse_driver_version_from_name

    v = parse_driver_version_from_name(path)
    if v:
        return v, "file-name"
    import mmap

    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            v = find_driver_version_string(mm)
    except (OSError, ValueError):
        v = None
    return (v, "version-string") if v else (None, None)


def _find_host_nvml(host_root: str, bind_source: str | None) -> str | None:
    candidates = []
    if bind_source:
        candidates.append(bind_source)
    for d in _HOST_NVML_DIRS:
        candidates.append(os.path.join(d, "libnvidia-ml.so.1"))
    for c in candidates:
        p = os.path.join(host_root, c.lstrip("/"))
        if os.path.isfile(p):
            return c
    return None


def _nvml_info(obj: MappedObject, fd: int | None, host_root: str, in_container: bool) -> NvmlInfo:
    version, source = (None, None)
    if fd is not None:
        version, source = _nvml_version_of_fd(fd, obj.path)
    host_version = read_host_driver_version(os.path.join(host_root, "proc"))
    host_lib = _find_host_nvml(host_root, obj.bind_source)
    host_bid = read_build_id_from_file(os.path.join(host_root, host_lib.lstrip("/"))) if host_lib else None
    origin = "host" if not in_container else ("injected-from-host" if obj.injected else "image")
    matches: bool | None = None
    reasons = []
    if host_version and version:
        matches = host_version == version
        reasons.append(f"library {version} vs kernel module {host_version}")
    if host_bid and obj.build_id:
        same = host_bid == obj.build_id
        matches = same if matches is None else (matches and same)
        reasons.append(f"build-id {'equals' if same else 'differs from'} the host's {host_lib}")
    if origin == "image":
        verdict = "a copy shipped in the container image, not injected from the host: it may not match the host driver"
    elif origin == "injected-from-host":
        verdict = f"bind-mounted from the host ({obj.bind_source}), as the NVIDIA container toolkit injects it"
    else:
        verdict = "the host's own library (the process runs in the host's mount namespace)"
    if matches is False:
        verdict += "; DOES NOT match the host driver (" + "; ".join(reasons) + ")"
    elif matches:
        verdict += "; matches the host driver (" + "; ".join(reasons) + ")"
    else:
        verdict += "; no host driver to compare with (no /proc/driver/nvidia/version, no host library)"
    return NvmlInfo(
        path=obj.path, inode=obj.inode, build_id=obj.build_id, version=version, version_source=source,
        origin=origin, bind_source=obj.bind_source, host_driver_version=host_version, host_library=host_lib,
        host_library_build_id=host_bid, matches_host=matches, verdict=verdict,
    )


def _site_dirs(exe: str | None, version: str | None, env: dict[str, str], cwd: str | None) -> list[str]:
    dirs = []
    for p in (env.get("PYTHONPATH") or "").split(":"):
        if p.startswith("/"):
            dirs.append(p)
    if version:
        prefixes = []
        if env.get("VIRTUAL_ENV"):
            prefixes.append(env["VIRTUAL_ENV"])
        if exe and exe.startswith("/"):
            prefixes.append(os.path.dirname(os.path.dirname(exe)))
        prefixes += ["/usr/local", "/usr", "/opt/conda"]
        for pre in prefixes:
            for sub in ("site-packages", "dist-packages"):
                dirs.append(f"{pre}/lib/python{version}/{sub}")
            dirs.append(f"{pre}/lib/python3/dist-packages")
    if cwd:
        dirs.append(cwd)
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _dist_version(root: str, site: str, dist: str) -> str | None:
    try:
        fd = open_in_root(root, site, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, UnsafeContainerPath):  # probing the site directories: the version is unknown here
        return None
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    norm = dist.replace("-", "_").lower()
    for n in names:
        if n.lower().startswith(norm + "-") and n.endswith(".dist-info"):
            return n[len(norm) + 1 : -len(".dist-info")]
    return None


def _python_modules(root: str, sites: list[str], warnings: list[str]) -> tuple[dict, ...]:
    wanted = (("pynvml", "nvidia-ml-py", ("pynvml.py", "pynvml/__init__.py")),
              ("nvitop", "nvitop", ("nvitop/__init__.py",)),
              ("nvitop_exporter", "nvitop-exporter", ("nvitop_exporter/__init__.py",)))
    out = []
    for module, dist, rels in wanted:
        for site in sites:
            hit = None
            for rel in rels:
                path = f"{site.rstrip('/')}/{rel}"
                digest = _hash_in_root(root, path, warnings)  # None: not there, or not a regular file
                if digest is None:
                    continue
                hit = {"module": module, "distribution": dist, "path": path, "sha256": digest,
                       "version": _dist_version(root, site, dist),
                       "how": "found in site-packages (import resolution failed)"}
                break
            if hit:
                out.append(hit)
                break
    return tuple(out)


#: the largest module source hashed (nvitop's, pynvml's are under 1 MiB; the file is the container's)
MAX_HASHED_SOURCE = 16 << 20


def _hash_in_root(root: str, path: str, warnings: list[str]) -> str | None:
    try:
        fd = open_in_root(root, path)
    except FileNotFoundError:  # no such file: nothing to hash (other failures are warnings, below)
        return None
    except (OSError, UnsafeContainerPath) as e:
        warnings.append(f"{path}: {e}")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > MAX_HASHED_SOURCE:
            warnings.append(f"{path}: {st.st_size} bytes, over {MAX_HASHED_SOURCE}: not hashed")
            return None
        h = hashlib.sha256()
        left = MAX_HASHED_SOURCE + 1  # a file that grows while it is read stops here too
        while left > 0 and (chunk := os.read(fd, min(1 << 20, left))):
            h.update(chunk)
            left -= len(chunk)
        if left <= 0:
            warnings.append(f"{path}: grew past {MAX_HASHED_SOURCE} bytes while hashed: not hashed")
            return None
        return h.hexdigest()
    finally:
        os.close(fd)


def _resolved_modules(view, root: str, sites: list[str], warnings: list[str]) -> tuple[dict, ...] | None:
    """nvitop / nvitop-exporter / nvidia-ml-py as this process would import them (verify-imports' live mode:
    sys.path[0], PYTHONPATH, .pth files, editable installs), with the verdict against pip's metadata.
    None when that resolution fails (the caller falls back to looking in site-packages).

    :param view: the process as /proc showed it (:func:`process_view_of`), None when it could not be read
    """
    if view is None:
        warnings.append("import resolution: the process's root, cwd or executable could not be read; site-packages "
                        "searched instead")
        return None
    try:
        from ..imports.verify import verify_process

        report = verify_process(view)
    except Exception as e:  # noqa: BLE001 - a snapshot is best effort; the fallback still names files
        warnings.append(f"import resolution of pid {view.pid} failed ({type(e).__name__}: {e}); site-packages "
                        "searched instead")
        return None
    from ..imports.verdict import DIST_OF_MODULE

    out = []
    for c in report.modules:
        if c.module not in DIST_OF_MODULE or c.resolved is None or not c.resolved.file:
            continue
        dist = c.distribution.name if c.distribution else DIST_OF_MODULE[c.module]
        version = c.effective_version or next(
            (v for v in (_dist_version(root, site, dist) for site in sites) if v), None)
        out.append({"module": c.module, "distribution": dist, "path": c.resolved.file,
                    "sha256": _hash_in_root(root, c.resolved.file, warnings), "version": version,
                    "verdict": c.verdict.value, "origin": c.origin.value if c.origin else None, "reason": c.reason,
                    "how": "resolved as CPython does for this process (verify-imports)"})
    return tuple(out)


def _python_info(objects: tuple[MappedObject, ...], exe: str | None, skipped: str | None) -> PythonInfo | None:
    """The interpreter and libpython the process mapped; its modules are looked for by :func:`_python_modules_of`
    (``skipped``: why they are not)."""
    libpy = next((o for o in objects if _LIBPYTHON.search(o.path.rsplit("/", 1)[-1])), None)
    exe_obj = next((o for o in objects if o.path == exe), None)
    version = None
    m = _LIBPYTHON.search(libpy.path.rsplit("/", 1)[-1]) if libpy else (_PYEXE.search(exe) if exe else None)
    if m is not None:
        version = m.group(1)
    if libpy is None and not (exe and "python" in exe.rsplit("/", 1)[-1]):
        return None
    return PythonInfo(
        interpreter=exe, interpreter_build_id=exe_obj.build_id if exe_obj else None,
        libpython=libpy.path if libpy else None, libpython_build_id=libpy.build_id if libpy else None,
        version=version, modules=(), modules_skipped=skipped,
    )


def _python_modules_of(python: PythonInfo, view, root: str, env: dict[str, str], cwd: str | None,
                       warnings: list[str]) -> tuple[dict, ...]:
    sites = _site_dirs(python.interpreter, python.version, env, cwd)
    return _resolved_modules(view, root, sites, warnings) or _python_modules(root, sites, warnings)


def process_view_of(pid: int, raw: RawProcFiles, root: str):
    """The :class:`~forensics.imports.procfs.ProcessView` of what :func:`read_snapshot` read into ``raw`` (no /proc
    read again), its root read at ``root``; None when its root, cwd or executable could not be read."""
    from ..imports.procfs import process_view

    root_seen, cwd, exe = (raw.links.get(k) for k in ("root", "cwd", "exe"))
    if root_seen is None or cwd is None or exe is None:
        return None
    return process_view(pid, root, cmdline=raw.cmdline, environ=raw.environ, root_seen=root_seen, cwd=cwd, exe=exe,
                        maps=decode(raw.files.get("maps", b"")), status=decode(raw.files.get("status", b"")))


def resolve_python_modules(snapshot: Snapshot, raw: RawProcFiles, root: str) -> Snapshot:
    """``snapshot`` with its Python modules looked for (when it is a Python process's and they were not), as the
    process imports them, in the root at ``root``: ``/proc/PID/root``, or ``/proc/self/fd/N`` of a descriptor of it
    held while its mount namespace is held too (the core handler does this after the core, the process gone)."""
    if snapshot.python is None or snapshot.python.modules or snapshot.python.modules_skipped is None:
        return snapshot
    warnings: list[str] = []
    env = parse_environ(raw.environ)
    modules = _python_modules_of(snapshot.python, process_view_of(snapshot.pid, raw, root), root, env,
                                 raw.links.get("cwd"), warnings)
    return dataclasses.replace(snapshot, python=dataclasses.replace(snapshot.python, modules=modules,
                                                                    modules_skipped=None),
                               warnings=snapshot.warnings + tuple(warnings))


def read_snapshot(
    pid: int,
    *,
    host_root: str = "/",
    object_fds: list[tuple[MapEntry, int]] | None = None,
    raw: RawProcFiles | None = None,
    maps_text: str | None = None,
    skip_python_modules: str | None = None,
) -> Snapshot:
    """Read the snapshot of process ``pid``.

    :param host_root: the host's filesystem as this process sees it (``/`` on the node)
    :param object_fds: descriptors from :func:`open_mapped_objects` (opened here when None,
        and closed again)
    :param raw: filled with the /proc files as read, for the bundle
    :param maps_text: ``/proc/PID/maps`` as the caller read it (to open ``object_fds``): not read again
    :param skip_python_modules: None: a Python process's modules are looked for now; else why they are not (the core
        handler looks for them after the core, with :func:`resolve_python_modules`, or not at all)
    :raises ProcessGone: when the process does not exist
    """
    if not os.path.isdir(f"/proc/{pid}"):
        raise ProcessGone(pid)
    warnings: list[str] = []
    texts: dict[str, str] = {}
    for name in _PROC_FILES:
        if name == "maps" and maps_text is not None:
            texts[name] = maps_text
            continue
        try:
            texts[name] = read_proc_text(pid, name, cut=warnings)
        except ProcessGone:
            raise
        except OSError as e:
            warnings.append(f"/proc/{pid}/{name}: {e.strerror or e}")
            texts[name] = ""
    try:
        cmdline_raw = read_proc_text(pid, "cmdline", binary=True, cut=warnings)
        environ_raw = read_proc_text(pid, "environ", binary=True, cut=warnings)
    except OSError as e:
        if isinstance(e, ProcessGone):
            raise
        cmdline_raw, environ_raw = b"", b""
        warnings.append(f"/proc/{pid}/cmdline or environ: {e}")
    comm = _read_small(f"/proc/{pid}/comm")
    exe = _readlink(f"/proc/{pid}/exe")
    cwd = _readlink(f"/proc/{pid}/cwd")
    raw = raw if raw is not None else RawProcFiles()
    for k, v in texts.items():
        raw.files[k] = v.encode(errors="surrogateescape")
    raw.cmdline, raw.environ = cmdline_raw, environ_raw
    raw.links = {"root": _readlink(f"/proc/{pid}/root"), "cwd": cwd, "exe": exe}
    from ..redact import Redactor

    red = Redactor()
    # the bundle's argv and environment show a byte that was not UTF-8 as U+FFFD: its readers write UTF-8 strictly
    args = [for_people(a) for a in parse_cmdline(cmdline_raw)]
    env_plain = {for_people(k): for_people(v) for k, v in parse_environ(environ_raw).items()}
    # secret values first, from the whole argv (``--token VALUE`` is two items) and the environment:
    # then each item is masked wherever such a value appears
    red.learn({"cmdline": args, "environ": env_plain})
    cmdline = tuple(red.text(a) for a in args)
    environ = {k: red.env_value(k, v) for k, v in env_plain.items()}
    ns = {n: _readlink(f"/proc/{pid}/ns/{n}") or "" for n in ("mnt", "pid", "net", "cgroup", "user")}
    # the host's mount namespace: PID 1's (hostPID agent pods see the node's), else our own
    host_ns = _readlink("/proc/1/ns/mnt") or _readlink("/proc/self/ns/mnt")
    in_container = bool(ns["mnt"]) and ns["mnt"] != host_ns
    identity = parse_cgroup(texts["cgroup"])  # read above: not again
    image = read_image_name(identity.container_id, host_root) if identity.container_id else None

    mounts = parse_mountinfo(texts["mountinfo"])
    host_mounts = parse_mountinfo(_read_small("/proc/1/mountinfo", 4 << 20)
                                  or _read_small("/proc/self/mountinfo", 4 << 20) or "")
    own_fds = object_fds is None
    # (the core handler opened them from the maps it parsed: they are not parsed again here)
    fds = open_mapped_objects(pid, parse_maps(texts["maps"]), warnings) if object_fds is None else object_fds
    try:
        objects, nvml_pair = _objects(fds, mounts, host_mounts, in_container)
        nvml = None
        if nvml_pair is not None:
            nvml = _nvml_info(nvml_pair[0], nvml_pair[1], host_root, in_container)
    finally:
        if own_fds:
            for _, fd in fds:
                os.close(fd)
    python = _python_info(objects, exe, skip_python_modules)
    if python is not None and skip_python_modules is None:
        root = f"/proc/{pid}/root"
        python = dataclasses.replace(python, modules=_python_modules_of(
            python, process_view_of(pid, raw, root), root, env_plain, cwd, warnings), modules_skipped=None)
    return Snapshot(
        pid=pid, taken_at=time.time(), comm=comm, exe=exe, cmdline=cmdline, cwd=cwd, environ=environ,
        status=parse_status(texts["status"]), limits=parse_limits(texts["limits"]),
        coredump_filter=texts["coredump_filter"].strip() or None, identity=identity, image=image,
        in_container_namespace=in_container, namespaces=ns, objects=objects, nvml=nvml, python=python,
        warnings=tuple(warnings),
    )


def _objects(fds, mounts, host_mounts, in_container):
    from ..core.nvml import is_nvml

    objects = []
    nvml_pair = None
    index = MountIndex(mounts, host_mounts)
    for m, fd in fds:
        path = m.path[: -len(" (deleted)")] if m.deleted else m.path
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = None
        bid = read_build_id_from_fd(fd)
        mount: MountEntry | None = index.find(path) if mounts else None
        bind_source = None
        injected = False
        if mount is not None and in_container:
            # a mount other than the container's root filesystem that the host also has: a bind mount
            host = index.host_path(mount, path)
            if mount.mount_point != "/" and host is not None:
                bind_source, injected = host, True
        elif mount is not None and mount.is_bind_of_subtree:
            bind_source = index.host_path(mount, path)
            injected = bind_source is not None and bind_source != path
        obj = MappedObject(
            path=path, dev=m.dev, inode=m.inode, size=size, build_id=bid,
            mount_point=mount.mount_point if mount else None, fstype=mount.fstype if mount else None,
            bind_source=bind_source, injected=injected,
        )
        objects.append(obj)
        if nvml_pair is None and is_nvml(path):
            nvml_pair = (obj, fd)
    return tuple(objects), nvml_pair


def _read_small(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace").strip()
    except OSError:  # the snapshot records the field as unknown (None)
        return None


def snapshot_payload(s: Snapshot) -> dict:
    """The snapshot as plain JSON values."""
    return dataclasses.asdict(s)
