"""The heap's verdict in a report's conclusion (forensics.report.verdict.decide, pure)."""
from __future__ import annotations

import dataclasses

from forensics.model import HeapCorruption, NativeFree, OverflowVerdict
from forensics.modes import ReportTemplate
from forensics.report.facts import Facts
from forensics.report.incident import IncidentClass
from forensics.report.verdict import decide
from forensics.reproduce import ReproRun

DRIVER = ("nvmlDeviceGetFieldValues wrote 24 bytes past the end of the 36-entry values "
          "(c_nvmlFieldValue_t_Array_36, 1440 bytes) that pynvml.nvmlDeviceGetFieldValues passed with count=36")
BINDING = "pynvml.nvmlDeviceGetFieldValues passed count=37 to nvmlDeviceGetFieldValues for the 36-entry values"


def _heap(verdict: str, reason: str) -> HeapCorruption:
    return HeapCorruption(message="munmap_chunk(): invalid pointer", check="munmap_chunk", rejected=None,
                          rejected_found_by=None, damaged=None, inconsistencies=(), overflowed=None, usable_size=None,
                          buffer_size=None, overflow_length=None, overflow_past_usable=None, overflow_exact=False,
                          overflow_basis="", first_bytes="", verdict=OverflowVerdict(verdict), verdict_reason=reason)


def _run(name: str, *, crashed: bool) -> ReproRun:
    return ReproRun(name=name, command=(), run_dir="/tmp/r", exit_code=-6 if crashed else 0,
                    signal="SIGABRT" if crashed else None, verdict="crashed: SIGABRT" if crashed else "clean",
                    crashed=crashed, core=None, core_note=None, signature=None, fingerprint=None, environment={},
                    seconds=0.1, stderr_tail="")


def _facts(verdict, reason, runs=()):
    return Facts(has_crash=True, signal="SIGABRT", kind="heap-corruption",
                 abort_message="munmap_chunk(): invalid pointer", heap=_heap(verdict, reason), repro_runs=tuple(runs))


def test_the_heap_alone_points_at_the_driver():
    c = decide(_facts("driver-wrote-past-buffer", DRIVER), [])
    assert c.incident is IncidentClass.DRIVER
    assert c.statement.startswith("The core's heap points at the NVIDIA driver library") and DRIVER in c.statement
    assert c.filings[0].report is ReportTemplate.NVML and "writing past a buffer" in c.filings[0].action
    assert any(e.startswith("the core's heap: driver-wrote-past-buffer") for e in c.evidence)


def test_the_heap_alone_points_at_the_binding():
    c = decide(_facts("binding-count-too-large", BINDING), [])
    assert c.incident is IncidentClass.BINDING and BINDING in c.statement


def test_an_undetermined_heap_decides_nothing_but_is_evidence():
    c = decide(_facts("undetermined", "the call had returned"), [])
    assert c.incident is IncidentClass.UNDETERMINED
    assert "the core's heap: undetermined: the call had returned" in c.evidence


def test_the_c_reproducer_and_the_heap_agree():
    runs = [_run("c", crashed=True)]
    c = decide(_facts("driver-wrote-past-buffer", DRIVER, runs), [])
    assert c.incident is IncidentClass.DRIVER and "The core's heap says the same" in c.statement


OWN = ("the buffer that overflowed is libnvidia-ml.so.580.126.09's own allocation (chunk 0x5000, size 0x510, 1288 "
       "usable bytes), freed by nvlink_scratch_overflow inside libnvidia-ml.so.580.126.09 during "
       "nvmlDeviceGetFieldValues, ..., so no binding count was involved")


def test_libnvidia_mls_own_buffer_points_at_the_driver():
    c = decide(_own(_facts("library-own-buffer", OWN), "libnvidia-ml.so.580.126.09"), [])
    assert c.incident is IncidentClass.DRIVER and OWN in c.statement
    assert c.filings[0].report is ReportTemplate.NVML
    assert "a buffer it allocated and freed itself" in c.filings[0].action
    assert any(e.startswith("the core's heap: library-own-buffer: ") for e in c.evidence)


def test_another_librarys_own_buffer_is_not_the_drivers():
    c = decide(_own(_facts("library-own-buffer", OWN.replace("libnvidia-ml", "libfoo")), "libfoo.so.1"), [])
    assert c.incident is IncidentClass.UNDETERMINED


def _own(f: Facts, lib: str) -> Facts:
    assert f.heap is not None
    freed = NativeFree(entry="free", function="nvlink_scratch_overflow", library=f"/usr/lib/{lib}")
    return dataclasses.replace(f, heap=dataclasses.replace(f.heap, freed_by=freed))
