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

import json
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


# -- the verdict: the Python side (frame locals, the ctypes call in progress) -------------------------------

def verdict_of(core_path: Path):
    from forensics.analyze import analyze_core

    a = analyze_core(str(core_path), method="direct", native_method="none")
    return a.heap.corruption, a


@pytest.mark.parametrize("program, stack", CASES)
def test_driver_overflow_verdict(program, stack, sim_dir, tmp_path, core_pattern):
    # GIVEN the library writes 24 bytes past the 36-entry array it was passed with count=36 (glibc checks in the call)
    c, a = verdict_of(crash(program, stack, sim_dir, tmp_path, fault="overflow", detect="call"))
    # THEN the array is named, in the binding's frame, with the call and its count
    assert c.owner is not None and c.owner.name == "values"
    assert c.owner.object.type_name == "c_nvmlFieldValue_t_Array_36" and c.owner.object.length == 36
    assert c.owner.object.buffer == c.overflowed.mem and c.buffer_size == ARRAY
    assert c.owner.function.endswith("nvmlDeviceGetFieldValues") and c.owner.file.endswith("pynvml.py")
    assert c.call.function == "nvmlDeviceGetFieldValues" and c.call.count == 36
    assert c.call.arguments[c.call.buffer_argument] == "byref(values)"
    # and the length is from the array's end: 24 bytes, "OVERRUN!" x 3
    assert c.overflow_length == 24 and c.overflow_exact
    assert bytes.fromhex(c.first_bytes) == b"OVERRUN!" * 3
    assert c.verdict.value == "driver-wrote-past-buffer", c.verdict_reason
    assert ("nvmlDeviceGetFieldValues (libnvidia-ml.so.580.126.09) wrote 24 bytes past the end of the 36-entry values"
            in c.verdict_reason)


@pytest.mark.parametrize("program", ["reproducer", "nvitop-exporter"])
def test_binding_count_verdict(program, sim_dir, tmp_path, core_pattern):
    # GIVEN the binding passes count=37 for its 36-entry array
    c, _a = verdict_of(crash(program, "incident", sim_dir, tmp_path, fault="none", detect="call", binding_excess=1))
    # THEN the verdict is the binding's, with the count it passed and the length it implies (one 40-byte record)
    assert c.owner.name == "values" and c.call.count == 37 and c.owner.object.length == 36
    assert c.verdict.value == "binding-count-too-large", c.verdict_reason
    assert c.overflow_length == 40
    assert ("passed count=37 to nvmlDeviceGetFieldValues (libnvidia-ml.so.580.126.09) for the 36-entry values"
            in c.verdict_reason)


@pytest.mark.parametrize("program", ["reproducer", "nvitop-exporter"])
def test_a_later_free_leaves_it_undetermined(program, sim_dir, tmp_path, core_pattern):
    # GIVEN the overflow found when the caller frees the array, after the call returned
    c, _a = verdict_of(crash(program, "incident", sim_dir, tmp_path, fault="overflow", detect="later"))
    # THEN the buffer is still named (a local of a frame of the crashing thread), but who wrote is undetermined
    assert c.owner is not None and c.owner.object.type_name == "c_nvmlFieldValue_t_Array_36"
    assert c.overflow_length == 24
    assert c.verdict.value == "undetermined"
    assert "not an argument of a native call in progress" in c.verdict_reason


@pytest.mark.parametrize("fault, excess, conclusion, count, length, first", [
    ("overflow", 0, "the native library wrote past a correctly sized buffer (not the binding)", 36,
     "24 bytes past the 1440-byte buffer's end (16 past the chunk's usable size)", "(OVERRUN!OVERRUN!OVERRUN!)"),
    ("none", 1, "the binding passed a count larger than its buffer (not the native library)", 37,
     "40 bytes past the 1440-byte buffer's end (32 past the chunk's usable size)", None),
], ids=["driver", "binding"])
def test_the_nvidia_report_states_the_heap_conclusion(fault, excess, conclusion, count, length, first, sim_dir,
                                                      tmp_path, core_pattern):
    from click.testing import CliRunner

    from forensics.cli import cli

    # GIVEN nvitop-exporter's core, analysed as `analyze --json -o` writes it, and the NVIDIA report made from it
    core = crash("nvitop-exporter", "incident", sim_dir, tmp_path, fault=fault, detect="call", binding_excess=excess)
    analysis, report = tmp_path / "analysis.json", tmp_path / "nvml.md"
    for args in (["analyze", "--json", "-o", str(analysis), str(core)],
                 ["report", "--template", "nvml", "-o", str(report), str(analysis)]):
        r = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
    section = report.read_text().split("## What the core's heap says", 1)[1].split("\n## ", 1)[0].replace("\\", "")
    # THEN the section opens with the conclusion, then names the chunk, the array, the argument and the count,
    # the overflow's length and the first bytes past the end, in words an engineer reads (no internal names)
    assert section.lstrip().startswith(f"Conclusion: {conclusion}: "), section
    c = json.loads(analysis.read_text())["analysis"]["heap"]["corruption"]
    assert f"in the chunk at 0x{c['overflowed']['address']:x} (size 0x5b0, 1448 usable bytes)" in section
    assert "`values`, a c_nvmlFieldValue_t_Array_36 (36 entries of 40 bytes, 1440 bytes)" in section
    assert (f"passed as byref(values) with count={count} (c_int({count})) to nvmlDeviceGetFieldValues in "
            "libnvidia-ml.so.580.126.09") in section
    assert f"Overflow: {length}" in section
    assert "First bytes past the end: " in section and (first is None or first in section)
    for internal in ("walker", "pyread", "anatomy", "fast locals"):
        assert internal not in section, internal


# -- the demo's fault: libnvidia-ml overflows and frees a scratch buffer of its own ---------------------------

SCRATCH_CHUNK, SCRATCH_USABLE = 0x510, 1288  # malloc(0x500): written 16 bytes past the request, 8 past usable


def analysed(core_path: Path, **kw):
    from forensics.analyze import analyze_core

    return analyze_core(str(core_path), **kw)


@pytest.mark.parametrize("program, stack", CASES)
def test_library_own_buffer_verdict(program, stack, sim_dir, tmp_path, core_pattern):
    # GIVEN the simulated library's heap fault (the demo's): inside nvmlDeviceGetFieldValues, nvlink_scratch_overflow
    # mallocs its own 0x500-byte buffer, writes 16 bytes past it and frees it; glibc aborts in that free()
    a = analysed(crash(program, stack, sim_dir, tmp_path, fault="heap", detect="later"))
    c = a.heap.corruption
    assert a.crash.abort_message == "double free or corruption (!prev)"
    # THEN the chunk is the library's 0x510-byte one, 1288 usable bytes, 8 bytes past them written (the next
    # chunk's size word, 0x510 with PREV_INUSE cleared), the chunk glibc was freeing; no Python object owns it
    assert c.rejected == c.overflowed and c.overflowed.size == SCRATCH_CHUNK and c.usable_size == SCRATCH_USABLE
    assert c.overflow_past_usable == 8 and c.first_bytes == "1005000000000000" and c.owner is None
    # and the free() glibc aborted in is the library's, inside the call the Python frame was making
    f = c.freed_by
    assert f is not None and f.entry == "free" and f.function == "nvlink_scratch_overflow"
    assert f.library.endswith("/libnvidia-ml.so.580.126.09") and f.call == "nvmlDeviceGetFieldValues"
    assert f.python_caller.startswith("nvmlDeviceGetFieldValues (pynvml.py:")
    # and the Python side was read (the frame's locals are there) and none of its ctypes buffers is in the chunk
    frame = a.snapshot.crashed_thread.py_frames[0]
    buffers = [loc.ctypes for loc in frame.locals or () if loc.ctypes is not None and loc.ctypes.kind == "array"]
    assert buffers, frame.locals
    assert all(b.buffer + b.size <= c.overflowed.mem or b.buffer >= c.overflowed.end + 8 for b in buffers)
    # so the verdict is the library's own buffer, saying the chunk, who freed it, during which call
    assert c.verdict.value == "library-own-buffer", c.verdict_reason
    assert c.verdict_reason.startswith(
        f"the buffer that overflowed is libnvidia-ml.so.580.126.09's own allocation (chunk 0x{c.overflowed.address:x}, "
        "size 0x510, 1288 usable bytes), freed by nvlink_scratch_overflow inside libnvidia-ml.so.580.126.09 during "
        "nvmlDeviceGetFieldValues, called from nvmlDeviceGetFieldValues (pynvml.py:"), c.verdict_reason
    assert c.verdict_reason.endswith("the Python side passed no pointer into it (none of the crashing thread's "
                                     "ctypes buffers, pointers and call arguments points into the chunk), so no "
                                     "binding count was involved")


def test_library_own_buffer_needs_the_freeing_frame(sim_dir, tmp_path, core_pattern):
    # GIVEN the same fault, analysed without unwinding native stacks: who called free() is not known
    a = analysed(crash("reproducer", "incident", sim_dir, tmp_path, fault="heap", detect="later"),
                 method="direct", native_method="none")
    c = a.heap.corruption
    # THEN the chunk is the same, but the verdict stays undetermined: nothing says which code freed it
    assert c.overflowed.size == SCRATCH_CHUNK and c.owner is None and c.freed_by is None
    assert c.verdict.value == "undetermined"
    assert "no variable of the crashing thread's Python frames" in c.verdict_reason


def test_a_free_by_python_code_stays_undetermined(sim_dir, tmp_path, core_pattern):
    # GIVEN the driver's overflow past the caller's array, found when Python frees the array after the call returned
    a = analysed(crash("nvitop-exporter", "incident", sim_dir, tmp_path, fault="overflow", detect="later"))
    c = a.heap.corruption
    # THEN the verdict stays undetermined: the free() (when glibc caught it there, not at a later malloc) is the
    # interpreter's, of a buffer a Python object holds, not a native library's of its own
    assert c.verdict.value == "undetermined", c.verdict_reason
    assert c.owner is not None and c.owner.object.type_name == "c_nvmlFieldValue_t_Array_36"
    if a.crash.abort_message.startswith("free()"):
        assert c.freed_by is not None and c.freed_by.call is None
        assert (c.freed_by.library or "").rsplit("/", 1)[-1].startswith(("libpython", "python")), c.freed_by
    else:
        assert a.crash.abort_message == "malloc(): corrupted top size" and c.freed_by is None


def test_the_nvidia_report_states_the_library_own_buffer(sim_dir, tmp_path, core_pattern):
    from click.testing import CliRunner

    from forensics.cli import cli

    # GIVEN nvitop-exporter's core from the demo's fault, analysed as `analyze --json -o` writes it, and the reports
    core = crash("nvitop-exporter", "incident", sim_dir, tmp_path, fault="heap", detect="later")
    analysis = tmp_path / "analysis.json"
    r = CliRunner().invoke(cli, ["analyze", "--json", "-o", str(analysis), str(core)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    c = json.loads(analysis.read_text())["analysis"]["heap"]["corruption"]
    assert c["verdict"] == "library-own-buffer" and c["freed_by"]["function"] == "nvlink_scratch_overflow"
    texts = {}
    for template in ("nvml", "nvitop", "runbook"):
        out = tmp_path / f"{template}.md"
        r = CliRunner().invoke(cli, ["report", "--template", template, "-o", str(out), str(analysis)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.stderr
        texts[template] = out.read_text().replace("\\", "")
    # THEN the NVIDIA report's heap section opens with the conclusion: the library, its buffer, who freed it
    section = texts["nvml"].split("## What the core's heap says", 1)[1].split("\n## ", 1)[0]
    assert section.lstrip().startswith(
        "Conclusion: points at libnvidia-ml.so.580.126.09, not the binding: the buffer that overflowed is "
        f"libnvidia-ml.so.580.126.09's own allocation (chunk 0x{c['overflowed']['address']:x}, size 0x510, 1288 "
        "usable bytes), freed by nvlink_scratch_overflow inside libnvidia-ml.so.580.126.09"), section
    assert "Overflow: 8 bytes past its usable size" in section and "First bytes past the end: 10 05 00" in section
    assert "glibc aborted in free() called by nvlink_scratch_overflow (libnvidia-ml.so.580.126.09) inside " \
           "nvmlDeviceGetFieldValues" in section
    # and the report's conclusion is the driver's, from the heap alone (no reproducer ran here)
    assert 'conclusion: "driver-fault"' in texts["nvml"].split("\n---", 1)[0]
    assert "The core's heap points at the NVIDIA driver library" in texts["nvml"]
    # and the nvitop issue and the runbook say it in one line
    for template in ("nvitop", "runbook"):
        assert "What the core's heap says: Conclusion: points at libnvidia-ml.so.580.126.09, not the binding" \
               in texts[template], template
