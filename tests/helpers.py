"""Small helpers several test modules share: an independent build-id oracle, a throwaway tmpfs, stopping a
child process for good."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

__all__ = ["pyelftools_build_id", "tmpfs", "stop_process", "ready_process"]


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
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def stop_process(p: subprocess.Popen, timeout: float = 10) -> None:
    """terminate, then kill if it does not go, and always wait (no zombie, no leaked pipe)."""
    p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@contextlib.contextmanager
def ready_process(argv: list[str], **popen):
    """A child that prints ``ready ...`` on its first line when it is set up; yields (process, that line's
    words after ``ready``) and stops it afterwards."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **popen)
    try:
        line = p.stdout.readline()
        assert line.startswith("ready"), p.stderr.read() if p.poll() is not None else line
        yield p, line.split()[1:]
    finally:
        stop_process(p)
