"""Read an x86-64 or AArch64 Linux ELF core file without gdb.

:func:`open_core` turns a core into a :class:`~forensics.model.CoreFile`: the
machine (:mod:`.arch`: the ELF header's e_machine chooses the register layout), the
threads and their registers (NT_PRSTATUS), the signal (NT_SIGINFO), the command
line (NT_PRPSINFO), the executable (NT_AUXV, NT_FILE), every mapping (PT_LOAD +
NT_FILE; a core without NT_FILE, as qemu-user writes them, from the dynamic
linker's link_map in its memory, :mod:`.linkmap`), AArch64's pointer-authentication
mask (NT_ARM_PAC_MASK), every mapped ELF object with its build-id checked against the file
that would be used to read it, the NVML library, and glibc's abort message.
:class:`CoreMemory` reads the process's memory for later stages; it maps the
file and never reads it whole.  :func:`resolve_file` finds the file for an
object the core names (with a sysroot) for the gdb layer.

Submodules: :mod:`.elf` (pure note parsers), :mod:`.memory` (the reader),
:mod:`.image` (an ELF object in memory or on disk), :mod:`.buildid`,
:mod:`.files` (sysroot resolution), :mod:`.libc` (abort message), :mod:`.nvml`.
"""
from __future__ import annotations

import bisect
import contextlib
import os
from dataclasses import replace
from collections.abc import Sequence

from forensics.core import arch, elf, linkmap
from forensics.core.argv import read_argv
from forensics.core.buildid import read_build_id_from_file, read_build_id_in_memory
from forensics.core.files import classify_library, real_name_in_sysroot, resolve_file
from forensics.core.libc import find_abort_message
from forensics.core.memory import CoreLayout, CoreMemory, MemoryNotInCore
from forensics.core.nvml import find_nvml
from forensics.errors import CoreReadError, InputNotFound, InputUnreadable
from forensics.model import CoreFile, CoreThread, Library, Mapping, SigInfo

__all__ = [
    "open_core",
    "open_core_memory",
    "CoreMemory",
    "MemoryNotInCore",
    "resolve_file",
    "read_build_id_from_file",
    "read_build_id_in_memory",
]

_MAX_EXECFN = 4096
_AT_HWCAP, _HWCAP_PACA = 16, 1 << 30  # AArch64: the CPU authenticates addresses (arch/arm64/include/uapi/asm/hwcap.h)


def open_core(path: str, *, sysroot: str | None = None, exe: str | None = None) -> CoreFile:
    """Read what a core file says about the crashed process.

    The file is opened once and memory-mapped; only the notes, the first page of
    each mapped object and the few words needed are read.  A truncated core is
    read as far as it goes (``truncated=True``).

    :param path: the core file
    :param sysroot: the crashed machine's filesystem, unpacked here; objects are
        looked up under it (see :func:`resolve_file`)
    :param exe: the executable file to use instead of the one the core names
    :return: the :class:`~forensics.model.CoreFile`
    :raises InputNotFound: when ``path``, ``sysroot`` or ``exe`` does not exist
    :raises InputUnreadable: when one of them may not be read by this user (permission denied)
    :raises NotACoreFile: when ``path`` is a directory, empty, compressed, text, or an ELF program
    :raises UnsupportedTarget: when it is the core of another machine or of a 32-bit process
    :raises CoreReadError: when it cannot be read or ends before its notes
    """
    core, mem = open_core_memory(path, sysroot=sysroot, exe=exe)
    mem.close()
    return core


def open_core_memory(path: str, *, sysroot: str | None = None,
                     exe: str | None = None) -> tuple[CoreFile, CoreMemory]:
    """:func:`open_core`'s record and the core's memory, still open, for the readers of one analysis (the
    caller closes it): the file is mapped and its headers and notes parsed once for all of them.

    :raises ForensicsError: as :func:`open_core`
    """
    path = os.fspath(path)
    if sysroot is not None:
        _check_input(os.fspath(sysroot), directory=True, what="--sysroot")
    if exe is not None:
        _check_input(os.fspath(exe), directory=False, what="--exe")
    mem = CoreMemory.open(path)
    try:
        layout = mem.layout
        assert layout is not None
        return _build(path, mem, layout, sysroot=sysroot, exe=exe), mem
    except BaseException:
        mem.close()
        raise


def _check_input(path: str, *, directory: bool, what: str) -> None:
    """``path`` exists as a directory (or a file) this user may read; a denied lookup is said as such,
    never as a missing file (``/proc/1/root`` without ptrace rights)."""
    import stat

    try:
        st = os.stat(path)
    except PermissionError as e:
        raise InputUnreadable(path) from e
    except (FileNotFoundError, NotADirectoryError) as e:
        raise InputNotFound(path, hint=f"{what} takes an existing {'directory' if directory else 'file'}") from e
    except OSError as e:
        raise InputUnreadable(path, e.strerror or str(e)) from e
    if directory != stat.S_ISDIR(st.st_mode):
        raise InputNotFound(path, hint=f"{what} takes a {'directory' if directory else 'file'}, not a "
                                       f"{'file' if directory else 'directory'}")
    if not os.access(path, os.R_OK | (os.X_OK if directory else 0)):
        raise InputUnreadable(path)


def _build(path: str, mem: CoreMemory, layout: CoreLayout, *, sysroot: str | None, exe: str | None) -> CoreFile:
    threads: list[CoreThread] = []
    psinfo: elf.PsInfo | None = None
    siginfo: SigInfo | None = None
    auxv: dict[int, int] = {}
    auxv_raw = b""
    problems = list(layout.problems)
    spec = layout.spec
    pac_mask: int | None = None
    for note in layout.notes:
        if note.name == b"LINUX" and note.type == elf.NT_ARM_PAC_MASK and spec.link_register and pac_mask is None:
            try:
                pac_mask = elf.parse_pac_mask(note.desc)[1]
            except ValueError as e:
                problems.append(f"malformed note, left out: {e}")
        if note.name != b"CORE":
            continue
        try:
            if note.type == elf.NT_PRSTATUS:
                threads.append(elf.parse_prstatus(note.desc, spec))
            elif note.type == elf.NT_PRPSINFO and psinfo is None:
                psinfo = elf.parse_prpsinfo(note.desc)
            elif note.type == elf.NT_SIGINFO and siginfo is None:
                siginfo = elf.parse_siginfo(note.desc)
            elif note.type == elf.NT_AUXV and not auxv:
                auxv = elf.parse_auxv(note.desc)
                auxv_raw = elf.auxv_vector(note.desc)
        except ValueError as e:
            # one malformed note costs what it holds, not the rest of the core: read on, partial
            problems.append(f"malformed note, left out: {e}")
    if not threads:
        raise CoreReadError(path, "no readable NT_PRSTATUS note: the core holds no thread's registers"
                            + (f" ({'; '.join(problems)})" if problems else ""))

    mappings_from = "NT_FILE"
    loaded_as: dict[str, str] = {}
    if not any(n.type == elf.NT_FILE and n.name == b"CORE" for n in layout.notes):
        layout, mappings_from, found, loaded_as = _named_by_link_map(mem, layout, auxv, sysroot=sysroot, exe=exe)
        problems += found
    mappings = _mappings(layout)
    exe_path = _executable_path(mem, layout, auxv)
    libraries = _libraries(mem, layout, exe_path, sysroot=sysroot, exe=exe, loaded_as=loaded_as)
    exe_lib = next((lib for lib in libraries if lib.path == exe_path), None)
    pid = psinfo.pid if psinfo is not None else (threads[0].tid if threads else 0)
    args, args_cut = _command_line(mem, auxv, auxv_raw, psinfo)
    return CoreFile(
        path=path,
        size=layout.size,
        pid=pid,
        command=psinfo.command if psinfo is not None else "",
        args=args,
        args_cut=args_cut,
        executable=exe_path,
        build_id=exe_lib.build_id if exe_lib is not None else None,
        signal=siginfo,
        threads=tuple(threads),
        mappings=mappings,
        libraries=libraries,
        nvml=find_nvml(mem, mappings, libraries),
        abort_message=find_abort_message(mem, libraries, layout.page_size, mappings),
        truncated=layout.truncated,
        expected_size=layout.expected_size,
        mtime=_mtime(path),
        problems=tuple(problems),
        arch=spec.arch,
        mappings_from=mappings_from,
        code_address_mask=arch.strip_code_address(spec, 0xFFFF_FFFF_FFFF_FFFF, pac_mask),
        pac_mask_missing=bool(spec.link_register) and pac_mask is None and bool(auxv.get(_AT_HWCAP, 0) & _HWCAP_PACA),
    )


def _named_by_link_map(mem: CoreMemory, layout: CoreLayout, auxv: dict[int, int], *, sysroot: str | None,
                       exe: str | None) -> tuple[CoreLayout, str, tuple[str, ...], dict[str, str]]:
    """A core without NT_FILE (qemu-user's): its mappings named from the dynamic linker's list in its memory
    (:mod:`.linkmap`), the memory reader told of them; what could not be read is a problem (partial).  With a
    sysroot each object is named by its file's own name there (:func:`_real_names`), as NT_FILE names it.

    :return: (the layout with those mappings, where the names came from, the problems, the file's name ->
              the name it was loaded by, for those that differ)
    """
    execfn = auxv.get(elf.AT_EXECFN)
    executable = None
    if execfn:
        with contextlib.suppress(MemoryNotInCore):
            executable = mem.read_cstring(execfn, _MAX_EXECFN).decode("utf-8", "surrogateescape") or None

    def file_of(path: str) -> str | None:
        return exe if exe is not None and path == executable else resolve_file(path, sysroot, None)[0]

    def file_phdrs(path: str) -> tuple[elf.ProgramHeader, ...] | None:
        found = file_of(path)
        return linkmap.read_file_phdrs(found, layout.machine) if found else None

    exe_file = file_of(executable) if executable else None
    link_map = linkmap.find_link_map(mem, auxv, file_phdrs(executable) if executable else None)
    page = auxv.get(elf.AT_PAGESZ, layout.page_size)
    if page not in (4096, 16384, 65536):
        page = layout.page_size
    files, problems = linkmap.link_map_file_mappings(mem, link_map, auxv, executable, page, file_phdrs,
                                                     linkmap.read_file_interp(exe_file, layout.machine)
                                                     if exe_file else None)
    lead = "no NT_FILE note; the dynamic linker's list" + (" could not be read" if not files else "")
    said = tuple(f"{lead}: {p}" for p in (*link_map.problems, *problems))
    real = _real_names(files, sysroot)
    mem.with_file_mappings(tuple(replace(f, path=real.get(f.path, f.path)) for f in files))
    assert mem.layout is not None
    mem.layout = replace(mem.layout, page_size=page)
    return mem.layout, ("link_map" if files else ""), said, {v: k for k, v in real.items()}


def _real_names(files: Sequence[elf.FileMapping], sysroot: str | None) -> dict[str, str]:
    """The name link_map gives -> the file's own name in ``sysroot``, for those that differ.

    The dynamic linker names an object as it was asked for it (``dlopen("libnvidia-ml.so.1")`` found on its
    search path is ``.../libnvidia-ml.so.1``), the kernel's NT_FILE by the file it mapped
    (``libnvidia-ml.so.580.126.09``: the driver's version is in that name).  The link is resolved inside the
    sysroot only (:func:`~forensics.core.files.real_name_in_sysroot`); without one, or when the name is not
    there, it stays as loaded.
    """
    if sysroot is None:
        return {}
    out: dict[str, str] = {}
    for name in dict.fromkeys(f.path for f in files):
        if name.startswith("/"):  # not [vdso]
            real = real_name_in_sysroot(sysroot, name)
            if real is not None and real != name:
                out[name] = real
    return out


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


#: pr_psargs keeps at most this many characters of the command line (ELF_PRARGSZ 80, less its NUL)
_PSARGS_MAX = 79


def _command_line(mem: CoreMemory, auxv: dict[int, int], auxv_raw: bytes,
                  psinfo: elf.PsInfo | None) -> tuple[str, bool]:
    """The whole command line from the stack; NT_PRPSINFO's first 80 bytes when the stack does not hold it
    (a truncated core) -- and whether that copy is cut (it is as long as the kernel keeps)."""
    short = psinfo.args if psinfo is not None else ""
    cut = psinfo is not None and (psinfo.args_full or len(short) >= _PSARGS_MAX)
    execfn = auxv.get(elf.AT_EXECFN)
    argv = read_argv(mem, auxv_raw, execfn) if execfn else None
    if not argv:
        return short, cut
    full = " ".join(argv)
    # the stack is the process's own memory; keep it only when it agrees with the kernel's copy
    return (full, False) if full.startswith(short) or short.startswith(full) else (short, cut)


def _mappings(layout: CoreLayout) -> tuple[Mapping, ...]:
    files = sorted(layout.file_mappings, key=lambda f: f.start)
    starts = [f.start for f in files]
    out = []
    for p in layout.phdrs:
        if p.type != elf.PT_LOAD:
            continue
        i = bisect.bisect_right(starts, p.vaddr) - 1
        backing = files[i] if i >= 0 and files[i].contains(p.vaddr) else None
        out.append(
            Mapping(
                start=p.vaddr,
                end=p.vaddr + p.memsz,
                offset=backing.offset + (p.vaddr - backing.start) if backing else 0,
                perms=elf.format_perms(p.flags),
                path=backing.path if backing else None,
                in_core=max(0, min(p.filesz, layout.size - p.offset)),
            )
        )
    return tuple(out)


def _executable_path(mem: CoreMemory, layout: CoreLayout, auxv: dict[int, int]) -> str | None:
    """The main program: the NT_FILE mapping holding AT_PHDR / AT_ENTRY, else AT_EXECFN, else the first file."""
    for key in (elf.AT_PHDR, elf.AT_ENTRY):
        addr = auxv.get(key)
        if addr:
            for f in layout.file_mappings:
                if f.contains(addr):
                    return f.path
    execfn = auxv.get(elf.AT_EXECFN)
    if execfn:
        try:
            name = mem.read_cstring(execfn, _MAX_EXECFN)
        except MemoryNotInCore:
            name = b""
        if name:
            return name.decode("utf-8", errors="surrogateescape")
    return layout.file_mappings[0].path if layout.file_mappings else None


def _object_bases(layout: CoreLayout) -> dict[str, tuple[int, Sequence[elf.FileMapping]]]:
    """path -> (lowest start of a mapping at file offset 0, all its mappings), in address order."""
    by_path: dict[str, list[elf.FileMapping]] = {}
    for f in layout.file_mappings:
        by_path.setdefault(f.path, []).append(f)
    out = {}
    for p, maps in by_path.items():
        zero = [f.start for f in maps if f.offset == 0]
        if zero:
            out[p] = (min(zero), maps)
    return dict(sorted(out.items(), key=lambda kv: kv[1][0]))


def _is_elf_object(mem: CoreMemory, base: int) -> bool | None:
    """Whether the object at ``base`` is ELF; None when its first bytes are not in the core."""
    try:
        return mem.read(base, 4) == elf.ELF_MAGIC
    except MemoryNotInCore:
        return None


def _libraries(
    mem: CoreMemory, layout: CoreLayout, exe_path: str | None, *, sysroot: str | None, exe: str | None,
    loaded_as: dict[str, str],
) -> tuple[Library, ...]:
    exe_first: list[Library] = []
    rest: list[Library] = []
    for obj_path, (base, maps) in _object_bases(layout).items():
        is_elf = _is_elf_object(mem, base)
        if is_elf is False:
            continue
        build_id = read_build_id_in_memory(mem, base, layout.page_size) if is_elf else None
        file_path: str | None
        if obj_path == exe_path and exe is not None:
            file_path, file_id = exe, read_build_id_from_file(exe)
        else:
            file_path, file_id = resolve_file(obj_path, sysroot, build_id)
        if is_elf is None and not _unknown_is_elf(file_path, layout, maps):
            continue
        lib = Library(
            path=obj_path,
            base=base,
            build_id=build_id,
            file_path=file_path,
            file_build_id=file_id,
            status=classify_library(build_id, file_path, file_id),
            loaded_as=loaded_as.get(obj_path),
        )
        (exe_first if obj_path == exe_path else rest).append(lib)
    return tuple(exe_first + rest)


def _unknown_is_elf(file_path: str | None, layout: CoreLayout, maps: Sequence[elf.FileMapping]) -> bool:
    """For an object whose first page is not in the core: ELF if its file says so, or if it was mapped executable."""
    if file_path is not None:
        try:
            with open(file_path, "rb") as f:
                return f.read(4) == elf.ELF_MAGIC
        except OSError:
            pass
    executable = [p.vaddr for p in layout.phdrs if p.type == elf.PT_LOAD and p.flags & elf.PF_X]
    return any(f.contains(addr) for f in maps for addr in executable)
