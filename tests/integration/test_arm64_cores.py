"""AArch64 cores made on this x86_64 machine (tests/arm64.py) and read from it (issue #31)."""
from __future__ import annotations

import pytest
from elftools.elf.elffile import ELFFile

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
