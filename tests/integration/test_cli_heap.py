"""`forensics analyze` and glibc's heap: the anatomy of a heap corruption by default, `--heap` for any core."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_OK


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_heap_corruption_gets_its_anatomy_without_asking(cores, newest_python):
    # GIVEN the anchor heap-corruption core (libcrash.so writes 16 bytes past a 0x500-byte buffer)
    core = cores.get(newest_python, "heap-next-size")
    # WHEN analyze --json runs without --heap
    r = run("analyze", "--json", str(core))
    assert r.exit_code == EXIT_OK, r.stderr
    heap = json.loads(r.stdout)["analysis"]["heap"]
    # THEN the analysis carries the corruption, not the arena summary
    assert heap["summary"] is None and heap["problems"] == []
    c = heap["corruption"]
    assert c["message"] == "free(): invalid next size (normal)"
    assert c["rejected"]["address"] == c["overflowed"]["address"] and c["overflowed"]["size"] == 0x510
    assert c["damaged"]["address"] == c["overflowed"]["address"] + 0x510
    assert c["usable_size"] == 0x508 and c["overflow_past_usable"] == 8 and c["first_bytes"] == "41" * 8
    # libcrash.so freed its own buffer inside the call, and nothing of the Python side points into it: its own buffer
    assert c["freed_by"]["function"] == "forensics_heap_overflow" and c["freed_by"]["library"].endswith("/libcrash.so")
    assert c["owner"] is None and c["verdict"] == "library-own-buffer", c["verdict_reason"]
    assert c["verdict_reason"].startswith(
        f"the buffer that overflowed is libcrash.so's own allocation (chunk 0x{c['overflowed']['address']:x}, size "
        "0x510, 1288 usable bytes), freed by forensics_heap_overflow inside libcrash.so during "
        "forensics_heap_overflow, called from query_nvlink_throughput_counters (exporter.py:"), c["verdict_reason"]
    findings = json.loads(r.stdout)["analysis"]["findings"]
    assert any(f["rule"] == "heap-buffer-overflow" and f["severity"] == "error" for f in findings)


def test_text_has_the_heap_section(cores, newest_python):
    r = run("analyze", str(cores.get(newest_python, "heap-prev")))
    assert r.exit_code == EXIT_OK, r.stderr
    text = r.stdout
    assert "Heap corruption:" in text and "Heap:" not in text.split("Heap corruption:")[1].split("Thread")[0]
    assert "glibc checked:   the PREV_INUSE bit of the chunk after the one being freed" in text
    assert "overflow:        8 bytes past the chunk's usable size" in text
    assert "first bytes:     10 05 00 00 00 00 00 00" in text


@pytest.mark.parametrize("scenario", ["segv", "heap-prev"])
def test_heap_summary_for_any_core(scenario, cores, newest_python):
    # GIVEN a core, a heap corruption or not
    core = cores.get(newest_python, scenario)
    # WHEN analyze --heap --json runs
    r = run("analyze", "--heap", "--json", str(core))
    assert r.exit_code == EXIT_OK, r.stderr
    heap = json.loads(r.stdout)["analysis"]["heap"]
    # THEN the summary has every arena, the main one first, each with its heaps walked, and every thread's tcache
    s = heap["summary"]
    assert s["glibc_version"] and s["main_arena"] == s["arenas"][0]["address"]
    assert [a["kind"] for a in s["arenas"]][0] == "main" and len(s["arenas"]) >= 1
    main = s["arenas"][0]
    assert main["heaps"][0]["chunks_in_use"] > 100 and main["heaps"][0]["walked_to"] == main["top"]
    threads = json.loads(r.stdout)["analysis"]["snapshot"]["threads"]
    assert {t["tid"] for t in s["tcaches"]} == {t["tid"] for t in threads}
    # and the anatomy only for the heap corruption
    assert (heap["corruption"] is not None) is (scenario == "heap-prev")


def test_no_heap_for_a_segv_without_asking(cores, newest_python):
    r = run("analyze", "--json", str(cores.get(newest_python, "segv")))
    assert r.exit_code == EXIT_OK, r.stderr
    assert json.loads(r.stdout)["analysis"]["heap"] is None


def test_reports_carry_what_the_heap_says(cores, newest_python, tmp_path):
    # GIVEN the analysis of a heap-corruption core, saved as `analyze --json` writes it
    analysis = tmp_path / "analysis.json"
    r = run("analyze", "--json", "-o", str(analysis), str(cores.get(newest_python, "heap-next-size")))
    assert r.exit_code == EXIT_OK, r.stderr
    texts = {}
    for template in ("nvml", "nvitop", "runbook"):
        out = tmp_path / f"{template}.md"
        r = run("report", "--template", template, "-o", str(out), str(analysis))
        texts[template] = out.read_text()
    # THEN the NVIDIA report has the heap section, with the overflowed chunk and its bytes
    nvml = texts["nvml"]
    section = nvml.split("## What the core's heap says", 1)[1].split("\n## ", 1)[0]
    # conclusion first, then the chunk, the overflow and the bytes past the end, in the words of a report
    assert section.lstrip().startswith("Conclusion: points at libcrash.so, not the binding: the buffer that "
                                       "overflowed is libcrash.so's own allocation"), section
    assert "(size 0x510, 1288 usable bytes), the chunk glibc was freeing" in section
    assert "Overflow: 8 bytes past its usable size" in section
    assert "First bytes past the end: 41 41 41 41 41 41 41 41 (AAAAAAAA)" in section
    for internal in ("walker", "pyread", "anatomy", "locals"):
        assert internal not in section, internal
    # and the other reports say it in a line
    for template in ("nvitop", "runbook"):
        assert "What the core's heap says: Conclusion: points at libcrash.so, not the binding" in texts[template], \
            template
    # and libcrash.so is not the driver: its own buffer does not point the report at NVIDIA
    assert 'conclusion: "driver-fault"' not in nvml.split("\n---", 1)[0]
