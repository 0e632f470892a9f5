"""Benchmark ``forensics verify-imports`` on a 2 GB, 50,000-file image against unpacking it with tar.

What it measures
----------------
* The image (built in a temporary directory and removed at the end, with everything else
  the run wrote; ``--keep DIR`` builds it there once and reuses it): the tests' CPython 3.11
  base layer, a site-packages layer with
  the real nvitop 1.7.1 / nvitop-exporter / nvidia-ml-py wheels, a WORKDIR layer with a
  stale nvitop 1.5.0 tree (so the run has a finding, as in the incident), and bulk
  layers that bring the image to ``--files`` entries (default 50,000) and ``--gb``
  uncompressed GiB (default 2): many small files and a few large ones, with content
  drawn from a pool of stdlib source, shared-library bytes and random bytes (gzip
  ratio about 2-3, like real images).  Layers are gzip (level 1) in an OCI layout.
* forensics: ``forensics verify-imports oci:LAYOUT:bench --json`` from a wheel of this
  checkout installed in a fresh venv (``--checkout``: this repository's .venv).  Wall time
  from spawn to exit; peak memory is the child's ``ru_maxrss`` from ``wait4``.  Median of
  ``--repeat`` runs; every run must report nvitop SHADOWED (exit 3).
* tar: ``tar -xzf LAYER -C DIR`` for every layer in order, into a fresh directory
  on the same file system (GNU tar runs gzip as a second process), removed
  afterwards.  Same number of repetitions, median.
* Both read the blobs from the page cache (everything is read once before timing).

Prints one table and the ratio forensics/tar; exits 1 when a target
(``--max-seconds`` 10, ``--max-mb`` 200) is missed.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.test_verify_imports_helpers import (Blob, Layer, base_blob,  # noqa: E402
                                                           image_config, site_layer, wheel, write_oci)

def _pool(seed: int) -> bytes:
    """~48 MiB of content: stdlib source text, shared-library bytes, random bytes."""
    rnd = random.Random(seed)
    parts = []
    stdlib = Path(os.__file__).parent
    text = bytearray()
    for p in sorted(stdlib.glob("*.py")):
        text += p.read_bytes()
        if len(text) > 16 << 20:
            break
    parts.append(bytes(text))
    libs = bytearray()
    for p in sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")):
        if p.is_file() and not p.is_symlink():
            libs += p.read_bytes()[: 4 << 20]
        if len(libs) > 16 << 20:
            break
    parts.append(bytes(libs))
    parts.append(rnd.randbytes(16 << 20))
    return b"".join(parts)


def _bulk_layer(path: Path, index: int, files: int, total: int, pool: bytes) -> None:
    """One gzip layer of ``files`` files, ``total`` bytes: 0.5% of the files carry 75% of the bytes."""
    rnd = random.Random(index)
    n_big = max(1, files // 200)
    big_bytes = total * 3 // 4
    small_bytes = total - big_bytes
    sizes = [big_bytes // n_big] * n_big + [max(1, int(rnd.expovariate(1.0) * small_bytes / (files - n_big)))
                                            for _ in range(files - n_big)]
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        made = set()
        for i, size in enumerate(sizes):
            d = f"opt/bulk{index}/pkg{i % 97}/sub{i % 13}"
            if d not in made:
                for k in range(3, len(d.split("/")) + 1):
                    sub = "/".join(d.split("/")[:k])
                    if sub not in made:
                        ti = tarfile.TarInfo(sub)
                        ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1700000000
                        tf.addfile(ti)
                        made.add(sub)
            ti = tarfile.TarInfo(f"{d}/file{i}.{'so' if size > 1 << 20 else 'py'}")
            ti.size, ti.mode, ti.mtime = size, 0o644, 1700000000

            class _Reader:
                """``n`` bytes of the pool from a random offset, wrapping around."""

                def __init__(self, n):
                    self.left = n
                    self.pos = rnd.randrange(0, len(pool) - (1 << 20))

                def read(self, want=-1):
                    want = self.left if want < 0 else min(want, self.left)
                    if want <= 0:
                        return b""
                    out = []
                    while want > 0:
                        if self.pos >= len(pool):
                            self.pos = 0
                        chunk = pool[self.pos:self.pos + want]
                        self.pos += len(chunk)
                        self.left -= len(chunk)
                        want -= len(chunk)
                        out.append(chunk)
                    return b"".join(out)

            tf.addfile(ti, _Reader(size))


def build(files: int, gb: float, workdir: Path) -> tuple[str, list[Path]]:
    key = hashlib.sha256(f"v1:{files}:{gb}".encode()).hexdigest()[:12]
    out = workdir / f"bench-verify-imports-{key}"
    ref = f"oci:{out / 'oci'}:bench"
    done = out / "done.json"
    if done.exists():
        return ref, [Path(p) for p in json.loads(done.read_text())["layers"]]
    shutil.rmtree(out, ignore_errors=True)
    (out / "store").mkdir(parents=True)
    from tests.integration.test_verify_imports_helpers import make_blob

    base = base_blob()
    site = make_blob(site_layer().tar_bytes(), out / "store")
    stale = make_blob(Layer().source_tree(wheel("nvitop", "1.5.0"), "nvitop", "/app").dir("/app").tar_bytes(),
                      out / "store")
    blobs = [base, site, stale]
    n_layers = 4
    pool = _pool(0)
    per_files = (files - 3000) // n_layers  # the base and site layers bring ~3,000 entries
    per_bytes = int(gb * (1 << 30)) // n_layers
    for i in range(n_layers):
        t = time.perf_counter()
        p = out / "store" / f"bulk{i}.tar.gz"
        _bulk_layer(p, i, per_files, per_bytes, pool)
        data_hash = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                data_hash.update(chunk)
        digest = "sha256:" + data_hash.hexdigest()
        final = out / "store" / digest.split(":")[1]
        p.rename(final)
        blobs.append(Blob(final, digest, "sha256:" + "0" * 64, final.stat().st_size,
                          "application/vnd.oci.image.layer.v1.tar+gzip"))
        print(f"  built bulk layer {i}: {per_files} files, {per_bytes >> 20} MiB "
              f"({final.stat().st_size >> 20} MiB gzip) in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    cfg = image_config(blobs, entrypoint=["python3", "-m", "nvitop_exporter"], workdir="/app")
    cfg["rootfs"]["diff_ids"] = []  # not checked for OCI layouts (the blob digests are)
    write_oci(out / "oci", blobs, cfg, tag="bench")
    layers = [b.data_path for b in blobs]
    done.write_text(json.dumps({"layers": [str(p) for p in layers]}))
    return ref, layers


def _timed(cmd: list[str], **kw) -> tuple[float, int, int]:
    """(seconds, exit status, peak RSS in MiB) of a child process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t, p.returncode, usage.ru_maxrss // 1024


def forensics_command(tmp: Path, checkout: bool) -> list[str]:
    """``forensics`` as users run it: from a wheel of this checkout installed in a fresh venv (its
    dependencies from PyPI), or with ``checkout`` this repository's .venv."""
    if checkout:
        py = ROOT / ".venv" / "bin" / "python"
        return [str(py if py.exists() else sys.executable), "-m", "forensics"]
    dist, venv = tmp / "dist", tmp / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], check=True,
                   timeout=900)
    whl = next(dist.glob("forensics-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(whl)], check=True, timeout=900)
    return [str(venv / "bin" / "forensics")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=50_000)
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the temporary image, venv and tar output go (default: $TMPDIR); all removed at the end")
    ap.add_argument("--keep", type=Path, default=None,
                    help="build the image in this directory and keep it there for the next run (it is GBs)")
    ap.add_argument("--checkout", action="store_true", help="measure this checkout's .venv, not an installed wheel")
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument("--max-mb", type=float, default=200.0)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="forensics-bench-verify-imports-", dir=args.workdir))
    try:
        return _run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the image (unless --keep), the venv, tar's output: nothing stays


def _run(args, tmp: Path) -> int:
    ref, layers = build(args.files, args.gb, args.keep or tmp)
    for p in layers:  # into the page cache, for both tools
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass
    cmd = forensics_command(tmp, args.checkout) + ["verify-imports", ref, "--json"]
    # the image as forensics sees it
    probe = subprocess.run(cmd, capture_output=True, text=True)
    if probe.returncode not in (0, 3):
        print(f"forensics exited {probe.returncode}: {probe.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    doc = json.loads(probe.stdout)
    nv = next(m for m in doc["result"]["modules"] if m["module"] == "nvitop")
    f_times, f_mem, t_times = [], [], []
    for _ in range(args.repeat):
        sec, code, mb = _timed(cmd)
        if code != 3:
            print(f"forensics exited {code} (expected 3: nvitop SHADOWED)", file=sys.stderr)
            return 1
        f_times.append(sec)
        f_mem.append(mb)
        dest = Path(tempfile.mkdtemp(prefix="tar-", dir=tmp))
        t = time.perf_counter()
        for p in layers:
            subprocess.run(["tar", "-xzf", str(p), "-C", str(dest)], check=True, stderr=subprocess.DEVNULL)
        t_times.append(time.perf_counter() - t)
        shutil.rmtree(dest, ignore_errors=True)
    entries, size = 0, 0
    for p in layers:
        with tarfile.open(p, "r|gz") as tf:
            for m in tf:
                entries += 1
                size += m.size
    f_med, t_med = statistics.median(f_times), statistics.median(t_times)
    print(f"image: {len(layers)} layers, {entries} entries, {size / (1 << 30):.2f} GiB uncompressed, "
          f"{sum(p.stat().st_size for p in layers) / (1 << 30):.2f} GiB gzip; nvitop {nv['verdict']} "
          f"({nv['effective_version']} instead of {nv['expected_version']})")
    print(f"{'tool':<28}{'median s':>10}{'runs':>30}{'peak MiB':>10}")
    print(f"{'forensics verify-imports':<28}{f_med:>10.2f}{' '.join(f'{x:.2f}' for x in f_times):>30}{max(f_mem):>10}")
    print(f"{'tar -xzf (each layer)':<28}{t_med:>10.2f}{' '.join(f'{x:.2f}' for x in t_times):>30}{'-':>10}")
    print(f"ratio forensics/tar: {f_med / t_med:.2f}")
    ok = f_med < args.max_seconds and max(f_mem) < args.max_mb
    print(f"targets: < {args.max_seconds:g} s and < {args.max_mb:g} MiB: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
