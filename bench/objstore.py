"""Bench: `forensics upload` against boto3's own copy (s3transfer's upload_file) of the same file, and
`forensics analyze s3://...` against `analyze` of the local copy, on a real S3 server on 127.0.0.1.

The server is SeaweedFS (tests/s3_env.py).  The upload's file is a sealed bundle of one random core-sized file
(--size, 256 MiB by default); both uploads use 16 MiB parts, 4 in flight, and SHA-256 checksums (boto3's
`upload_file` with ChecksumAlgorithm=SHA256, as `aws s3 cp --checksum-algorithm SHA256` runs it), so the
difference is what forensics adds: the file read once before (its SHA-256 against the manifest and the parts'
digests) and the object verified after.  The analysis pair: a real core of a small C program crashed by the
kernel (core_pattern must leave it in the working directory, as the tests' session sets it), taken by the real
core handler; `analyze s3://` is timed cold (fetched into an empty cache) and warm (the entry reused).  Each
figure is the best of --repeat runs (wall seconds); prints a table, or --json.

--agent-core SIZE (#29's "a 2 GB core uploaded in parts with the agent's memory bounded") runs instead: a C
program fills SIZE of its heap with pseudo-random bytes (xorshift: the core does not compress), gcore writes its
real core, the real core handler takes it into a core directory (zstd, as the kernel would pipe it), and a real
`agent serve --upload` (bandwidth unbounded, 16 MiB parts, 4 in flight) analyzes it and uploads the bundle to
SeaweedFS on 127.0.0.1. The agent's own peak RSS (VmHWM of its process; the analysis is a child with its own
bounds) is compared with the same agent's on a 16 MiB core, and the object is checked by the server's composite
SHA-256 and part count. About 3 x SIZE of free disk is needed (the core, its bundle, the bucket).

--records N (#37's "40 records of 16 MiB") runs instead: `fleet --bundles s3://...` over N bundles whose
UPLOAD.json records are 16 MiB each (items of long paths, within what a bundle's record holds), served by the
tests' hostile S3 endpoint on 127.0.0.1 (tests/hostile_s3.py; nothing hostile switched on), and the same over N
records of a few KiB: the peak RSS of the fleet process (ru_maxrss of a child run alone) of each, their ratio,
and the seconds taken.  (Before #37 every parsed record was kept: 40 such records took 2.6 GB.)

    .venv/bin/python bench/objstore.py [--size 256M] [--repeat 3] [--json]
    .venv/bin/python bench/objstore.py --agent-core 2G [--json]
    .venv/bin/python bench/objstore.py --records 40 [--json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.s3_env import S3Server  # noqa: E402

FORENSICS = str(Path(sys.executable).parent / "forensics")
CRASHER = "#include <stdlib.h>\n#include <string.h>\n#include <unistd.h>\n" \
          "int main(int c, char **v) { if (c > 1 && !strcmp(v[1], \"sleep\")) for (;;) pause(); abort(); }\n"


def _bundle(d: Path, size: int) -> Path:
    (d / "50-core").mkdir(parents=True)
    h = hashlib.sha256()
    with open(d / "50-core" / "core.zst", "wb") as f:
        left = size
        while left:
            block = os.urandom(min(1 << 20, left))
            h.update(block)
            f.write(block)
            left -= len(block)
    (d / "MANIFEST.json").write_text(json.dumps({"schema_version": 1, "items": [
        {"path": "50-core/core.zst", "size": size, "sha256": h.hexdigest(), "what": "random"}]}))
    return d


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _run(argv: list[str], env: dict) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    if p.returncode not in (0, 4):
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr[-2000:]}")


def bench_upload(srv: S3Server, work: Path, size: int, repeat: int) -> dict:
    bundle = _bundle(work / "bundle", size)
    env = srv.env()
    bucket = srv.make_bucket("bench-upload")
    n = iter(range(1000))
    ours = _best(lambda: _run([FORENSICS, "upload", "--keep", "--part-size", "16M", "--concurrency", "4",
                               str(bundle), f"s3://{bucket}/ours-{next(n)}"], env), repeat)
    probe = ("import sys, boto3\nfrom boto3.s3.transfer import TransferConfig\n"
             "c = boto3.client('s3')\n"
             "c.upload_file(sys.argv[1], sys.argv[2], sys.argv[3], ExtraArgs={'ChecksumAlgorithm': 'SHA256'},"
             " Config=TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20, max_concurrency=4))\n")
    theirs = _best(lambda: _run([sys.executable, "-c", probe, str(bundle / "50-core" / "core.zst"), bucket,
                                 f"boto3-{next(n)}"], env), repeat)
    mb = size / 1e6
    return {"size": size, "forensics_upload_s": round(ours, 3), "boto3_upload_file_s": round(theirs, 3),
            "forensics_MB_s": round(mb / ours, 1), "boto3_MB_s": round(mb / theirs, 1),
            "ratio": round(ours / theirs, 2)}


def _real_bundle(work: Path) -> Path:
    d = work / "crasher"
    d.mkdir()
    (d / "c.c").write_text(CRASHER)
    subprocess.run(["gcc", "-g", "-o", str(d / "crasher"), str(d / "c.c")], check=True)
    subprocess.run([str(d / "crasher")], cwd=d, capture_output=True,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
    cores = [p for p in d.iterdir() if p.name.startswith("core")]
    if not cores:
        raise SystemExit("no core: kernel.core_pattern must write 'core' into the working directory")
    live = subprocess.Popen([str(d / "crasher"), "sleep"])
    try:
        with open(cores[0], "rb") as f:
            subprocess.run([FORENSICS, "core-handler", str(work / "cores"), str(live.pid), str(live.pid), "6",
                            str(int(time.time())), "18446744073709551615"], stdin=f, env={}, cwd="/", check=True)
    finally:
        live.kill()
        live.wait()
    return next((work / "cores" / "crashes").iterdir())


def bench_analyze(srv: S3Server, work: Path, repeat: int) -> dict:
    crash = _real_bundle(work)
    bucket = srv.make_bucket("bench-analyze")
    env = srv.env(FORENSICS_CACHE=str(work / "cache"), HOME=str(work))
    p = subprocess.run([FORENSICS, "upload", "--json", "--keep", str(crash), f"s3://{bucket}/b"], capture_output=True,
                       text=True, env=env, check=True)
    url = json.loads(p.stdout)["uploads"][0]["url"]
    local = _best(lambda: _run([FORENSICS, "analyze", "--json", str(crash)], env), repeat)

    def cold() -> None:
        shutil.rmtree(work / "cache" / "s3", ignore_errors=True)
        _run([FORENSICS, "analyze", "--json", url], env)

    remote_cold = _best(cold, repeat)
    remote_warm = _best(lambda: _run([FORENSICS, "analyze", "--json", url], env), repeat)
    return {"analyze_local_s": round(local, 3), "analyze_s3_cold_s": round(remote_cold, 3),
            "analyze_s3_warm_s": round(remote_warm, 3), "cold_ratio": round(remote_cold / local, 2),
            "warm_ratio": round(remote_warm / local, 2)}


BIG = r"""#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int c, char **v) {
    size_t n = strtoull(v[1], 0, 10) / 8;
    uint64_t *p = malloc(n * 8), x = 88172645463325252ull;
    if (!p) return 1;
    for (size_t i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; p[i] = x; }
    printf("ready %p\n", (void *)p); fflush(stdout);
    for (;;) pause();
}
"""


def _agent_bundle(work: Path, name: str, size: int) -> tuple[Path, int]:
    """A core directory holding the handler's bundle of a real core of ``size`` bytes of heap: (dir, core.zst)."""
    src, exe = work / "heapfill.c", work / "heapfill"
    if not exe.exists():
        src.write_text(BIG)
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    p = subprocess.Popen([str(exe), str(size)], stdout=subprocess.PIPE, text=True)
    try:
        if not (p.stdout.readline().startswith("ready")):
            raise SystemExit("the core's program did not start")
        raw = work / f"{name}.core"
        subprocess.run(["gcore", "-o", str(raw), str(p.pid)], check=True, capture_output=True)
        raw = raw.with_name(f"{raw.name}.{p.pid}")
        cores = work / f"cores-{name}"
        with open(raw, "rb") as f:
            subprocess.run([FORENSICS, "core-handler", str(cores), str(p.pid), str(p.pid), "6", str(int(time.time())),
                            "18446744073709551615", "--max-core-size", "64G"], stdin=f, env={}, cwd="/", check=True)
        raw.unlink()
    finally:
        p.kill()
        p.wait()
    (crash,) = (cores / "crashes").iterdir()
    return cores, (crash / "50-core" / "core.zst").stat().st_size


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def _agent_upload(srv: S3Server, work: Path, cores: Path, bucket: str) -> dict:
    """agent serve --upload on ``cores`` until its crash is uploaded: seconds, the agent's peak RSS, the object."""
    env = srv.env(FORENSICS_CACHE=str(work / "cache"), HOME=str(work))
    (crash,) = (cores / "crashes").iterdir()
    agent = subprocess.Popen([FORENSICS, "agent", "serve", "--core-dir", str(cores), "--node-name", "bench",
                              "--no-events", "--metrics-port", "0", "--analysis-timeout", "1200", "--upload",
                              f"s3://{bucket}/{cores.name}", "--upload-max-bandwidth", "0", "--upload-keep"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        analyzed = None
        while not (crash / "70-upload.json").exists():
            if agent.poll() is not None:
                raise SystemExit(f"agent serve exited {agent.returncode}: {agent.stderr.read()[-2000:]}")
            if analyzed is None and any((crash / "60-analysis" / n).exists() for n in ("analysis.json",
                                                                                       "failed.json")):
                analyzed = time.monotonic()
            time.sleep(0.1)
        done = time.monotonic()
        peak = _vm_hwm(agent.pid)
    finally:
        agent.terminate()
        agent.wait(60)
    record = json.loads((crash / "70-upload.json").read_text())
    key = record["url"][len(f"s3://{bucket}/"):] + "50-core/core.zst"
    head = srv.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    return {"upload_s": round(done - (analyzed or done), 2), "agent_peak_rss": peak,
            "object_size": head["ContentLength"], "checksum": head.get("ChecksumSHA256", "")}


def bench_agent_core(srv: S3Server, work: Path, size: int) -> dict:
    bucket = srv.make_bucket("bench-agent-core")
    out = {}
    for name, n in (("small", 16 << 20), ("big", size)):
        cores, zst = _agent_bundle(work, name, n)
        r = _agent_upload(srv, work, cores, bucket)
        if r["object_size"] != zst:
            raise SystemExit(f"{name}: the bucket holds {r['object_size']} bytes of a {zst}-byte core.zst")
        out[name] = {"heap": n, "core_zst": zst, **r}
        shutil.rmtree(cores / "crashes", ignore_errors=True)
    big = out["big"]
    out["growth"] = big["agent_peak_rss"] - out["small"]["agent_peak_rss"]
    out["MB_s"] = round(big["core_zst"] / 1e6 / big["upload_s"], 1) if big["upload_s"] else None
    return out


def _print_agent_core(r: dict) -> None:
    big, small = r["big"], r["small"]
    print(f"agent serve --upload of a real core ({big['heap'] >> 20} MiB heap; core.zst {big['core_zst']:,} bytes, "
          f"checksum {big['checksum']}):")
    print(f"  upload after the analysis   {big['upload_s']:8.2f} s  {r['MB_s']} MB/s")
    print(f"  agent peak RSS              {big['agent_peak_rss'] >> 20} MiB (16 MiB core: "
          f"{small['agent_peak_rss'] >> 20} MiB; growth {r['growth'] >> 20} MiB)")


def _fleet_peak(server, n: int, pad: int, work: Path) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of fleet --bundles over ``n`` records of about ``pad`` bytes."""
    from tests.hostile_s3 import upload_record

    template = upload_record(fingerprint="FP-PLACEHOLDER", node="gpu-3", time=1.0e9, pad=pad)
    server.objects["bench"] = {f"p/c/gpu-3/ns/p/t-{i:03d}/UPLOAD.json":
                               (lambda i=i: template.replace(b"FP-PLACEHOLDER", f"fp-{i:03d}-padded".encode()))
                               for i in range(n)}
    pods = {"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                                       "spec": {"nodeName": "gpu-3"}, "status": {}}]}
    nodes = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "gpu-3", "labels": {}}}]}
    (work / "pods.json").write_text(json.dumps(pods))
    (work / "nodes.json").write_text(json.dumps(nodes))
    # a child of its own measures it: ru_maxrss of RUSAGE_CHILDREN is the largest child's, so a helper runs it
    helper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
              "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + ' ' + str(r.returncode))")
    argv = [FORENSICS, "fleet", "--from", str(work / "pods.json"), "--nodes", str(work / "nodes.json"),
            "--bundles", "s3://bench/p", "--json"]
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", helper, *argv], capture_output=True, text=True,
                         env=server.env(os.environ, HOME=str(work)), check=True).stdout.split()
    took = time.perf_counter() - t
    if out[1] != "0":
        raise SystemExit(f"fleet --bundles exited {out[1]}")
    return int(out[0]) * 1024, took


def bench_records(n: int) -> dict:
    from tests.hostile_s3 import HostileS3

    work = Path(tempfile.mkdtemp(prefix="forensics-bench-records-"))
    server = HostileS3()
    try:
        big, big_s = _fleet_peak(server, n, (16 << 20) - (256 << 10), work)
        small, small_s = _fleet_peak(server, n, 0, work)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    return {"records": n, "record_bytes": 16 << 20, "peak_rss_16MiB": big, "peak_rss_small": small,
            "ratio": round(big / small, 2), "seconds_16MiB": round(big_s, 2), "seconds_small": round(small_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256M", help="the uploaded file's size (K, M, G)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--agent-core", default=None, metavar="SIZE",
                    help="instead: agent serve --upload of a real core of SIZE (K, M, G) of heap, its peak RSS")
    ap.add_argument("--records", type=int, default=None, metavar="N",
                    help="instead: fleet --bundles over N records of 16 MiB, its peak RSS")
    args = ap.parse_args()
    if args.records:
        r = bench_records(args.records)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            print(f"fleet --bundles over {r['records']} UPLOAD.json records:")
            mib = 1 << 20
            print(f"  of 16 MiB each    peak RSS {r['peak_rss_16MiB'] / mib:7.1f} MiB  {r['seconds_16MiB']:6.1f} s")
            print(f"  of a few KiB each peak RSS {r['peak_rss_small'] / mib:7.1f} MiB  {r['seconds_small']:6.1f} s")
            print(f"  ratio             {r['ratio']:7.2f}")
        return
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def parse(text: str) -> int:
        return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)

    size = parse(args.size)
    work = Path(tempfile.mkdtemp(prefix="forensics-bench-s3-"))
    srv = S3Server(work / "s3").start()
    if args.agent_core:
        try:
            r = bench_agent_core(srv, work, parse(args.agent_core))
        finally:
            srv.stop()
            shutil.rmtree(work, ignore_errors=True)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            _print_agent_core(r)
        return
    try:
        result = {"upload": bench_upload(srv, work, size, args.repeat),
                  "analyze": bench_analyze(srv, work, args.repeat)}
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    u, a = result["upload"], result["analyze"]
    print(f"upload of {u['size'] >> 20} MiB, 16 MiB parts x 4, SHA-256 checksums (best of {args.repeat}):")
    print(f"  forensics upload     {u['forensics_upload_s']:8.2f} s  {u['forensics_MB_s']:7.1f} MB/s")
    print(f"  boto3 upload_file    {u['boto3_upload_file_s']:8.2f} s  {u['boto3_MB_s']:7.1f} MB/s")
    print(f"  ratio                {u['ratio']:8.2f}")
    print("analyze of a real core handler bundle:")
    print(f"  analyze BUNDLE       {a['analyze_local_s']:8.2f} s")
    print(f"  analyze s3:// cold   {a['analyze_s3_cold_s']:8.2f} s  ({a['cold_ratio']}x)")
    print(f"  analyze s3:// warm   {a['analyze_s3_warm_s']:8.2f} s  ({a['warm_ratio']}x)")


if __name__ == "__main__":
    main()
