"""The address an AArch64 load or store accessed (forensics.analyze.a64fault), for instruction words the GNU
assembler made (aarch64-linux-gnu-as: the encoding's oracle), against what each form's semantics give."""
from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from forensics.analyze.a64fault import access_address

REGS = {f"x{i}": 0 for i in range(31)} | {
    "x1": 0x1000, "x2": 0x20, "x3": 0xFFFF_FFFF_FFFF_FFF0, "x4": 0x8000_0000, "x19": 0xB400_0055_0000_0010,
    "sp": 0x7FF0_0000, "pc": 0x40_0000,
}
#: (assembly, the address accessed with REGS)
CASES = [
    ("str w0, [x1]", 0x1000),
    ("ldr x0, [x1, #8]", 0x1008),
    ("ldrb w0, [x1, #4095]", 0x1FFF),
    ("ldr q0, [x1, #32]", 0x1020),
    ("ldr d0, [sp, #8]", 0x7FF0_0008),
    ("ldur x0, [x1, #-8]", 0x0FF8),
    ("ldr x0, [x1, #16]!", 0x1010),
    ("ldr x0, [x1], #16", 0x1000),  # post-indexed: the base before the write-back
    ("ldr x0, [x1, x2]", 0x1020),
    ("ldr x0, [x1, x2, lsl #3]", 0x1100),
    ("ldr w0, [x1, w3, sxtw #2]", 0x1000 - 0x40),
    ("ldr w0, [x1, w4, uxtw]", 0x8000_1000),
    ("stp x29, x30, [sp, #-16]!", 0x7FEF_FFF0),
    ("ldp x0, x1, [x1, #16]", 0x1010),
    ("ldp w0, w1, [x1], #8", 0x1000),
    ("ldp q0, q1, [x1, #64]", 0x1040),
    ("ldxr x0, [x1]", 0x1000),
    ("ldadd x0, x2, [x1]", 0x1000),
    ("casal x0, x2, [x1]", 0x1000),
    ("ldr x0, [x19]", 0x55_0000_0010),  # a tagged pointer: the top byte is not part of the address
]

pytestmark = pytest.mark.skipif(shutil.which("aarch64-linux-gnu-as") is None,
                                reason="no aarch64-linux-gnu-as (Debian: binutils-aarch64-linux-gnu)")


def assemble(lines: list[str], tmp_path) -> list[int]:
    src, obj, raw = tmp_path / "a.s", tmp_path / "a.o", tmp_path / "a.bin"
    src.write_text(".arch armv8.1-a\n.text\n" + "\n".join(lines) + "\n")
    subprocess.run(["aarch64-linux-gnu-as", "-o", str(obj), str(src)], check=True, capture_output=True)
    subprocess.run(["aarch64-linux-gnu-objcopy", "-O", "binary", "-j", ".text", str(obj), str(raw)], check=True)
    data = raw.read_bytes()
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def test_each_load_and_store_form_gives_the_address_it_accessed(tmp_path):
    words = assemble([asm for asm, _ in CASES], tmp_path)
    got = {asm: access_address(w, REGS) for (asm, _), w in zip(CASES, words, strict=True)}
    assert got == {asm: want for asm, want in CASES}


def test_a_literal_load_is_pc_relative_and_others_are_no_access(tmp_path):
    words = assemble(["ldr x0, .+64", "nop", "add x0, x1, x2", "bl .+8", "svc #0"], tmp_path)
    assert access_address(words[0], REGS) == 0x40_0040
    assert [access_address(w, REGS) for w in words[1:]] == [None] * 4
