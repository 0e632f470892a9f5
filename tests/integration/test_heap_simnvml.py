"""Heap anatomy of the simulated NVML's overflows, under the Python reproducer and the real nvitop-exporter.

The faults (reproducers/simnvml/simnvml.c, forensics/simnvml.py):

* the driver's bug: ``FORENSICS_SIMNVML_FAULT=overflow`` writes ``FORENSICS_SIMNVML_OVERFLOW_BYTES``
  of "OVERRUN!" past the end of the caller's field-value array, after the count records it was asked for;
* the binding's bug: nvidia-ml-py's own ``pynvml.py``, copied with one change
  (:func:`forensics.simnvml.seed_binding_fault`): it passes ``len(fieldIds) + 1`` for an array of
  ``len(fieldIds)`` entries, and the library fills the records it is asked for.

``FORENSICS_SIMNVML_DETECT=call`` makes glibc check the trampled header before the call returns
(the caller's frame, with the array and the count, is on the stack); ``later`` leaves it to the
caller's own free of the array, after the call returned.  The node has 8 GPUs of 18 NVLinks: the
query is 36 fields, a 36 x 40 = 1440-byte array in a 0x5b0-byte chunk (usable 1448).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from forensics.core import open_core
from forensics.errors import BuildError
from forensics.heap import read_heap
from forensics.simnvml import build_simnvml, ensure_stack_venv, find_reproducers, seed_binding_fault, sim_environment
from tests.crashers.make_core import crash_for_core

REPRO_PY = find_reproducers() / "nvml_nvlink_fieldvalues.py"
ARRAY, CHUNK, USABLE = 36 * 40, 0x5B0, 0x5A8


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory) -> Path:
    return build_simnvml(tmp_path_factory.mktemp("simnvml-heap"))


def stack_python(name: str) -> Path:
    try:
        return ensure_stack_venv(name)
    except BuildError as e:
        pytest.skip(f"stack {name} unavailable: {e}")


def _argv(program: str, python: Path) -> list[str]:
    if program == "reproducer":
        return [str(python), str(REPRO_PY), "--threads", "1", "--iterations", "20"]
    return [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "0", "--interval", "0.25"]


def crash(program: str, stack: str, sim_dir: Path, tmp_path: Path, *, fault: str, detect: str,
          binding_excess: int = 0, overflow_bytes: int = 24) -> Path:
    """Run the reproducer or nvitop-exporter on the simulated node until glibc aborts; its core."""
    python = stack_python(stack)
    env = sim_environment(sim_dir, fault=fault, detect=detect, overflow_bytes=overflow_bytes, fault_after=2)
    if binding_excess:
        seeded = seed_binding_fault(python, tmp_path / "binding", binding_excess)
        env["PYTHONPATH"] = str(seeded) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    run = tmp_path / "run"
    run.mkdir()
    return crash_for_core(_argv(program, python), run, env=env, timeout=120)


def anatomy(core_path: Path):
    core = open_core(str(core_path))
    report = read_heap(core, message=core.abort_message, tid=core.crashed_tid)
    assert not report.problems, report.problems
    return core, report.corruption


#: nvitop-exporter 1.5.0 (the incident's) collects on its own timer; 1.7.2 only when scraped
CASES = [pytest.param("reproducer", "incident", id="reproducer-stack=incident"),
         pytest.param("reproducer", "current", id="reproducer-stack=current"),
         pytest.param("nvitop-exporter", "incident", id="nvitop-exporter-stack=incident")]


@pytest.mark.parametrize("program, stack", CASES)
def test_driver_overflow_detected_in_the_call(program, stack, sim_dir, tmp_path, core_pattern):
    # GIVEN the library writes 24 bytes of "OVERRUN!" past the 36-entry array it was passed with count=36,
    # and glibc checks the trampled header before the call returns
    core, c = anatomy(crash(program, stack, sim_dir, tmp_path, fault="overflow", detect="call"))
    # THEN the chunk after the array is the one glibc rejected (its size word is "OVERRUN!")
    assert core.abort_message == "munmap_chunk(): invalid pointer"
    assert c.rejected.address == c.damaged.address == c.overflowed.end
    # and the array's chunk overflowed: 16 bytes past its usable size (8 of slack + 8 + 8), the pattern shown
    assert c.overflowed.size == CHUNK and c.usable_size == USABLE
    assert c.overflow_past_usable == 16 and c.overflow_exact
    assert bytes.fromhex(c.first_bytes).startswith(b"OVERRUN!")


@pytest.mark.parametrize("program", ["reproducer", "nvitop-exporter"])
def test_driver_overflow_detected_at_the_callers_free(program, sim_dir, tmp_path, core_pattern):
    # GIVEN the same overflow, left for glibc to find when the caller frees the array (the call returned)
    core, c = anatomy(crash(program, "incident", sim_dir, tmp_path, fault="overflow", detect="later"))
    # THEN glibc rejected the array itself (the size word after it is "OVERRUN!"), or -- when the array
    # was the last chunk before the top -- the top chunk, at the next malloc that needed it
    assert core.abort_message in ("free(): invalid next size (normal)", "malloc(): corrupted top size")
    if core.abort_message.startswith("free()"):
        assert c.rejected.address == c.overflowed.address
    else:
        assert c.rejected.state.value == "top" and c.rejected.address == c.overflowed.end
    assert c.overflowed.size == CHUNK and c.damaged.address == c.overflowed.end
    assert c.overflow_past_usable == 16 and bytes.fromhex(c.first_bytes).startswith(b"OVERRUN!")


@pytest.mark.parametrize("program", ["reproducer", "nvitop-exporter"])
def test_binding_count_larger_than_its_array(program, sim_dir, tmp_path, core_pattern):
    # GIVEN the binding passes count=37 for its 36-entry array; the library fills 37 records
    core, c = anatomy(crash(program, "incident", sim_dir, tmp_path, fault="none", detect="call", binding_excess=1))
    # THEN record 36's timestamp (a multiple of 16 us) is the next chunk's size: past the arena's end
    assert core.abort_message == "double free or corruption (out)"
    assert c.overflowed.size == CHUNK and c.rejected.address == c.overflowed.end
    assert c.overflow_past_usable >= 8
