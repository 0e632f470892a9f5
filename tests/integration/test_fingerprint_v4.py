"""Fingerprint version 4, "the same bug" (issue #38 item 1), on real kernel cores of tests/crashers/same_bug.py.

Two native functions behind one Python dispatcher are two bugs (libdw's and gdb's stacks); one fault in two
builds of a library whose offsets differ (one of them stripped) is one; two C++ throwers escaping ``noexcept``
are two, each signature naming the thrower and the exception's type; one double free whose glibc message
differs by the allocation's size and the heap around it is one, under every interpreter the suite has; and the
batch over the suite's cores groups them exactly as the bugs were planted.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.analyze.fingerprint import FINGERPRINT_VERSION, fingerprint, fingerprint_basis_v3
from forensics.model import CrashKind, HeapFailureKind
from forensics.views.signature import signature
from tests.conftest import PYTHONS
from tests.crashers.make_core import HERE, build_libcrash

OVERFLOW = HERE / "overflow.py"


@pytest.mark.parametrize("method", ["libdw", "gdb"])
def test_two_native_functions_behind_one_python_function_are_two_bugs(same_bug, newest_python, method):
    # GIVEN one Python dispatcher calling two functions of one library with NULL: a read at NULL+0 and at NULL+0x10
    kw = {"libdw": {}, "gdb": {"method": "gdb", "native_method": "gdb"}}[method]
    got = {mode: same_bug.analysis(newest_python, mode, **kw) for mode in ("dispatch-sum", "dispatch-count")}
    for mode, function in (("dispatch-sum", "forensics_sum_keys"), ("dispatch-count", "forensics_count_names")):
        a = got[mode]
        assert a.fingerprint_partial is None, a.fingerprint_partial
        # THEN the faulting function is in the basis beside the Python frames they share
        assert f"function:libcrash.so:{function}" in a.fingerprint_basis, a.fingerprint_basis
        assert "python:same_bug.py:dispatch" in a.fingerprint_basis
    # and they are two bugs, where the previous definition made them one
    assert got["dispatch-sum"].fingerprint != got["dispatch-count"].fingerprint
    assert got["dispatch-sum"].fingerprint_v3 == got["dispatch-count"].fingerprint_v3
    assert (got["dispatch-sum"].crash.fault_address, got["dispatch-count"].crash.fault_address) == (0, 0x10)


def test_both_native_methods_give_one_fingerprint(same_bug, newest_python):
    for mode in ("dispatch-sum", "throw-parse", "double-free-small"):
        libdw = same_bug.analysis(newest_python, mode)
        gdb = same_bug.analysis(newest_python, mode, method="gdb", native_method="gdb")
        assert libdw.fingerprint == gdb.fingerprint, (mode, libdw.fingerprint_basis, gdb.fingerprint_basis)


@pytest.fixture(scope="module")
def other_build(cores) -> Path:
    """libcrash.so built again with code before every function (their offsets move), then stripped of its
    symbol table (a driver's point release: only its exported symbols left)."""
    lib = build_libcrash(cores.base / "padded", cflags=("-DFORENSICS_PAD",))
    stripped = lib.with_name("stripped") / "libcrash.so"
    stripped.parent.mkdir(exist_ok=True)
    if not stripped.exists():
        subprocess.run(["strip", "--strip-all", "-o", str(stripped), str(lib)], check=True, timeout=60)
    return stripped


def test_one_fault_in_two_builds_of_a_library_is_one_bug(same_bug, newest_python, other_build):
    # GIVEN one NULL write under the suite's libcrash.so and under another build of it, stripped
    first = same_bug.analysis(newest_python, "null")
    second = same_bug.analysis(newest_python, "null", lib=other_build)
    pcs = [a.snapshot.crashed_thread.native_frames[0] for a in (first, second)]
    bases = [next(lib.base for lib in a.snapshot.core.libraries if lib.path.endswith("libcrash.so"))
             for a in (first, second)]
    assert pcs[0].pc - bases[0] != pcs[1].pc - bases[1]  # the fault's offset in the object differs
    assert not any(s.startswith("native:") and "+0x" in s for s in second.fingerprint_basis)
    # THEN one bug: the function by its name (the stripped build's by its exported symbol), no offset
    assert "function:libcrash.so:forensics_bad_write" in first.fingerprint_basis
    assert first.fingerprint == second.fingerprint, (first.fingerprint_basis, second.fingerprint_basis)


def test_two_cxx_throwers_are_two_bugs_named_by_thrower_and_type(same_bug, newest_python):
    # GIVEN std::out_of_range from app::parse_header and app::ParseError from app::read_config, each escaping a
    # noexcept entry point (std::terminate, abort)
    got = {mode: same_bug.analysis(newest_python, mode) for mode in ("throw-parse", "throw-config")}
    stderr = {mode: (same_bug.core(newest_python, mode).parent / ".stderr").read_text() for mode in got}
    for mode, exc_type, mangled, thrower in (
            ("throw-parse", "std::out_of_range", "St12out_of_range", "app::parse_header"),
            ("throw-config", "app::ParseError", "N3app10ParseErrorE", "app::read_config")):
        a = got[mode]
        # the oracle: libstdc++'s verbose terminate handler names the type on stderr
        assert f"terminate called after throwing an instance of '{exc_type}'" in stderr[mode]
        assert a.crash.kind is CrashKind.ABORT
        exc = a.snapshot.crashed_thread.cxx_exception
        assert exc is not None and (exc.type, exc.mangled, exc.runtime) == (exc_type, mangled, "libstdc++")
        # THEN the signature names the exception's type and its thrower, not libstdc++'s terminate machinery
        sig = signature(a)
        assert f"[abort] std::terminate on an uncaught {exc_type}" in sig, sig
        assert f"thrown by {thrower} (libthrower.so)" in sig, sig
        assert "libstdc++" not in sig
        assert f"exception:{mangled}" in a.fingerprint_basis and f"function:libthrower.so:{thrower}" in \
            a.fingerprint_basis, a.fingerprint_basis
    # and two bugs, where the previous definition made them one
    assert got["throw-parse"].fingerprint != got["throw-config"].fingerprint
    assert got["throw-parse"].fingerprint_v3 == got["throw-config"].fingerprint_v3


def test_one_double_free_is_one_bug_whatever_glibcs_message(same_bug):
    # GIVEN one buffer released twice, 64 bytes (a tcache size) and 1280 bytes, under every interpreter here and
    # Debian unstable's in the sid root
    got = {(key, mode): same_bug.analysis(key, mode) for key in same_bug.keys
           for mode in ("double-free-small", "double-free-large")}
    for k, a in got.items():
        assert a.crash.kind is CrashKind.HEAP_CORRUPTION, k
        assert a.heap is not None and a.heap.corruption is not None, k
    # the heap's anatomy finds the chunk freed twice in every one of them: "a second free of ..."
    found = {k: a for k, a in got.items() if a.heap.corruption.kind is HeapFailureKind.DOUBLE_FREE}
    assert found == got, {k: (a.crash.abort_message, a.heap.corruption.verdict_reason) for k, a in got.items()
                          if k not in found}
    assert all("a second free" in a.heap.corruption.verdict_reason for a in got.values()), \
        {k: a.heap.corruption.verdict_reason for k, a in got.items()}
    messages = {a.crash.abort_message for a in found.values()}
    # THEN glibc caught it with different checks (the messages differ) ...
    assert len(messages) >= 2 and "free(): double free detected in tcache 2" in messages, messages
    for k, a in found.items():
        assert "heap:double-free" in a.fingerprint_basis and not any(s.startswith("abort:") for s in
                                                                      a.fingerprint_basis), a.fingerprint_basis
        assert a.fingerprint_partial is None, (k, a.fingerprint_partial)
    # ... and it is one bug; the previous definition, keyed on the message, split it
    assert len({a.fingerprint for a in found.values()}) == 1, {k: a.fingerprint_basis for k, a in found.items()}
    assert len({a.fingerprint_v3 for a in found.values()}) >= 2


#: the suite's planted bugs: (crasher, mode, faulthandler) -> the bug it is (one name per bug)
PLANTED = {
    ("same", "thread-method", False): "thread-method",
    ("same", "c-extension", False): "c-extension",
    ("same", "assert", False): "assert",
    ("same", "native-a", False): "native-a",
    ("same", "native-b", False): "native-b",
    ("same", "null", False): "null",
    ("same", "null", True): "null",
    ("same", "usr1-handler", False): "usr1-handler",
    ("same", "double-free-small", False): "double-free",
    ("same", "double-free-large", False): "double-free",
    ("same", "dispatch-sum", False): "dispatch-sum",
    ("same", "dispatch-count", False): "dispatch-count",
    ("same", "throw-parse", False): "throw-parse",
    ("same", "throw-config", False): "throw-config",
    ("overflow", "c-recursion", False): "c-recursion",
    ("overflow", "py-recursion", False): "py-recursion",
    ("overflow", "memmap", False): "memmap",
}


def test_the_batch_groups_equal_the_planted_bugs(same_bug, tmp_path):
    # GIVEN every planted bug crashed under the oldest and the newest interpreter here, in one directory
    keys = sorted({next(iter(PYTHONS)), list(PYTHONS)[-1]})
    d = tmp_path / "cores"
    d.mkdir()
    bug_of: dict[str, str] = {}
    for key in keys:
        for (crasher, mode, fh), bug in PLANTED.items():
            core = same_bug.core(key, mode, faulthandler=fh, script=OVERFLOW if crasher == "overflow" else None)
            name = f"core.{key}.{mode}{'.fh' if fh else ''}"
            os.symlink(core, d / name)
            bug_of[str(d / name)] = bug
    # WHEN forensics analyze DIR runs as a user runs it
    exe = shutil.which("forensics", path=str(Path(os.sys.executable).parent))
    p = subprocess.run([exe, "analyze", "--json", "-j", "2", str(d)], capture_output=True, text=True, timeout=900)
    assert p.returncode in (0, 4), p.stderr
    doc = json.loads(p.stdout)
    # THEN its groups are the planted bugs exactly: no merge, no split
    groups = [{bug_of[path] for path in g["paths"]} for g in doc["batch"]["groups"]]
    assert all(len(g) == 1 for g in groups), [sorted(g) for g in groups if len(g) > 1]  # no merge
    assert sorted(next(iter(g)) for g in groups) == sorted(set(PLANTED.values()))  # no split
    assert doc["found"]["bugs"] == len(set(PLANTED.values()))
    assert all(c["fingerprint"] for c in doc["cores"]) and not doc["batch"]["failed"]
    # the previous definition's count is beside it, and every core carries its previous key
    assert doc["found"]["fingerprints_v3"] >= 1 and all(c["fingerprint_v3"] for c in doc["cores"])
    text = subprocess.run([exe, "analyze", "-j", "2", str(d)], capture_output=True, text=True, timeout=900).stdout
    assert text.splitlines()[1].startswith(f"Found {len(set(PLANTED.values()))} bugs (distinct fingerprints); the "
                                           "previous fingerprint definition gives them "), text.splitlines()[:2]


def test_the_previous_definition_stays_readable(same_bug, newest_python):
    a = same_bug.analysis(newest_python, "dispatch-sum")
    assert a.fingerprint_version == FINGERPRINT_VERSION == 4
    assert a.fingerprint_v3 == fingerprint(fingerprint_basis_v3(a.snapshot, a.crash)[0])
    assert a.fingerprint_v2 is None  # retired: no longer computed
