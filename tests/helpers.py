"""Small helpers several test modules share: an independent build-id oracle and a throwaway tmpfs."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

__all__ = ["pyelftools_build_id", "tmpfs"]


def pyelftools_build_id(path) -> str | None:
    """The GNU build-id as pyelftools reads it from a file: the oracle independent of forensics' own reader."""
    with open(path, "rb") as f:
        for section in ELFFile(f).iter_sections():
            if section.header.sh_type == "SHT_NOTE":
                for n in section.iter_notes():
                    if n["n_type"] == "NT_GNU_BUILD_ID":
                        return n["n_desc"]
    return None


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of ``size`` mounted on ``mnt`` (made here) for the block; skips when mounting is not allowed."""
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
