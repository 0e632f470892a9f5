"""open_core and CoreMemory on real cores of tests/crashers/exporter.py (no gdb needed; gdb only cross-checks)."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import shutil
import statistics
import struct
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from forensics.core import elf
from forensics.core import CoreMemory, MemoryNotInCore, open_core, resolve_file
from forensics.errors import CoreReadError, InputNotFound, NotACoreFile, UnsupportedTarget
from forensics.model import LibraryStatus

from tests.helpers import pyelftools_build_id
from tests.crashers.make_core import CoresUnavailable, build_libcrash, make_core
from tests.pythons import discover_pythons

_FOUND = discover_pythons()  # {"3.12": path}, 3.8-3.13
_MINOR = {Path(p): v for v, p in _FOUND.items()}
PYTHONS = [Path(_FOUND[v]) for v in sorted(_FOUND, key=lambda v: tuple(map(int, v.split("."))))]
PYTHON = Path(_FOUND["3.12"]) if "3.12" in _FOUND else (PYTHONS[-1] if PYTHONS else None)
pytestmark = pytest.mark.skipif(PYTHON is None, reason="no pyenv CPython 3.8+ with a shared libpython")

NVML_C = r"""
const char nvml_banner[] = "NVIDIA Management Library, driver 565.57.01, copyright NVIDIA Corporation";
int nvmlInit_v2(void) { return nvml_banner[0]; }
"""


def minor(python: Path) -> str:
    return _MINOR[python]


file_build_id = pyelftools_build_id  # the independent oracle


def crash(directory: Path, python: Path, scenario: str, **kwargs) -> Path:
    try:
        return make_core(directory, python, scenario, **kwargs)
    except CoresUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, core_pattern) -> Path:
    return tmp_path_factory.mktemp("cores")


@pytest.fixture(scope="module")
def cores(workdir):
    made: dict[str, Path] = {}

    def get(scenario: str) -> Path:
        if scenario not in made:
            made[scenario] = crash(workdir, PYTHON, scenario)
        return made[scenario]

    return get


@pytest.fixture(scope="module")
def heap_prev(cores):
    return cores("heap-prev")


def lib(core, name_prefix):
    found = [x for x in core.libraries if x.name.startswith(name_prefix)]
    assert len(found) == 1, [x.path for x in core.libraries]
    return found[0]


# -- what the core says ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scenario,message",
    [("heap-prev", "double free or corruption (!prev)"), ("heap-next-size", "free(): invalid next size (normal)")],
)
def test_heap_corruption_abort(cores, scenario, message):
    # GIVEN a core of glibc aborting on a corrupted heap
    path = cores(scenario)
    # WHEN
    core = open_core(str(path))
    # THEN
    assert core.signal is not None
    assert (core.signal.signo, core.signal.name, core.signal.code) == (6, "SIGABRT", -6)  # SI_TKILL from abort()
    assert core.signal.sender_pid == core.pid
    assert core.signal.addr is None
    assert core.abort_message == message
    assert not core.truncated
    assert core.size == core.expected_size == path.stat().st_size


def test_segv_fault_address(cores, workdir):
    core = open_core(str(cores("segv")))
    assert core.signal is not None
    assert (core.signal.signo, core.signal.name, core.signal.code, core.signal.addr) == (11, "SIGSEGV", 1, 0x10)
    assert core.signal.sender_pid is None
    assert core.abort_message is None
    # the crashed thread stopped inside libcrash.so
    crashed = core.find_mapping(core.threads[0].pc)
    assert crashed is not None and crashed.path == str(workdir / "libcrash.so") and "x" in crashed.perms


def test_threads_crashed_first(heap_prev):
    core = open_core(str(heap_prev))
    assert len(core.threads) == 2
    assert core.crashed_tid == core.pid == core.threads[0].tid
    assert core.threads[0].signal == 6
    assert core.threads[1].tid != core.pid
    for t in core.threads:
        assert core.find_mapping(t.pc) is not None
        assert core.find_mapping(t.sp) is not None
        assert t.fs_base and core.find_mapping(t.fs_base) is not None


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb not installed")
def test_threads_and_registers_match_gdb(heap_prev):
    core = open_core(str(heap_prev))
    printf = 'thread apply all printf "TID %d %lx %lx %lx\\n", $_thread, $pc, $sp, $fs_base'
    cmd = ["gdb", "-nx", "-batch", "-ex", printf, "-ex", "info threads", "-c", str(heap_prev), str(core.executable)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    lwps = [int(x) for x in re.findall(r"\(LWP (\d+)\)", out.split("Id   Target Id")[-1])]
    rows = re.findall(r"TID (\d+) (\w+) (\w+) (\w+)", out)
    regs = {int(n): (int(pc, 16), int(sp, 16), int(fs, 16)) for n, pc, sp, fs in rows}
    assert lwps == [t.tid for t in core.threads]
    assert [regs[i + 1] for i in range(len(lwps))] == [(t.pc, t.sp, t.fs_base) for t in core.threads]


def test_process_identity(heap_prev):
    core = open_core(str(heap_prev))
    assert core.command == "python3"
    # the whole argv (make_core runs: PYTHON exporter.py libcrash.so SCENARIO), not NT_PRPSINFO's 80 bytes
    argv = core.args.split(" ")
    assert argv[0] == str(PYTHON) and argv[1].endswith("/tests/crashers/exporter.py")
    assert argv[2].endswith("/libcrash.so") and argv[3] == "heap-prev" and len(argv) == 4
    assert core.executable == os.path.realpath(PYTHON)
    assert core.build_id == file_build_id(core.executable)


def test_long_command_line_is_read_whole_from_the_stack(workdir, tmp_path):
    """pr_psargs keeps 80 bytes; the argv strings on the initial stack keep everything (bounded)."""
    from tests.crashers.make_core import _child_setup

    long_arg = "--config=" + "/very/long/path" * 400  # 6 KB, longer than one page
    argv = [str(PYTHON), "-c", "import os; os.abort()", long_arg, "ünïcödé", "two words", "--last"]
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run(argv, cwd=run, preexec_fn=_child_setup(None), capture_output=True, timeout=60)
    assert proc.returncode < 0
    (core_path,) = run.iterdir()
    core = open_core(str(core_path))
    assert core.args == " ".join(argv)
    # the kernel's own copy is the first 80 bytes of the same line
    with CoreMemory.open(str(core_path)) as mem:
        (note,) = [n for n in mem.layout.notes if n.name == b"CORE" and n.type == elf.NT_PRPSINFO]
    psargs = elf.parse_prpsinfo(note.desc).args
    assert len(psargs) < 80 and core.args.startswith(psargs)


def test_libraries_ok_with_real_build_ids(heap_prev, workdir):
    core = open_core(str(heap_prev))
    # the executable first, then every mapped ELF object
    assert core.libraries[0].path == core.executable
    names = {x.name for x in core.libraries}
    assert {f"libpython{minor(PYTHON)}.so.1.0", "libc.so.6", "libcrash.so"} <= names
    # every mapped ELF file is listed, and only those (not LC_CTYPE, gconv-modules.cache, ...)
    with CoreMemory.open(str(heap_prev)) as mem:
        mapped = {f.path for f in mem.layout.file_mappings}
    assert {x.path for x in core.libraries} == {p for p in mapped if Path(p).read_bytes()[:4] == b"\x7fELF"}
    assert len(mapped) > len(core.libraries)
    for x in core.libraries:
        assert x.status is LibraryStatus.OK, x
        assert x.file_path == x.path
        assert x.build_id == x.file_build_id == file_build_id(x.path)
        assert x.build_id and len(x.build_id) == 40
    crash_lib = lib(core, "libcrash.so")
    assert crash_lib.path == str(workdir / "libcrash.so")
    assert core.find_mapping(crash_lib.base).offset == 0
    assert core.nvml is None


def test_mappings_follow_program_headers(heap_prev):
    core = open_core(str(heap_prev))
    with open(heap_prev, "rb") as f:
        loads = [s for s in ELFFile(f).iter_segments() if s["p_type"] == "PT_LOAD"]
        assert len(core.mappings) == len(loads)
        for m, s in zip(core.mappings, loads, strict=True):
            assert (m.start, m.size, m.in_core) == (s["p_vaddr"], s["p_memsz"], s["p_filesz"])
            assert re.fullmatch(r"[r-][w-][x-]p", m.perms)
    libc = lib(core, "libc.so.6")
    libc_maps = [m for m in core.mappings if m.path == libc.path]
    assert [m.offset for m in libc_maps] == sorted(m.offset for m in libc_maps)
    assert any(m.perms == "r-xp" for m in libc_maps)
    assert any(m.path is None and m.in_core for m in core.mappings)  # the heap and stacks


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS, ids=lambda p: f"python={minor(p)}")
def test_every_python_version(workdir, python):
    core = open_core(str(crash(workdir, python, "heap-prev")))
    assert core.abort_message == "double free or corruption (!prev)"
    assert len(core.threads) == 2
    assert lib(core, f"libpython{minor(python)}").status is LibraryStatus.OK


# -- sysroot, exe and build-id checks ---------------------------------------------------------------


def place(sysroot: Path, core_path: str, source: Path) -> Path:
    target = sysroot / core_path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    return target


def test_sysroot_with_another_build_is_mismatch(heap_prev, workdir, tmp_path):
    # GIVEN a sysroot holding a different build of libcrash.so at the path the core names
    other = build_libcrash(tmp_path / "other", cflags=["-O0"])
    placed = place(tmp_path / "sysroot", str(workdir / "libcrash.so"), other)
    # WHEN
    core = open_core(str(heap_prev), sysroot=str(tmp_path / "sysroot"))
    # THEN it is flagged; everything else falls back to this machine's identical files
    crash_lib = lib(core, "libcrash.so")
    assert crash_lib.status is LibraryStatus.MISMATCH
    assert crash_lib.file_path == str(placed)
    assert crash_lib.file_build_id == file_build_id(other) != crash_lib.build_id
    assert all(x.status is LibraryStatus.OK for x in core.libraries if x is not crash_lib)
    assert lib(core, "libc.so.6").file_path == lib(core, "libc.so.6").path


def test_missing_from_sysroot_and_different_on_host(tmp_path):
    # GIVEN a core whose libcrash.so was since rebuilt on this machine
    d = tmp_path / "missing"
    path = crash(d, PYTHON, "segv")
    original = d / "libcrash.so"
    saved = shutil.copy2(original, tmp_path / "saved.so")
    shutil.copy2(build_libcrash(tmp_path / "other", cflags=["-O0"]), original)
    empty = tmp_path / "empty-sysroot"
    empty.mkdir()
    # WHEN / THEN: not in the sysroot and the host copy differs -> missing
    missing = lib(open_core(str(path), sysroot=str(empty)), "libcrash.so")
    assert (missing.status, missing.file_path, missing.file_build_id) == (LibraryStatus.MISSING, None, None)
    assert missing.build_id == file_build_id(saved)
    # without a sysroot the path itself is used: a mismatch
    assert lib(open_core(str(path)), "libcrash.so").status is LibraryStatus.MISMATCH
    # with the same build back on the host, it falls back to it
    shutil.copy2(saved, original)
    back = lib(open_core(str(path), sysroot=str(empty)), "libcrash.so")
    assert (back.status, back.file_path) == (LibraryStatus.OK, str(original))
    assert resolve_file(str(original), str(empty), back.build_id) == (str(original), back.build_id)
    assert resolve_file(str(original), str(empty), "00" * 20) == (None, None)


def test_symlinks_resolve_inside_the_sysroot(heap_prev, tmp_path):
    core = open_core(str(heap_prev))
    libc = lib(core, "libc.so.6")
    root = tmp_path / "sysroot"
    real = place(root, "/opt/glibc/libc-real.so", Path(libc.path))
    link = root / libc.path.lstrip("/")
    link.parent.mkdir(parents=True)
    os.symlink("/opt/glibc/libc-real.so", link)  # absolute target: means <sysroot>/opt/...
    got = lib(open_core(str(heap_prev), sysroot=str(root)), "libc.so.6")
    assert (got.status, got.file_path) == (LibraryStatus.OK, str(real))


def test_exe_overrides_the_executable(heap_prev, workdir, tmp_path):
    copy = shutil.copy2(os.path.realpath(PYTHON), tmp_path / "python-copy")
    core = open_core(str(heap_prev), exe=str(copy))
    assert (core.libraries[0].file_path, core.libraries[0].status) == (str(copy), LibraryStatus.OK)
    wrong = open_core(str(heap_prev), exe=str(workdir / "libcrash.so"))
    assert wrong.libraries[0].status is LibraryStatus.MISMATCH
    assert wrong.libraries[0].path == wrong.executable


def test_abort_message_from_core_memory_when_libc_file_mismatches(tmp_path):
    # GIVEN a core with file-backed private pages dumped (coredump_filter bit 2) and a sysroot whose libc is wrong
    path = crash(tmp_path / "full", PYTHON, "heap-next-size", coredump_filter=0x37)
    libc_path = lib(open_core(str(path)), "libc.so.6").path
    libm = next(x.path for x in open_core(str(path)).libraries if x.name.startswith("libm.so"))
    place(tmp_path / "sysroot", libc_path, Path(libm))
    # WHEN
    core = open_core(str(path), sysroot=str(tmp_path / "sysroot"))
    # THEN the symbol comes from libc's dynamic section in the core
    assert lib(core, "libc.so.6").status is LibraryStatus.MISMATCH
    assert core.abort_message == "free(): invalid next size (normal)"


def test_abort_message_when_libc_is_wrong_and_its_symbols_not_in_core(cores, heap_prev, tmp_path):
    # GIVEN a sysroot whose libc is another file, and the kernel's default coredump_filter (libc's symbol
    # tables are not in the core: __abort_msg's address cannot be looked up)
    libc = lib(open_core(str(heap_prev)), "libc.so.6")
    place(tmp_path / "sysroot", libc.path, Path(lib(open_core(str(heap_prev)), "libm.so").path))
    core = open_core(str(heap_prev), sysroot=str(tmp_path / "sysroot"))
    assert lib(core, "libc.so.6").status is LibraryStatus.MISMATCH
    # THEN the message is found through the pointer in libc's writable image, which the core holds (#27)
    assert core.abort_message == "double free or corruption (!prev)"
    # and a crash that wrote no message has none
    segv = cores("segv")
    assert open_core(str(segv), sysroot=str(tmp_path / "sysroot")).abort_message is None


def test_core_without_elf_headers_is_unverified(tmp_path):
    # GIVEN a core written without the first page of each ELF object (coredump_filter bit 4 off)
    path = crash(tmp_path / "nohdr", PYTHON, "heap-prev", coredump_filter=0x23)
    # WHEN
    core = open_core(str(path))
    # THEN the objects are still found (judged from their files), but no build-id can be checked
    names = {x.name for x in core.libraries}
    assert {f"libpython{minor(PYTHON)}.so.1.0", "libc.so.6", "libcrash.so"} <= names
    assert all(x.status is LibraryStatus.UNVERIFIED and x.build_id is None for x in core.libraries)
    assert core.build_id is None
    # the libc file is still used: the load base comes from its program headers
    assert core.abort_message == "double free or corruption (!prev)"


@pytest.mark.parametrize(
    "name,version,source",
    [("libnvidia-ml.so.580.126.09", "580.126.09", "file-name"), ("libnvidia-ml.so.1", "565.57.01", "version-string")],
)
def test_nvml_identified(tmp_path, name, version, source):
    src = tmp_path / "nvml.c"
    src.write_text(NVML_C)
    so = tmp_path / "nvml" / name
    so.parent.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    core = open_core(str(crash(tmp_path, PYTHON, "segv", preload=[so])))
    assert core.nvml is not None
    assert (core.nvml.path, core.nvml.driver_version, core.nvml.version_source) == (str(so), version, source)
    assert core.nvml.build_id == file_build_id(so)


# -- truncated cores ------------------------------------------------------------------------------


def cut(src: Path, dst: Path, n: int) -> Path:
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read(n))
    return dst


def test_truncated_core_is_read_as_far_as_it_goes(heap_prev, tmp_path):
    full = open_core(str(heap_prev))
    n = heap_prev.stat().st_size // 2
    core = open_core(str(cut(heap_prev, tmp_path / "core", n)))
    assert core.truncated
    assert (core.size, core.expected_size) == (n, full.size)
    assert core.threads == full.threads
    assert core.signal == full.signal
    assert (core.pid, core.command, core.executable) == (full.pid, full.command, full.executable)
    # the stack (at the top of the address space) is cut off: the command line is NT_PRPSINFO's first 80 bytes
    assert full.args.startswith(core.args) and 0 < len(core.args) <= 80 < len(full.args)
    assert len(core.mappings) == len(full.mappings)
    assert sum(m.in_core for m in core.mappings) < sum(m.in_core for m in full.mappings)
    assert [x.path for x in core.libraries if x.build_id] != []
    with CoreMemory.open(str(tmp_path / "core")) as mem:
        last = [m for m in full.mappings if m.in_core][-1]
        with pytest.raises(MemoryNotInCore):
            mem.read(last.start, 8)


def note_offset(path: Path) -> int:
    with open(path, "rb") as f:
        return next(s["p_offset"] for s in ELFFile(f).iter_segments() if s["p_type"] == "PT_NOTE")


def test_core_cut_inside_the_notes_keeps_the_first_thread(heap_prev, tmp_path):
    n = note_offset(heap_prev) + 400  # the first NT_PRSTATUS (20 + 336 bytes) and no more
    core = open_core(str(cut(heap_prev, tmp_path / "core", n)))
    assert core.truncated and core.size == n
    assert [t.tid for t in core.threads] == [open_core(str(heap_prev)).pid]
    assert core.signal is None and core.libraries == () and core.abort_message is None


def test_core_cut_before_the_notes_is_an_error(heap_prev, tmp_path):
    for n in (200, note_offset(heap_prev)):
        with pytest.raises(CoreReadError, match="truncated before the notes"):
            open_core(str(cut(heap_prev, tmp_path / f"core{n}", n)))


# -- wrong inputs ---------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    with pytest.raises(InputNotFound) as e:
        open_core(str(tmp_path / "nope"))
    assert str(e.value) == f"{tmp_path / 'nope'}: no such file or directory"


def test_directory(tmp_path):
    with pytest.raises(NotACoreFile) as e:
        open_core(str(tmp_path))
    assert str(e.value) == f"{tmp_path}: not a core file: a directory"


def test_empty_and_text_files(tmp_path):
    (tmp_path / "empty").touch()
    with pytest.raises(NotACoreFile, match="not a core file: an empty file; the kernel wrote nothing"):
        open_core(str(tmp_path / "empty"))
    (tmp_path / "log").write_text("Segmentation fault (core dumped)\n")
    with pytest.raises(NotACoreFile, match="not a core file: a text file$"):
        open_core(str(tmp_path / "log"))


def compressed(heap_prev: Path, tmp_path: Path, kind: str) -> Path:
    head = heap_prev.read_bytes()[: 1 << 16]
    out = tmp_path / "core.1234"
    if kind == "gzip":
        out.write_bytes(gzip.compress(head))
    elif kind == "xz":
        out.write_bytes(lzma.compress(head))
    elif kind == "bzip2":
        out.write_bytes(bz2.compress(head))
    else:
        if shutil.which("zstd") is None:
            pytest.skip("zstd not installed")
        (tmp_path / "head").write_bytes(head)
        subprocess.run(["zstd", "-q", str(tmp_path / "head"), "-o", str(out)], check=True)
    return out


@pytest.mark.parametrize("kind,tool", [("gzip", "gzip"), ("zstd", "zstd"), ("xz", "xz"), ("bzip2", "bzip2")])
def test_compressed_core(heap_prev, tmp_path, kind, tool):
    path = compressed(heap_prev, tmp_path, kind)
    with pytest.raises(NotACoreFile) as e:
        open_core(str(path))
    assert e.value.what == f"{kind}-compressed data"
    assert str(e.value) == (
        f"{path}: not a core file: {kind}-compressed data; decompress it first: {tool} -d -c {path} > {path}.core"
    )


@pytest.mark.parametrize("which", ["executable", "shared object"])
def test_elf_program_instead_of_core(workdir, heap_prev, which):
    path = os.path.realpath(PYTHON) if which == "executable" else str(workdir / "libcrash.so")
    with pytest.raises(NotACoreFile) as e:
        open_core(path)
    assert str(e.value) == (
        f"{path}: not a core file: an ELF executable/shared object; "
        "pass the core, not the program; the program goes to --exe"
    )


def patched(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return dst


def test_core_of_another_machine(heap_prev, tmp_path):
    path = patched(heap_prev, tmp_path / "core", 18, struct.pack("<H", 22))
    with pytest.raises(UnsupportedTarget) as e:
        open_core(str(path))
    what = "ELF core for S/390 (e_machine 22); forensics reads x86-64 and AArch64 cores"
    assert str(e.value) == f"{path}: unsupported core: {what}"


def test_32_bit_core(heap_prev, tmp_path):
    path = patched(heap_prev, tmp_path / "core", 4, b"\x01")
    with pytest.raises(UnsupportedTarget, match=r"32-bit ELF core for x86-64 \(e_machine 62\)"):
        open_core(str(path))


def test_missing_sysroot_or_exe(heap_prev, tmp_path):
    with pytest.raises(InputNotFound):
        open_core(str(heap_prev), sysroot=str(tmp_path / "no-sysroot"))
    with pytest.raises(InputNotFound):
        open_core(str(heap_prev), exe=str(tmp_path / "no-exe"))


# -- CoreMemory and speed -------------------------------------------------------------------------


def test_core_memory_reads_process_memory(heap_prev, workdir):
    core = open_core(str(heap_prev))
    libc = lib(core, "libc.so.6")
    with CoreMemory.open(str(heap_prev)) as mem:
        assert mem.read(libc.base, 4) == b"\x7fELF"
        text = next(m for m in core.mappings if m.path == libc.path and m.perms == "r-xp")
        assert text.in_core == 0
        assert not mem.is_readable(text.start, 1)  # library text lives in the file, not the core
        guard = next((m for m in core.mappings if m.perms == "---p" and m.path is None), None)
        if guard is not None:
            assert mem.is_readable(guard.start, 16) is False
        stack = core.find_mapping(core.threads[0].sp)
        assert len(mem.read(core.threads[0].sp, 64)) == 64 and stack.in_core
        with pytest.raises(MemoryNotInCore):
            mem.read_u64(0x10)


def test_open_core_is_fast(heap_prev):
    open_core(str(heap_prev))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        open_core(str(heap_prev))
        times.append(time.perf_counter() - t)
    # target: well under 50 ms for a ~15 MB core (a few ms measured); generous for slow CI machines
    assert statistics.median(times) < 0.25, times
