"""The object-store readers against a hostile S3 endpoint (tests/hostile_s3.py, on 127.0.0.1): a listing that never
ends, a record sent a byte at a time, redirects, a time that overflows, forty records of 16 MiB under a memory
cgroup, an endpoint with a password in it.  Each is one line and no "internal error"; the rest of the bucket is
still read.  The times measured are printed (``-s``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cgroups import memory_cgroup
from tests.hostile_s3 import HostileS3, upload_record

FORENSICS = Path(sys.executable).parent / "forensics"
BUCKET = "hostile"
PREFIX = "fleet/prod"


@pytest.fixture
def s3():
    server = HostileS3()
    yield server
    server.close()


@pytest.fixture
def fleet_inputs(tmp_path):
    pods = {"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "p", "namespace": "n", "uid": "u"},
                                       "spec": {"nodeName": "gpu-3"}, "status": {}}]}
    nodes = {"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "gpu-3", "labels": {}}}]}
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    return ["--from", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json")]


def _key(i: int) -> str:
    return f"{PREFIX}/c/gpu-3/ns/p/2025-01-01T00-00-0{i}-fp{i}-id{i}/UPLOAD.json"


def _bundles(s3: HostileS3, n: int = 4, **times) -> None:
    s3.objects[BUCKET] = {_key(i): upload_record(fingerprint=f"fp{i}", node="gpu-3", time=times.get(f"t{i}", 1.0e9 + i))
                          for i in range(n)}


def _fleet(s3, fleet_inputs, tmp_path, *extra: str, prefix: str = PREFIX, **env: str):
    started = time.monotonic()
    r = subprocess.run([str(FORENSICS), "fleet", *fleet_inputs, "--bundles", f"s3://{BUCKET}/{prefix}", "--json",
                        *extra], capture_output=True, text=True, timeout=300,
                       env=s3.env(os.environ, HOME=str(tmp_path), **env))
    took = time.monotonic() - started
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r, took


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("forensics: warning:")]


def _latest(r) -> dict:
    return json.loads(r.stdout)["fleet"]["latest_bundles"]


@pytest.mark.parametrize("attack", ["endless", "endless-new", "repeat", "stuck"])
def test_a_listing_that_never_ends_is_cut_short_in_one_line(s3, fleet_inputs, tmp_path, attack):
    # GIVEN four bundles under a prefix whose listing never ends
    _bundles(s3)
    s3.listing[BUCKET] = attack
    # WHEN fleet reads the bundles there
    r, took = _fleet(s3, fleet_inputs, tmp_path)
    pages = sum(1 for m, path, q in s3.asked if m == "GET" and "list-type" in q)
    print(f"\n{attack} listing: stopped after {pages} pages, {took:.1f} s")
    # THEN one warning line says the listing was stopped; what was listed is read (partial: exit 4)
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "listing of" in warnings[0] and "stopped" in warnings[0], r.stderr
    assert r.returncode == 4, r.stderr
    if attack != "endless-new":  # the honest keys were on the first page
        assert sorted(_latest(r)) == ["fp0", "fp1", "fp2", "fp3"]
    assert json.loads(r.stdout)["fleet"]["bundle_problems"] == [warnings[0].split("warning: ", 1)[1]]


def test_a_dripped_record_is_left_and_the_rest_of_the_bucket_read(s3, fleet_inputs, tmp_path):
    # GIVEN four bundles, one of whose records is sent one byte every 2 s
    _bundles(s3)
    s3.drip.add((BUCKET, _key(2)))
    # WHEN fleet reads them
    r, took = _fleet(s3, fleet_inputs, tmp_path)
    print(f"\ndripped record: left, the command done in {took:.1f} s")
    # THEN that record is one warning line (its own deadline: 10 s and 1 s a MiB), the three others are counted
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "not done within" in warnings[0] and "fp2" in warnings[0], r.stderr
    assert sorted(_latest(r)) == ["fp0", "fp1", "fp3"] and r.returncode == 4
    assert took < 60, took


def test_the_command_deadline_bounds_all_the_requests(s3, fleet_inputs, tmp_path):
    # GIVEN a listing of new keys forever, every page slow to list
    _bundles(s3)
    s3.listing[BUCKET] = "endless-new"
    s3.page_size = 1000
    # WHEN fleet reads it with --deadline 3
    r, took = _fleet(s3, fleet_inputs, tmp_path, "--deadline", "3")
    print(f"\n--deadline 3 over an endless listing: done in {took:.1f} s")
    # THEN it stops at the deadline (or the key bound, whichever comes first), one line
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1, r.stderr
    assert "--deadline" in warnings[0], warnings
    assert took < 60, took


def test_a_redirect_is_one_line(s3, fleet_inputs, tmp_path):
    # GIVEN a record answered 307 to itself
    _bundles(s3)
    s3.redirect.add((BUCKET, _key(1)))
    r, _ = _fleet(s3, fleet_inputs, tmp_path)
    # THEN one warning line names the redirect; the others are counted
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "redirect" in warnings[0] and "fp1" in warnings[0], r.stderr
    assert sorted(_latest(r)) == ["fp0", "fp2", "fp3"]
    # AND every request answered 307 (botocore's region redirector recursed until RecursionError) is one error line
    s3.redirect.add("*")
    r, took = _fleet(s3, fleet_inputs, tmp_path)
    print(f"\n307 to every request: one line after {took:.1f} s")
    errors = [line for line in r.stderr.splitlines() if line.startswith("forensics: error:")]
    assert r.returncode == 1 and len(errors) == 1 and "redirect loop" in errors[0], r.stderr


@pytest.mark.parametrize("bad_time", ["9" * 401, "1e400", "-5", "NaN", "Infinity", '"yesterday"'],
                         ids=["401-digits", "1e400", "negative", "NaN", "Infinity", "string"])
def test_a_time_out_of_range_is_no_time(s3, fleet_inputs, tmp_path, bad_time):
    # GIVEN a record whose place.time no clock gives, beside three sound ones
    _bundles(s3, t1=bad_time)
    r, _ = _fleet(s3, fleet_inputs, tmp_path)
    # THEN it is counted without a time, said in one line; the others are read
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "place.time" in warnings[0] and "fp1" in warnings[0], r.stderr
    assert sorted(_latest(r)) == ["fp0", "fp1", "fp2", "fp3"]


def test_forty_records_of_16_mib_are_read_within_300_mib(s3, fleet_inputs, tmp_path):
    # GIVEN forty bundles whose records are 16 MiB each (items of long paths: within what a bundle's record holds)
    template = upload_record(fingerprint="FP-PLACEHOLDER", node="gpu-3", time=1.0e9, pad=(16 << 20) - (256 << 10))
    assert (15 << 20) < len(template) <= 16 << 20
    s3.objects[BUCKET] = {_key(0).replace("0-fp0-id0", f"{i:02d}-fp-id{i}"):
                          (lambda i=i: template.replace(b"FP-PLACEHOLDER", f"fp-{i:02d}-padded".encode()))
                          for i in range(40)}
    with memory_cgroup(300 << 20, "forensics-s3-records") as cg:
        if cg is None:
            pytest.skip("no memory cgroup this test may make (cgroup v1 memory or v2 with the memory controller)")
        # WHEN fleet reads them in a cgroup whose memory is limited to 300 MiB
        started = time.monotonic()
        r = subprocess.run([str(FORENSICS), "fleet", *fleet_inputs, "--bundles", f"s3://{BUCKET}/{PREFIX}", "--json"],
                           capture_output=True, text=True, timeout=600, preexec_fn=cg.enter,
                           env=s3.env(os.environ, HOME=str(tmp_path)))
        took = time.monotonic() - started
        print(f"\n40 records of 16 MiB: read in {took:.1f} s, OOM kills {cg.oom_kills} (the peak: bench/objstore.py)")
        # THEN it was not killed, and counted all forty
        assert cg.oom_kills == 0 and r.returncode == 0, r.stderr[-2000:]
    assert len(_latest(r)) == 40


def test_a_record_of_too_many_json_values_is_not_parsed(s3, fleet_inputs, tmp_path):
    # GIVEN a record of 16 MiB of empty lists (it would parse into twenty times its size) beside sound ones
    _bundles(s3)
    s3.objects[BUCKET][_key(3)] = b'{"items": [' + b"[]," * ((16 << 20) // 3 - 10) + b'[]], "place": {}}'
    r, _ = _fleet(s3, fleet_inputs, tmp_path)
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "more JSON values" in warnings[0], r.stderr
    assert sorted(_latest(r)) == ["fp0", "fp1", "fp2"]


def test_analyze_of_a_dripped_core_object_is_one_line(s3, tmp_path):
    # GIVEN a core object sent one byte every 2 s
    s3.objects[BUCKET] = {"cores/core.zst": b"\x28\xb5\x2f\xfd" + bytes(4096)}
    s3.drip.add((BUCKET, "cores/core.zst"))
    started = time.monotonic()
    # WHEN analyze reads it, with and without --deadline
    r = subprocess.run([str(FORENSICS), "analyze", f"s3://{BUCKET}/cores/core.zst"], capture_output=True, text=True,
                       timeout=300, env=s3.env(os.environ, HOME=str(tmp_path)))
    took = time.monotonic() - started
    started = time.monotonic()
    r2 = subprocess.run([str(FORENSICS), "analyze", "--deadline", "3", f"s3://{BUCKET}/cores/core.zst"],
                        capture_output=True, text=True, timeout=300, env=s3.env(os.environ, HOME=str(tmp_path)))
    took2 = time.monotonic() - started
    print(f"\nanalyze of a dripped core: left after {took:.1f} s; with --deadline 3 after {took2:.1f} s")
    # THEN each is one error line naming the bound, exit 1
    for res, bound in ((r, "not done within 1"), (r2, "--deadline")):
        errors = [line for line in res.stderr.splitlines() if line.startswith("forensics: error:")]
        assert res.returncode == 1 and len(errors) == 1 and bound in errors[0], res.stderr
        assert "internal error" not in res.stderr
    assert took < 60 and took2 < 30


SECRET = "hunter2hunter2-PASSWORD"


@pytest.mark.parametrize("how", ["option", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
@pytest.mark.parametrize("command", ["analyze", "fleet", "report", "upload"])
def test_an_endpoint_with_a_password_is_refused_and_never_printed(s3, fleet_inputs, tmp_path, command, how):
    _bundles(s3)
    endpoint = s3.endpoint.replace("http://", f"http://admin:{SECRET}@")
    env = s3.env(os.environ, HOME=str(tmp_path))
    args: list[str] = []
    if how == "option":
        args = ["--endpoint-url", endpoint]
    else:
        env[how] = endpoint
    url = f"s3://{BUCKET}/{PREFIX}"
    argv = {"analyze": ["analyze", url], "fleet": ["fleet", *fleet_inputs, "--bundles", url],
            "report": ["report", url], "upload": ["upload", str(tmp_path), url]}[command]
    r = subprocess.run([str(FORENSICS), *argv, *args], capture_output=True, text=True, timeout=300, env=env)
    # THEN one error line refuses it, the hint names the SDK's credential chain, and the password is nowhere
    assert r.returncode == 1, r.stderr
    assert SECRET not in r.stderr + r.stdout
    assert "user:password@" in r.stderr and "AWS_ACCESS_KEY_ID" in r.stderr, r.stderr
    assert not any(q.get("list-type") for _m, _p, q in s3.asked), "nothing is asked of the endpoint"


def test_a_secret_in_what_the_server_says_is_masked(s3, fleet_inputs, tmp_path):
    # GIVEN a server whose error message quotes a password and an AWS secret key back
    _bundles(s3)
    s3.error[(BUCKET, _key(0))] = (f"db password={SECRET} aws_secret_access_key="
                                   "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    r, _ = _fleet(s3, fleet_inputs, tmp_path)
    # THEN the line that quotes it masks both
    warnings = _warnings(r.stderr)
    assert len(warnings) == 1 and "[REDACTED]" in warnings[0], r.stderr
    assert SECRET not in r.stderr and "wJalrXUtnFEMI" not in r.stderr


def test_agent_manifest_refuses_to_write_a_password_into_the_daemonset(tmp_path):
    r = subprocess.run([str(FORENSICS), "agent", "manifest", "--upload", "s3://crash-bundles/fleet", "--endpoint-url",
                        f"http://admin:{SECRET}@minio.local:9000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "" and SECRET not in r.stderr, r.stderr
    assert "user:password@" in r.stderr and "AWS_ACCESS_KEY_ID" in r.stderr
