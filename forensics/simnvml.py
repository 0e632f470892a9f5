"""The simulated NVML and the NVML reproducers: building them, running them, test stacks.

``reproducers/simnvml/*.c`` is a simulated ``libnvidia-ml.so.1``: a node of GPUs
(8 x "NVIDIA H20", driver 580.126.09 by default) on which the real nvidia-ml-py,
nvitop and nvitop-exporter run unchanged on a CPU-only machine, with faults
switched on by environment (:data:`SIM_ENV`).  :func:`build_simnvml` compiles it
into the layout of a real driver install (``libnvidia-ml.so.<driver>`` plus the
``libnvidia-ml.so.1`` link), so a core names the versioned file.

``reproducers/nvml_nvlink_fieldvalues.{py,c}`` are the minimal reproducers an
upstream maintainer runs on a real GPU node; :func:`build_c_reproducer` compiles
the C one.  Both build for this machine or, with ``arch="aarch64"``, for an arm64 node
(Grace Hopper / Grace Blackwell) with Debian's cross compiler ``aarch64-linux-gnu-gcc``;
:func:`guest_command` runs such a build here under ``qemu-aarch64-static -L <arm64 root>``.
:func:`ensure_stack_venv` installs the PyPI stacks of the incident and of today into
cached virtual environments.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .cache import cache_dir
from .errors import BuildError
from .resources import REPRODUCER_FILES, find_reproducers
from .subproc import run_bounded

__all__ = [
    "DEFAULT_DRIVER",
    "FAULTS",
    "SIM_ENV",
    "STACKS",
    "ARCHES",
    "arch_name",
    "build_c_reproducer",
    "build_simnvml",
    "elf_arch",
    "guest_analysis_root",
    "guest_command",
    "guest_program",
    "host_arch",
    "default_cache_dir",
    "ensure_stack_venv",
    "sim_environment",
    "seed_binding_fault",
    "DETECT",
]

DEFAULT_DRIVER = "580.126.09"

#: The faults ``FORENSICS_SIMNVML_FAULT`` accepts.
FAULTS = ("none", "heap", "heap-delayed", "overflow", "segv", "use-after-shutdown")

#: When glibc gets to see a write past the caller's array (``FORENSICS_SIMNVML_DETECT``).
DETECT = ("later", "call")

#: Every environment variable the simulated library reads (at ``nvmlInit``), with its
#: default and meaning.
SIM_ENV: dict[str, tuple[str, str]] = {
    "FORENSICS_SIMNVML_GPUS": ("8", "number of GPUs (0-64)"),
    "FORENSICS_SIMNVML_NAME": ("NVIDIA H20", "product name of every GPU"),
    "FORENSICS_SIMNVML_DRIVER": (DEFAULT_DRIVER, "driver version (nvmlSystemGetDriverVersion)"),
    "FORENSICS_SIMNVML_NVML_VERSION": ("13.580.126", "NVML version (nvmlSystemGetNVMLVersion)"),
    "FORENSICS_SIMNVML_CUDA": ("13000", "CUDA driver version as an int (13000 = 13.0)"),
    "FORENSICS_SIMNVML_FAULT": (
        "none",
        "none | heap (glibc aborts inside nvmlDeviceGetFieldValues) | heap-delayed (writes over the "
        "header of the caller's field-value array; glibc aborts at the caller's later free) | overflow "
        "(writes FORENSICS_SIMNVML_OVERFLOW_BYTES of 'OVERRUN!' past the end of the caller's array, after "
        "the count records it was asked for: the driver's bug) | segv (bad pointer write) | "
        "use-after-shutdown (a query racing nvmlShutdown crashes with SIGSEGV)",
    ),
    "FORENSICS_SIMNVML_FAULT_AFTER": ("0", "eligible nvmlDeviceGetFieldValues calls that succeed before the fault"),
    "FORENSICS_SIMNVML_HEAP_MESSAGE": (
        "prev",
        "prev -> 'double free or corruption (!prev)'; next-size -> 'free(): invalid next size (normal)'",
    ),
    "FORENSICS_SIMNVML_FAULT_THREAD": ("any",
                                       "any | non-main: fault only in calls from threads other than the main one"),
    "FORENSICS_SIMNVML_OVERFLOW_BYTES": ("24", "the overflow fault: bytes written past the caller's array (1-4096)"),
    "FORENSICS_SIMNVML_DETECT": (
        "later",
        "later: glibc notices a write past the caller's array when the caller frees it | call: before "
        "returning, the library frees the chunk after the array, so glibc aborts while the call (and the "
        "caller's frame with the array and the count) is on the stack",
    ),
    "FORENSICS_SIMNVML_NVLINKS": ("18", "NVLinks per GPU (NVML_FI_DEV_NVLINK_LINK_COUNT, 0-18), or 'error': that "
                                        "field fails"),
}

#: pip install steps of the PyPI stacks, in order (nvitop 1.5.0 declares
#: nvidia-ml-py < 12.571, so the incident's binding goes in over it, as it did in production).
STACKS: dict[str, tuple[tuple[str, ...], ...]] = {
    "incident": (("nvitop==1.5.0", "nvitop-exporter==1.5.0"), ("nvidia-ml-py==12.575.51",)),
    "current": (("nvitop==1.7.2", "nvitop-exporter==1.7.2", "nvidia-ml-py==13.580.126"),),
}

#: the architectures the simulated NVML and the C reproducer build for: ELF e_machine, the cross compiler
#: (Debian's gcc-<triplet>, used when the machine is another), the qemu-user emulator that runs a build here
ARCHES: dict[str, tuple[int, str, str]] = {
    "x86_64": (62, "x86_64-linux-gnu-gcc", "qemu-x86_64-static"),
    "aarch64": (183, "aarch64-linux-gnu-gcc", "qemu-aarch64-static"),
}
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_arch() -> str:
    """This machine's architecture in :data:`ARCHES`' words (``os.uname().machine``)."""
    machine = os.uname().machine
    return _ARCH_ALIASES.get(machine, machine)


def arch_name(arch: str | None) -> str:
    """``arch`` checked and normalised (``arm64`` -> ``aarch64``); None: this machine's."""
    name = host_arch() if arch is None else _ARCH_ALIASES.get(arch, arch)
    if name not in ARCHES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHES)} (or arm64, amd64)")
    return name


def elf_arch(path: str | Path) -> str | None:
    """The architecture an ELF file was built for (:data:`ARCHES`' words), None when it is not a 64-bit
    little-endian ELF file of one of them (or cannot be read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:6] != b"\x7fELF\x02\x01":
        return None
    machine = int.from_bytes(head[18:20], "little")
    return next((name for name, (em, _, _) in ARCHES.items() if em == machine), None)


def _gcc(arch: str | None = None) -> str:
    """The C compiler for ``arch``: ``$CC`` or gcc for this machine, the cross compiler for another."""
    name = arch_name(arch)
    if name == host_arch():
        gcc = shutil.which(os.environ.get("CC") or "gcc")
        if gcc is None:
            raise BuildError("the simulated NVML", "gcc not found on PATH")
        return gcc
    cross = ARCHES[name][1]
    gcc = shutil.which(cross)
    if gcc is None:
        raise BuildError("the simulated NVML", f"{cross} not found on PATH (Debian: apt-get install "
                                               f"gcc-{cross.removesuffix('-gcc')})")
    return gcc


def guest_program(path: str, sysroot: str | Path) -> str:
    """The file here that a program path of the guest names: ``/usr/bin/python3.11`` of an arm64 root is
    ``<root>/usr/bin/python3.11`` (resolved inside the root one component at a time, its symlinks too);
    a path already inside the root, or one the root lacks, is returned as it is.  qemu-user loads a program
    from the host's path, its libraries and loader from the root (``-L``)."""
    from .rootpath import resolve_in_root

    root = os.path.abspath(sysroot)
    if not os.path.isabs(path) or path == root or path.startswith(root.rstrip("/") + "/"):
        return path
    try:
        inside = resolve_in_root(root, path)
    except OSError:
        return path
    return os.path.join(root, inside.lstrip("/"))


#: files of a root hard-linked into an analysis root, at most (a Debian root with CPython: about 2,000)
MAX_ROOT_FILES = 200_000
#: entries of one directory added beside a root's files (a driver directory: a handful)
MAX_DIR_ENTRIES = 256
_ANALYSIS_MARKER = ".forensics-analysis-root"


def guest_analysis_root(sysroot: str | Path, dest: str | Path, *, files: tuple[Path, ...] = (),
                        dirs: tuple[Path, ...] = ()) -> Path:
    """The root to analyze a guest core with: ``sysroot`` hard-linked into ``dest`` (made once, never
    written into ``sysroot``), plus ``files`` and the entries of ``dirs`` at their own absolute paths inside
    it -- the programs and libraries qemu-user loaded from this machine's paths (``-L`` falls back to them),
    which a core names at those paths.  A path whose parent inside ``dest`` is a symlink is left out (it
    could lead out of ``dest``).

    :raises OSError: when the tree cannot be hard-linked (another filesystem) or holds more than
        :data:`MAX_ROOT_FILES` files
    """
    dest = Path(dest)
    if not (dest / _ANALYSIS_MARKER).is_file():
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
        for old in (tmp, dest):
            if old.is_symlink() or old.is_file():
                old.unlink()
            elif old.exists():
                shutil.rmtree(old)
        try:
            _link_tree(Path(sysroot), tmp)
            (tmp / _ANALYSIS_MARKER).write_text(str(Path(sysroot).resolve()) + "\n")
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    extra = list(files)
    for d in dirs:
        extra.extend(sorted(d.iterdir())[:MAX_DIR_ENTRIES] if d.is_dir() else ())
    for f in extra:
        _place(dest, Path(os.path.abspath(f)))
    return dest


def _link_tree(src: Path, dst: Path) -> None:
    count = 0
    for top, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(top, src)
        target = dst if rel == "." else dst / rel
        target.mkdir(parents=True, exist_ok=True)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(top, d))]:
            count += 1
            if count > MAX_ROOT_FILES:
                raise OSError(f"{src} holds more than {MAX_ROOT_FILES} files")
            path = os.path.join(top, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), target / name)
            elif os.path.isfile(path):
                os.link(path, target / name)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(top, d))]


def _place(dest: Path, path: Path) -> None:
    """``path`` (a file or a symlink of this machine) at ``dest``/``path``: hard-linked, else copied."""
    parts = path.relative_to("/").parts
    where = dest
    for part in parts[:-1]:
        where = where / part
        if where.is_symlink():
            return
        where.mkdir(exist_ok=True)
    target = where / parts[-1]
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        return
    if path.is_symlink():
        os.symlink(os.readlink(path), target)
    elif path.is_file():
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def guest_command(cmd: list[str], arch: str | None, sysroot: str | Path | None) -> list[str]:
    """``cmd`` as it runs here: unchanged for this machine's architecture, else under the architecture's
    qemu-user emulator, which loads the program's libraries (and its interpreter) from ``sysroot`` first
    (``-L``).  The emulator is named explicitly: binfmt_misc is often not mounted (containers, CI).

    :raises BuildError: when the emulator is not installed, or another architecture comes without a root
    """
    name = arch_name(arch)
    if name == host_arch():
        return list(cmd)
    qemu = shutil.which(ARCHES[name][2])
    if qemu is None:
        raise BuildError(f"a {name} program", f"{ARCHES[name][2]} not found on PATH (Debian: qemu-user-static)")
    if sysroot is None:
        raise BuildError(f"a {name} program", f"a {name} root is needed to run it here (its C library and loader)")
    return [qemu, "-L", str(sysroot), *cmd]


def _newest_mtime(paths: list[Path]) -> float:
    return max(p.stat().st_mtime for p in paths)


def _compile(what: str, cmd: list[str], target: Path) -> None:
    """Run gcc writing ``cmd``'s output to a temporary name, then rename it onto ``target``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        # its own session, killed with its compiler passes when we are stopped (SIGTERM reaches only us)
        proc = run_bounded(cmd + ["-o", tmp], timeout=300)
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
            raise BuildError(what, f"gcc exited {proc.returncode}: {first}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except OSError as e:
        raise BuildError(what, str(e)) from e
    except subprocess.TimeoutExpired as e:
        raise BuildError(what, "gcc timed out") from e
    except subprocess.SubprocessError as e:  # OutputTooLarge: it wrote past the bound on standard output
        raise BuildError(what, str(e)) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _replace_symlink(link: Path, target_name: str) -> None:
    if link.is_symlink() and os.readlink(link) == target_name:
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)


def build_simnvml(out_dir: str | Path, *, force: bool = False, arch: str | None = None) -> Path:
    """Compile the simulated NVML into ``out_dir`` and return that directory (for LD_LIBRARY_PATH).

    The library is ``out_dir/libnvidia-ml.so.<driver>`` (driver from
    ``FORENSICS_SIMNVML_DRIVER``, default 580.126.09) with soname ``libnvidia-ml.so.1``
    and the link ``out_dir/libnvidia-ml.so.1`` to it, as a driver install lays them out.
    It is rebuilt only when a source is newer than it, it was built for another architecture
    (or ``force``), atomically.

    :param out_dir: directory to build into; created if missing.
    :param force: rebuild even when up to date.
    :param arch: ``x86_64`` or ``aarch64`` (``amd64``/``arm64`` too); None: this machine's.  Another
        than this machine's is built with its cross compiler (:data:`ARCHES`).
    :return: ``out_dir`` as an absolute path.
    :raises BuildError: when gcc (or the cross compiler) is missing or fails.
    :raises ValueError: for an unknown architecture.

    >>> lib_dir = build_simnvml("/tmp/simnvml")           # doctest: +SKIP
    >>> sorted(p.name for p in lib_dir.iterdir())         # doctest: +SKIP
    ['libnvidia-ml.so.1', 'libnvidia-ml.so.580.126.09']
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    src_dir = find_reproducers() / "simnvml"
    sources = sorted(src_dir.glob("*.c"))
    if not sources:
        raise BuildError("the simulated NVML", f"no C sources in {src_dir}")
    driver = os.environ.get("FORENSICS_SIMNVML_DRIVER") or DEFAULT_DRIVER
    target = out / f"libnvidia-ml.so.{driver}"
    deps = sources + sorted(src_dir.glob("*.h"))
    name = arch_name(arch)
    if force or not target.exists() or target.stat().st_mtime < _newest_mtime(deps) or elf_arch(target) != name:
        cmd = [_gcc(name), "-O1", "-g", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden",
               "-Wl,-soname,libnvidia-ml.so.1", *map(str, sources), "-lm", "-lpthread"]
        _compile("the simulated NVML (libnvidia-ml.so.1)", cmd, target)
    _replace_symlink(out / "libnvidia-ml.so.1", target.name)
    return out


def build_c_reproducer(out_dir: str | Path, nvml_dir: str | Path | None = None, *, arch: str | None = None) -> Path:
    """Compile ``reproducers/nvml_nvlink_fieldvalues.c`` into ``out_dir`` and return the binary.

    The binary ``dlopen``\\ s ``libnvidia-ml.so.1`` at run time, so it uses whatever the
    loader finds (LD_LIBRARY_PATH first).  ``nvml_dir`` is recorded as a DT_RUNPATH, a
    fallback that LD_LIBRARY_PATH still overrides.

    :param out_dir: directory to build into; created if missing.
    :param nvml_dir: optional fallback directory holding libnvidia-ml.so.1.
    :param arch: as :func:`build_simnvml`'s (None: this machine's).
    :return: path of the ``nvml_nvlink_fieldvalues`` executable.
    :raises BuildError: when gcc (or the cross compiler) is missing or fails.
    :raises ValueError: for an unknown architecture.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    src = find_reproducers() / REPRODUCER_FILES["c"]
    target = out / "nvml_nvlink_fieldvalues"
    stamp = out / ".nvml_nvlink_fieldvalues.runpath"
    runpath = str(Path(nvml_dir).resolve()) if nvml_dir else ""
    name = arch_name(arch)
    stale = not target.exists() or target.stat().st_mtime < src.stat().st_mtime or elf_arch(target) != name
    if stale or not stamp.exists() or stamp.read_text() != runpath:
        cmd = [_gcc(name), "-O1", "-g", "-Wall", str(src), "-ldl", "-lpthread"]
        if runpath:
            cmd.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
        _compile("the C reproducer (nvml_nvlink_fieldvalues)", cmd, target)
        stamp.write_text(runpath)
    return target


def sim_environment(
    lib_dir: str | Path,
    *,
    fault: str = "none",
    fault_after: int = 0,
    heap_message: str = "prev",
    fault_thread: str = "any",
    gpus: int | None = None,
    nvlinks: str | None = None,
    overflow_bytes: int | None = None,
    detect: str = "later",
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """An environment that runs a process on the simulated node.

    ``lib_dir`` goes first on LD_LIBRARY_PATH; every ``FORENSICS_SIMNVML_*`` not given is
    removed, so the library's defaults apply.

    :param lib_dir: the directory :func:`build_simnvml` returned.
    :param nvlinks: what NVML_FI_DEV_NVLINK_LINK_COUNT reports (``"0"``-``"18"``, or ``"error"``)
    :param overflow_bytes: the ``overflow`` fault's length past the caller's array (1-4096)
    :param detect: ``later`` or ``call``: when glibc sees a write past the caller's array
    :param base: environment to start from (default: ``os.environ``).
    :raises ValueError: for an unknown fault, heap message, thread filter or detection, or a bad length.

    >>> sim_environment("/tmp/sim", fault="heap", base={})["FORENSICS_SIMNVML_FAULT"]
    'heap'
    """
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    if heap_message not in ("prev", "next-size"):
        raise ValueError(f"unknown heap message {heap_message!r}; choose prev or next-size")
    if fault_thread not in ("any", "non-main"):
        raise ValueError(f"unknown fault thread {fault_thread!r}; choose any or non-main")
    if detect not in DETECT:
        raise ValueError(f"unknown detection {detect!r}; choose {' or '.join(DETECT)}")
    if overflow_bytes is not None and not 1 <= overflow_bytes <= 4096:
        raise ValueError(f"overflow_bytes {overflow_bytes} is outside 1-4096")
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("FORENSICS_SIMNVML_")}
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = str(lib_dir) + (os.pathsep + old if old else "")
    env["FORENSICS_SIMNVML_FAULT"] = fault
    env["FORENSICS_SIMNVML_FAULT_AFTER"] = str(fault_after)
    env["FORENSICS_SIMNVML_HEAP_MESSAGE"] = heap_message
    env["FORENSICS_SIMNVML_FAULT_THREAD"] = fault_thread
    if gpus is not None:
        env["FORENSICS_SIMNVML_GPUS"] = str(gpus)
    if nvlinks is not None:
        env["FORENSICS_SIMNVML_NVLINKS"] = str(nvlinks)
    if overflow_bytes is not None:
        env["FORENSICS_SIMNVML_OVERFLOW_BYTES"] = str(overflow_bytes)
    env["FORENSICS_SIMNVML_DETECT"] = detect
    return env


#: the line of nvidia-ml-py's nvmlDeviceGetFieldValues that passes the count (12.x and 13.x)
_BINDING_COUNT_CALL = "ret = fn(handle, c_int32(len(fieldIds)), byref(values))"


def seed_binding_fault(python: str | Path, out_dir: str | Path, excess: int) -> Path:
    """A copy of the binding ``python`` imports (nvidia-ml-py's ``pynvml.py``) whose
    ``nvmlDeviceGetFieldValues`` passes ``len(fieldIds) + excess`` as the count of an array of
    ``len(fieldIds)`` entries, for queries of more than one field -- the binding's bug, seeded into
    the real binding's code.

    Put the returned directory first on PYTHONPATH: ``import pynvml`` then finds the copy,
    nvitop and nvitop-exporter included; the library fills the count records it is asked for,
    past the end of the array.

    :param python: the interpreter (a stack venv's) whose ``pynvml`` is copied
    :param out_dir: where ``pynvml.py`` is written
    :param excess: entries the count claims beyond the array (1-64)
    :return: ``out_dir``
    :raises ValueError: for an excess outside 1-64
    :raises BuildError: when the binding cannot be found or its count call is not the expected one
    """
    if not 1 <= excess <= 64:
        raise ValueError(f"excess {excess} is outside 1-64")
    what = "the seeded binding fault (pynvml.py)"
    try:
        proc = subprocess.run([str(python), "-c", "import pynvml; print(pynvml.__file__)"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(what, f"{python}: {e}") from e
    if proc.returncode != 0:
        raise BuildError(what, f"{python} cannot import pynvml: {proc.stderr.strip()[-300:]}")
    source = Path(proc.stdout.strip()).read_text()
    start = source.find("\ndef nvmlDeviceGetFieldValues(")
    end = source.find("\ndef ", start + 1)
    if start < 0 or source.count(_BINDING_COUNT_CALL, start, end) != 1:
        raise BuildError(what, f"{proc.stdout.strip()}: nvmlDeviceGetFieldValues does not pass the count as "
                               f"{_BINDING_COUNT_CALL!r}")
    # multi-field queries only: a one-field array (the link count) is pymalloc's, not a malloc chunk, and
    # writing past it would corrupt a neighbouring Python object instead of the heap under test
    body = source[start:end].replace(
        _BINDING_COUNT_CALL,
        f"ret = fn(handle, c_int32(len(fieldIds) + ({excess} if len(fieldIds) > 1 else 0)), byref(values))")
    seeded = source[:start] + body + source[end:]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pynvml.py").write_text(seeded)
    return out


def default_cache_dir() -> Path:
    """forensics' cache directory (see :func:`forensics.cache.cache_dir`)."""
    return cache_dir()


def ensure_stack_venv(name: str, cache_dir: str | Path | None = None) -> Path:
    """Create (once) a virtual environment holding one PyPI stack and return its python.

    ``incident``: nvitop 1.5.0 + nvitop-exporter 1.5.0, then nvidia-ml-py 12.575.51 over
    them.  ``current``: nvitop 1.7.2 + nvitop-exporter 1.7.2 + nvidia-ml-py 13.580.126.
    The venv lives in ``<cache>/venvs/<name>``; it is complete once its
    ``forensics-stack.json`` records the pins, and is rebuilt when the pins change.

    :param name: ``"incident"`` or ``"current"``.
    :param cache_dir: default :func:`default_cache_dir`.
    :return: path of the venv's ``bin/python``.
    :raises ValueError: for an unknown stack name.
    :raises BuildError: when the venv or pip fails (for instance with no access to PyPI).
    """
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r}; choose one of {', '.join(STACKS)}")
    steps = STACKS[name]
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    venvs = root / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    venv = venvs / name
    python = venv / "bin" / "python"
    marker = venv / "forensics-stack.json"
    wanted = {"stack": name, "steps": [list(s) for s in steps]}
    with open(venvs / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.exists() and json.loads(marker.read_text()) == wanted and python.exists():
                return python
        except (OSError, ValueError):
            pass
        if venv.exists():
            shutil.rmtree(venv)
        what = f"the {name} stack venv ({venv})"
        _run_build(what, [_base_python(), "-m", "venv", str(venv)])
        for step in steps:
            _run_build(what, [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *step])
        marker.write_text(json.dumps(wanted, indent=1) + "\n")
    return python


def _base_python() -> str:
    """An interpreter to make venvs with: this one (``-m venv`` from a venv uses its base)."""
    return sys.executable or shutil.which("python3") or "python3"


def _run_build(what: str, cmd: list[str]) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(what, f"{cmd[0]}: {e}") from e
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
        raise BuildError(what, f"{' '.join(cmd[1:4])} exited {proc.returncode}: {' '.join(lines)[:400]}")
