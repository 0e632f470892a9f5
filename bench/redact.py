"""Bench: the redactor's cost on ordinary input, this checkout's rules against an earlier revision's (the peer).

Redaction is on analyze's hot path: every string of every ``--json`` document and text line goes through
:class:`forensics.redact.Redactor`.  A rule added for a new secret form must not make ordinary input measurably
slower.  The ordinary input is real: ``forensics analyze --json`` of a gcore'd CPython process with --threads
threads, each a few Python frames deep in a module and a C library (many frames, paths, library names, a
command line with options and an environment of ordinary variables), and the harmless lines of
tests/data/secrets_corpus.json.  Each figure is the median (CPU seconds) of --repeat interleaved runs of
``redact_document`` on that document (a fresh copy each time) and of ``Redactor().text`` over the lines, in the
same process, of the installed ``forensics.redact`` and of the peer's ``forensics/redact.py`` (``git show
REV:forensics/redact.py``, loaded as a module of its own).

    .venv/bin/python bench/redact.py [--rev main~1] [--threads 64] [--repeat 31] [--json]
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORENSICS = str(Path(sys.executable).parent / "forensics")
PROGRAM = r"""
import os, sys, threading, time
def handler_for(n):
    def serve_forever(depth):
        if depth:
            return serve_forever(depth - 1)
        time.sleep(3600)
    return serve_forever
def worker(n):
    handler_for(n)(5)
for i in range(int(sys.argv[1])):
    threading.Thread(target=worker, args=(i,), name=f"collector-{i}", daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


def _document(work: Path, threads: int) -> dict:
    (work / "exporter.py").write_text(PROGRAM)
    env = {**os.environ, "EXPORTER_PORT": "9400", "LOG_LEVEL": "info", "CUDA_VISIBLE_DEVICES": "0,1",
           "PYTHONPATH": "/app/lib:/app", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    proc = subprocess.Popen([sys.executable, str(work / "exporter.py"), str(threads), "--bind-address", "0.0.0.0",
                             "--port", "9400", "--interval", "5s"], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        subprocess.run(["gcore", "-o", str(work / "core"), str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.kill()
        proc.wait()
    out = subprocess.run([FORENSICS, "analyze", "--json", str(work / f"core.{proc.pid}")], capture_output=True,
                         text=True)
    if out.returncode not in (0, 4):
        raise SystemExit(f"analyze failed: {out.stderr[-500:]}")
    return json.loads(out.stdout)["analysis"]


def _peer(rev: str, work: Path, name: str = "redact_peer"):
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:forensics/redact.py"], capture_output=True,
                          text=True, check=True).stdout
    path = work / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _median_pair(a, b, repeat: int) -> tuple[float, float]:
    ta, tb = [], []
    for i in range(repeat):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            t = time.process_time()  # CPU time: the machine's other load weighs less on it than on wall time
            fn()
            out.append(time.process_time() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="main", help="the peer: a git revision whose forensics/redact.py is compared")
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=31)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import forensics.redact as ours

    with tempfile.TemporaryDirectory(prefix="forensics-bench-redact-") as tmp:
        work = Path(tmp)
        doc = _document(work, a.threads)
        peer = _peer(a.rev, work)
        twin = _peer(a.rev, work, "redact_twin")  # the same peer again: the noise floor of a ratio
    corpus = json.loads((ROOT / "tests" / "data" / "secrets_corpus.json").read_text())
    lines = corpus["harmless"] * 50

    def doc_with(module):
        return lambda: module.redact_document(copy.deepcopy(doc))

    def lines_with(module):
        def run():
            for line in lines:
                module.Redactor().text(line)
        return run

    copy_only = statistics.median(
        [(lambda t: (copy.deepcopy(doc), time.process_time() - t)[1])(time.process_time()) for _ in range(a.repeat)])
    d_ours, d_peer = _median_pair(doc_with(ours), doc_with(peer), a.repeat)
    l_ours, l_peer = _median_pair(lines_with(ours), lines_with(peer), a.repeat)
    d_twin, d_peer2 = _median_pair(doc_with(twin), doc_with(peer), a.repeat)
    result = {"peer": a.rev, "threads": a.threads, "strings": len(json.dumps(doc)),
              "document_s": {"ours": round(d_ours - copy_only, 5), "peer": round(d_peer - copy_only, 5),
                             "ratio": round((d_ours - copy_only) / (d_peer - copy_only), 3),
                             "noise_floor_ratio": round((d_twin - copy_only) / (d_peer2 - copy_only), 3)},
              "harmless_lines_s": {"ours": round(l_ours, 5), "peer": round(l_peer, 5),
                                   "ratio": round(l_ours / l_peer, 3), "lines": len(lines)}}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    d, h = result["document_s"], result["harmless_lines_s"]
    print(f"redact_document of analyze --json ({a.threads} threads, {result['strings']:,} bytes of JSON), "
          f"median of {a.repeat}:")
    print(f"  this checkout   {d['ours'] * 1000:8.2f} ms")
    print(f"  {a.rev:<15} {d['peer'] * 1000:8.2f} ms")
    print(f"  ratio           {d['ratio']:8.3f}   ({a.rev} against a second copy of itself: "
          f"{d['noise_floor_ratio']:.3f})")
    print(f"Redactor().text over {h['lines']} harmless lines:")
    print(f"  this checkout   {h['ours'] * 1000:8.2f} ms")
    print(f"  {a.rev:<15} {h['peer'] * 1000:8.2f} ms")
    print(f"  ratio           {h['ratio']:8.3f}")


if __name__ == "__main__":
    main()
