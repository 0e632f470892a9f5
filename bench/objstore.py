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

    .venv/bin/python bench/objstore.py [--size 256M] [--repeat 3] [--json]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256M", help="the uploaded file's size (K, M, G)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(float(args.size[:-1]) * units[args.size[-1].upper()]) if args.size[-1].upper() in units else \
        int(args.size)
    work = Path(tempfile.mkdtemp(prefix="forensics-bench-s3-"))
    srv = S3Server(work / "s3").start()
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
