"""AArch64 cores made on this x86_64 machine (tests/arm64.py) and read from it (issue #31)."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess

import pytest
from click.testing import CliRunner
from elftools.elf.elffile import ELFFile

from forensics.cli import cli
from forensics.core import elf as core_elf
from forensics.core import linkmap, open_core
from forensics.core.memory import CoreMemory
from forensics.model import Arch
from tests.arm64 import gdb_multiarch_stacks, guest_python
from tests.fuzz_cores import NT_PRSTATUS, _layout

SUITES = [pytest.param(s, id=f"suite={s}") for s in ("bookworm", "sid")]


def _notes(path):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        header = elf.header
        notes = [n for seg in elf.iter_segments() if seg["p_type"] == "PT_NOTE" for n in seg.iter_notes()]
        return header, [(n["n_name"], n["n_type"]) for n in notes], notes


@pytest.mark.parametrize("suite", SUITES)
def test_qemu_writes_an_aarch64_core_of_the_guest_interpreter(arm64_cores, suite):
    # GIVEN exporter.py crashed in native code (SIGSEGV in libcrash) under qemu-user in the arm64 root
    core = arm64_cores.core(suite, "segv")
    # WHEN pyelftools (the oracle) reads it
    header, kinds, notes = _notes(core)
    # THEN it is qemu's AArch64 core of the root's interpreter: a thread's registers for each of the two threads,
    # the process and the auxiliary vector, and neither NT_FILE nor NT_SIGINFO (qemu writes no more)
    assert core.name.startswith("qemu_python3.") and core.name.endswith(".core")
    assert (header["e_machine"], header["e_type"], header["e_ident"]["EI_CLASS"]) == ("EM_AARCH64", "ET_CORE",
                                                                                      "ELFCLASS64")
    assert kinds.count(("CORE", "NT_PRSTATUS")) == 2
    assert ("CORE", "NT_PRPSINFO") in kinds and ("CORE", "NT_AUXV") in kinds
    assert not any(t in ("NT_FILE", "NT_SIGINFO") for _, t in kinds)
    psinfo = next(n for n in notes if n["n_type"] == "NT_PRPSINFO")["n_desc"]
    assert psinfo["pr_psargs"].decode().startswith(f"/usr/bin/python{'3.11' if suite == 'bookworm' else '3.14'} ")
    # and the kernel's own core of qemu was not left beside it
    assert [p.name for p in core.parent.iterdir() if not p.name.startswith(".")] == [core.name]


# -- the core reader and the native stacks (#31 items 1 and 2) -------------------------------------------------


#: a CPU without pointer authentication: gdb-multiarch, the oracle, cannot unwind a PAC core qemu wrote
NO_PAC = "cortex-a72"
EXIT_OK = 0
needs_gdb = pytest.mark.skipif(shutil.which("gdb-multiarch") is None, reason="gdb-multiarch is not installed "
                               "(apt-get install -y gdb-multiarch)")


def analyze(*args: str):
    return CliRunner().invoke(cli, ["analyze", *args], catch_exceptions=False)


def _gdb_libraries(sysroot, executable, core) -> set[str]:
    """gdb-multiarch's `info sharedlibrary`: the objects it found through the core's r_debug, as the process
    named them (the sysroot prefix taken off)."""
    out = subprocess.run(["gdb-multiarch", "-nx", "-batch", "-ex", "set debuginfod enabled off", "-ex",
                          f"set sysroot {sysroot}", "-ex", f"file {sysroot}{executable}", "-ex", f"core-file {core}",
                          "-ex", "info sharedlibrary"], capture_output=True, text=True, timeout=300).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"0x[0-9a-f]+\s+0x[0-9a-f]+\s+\S+\s+(?:\(\*\)\s+)?(/\S+)$", line)
        if m:
            found.add(m.group(1).removeprefix(str(sysroot)))
    return found


@needs_gdb
@pytest.mark.parametrize("suite", SUITES)
def test_the_reader_finds_the_objects_through_the_dynamic_linkers_list(arm64_cores, suite):
    # GIVEN qemu's core (no NT_FILE) and the sysroot of the root it ran in
    core, sysroot = arm64_cores.core(suite, "segv", cpu=NO_PAC), arm64_cores.sysroot(suite)
    # WHEN forensics reads it, and gdb-multiarch (the oracle) lists the shared libraries it finds itself
    read = open_core(str(core), sysroot=str(sysroot))
    theirs = _gdb_libraries(sysroot, guest_python(suite), core)
    # THEN it is an AArch64 core whose objects were named from link_map: the executable, and every library
    # gdb found, each found in the sysroot; the threads are gdb's
    assert read.arch is Arch.AARCH64 and read.mappings_from == "link_map", read.problems
    assert read.executable == guest_python(suite) and read.problems == ()
    libs = {lib.loaded_as or lib.path: lib for lib in read.libraries}  # gdb names them as they were loaded
    assert theirs and theirs <= set(libs), (theirs, sorted(libs))
    assert all(libs[p].file_path and libs[p].file_path.startswith(str(sysroot)) for p in theirs)
    assert {t.tid for t in read.threads} == set(gdb_multiarch_stacks(sysroot, guest_python(suite), core))
    assert read.code_address_mask == (1 << 48) - 1  # no NT_ARM_PAC_MASK: the address is its low 48 bits


def _libdw_stacks(core, sysroot, method="libdw") -> tuple[dict[int, list], dict]:
    r = analyze("--json", "--native-method", method, "--sysroot", str(sysroot), str(core))
    assert r.exit_code == EXIT_OK, r.output[-3000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    return {t["tid"]: [f["symbol"] for f in t["native_frames"]] for t in snap["threads"]}, snap


@needs_gdb
@pytest.mark.parametrize("method", ["libdw", "gdb"])
@pytest.mark.parametrize("suite", SUITES)
def test_native_stacks_equal_gdb_multiarchs(arm64_cores, suite, method):
    # GIVEN an AArch64 core of a Python program that faulted in native code called through ctypes
    core, sysroot = arm64_cores.core(suite, "segv", cpu=NO_PAC), arm64_cores.sysroot(suite)
    # WHEN analyze unwinds it on this x86_64 machine (libdw's aarch64 backend; gdb: gdb-multiarch, chosen for the
    # core's machine) and gdb-multiarch unwinds it on its own
    ours, snap = _libdw_stacks(core, sysroot, method)
    theirs = gdb_multiarch_stacks(sysroot, guest_python(suite), core)
    # THEN every thread's frames are gdb's, function for function (inlined ones included), and the crashed one
    # runs from libcrash's faulting function down to _start
    assert snap["native_method"] == method
    assert ours == theirs
    crashed = ours[snap["threads"][0]["tid"]]
    assert crashed[0] == "forensics_bad_write" and crashed[-1] == "_start", crashed


def _hwcap(core) -> int:
    with open(core, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] == "PT_NOTE":
                for n in seg.iter_notes():
                    if n["n_type"] == "NT_AUXV":  # pyelftools leaves an AArch64 auxv as bytes: (type, value) pairs
                        pairs = struct.iter_unpack("<QQ", n["n_desc"][: len(n["n_desc"]) // 16 * 16])
                        return next(v for t, v in pairs if t == 16)  # AT_HWCAP
    raise AssertionError("no AT_HWCAP")


@needs_gdb
def test_return_addresses_signed_by_pointer_authentication_are_stripped(arm64_cores):
    """Debian unstable's arm64 code signs its return addresses (paciasp) and qemu's default CPU authenticates
    them; the core has no NT_ARM_PAC_MASK.  Unstripped, libdw stopped at the first signed one ("at
    0x270000006798f0 outside every mapped object")."""
    # GIVEN the same crash under a CPU with pointer authentication (HWCAP_PACA) and under one without
    pac = arm64_cores.core("sid", "segv")
    plain = arm64_cores.core("sid", "segv", cpu=NO_PAC)
    sysroot = arm64_cores.sysroot("sid")
    assert _hwcap(pac) & (1 << 30) and not _hwcap(plain) & (1 << 30)
    # WHEN libdw unwinds the signed one
    ours, snap = _libdw_stacks(pac, sysroot)
    # THEN its frames are gdb-multiarch's on the unsigned twin (the same code at the same addresses): whole
    theirs = gdb_multiarch_stacks(sysroot, guest_python("sid"), plain)
    assert sorted(ours.values()) == sorted(theirs.values())
    assert all(t["native_error"] in (None, "") for t in snap["threads"]), snap["threads"]


# -- hostile AArch64 cores: a result, a partial result or one line, never a traceback ---------------------------


EXIT_ERROR, EXIT_PARTIAL = 1, 4


def _copy_patched(src, dest, patches=(), *, size=None):
    shutil.copyfile(src, dest)
    with open(dest, "r+b") as f:
        for offset, data in patches:
            f.seek(offset)
            f.write(data)
        if size is not None:
            f.truncate(size)
    return str(dest)


def test_a_truncated_aarch64_core_is_read_as_far_as_it_goes(arm64_cores, tmp_path):
    # GIVEN qemu's core cut in the middle of its memory
    src = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    core = _copy_patched(src, tmp_path / "core", size=src.stat().st_size // 2)
    # WHEN it is analysed from this machine
    r = analyze("--json", "--sysroot", str(arm64_cores.sysroot("bookworm")), core)
    # THEN the result is partial and says the core is cut; the threads and the signal are there
    assert r.exit_code == EXIT_PARTIAL and "internal error" not in r.stderr, r.stderr[-2000:]
    a = json.loads(r.stdout)["analysis"]
    assert "core-truncated" in {f["rule"] for f in a["findings"]}
    assert a["crash"]["signal_name"] == "SIGSEGV" and len(a["snapshot"]["threads"]) == 2


def _link_map_nodes(core, sysroot) -> list[int]:
    """The addresses of the link_map entries of a guest core (made here to patch one, with struct)."""
    with CoreMemory.open(str(core)) as mem:
        auxv = core_elf.parse_auxv(next(n.desc for n in mem.layout.notes if n.type == core_elf.NT_AUXV))
        exe = linkmap.read_file_phdrs(f"{sysroot}{guest_python('bookworm')}")
        phdr = auxv[core_elf.AT_PHDR]
        self_ = next(p for p in exe if p.type == 6)
        dyn = next(p for p in exe if p.type == core_elf.PT_DYNAMIC)
        entries = mem.read(phdr - self_.vaddr + dyn.vaddr, dyn.filesz)
        r_debug = next(v for t, v in struct.iter_unpack("<qQ", entries) if t == 21)
        nodes, node = [], mem.read_u64(r_debug + 8)
        while node and len(nodes) < 100:
            nodes.append(node)
            node = mem.read_u64(node + 24)
        return nodes, mem


def _file_offset(mem, addr) -> int:
    seg = next(s for s in mem.segments if s.vaddr <= addr < s.vaddr + s.present)
    return seg.offset + addr - seg.vaddr


@pytest.mark.parametrize("target", ["first", "outside"], ids=["l_next=the first entry", "l_next=outside the core"])
def test_a_link_map_that_loops_or_leaves_the_core_is_cut_there(arm64_cores, tmp_path, target):
    # GIVEN qemu's core whose third link_map entry's l_next points back at the first, or at no memory of the core
    src = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    sysroot = arm64_cores.sysroot("bookworm")
    nodes, mem = _link_map_nodes(src, sysroot)
    assert len(nodes) > 4
    to = nodes[0] if target == "first" else 0x7EAD_BEEF_0000
    core = _copy_patched(src, tmp_path / "core", [(_file_offset(mem, nodes[2] + 24), struct.pack("<Q", to))])
    # WHEN it is analysed
    r = analyze("--json", "--sysroot", str(sysroot), core)
    # THEN the walk stops there: the objects before are named, the result is partial and says why
    assert r.exit_code == EXIT_PARTIAL and "internal error" not in r.stderr, r.stderr[-2000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    said = (f"the link_map list loops back to {to:#x} after 3 objects" if target == "first" else
            f"link_map entry 3 ({to:#x}) is not in the core: the list ends there")
    assert any(said in p for p in snap["core"]["problems"]), snap["core"]["problems"]
    assert 1 <= len(snap["core"]["libraries"]) <= 3 and snap["threads"]


@pytest.mark.parametrize("field,value", [pytest.param(4, 0xFFFF_FFF0, id="descsz=4GiB"),
                                         pytest.param(0, 0xFFFF_FFF0, id="namesz=4GiB")])
def test_absurd_note_sizes(arm64_cores, tmp_path, field, value):
    # GIVEN qemu's core whose second thread's NT_PRSTATUS header claims a note of 4 GiB
    src = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    second = [n for n in _layout(str(src)).notes if n.type == NT_PRSTATUS][1]
    core = _copy_patched(src, tmp_path / "core", [(second.header + field, struct.pack("<I", value))])
    # WHEN it is analysed
    r = analyze("--json", "--sysroot", str(arm64_cores.sysroot("bookworm")), core)
    # THEN the notes before it are read (the crashed thread), the result is partial: the other thread and the
    # auxiliary vector after it are missing, so no object is named
    assert r.exit_code == EXIT_PARTIAL and "internal error" not in r.stderr, r.stderr[-2000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert [t["tid"] for t in snap["core"]["threads"]] == [int(src.name.split("_")[-1].split(".")[0])]


@pytest.mark.parametrize("machine,cls,data,what", [
    pytest.param(40, 1, 1, "32-bit ELF core for ARM (e_machine 40)", id="arm32"),
    pytest.param(22, 2, 2, "big-endian ELF core for S/390 (e_machine 22)", id="s390x"),
])
def test_a_core_of_another_machine_is_one_line(arm64_cores, tmp_path, machine, cls, data, what):
    # GIVEN qemu's core relabelled as another machine's
    src = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    order = ">" if data == 2 else "<"
    core = _copy_patched(src, tmp_path / "core", [(4, bytes([cls, data])), (16, struct.pack(order + "HH", 4, machine))])
    # WHEN it is analysed
    r = analyze(core)
    # THEN one line says what it is and what forensics reads, exit 1
    assert r.exit_code == EXIT_ERROR
    assert f"unsupported core: {what}; forensics reads x86-64 and AArch64 cores" in r.stderr.splitlines()[0]


# -- Python stacks and locals (#31 item 3, the Python walker) ----------------------------------------------------

@pytest.fixture(scope="module")
def pystack_root(arm64_cores):
    """Per suite: the arm64 root (it has pystack's C++ runtime), for pystack's own aarch64 build (the oracle)."""
    from tests.arm64 import GuestUnavailable, guest_root, pystack_wheel_dir
    from tests.roots import RootUnavailable

    def get(suite):
        arm64_cores.root(suite)  # skips without qemu or the mirror
        try:
            pystack_wheel_dir(suite)
            return guest_root(suite)
        except (GuestUnavailable, RootUnavailable) as e:
            pytest.skip(f"no pystack oracle for arm64: {e}")

    return get


@pytest.mark.parametrize("suite,scenario,cpu,debug", [
    pytest.param("bookworm", "segv", NO_PAC, False, id="python=3.11,segv"),
    pytest.param("bookworm", "heap-prev", NO_PAC, False, id="python=3.11,heap-prev"),
    pytest.param("bookworm", "segv", NO_PAC, True, id="python=3.11d,segv"),
    pytest.param("trixie", "segv", NO_PAC, False, id="python=3.13,segv"),
    pytest.param("sid", "segv", None, False, id="python=3.14,segv,pac"),
    pytest.param("sid", "qsort-abort", NO_PAC, False, id="python=3.14,qsort-abort"),
    pytest.param("sid", "heap-prev", NO_PAC, True, id="python=3.14d,heap-prev"),
])
def test_python_stacks_and_locals_equal_pystacks_own_aarch64_build(arm64_cores, pystack_root, suite, scenario, cpu,
                                                                   debug):
    from tests.arm64 import build_guest_libcrash, pystack_guest_stacks

    # GIVEN an AArch64 core of the exporter, crashed in native code under the suite's CPython (or its -dbg build)
    core, sysroot = arm64_cores.core(suite, scenario, cpu=cpu, debug=debug), arm64_cores.sysroot(suite)
    # WHEN analyze reads its Python stacks on this x86_64 machine, and pystack 1.7.2's aarch64 wheel reads them
    # under qemu in the root (the oracle)
    r = analyze("--json", "--sysroot", str(sysroot), str(core))
    assert r.exit_code == EXIT_OK, r.output[-3000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    theirs = pystack_guest_stacks(pystack_root(suite), suite, core, debug=debug,
                                  lib_dirs=[build_guest_libcrash(arm64_cores.base).parent])
    # THEN every thread's frames are pystack's (function, file, line), and so are the names of each frame's
    # arguments and locals
    assert snap["python_status"] == "ok", snap["python_stack_status"]
    ours = {t["tid"]: [(f["function"].rsplit(".", 1)[-1], f["file"], f["line"]) for f in t["py_frames"]]
            for t in snap["threads"] if t["py_frames"]}
    assert ours == {tid: [f[:3] for f in frames] for tid, frames in theirs.items()}
    our_names = {t["tid"]: [sorted(v["name"] for v in f["locals"]) for f in t["py_frames"]]
                 for t in snap["threads"] if t["py_frames"]}
    crashed = snap["threads"][0]["tid"]
    assert our_names[crashed] == [f[3] for f in theirs[crashed]]


# -- the pointer-authentication mask note, and the core handler's crash site on an arm64 node --------------------

NT_PRPSINFO, NT_ARM_PAC_MASK = 3, 0x406


def _with_pac_mask_note(src, dest, insn_mask: int) -> str:
    """``src`` with its NT_PRPSINFO note's bytes turned into an NT_ARM_PAC_MASK note (owner LINUX) and a filler
    note of the same total size: what a kernel writes for a process with pointer authentication, which qemu
    does not."""
    prpsinfo = next(n for n in _layout(str(src)).notes if n.type == NT_PRPSINFO)
    total = 12 + 8 + ((prpsinfo.size + 3) & ~3)  # its header, "CORE\0" padded, its descriptor padded
    pac = struct.pack("<III", 6, 16, NT_ARM_PAC_MASK) + b"LINUX\0\0\0" + struct.pack("<QQ", insn_mask, insn_mask)
    filler = struct.pack("<III", 0, total - len(pac) - 12, 0) + bytes(total - len(pac) - 12)
    return _copy_patched(src, dest, [(prpsinfo.header, pac + filler)])


def test_the_pac_mask_note_strips_return_addresses(arm64_cores, tmp_path):
    # GIVEN the PAC core with the kernel's NT_ARM_PAC_MASK for a 48-bit address space (bits 48-54 and 56-63)
    mask = 0xFF7F_0000_0000_0000
    src = arm64_cores.core("sid", "segv")
    core = _with_pac_mask_note(src, tmp_path / "core", mask)
    sysroot = arm64_cores.sysroot("sid")
    # WHEN it is read and unwound
    read = open_core(core, sysroot=str(sysroot))
    ours, _snap = _libdw_stacks(core, sysroot)
    # THEN the note's instruction mask is the one used, and the stacks are those of the core without it
    assert read.code_address_mask == ~mask & 0xFFFF_FFFF_FFFF_FFFF
    assert ours == _libdw_stacks(src, sysroot)[0]
    assert all(frames[-1] in ("_start", "thread_start") for frames in ours.values()), ours


def test_the_core_handler_names_the_crash_site_of_an_aarch64_core(arm64_cores):
    """The handler's record read NT_PRSTATUS with x86-64's layout: an AArch64 core's "pc" was x16."""
    from forensics.capture.handler import parse_core_head

    # GIVEN the first bytes of an AArch64 core, as the core handler reads them from the kernel's stream
    core = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    with open(core, "rb") as f:
        head = f.read(1 << 20)
    # WHEN the handler takes the crash site from them
    site = parse_core_head(head)
    # THEN its pc and signal are the crashed thread's (the core reader's, equal to gdb-multiarch's frame #0)
    first = open_core(str(core)).threads[0]
    assert (site.pc, site.signal) == (first.pc, 11)


def test_without_a_sysroot_this_machines_files_of_the_same_name_are_not_used(arm64_cores):
    """This machine has a /usr/bin/python3.11 too, an x86-64 one: read as the arm64 executable's program headers
    it gave a wrong dynamic section ("holds no DT_DEBUG")."""
    # GIVEN qemu's core of /usr/bin/python3.11, and no --sysroot
    core = arm64_cores.core("bookworm", "segv", cpu=NO_PAC)
    # WHEN it is analysed
    r = analyze("--json", str(core))
    # THEN the result is partial: the objects cannot be named, and the warning says to give the sysroot; the
    # threads and the signal are there
    assert r.exit_code == EXIT_PARTIAL and "internal error" not in r.stderr, r.stderr[-2000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["core"]["libraries"] == [] and len(snap["threads"]) == 2
    assert any("neither in the core nor in its file (give --sysroot or --exe)" in p for p in snap["core"]["problems"])
    # and the Python stacks are said missing for want of the files, not "not a Python process" (it was)
    assert snap["python_status"] == "no-runtime" and "pass --sysroot" in snap["python_stack_status"]


@needs_gdb
def test_gdb_on_a_pac_core_without_the_mask_says_why_it_stops(arm64_cores):
    """gdb-multiarch cannot strip the signed return addresses of a core with HWCAP_PACA and no NT_ARM_PAC_MASK:
    its stacks stopped after one frame with only 'Register 69 is not available' to say why."""
    # GIVEN qemu's core of Debian unstable's CPython under qemu's PAC CPU
    core, sysroot = arm64_cores.core("sid", "segv"), arm64_cores.sysroot("sid")
    # WHEN its native stacks are asked of gdb
    r = analyze("--json", "--native-method", "gdb", "--sysroot", str(sysroot), str(core))
    # THEN gdb's single frames are shown, and a warning says why and what unwinds it whole
    assert r.exit_code == EXIT_OK, r.output[-2000:]
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["core"]["pac_mask_missing"] is True and snap["native_method"] == "gdb"
    assert any("no NT_ARM_PAC_MASK note" in w and "--native-method libdw" in w for w in snap["warnings"])
    assert open_core(str(arm64_cores.core("sid", "segv", cpu=NO_PAC))).pac_mask_missing is False
