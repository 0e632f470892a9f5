"""Pure parsers of forensics.core.elf, fed note bytes built with struct."""
from __future__ import annotations

import signal
import struct

import pytest

from forensics.core import elf
from forensics.errors import NotACoreFile, UnsupportedTarget


def note(name: bytes, ntype: int, desc: bytes) -> bytes:
    raw = name + b"\x00"
    pad = lambda b: b + b"\x00" * (-len(b) % 4)  # noqa: E731
    return struct.pack("<III", len(raw), len(desc), ntype) + pad(raw) + pad(desc)


def prstatus(*, pid: int, cursig: int, rip: int, rsp: int, fs_base: int) -> bytes:
    b = bytearray(elf.PRSTATUS_SIZE)
    struct.pack_into("<iii", b, 0, cursig, 0, 0)
    struct.pack_into("<h", b, 12, cursig)
    struct.pack_into("<iiii", b, 32, pid, 1, pid, pid)
    regs = [0] * 27
    regs[16], regs[19], regs[21] = rip, rsp, fs_base
    regs[10] = 0xAAAA  # rax: must not leak into the fields
    struct.pack_into("<27Q", b, 112, *regs)
    return bytes(b)


def prpsinfo(*, pid: int, fname: bytes, psargs: bytes) -> bytes:
    fields = (b"\x00", b"R", 0, 0, 0x400600, 1000, 1000, pid, 1, pid, pid, fname, psargs)
    return struct.pack("<ccbb4xQIIiiii16s80s", *fields)


def ehdr(*, etype: int = elf.ET_CORE, machine: int = elf.EM_X86_64, cls: int = 2, data: int = 1) -> bytes:
    ident = b"\x7fELF" + bytes([cls, data, 1, 0]) + bytes(8)
    order = ">" if data == 2 else "<"
    rest = struct.pack(order + "HHIQQQIHHHHHH", etype, machine, 1, 0, 64, 0, 0, 64, 56, 3, 0, 0, 0)
    return ident + rest


# -- notes -------------------------------------------------------------------------------------


def test_parse_notes_reads_name_type_desc_and_padding():
    # GIVEN two notes whose name and desc need padding
    data = note(b"CORE", 1, b"abcde") + note(b"LINUX", 0x202, b"xyz")
    # WHEN
    notes = elf.parse_notes(data)
    # THEN
    assert [(n.name, n.type, n.desc) for n in notes] == [(b"CORE", 1, b"abcde"), (b"LINUX", 0x202, b"xyz")]


def test_parse_notes_drops_a_note_cut_short():
    data = note(b"CORE", 1, b"a" * 16) + note(b"CORE", 6, b"b" * 64)
    assert [n.type for n in elf.parse_notes(data[:-10])] == [1]
    assert elf.parse_notes(data[:5]) == ()


def test_parse_prstatus_takes_tid_signal_and_registers():
    desc = prstatus(pid=4242, cursig=11, rip=0x7F00DEADBEEF, rsp=0x7FFC0000, fs_base=0x7F0012345678)
    t = elf.parse_prstatus(desc)
    assert (t.tid, t.signal, t.pc, t.sp, t.fs_base) == (4242, 11, 0x7F00DEADBEEF, 0x7FFC0000, 0x7F0012345678)


def test_parse_prstatus_rejects_a_short_note():
    with pytest.raises(ValueError, match="x86-64"):
        elf.parse_prstatus(bytes(200))


def test_parse_prpsinfo():
    info = elf.parse_prpsinfo(prpsinfo(pid=77, fname=b"python3", psargs=b"python3 exporter.py segv "))
    got = (info.pid, info.command, info.args, info.state, info.uid)
    assert got == (77, "python3", "python3 exporter.py segv", "R", 1000)


def siginfo(signo: int, code: int, word: int) -> bytes:
    return struct.pack("<iiiiQ", signo, 0, code, 0, word) + bytes(104)


@pytest.mark.parametrize(
    "signo,code,word,addr,sender",
    [
        pytest.param(11, 1, 0x10, 0x10, None, id="SIGSEGV,SEGV_MAPERR->addr"),
        pytest.param(7, 2, 0x7F0000001000, 0x7F0000001000, None, id="SIGBUS->addr"),
        pytest.param(8, 1, 0x401000, 0x401000, None, id="SIGFPE->addr"),
        pytest.param(4, 2, 0x401002, 0x401002, None, id="SIGILL->addr"),
        pytest.param(6, -6, 321, None, 321, id="SIGABRT,SI_TKILL->pid"),
        pytest.param(9, 0, 55, None, 55, id="SIGKILL,SI_USER->pid"),
        pytest.param(11, 0, 55, None, 55, id="SIGSEGV-sent-by-kill->pid-not-addr"),
        pytest.param(6, 0x80, 0, None, None, id="SI_KERNEL->neither"),
    ],
)
def test_parse_siginfo(signo, code, word, addr, sender):
    s = elf.parse_siginfo(siginfo(signo, code, word))
    assert (s.signo, s.code, s.errno, s.addr, s.sender_pid) == (signo, code, 0, addr, sender)
    assert s.name == signal.Signals(signo).name


def test_signal_name_of_realtime_and_unknown_signals():
    assert elf.signal_name(signal.SIGRTMIN + 1) == "SIGRTMIN+1"
    assert elf.signal_name(200) == "SIG200"


def test_parse_auxv_stops_at_at_null():
    desc = struct.pack("<8Q", elf.AT_PHDR, 0x400040, elf.AT_EXECFN, 0x7FFF0000, 0, 0, elf.AT_ENTRY, 1)
    assert elf.parse_auxv(desc) == {elf.AT_PHDR: 0x400040, elf.AT_EXECFN: 0x7FFF0000}


def nt_file(entries, page_size=4096) -> bytes:
    head = struct.pack("<QQ", len(entries), page_size)
    table = b"".join(struct.pack("<QQQ", s, e, off) for s, e, off, _ in entries)
    names = b"".join(p.encode() + b"\x00" for *_, p in entries)
    return head + table + names


def test_parse_nt_file_scales_offsets_by_page_size():
    desc = nt_file([(0x400000, 0x401000, 0, "/usr/bin/x"), (0x7F0000000000, 0x7F0000002000, 3, "/lib/libc.so.6")])
    maps = elf.parse_nt_file(desc)
    assert [(m.start, m.end, m.offset, m.path) for m in maps] == [
        (0x400000, 0x401000, 0, "/usr/bin/x"),
        (0x7F0000000000, 0x7F0000002000, 3 * 4096, "/lib/libc.so.6"),
    ]
    assert elf.parse_nt_file_page_size(desc) == 4096


def test_parse_nt_file_takes_gdbs_byte_offsets():
    # gdb's gcore / generate-core-file writes NT_FILE with a "page size" of 1: offsets in bytes
    desc = nt_file([(0x7F0000000000, 0x7F0000002000, 0x3000, "/lib/libc.so.6")], page_size=1)
    assert [m.offset for m in elf.parse_nt_file(desc)] == [0x3000]
    assert elf.parse_nt_file_page_size(desc) == 4096  # the machine's page size: gdb's 1 tells nothing of it


def test_parse_nt_file_refuses_a_page_size_that_is_none():
    with pytest.raises(ValueError, match="pages of 3 bytes"):
        elf.parse_nt_file(nt_file([(1, 2, 0, "/a")], page_size=3))


@pytest.mark.parametrize("entry, words", [
    ((0x7F0000002000, 0x7F0000002000, 0, "/lib/libc.so.6"), "not after its start"),  # empty
    ((0x7F0000002000, 0x7F0000001000, 0, "/lib/libc.so.6"), "not after its start"),  # backwards
    ((0x7F0000000000, 0x7F0000001000, (1 << 64) - 1, "/lib/libc.so.6"), "past any file"),  # off_t overflows
])
def test_parse_nt_file_refuses_a_mapping_no_process_has(entry, words):
    # a mutated core's NT_FILE offset of 2**64-1 pages made analyze pread() past off_t: an internal error
    desc = nt_file([(0x400000, 0x401000, 0, "/usr/bin/x"), entry])
    with pytest.raises(ValueError, match=f"entry 1 .*{words}"):
        elf.parse_nt_file(desc)


def test_parse_nt_file_rejects_missing_paths():
    desc = nt_file([(1, 2, 0, "/a"), (3, 4, 0, "/b")])
    with pytest.raises(ValueError):
        elf.parse_nt_file(desc[: -len(b"/b\x00") - 1])
    with pytest.raises(ValueError):
        elf.parse_nt_file(desc[:30])


def test_parse_build_id_skips_other_notes():
    data = note(b"GNU", 1, bytes(16)) + note(b"GNU", elf.NT_GNU_BUILD_ID, bytes.fromhex("0123456789abcdef"))
    assert elf.parse_build_id(data) == "0123456789abcdef"
    assert elf.parse_build_id(note(b"XYZ", elf.NT_GNU_BUILD_ID, b"\x01")) is None


def test_parse_dynamic_stops_at_dt_null():
    data = struct.pack("<qQqQqQqQ", 5, 0x1000, 6, 0x2000, 0, 0, 5, 0x9999)
    assert elf.parse_dynamic(data) == {5: 0x1000, 6: 0x2000}


def test_parse_program_headers():
    raw = struct.pack("<IIQQQQQQ", elf.PT_LOAD, 5, 0x3000, 0x400000, 0, 0x1000, 0x2000, 0x1000)
    (p,) = elf.parse_program_headers(raw, 1)
    assert (p.type, p.flags, p.offset, p.vaddr, p.filesz, p.memsz) == (1, 5, 0x3000, 0x400000, 0x1000, 0x2000)
    with pytest.raises(ValueError):
        elf.parse_program_headers(raw, 2)


@pytest.mark.parametrize("flags,perms", [(4, "r--p"), (5, "r-xp"), (6, "rw-p"), (7, "rwxp"), (0, "---p"), (1, "--xp")])
def test_format_perms(flags, perms):
    assert elf.format_perms(flags) == perms


# -- identification and header checks ------------------------------------------------------------


@pytest.mark.parametrize(
    "head,what,tool,suffix",
    [
        pytest.param(b"\x1f\x8b\x08\x00" + bytes(20), "gzip-compressed data", "gzip", ".gz", id="gzip"),
        pytest.param(b"\x28\xb5\x2f\xfd\x04\x00", "zstd-compressed data", "zstd", ".zst", id="zstd"),
        pytest.param(b"\xfd7zXZ\x00\x00", "xz-compressed data", "xz", ".xz", id="xz"),
        pytest.param(b"BZh91AY&SY", "bzip2-compressed data", "bzip2", ".bz2", id="bzip2"),
        pytest.param(b"\x04\x22\x4d\x18\x64", "lz4-compressed data", "lz4", ".lz4", id="lz4"),
    ],
)
def test_identify_compressed(head, what, tool, suffix):
    # a name without the tool's suffix: decompress to stdout, since the tool cannot name the output
    got_what, hint = elf.identify_non_elf(head, "/tmp/my core")
    assert got_what == what
    assert hint == f"decompress it first: {tool} -d -c '/tmp/my core' > '/tmp/my core.core'"
    # a name with it: decompress in place, keeping the original
    assert elf.identify_non_elf(head, f"core{suffix}")[1] == f"decompress it first: {tool} -d -k core{suffix}"


def test_identify_text_empty_and_binary():
    assert elf.identify_non_elf(b"Segmentation fault (core dumped)\n", "x")[0] == "a text file"
    assert elf.identify_non_elf(b"ProblemType: Crash\nDate: now\n", "x")[0] == "an apport crash report"
    assert elf.identify_non_elf("héllo wörld ".encode() * 3 + "é".encode()[:1], "x")[0] == "a text file"
    assert elf.identify_non_elf(b"", "x")[0] == "an empty file"
    assert elf.identify_non_elf(b"\x00\x01\x02\x03\x04\x05\x06\x07\x08", "x")[0] == (
        "not an ELF file (starts with 00 01 02 03 04 05 06 07)"
    )


def test_check_core_header_accepts_x86_64_core():
    elf.check_core_header(elf.parse_elf_header(ehdr()), "core")


@pytest.mark.parametrize("etype", [elf.ET_EXEC, elf.ET_DYN])
def test_check_core_header_rejects_programs_with_exe_hint(etype):
    with pytest.raises(NotACoreFile) as e:
        elf.check_core_header(elf.parse_elf_header(ehdr(etype=etype)), "/bin/prog")
    assert str(e.value) == (
        "/bin/prog: not a core file: an ELF executable/shared object; "
        "pass the core, not the program; the program goes to --exe"
    )


def test_check_core_header_rejects_relocatable():
    with pytest.raises(NotACoreFile, match=r"relocatable object \(.o\)"):
        elf.check_core_header(elf.parse_elf_header(ehdr(etype=elf.ET_REL)), "x.o")


@pytest.mark.parametrize(
    "kwargs,what",
    [
        pytest.param({"machine": 40, "cls": 1}, "32-bit ELF core for ARM (e_machine 40)", id="arm32"),
        pytest.param({"machine": 183, "cls": 1}, "32-bit ELF core for AArch64 (e_machine 183)", id="aarch64-ilp32"),
        pytest.param({"machine": 3, "cls": 1}, "32-bit ELF core for i386 (e_machine 3)", id="i386"),
        pytest.param({"machine": 62, "cls": 1}, "32-bit ELF core for x86-64 (e_machine 62)", id="x32"),
        pytest.param({"machine": 22, "data": 2}, "big-endian ELF core for S/390 (e_machine 22)", id="s390x"),
        pytest.param({"machine": 9999}, "ELF core for machine 9999 (e_machine 9999)", id="unknown"),
    ],
)
def test_check_core_header_rejects_other_targets(kwargs, what):
    head = ehdr(**kwargs)
    if kwargs.get("cls") == 1:
        head = head[:24]  # a 32-bit header: only the identification and e_type/e_machine are read
    with pytest.raises(UnsupportedTarget) as e:
        elf.check_core_header(elf.parse_elf_header(head), "core")
    assert str(e.value) == f"core: unsupported core: {what}; forensics reads x86-64 and AArch64 cores"


def test_parse_elf_header_rejects_non_elf():
    with pytest.raises(ValueError):
        elf.parse_elf_header(b"\x7fELG" + bytes(60))


def test_parse_xnum_phnum_reads_sh_info():
    shdr0 = bytearray(64)
    struct.pack_into("<I", shdr0, 44, 70000)
    assert elf.parse_xnum_phnum(bytes(shdr0)) == 70000
