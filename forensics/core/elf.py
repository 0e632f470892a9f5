"""Pure parsers for the ELF structures of an x86-64 or AArch64 Linux core file.

Every ``parse_*`` function here takes bytes (or any buffer) and returns records;
none of them does I/O, so each is unit-tested on bytes built with :mod:`struct`.
The layouts are the kernel's (``include/uapi/linux/elfcore.h``, ``fs/binfmt_elf.c``); the
registers' are the machine's (``arch/x86/include/asm/user_64.h``,
``arch/arm64/include/uapi/asm/ptrace.h``), chosen by an :class:`~forensics.core.arch.ArchSpec`.

:func:`check_core_header` and :func:`identify_non_elf` turn a file's first
bytes into the one-line errors of :mod:`forensics.errors`.
"""
from __future__ import annotations

import signal
import struct
from collections.abc import Iterator

from forensics.core.arch import X86_64, ArchSpec, spec_for
from forensics.records import record
from forensics.errors import NotACoreFile, UnsupportedTarget
from forensics.model import CoreThread, SigInfo

__all__ = [
    "ELF_MAGIC",
    "ET_CORE",
    "EM_X86_64",
    "EM_AARCH64",
    "PT_LOAD",
    "PT_DYNAMIC",
    "PT_NOTE",
    "PF_R",
    "PF_W",
    "PF_X",
    "PN_XNUM",
    "MAX_NOTE_BYTES",
    "MAX_NOTES",
    "NT_PRSTATUS",
    "REGISTER_NAMES",
    "parse_prstatus_registers",
    "NT_PRPSINFO",
    "NT_AUXV",
    "NT_SIGINFO",
    "NT_FILE",
    "NT_ARM_TLS",
    "NT_ARM_PAC_MASK",
    "parse_pac_mask",
    "NT_GNU_BUILD_ID",
    "AT_PHDR",
    "AT_PAGESZ",
    "AT_ENTRY",
    "AT_EXECFN",
    "ElfHeader",
    "ProgramHeader",
    "Note",
    "PsInfo",
    "FileMapping",
    "machine_name",
    "identify_non_elf",
    "parse_elf_header",
    "check_core_header",
    "parse_program_headers",
    "iter_notes",
    "cut_note",
    "parse_notes",
    "parse_xnum_phnum",
    "core_extent",
    "parse_prstatus",
    "parse_prpsinfo",
    "parse_siginfo",
    "parse_auxv",
    "auxv_vector",
    "parse_nt_file",
    "parse_nt_file_page_size",
    "parse_build_id",
    "parse_dynamic",
    "signal_name",
    "format_perms",
]

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1

ET_REL, ET_EXEC, ET_DYN, ET_CORE = 1, 2, 3, 4
EM_X86_64 = 62
EM_AARCH64 = 183
PN_XNUM = 0xFFFF

PT_LOAD, PT_DYNAMIC, PT_NOTE = 1, 2, 4
#: bounds on a core's notes, read whole into memory: a kernel core holds about 4 notes and 4 KiB per thread
#: (11 KiB with AMX state) plus an NT_FILE of at most 4 MiB, so these fit 10,000 threads with room to spare
MAX_NOTE_BYTES = 128 << 20
MAX_NOTES = 1 << 18
PF_X, PF_W, PF_R = 1, 2, 4

NT_PRSTATUS = 1
NT_PRPSINFO = 3
NT_AUXV = 6
NT_SIGINFO = 0x53494749  # "SIGI"
NT_FILE = 0x46494C45  # "FILE"
NT_ARM_TLS = 0x401  # owner "LINUX": TPIDR_EL0
NT_ARM_PAC_MASK = 0x406  # owner "LINUX": struct user_pac_mask { data_mask, insn_mask }
NT_GNU_BUILD_ID = 3

AT_NULL, AT_PHDR, AT_PAGESZ, AT_ENTRY, AT_EXECFN = 0, 3, 6, 9, 31

EHDR64_SIZE = 64
PHDR64_SIZE = 56
SHDR64_SIZE = 64

_EHDR64 = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR64 = struct.Struct("<IIQQQQQQ")
_NHDR = struct.Struct("<III")

# struct elf_prstatus (64-bit): pr_info(12) pr_cursig(2)+pad(2) pr_sigpend(8) pr_sighold(8)
# pr_pid pr_ppid pr_pgrp pr_sid (4 each) 4 x timeval(16) -> pr_reg at 112: 27 x u64 on x86-64 (336 bytes
# in all), 34 x u64 on AArch64 (392); the machine's ArchSpec says which.
PRSTATUS_SIZE = X86_64.prstatus_size
_PRSTATUS_CURSIG = 12
_PRSTATUS_PID = 32
_PRSTATUS_REGS = 112

# struct elf_prpsinfo (x86-64): state sname zomb nice (1 each) pad(4) pr_flag(8) uid gid pid ppid
# pgrp sid (4 each) pr_fname[16] pr_psargs[80] = 136 bytes.
PRPSINFO_SIZE = 136
_PRPSINFO = struct.Struct("<ccbb4xQIIiiii16s80s")

# siginfo_t: si_signo si_errno si_code (int each), pad, then the union at 16.
SIGINFO_MIN_SIZE = 24
_SI_USER, _SI_QUEUE, _SI_TKILL = 0, -1, -6
_FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})

_MACHINES = {
    3: "i386",
    8: "MIPS",
    20: "PowerPC",
    21: "PowerPC64",
    22: "S/390",
    40: "ARM",
    42: "SuperH",
    43: "SPARC v9",
    62: "x86-64",
    183: "AArch64",
    243: "RISC-V",
    258: "LoongArch",
}

# (magic, what, tool, the suffix the tool expects when decompressing in place)
_COMPRESSED = (
    (b"\x1f\x8b", "gzip-compressed data", "gzip", ".gz"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "zstd", ".zst"),
    (b"\xfd7zXZ\x00", "xz-compressed data", "xz", ".xz"),
    (b"BZh", "bzip2-compressed data", "bzip2", ".bz2"),
    (b"\x04\x22\x4d\x18", "lz4-compressed data", "lz4", ".lz4"),
)


@record
class ElfHeader:
    """The fields of an ELF header that forensics looks at."""

    elf_class: int  # 1 = 32-bit, 2 = 64-bit
    data: int  # 1 = little endian, 2 = big endian
    type: int
    machine: int
    phoff: int = 0
    shoff: int = 0
    phentsize: int = 0
    phnum: int = 0
    shentsize: int = 0
    shnum: int = 0


@record
class ProgramHeader:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int


@record
class Note:
    name: bytes  # without the terminating NUL, e.g. b"CORE"
    type: int
    desc: bytes


@record
class PsInfo:
    """NT_PRPSINFO: the process as ``ps`` would show it."""

    pid: int
    ppid: int
    uid: int
    gid: int
    state: str
    command: str  # pr_fname, at most 15 characters
    args: str  # pr_psargs, at most 80 characters
    args_full: bool = False  # pr_psargs filled to the kernel's 79 bytes (before trailing spaces were dropped): cut


@record
class FileMapping:
    """One NT_FILE entry: a file-backed mapping."""

    start: int
    end: int
    offset: int  # in bytes (page offset * page size)
    path: str

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end


def machine_name(machine: int) -> str:
    """Name an ``e_machine`` value.

    >>> machine_name(183)
    'AArch64'
    """
    return _MACHINES.get(machine, f"machine {machine}")


def identify_non_elf(head: bytes, path: str) -> tuple[str, str]:
    """Say what a file that is not ELF is, from its first bytes.

    :param head: the file's first bytes (4 KiB is plenty; empty for an empty file)
    :param path: the file's path, used in the suggested command
    :return: ``(what, hint)`` for :class:`~forensics.errors.NotACoreFile`

    >>> identify_non_elf(b"\\x28\\xb5\\x2f\\xfd\\x00", "core.zst")
    ('zstd-compressed data', 'decompress it first: zstd -d -k core.zst')
    >>> identify_non_elf(b"\\x1f\\x8b\\x08", "core.1234")[1]
    'decompress it first: gzip -d -c core.1234 > core.1234.core'
    """
    import shlex  # here: only a file that is no core needs it

    if not head:
        return "an empty file", "the kernel wrote nothing: check the core size limit (ulimit -c) and free disk space"
    for magic, what, tool, suffix in _COMPRESSED:
        if head.startswith(magic):
            if path.endswith(suffix) and len(path) > len(suffix):
                return what, f"decompress it first: {tool} -d -k {shlex.quote(path)}"
            return what, f"decompress it first: {tool} -d -c {shlex.quote(path)} > {shlex.quote(path + '.core')}"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive", f"extract the core first: unzip {shlex.quote(path)}"
    if head[257:262] == b"ustar":
        return "a tar archive", f"extract the core first: tar -xf {shlex.quote(path)}"
    if _looks_like_text(head):
        if head.startswith(b"ProblemType:"):
            return "an apport crash report", f"extract its core first: apport-unpack {shlex.quote(path)} DIR"
        return "a text file", ""
    shown = " ".join(f"{b:02x}" for b in head[:8])
    return f"not an ELF file (starts with {shown})", ""


def _looks_like_text(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut at the end of the sample is still text
        if e.start < len(head) - 4:
            return False
        text = head[: e.start].decode("utf-8")
    printable = sum(1 for c in text if c.isprintable() or c in "\t\r\n\f\v")
    return printable >= 0.95 * max(len(text), 1)


def parse_elf_header(data: bytes) -> ElfHeader:
    """Parse the identification and, for 64-bit little-endian files, the rest of an ELF header.

    :param data: at least the first 20 bytes of the file (64 for a full ELF64 header)
    :raises ValueError: when the data is not an ELF header
    """
    if len(data) < 20 or data[:4] != ELF_MAGIC:
        raise ValueError("not an ELF header")
    elf_class, encoding = data[4], data[5]
    order = ">" if encoding == 2 else "<"
    etype, machine = struct.unpack_from(order + "HH", data, 16)
    if elf_class != ELFCLASS64 or encoding != ELFDATA2LSB or len(data) < EHDR64_SIZE:
        return ElfHeader(elf_class=elf_class, data=encoding, type=etype, machine=machine)
    (_, etype, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _EHDR64.unpack_from(
        data, 0
    )
    return ElfHeader(
        elf_class=elf_class,
        data=encoding,
        type=etype,
        machine=machine,
        phoff=phoff,
        shoff=shoff,
        phentsize=phentsize,
        phnum=phnum,
        shentsize=shentsize,
        shnum=shnum,
    )


def check_core_header(header: ElfHeader, path: str) -> None:
    """Raise unless the header is an ELF64 little-endian core of a machine forensics reads (x86-64, AArch64).

    :raises NotACoreFile: when the ELF type is not ET_CORE
    :raises UnsupportedTarget: when it is a core of another machine, 32-bit or big-endian
    """
    if header.type != ET_CORE:
        if header.type in (ET_EXEC, ET_DYN):
            raise NotACoreFile(
                path, "an ELF executable/shared object", "pass the core, not the program; the program goes to --exe"
            )
        if header.type == ET_REL:
            raise NotACoreFile(path, "an ELF relocatable object (.o)")
        raise NotACoreFile(path, f"an ELF file of type {header.type}")
    bits = "32-bit " if header.elf_class != ELFCLASS64 else ""
    endian = "big-endian " if header.data != ELFDATA2LSB else ""
    if spec_for(header.machine) is None or bits or endian:
        raise UnsupportedTarget(
            path,
            f"{bits}{endian}ELF core for {machine_name(header.machine)} (e_machine {header.machine}); "
            "forensics reads x86-64 and AArch64 cores",
        )
    if header.phentsize != PHDR64_SIZE:
        raise UnsupportedTarget(path, f"program header entries of {header.phentsize} bytes (expected 56)")


def parse_program_headers(data: bytes, count: int) -> tuple[ProgramHeader, ...]:
    """Parse ``count`` ELF64 program headers from the start of ``data``.

    :raises ValueError: when ``data`` holds fewer than ``count`` headers
    """
    if len(data) < count * PHDR64_SIZE:
        raise ValueError(f"{count} program headers need {count * PHDR64_SIZE} bytes, got {len(data)}")
    out = []
    for i in range(count):
        ptype, flags, offset, vaddr, _paddr, filesz, memsz, align = _PHDR64.unpack_from(data, i * PHDR64_SIZE)
        out.append(
            ProgramHeader(type=ptype, flags=flags, offset=offset, vaddr=vaddr, filesz=filesz, memsz=memsz, align=align)
        )
    return tuple(out)


def parse_xnum_phnum(section_header0: bytes) -> int:
    """The real program header count of a file whose ``e_phnum`` is PN_XNUM (``sh_info`` of section 0)."""
    if len(section_header0) < SHDR64_SIZE:
        raise ValueError("section header 0 is cut short")
    return struct.unpack_from("<I", section_header0, 44)[0]


def core_extent(phdrs: tuple[ProgramHeader, ...], ph_end: int) -> int:
    """The size a whole core file measures: where its last PT_LOAD / PT_NOTE data, or its program headers, end.

    The one definition of "a complete core" for the reader (truncated cores) and the core handler
    (a stream that ended early).
    """
    return max(max((p.offset + p.filesz for p in phdrs if p.type in (PT_LOAD, PT_NOTE)), default=ph_end), ph_end)


def _align4(n: int) -> int:
    return (n + 3) & ~3


def iter_notes(data: bytes) -> Iterator[Note]:
    """Yield the notes of a note segment; a note cut short at the end is not yielded."""
    pos, end = 0, len(data)
    while pos + _NHDR.size <= end:
        namesz, descsz, ntype = _NHDR.unpack_from(data, pos)
        name_at = pos + _NHDR.size
        desc_at = name_at + _align4(namesz)
        desc_end = desc_at + descsz
        if desc_end > end:
            return
        name = bytes(data[name_at : name_at + namesz]).rstrip(b"\x00")
        yield Note(name=name, type=ntype, desc=bytes(data[desc_at:desc_end]))
        pos = desc_at + _align4(descsz)


def cut_note(data: bytes) -> tuple[int, int] | None:
    """Where :func:`iter_notes` stopped short: ``(offset of the note that claims more bytes than the segment
    holds, the bytes it claims)``; None when every note is whole (the headers are walked, nothing copied).

    >>> import struct
    >>> cut_note(struct.pack("<III", 5, 0xFFFF_FFF0, 1) + b"CORE\\0\\0\\0\\0")
    (0, 4294967300)
    """
    pos, end = 0, len(data)
    while pos + _NHDR.size <= end:
        namesz, descsz, _ = _NHDR.unpack_from(data, pos)
        desc_end = pos + _NHDR.size + _align4(namesz) + descsz
        if desc_end > end:
            return pos, desc_end - pos
        pos = desc_end + (_align4(descsz) - descsz)
    return None


def parse_notes(data: bytes) -> tuple[Note, ...]:
    """Parse every complete note of a PT_NOTE segment (4-byte aligned, as the kernel writes them).

    >>> import struct
    >>> parse_notes(struct.pack("<III", 5, 4, 1) + b"CORE\\0\\0\\0\\0" + b"abcd")
    (Note(name=b'CORE', type=1, desc=b'abcd'),)
    """
    return tuple(iter_notes(data))


def parse_prstatus(desc: bytes, spec: ArchSpec = X86_64) -> CoreThread:
    """Parse an NT_PRSTATUS note (``struct elf_prstatus`` of ``spec``'s machine) into a :class:`CoreThread`.

    :raises ValueError: when the note is shorter than the machine's layout
    """
    pid, regs = parse_prstatus_registers(desc, spec)
    cursig = struct.unpack_from("<h", desc, _PRSTATUS_CURSIG)[0]
    return CoreThread(tid=pid, signal=cursig, pc=regs[spec.pc], sp=regs[spec.sp],
                      fs_base=regs[spec.thread_pointer] if spec.thread_pointer else 0)


#: x86-64 ``struct user_regs_struct``, the order of the registers in NT_PRSTATUS
REGISTER_NAMES = X86_64.registers


def parse_prstatus_registers(desc: bytes, spec: ArchSpec = X86_64) -> tuple[int, dict[str, int]]:
    """(tid, every general register by name) of an NT_PRSTATUS note of ``spec``'s machine.

    :raises ValueError: when the note is shorter than the machine's layout
    """
    if len(desc) < spec.prstatus_size:
        raise ValueError(f"NT_PRSTATUS has {len(desc)} bytes, expected {spec.prstatus_size} ({spec.arch.value})")
    pid = struct.unpack_from("<i", desc, _PRSTATUS_PID)[0]
    regs = struct.unpack_from(f"<{len(spec.registers)}Q", desc, _PRSTATUS_REGS)
    return pid, dict(zip(spec.registers, regs, strict=True))


def parse_pac_mask(desc: bytes) -> tuple[int, int]:
    """(data mask, instruction mask) of an NT_ARM_PAC_MASK note: the bits of a pointer that hold its
    pointer-authentication code.

    >>> import struct
    >>> [hex(m) for m in parse_pac_mask(struct.pack("<QQ", 0xff7f << 48, 0xff7f << 48))]
    ['0xff7f000000000000', '0xff7f000000000000']

    :raises ValueError: when the note is shorter than its two masks
    """
    if len(desc) < 16:
        raise ValueError(f"NT_ARM_PAC_MASK has {len(desc)} bytes, expected 16")
    data, insn = struct.unpack_from("<QQ", desc, 0)
    return data, insn


def _c_string(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", errors="replace")


def parse_prpsinfo(desc: bytes) -> PsInfo:
    """Parse an NT_PRPSINFO note (x86-64 ``struct elf_prpsinfo``).

    :raises ValueError: when the note is shorter than the x86-64 layout
    """
    if len(desc) < PRPSINFO_SIZE:
        raise ValueError(f"NT_PRPSINFO has {len(desc)} bytes, expected {PRPSINFO_SIZE} (x86-64)")
    _state, sname, _zomb, _nice, _flag, uid, gid, pid, ppid, _pgrp, _sid, fname, psargs = _PRPSINFO.unpack_from(desc, 0)
    return PsInfo(
        pid=pid,
        ppid=ppid,
        uid=uid,
        gid=gid,
        state=sname.decode("latin-1").strip("\x00"),
        command=_c_string(fname),
        # a record filled to the kernel's 79 bytes is cut: kept as it is (a trailing space says the cut fell
        # between two arguments), else the padding dropped
        args=_c_string(psargs) if len(_c_string(psargs)) >= 79 else _c_string(psargs).rstrip(" "),
        args_full=len(_c_string(psargs)) >= 79,
    )


def signal_name(signo: int) -> str:
    """The conventional name of a signal number.

    >>> signal_name(6), signal_name(36)
    ('SIGABRT', 'SIGRTMIN+2')
    """
    try:
        return signal.Signals(signo).name
    except ValueError:
        if signal.SIGRTMIN < signo < signal.SIGRTMAX:
            return f"SIGRTMIN+{signo - signal.SIGRTMIN}"
        return f"SIG{signo}"


def parse_siginfo(desc: bytes) -> SigInfo:
    """Parse an NT_SIGINFO note (the kernel's ``siginfo_t``).

    ``addr`` is set for the fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL) when the
    kernel raised them (``si_code > 0``); ``sender_pid`` for signals sent by
    ``kill``/``sigqueue``/``tgkill`` (``SI_USER``, ``SI_QUEUE``, ``SI_TKILL``), as
    ``abort()`` does, and ``sender_uid`` beside it (``si_pid``, ``si_uid``: the union's first two words).

    :raises ValueError: when the note is too short
    """
    if len(desc) < SIGINFO_MIN_SIZE:
        raise ValueError(f"NT_SIGINFO has {len(desc)} bytes, expected at least {SIGINFO_MIN_SIZE}")
    signo, errno, code = struct.unpack_from("<iii", desc, 0)
    addr = sender = uid = None
    if signo in _FAULT_SIGNALS and code > 0:
        addr = struct.unpack_from("<Q", desc, 16)[0]
    elif code in (_SI_USER, _SI_QUEUE, _SI_TKILL):
        sender, uid = struct.unpack_from("<iI", desc, 16)
    return SigInfo(signo=signo, code=code, errno=errno, name=signal_name(signo), addr=addr, sender_pid=sender,
                   sender_uid=uid)


def parse_auxv(desc: bytes) -> dict[int, int]:
    """Parse an NT_AUXV note into ``{a_type: a_val}``, up to AT_NULL.

    >>> import struct
    >>> parse_auxv(struct.pack("<6Q", 6, 4096, 9, 0x401000, 0, 0))
    {6: 4096, 9: 4198400}
    """
    out: dict[int, int] = {}
    for i in range(len(desc) // 16):
        a_type, a_val = struct.unpack_from("<QQ", desc, i * 16)
        if a_type == AT_NULL:
            break
        out.setdefault(a_type, a_val)
    return out


def auxv_vector(desc: bytes) -> bytes:
    """The NT_AUXV note's bytes up to and including the AT_NULL entry (the note may be padded past it).

    >>> import struct
    >>> len(auxv_vector(struct.pack("<8Q", 6, 4096, 0, 0, 0, 0, 0, 0)))
    32
    """
    for i in range(len(desc) // 16):
        if struct.unpack_from("<Q", desc, i * 16)[0] == AT_NULL:
            return desc[: i * 16 + 16]
    return desc[: len(desc) // 16 * 16]


#: page sizes an NT_FILE note may count in: the kernel's PAGE_SIZE (4 KiB on x86-64; 16 and 64 KiB
#: elsewhere), and 1 -- gdb's gcore / generate-core-file writes byte offsets with a "page size" of 1
_PAGE_SIZES = frozenset({1, 1 << 12, 1 << 14, 1 << 16})
#: the largest file offset a mapping can have (off_t is signed 64-bit)
_MAX_FILE_OFFSET = (1 << 63) - 1


def parse_nt_file(desc: bytes) -> tuple[FileMapping, ...]:
    """Parse an NT_FILE note: every file-backed mapping with its path.

    Layout: ``count, page_size`` then ``count`` x ``(start, end, page_offset)`` then
    ``count`` NUL-terminated paths.

    :raises ValueError: when the note is cut short or names a mapping no process can have (empty, or an offset
        past any file)
    """
    if len(desc) < 16:
        raise ValueError("NT_FILE is shorter than its header")
    count, page_size = struct.unpack_from("<QQ", desc, 0)
    if page_size not in _PAGE_SIZES:
        raise ValueError(f"NT_FILE counts offsets in pages of {page_size} bytes (the kernel: 4096 on x86-64; gdb: 1)")
    table_end = 16 + count * 24
    if table_end > len(desc):
        raise ValueError(f"NT_FILE names {count} mappings but holds {len(desc)} bytes")
    names = bytes(desc[table_end:]).split(b"\x00")
    if len(names) < count + (1 if count else 0):
        raise ValueError(f"NT_FILE names {count} mappings but holds {len(names) - 1} paths")
    out = []
    for i in range(count):
        start, end, pgoff = struct.unpack_from("<QQQ", desc, 16 + i * 24)
        # the kernel writes neither an empty mapping nor a file offset past off_t's range: such an entry is not
        # one a core holds, and its offset would be read from the file as given
        if end <= start:
            raise ValueError(f"NT_FILE entry {i} ends at {end:#x}, not after its start {start:#x}")
        if pgoff * page_size > _MAX_FILE_OFFSET:
            raise ValueError(f"NT_FILE entry {i} starts {pgoff * page_size:#x} bytes into its file, past any file")
        out.append(
            FileMapping(
                start=start, end=end, offset=pgoff * page_size, path=names[i].decode("utf-8", errors="surrogateescape")
            )
        )
    return tuple(out)


def parse_nt_file_page_size(desc: bytes) -> int:
    """The crashed machine's page size as an NT_FILE note tells it (the kernel's PAGE_SIZE).

    4096 when absent, not a page size, or gdb's 1 (gdb counts offsets in bytes: that says
    nothing of the page size, which the readers use to align their searches).
    """
    if len(desc) < 16:
        return 4096
    size = struct.unpack_from("<Q", desc, 8)[0]
    return size if size in _PAGE_SIZES and size >= 4096 else 4096


def parse_build_id(note_data: bytes) -> str | None:
    """Find the GNU build-id (NT_GNU_BUILD_ID, owner "GNU") in note data, as lowercase hex.

    >>> import struct
    >>> parse_build_id(struct.pack("<III", 4, 4, 3) + b"GNU\\0" + bytes.fromhex("deadbeef"))
    'deadbeef'
    """
    for note in iter_notes(note_data):
        if note.type == NT_GNU_BUILD_ID and note.name == b"GNU" and note.desc:
            return note.desc.hex()
    return None


def parse_dynamic(data: bytes) -> dict[int, int]:
    """Parse ELF64 ``Elf64_Dyn`` entries up to DT_NULL into ``{d_tag: d_val}`` (first wins)."""
    out: dict[int, int] = {}
    for i in range(len(data) // 16):
        tag, val = struct.unpack_from("<qQ", data, i * 16)
        if tag == 0:
            break
        out.setdefault(tag, val)
    return out


def format_perms(flags: int) -> str:
    """``"r-xp"``-style permissions from PT_LOAD ``p_flags``.

    A core does not record whether a mapping was shared, so the last letter is
    always ``p``.

    >>> format_perms(5)
    'r-xp'
    """
    return (
        ("r" if flags & PF_R else "-") + ("w" if flags & PF_W else "-") + ("x" if flags & PF_X else "-") + "p"
    )
