"""A fuzz target for the core reader of ``forensics analyze``: seeded mutants of real kernel cores.

The seeds are real cores of tests/crashers (a heap corruption glibc aborted on, a SIGSEGV whose
C crash reporter faults again in its handler, a Python-level abort), given with ``--core`` or
made here with tests/crashers/make_core.py.  Each seed is profiled once: where its ELF header,
program headers and notes lie, what its NT_FILE, NT_PRSTATUS, NT_AUXV, NT_SIGINFO and
NT_PRPSINFO hold, and which memory each reader reads from it -- a recording analysis, in a fork,
notes every read of the core's memory with the reader that asked for it (the Python walker,
the heap reader, the signal-frame reader, argv, the abort message, the objects' build-ids) --
plus the chunk headers of glibc's heap and the words near each thread's stack pointer (what
libdw and gdb unwind through).

Each mutant is a copy of one seed with one to three of these changed (the rest of the seed is
left whole, so the reader gets far enough to meet the change): an ELF header field, a program
header field (a segment moved, cut, grown past the file, overlapping another), a note's
header (its sizes, its type), NT_PRSTATUS (pid, signal, rip/rsp/rbp/fs_base), NT_FILE (its
count, page size, an entry's range, a path: a traversal towards the sentinel directory,
control characters, bytes that are not UTF-8), NT_SIGINFO, NT_AUXV (AT_PHDR, AT_EXECFN,
AT_SYSINFO_EHDR, AT_PAGESZ), NT_PRPSINFO (command and arguments with terminal escapes), words
of memory a reader reads (zero, all ones, random, a pointer to itself or to another structure
that reader reads, a size off by a little or a lot, a region of self-referencing words), or
the file cut at a point that matters.

Each mutant is analysed by the real command line through the shared harness (tests/fuzzing.py),
without gdb: ``--method direct`` with ``--native-method none`` or ``libdw`` (with no gdb to
fall back on), in turn with ``--json``, ``--heap``, ``--native``, ``-v`` and ``-o FILE``; every
``--gdb-every``-th mutant also with gdb (``--method gdb``, ``both``, ``auto``; gdb's
``--timeout``).  Every run must be a result (exit 0), a partial result (exit 4) or a clear
one-line error (exit 1) within its bounds, with no control character reaching the terminal,
and write nothing but its ``-o`` file.

    .venv/bin/python tests/fuzz_cores.py --count 3000 --seed 1000 --core A --core B   # more than CI's
    .venv/bin/python tests/fuzz_cores.py --count 500                                    # seeds made here
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzzing import SENTINEL_DIR, Harness, RunSpec, fuzz_count, fuzz_seed
from tests.scriptenv import require_checkout_python

__all__ = ["Profile", "profile_core", "mutate", "specs", "main", "SEED_SCENARIOS"]

#: (scenario, crash reporter) of the seeds made here when none is given
SEED_SCENARIOS = (("heap-next-size", None), ("segv", "c-segv"), ("py-abort", None))
TIME_BOUND = 60.0  # seconds for one run without gdb (a seed takes about one)
GDB_TIMEOUT = 30  # analyze --timeout for the runs with gdb
MEMORY_BOUND_MB = 1024.0

NT_PRSTATUS, NT_PRPSINFO, NT_AUXV = 1, 3, 6
NT_SIGINFO, NT_FILE = 0x53494749, 0x46494C45
PT_LOAD, PT_NOTE = 1, 4
AT = {"AT_PHDR": 3, "AT_PAGESZ": 6, "AT_ENTRY": 9, "AT_RANDOM": 25, "AT_EXECFN": 31, "AT_SYSINFO_EHDR": 33}

#: what reads which memory: the first of these modules found on the stack of a read names the reader
READERS = (("forensics.pyread", "python"), ("forensics.heap", "heap"), ("forensics.analyze.sigframe", "sigframe"),
           ("forensics.core.argv", "argv"), ("forensics.core.libc", "abort-message"),
           ("forensics.core.nvml", "nvml"), ("forensics.unwind", "native"), ("forensics.core", "objects"))

CONTROL_TEXT = [b"\x1b]0;owned\x07", b"\x1b[2J\x1b[H", b"\r\nThread \"MainThread\" [FORGED]\n", b"\x9b31m",
                b"\x08\x08\x7f", b"\xff\xfe", b"\xc2\x9b2J"]


# -- the seed's profile ----------------------------------------------------------------------------------

@dataclass
class Note:
    type: int
    name: bytes
    header: int  # file offset of its (namesz, descsz, type)
    desc: int  # file offset of its descriptor
    size: int  # descsz


@dataclass
class Profile:
    """Where the parts of a seed core lie in its file, and what its readers read."""

    path: str
    size: int
    phoff: int
    phnum: int
    phdrs: list[tuple[int, int, int, int, int, int]]  # (entry offset, type, offset, vaddr, filesz, memsz)
    notes: list[Note]
    file_entries: list[int] = field(default_factory=list)  # NT_FILE: offsets of (start, end, pgoff)
    file_paths: list[tuple[int, int]] = field(default_factory=list)  # NT_FILE: (offset, length) of each path
    auxv: dict[int, int] = field(default_factory=dict)  # a_type -> file offset of its value
    stacks: list[int] = field(default_factory=list)  # each thread's rsp
    reads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # reader -> (address, size)
    anon: list[tuple[int, int]] = field(default_factory=list)  # writable anonymous segments: (vaddr, present)

    def offset(self, addr: int, size: int = 8) -> int | None:
        """The file offset of ``size`` bytes at ``addr`` when they are in the file."""
        for _, ptype, off, vaddr, filesz, _memsz in self.phdrs:
            if ptype == PT_LOAD and vaddr <= addr and addr + size <= vaddr + filesz and off + filesz <= self.size:
                return off + addr - vaddr
        return None

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["notes"] = [dict(n.__dict__, name=n.name.decode("latin-1")) for n in self.notes]
        d["auxv"] = {str(k): v for k, v in self.auxv.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        d = dict(d)
        d["notes"] = [Note(**dict(n, name=n["name"].encode("latin-1"))) for n in d["notes"]]
        d["auxv"] = {int(k): v for k, v in d["auxv"].items()}
        d["phdrs"] = [tuple(p) for p in d["phdrs"]]
        d["file_paths"] = [tuple(p) for p in d["file_paths"]]
        d["anon"] = [tuple(p) for p in d["anon"]]
        d["reads"] = {k: [tuple(r) for r in v] for k, v in d["reads"].items()}
        return cls(**d)


def _layout(path: str) -> Profile:
    """The ELF structure of a seed, read here with struct (not with the reader under test)."""
    with open(path, "rb") as f:
        data = f.read()
    (_, _, _, _, _, phoff, _, _, _, phentsize, phnum, _, _, _) = struct.unpack_from("<16sHHIQQQIHHHHHH", data, 0)
    assert phentsize == 56 and phnum not in (0, 0xFFFF), "a seed is a plain x86-64 core"
    phdrs = []
    for i in range(phnum):
        at = phoff + i * 56
        ptype, _flags, off, vaddr, _paddr, filesz, memsz, _align = struct.unpack_from("<IIQQQQQQ", data, at)
        phdrs.append((at, ptype, off, vaddr, filesz, memsz))
    prof = Profile(path=path, size=len(data), phoff=phoff, phnum=phnum, phdrs=phdrs, notes=[])
    for _, ptype, off, _vaddr, filesz, _ in phdrs:
        if ptype != PT_NOTE:
            continue
        pos, end = off, off + filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            desc = pos + 12 + ((namesz + 3) & ~3)
            name = data[pos + 12: pos + 12 + namesz].rstrip(b"\0")
            prof.notes.append(Note(type=ntype, name=name, header=pos, desc=desc, size=descsz))
            pos = desc + ((descsz + 3) & ~3)
    for n in prof.notes:
        if n.name != b"CORE":
            continue
        if n.type == NT_FILE:
            count = struct.unpack_from("<Q", data, n.desc)[0]
            prof.file_entries = [n.desc + 16 + 24 * i for i in range(count)]
            pos = n.desc + 16 + 24 * count
            for _ in range(count):
                nul = data.index(b"\0", pos)
                prof.file_paths.append((pos, nul - pos))
                pos = nul + 1
        elif n.type == NT_AUXV:
            for i in range(n.size // 16):
                a_type = struct.unpack_from("<Q", data, n.desc + 16 * i)[0]
                if a_type == 0:
                    break
                prof.auxv.setdefault(a_type, n.desc + 16 * i + 8)
        elif n.type == NT_PRSTATUS:
            prof.stacks.append(struct.unpack_from("<Q", data, n.desc + 112 + 19 * 8)[0])
    return prof


def _record_reads(path: str, out: str) -> None:
    """In a fork: analyze the seed as ``--method direct --native-method libdw --heap`` does, noting every read
    of its memory with the reader that made it; add the heap's chunk headers; write JSON to ``out``."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status):
            raise RuntimeError(f"profiling {path} failed (status {status}); see stderr")
        return
    code = 1
    try:
        from forensics.analyze import analyze_core
        from forensics.core import memory

        reads: dict[str, set[tuple[int, int]]] = {}
        real = memory.CoreMemory._read

        def recording(self, addr, size, *, partial):
            f = sys._getframe(1)
            modules = []
            while f is not None:
                modules.append(f.f_globals.get("__name__", ""))
                f = f.f_back
            for prefix, reader in READERS:
                if any(m.startswith(prefix) and m != "forensics.core.memory" for m in modules):
                    reads.setdefault(reader, set()).add((addr, min(size, 4096)))
                    break
            return real(self, addr, size, partial=partial)

        memory.CoreMemory._read = recording
        analysis = analyze_core(path, method="direct", native_method="libdw", heap="full", gdb="/nonexistent/gdb")
        memory.CoreMemory._read = real
        heap = reads.setdefault("heap", set())
        summary = getattr(analysis.heap, "summary", None) if analysis.heap is not None else None
        if summary is not None:
            with memory.CoreMemory.open(path) as mem:
                for a in summary.arenas:
                    for h in a.heaps:
                        addr, n = h.first_chunk, 0
                        while addr < a.top and n < 2000:
                            heap.add((addr, 32))  # prev_size, size, fd, bk
                            try:
                                size = mem.read_u64(addr + 8) & ~7
                            except memory.MemoryNotInCore:
                                break
                            if size < 32:
                                break
                            addr, n = addr + size, n + 1
        rng = random.Random(0)
        doc = {k: sorted(rng.sample(sorted(v), min(len(v), 20000))) for k, v in reads.items()}
        with open(out, "w") as f:
            json.dump(doc, f)
        code = 0
    except BaseException:  # noqa: BLE001 -- the forked child reports anything, then os._exit below
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def profile_core(path: str, cache: Path) -> Profile:
    """The seed's profile, made once per seed file (keyed by its size and modification time)."""
    st = os.stat(path)
    key = cache / f"profile-{os.path.basename(path)}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}.json"
    if key.exists():
        return Profile.from_json(json.loads(key.read_text()))
    prof = _layout(path)
    reads_json = str(key) + ".reads"
    _record_reads(path, reads_json)
    with open(reads_json) as f:
        prof.reads = {k: [tuple(r) for r in v] for k, v in json.load(f).items()}
    os.unlink(reads_json)
    file_ranges = []
    for e in prof.file_entries:
        with open(path, "rb") as f:
            f.seek(e)
            file_ranges.append(struct.unpack("<QQ", f.read(16)))
    for _, ptype, _off, vaddr, filesz, _ in prof.phdrs:
        if ptype == PT_LOAD and filesz and not any(s <= vaddr < e for s, e in file_ranges):
            prof.anon.append((vaddr, filesz))
    key.write_text(json.dumps(prof.to_json()))
    return prof


# -- mutations ---------------------------------------------------------------------------------------------

class Mutant:
    """Patches to a copy of a seed: (file offset, bytes), and where the file is cut."""

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.patches: list[tuple[int, bytes]] = []
        self.cut: int | None = None
        self.what: list[str] = []

    def put(self, offset: int | None, data: bytes) -> None:
        if offset is not None and offset >= 0 and offset + len(data) <= self.prof.size:
            self.patches.append((offset, data))

    def u64(self, offset: int | None, value: int) -> None:
        self.put(offset, struct.pack("<Q", value & (1 << 64) - 1))

    def write(self, dest: str) -> None:
        shutil.copyfile(self.prof.path, dest)
        with open(dest, "r+b") as f:
            for off, data in self.patches:
                f.seek(off)
                f.write(data)
            if self.cut is not None:
                f.truncate(self.cut)


def _evil(rng: random.Random, addr: int, old: int, others: list[tuple[int, int]]) -> int:
    choice = rng.randrange(13)
    if choice == 0:
        return 0
    if choice == 1:
        return (1 << 64) - 1
    if choice == 2:
        return rng.getrandbits(64)
    if choice == 3:
        return addr  # points at itself: a one-entry cycle
    if choice == 4:
        return addr - rng.choice([8, 16, 24, 48, 0x40, 0x1000])  # the structure it is in: a cycle
    if choice == 5:
        return old ^ (1 << rng.randrange(64))
    if choice == 6:
        return old + rng.choice([-16, -8, 8, 16, 0x1000, 1 << 20, 1 << 31])
    if choice == 7 and others:
        return rng.choice(others)[0] + rng.choice([0, 8, 16, -16])  # another structure the same reader reads
    if choice == 8:
        return rng.choice([0x7FFFFFFF, 0xFFFFFFFF, 1 << 31, 1 << 40, 1 << 62, 0x8000000000000000])  # a count or size
    if choice == 9:
        return rng.choice([1, 2, 7, 0x10, 0x41414141_41414141])
    if choice == 10:
        return 0x00007FFF_FFFFF000 + rng.randrange(0x1000)  # canonical, not mapped
    if choice == 11:
        return old | 7
    return old & ~0xFFF


def _mutate_ehdr(rng: random.Random, m: Mutant) -> str:
    p = m.prof
    field_ = rng.choice(["class", "data", "version", "type", "machine", "phoff", "phentsize", "phnum", "xnum",
                         "shoff"])
    if field_ == "class":
        m.put(4, bytes([rng.choice([0, 1, 3])]))
    elif field_ == "data":
        m.put(5, bytes([rng.choice([0, 2, 9])]))
    elif field_ == "version":
        m.put(6, bytes([rng.choice([0, 2, 255])]))
    elif field_ == "type":
        m.put(16, struct.pack("<H", rng.choice([0, 1, 2, 3, 5, 0xFE00, 0xFFFF])))
    elif field_ == "machine":
        m.put(18, struct.pack("<H", rng.choice([0, 3, 40, 183, 0xFFFF])))
    elif field_ == "phoff":
        m.u64(32, rng.choice([0, 1, 63, p.size - 8, p.size, p.size + 56, 1 << 63, (1 << 64) - 1,
                              p.notes[0].header if p.notes else 0]))
    elif field_ == "phentsize":
        m.put(54, struct.pack("<H", rng.choice([0, 32, 55, 57, 64, 0xFFFF])))
    elif field_ == "phnum":
        m.put(56, struct.pack("<H", rng.choice([0, 1, p.phnum - 1, p.phnum + 1, p.phnum * 2, 0xFFFE])))
    elif field_ == "xnum":  # PN_XNUM: the count is in section header 0, wherever e_shoff says
        m.put(56, struct.pack("<H", 0xFFFF))
        m.u64(40, rng.choice([0, 64, p.size - 32, p.size, p.phoff, 1 << 62]))
        m.put(58, struct.pack("<H", rng.choice([0, 64])))
    else:
        m.u64(40, rng.choice([0, p.size, (1 << 64) - 1]))
    return f"ELF header: {field_}"


def _mutate_phdr(rng: random.Random, m: Mutant) -> str:
    p = m.prof
    loads = [ph for ph in p.phdrs if ph[1] == PT_LOAD]
    notes = [ph for ph in p.phdrs if ph[1] == PT_NOTE]
    at, ptype, off, vaddr, filesz, memsz = rng.choice(notes if rng.random() < 0.3 else loads)
    other = rng.choice(loads)
    field_ = rng.choice(["type", "flags", "offset", "vaddr", "filesz", "memsz", "overlap", "wrap"])
    if field_ == "type":
        m.put(at, struct.pack("<I", rng.choice([0, PT_LOAD, 2, PT_NOTE, 0x6474E550, 0xFFFFFFFF])))
    elif field_ == "flags":
        m.put(at + 4, struct.pack("<I", rng.choice([0, 1, 2, 7, 0xFFFFFFFF])))
    elif field_ == "offset":
        m.u64(at + 8, rng.choice([0, off + 1, off - 4096, p.size - 1, p.size, p.size + 4096, 1 << 62,
                                  (1 << 64) - 4096, other[2]]))
    elif field_ == "vaddr":
        m.u64(at + 16, rng.choice([0, vaddr + 1, other[3], other[3] + 8, (1 << 64) - 4096, 1 << 47, 1 << 63]))
    elif field_ == "filesz":
        m.u64(at + 32, rng.choice([0, 1, filesz - 1, filesz + 4096, memsz * 2, p.size, (1 << 64) - 1, 1 << 40]))
    elif field_ == "memsz":
        m.u64(at + 40, rng.choice([0, 1, filesz - 1, 1 << 40, 1 << 63, (1 << 64) - 1, memsz * 1024]))
    elif field_ == "overlap":  # another segment's addresses, this one's bytes
        m.u64(at + 16, other[3] + rng.choice([0, 4096, other[5] // 2 & ~0xFFF]))
    else:  # a segment whose end wraps past 2**64
        m.u64(at + 16, (1 << 64) - 4096)
        m.u64(at + 40, rng.choice([8192, 1 << 20]))
    return f"program header {(at - p.phoff) // 56} ({'PT_NOTE' if ptype == PT_NOTE else 'PT_LOAD'}): {field_}"


def _mutate_note_header(rng: random.Random, m: Mutant) -> str:
    n = rng.choice(m.prof.notes)
    field_ = rng.choice(["namesz", "descsz", "type"])
    if field_ == "namesz":
        m.put(n.header, struct.pack("<I", rng.choice([0, 1, 3, 4, 6, 0x7FFFFFFF, 0xFFFFFFFF])))
    elif field_ == "descsz":
        m.put(n.header + 4, struct.pack("<I", rng.choice([0, 1, n.size - 4, n.size + 4, n.size * 2, 0xFFFFFFF0,
                                                          0xFFFFFFFF])))
    else:
        m.put(n.header + 8, struct.pack("<I", rng.choice([NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_SIGINFO, NT_FILE, 0,
                                                          0x202, 0xFFFFFFFF])))
    return f"note header (type {n.type:#x}): {field_}"


def _notes(m: Mutant, ntype: int) -> list[Note]:
    return [n for n in m.prof.notes if n.type == ntype and n.name == b"CORE"]


def _mutate_prstatus(rng: random.Random, m: Mutant) -> str:
    n = rng.choice(_notes(m, NT_PRSTATUS))
    regs = {"rbp": 4, "rax": 10, "rip": 16, "rsp": 19, "fs_base": 21}
    field_ = rng.choice(["pid", "cursig", "sigpend"] + list(regs) * 2)
    if field_ == "pid":
        m.put(n.desc + 32, struct.pack("<i", rng.choice([0, -1, 1, 0x7FFFFFFF])))
    elif field_ == "cursig":
        m.put(n.desc + 12, struct.pack("<h", rng.choice([0, -1, 64, 99, 0x7FFF])))
    elif field_ == "sigpend":
        m.u64(n.desc + 16, (1 << 64) - 1)
    else:
        at = n.desc + 112 + 8 * regs[field_]
        with open(m.prof.path, "rb") as f:
            f.seek(at)
            old = struct.unpack("<Q", f.read(8))[0]
        m.u64(at, _evil(rng, old, old, []))
    return f"NT_PRSTATUS: {field_}"


def _mutate_nt_file(rng: random.Random, m: Mutant) -> str:
    n = _notes(m, NT_FILE)[0]
    p = m.prof
    field_ = rng.choice(["count", "page_size", "range", "traversal", "control", "not-utf8", "no-nul", "range"])
    if field_ == "count":
        m.u64(n.desc, rng.choice([0, 1, len(p.file_entries) - 1, len(p.file_entries) + 1, 1 << 20, 1 << 60,
                                  (1 << 64) - 1]))
    elif field_ == "page_size":
        m.u64(n.desc + 8, rng.choice([0, 1, 3, 1 << 12, 1 << 30, 1 << 63, (1 << 64) - 1]))
    elif field_ == "range":
        e = rng.choice(p.file_entries)
        which = rng.randrange(3)
        m.u64(e + 8 * which, rng.choice([0, 1, (1 << 64) - 1, 1 << 47, rng.getrandbits(64)]))
    elif field_ == "no-nul":  # the paths run to the note's end
        off, length = p.file_paths[-1]
        m.put(off + length, b"x")
    else:
        off, length = rng.choice(p.file_paths)
        if field_ == "traversal":
            name = f"/../../../../..{SENTINEL_DIR}/{rng.getrandbits(32):x}".encode()
        elif field_ == "control":
            name = b"/usr/lib/" + rng.choice(CONTROL_TEXT) + b"lib.so"
        else:
            name = b"/usr/lib/\xff\xfe\xc0\xaf.so"
        if len(name) > length:
            field_ += " (cut to the path's length)"
        name = (name + b"/" * length)[:length] if not name.startswith(b"/..") else name[:length].ljust(length, b"/")
        m.put(off, name)
    return f"NT_FILE: {field_}"


def _mutate_siginfo(rng: random.Random, m: Mutant) -> str:
    notes = _notes(m, NT_SIGINFO)
    if not notes:
        return "NT_SIGINFO: none"
    n = notes[0]
    field_ = rng.choice(["signo", "code", "errno", "addr"])
    at = {"signo": 0, "errno": 4, "code": 8}.get(field_)
    if at is not None:
        m.put(n.desc + at, struct.pack("<i", rng.choice([0, -1, 1, 6, 11, 64, 65, 0x7FFFFFFF, -0x80000000])))
    else:
        m.u64(n.desc + 16, rng.choice([0, 1, (1 << 64) - 1, rng.getrandbits(64)]))
    return f"NT_SIGINFO: {field_}"


def _mutate_auxv(rng: random.Random, m: Mutant) -> str:
    p = m.prof
    name = rng.choice(list(AT) + ["AT_NULL"])
    if name == "AT_NULL":  # the vector runs to the note's end with no AT_NULL
        n = _notes(m, NT_AUXV)[0]
        m.put(n.desc, struct.pack("<QQ", 6, 4096) * (n.size // 16))
        return "NT_AUXV: no AT_NULL"
    at = p.auxv.get(AT[name])
    if at is None:
        return f"NT_AUXV: no {name}"
    others = [r for k in ("argv", "python", "objects") for r in p.reads.get(k, [])]
    m.u64(at, _evil(rng, 0, 0, others) if rng.random() < 0.5 else rng.choice([0, 1, (1 << 64) - 1, 1 << 47]))
    return f"NT_AUXV: {name}"


def _mutate_prpsinfo(rng: random.Random, m: Mutant) -> str:
    notes = _notes(m, NT_PRPSINFO)
    if not notes:
        return "NT_PRPSINFO: none"
    n = notes[0]
    field_ = rng.choice(["fname", "psargs", "pid", "state"])
    if field_ in ("fname", "psargs"):
        at, size = (n.desc + 40, 16) if field_ == "fname" else (n.desc + 56, 80)
        text = (b"python3 " + rng.choice(CONTROL_TEXT) + b" --url https://alice:PASSWORD@host ")
        m.put(at, text[:size].ljust(size, rng.choice([b"\0", b"A"])))
    elif field_ == "pid":
        m.put(n.desc + 24, struct.pack("<i", rng.choice([0, -1, 0x7FFFFFFF])))
    else:
        m.put(n.desc + 1, bytes([rng.randrange(256)]))
    return f"NT_PRPSINFO: {field_}"


def _mutate_memory(rng: random.Random, m: Mutant, reader: str) -> str:
    p = m.prof
    if reader == "stack":
        rsp = rng.choice(p.stacks)
        targets = [(rsp + 8 * i, 8) for i in range(-16, 512)]
    else:
        targets = p.reads.get(reader) or []
    targets = [t for t in targets if p.offset(t[0], min(t[1], 8)) is not None]
    if not targets:
        return f"memory ({reader}): nothing to change"
    if reader in ("python", "heap") and rng.random() < 0.1 and p.anon:
        return _self_region(rng, m, reader, targets)
    if reader == "argv" and rng.random() < 0.5:
        addr, size = rng.choice(targets)
        text = rng.choice(CONTROL_TEXT)
        m.put(p.offset(addr, min(size, len(text))), text[:size])
        return f"memory ({reader}): control characters in a string at {addr:#x}"
    picks = rng.sample(targets, min(len(targets), rng.randint(1, 8)))
    with open(p.path, "rb") as f:
        for addr, size in picks:
            word = addr + 8 * rng.randrange(max(1, min(size, 256) // 8)) if size >= 8 else addr
            off = p.offset(word, 8)
            if off is None:
                continue
            f.seek(off)
            old = struct.unpack("<Q", f.read(8))[0]
            m.u64(off, _evil(rng, word, old, targets))
    return f"memory ({reader}): {len(picks)} words"


def _self_region(rng: random.Random, m: Mutant, reader: str, targets: list[tuple[int, int]]) -> str:
    """A region of words each pointing at itself or the next (#13 item 3c's crafted thread list), and a
    pointer the reader follows aimed at it."""
    p = m.prof
    vaddr, present = max(p.anon, key=lambda a: a[1])
    size = min(present, rng.choice([1 << 16, 1 << 20, 8 << 20])) & ~7
    start = p.offset(vaddr, size)
    step = rng.choice([0, 8, 16, 0x38, 0x48])
    words = b"".join(struct.pack("<Q", vaddr + ((i * 8 + step) % size if step else i * 8)) for i in range(size // 8))
    m.put(start, words)
    for addr, _ in rng.sample(targets, min(len(targets), rng.randint(1, 6))):
        m.u64(p.offset(addr, 8), vaddr + 8 * rng.randrange(size // 8))
    return f"memory ({reader}): a {size >> 10} KiB region of self-referencing words (step {step})"


def _mutate_cut(rng: random.Random, m: Mutant) -> str:
    p = m.prof
    note = p.notes[rng.randrange(len(p.notes))] if p.notes else None
    loads = [ph for ph in p.phdrs if ph[1] == PT_LOAD and ph[4]]
    seg = rng.choice(loads)
    where = rng.choice(["header", "program headers", "notes", "a segment's start", "inside a segment", "last byte"])
    m.cut = {
        "header": rng.randrange(0, 64),
        "program headers": p.phoff + rng.randrange(p.phnum * 56),
        "notes": (note.desc + rng.randrange(max(1, note.size))) if note else 100,
        "a segment's start": seg[2],
        "inside a segment": seg[2] + rng.randrange(seg[4]),
        "last byte": p.size - 1,
    }[where]
    return f"cut in the {where} at {m.cut}"


KINDS = (("ehdr", 6), ("phdr", 10), ("note header", 6), ("prstatus", 7), ("nt_file", 10), ("siginfo", 4),
         ("auxv", 6), ("prpsinfo", 5), ("python", 14), ("heap", 9), ("sigframe", 6), ("stack", 6), ("argv", 3),
         ("objects", 3), ("cut", 5))


def mutate(seed: int, profiles: list[Profile]) -> Mutant:
    """The mutant for ``seed``: one of the seeds with one to three changes."""
    rng = random.Random(seed)
    m = Mutant(profiles[seed % len(profiles)])
    names, weights = zip(*KINDS, strict=True)
    for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 3)):
        kind = rng.choices(names, weights)[0]
        fn = {"ehdr": _mutate_ehdr, "phdr": _mutate_phdr, "note header": _mutate_note_header,
              "prstatus": _mutate_prstatus, "nt_file": _mutate_nt_file, "siginfo": _mutate_siginfo,
              "auxv": _mutate_auxv, "prpsinfo": _mutate_prpsinfo, "cut": _mutate_cut}.get(kind)
        m.what.append(fn(rng, m) if fn else _mutate_memory(rng, m, kind))
    return m


# -- the runs ---------------------------------------------------------------------------------------------

FAST = (["--method", "direct", "--native-method", "none"],
        ["--method", "direct", "--native-method", "libdw", "--gdb", "/nonexistent/gdb"])
WITH_GDB = (["--method", "gdb", "--native-method", "gdb"], ["--method", "both", "--native-method", "both"],
            ["--method", "auto", "--native-method", "auto"], ["--method", "direct", "--native-method", "libdw"])


def specs(core: str, seed: int, out_dir: str, gdb_every: int) -> list[RunSpec]:
    """The command lines a mutant is analysed with: both gdb-free methods, each with some of --json,
    --heap, --native, -v, -o; with gdb on every ``gdb_every``-th mutant."""
    rng = random.Random(seed ^ 0xC0FE)
    inputs = (os.path.dirname(core),)
    out = []
    methods = [list(m) for m in FAST]
    if gdb_every > 0 and seed % gdb_every == 0:
        methods.append(WITH_GDB[(seed // gdb_every) % len(WITH_GDB)] + ["--timeout", str(GDB_TIMEOUT)])
    for i, method in enumerate(methods):
        argv = ["analyze", core, *method]
        as_json = (seed + i) % 2 == 0
        argv += ["--json"] if as_json else []
        argv += ["--heap"] if rng.random() < 0.3 else []
        argv += ["--native"] if rng.random() < 0.3 else []
        argv += ["-v"] if rng.random() < 0.5 else []
        output = None
        if rng.random() < 0.25:
            output = os.path.join(out_dir, "result")
            argv += ["-o", output]
        gdb = "--timeout" in method
        out.append(RunSpec(argv, json=as_json and output is None, results=(0, 4), output=output, inputs=inputs,
                           time_bound=TIME_BOUND + (3 * GDB_TIMEOUT if gdb else 0)))
    return out


def make_seeds(directory: Path) -> list[str]:
    """Real cores of tests/crashers under the newest CPython here (kernel.core_pattern must write to the cwd)."""
    from tests.crashers.make_core import make_core
    from tests.pythons import WANTED, discover_pythons

    pythons = discover_pythons()
    version = next(v for v in reversed(WANTED) if v in pythons)
    return [str(make_core(directory, pythons[version], scenario, handler=handler))
            for scenario, handler in SEED_SCENARIOS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=fuzz_count())
    ap.add_argument("--seed", type=int, default=fuzz_seed())
    ap.add_argument("--core", action="append", default=[], help="a seed core (repeat; default: made here)")
    ap.add_argument("--gdb-every", type=int, default=20, help="analyze every Nth mutant with gdb too (0: never)")
    ap.add_argument("--json", action="store_true", help="one JSON line per run on stdout")
    ap.add_argument("--keep", metavar="DIR", help="write each mutant to DIR/SEED.core instead of running it "
                                                 "(to reproduce a violation: --seed S --count 1 --keep DIR)")
    args = ap.parse_args(argv)
    require_checkout_python("tests/fuzz_cores.py")
    # imported once; every run is a fork of this process
    import forensics.analyze
    import forensics.cli
    import forensics.commands.analyze
    import forensics.format  # noqa: F401

    work = Path(tempfile.mkdtemp(prefix="fuzz-cores-"))
    try:
        cores = args.core or make_seeds(work / "seeds")
        profiles = [profile_core(c, work) for c in cores]
        harness = Harness("cores", json_lines=args.json, memory_bound_mb=MEMORY_BOUND_MB, command="analyze")
        readers = sorted({k for p in profiles for k in p.reads})
        print(json.dumps({"seeds": [{"core": p.path, "size": p.size, "reads": {k: len(v) for k, v in p.reads.items()}}
                                    for p in profiles], "readers": readers}), file=sys.stderr, flush=True)
        out_dir = work / "out"
        out_dir.mkdir()
        for seed in range(args.seed, args.seed + args.count):
            m = mutate(seed, profiles)
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                m.write(os.path.join(args.keep, f"{seed}.core"))
                print(json.dumps({"seed": seed, "core": os.path.join(args.keep, f"{seed}.core"),
                                  "mutation": "; ".join(m.what), "runs": [s.argv[2:] for s in specs(
                                      "CORE", seed, "OUT", args.gdb_every)]}), flush=True)
                continue
            d = work / "in" / str(seed)
            d.mkdir(parents=True)
            core = str(d / "core")
            m.write(core)
            what = f"{os.path.basename(os.path.dirname(m.prof.path))}: " + "; ".join(m.what)
            for spec in specs(core, seed, str(out_dir), args.gdb_every):
                harness.run(seed, what, spec)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return harness.finish()


if __name__ == "__main__":
    sys.exit(main())
