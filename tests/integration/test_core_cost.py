"""What an analysis costs follows what the core holds, not the core file's size: a big sparse core of a small
process (a large mapping it touched once) analyzes under a small address-space limit -- the agent's default
``--analysis-memory`` included, on a core of the DaemonSet's default ``--max-core-size``."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from forensics.commands.agent import agent_manifest, agent_serve
from tests.crashers.make_core import crash_for_core

GiB = 1 << 30

#: a small Python process that maps ``size`` bytes of anonymous memory, writes one byte of it (so the kernel
#: dumps the mapping: all of it, as a hole but for that page) and dies of SIGSEGV in ctypes
BIG_MAPPING = """
import ctypes, mmap, sys
big = mmap.mmap(-1, int(sys.argv[1]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
big[0] = 1
ctypes.string_at(0)
"""


def _default(command, name: str) -> int:
    param = next(p for p in command.params if p.name == name)
    return param.type.convert(param.default, param, None)


def _sparse_core(tmp_path, size: int):
    run = tmp_path / f"run-{size >> 30}g"
    run.mkdir()
    core = crash_for_core([sys.executable, "-c", BIG_MAPPING, str(size)], run)
    st = os.stat(core)
    assert st.st_size > size and st.st_blocks * 512 < 256 << 20  # the mapping is in the core, as a hole
    return core


def _analyze_limited(core, limit: int) -> subprocess.CompletedProcess:
    def limit_as() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "forensics", "analyze", "--json", str(core)], capture_output=True,
                          text=True, timeout=300, preexec_fn=limit_as)


def test_the_agent_defaults_analyze_a_core_of_the_largest_size_kept(tmp_path, core_pattern):
    # GIVEN the agent's defaults: cores kept up to --max-core-size, each analysis under --analysis-memory
    max_core = _default(agent_manifest, "max_core_size")
    memory = _default(agent_serve, "analysis_memory")
    assert _default(agent_manifest, "analysis_memory") == memory
    assert max_core > memory  # what this test is about: a core larger than the analysis' address space
    # and a real core of that size (less the rest of the process) from a small process
    core = _sparse_core(tmp_path, max_core - 64 * (1 << 20))
    # WHEN it is analyzed in an address space of --analysis-memory
    p = _analyze_limited(core, memory)
    # THEN the analysis is whole: the crash is named, nothing failed
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Cannot allocate memory" not in p.stderr and "MemoryError" not in p.stderr
    analysis = json.loads(p.stdout)["analysis"]
    assert analysis["crash"]["signal_name"] == "SIGSEGV" and not analysis["snapshot"]["warnings"]
    (thread,) = analysis["snapshot"]["threads"]
    assert any(f["function"] == "string_at" for f in thread["py_frames"]), thread["py_frames"]


def test_a_sparse_core_larger_than_the_address_space_is_analyzed(tmp_path, core_pattern):
    # GIVEN a 2 GiB core of a small process
    core = _sparse_core(tmp_path, 2 * GiB)
    # WHEN it is analyzed in a 1 GiB address space (prlimit --as=1G)
    p = _analyze_limited(core, GiB)
    # THEN it is read (the core was mapped whole before: "cannot read core: Cannot allocate memory")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["analysis"]["crash"]["signal_name"] == "SIGSEGV"
