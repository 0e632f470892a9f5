"""`forensics analyze` on the cores of issue #14: a gcore of a live process, a stripped Debian python,
--method both without CPython's symbols, a program that never imported threading, a fault in the
standard library's wrapper.  Each core is made here by a real process (tests/crashers)."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from elftools.elf.elffile import ELFFile

from forensics.analyze import analyze_core
from forensics.views.signature import signature
from forensics.cli import cli
from forensics.errors import EXIT_OK
from forensics.model import CrashKind
from tests.conftest import PYTHONS
from tests.crashers.make_core import BARE, build_libcrash, crash_for_core, make_core, make_gcore


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _stripped_copy(directory: Path) -> str | None:
    """A CPython made stripped here, as a distribution ships it: a copy of an interpreter whose executable holds
    CPython itself (no libpython it needs), without symbol table, DWARF or debug link, and with a build-id of its
    own, so that no debug package installed on this machine (Debian's python3.X-dbg) gives its symbols back."""
    for exe in sorted(glob.glob("/usr/bin/python3.[0-9]*")) + list(PYTHONS.values()):
        real = os.path.realpath(exe)
        if not re.fullmatch(r".*/python3\.\d+", real):
            continue
        with open(real, "rb") as f:
            elf = ELFFile(f)
            dynamic = elf.get_section_by_name(".dynamic")
            needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"] if dynamic else []
            if any(n.startswith("libpython") for n in needed) or elf.get_section_by_name(".dynsym") is None:
                continue
        dst = directory / "stripped" / os.path.basename(real)
        dst.parent.mkdir(exist_ok=True)
        shutil.copy2(real, dst)
        subprocess.run(["strip", "--strip-all", "--remove-section=.gnu_debuglink", str(dst)], check=True, timeout=120)
        with open(dst, "r+b") as f:
            note = ELFFile(f).get_section_by_name(".note.gnu.build-id")
            if note is not None:  # namesz, descsz, type, "GNU\0", then the id itself
                f.seek(note["sh_offset"] + 16)
                f.write(os.urandom(note["sh_size"] - 16))
        return str(dst)
    return None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, core_pattern) -> Path:
    return tmp_path_factory.mktemp("outside")


@pytest.fixture(scope="module")
def stripped_abort(workdir) -> Path:
    python = _stripped_copy(workdir)
    if python is None:
        pytest.skip("no CPython whose executable holds CPython itself (not in a libpython) on this machine")
    return make_core(workdir, python, "py-abort")


def test_gcore_of_a_live_process_is_a_snapshot(workdir, newest_python):
    # GIVEN a core gdb's gcore wrote of a live, sleeping exporter (SIGSTOP, si_code 128)
    core = make_gcore(workdir, PYTHONS[newest_python])
    # WHEN it is analyzed
    r = run("analyze", "--json", str(core))
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    # THEN it is a snapshot, not a crash: no crashed thread, no crash fingerprint ...
    assert a["crash"]["kind"] == "snapshot" and a["crash"]["signal_name"] == "SIGSTOP"
    assert a["fingerprint"] is None and a["crash"]["exit_status"] is None
    assert not any(t["is_crashed"] for t in a["snapshot"]["threads"])
    assert a["signature"].startswith("snapshot of a live process (SIGSTOP")
    assert "query_nvlink_throughput_counters" in a["signature"]
    # ... and every stack is still shown: both threads, native and Python
    threads = {t["name"]: t for t in a["snapshot"]["threads"]}
    assert set(threads) == {"MainThread", "metrics-server"}
    assert all(len(t["native_frames"]) > 3 and t["py_frames"] for t in threads.values())
    assert threads["metrics-server"]["py_frames"][0]["function"] == "serve_forever"
    text = run("analyze", str(core)).stdout
    assert "Fingerprint: none (a snapshot is not a crash)" in text and "[crashed" not in text


def test_stripped_binary_culprit_is_the_unnamed_frame_not_its_caller(stripped_abort):
    # GIVEN os.abort() under a distribution's stripped python: abort()'s caller, os_abort_impl, has no
    # symbol there, and the next named frame up is PyObject_Vectorcall
    a = analyze_core(str(stripped_abort))
    crashed = a.snapshot.crashed_thread
    past_libc = next(f for f in crashed.native_frames if not f.is_libc)
    assert past_libc.symbol is None  # the frame that called abort() is unnamed here
    # THEN the signature shows that frame by library and offset, never its named caller
    lib = next(lib for lib in a.snapshot.core.libraries if lib.path == past_libc.library)
    sig = signature(a)
    assert f"via {past_libc.library_name}+0x{past_libc.pc - lib.base:x} (no symbol)" in sig, sig
    assert "PyObject_Vectorcall" not in sig


def test_method_both_without_python_symbols_is_no_disagreement(stripped_abort):
    # GIVEN the stripped python's core: gdb has no CPython DWARF, the direct layout needs none
    r = run("analyze", "--method", "both", "--json", str(stripped_abort))
    # THEN the method that could not run is said, and it is no disagreement: the analysis is whole
    assert r.exit_code == EXIT_OK, r.stderr
    a = json.loads(r.stdout)["analysis"]
    assert a["snapshot"]["method_disagreements"] == []
    assert not any(f["rule"] == "python-methods-disagree" for f in a["findings"])
    assert "gdb could not read Python stacks: unsupported (gdb: no DWARF for _PyRuntime" in r.stderr
    assert a["snapshot"]["threads"][0]["py_frames"][0]["function"] == "query_nvlink_throughput_counters"


def test_main_thread_is_named_when_threading_was_never_imported(workdir, newest_python):
    # GIVEN a program that never imports threading: no thread has a Python name
    core = crash_for_core([PYTHONS[newest_python], str(BARE), str(build_libcrash(workdir))],
                          Path(tempfile.mkdtemp(dir=workdir)))
    a = analyze_core(str(core))
    crashed = a.snapshot.crashed_thread
    # THEN the thread whose tid is the pid is the main thread, and the signature says so
    assert crashed.name is None and crashed.is_main and crashed.tid == a.snapshot.core.pid
    assert f"in the main thread tid {crashed.tid} at query (bare.py:" in signature(a)


def test_frames_by_module_with_the_first_frame_outside_the_standard_library(workdir, newest_python):
    # GIVEN a fault inside ctypes.string_at, called by the exporter
    a = analyze_core(str(make_core(workdir, PYTHONS[newest_python], "string-at")))
    sig = signature(a)
    # THEN the frame is shown by module and path, and the exporter's own frame stays visible
    assert re.search(r" at ctypes\.string_at \(ctypes/__init__\.py:\d+\) from query_nvlink_throughput_counters "
                     r"\(exporter\.py:\d+\)", sig), sig
    assert a.crash.kind is CrashKind.SEGV
    text = run("analyze", str(a.snapshot.core.path)).stdout
    assert re.search(r"^    ctypes\.string_at \(ctypes/__init__\.py:\d+\)$", text, re.M)
    # the fingerprint hashes the same short path, whatever the interpreter's prefix
    assert any(b.startswith("python:ctypes/__init__.py:string_at") for b in a.fingerprint_basis)


def test_text_output_escapes_what_the_crashed_process_named(workdir, newest_python, tmp_path):
    # GIVEN a thread name and a core file name with terminal escape sequences in them
    core = make_core(workdir, PYTHONS[newest_python], "segv", env={"EXPORTER_THREAD_NAME": "evil\x1b[2J\x07"})
    d = tmp_path / "batch"
    d.mkdir()
    linked = d / "core.\x1b[31mred"
    linked.symlink_to(core)
    # WHEN analyze prints text, for the core and for a batch
    one, batch = run("analyze", str(core)), run("analyze", str(d), str(core))
    # THEN no control character reaches the terminal; each is shown escaped
    for r in (one, batch):
        assert not any(c in r.stdout for c in "\x1b\x07"), r.stdout
    assert '"evil\\x1b[2J\\x07" tid' in one.stdout
    assert "core.\\x1b[31mred" in batch.stdout


def test_report_of_a_snapshot_says_it_is_no_crash(workdir, newest_python, tmp_path):
    core = make_gcore(workdir, PYTHONS[newest_python])
    assert run("analyze", "--json", "-o", str(tmp_path / "a.json"), str(core)).exit_code == EXIT_OK
    run("report", "--template", "runbook", "-o", str(tmp_path / "r.md"), str(tmp_path / "a.json"))
    text = (tmp_path / "r.md").read_text()
    assert "did not crash: the core is a snapshot of the live process (SIGSTOP" in text
    assert "crashes with SIGSTOP" not in text and "dies of SIGSTOP" not in text


@pytest.mark.parametrize("scenario", ["heap-prev", "segv"])
def test_one_fingerprint_whatever_the_method(cores, newest_python, scenario):
    # GIVEN one crash (issue #20 item 5: gdb, --method direct and the handler's index gave three)
    core = str(cores.get(newest_python, scenario))
    got = {
        "libdw": analyze_core(core),
        "gdb": analyze_core(core, native_method="gdb", method="gdb"),
        "direct": analyze_core(core, method="direct"),
        "no unwinder": analyze_core(core, native_method="none"),
        "no gdb": analyze_core(core, gdb="/nonexistent/gdb", native_method="gdb"),
    }
    # THEN every method that unwinds the crashed thread gives the one fingerprint, whole, with the faulting function
    # (fingerprint v4, issue #38 item 1)
    unwound = {k: got[k] for k in ("libdw", "gdb", "direct")}
    assert len({a.fingerprint for a in unwound.values()}) == 1, {k: a.fingerprint_basis for k, a in got.items()}
    assert not any(a.fingerprint_partial for a in unwound.values())
    whole = got["libdw"].fingerprint_basis
    assert all(not b.startswith("native:") for b in whole)
    assert [b for b in whole if b.startswith("function:")] == \
        [f"function:libcrash.so:{'forensics_bad_write' if scenario == 'segv' else 'forensics_heap_overflow'}"]
    for k in ("no unwinder", "no gdb"):
        a = got[k]
        if scenario == "segv":
            # and so does one that unwinds nothing: the faulting function is the program counter's
            assert (a.fingerprint, a.fingerprint_partial) == (got["libdw"].fingerprint, None), a.fingerprint_basis
        else:
            # an abort's culprit (the caller of the free() glibc rejected) lies past glibc's abort frames, which only
            # an unwinder walks: without one the basis is the rest, and the fingerprint says it is partial and why
            assert a.fingerprint_basis == tuple(b for b in whole if not b.startswith("function:"))
            assert a.fingerprint_partial == \
                "the faulting thread's native stack was not unwound (its function is not known)"
