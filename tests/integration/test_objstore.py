"""Bundles shipped to a real S3 server on 127.0.0.1 (SeaweedFS) and read back from it.

Bundles come from real crashes: a small C program crashed by the kernel, its core fed to the installed
``forensics core-handler`` as the kernel feeds it, while a live process stands for /proc.  The S3 server
is SeaweedFS's ``weed server -s3`` (tests/s3_env.py); every check of what the bucket holds goes through the
test's own boto3 client, not through forensics.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.podruntime import searchable_view
from tests.s3_env import ACCESS_KEY, SECRET_KEY, S3Server

FORENSICS = Path(sys.executable).parent / "forensics"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the core handler reads /proc/PID of other processes as root")

CRASHER_C = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (!strcmp(argv[1], "sleep")) { for (;;) pause(); }
    if (!strcmp(argv[1], "random-abort")) {  /* 16 MiB of random heap: a core that does not compress */
        size_t n = 16u << 20; unsigned char *b = malloc(n); int r = open("/dev/urandom", O_RDONLY);
        size_t got = 0; while (got < n) { ssize_t k = read(r, b + got, n - got); if (k <= 0) break; got += k; }
        fprintf(stderr, "%d\n", b[n / 2]);
    }
    abort();
}
"""


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def crasher(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("s3-crasher")
    (d / "crasher.c").write_text(CRASHER_C)
    subprocess.run(["gcc", "-g", "-O1", "-o", str(d / "crasher"), str(d / "crasher.c")], check=True)
    return d / "crasher"


@pytest.fixture(scope="module")
def kernel_cores(crasher, tmp_path_factory, core_pattern) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("s3-cores")
    out = {}
    for mode in ("abort", "random-abort"):
        run = Path(tempfile.mkdtemp(prefix=f"core-{mode}-", dir=d))
        p = subprocess.run([str(crasher), mode], cwd=run, capture_output=True, timeout=60, preexec_fn=lambda: (
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))))
        assert p.returncode < 0, p
        (out[mode],) = list(run.iterdir())
    return out


@pytest.fixture
def live(crasher):
    p = subprocess.Popen([str(crasher), "sleep"])
    try:
        time.sleep(0.05)
        yield p
    finally:
        p.kill()
        p.wait()


def make_bundle(core_dir: Path, core: Path, pid: int, *, only: bool = True) -> Path | None:
    """The core handler's bundle of a real kernel core, made as the kernel runs the handler (``only``: the one
    bundle of ``core_dir``, returned)."""
    cmd = [str(FORENSICS), "core-handler", str(core_dir), str(pid), str(pid), str(signal.SIGABRT),
           str(int(time.time())), "18446744073709551615"]
    with open(core, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, text=True, env={}, cwd="/", timeout=120)
    assert p.returncode == 0, p.stderr
    if not only:
        return None
    (crash,) = sorted((core_dir / "crashes").iterdir())
    return crash


def forensics(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(FORENSICS), *args], capture_output=True, text=True, env=env, timeout=timeout)


def bucket_keys(s3: S3Server, bucket: str, prefix: str = "") -> dict[str, int]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def test_the_client_takes_the_sdk_environment_and_names_a_refusal(s3, monkeypatch):
    # GIVEN the server's endpoint and credentials in the AWS SDKs' environment only
    from forensics.errors import ObjectNotFound, ObjectStoreDenied
    from forensics.objstore.client import StoreOptions, open_client, translate_error

    for name, value in s3.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    bucket = s3.make_bucket("client-env")
    # WHEN forensics' client writes through it
    client = open_client(StoreOptions())
    client.put_object(Bucket=bucket, Key="k", Body=b"evidence")
    # THEN the test's own client reads it back
    assert s3.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"evidence"
    # AND a refused secret and a missing bucket become our errors, one line, no secret in them
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as refused:
        open_client(StoreOptions(attempts=1)).put_object(Bucket=bucket, Key="k2", Body=b"x")
    err = translate_error(refused.value, f"s3://{bucket}/k2", StoreOptions())
    assert isinstance(err, ObjectStoreDenied) and "refused the credentials" in str(err)
    assert "\n" not in str(err) and "wrong-secret" not in str(err) and SECRET_KEY not in str(err)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        open_client(StoreOptions()).head_object(Bucket="no-such-bucket-here", Key="k")
    assert isinstance(translate_error(missing.value, "s3://no-such-bucket-here/k", StoreOptions()), ObjectNotFound)


def test_upload_wipe_and_analyze_from_the_bucket_alone(s3, kernel_cores, live, tmp_path):
    # GIVEN a real crash's bundle and its analysis made on the node
    env = s3.env(FORENSICS_CACHE=str(tmp_path / "cache"), HOME=str(tmp_path))
    bucket = s3.make_bucket("crashes-equal")
    crash = make_bundle(tmp_path / "cores", kernel_cores["abort"], live.pid)
    local = forensics("analyze", "--json", str(crash), env=env)
    assert local.returncode == 0, local.stderr
    local_reports = {t: forensics("report", "--template", t, str(crash), env=env) for t in ("nvml", "runbook")}
    assert all(r.returncode == 0 for r in local_reports.values()), local_reports
    import hashlib

    files = {str(f.relative_to(crash)): hashlib.sha256(f.read_bytes()).hexdigest()
             for f in crash.rglob("*") if f.is_file()}
    # WHEN it is uploaded (the node's copy deleted after the verified upload)
    up = forensics("upload", "--json", "--cluster", "prod", "--node", "gpu-7", str(crash), f"s3://{bucket}/fleet",
                   env=env)
    # THEN every file of the bundle and the objects the core maps are in the bucket, verified
    assert up.returncode == 0, up.stderr
    (result,) = json.loads(up.stdout)["uploads"]
    assert result["deleted"] and not crash.exists()
    prefix = result["url"][len(f"s3://{bucket}/"):]
    assert re.fullmatch(r"fleet/prod/gpu-7/_/_/\d{8}T\d{6}Z-unknown-[^/]+/", prefix), prefix
    keys = bucket_keys(s3, bucket)
    assert f"{prefix}MANIFEST.json" in keys and f"{prefix}50-core/core.zst" in keys and f"{prefix}UPLOAD.json" in keys
    assert any(k.startswith("fleet/objects/") for k in keys)
    assert all(o["verified_by"] == "sha256" for o in result["objects"])
    # (each file's bytes, read back by the test's own client, are the node's; the record lists them all)
    got = {rel: hashlib.sha256(s3.client().get_object(Bucket=bucket, Key=f"{prefix}{rel}")["Body"].read()).hexdigest()
           for rel in files}
    assert got == files
    record = json.loads(s3.client().get_object(Bucket=bucket, Key=f"{prefix}UPLOAD.json")["Body"].read())
    assert {i["path"]: i["sha256"] for i in record["items"]} == files
    assert record["objects"] and all(k.startswith("fleet/objects/") for k in (o["key"] for o in record["objects"]))
    # AND the analysis made from the bucket alone (the node's directory wiped) equals the node's
    shutil.rmtree(tmp_path / "cores")
    shutil.rmtree(tmp_path / "cache")
    remote = forensics("analyze", "--json", result["url"], env=env)
    assert remote.returncode == 0, remote.stderr
    a, b = _without_paths(json.loads(remote.stdout)), _without_paths(json.loads(local.stdout))
    assert _differences(a, b) == []
    assert a == b
    # (read with the bundle's own objects, fetched from the bucket's build-id store)
    snap = json.loads(remote.stdout)["analysis"]["snapshot"]
    libc = next(lib for lib in snap["core"]["libraries"] if lib["path"].endswith("/libc.so.6"))
    assert snap["sysroot"] and libc["status"] == "ok" and libc["file_path"].startswith(snap["sysroot"])
    # AND the core object alone is analyzed the same (libraries from this machine, the crash's own)
    core = forensics("analyze", "--json", f"s3://{bucket}/{prefix}50-core/core.zst", env=env)
    assert core.returncode == 0, core.stderr
    assert json.loads(core.stdout)["analysis"]["fingerprint"] == json.loads(local.stdout)["analysis"]["fingerprint"]
    # AND a prefix of uploaded bundles is a batch
    batch = forensics("analyze", "--json", f"s3://{bucket}/fleet/prod/", env=env)
    assert batch.returncode == 0, batch.stderr
    doc = json.loads(batch.stdout)
    assert doc["batch"]["total"] == 1
    assert [c["fingerprint"] for c in doc["cores"]] == [json.loads(local.stdout)["analysis"]["fingerprint"]]
    # AND so are the reports
    for template, report in local_reports.items():
        r = forensics("report", "--template", template, result["url"], env=env)
        assert r.returncode == 0, r.stderr
        assert _report_lines(r.stdout, tmp_path) == _report_lines(report.stdout, tmp_path), template


def _report_lines(markdown: str, tmp: Path) -> list[str]:
    """The report's lines, the bundle's directory (on the node, or fetched into the cache) named BUNDLE, the minute
    the report was made DATE."""
    where = re.compile(r"/\S*?/(?:cores/crashes/[^/|\s]+|cache/s3/[0-9a-f]{32}/bundle)")
    when = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d UTC\b")
    return [when.sub("DATE", where.sub("BUNDLE", line)) for line in markdown.splitlines()]


def _without_paths(doc):
    """An analysis document with the places it was read from left out (the node's bundle, the cache) and the
    time its core was decompressed into the cache."""
    if isinstance(doc, dict):
        return {k: _without_paths(v) for k, v in doc.items()
                if k not in ("path", "sysroot", "file_path", "source", "mtime")}
    if isinstance(doc, list):
        return [_without_paths(v) for v in doc]
    return doc


def _differences(a, b, where="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r:.200} != {b!r:.200}"]


def test_wrong_credentials_one_line_and_nothing_deleted(s3, kernel_cores, live, tmp_path):
    # GIVEN a real bundle and a secret key the server does not know
    bucket = s3.make_bucket("crashes-denied")
    crash = make_bundle(tmp_path / "cores", kernel_cores["abort"], live.pid)
    before = {p.relative_to(crash): p.read_bytes() for p in crash.rglob("*") if p.is_file()}
    env = s3.env(AWS_SECRET_ACCESS_KEY="not-the-secret-key-0123456789")
    # WHEN it is uploaded
    r = forensics("upload", "--rounds", "2", str(crash), f"s3://{bucket}/x", env=env)
    # THEN one error line names the refusal, the secret is nowhere, and the bundle is whole
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("forensics: error:")]
    assert len(errors) == 1 and "refused the credentials" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and "not-the-secret-key" not in r.stderr + r.stdout
    assert SECRET_KEY not in r.stderr + r.stdout
    assert {p.relative_to(crash): p.read_bytes() for p in crash.rglob("*") if p.is_file()} == before
    assert bucket_keys(s3, bucket) == {}


def test_server_killed_mid_upload_keeps_the_node_copy_then_completes(kernel_cores, live, tmp_path):
    # GIVEN a server of its own and a bundle with an incompressible core, sent at 2 MB/s in 5 MiB parts
    server = S3Server(tmp_path / "s3").start()
    try:
        bucket = server.make_bucket("crashes-cut")
        crash = make_bundle(tmp_path / "cores", kernel_cores["random-abort"], live.pid)
        assert (crash / "50-core" / "core.zst").stat().st_size > 12 << 20
        env = server.env()
        argv = [str(FORENSICS), "upload", "--part-size", "5M", "--concurrency", "1", "--max-bandwidth", "2M",
                "--attempts", "2", "--rounds", "2", str(crash), f"s3://{bucket}/cut"]
        # WHEN the server is killed while the core is on its way
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while not any(k.endswith("MANIFEST.json") or "50-core" in k for k in _uploads_seen(server, bucket)):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.2)
        time.sleep(1.0)
        server.kill()
        out, err = p.communicate(timeout=180)
        # THEN the upload fails in one line and the node's copy is whole
        assert p.returncode == 1, (out, err)
        assert "did not answer" in err and "50-core/core.zst" in err, err
        assert len([x for x in err.splitlines() if x.startswith("forensics: error:")]) == 1, err
        assert crash.is_dir()
        from forensics.bundle import verify_manifest

        assert verify_manifest(str(crash)) == []
        # AND once the server is back, a second run completes it, sending only what is missing
        server.start()
        r = subprocess.run([*argv[:1], "upload", "--json", "--part-size", "5M", str(crash), f"s3://{bucket}/cut"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        (result,) = json.loads(r.stdout)["uploads"]
        assert result["deleted"] and not crash.exists()
        keys = bucket_keys(server, bucket)
        record = json.loads(server.client().get_object(Bucket=bucket, Key=result["record"].split("/", 3)[3])
                            ["Body"].read())
        assert sorted(o["key"] for o in record["items"] + record["objects"]) == sorted(
            k for k in keys if not k.endswith("UPLOAD.json"))
    finally:
        server.stop()


def _uploads_seen(server: S3Server, bucket: str) -> list[str]:
    """Keys present and multipart uploads under way."""
    c = server.client()
    try:
        ups = [u["Key"] for u in c.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    except Exception:  # noqa: BLE001 -- a poll while the server is busy: next time
        ups = []
    return ups + list(bucket_keys(server, bucket))


def _sealed_bundle(directory: Path, files: dict[str, int]) -> Path:
    """A bundle of random files of the given sizes and its MANIFEST.json, computed here (the test's oracle)."""
    import hashlib

    directory.mkdir(parents=True)
    items = []
    for rel, size in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for _ in range(0, size, 1 << 20):
                block = os.urandom(min(1 << 20, size - f.tell()))
                h.update(block)
                f.write(block)
        items.append({"path": rel, "size": size, "sha256": h.hexdigest(), "what": "random"})
    (directory / "MANIFEST.json").write_text(json.dumps({"schema_version": 1, "items": items}))
    return directory


def _peak_rss_of(argv: list[str], env: dict) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``argv`` as the only child of a fresh interpreter: (its result, its peak RSS in bytes)."""
    probe = ("import resource, subprocess, sys, json\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(json.dumps([p.returncode, p.stdout, p.stderr,"
             " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))\n")
    r = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env, timeout=600)
    code, out, err, peak = json.loads(r.stdout)
    return subprocess.CompletedProcess(argv, code, out, err), peak


def test_a_large_file_goes_in_parts_with_memory_bounded(s3, tmp_path):
    # GIVEN a sealed bundle holding a 384 MiB random file, and one holding 1 MiB
    size = 384 << 20
    big = _sealed_bundle(tmp_path / "big", {"50-core/core.zst": size})
    small = _sealed_bundle(tmp_path / "small", {"50-core/core.zst": 1 << 20})
    bucket = s3.make_bucket("crashes-large")
    env = s3.env()
    # WHEN each is uploaded in 16 MiB parts, 4 at a time
    peaks = {}
    for name, bundle in (("small", small), ("big", big)):
        r, peaks[name] = _peak_rss_of([str(FORENSICS), "upload", "--json", "--keep", "--part-size", "16M",
                                       "--concurrency", "4", str(bundle), f"s3://{bucket}/{name}"], env)
        assert r.returncode == 0, r.stderr
        (result,) = json.loads(r.stdout)["uploads"]
    # THEN the large file went in 24 parts, verified by the server's composite SHA-256 of them
    core = next(o for o in result["objects"] if o["path"] == "50-core/core.zst")
    assert core["verified_by"] == "sha256" and core["size"] == size
    head = s3.client().head_object(Bucket=bucket, Key=core["key"], ChecksumMode="ENABLED")
    assert head["ContentLength"] == size and head["ChecksumSHA256"].endswith("-24")
    # AND the uploader's memory grew by less than 4 parts (in flight at once, each sent from the file)
    print(f"peak RSS: small {peaks['small'] >> 20} MiB, big {peaks['big'] >> 20} MiB, file {size >> 20} MiB")
    assert peaks["big"] - peaks["small"] < 4 * (16 << 20), peaks


@pytest.mark.parametrize("case", ["dotdot-path", "changed-object", "absolute-path", "longer-object"])
def test_a_hostile_bucket_record_writes_nothing_outside_the_cache_entry(s3, tmp_path, case):
    # GIVEN a bundle prefix whose UPLOAD.json lies: a path out of the bundle, or an object not its SHA-256 / size
    import hashlib

    c = s3.client()
    bucket = s3.make_bucket("hostile-records")
    body = b"core bytes"
    c.put_object(Bucket=bucket, Key=f"{case}/obj", Body=body + (b"x" * 100 if case == "longer-object" else b""))
    path = {"dotdot-path": "../../escaped", "absolute-path": "/tmp/escaped"}.get(case, "50-core/core.zst")
    digest = hashlib.sha256(b"other bytes" if case == "changed-object" else body).hexdigest()
    record = {"schema_version": 1, "items": [{"path": path, "key": f"{case}/obj", "size": len(body), "sha256": digest}],
              "objects": []}
    c.put_object(Bucket=bucket, Key=f"{case}/b/UPLOAD.json", Body=json.dumps(record).encode())
    env = s3.env(FORENSICS_CACHE=str(tmp_path / "cache"), HOME=str(tmp_path))
    # WHEN it is analyzed
    r = forensics("analyze", f"s3://{bucket}/{case}/b/", env=env)
    # THEN one error line, and nothing was written anywhere but (nor left in) the cache entry
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(f"forensics: error: s3://{bucket}/") and "Traceback" not in r.stderr, r.stderr
    assert not any(p.name == "escaped" for p in tmp_path.rglob("*")) and not Path("/tmp/escaped").exists()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.name != ".lock"]


def test_fetched_entries_are_pruned_oldest_first_past_the_budget(tmp_path, monkeypatch):
    # GIVEN three fetched entries of 1 MiB, used 3 h, 2 h and a minute ago
    from forensics.objstore.fetch import prune_fetched

    monkeypatch.setenv("FORENSICS_CACHE", str(tmp_path))
    now = time.time()
    for name, age in (("old", 3 * 3600), ("older-than-hour", 2 * 3600), ("recent", 60)):
        entry = tmp_path / "s3" / name / "bundle"
        entry.mkdir(parents=True)
        (entry / "core.zst").write_bytes(b"\0" * (1 << 20))
        os.utime(entry.parent, (now - age, now - age))
    # WHEN the budget is 1.5 MiB
    deleted = prune_fetched(budget=3 << 19)
    # THEN the oldest two went (the recent one is kept even past the budget)
    assert sorted(Path(p).name for p in deleted) == ["old", "older-than-hour"]
    assert [p.name for p in (tmp_path / "s3").iterdir()] == ["recent"]


def _serve(core_dir: Path, bucket: str, env: dict, *extra: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [str(FORENSICS), "agent", "serve", "--core-dir", str(core_dir), "--node-name", "gpu-3", "--no-events",
            "--metrics-port", str(port), "--analysis-timeout", "120", "--upload", f"s3://{bucket}/agent",
            "--cluster", "prod", *extra]
    files = [a for a in extra if a.startswith("/") and os.path.isfile(a)]  # a --kubeconfig
    return subprocess.Popen([*_reachable(core_dir, env, *files), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env), f"http://127.0.0.1:{port}/metrics"


def _reachable(core_dir: Path, env: dict, *files: str) -> list[str]:
    """The agent's analyses run in the sandbox as an unprivileged uid: its core directory, scratch and interpreter
    made reachable to that uid in a mount namespace of the agent's own (pytest's directories are private)."""
    core_dir.mkdir(parents=True, exist_ok=True)
    return searchable_view(bind=[str(core_dir), *files],
                           homes=[env[k] for k in ("HOME", "FORENSICS_CACHE") if env.get(k)])


def _stop(p: subprocess.Popen) -> str:
    p.send_signal(signal.SIGTERM)
    try:
        _out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _out, err = p.communicate()
    return err


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def _scrape(url: str) -> dict[str, list]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        return {f.name: f.samples for f in text_string_to_metric_families(r.read().decode())}


def _value(families: dict[str, list], sample: str) -> float:
    """The value of the one sample named ``sample`` (the node's), or -1 when there is none."""
    found = [s.value for samples in families.values() for s in samples if s.name == sample]
    return found[0] if len(found) == 1 else -1.0


def _fleet_of_bundles(tmp_path: Path, env: dict, *sources: str) -> tuple[dict, str]:
    """`forensics fleet --from --nodes --bundles SOURCE...` over gpu-3 (an H20 node) and its one restarting pod: the
    fleet document (--json) and the table (text)."""
    node = {"kind": "Node", "metadata": {"name": "gpu-3", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H20", "nvidia.com/cuda.driver-version.full": "580.126.09"}}}
    pod = {"kind": "Pod", "metadata": {"name": "exporter-0", "namespace": "monitoring", "uid": "u-0"},
           "spec": {"nodeName": "gpu-3"}, "status": {"containerStatuses": [
               {"name": "exporter", "restartCount": 2, "lastState": {"terminated": {"exitCode": 134}}}]}}
    (tmp_path / "fleet-pods.json").write_text(json.dumps({"kind": "List", "items": [pod]}))
    (tmp_path / "fleet-nodes.json").write_text(json.dumps({"kind": "List", "items": [node]}))
    argv = ["fleet", "--from", str(tmp_path / "fleet-pods.json"), "--nodes", str(tmp_path / "fleet-nodes.json"),
            *(x for src in sources for x in ("--bundles", src))]
    r, t = forensics(*argv, "--json", env=env), forensics(*argv, env=env)
    assert r.returncode == 0 and t.returncode == 0, r.stderr + t.stderr
    return json.loads(r.stdout)["fleet"], t.stdout


def test_agent_serve_uploads_each_analyzed_crash_and_keeps_its_record(s3, kernel_cores, live, tmp_path):
    # GIVEN two real crashes taken by the handler, and an agent whose bucket refuses its credentials
    core_dir = tmp_path / "cores"
    for _ in range(2):
        make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    crashes = sorted((core_dir / "crashes").iterdir())
    bucket = s3.make_bucket("agent-uploads")
    env = s3.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache"))
    agent, url = _serve(core_dir, bucket, {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-0123456789"})
    try:
        # WHEN it has analyzed them and tried to upload
        _wait(lambda: all((c / "60-analysis" / "analysis.json").is_file() for c in crashes), 300, "no analyses")
        _wait(lambda: _value(_scrape(url), "forensics_upload_failures_total") >= 2, 60, "no failed attempts")
        failing = _scrape(url)
    finally:
        err = _stop(agent)
    # THEN the metrics say two uploads wait, the oldest since the first crash, and the attempts failed
    assert _value(failing, "forensics_uploads_pending") == 2 and _value(failing, "forensics_uploads_total") == 0
    assert _value(failing, "forensics_upload_oldest_pending_seconds") > 0
    # THEN each failed upload is one line, the bundles are whole, nothing is in the bucket
    assert "refused the credentials" in err and "the bundle stays whole" in err and "wrong-secret" not in err, err
    assert all((c / "MANIFEST.json").is_file() and not (c / "70-upload.json").exists() for c in crashes)
    assert bucket_keys(s3, bucket) == {}
    # AND fleet --bundles over the core directory counts both crashes in gpu-3's group and names the newer bundle
    # where it is: on this disk
    fleet, text = _fleet_of_bundles(tmp_path, env, str(core_dir))
    (fp,) = {json.loads((c / "60-analysis" / "analysis.json").read_text())["analysis"]["fingerprint"] for c in crashes}
    on_disk = max((json.loads((c / "metadata.json").read_text())["time"], str(c)) for c in crashes)[1]
    assert [g["fingerprints"] for g in fleet["groups"]] == [{fp: 2}]
    assert fleet["latest_bundles"] == {fp: on_disk} and fleet["bundles"] == [str(core_dir)]
    assert f"| {fp} x 2 |" in text and f"Newest bundle of {fp}: {on_disk}" in text, text
    # WHEN the agent starts again with the right credentials (the pending uploads found on disk)
    agent, url = _serve(core_dir, bucket, env)
    try:
        _wait(lambda: all((c / "70-upload.json").is_file() for c in crashes), 300, "not uploaded")
        _wait(lambda: all(sorted(p.name for p in c.iterdir()) == ["60-analysis", "70-upload.json", "metadata.json"]
                          for c in crashes), 30, "not trimmed")
        _wait(lambda: _value(_scrape(url), "forensics_uploads_total") == 2, 30, "uploads not counted")
        families = _scrape(url)
    finally:
        _stop(agent)
    # THEN the metrics count both uploads, their bytes as the node recorded them, none waiting
    recorded = sum(json.loads((c / "70-upload.json").read_text())["bytes"] for c in crashes)
    assert _value(families, "forensics_uploaded_bytes_total") == recorded > 0
    assert _value(families, "forensics_uploads_pending") == 0
    # THEN the node keeps each crash's record, analysis and where its bundle went; the index still counts both
    counted = {s.labels["fingerprint"]: s.value for s in families["forensics_crashes"]
               if s.name == "forensics_crashes_total"}
    assert counted == {fp: 2.0}, counted
    # AND where the newest bundle of the fingerprint lives: its URL in the bucket, valued with when it crashed
    newest = max(crashes, key=lambda c: (json.loads((c / "metadata.json").read_text())["time"], c.name))
    latest = [(s.labels, s.value) for s in families["forensics_latest_bundle_timestamp_seconds"]]
    assert latest == [({"forensics_node": "gpu-3", "fingerprint": fp,
                        "bundle": json.loads((newest / "70-upload.json").read_text())["url"]},
                       float(json.loads((newest / "metadata.json").read_text())["time"]))], latest
    # AND each bundle in the bucket is keyed by its fingerprint, holds its core and the agent's analysis, and
    # analyzes from the bucket to the same fingerprint
    for c in crashes:
        where = json.loads((c / "70-upload.json").read_text())
        prefix = where["url"][len(f"s3://{bucket}/"):]
        assert re.fullmatch(rf"agent/prod/gpu-3/_/_/\d{{8}}T\d{{6}}Z-{fp}-[^/]+/", prefix), prefix
        keys = bucket_keys(s3, bucket, prefix)
        assert {f"{prefix}50-core/core.zst", f"{prefix}60-analysis/analysis.json", f"{prefix}UPLOAD.json"} <= set(keys)
        r = forensics("analyze", "--json", where["url"], env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["analysis"]["fingerprint"] == fp
    # AND fleet --bundles names the newer bundle in the bucket: from the node's records of the uploads, and from the
    # bucket's upload records alone
    # (of crashes in the same second, the greater location: fleet's rule, whatever order the bundles are read in)
    uploaded = max((json.loads((c / "metadata.json").read_text())["time"],
                    json.loads((c / "70-upload.json").read_text())["url"]) for c in crashes)[1]
    for source in (str(core_dir), f"s3://{bucket}/agent"):
        fleet, text = _fleet_of_bundles(tmp_path, env, source)
        assert [g["fingerprints"] for g in fleet["groups"]] == [{fp: 2}], source
        assert fleet["latest_bundles"] == {fp: uploaded}, source
        assert f"Newest bundle of {fp}: {uploaded}" in text


def test_endpoint_and_profile_from_flags(s3, kernel_cores, live, tmp_path):
    # GIVEN credentials only in a profile of a credentials file, and no endpoint in the environment
    creds = tmp_path / "credentials"
    creds.write_text(f"[bucket-writer]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    env = {k: v for k, v in s3.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache")).items()
           if k not in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    flags = ["--endpoint-url", s3.endpoint, "--profile", "bucket-writer", "--region", "us-east-1"]
    bucket = s3.make_bucket("flags")
    crash = make_bundle(tmp_path / "cores", kernel_cores["abort"], live.pid)
    # WHEN upload, analyze and report are told where and who by their flags
    up = forensics("upload", "--json", "--keep", *flags, str(crash), f"s3://{bucket}/f", env=env)
    assert up.returncode == 0, up.stderr
    url = json.loads(up.stdout)["uploads"][0]["url"]
    a = forensics("analyze", "--json", *flags, url, env=env)
    r = forensics("report", "--template", "nvml", *flags, url, env=env)
    # THEN they reach the bucket; without the endpoint flag they do not (AWS itself is never asked: a closed
    # port on 127.0.0.1 stands for a wrong endpoint), in one line
    assert a.returncode == 0 and r.returncode == 0, (a.stderr, r.stderr)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    bad = forensics("analyze", "--endpoint-url", closed, "--profile", "bucket-writer", url, env=env)
    assert bad.returncode == 1 and "did not answer" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    missing = forensics("analyze", *flags[:2], "--profile", "nobody", url, env=env)
    assert missing.returncode == 1 and "no such AWS profile" in missing.stderr, missing.stderr


def test_a_core_the_budget_deleted_uploads_what_is_left_and_says_so(s3, kernel_cores, live, tmp_path):
    # GIVEN two real crashes of one program, and the core directory's real budget enforced down to one core
    from forensics.capture.budget import enforce_budget

    core_dir = tmp_path / "cores"
    for _ in range(2):
        make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    older, newer = sorted((core_dir / "crashes").iterdir())
    assert enforce_budget(str(core_dir), 1, object_grace=1e9) == [older.name]
    assert not (older / "50-core" / "core.zst").exists()
    bucket = s3.make_bucket("budget-left")
    env = s3.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache"))
    # WHEN the older bundle (core deleted, record rewritten to say so) is uploaded
    r = forensics("upload", "--json", str(older), f"s3://{bucket}/b", env=env)
    # THEN what is left goes, and the upload's record names what is not as sealed and why
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)["uploads"]
    prefix = result["url"][len(f"s3://{bucket}/"):]
    record = json.loads(s3.client().get_object(Bucket=bucket, Key=f"{prefix}UPLOAD.json")["Body"].read())
    assert record["not_as_sealed"] == [
        {"path": "50-core/core.zst", "why": "deleted for the core directory's budget"},
        {"path": "metadata.json", "why": "rewritten: the core deleted for the budget"}]
    assert f"{prefix}metadata.json" in bucket_keys(s3, bucket) and f"{prefix}50-core/core.zst" not in bucket_keys(
        s3, bucket)
    # AND analyzed from the bucket, it says what the node's copy said: no core kept
    a = forensics("analyze", result["url"], env=env)
    assert a.returncode == 1 and "no core kept" in a.stderr, a.stderr
    # AND a core deleted by hand (the record saying nothing of it) is refused, the bundle kept
    (newer / "50-core" / "core.zst").unlink()
    r = forensics("upload", str(newer), f"s3://{bucket}/c", env=env)
    assert r.returncode == 1 and "lists 1 file(s) it no longer has" in r.stderr, r.stderr
    assert newer.is_dir() and bucket_keys(s3, bucket, "c/") == {}


@pytest.mark.parametrize("parts", [0, 3], ids=["whole", "3-parts"])
def test_verification_falls_back_to_the_etag_where_the_server_has_no_sha256(s3, tmp_path, parts):
    # GIVEN objects another client wrote without a SHA-256 checksum (botocore's default CRC32), whole or in parts
    from boto3.s3.transfer import TransferConfig

    from forensics.errors import UploadNotVerified
    from forensics.objstore.client import ObjectURL, StoreOptions
    from forensics.objstore.transfer import Transfer, digest_file, part_layout

    opts = StoreOptions(part_size=5 << 20)
    size = 3 * (5 << 20) - 1000 if parts else 1 << 20
    path = tmp_path / "file"
    path.write_bytes(os.urandom(size))
    bucket = s3.make_bucket("etag-fallback")
    c = s3.client()
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    c.upload_file(str(path), bucket, "same", Config=config)
    other = tmp_path / "other"
    other.write_bytes(os.urandom(size))
    c.upload_file(str(other), bucket, "other", Config=config)
    assert "ChecksumSHA256" not in c.head_object(Bucket=bucket, Key="same", ChecksumMode="ENABLED")
    fd = os.open(path, os.O_RDONLY)
    try:
        digests = digest_file(fd, part_layout(size, opts))
        with Transfer(s3.client(), opts) as t:
            # WHEN forensics verifies the file against them
            how = t.verify(ObjectURL(bucket=bucket, key="same"), digests, fd=fd, must_exist=True)
            # THEN the ETag (MD5, or the MD5 of the parts' MD5s) says the same object is the file, another is not
            assert how == "etag"
            with pytest.raises(UploadNotVerified, match="its ETag is"):
                t.verify(ObjectURL(bucket=bucket, key="other"), digests, fd=fd, must_exist=True)
            # AND read back, the SHA-256 of the bytes says the same
            assert t.read_back(ObjectURL(bucket=bucket, key="same")) == digests.sha256
    finally:
        os.close(fd)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_event_names_the_uploaded_bundle_and_its_key_the_pod(crasher, kernel_cores, tmp_path):
    # GIVEN a crash of a process in a pod's cgroup, the pod in the API stand-in, and agent serve --upload to an S3
    # server not started yet
    import uuid

    from tests.cgroups import CGROUP_ROOT, pod_cgroup, remove_cgroup
    from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

    if not CGROUP_ROOT.is_dir():
        pytest.skip("no cgroup hierarchy to place the container's process")
    node, ns = socket.gethostname(), "monitoring"
    pod_uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    proc = subprocess.Popen([str(crasher), "sleep"])
    cg = pod_cgroup(pod_uid, cid)
    bucket = "event-url"
    s3 = S3Server(tmp_path / "s3")
    env = s3.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache"))
    try:
        cg.mkdir(parents=True)
        (cg / "cgroup.procs").write_text(str(proc.pid))
        with StandIn(path_env=os.environ["PATH"]) as api:
            api.nodes[node] = make_node(node)
            api.pods[(ns, "exporter-a1")] = make_pod(name="exporter-a1", namespace=ns, uid=pod_uid, node=node,
                                                     container_id=cid, restarts=1, last_exit=134)
            kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
            make_bundle(tmp_path / "cores", kernel_cores["abort"], proc.pid, only=False)
            (crash,) = (tmp_path / "cores" / "crashes").iterdir()
            argv = [str(FORENSICS), "agent", "serve", "--core-dir", str(tmp_path / "cores"), "--node-name", node,
                    "--metrics-port", "0", "--kubeconfig", kubeconfig, "--upload", f"s3://{bucket}/ev",
                    "--cluster", "prod"]
            agent = subprocess.Popen([*_reachable(tmp_path / "cores", env, kubeconfig), *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                # WHEN the agent has analyzed, named the pod, uploaded and told the API
                def notes() -> list[str]:
                    r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "events.v1.events.k8s.io",
                                        "-n", ns, "-o", "json"], capture_output=True, text=True, env=env)
                    return [e["note"] for e in json.loads(r.stdout or "{}").get("items", [])
                            if e["reason"] == "NativeCrash"]

                # (first the Event names the bundle on the node: the upload fails, no server answers)
                _wait(lambda: any(" on node " in n for n in notes()), 300, "no Event")
                s3.start()
                s3.make_bucket(bucket)
                # THEN, once the upload is tried again (30 s) and verified, an Event names the object in the bucket
                # (an events.k8s.io/v1 Event's note cannot change: the one naming the node's path stays)
                _wait(lambda: any("s3://" in n for n in notes()), 120, "no Event names the bucket")
                (message,) = [n for n in notes() if "s3://" in n]
                assert len(notes()) == 2
            finally:
                _stop(agent)
    finally:
        s3.stop()
        remove_cgroup(cg)
        proc.kill()
        proc.wait()
    # AND the bundle's key names the namespace and the pod
    where = json.loads((crash / "70-upload.json").read_text())["url"]
    assert re.fullmatch(rf"s3://{bucket}/ev/prod/{re.escape(node)}/{ns}/exporter-a1/\d{{8}}T\d{{6}}Z-[0-9a-f]{{12}}-.+/",
                        where), where
    assert f"bundle {where} (from node {node})" in message, message


def _scrape_when_up(url: str) -> dict[str, list]:
    """:func:`_scrape`, or nothing while the agent's metrics server is not listening yet."""
    import urllib.error

    try:
        return _scrape(url)
    except urllib.error.URLError:
        return {}


@pytest.mark.slow
def test_a_hundred_crashes_with_the_bucket_down_then_up(kernel_cores, live, tmp_path):
    """#29: 100 crashes while the bucket is unreachable: the queue holds at most --upload-max-pending, the oldest
    past it given up and recorded; once the bucket is back, the rest uploaded once each; nothing lost."""
    # GIVEN 100 real crashes of one crash-looping process taken by the handler (its first core kept, the others'
    # records only: the loop limit), and a bucket whose server is down
    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    (core_dir / "handler.json").write_text(json.dumps({"config": {"loop_limit": 1, "min_free": 0}}))
    for _ in range(100):
        make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    crashes = sorted((core_dir / "crashes").iterdir(), key=lambda c: (json.loads(
        (c / "metadata.json").read_text())["time"], c.name))
    assert len(crashes) == 100
    server = S3Server(tmp_path / "s3").start()
    try:
        bucket = server.make_bucket("storm")
        server.stop()
        env = server.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache"))
        # WHEN the agent runs with a queue of at most 40 while the bucket is down
        agent, url = _serve(core_dir, bucket, env, "--upload-max-pending", "40")
        try:
            _wait(lambda: _value(_scrape_when_up(url), "forensics_upload_failures_total") >= 3, 300,
                  "no failed attempts")
            down = _scrape(url)
            # THEN the queue holds 40, the 60 oldest given up, counted, each in its own record and on stderr
            assert _value(down, "forensics_uploads_pending") == 40
            dropped = {s.labels["reason"]: s.value for s in down["forensics_uploads_dropped"]
                       if s.name == "forensics_uploads_dropped_total"}
            assert dropped == {"queue-count": 60.0, "queue-bytes": 0.0, "conflict": 0.0, "attempts": 0.0}, dropped
            assert _value(down, "forensics_uploads_pending_bytes") > 0
            for c in crashes[:60]:
                rec = json.loads((c / "70-upload.json").read_text())
                assert rec["dropped"] == "queue-count" and rec["bound"] == 40 and "url" not in rec, rec
                assert {p.name for p in c.iterdir()} <= {"60-analysis", "70-upload.json", "metadata.json"}
            assert not any((c / "70-upload.json").exists() for c in crashes[60:])
            # WHEN the bucket is back
            server.start()
            _wait(lambda: all((c / "70-upload.json").is_file() for c in crashes), 300, "not all uploaded")
            _wait(lambda: _value(_scrape(url), "forensics_uploads_total") == 40, 60, "uploads not counted")
            up = _scrape(url)
        finally:
            err = _stop(agent)
        # THEN every crash is uploaded or recorded as given up; none twice; the queue is empty
        assert _value(up, "forensics_uploads_pending") == 0
        assert err.count("given up (queue-count: ") == 60, err
        urls = [json.loads((c / "70-upload.json").read_text()).get("url") for c in crashes[60:]]
        assert all(urls) and len(set(urls)) == 40
        records = [k for k in bucket_keys(server, bucket) if k.endswith("/UPLOAD.json")]
        assert sorted(f"s3://{bucket}/{k[:-len('UPLOAD.json')]}" for k in records) == sorted(urls)
    finally:
        server.stop()


def test_the_pending_bytes_bound_gives_up_the_oldest_and_says_so(kernel_cores, live, tmp_path, monkeypatch, capsys):
    """#29: past --upload-max-pending-bytes the oldest crashes waiting are given up (recorded, counted, on stderr,
    trimmed) until the queue's bytes fit; the ones left are still tried."""
    from forensics.agent.nodeindex import IndexReader
    from forensics.agent.shipper import Shipper, UploadConfig
    from forensics.capture.store import disk_usage
    from forensics.objstore.client import StoreOptions, parse_object_url

    # GIVEN 5 real crashes recorded by the handler (metadata only: loop limit 0), and a bucket nobody answers for
    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    (core_dir / "handler.json").write_text(json.dumps({"config": {"loop_limit": 0, "min_free": 0}}))
    for _ in range(5):
        make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    reader = IndexReader(str(core_dir))
    reader.refresh()
    crashes = sorted(reader.index.crashes, key=lambda c: (c.time, c.path))
    assert len(crashes) == 5 and all(c.analysis == "none" for c in crashes)
    sizes = [disk_usage(c.path) for c in crashes]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections refused
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    bound = sum(sizes[2:])  # the three newest fit, not four
    shipper = Shipper(UploadConfig(
        dest=parse_object_url("s3://down/agent"), cluster="prod", max_pending_bytes=bound,
        opts=StoreOptions(endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", attempts=1, rounds=1,
                          connect_timeout=2)), "gpu-3")
    # WHEN the agent's round runs
    assert shipper.ship_next(reader.index) is False
    # THEN the two oldest are given up, recorded and trimmed; the three newest wait, whole, within the bound
    err = capsys.readouterr().err
    for c in crashes[:2]:
        rec = json.loads(Path(c.path, "70-upload.json").read_text())
        assert rec["dropped"] == "queue-bytes" and rec["bound"] == bound and "url" not in rec, rec
        assert {p.name for p in Path(c.path).iterdir()} <= {"60-analysis", "70-upload.json", "metadata.json"}
        assert f"upload of {c.id} given up (queue-bytes: " in err, err
    for c in crashes[2:]:
        assert not Path(c.path, "70-upload.json").exists() and Path(c.path, "MANIFEST.json").is_file()
    st = shipper.stats
    assert dict(st.dropped) == {"queue-count": 0, "queue-bytes": 2, "conflict": 0, "attempts": 0}
    assert st.pending == 3 and st.pending_bytes == bound and st.failures == 1
    # AND a new agent (restarted) counts the two given up from their records and tries nothing of theirs again
    again = Shipper(shipper.cfg, "gpu-3")
    again.ship_next(reader.index)
    assert dict(again.stats.dropped) == {"queue-count": 0, "queue-bytes": 2, "conflict": 0, "attempts": 0}
    assert again.stats.pending == 3


def test_fleet_bundles_of_a_prefix_without_bundles_is_one_line(s3, tmp_path):
    # GIVEN a bucket holding an object that is no bundle's record
    bucket = s3.make_bucket("fleet-no-bundles")
    s3.client().put_object(Bucket=bucket, Key="fleet/notes.txt", Body=b"not a bundle")
    pods = {"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                                       "spec": {"nodeName": "gpu-3"}, "status": {}}]}
    nodes = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "gpu-3", "labels": {}}}]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    # WHEN fleet is asked to read the bundles under its prefix
    r = forensics("fleet", "--from", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json"),
                  "--bundles", f"s3://{bucket}/fleet", env=s3.env(HOME=str(tmp_path)))
    # THEN one error line says there is none (exit 1)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"s3://{bucket}/fleet" in r.stderr and "no bundle (UPLOAD.json) at or under it" in r.stderr, r.stderr


def test_the_same_crash_uploaded_twice_ends_uploaded_or_dropped_never_pending(s3, kernel_cores, live, tmp_path):
    """#39 item 4: a crash uploaded again under the same prefix -- its analysis made again (an upgraded agent), or
    other bytes in the bucket where its core goes -- ends uploaded or given up, recorded, counted and told."""
    from tests.kube_standin import StandIn, make_node, write_kubeconfig

    # GIVEN two real crashes, each uploaded by an agent that keeps the bundles
    core_dir = tmp_path / "cores"
    for _ in range(2):
        make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    again, clash = sorted((core_dir / "crashes").iterdir())
    bucket = s3.make_bucket("twice")
    env = s3.env(HOME=str(tmp_path), FORENSICS_CACHE=str(tmp_path / "cache"))
    agent, _url = _serve(core_dir, bucket, env, "--upload-keep")
    try:
        _wait(lambda: all((c / "70-upload.json").is_file() for c in (again, clash)), 300, "not uploaded")
    finally:
        _stop(agent)
    first = {c: json.loads((c / "70-upload.json").read_text()) for c in (again, clash)}
    prefix = {c: first[c]["url"][len(f"s3://{bucket}/"):] for c in (again, clash)}
    core_key = f"{prefix[clash]}50-core/core.zst"
    old_core = s3.client().get_object(Bucket=bucket, Key=f"{prefix[again]}50-core/core.zst")["Body"].read()
    # WHEN one crash's analysis is removed (an upgraded agent analyzes it again: other bytes, the same fingerprint),
    # the other's core object in the bucket is another crash's bytes, and both are to be uploaded again
    shutil.rmtree(again / "60-analysis")
    for c in (again, clash):
        (c / "70-upload.json").unlink()
    s3.client().put_object(Bucket=bucket, Key=core_key, Body=b"another crash's core at this key")
    with StandIn(path_env=os.environ["PATH"]) as api:
        api.nodes["gpu-3"] = make_node("gpu-3")
        kubeconfig = write_kubeconfig(str(tmp_path / "kc"), api.url, context="standin")
        agent, url = _serve(core_dir, bucket, env, "--events", "--kubeconfig", kubeconfig)
        try:
            _wait(lambda: all((c / "70-upload.json").is_file() for c in (again, clash)), 300, "still pending")
            _wait(lambda: _value(_scrape(url), "forensics_uploads_pending") == 0, 30, "pending in the metrics")
            families = _scrape(url)

            def dropped_events() -> list[dict]:
                r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "events.v1.events.k8s.io", "-n",
                                    "default", "-o", "json"], capture_output=True, text=True, env=env)
                return [e for e in json.loads(r.stdout or "{}").get("items", []) if e["reason"] == "UploadDropped"]

            _wait(lambda: len(dropped_events()) == 1, 60, "no UploadDropped Event")
            (event,) = dropped_events()
        finally:
            err = _stop(agent)
    # THEN the crash analyzed again is uploaded: its analysis overwritten in the bucket (said so), its core the same
    rec = json.loads((again / "70-upload.json").read_text())
    assert rec["url"] == first[again]["url"] and "60-analysis/analysis.json" in rec["replaced"], rec
    assert sorted(p.name for p in again.iterdir()) == ["60-analysis", "70-upload.json", "metadata.json"]
    in_bucket = s3.client().get_object(Bucket=bucket, Key=f"{prefix[again]}60-analysis/analysis.json")["Body"].read()
    assert in_bucket == (again / "60-analysis" / "analysis.json").read_bytes()
    assert s3.client().get_object(Bucket=bucket, Key=f"{prefix[again]}50-core/core.zst")["Body"].read() == old_core
    record = json.loads(s3.client().get_object(Bucket=bucket, Key=f"{prefix[again]}UPLOAD.json")["Body"].read())
    assert [i["path"] for i in record["items"] if i.get("replaced")] == rec["replaced"]
    # AND the crash whose core's key holds other bytes is given up at once: recorded, kept whole, counted, told
    rec = json.loads((clash / "70-upload.json").read_text())
    assert rec["dropped"] == "conflict" and rec["key"] == f"s3://{bucket}/{core_key}" and rec["kept"] is True, rec
    assert rec["attempts"] == 1 and "url" not in rec
    assert (clash / "MANIFEST.json").is_file() and (clash / "50-core" / "core.zst").is_file()
    assert err.count("given up (conflict: ") == 1 and "Traceback" not in err, err
    dropped = {s.labels["reason"]: s.value for s in families["forensics_uploads_dropped"]
               if s.name == "forensics_uploads_dropped_total"}
    assert dropped == {"queue-count": 0.0, "queue-bytes": 0.0, "conflict": 1.0, "attempts": 0.0}, dropped
    assert _value(families, "forensics_uploads_total") == 1
    assert event["regarding"]["kind"] == "Node" and event["regarding"]["name"] == "gpu-3", event
    assert event["note"].startswith(f"upload of crash {clash.name} given up (conflict: ")
    assert str(clash) in event["note"], event
    assert s3.client().get_object(Bucket=bucket, Key=core_key)["Body"].read() == b"another crash's core at this key"


def test_an_upload_failing_is_given_up_after_its_attempts_whole(kernel_cores, live, tmp_path, monkeypatch, capsys):
    """#39 item 4: an upload that keeps failing is given up after --upload-max-attempts, counted across restarts
    of the agent; the bundle is kept whole on the node."""
    from forensics.agent.nodeindex import IndexReader
    from forensics.agent.shipper import Shipper, UploadConfig
    from forensics.objstore.client import StoreOptions, parse_object_url

    # GIVEN a real crash recorded by the handler (metadata only: nothing to analyze), and a bucket nobody answers for
    core_dir = tmp_path / "cores"
    core_dir.mkdir()
    (core_dir / "handler.json").write_text(json.dumps({"config": {"loop_limit": 0, "min_free": 0}}))
    make_bundle(core_dir, kernel_cores["abort"], live.pid, only=False)
    reader = IndexReader(str(core_dir))
    reader.refresh()
    (crash,) = reader.index.crashes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections refused
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    cfg = UploadConfig(dest=parse_object_url("s3://down/agent"), cluster="prod", max_attempts=3, opts=StoreOptions(
        endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", attempts=1, rounds=1, connect_timeout=2))
    now = [0.0]
    # WHEN an agent tries twice (its clock past the backoff between), then a restarted agent once more
    first = Shipper(cfg, "gpu-3", clock=lambda: now[0])
    for _ in range(2):
        assert first.ship_next(reader.index) is False
        now[0] += 3600
    counted = json.loads((core_dir / "upload-attempts.json").read_text())
    assert counted[crash.id]["attempts"] == 2 and "did not answer" in counted[crash.id]["last_error"], counted
    assert first.stats.pending == 1 and not Path(crash.path, "70-upload.json").exists()
    restarted = Shipper(cfg, "gpu-3", clock=lambda: now[0])
    assert restarted.ship_next(reader.index) is False
    # THEN the third failed attempt gives it up: recorded with the last error, the bundle whole, counted, said
    rec = json.loads(Path(crash.path, "70-upload.json").read_text())
    assert rec["dropped"] == "attempts" and rec["attempts"] == 3 and rec["kept"] is True, rec
    assert "did not answer" in rec["why"] and "url" not in rec
    assert Path(crash.path, "MANIFEST.json").is_file()
    assert json.loads((core_dir / "upload-attempts.json").read_text()) == {}
    assert dict(restarted.stats.dropped)["attempts"] == 1 and restarted.stats.pending == 0
    err = capsys.readouterr().err
    assert "(attempt 1 of 3, again in 30s" in err and "(attempt 2 of 3, again in 60s" in err, err
    assert f"upload of {crash.id} given up (attempts: 3 attempts failed, the last: " in err
    # AND another restart counts it from its record, keeps it whole and tries nothing again
    reader.touch(crash.path)
    reader.refresh()
    (entry,) = reader.index.crashes
    assert entry.upload_dropped == "attempts"
    assert entry.upload_dropped_why and entry.upload_dropped_why.endswith("the whole bundle stays on the node")
    later = Shipper(cfg, "gpu-3", clock=lambda: now[0])
    assert later.ship_next(reader.index) is False
    assert dict(later.stats.dropped)["attempts"] == 1 and later.stats.failures == 0
    assert Path(crash.path, "MANIFEST.json").is_file()
