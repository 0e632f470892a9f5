"""The `forensics analyze` command line on real cores: JSON, text, batch and bad input."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, EXIT_PARTIAL
from tests.conftest import python_params


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_error_line(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("forensics: error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return lines[0]


@pytest.fixture(scope="module")
def heap_core(cores, newest_python) -> Path:
    return cores.get(newest_python, "heap-prev")


def test_json_document(heap_core):
    # WHEN analyze --json runs on a real heap-corruption core
    r = run("analyze", "--json", str(heap_core))
    # THEN stdout is one JSON document with the schema header and the facts
    assert r.exit_code == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["command"] == "analyze"
    a = doc["analysis"]
    assert a["crash"]["kind"] == "heap-corruption"
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    assert a["signature"].startswith(
        'SIGABRT "double free or corruption (!prev)" [heap-corruption] in thread "MainThread"')
    assert "query_nvlink_throughput_counters" in a["signature"]
    assert "forensics_heap_overflow (libcrash.so)" in a["signature"]
    threads = a["snapshot"]["threads"]
    assert [t["name"] for t in threads] == ["MainThread", "metrics-server"]
    assert len(a["fingerprint"]) == 12


def test_text_summary_signature_first_and_merged(heap_core):
    r = run("analyze", "--native", str(heap_core))
    assert r.exit_code == EXIT_OK, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith('SIGABRT "double free or corruption (!prev)"')
    assert any(ln.strip().startswith("(Python) query_nvlink_throughput_counters (exporter.py:") for ln in lines)
    assert "Mapped libraries:" in lines


@pytest.mark.parametrize("view", [[], ["--native"]], ids=["separate", "merged"])
def test_full_paths_name_each_python_file_as_an_editor_opens_it(heap_core, view):
    # GIVEN a real core whose crash sample runs from this checkout's tests/crashers/exporter.py
    exporter = Path(__file__).resolve().parents[1] / "crashers" / "exporter.py"
    # WHEN analyze prints it with --full-paths (py-spy's and pystack's way), and without
    full = run("analyze", "--full-paths", *view, str(heap_core))
    short = run("analyze", *view, str(heap_core))
    # THEN each Python frame names its file by the whole path the process loaded (path:line); the default stays short
    assert full.exit_code == short.exit_code == EXIT_OK, full.stderr
    assert f"query_nvlink_throughput_counters ({exporter}:" in full.stdout, full.stdout
    assert "query_nvlink_throughput_counters (exporter.py:" in short.stdout
    assert full.stdout.splitlines()[0] == short.stdout.splitlines()[0]  # the signature is the same


def test_output_file_is_never_overwritten(heap_core, tmp_path):
    out = tmp_path / "a.json"
    r = run("analyze", "--json", "-o", str(out), str(heap_core))
    assert r.exit_code == EXIT_OK and f"Wrote {out}" in r.stderr
    before = out.read_bytes()
    r = run("analyze", "--json", "-o", str(out), str(heap_core))
    assert r.exit_code == EXIT_ERROR and "already exists" in one_error_line(r)
    assert out.read_bytes() == before
    assert run("analyze", "--json", "--force", "-o", str(out), str(heap_core)).exit_code == EXIT_OK


def test_batch_folds_cores_into_fingerprints(cores, newest_python, tmp_path):
    # GIVEN a directory with 3 cores of one bug, 2 of another, and a file that is not a core
    d = tmp_path / "cores"
    d.mkdir()
    for i in range(3):
        shutil.copy(cores.get(newest_python, "heap-prev", i), d / f"core.heap.{i}")
    for i in range(2):
        shutil.copy(cores.get(newest_python, "segv", i), d / f"core.segv.{i}")
    (d / "notes.txt").write_text("not a core\n")
    when = ({f"core.heap.{i}": 1_700_000_000 + 3600 * i for i in range(3)}
            | {f"core.segv.{i}": 1_700_100_000 + i for i in range(2)})
    for name, t in when.items():
        os.utime(d / name, (t, t))
    # WHEN the directory is analyzed as a batch
    r = run("analyze", "--json", str(d))
    # THEN two distinct crashes, counted, with an example each
    assert r.exit_code == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["command"] == "analyze-batch"
    groups = doc["batch"]["groups"]
    assert [g["count"] for g in groups] == [3, 2]
    assert groups[0]["signature"].startswith("SIGABRT") and groups[1]["signature"].startswith("SIGSEGV")
    assert all(Path(g["example"]).parent == d for g in groups)
    assert doc["batch"]["total"] == 5 and not doc["batch"]["failed"]
    # how many bugs it found (distinct fingerprints) and the previous definition's keys for them, one each here
    assert doc["found"] == {"bugs": 2, "fingerprints_v3": 2, "sent_signals": 0}
    assert [len(g["fingerprints_v3"]) for g in groups] == [1, 1]
    assert groups[0]["fingerprints_v3"] != groups[1]["fingerprints_v3"]
    # first and last seen: the oldest and newest core of each crash (the kernel's write times)
    assert (groups[0]["first_seen"], groups[0]["last_seen"]) == (1_700_000_000, 1_700_007_200)
    assert (groups[1]["first_seen"], groups[1]["last_seen"]) == (1_700_100_000, 1_700_100_001)
    # the progress callback (the bar on a terminal) hears of every core once
    from forensics.analyze.batch import analyze_many

    seen, paths = [], sorted(str(p) for p in d.iterdir() if p.name.startswith("core"))
    analyze_many(paths, jobs=1, progress=lambda e: seen.append(e.path))
    assert seen == paths
    # and the text table lists the same
    r = run("analyze", str(d))
    assert r.stdout.splitlines()[0] == ("5 inputs: 5 cores analyzed (0 partial), 2 distinct crashes, 0 unreadable, "
                                        "1 file skipped (not cores)")
    assert r.stdout.splitlines()[1] == ("Found 2 bugs (distinct fingerprints); the previous fingerprint definition "
                                        "gives them 2 fingerprints (fingerprint_v3)")


def test_batch_with_an_unreadable_core_exits_3(cores, newest_python, tmp_path):
    bad = tmp_path / "core.bad"
    bad.write_bytes(b"\x7fELF" + b"\x00" * 10)
    r = run("analyze", "--json", str(cores.get(newest_python, "segv")), str(bad))
    assert r.exit_code == EXIT_FINDINGS
    doc = json.loads(r.stdout)
    assert len(doc["batch"]["failed"]) == 1 and doc["batch"]["failed"][0]["path"] == str(bad)


# -- bad input: one clear line, a documented exit code, no traceback ------------------------------


def test_not_a_file(tmp_path):
    r = run("analyze", str(tmp_path / "nope"))
    assert r.exit_code == EXIT_ERROR
    assert "no such file" in one_error_line(r)


def test_not_elf_gzip(tmp_path):
    p = tmp_path / "core.gz"
    p.write_bytes(gzip.compress(b"x" * 100))
    r = run("analyze", str(p))
    assert r.exit_code == EXIT_ERROR
    assert "gzip" in one_error_line(r)


def test_elf_but_not_a_core():
    r = run("analyze", sys.executable)
    assert r.exit_code == EXIT_ERROR
    line = one_error_line(r)
    assert "not a core" in line and "--exe" in line


def test_core_of_another_architecture(heap_core, tmp_path):
    # a machine whose cores are not read (AArch64's are since #31: tests/integration/test_arm64_cores.py)
    p = tmp_path / "core.riscv64"
    data = bytearray(heap_core.read_bytes()[:1 << 20])
    data[18:20] = (243).to_bytes(2, "little")  # e_machine = EM_RISCV
    p.write_bytes(data)
    r = run("analyze", str(p))
    assert r.exit_code == EXIT_ERROR
    assert "unsupported core" in one_error_line(r) and "RISC-V (e_machine 243)" in one_error_line(r)


def test_truncated_core_is_partial_but_readable(heap_core, tmp_path):
    # GIVEN a core cut short, as the kernel leaves it at the size limit or on a full disk
    p = tmp_path / "core.trunc"
    with open(heap_core, "rb") as src:
        p.write_bytes(src.read(os.path.getsize(heap_core) // 3))
    # THEN what is readable is reported, the core is called truncated, and the exit code says partial
    r = run("analyze", "--json", str(p))
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    doc = json.loads(r.stdout)
    assert doc["analysis"]["snapshot"]["core"]["truncated"] is True
    assert doc["analysis"]["crash"]["signal_name"] == "SIGABRT"
    assert "truncated" in r.stderr


def test_gdb_not_installed_still_reports_the_core(heap_core):
    # GIVEN no gdb at all
    # WHEN analyzed with the defaults: native stacks by libdw, Python stacks by the direct reader
    r = run("analyze", "--json", "--gdb", "/nonexistent/gdb", str(heap_core))
    # THEN the analysis is whole without gdb
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    assert a["snapshot"]["native_method"] == "libdw" and a["snapshot"]["python_method"] == "direct"
    crashed = a["snapshot"]["threads"][0]
    assert crashed["native_method"] == "libdw"
    assert any(f["symbol"] == "forensics_heap_overflow" for f in crashed["native_frames"])
    assert crashed["py_frames"][0]["function"] == "query_nvlink_throughput_counters"
    # WHEN gdb is asked for the native stacks
    r = run("analyze", "--json", "--native-method", "gdb", "--gdb", "/nonexistent/gdb", str(heap_core))
    # THEN the core is still reported, partial: program counters only, and the fix is said
    assert r.exit_code == EXIT_PARTIAL
    a = json.loads(r.stdout)["analysis"]
    assert a["crash"]["abort_message"] == "double free or corruption (!prev)"
    assert a["snapshot"]["native_method"] == "registers" and a["snapshot"]["python_method"] == "direct"
    assert a["snapshot"]["threads"][0]["py_frames"][0]["function"] == "query_nvlink_throughput_counters"
    assert "gdb not found" in r.stderr and "apt-get install -y gdb" in r.stderr


def test_method_direct_needs_no_gdb_and_is_complete(heap_core):
    r = run("analyze", "--json", "--method", "direct", "--gdb", "/nonexistent/gdb", str(heap_core))
    assert r.exit_code == EXIT_OK, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    # no gdb: the crashed thread unwound by libdw (its faulting function is the fingerprint's), the others' program
    # counters only
    assert snap["python_method"] == "direct" and snap["native_method"] == "libdw+registers"
    assert [t["name"] for t in snap["threads"]] == ["MainThread", "metrics-server"]
    assert [t["native_method"] for t in snap["threads"]] == ["libdw", "registers"]


def test_method_both_agrees(heap_core):
    # both Python layouts (gdb's DWARF, the direct one) and both native unwinders (libdw, gdb), compared
    r = run("analyze", "--json", "--method", "both", "--native-method", "both", str(heap_core))
    assert r.exit_code == EXIT_OK, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["method_disagreements"] == [] and snap["native_disagreements"] == []
    assert snap["native_method"] == "libdw" and snap["requested_native_method"] == "both"


def _sysroot_copy(tmp_path: Path, files: list[str]) -> Path:
    root = tmp_path / "sysroot"
    for f in files:
        dst = root / f.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
    return root


def test_python_without_debug_symbols_says_what_to_install(heap_core, tmp_path):
    # GIVEN a sysroot whose interpreter and libpython are stripped of debug info
    from forensics.core import open_core

    core = open_core(str(heap_core))
    py_files = [lib.path for lib in core.libraries if lib.name.startswith(("python", "libpython"))]
    root = _sysroot_copy(tmp_path, py_files)
    for f in py_files:
        subprocess.run(["strip", "--strip-debug", str(root / f.lstrip("/"))], check=True)
    # WHEN analyzed against it with the gdb method
    r = run("analyze", "--json", "--method", "gdb", "--sysroot", str(root), str(heap_core))
    # THEN native stacks still come, and the Python stack's absence is explained
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    doc = json.loads(r.stdout)
    status = doc["analysis"]["snapshot"]["python_stack_status"]
    assert status.startswith("unavailable: gdb: no DWARF for _PyRuntime") and "-dbg" in status
    assert doc["analysis"]["snapshot"]["python_status"] == "unsupported"
    crashed = doc["analysis"]["snapshot"]["threads"][0]
    assert any(f["symbol"] == "forensics_heap_overflow" for f in crashed["native_frames"])
    # and the default method reads the Python stacks anyway, without symbols
    r = run("analyze", "--json", "--sysroot", str(root), str(heap_core))
    assert r.exit_code == EXIT_OK, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["python_method"] == "direct" and snap["threads"][0]["py_frames"]


def test_executable_with_another_build_id_is_flagged(heap_core, tmp_path):
    # GIVEN --exe pointing at a different program than the one that crashed
    other = shutil.which("gdb")
    r = run("analyze", "--json", "--exe", other, str(heap_core))
    doc = json.loads(r.stdout)
    exe = doc["analysis"]["snapshot"]["core"]["libraries"][0]
    assert exe["status"] == "build-id-mismatch"
    assert any("build" in w for w in doc["analysis"]["snapshot"]["warnings"])


def test_missing_executable_under_sysroot(heap_core, tmp_path):
    # A sysroot with nothing in it: the exe falls back to this machine's copy only on a build-id match
    root = tmp_path / "empty-root"
    root.mkdir()
    r = run("analyze", "--json", "--sysroot", str(root), str(heap_core))
    assert r.exit_code == EXIT_OK, r.stderr
    libs = json.loads(r.stdout)["analysis"]["snapshot"]["core"]["libraries"]
    assert all(lib["status"] == "ok" for lib in libs if lib["path"] != "[vdso]")


def test_python_dash_m_help():
    r = subprocess.run([sys.executable, "-m", "forensics", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "analyze" in r.stdout


# -- a corrupted frame pointer: a partial Python stack, said so --------------------------------------


def broken_frame_core(cores, version: str, tmp_path: Path) -> tuple[str, str]:
    """A copy of a segv core whose crashed (main) thread's current-frame pointer is garbage, and that garbage."""
    from tests.integration.test_pyread import GARBAGE, main_thread_slots, patched_copy

    src = str(cores.get(version, "segv"))
    path = patched_copy(src, tmp_path / "core.broken-frame", {main_thread_slots(src)["frame_slot"]: GARBAGE})
    return path, f"0x{GARBAGE:x}"


def split_threads(snap: dict) -> tuple[dict, dict]:
    main = next(t for t in snap["threads"] if t["name"] == "MainThread")
    server = next(t for t in snap["threads"] if t["name"] == "metrics-server")
    return main, server


@pytest.mark.parametrize("version", python_params())
def test_broken_frame_pointer_is_a_partial_result(cores, version, tmp_path, monkeypatch):
    # GIVEN a real core whose main thread's frame pointer was overwritten
    import forensics.gdb

    path, garbage = broken_frame_core(cores, version, tmp_path)
    real_run_gdb, asked = forensics.gdb.run_gdb, []

    def spy(*args, **kwargs):
        asked.append(kwargs.get("python"))
        return real_run_gdb(*args, **kwargs)

    monkeypatch.setattr(forensics.gdb, "run_gdb", spy)  # analyze imports it when gdb is needed
    # WHEN it is analyzed with the default method
    r = run("analyze", "--json", path)
    # THEN gdb's DWARF layout was tried for the Python stacks, the result is partial (exit 4) and said once
    assert asked == [True]
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["python_status"] == "partial" and not any(garbage in w for w in snap["warnings"])
    assert snap["python_method"] == "direct"
    assert snap["python_stack_status"].startswith("partial:") and garbage in snap["python_stack_status"]
    # and the main thread carries the reason its Python stack is empty; the other thread is whole
    main, server = split_threads(snap)
    assert main["py_frames"] == [] and garbage in main["python_error"]
    assert server["py_frames"] and server["python_error"] is None
    # WHEN it is walked with gdb's DWARF layout alone
    r = run("analyze", "--json", "--method", "gdb", path)
    # THEN that is partial too, with the same reason on the same thread
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["python_method"] == "gdb" and snap["python_stack_status"].startswith("partial:")
    main, server = split_threads(snap)
    assert main["py_frames"] == [] and garbage in main["python_error"]
    assert server["py_frames"] and server["python_error"] is None


def test_broken_frame_pointer_in_text_and_with_both_methods(cores, newest_python, tmp_path):
    # GIVEN the same corrupted core
    path, garbage = broken_frame_core(cores, newest_python, tmp_path)
    # WHEN the text summary is printed
    r = run("analyze", path)
    # THEN the Stacks line says partial and why, once (no warning repeats it), and the reason stands
    # under the thread
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    lines = r.stdout.splitlines()
    stacks = next(ln for ln in lines if ln.startswith("Stacks:"))
    assert "Python by direct (" in stacks and "): partial: " in stacks and garbage in stacks
    assert not any(ln.startswith("warning:") and garbage in ln for ln in lines)
    at = next(i for i, ln in enumerate(lines) if ln.startswith('Thread "MainThread"'))
    end = next((i for i, ln in enumerate(lines) if i > at and ln.startswith("Thread ")), len(lines))
    block = lines[at:end]
    assert "  Python stack (most recent call first):" in block
    assert any(ln.strip().startswith("(Python stack incomplete: frame " + garbage) for ln in block), block
    # and --method both: the two methods agree on the broken stack, which is still partial
    r = run("analyze", "--json", "--method", "both", path)
    assert r.exit_code == EXIT_PARTIAL, r.stderr
    snap = json.loads(r.stdout)["analysis"]["snapshot"]
    assert snap["method_disagreements"] == []
    assert garbage in split_threads(snap)[0]["python_error"]


def test_the_console_script_analyzes_a_core_without_click_and_as_click_does(heap_core):
    # GIVEN a real heap-corruption core (its analysis reads the heap's anatomy too)
    probe = ("import sys\nsys.argv[0] = 'forensics'\nfrom forensics.cli import main\ntry:\n    main()\nfinally:\n"
             "    heavy = ('click', 'typing', 'pathlib', 'hashlib', '_hashlib', 'datetime', 'shlex', 'urllib.parse')\n"
             "    print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)")
    for args in (["--method", "direct"], ["--method", "direct", "--json"], ["--json"]):
        # WHEN the console script's main analyzes it, and the click group does
        fast = subprocess.run([sys.executable, "-c", probe, "analyze", *args, str(heap_core)], capture_output=True,
                              text=True, timeout=300)
        slow = subprocess.run([sys.executable, "-c", "import sys\nfrom forensics.cli import cli\n"
                               "cli(sys.argv[1:], prog_name='forensics')", "analyze", *args, str(heap_core)],
                              capture_output=True, text=True, timeout=300)
        # THEN the same analysis comes out with the same exit code
        assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout), args
        assert fast.returncode == EXIT_OK and "0x" in fast.stdout
        assert fast.stderr.splitlines()[:-1] == slow.stderr.splitlines()
        # and none imported what was only start-up cost (click, typing, pathlib, hashlib...): the default's
        # libdw unwinder (its debug-file cache, its ctypes prototypes) neither
        imported = fast.stderr.splitlines()[-1]
        assert imported == "[]", (args, imported)
