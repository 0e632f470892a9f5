"""Every planted secret of the corpus, carried by a real crashing process, leaves through no artifact (#33 items
2 and 3, #26 item 6).

A Python process carries every form of tests/data/secrets_corpus.json in its environment (one variable per
form, under an innocent name: the value's own structure must give it away) and in its argv (one item per
form), holds secrets in the crashing frames' locals (one cut by the 77-character str quote) and names its
threads after secrets (the crashing one after a value its argv gives as --api-key, another after an NGC
key).  Its twin crashes (SIGSEGV in ctypes.string_at) and leaves a kernel core; the live one stands for the
container.  The real core handler takes the core, the real agent analyzes it into the bundle and posts its
Event to the API stand-in, and the analyst's side runs analyze --json, report (three templates, with their
attachments and as JSON) and verify-imports --pid --json.  Each output's (planted, masked, leaked) is printed.

A heap overflow whose bytes past the buffer's end are the password its argv gives: the heap verdict's quote
of them (first_bytes), the report's "First bytes past the end" and analyze's text mask it in hex and text.

And redaction is no weapon: a process started with ``--api-key SIGSEGV --token string_at`` that crashes in
ctypes.string_at with SIGSEGV keeps its crash site in the signature, the report's title and body.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.cgroups import CGROUP_ROOT, pod_cgroup, remove_cgroup
from tests.conftest import PYTHONS
from tests.crashers.make_core import EXPORTER, build_libcrash, crash_for_core
from tests.integration.test_agent_serve import NS, AgentProcess, handle, wait_analyzed
from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the core handler and verify-imports --pid read other processes"),
    pytest.mark.skipif(not CGROUP_ROOT.is_dir(), reason="no cgroup hierarchy to place the container's process"),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

CORPUS = json.loads((Path(__file__).parent.parent / "data" / "secrets_corpus.json").read_text())
THREAD_SECRET = "ThreadNameSecret0101"  # given as --api-key, and the crashing thread's name
NGC_THREAD = "nvapi-" + "ThreadNgcKey0102" * 3  # a second thread's name: an NGC key, nowhere else
LOCAL_PASSWORD = "LocalPassw0rd0103"  # a local named password in the crashing frame
LOCAL_CUT = "LocalCutSecret0104abcdefgh"  # given as --token; a local's str holds it where the quote is cut
PLANTED = sorted({s for e in CORPUS["entries"] for s in e["secrets"]}
                 | {THREAD_SECRET, NGC_THREAD, LOCAL_PASSWORD, LOCAL_CUT})

HOSTILE = r'''
import ctypes, os, sys, threading, time

def poll(password, note):
    if sys.argv[1] == "sleep":
        while True:
            time.sleep(3600)
    ctypes.string_at(0x10, 8)

def main():
    threading.Thread(target=lambda: time.sleep(3600), name=os.environ["NGC_THREAD"], daemon=True).start()
    note = "x" * 60 + os.environ["CUT"]  # the str quote is cut at 77 characters, inside the secret
    t = threading.Thread(target=poll, args=(os.environ["LOCAL_PW"], note), name="poller " + os.environ["THREAD"])
    t.start()
    t.join()

main()
'''


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def texts_of(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` but cores and stored objects (mapped ELF files), as text."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and not p.name.startswith("core") and "objects" not in rel.parts and p.suffix != ".zst":
            out[str(rel)] = p.read_bytes().decode("utf-8", "replace")
    return out


def leaked_in(text: str) -> list[str]:
    return [s for s in PLANTED if s in text or json.dumps(s)[1:-1] in text]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, core_pattern, newest_python):
    """The live process in a pod container's cgroup, its crashed twin's kernel core, and their argv and env."""
    d = tmp_path_factory.mktemp("hostile")
    script = d / "hostile.py"
    script.write_text(HOSTILE)
    env = {f"FORM_{i:02d}": e["text"] for i, e in enumerate(CORPUS["entries"])}
    env.update(NGC_THREAD=NGC_THREAD, THREAD=THREAD_SECRET, LOCAL_PW=LOCAL_PASSWORD, CUT=LOCAL_CUT)
    forms = [e["text"] for e in CORPUS["entries"]]
    tail = ["--api-key", THREAD_SECRET, "--token", LOCAL_CUT, *forms]
    python = PYTHONS[newest_python]
    run_dir = d / "run"
    run_dir.mkdir()
    core = crash_for_core([python, str(script), "crash", *tail], run_dir, env=env)
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    live = subprocess.Popen([python, str(script), "sleep", *tail], env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cg = pod_cgroup(pod_uid, cid)
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(live.pid))
        # the secrets really are in the core: its memory holds the argv, environment and thread names
        raw = core.read_bytes()
        assert all(s.encode() in raw for s in (THREAD_SECRET, NGC_THREAD, LOCAL_PASSWORD, LOCAL_CUT))
        yield {"core": core, "pid": live.pid, "pod_uid": pod_uid, "cid": cid, "dir": d}
    finally:
        remove_cgroup(cg)
        live.kill()
        live.wait()


@pytest.fixture(scope="module")
def outputs(hostile, tmp_path_factory) -> dict[str, dict[str, str]]:
    """Every artifact made of the hostile process, by output: {output: {file or item: text}}."""
    tmp = tmp_path_factory.mktemp("outputs")
    out: dict[str, dict[str, str]] = {}
    core_dir = tmp / "cores"
    node = socket.gethostname()
    # the node's side: the core handler's bundle, the agent's analysis in it, and its Event
    with StandIn(path_env=os.environ["PATH"]) as api:
        api.nodes[node] = make_node(node)
        api.pods[(NS, "exporter-s1")] = make_pod(name="exporter-s1", namespace=NS, uid=hostile["pod_uid"], node=node,
                                                 container_id=hostile["cid"], restarts=1, last_exit=139)
        kubeconfig = write_kubeconfig(str(tmp / "kc"), api.url, context="standin")
        handle(core_dir, hostile["pid"], signal.SIGSEGV, hostile["core"])
        agent = AgentProcess(core_dir, node, kubeconfig, tmp)
        try:
            wait_analyzed(core_dir, 1)
            import time

            deadline = time.monotonic() + 30
            while not [e for e in api.events if e["reason"] == "NativeCrash"] and time.monotonic() < deadline:
                time.sleep(0.3)
            events = [e for e in api.events if e["reason"] == "NativeCrash"]
        finally:
            agent.stop()
    assert events, "the agent posted no Event"
    (bundle,) = (core_dir / "crashes").iterdir()
    files = texts_of(bundle)
    out["agent analysis.json"] = {"analysis.json": files["60-analysis/analysis.json"]}
    out["crash bundle"] = files
    out["Kubernetes Event"] = {e["metadata"]["name"]: json.dumps(e) for e in events}
    # the analyst's side: analyze --json of the core, the reports, verify-imports --pid --json
    analysis = tmp / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(hostile["core"])).exit_code in (0, 4)
    out["analyze --json"] = {"analysis.json": analysis.read_text()}
    out["analyze (text)"] = {"stdout": run("analyze", str(hostile["core"])).stdout}
    cores = hostile["core"].parent
    out["analyze, a batch"] = {"--json": run("analyze", "--json", str(cores)).stdout,
                               "text": run("analyze", str(cores)).stdout}
    reports: dict[str, str] = {}
    for template in ("nvitop", "nvml", "runbook"):
        rdir = tmp / f"report-{template}"
        rdir.mkdir()
        r = run("report", "--template", template, "-o", str(rdir / "report.md"), str(bundle), str(analysis))
        assert r.exit_code in (0, 3), r.output
        reports.update({f"{template}/{k}": v for k, v in texts_of(rdir).items()})
        reports[f"{template}/--json"] = run("report", "--json", "--template", template, str(bundle),
                                            str(analysis)).stdout
    out["reports"] = reports
    r = subprocess.run([sys.executable, "-m", "forensics", "verify-imports", "--pid", str(hostile["pid"]), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stderr
    out["verify-imports --pid --json"] = {"stdout": r.stdout}
    r = subprocess.run([sys.executable, "-m", "forensics", "verify-imports", "--pid", str(hostile["pid"]), "-v"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stderr
    out["verify-imports --pid (text)"] = {"stdout": r.stdout, "stderr": r.stderr}
    return out


def test_no_artifact_keeps_a_planted_secret(outputs, capsys):
    table, leaks = [], []
    for output, files in outputs.items():
        leaked = sorted({s for text in files.values() for s in leaked_in(text)})
        leaks += [(output, name, leaked_in(text)) for name, text in files.items() if leaked_in(text)]
        table.append((output, len(PLANTED), len(PLANTED) - len(leaked), len(leaked)))
    with capsys.disabled():
        print("\nplanted secrets per output: planted masked leaked")
        for row in table:
            print(f"  {row[0]:28} {row[1]:4} {row[2]:4} {row[3]:4}")
    assert leaks == []


def test_the_thread_names_and_locals_are_masked_in_place(outputs):
    doc = json.loads(outputs["agent analysis.json"]["analysis.json"])
    a = doc["analysis"]
    threads = {t["name"] for t in a["snapshot"]["threads"]}
    assert "poller [REDACTED]" in threads and "[REDACTED]" in threads
    crashed = next(t for t in a["snapshot"]["threads"] if t["is_crashed"])
    locals_ = {x["name"]: x["value"] for f in crashed["py_frames"] for x in f["locals"]}
    assert locals_["password"] == "[REDACTED]" and locals_["note"].endswith("[REDACTED]...'")
    # the signature names the crashing thread: masked there, and said so
    assert 'thread "poller [REDACTED]"' in a["signature"] and "string_at" in a["signature"]
    assert doc["redaction"]["masked_in"] == ["signature"]
    (event,) = outputs["Kubernetes Event"].values()
    assert "poller [REDACTED]" in json.loads(event)["note"]  # events.k8s.io/v1 (5ee8ce4): the text is its note
    footer = json.loads(outputs["reports"]["nvml/--json"])["report"]["footer"]
    assert any("masked in the crash's signature" in line for line in footer), footer


@pytest.fixture(scope="module")
def weapon(tmp_path_factory, core_pattern, newest_python):
    """exporter.py crashing in ctypes.string_at (SIGSEGV), started with --api-key SIGSEGV --token string_at."""
    d = tmp_path_factory.mktemp("weapon")
    lib = build_libcrash(d)
    run_dir = d / "run"
    run_dir.mkdir()
    core = crash_for_core([PYTHONS[newest_python], str(EXPORTER), str(lib), "string-at", "/dev/null",
                           "--api-key", "SIGSEGV", "--token", "string_at"], run_dir)
    analysis = d / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(core)).exit_code in (0, 4)
    return analysis, core


def test_a_secret_equal_to_the_crash_site_does_not_blank_it(weapon):
    weapon, core = weapon
    # THEN the analysis keeps its crash site, and masks the values where the argv gives them
    text = run("analyze", str(core)).stdout
    assert "string_at" in text and "SIGSEGV" in text and "--token [REDACTED]" in text
    batch = json.loads(run("analyze", "--json", str(core.parent)).stdout)
    (entry,) = batch["cores"]
    assert "string_at" in entry["signature"] and "[REDACTED]" not in entry["signature"]
    doc = json.loads(weapon.read_text())
    a = doc["analysis"]
    assert a["signature"].startswith("SIGSEGV at ") and "string_at" in a["signature"], a["signature"]
    assert "[REDACTED]" not in a["signature"] and doc["redaction"]["masked_in"] == []
    assert "--api-key [REDACTED] --token [REDACTED]" in a["snapshot"]["core"]["args"]
    # and so do the reports: title and body name the signal and the function; nothing was masked in a title
    for template in ("nvitop", "nvml", "runbook"):
        rep = json.loads(run("report", "--json", "--template", template, str(weapon)).stdout)["report"]
        assert "[REDACTED]()" not in rep["body"] and "with [REDACTED]" not in rep["body"], template
        assert "[REDACTED]" not in rep["title"], rep["title"]
        assert "SIGSEGV" in rep["body"] and "string_at" in rep["body"], template
        assert not any("masked in the crash's" in line for line in rep["footer"])


HEAP_OVERFLOW = r'''
import ctypes, sys
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
secret = sys.argv[sys.argv.index("--password") + 1].encode()
a = libc.malloc(2000)
b = libc.malloc(2000)
ctypes.memmove(a, b"A" * 2000 + secret, 2000 + len(secret))  # the copy runs on over b's header: glibc aborts in free
libc.free(a)
'''


def test_a_quote_of_memory_past_a_buffer_keeps_no_password(tmp_path, core_pattern, newest_python):
    # GIVEN a process whose copy overflows a heap buffer with the password its argv gives: glibc aborts in free()
    password = "HeapPassw0rdQuote77"
    (tmp_path / "heap.py").write_text(HEAP_OVERFLOW)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    core = crash_for_core([PYTHONS[newest_python], str(tmp_path / "heap.py"), "--password", password], run_dir)
    assert password.encode() in core.read_bytes()
    # WHEN it is analyzed and reported
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(core)).exit_code in (0, 4)
    doc = json.loads(analysis.read_text())
    rep = run("report", "--json", "--template", "nvml", str(analysis)).stdout
    text = run("analyze", str(core)).stdout
    # THEN the heap verdict quotes the bytes past the buffer's end, with the password masked in hex and text alike
    quoted = bytes.fromhex(doc["analysis"]["heap"]["corruption"]["first_bytes"])
    assert b"[REDACTED]" in quoted, quoted
    assert "secrets in quotes of memory" in doc["redaction"]["counts"]
    windows = {password[i:i + 8] for i in range(len(password) - 7)}
    hexes = {w.encode().hex() for w in windows} | {w.encode().hex(" ") for w in windows}
    for name, out in (("analysis.json", analysis.read_text()), ("report", rep), ("analyze (text)", text)):
        assert not [w for w in windows | hexes if w in out], name
    assert "First bytes past the end: 5b 52 45 44 41 43 54 45 44 5d" in json.loads(rep)["report"]["markdown"]
