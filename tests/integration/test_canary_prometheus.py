"""`forensics canary` scrapes as Prometheus does: https with a CA, a bearer token file, gzip and the
OpenMetrics Accept header -- against real HTTPS servers on 127.0.0.1 with certificates made here."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK
from tests.integration.test_canary import Server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI is not installed")

TOKEN = "s3cr3t-canary-token-7f0a"


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def make_cert(d: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, made by openssl."""
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def servers(tmp_path):
    started: list[Server] = []

    def start(*flags):
        s = Server(tmp_path, *flags)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def _log(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_https_with_ca_token_gzip_and_openmetrics(servers, tmp_path):
    # GIVEN an HTTPS exporter whose certificate only its own CA vouches for, and a token file
    cert, key = make_cert(tmp_path, "exporter")
    log = tmp_path / "requests.jsonl"
    s = servers("--tls", str(cert), str(key), "--log", str(log))
    url = s.url.replace("http://", "https://")
    (tmp_path / "token").write_text(TOKEN + "\n")
    # WHEN the canary scrapes it with the CA and the token
    r = run("canary", url, "--json", "--interval", "0", "--requests", "5", "--ca-file", str(cert),
            "--bearer-token-file", str(tmp_path / "token"), "--expect", "nvitop_gpu_utilization")
    # THEN every scrape succeeds, carrying the token, asking for gzip and OpenMetrics first, as Prometheus does
    assert r.exit_code == EXIT_OK, r.output
    c = json.loads(r.stdout)["canary"]
    assert c["ok"] == 5 and c["families"]["nvitop_gpu_utilization"] == 8
    reqs = _log(log)
    assert len(reqs) == 5
    assert all(h["Authorization"] == f"Bearer {TOKEN}" for h in reqs)
    assert all(h["Accept-Encoding"] == "gzip" for h in reqs)
    assert all(h["Accept"].startswith("application/openmetrics-text;version=1.0.0") for h in reqs)
    # the answers came gzip-encoded in OpenMetrics, and were decoded and parsed as such
    assert c["gzip_bodies"] == 5
    assert c["content_types"] == {"application/openmetrics-text; version=1.0.0; charset=utf-8": 5}
    assert c["invalid_bodies"] == 0 and c["body_min"] > 0
    # the token is never shown
    assert TOKEN not in r.output
    text = run("canary", url, "--interval", "0", "--requests", "2", "--ca-file", str(cert),
               "--bearer-token-file", str(tmp_path / "token"))
    assert text.exit_code == EXIT_OK and TOKEN not in text.output
    assert "format: application/openmetrics-text; version=1.0.0; charset=utf-8: 2; gzip 2 of 2" in text.stdout


def test_a_wrong_ca_fails_in_one_line_and_skip_verify_scrapes(servers, tmp_path):
    cert, key = make_cert(tmp_path, "exporter")
    other, _ = make_cert(tmp_path, "someone-else")
    s = servers("--tls", str(cert), str(key))
    url = s.url.replace("http://", "https://")
    # a CA that did not sign the server's certificate: one error line, exit 1, nothing judged
    r = run("canary", url, "--interval", "0", "--requests", "5", "--ca-file", str(other))
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "certificate verify failed" in errors[0] and "--ca-file" in errors[0], r.stderr
    assert "Traceback" not in r.output and r.stdout == ""
    # no CA at all: the system's CAs do not know it either
    r = run("canary", url, "--interval", "0", "--requests", "5")
    assert r.exit_code == 1 and "self-signed certificate" in r.stderr
    # --insecure-skip-verify scrapes it
    r = run("canary", url, "--interval", "0", "--requests", "5", "--insecure-skip-verify")
    assert r.exit_code == EXIT_OK, r.output


def test_the_token_is_not_sent_after_a_redirect_to_another_origin(servers, tmp_path):
    # GIVEN an endpoint that redirects to another origin (another port), which logs what reaches it
    other_log = tmp_path / "other.jsonl"
    other = servers("--log", str(other_log))
    first_log = tmp_path / "first.jsonl"
    first = servers("--redirect", other.url, "--log", str(first_log))
    (tmp_path / "token").write_text(TOKEN)
    r = run("canary", first.url, "--json", "--interval", "0", "--requests", "3",
            "--bearer-token-file", str(tmp_path / "token"))
    # THEN the token went to the URL's origin only; the redirect is not followed, and says so
    assert [h["Authorization"] for h in _log(first_log)] == [f"Bearer {TOKEN}"] * 3
    assert _log(other_log) == []
    assert r.exit_code == EXIT_FINDINGS
    c = json.loads(r.stdout)["canary"]
    assert c["errors"] == {"HTTP 302 (redirect: not followed, give the final URL)": 3}


def test_a_gzip_bomb_is_refused_not_inflated(servers, tmp_path):
    s = servers("--bomb")
    r = run("canary", s.url, "--json", "--interval", "0", "--requests", "2")
    assert r.exit_code == EXIT_FINDINGS
    c = json.loads(r.stdout)["canary"]
    assert c["errors"] == {"decompressed body over the size limit": 2} and c["ok"] == 0


def test_a_bad_token_file_or_a_ca_with_http_is_one_error_line(tmp_path):
    (tmp_path / "empty").write_text("\n")
    r = run("canary", "http://127.0.0.1:9/metrics", "--bearer-token-file", str(tmp_path / "empty"))
    assert r.exit_code == 1 and "not a bearer token" in r.stderr
    r = run("canary", "http://127.0.0.1:9/metrics", "--bearer-token-file", str(tmp_path / "missing"))
    assert r.exit_code == 1 and "cannot read the bearer token: No such file or directory" in r.stderr
    r = run("canary", "http://127.0.0.1:9/metrics", "--insecure-skip-verify")
    assert r.exit_code == 1 and "go with an https:// URL" in r.stderr
    r = run("canary", "https://127.0.0.1:9/metrics", "--ca-file", str(tmp_path / "empty"))
    assert r.exit_code == 1 and "cannot load the CA file" in r.stderr
    r = run("canary", "http://127.0.0.1:9/metrics", "--interval", "5", "--timeout", "10")
    assert r.exit_code == 1 and "longer than --interval" in r.stderr
