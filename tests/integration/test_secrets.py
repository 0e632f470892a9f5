"""Secrets planted in a real crashing process are masked by their structure in every report, every
report JSON and attachment, and every capture bundle file (#13 item 4).

The process carries them where a container carries them: its argv (a URL with an empty user, a
password with "@", JSON, a Slack webhook, a Stripe-style key inside a path, a GitHub token) and its
environment (SLACK_WEBHOOK_URL, a PGP private key block under an innocent name, DATABASE_URL).  A
second crash is written truncated, so its command line is the kernel's 80-byte copy that cuts a URL
before its "@".
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.redact import Redactor
from tests.conftest import PYTHONS
from tests.crashers.make_core import EXPORTER, build_libcrash

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="capture --pid arms other processes as root")

REDIS_PW = "R3disPassw0rd"
AT_PW = "p@ssW0rd-at"
JSON_PW, JSON_KEY = "js0nPassw0rd", "js0nApiKey1234"
SLACK = "https://hooks.slack.com/services/T0ABCDEF1/B0ABCDEF2/abcdefghijklmnopqrstuvwx"
SLACK_SECRET = "abcdefghijklmnopqrstuvwx"
STRIPE = "sk_live_51HxyzABCdefGHIjklMNOpqr"
GITHUB = "ghp_" + "AbC1" * 9
ENV_SLACK_SECRET = "zyxwvutsrqponmlkjihgfedc"
PGP_BODY = "lQOYBGX1q2kBCADn3s3cr3tPgpMaterialLine"
PGP = f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{PGP_BODY}\n=ab12\n-----END PGP PRIVATE KEY BLOCK-----\n"
DB_PW = "pgPassw0rdXyz"
PLANTED = (REDIS_PW, AT_PW, "ssW0rd-at", JSON_PW, JSON_KEY, SLACK_SECRET, STRIPE, GITHUB, ENV_SLACK_SECRET, PGP_BODY,
           DB_PW)


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def texts_of(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` but cores, as text."""
    out = {}
    for p in directory.rglob("*"):
        if p.is_file() and not p.name.startswith("core"):
            out[str(p.relative_to(directory))] = p.read_bytes().decode("utf-8", "replace")
    return out


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, core_pattern, newest_python):
    """A captured exporter-shaped process with the secrets in argv and environment, crashed, its core analysed."""
    d = tmp_path_factory.mktemp("secrets")
    lib = build_libcrash(d)
    fifo = d / "ready"
    os.mkfifo(fifo)
    env = {**os.environ, "SLACK_WEBHOOK_URL": SLACK.replace(SLACK_SECRET, ENV_SLACK_SECRET), "GPG_MATERIAL": PGP,
           "DATABASE_URL": f"postgresql://app:{DB_PW}@db.internal:5432/metrics"}
    run_dir = d / "run"
    run_dir.mkdir()
    # exporter.py ignores arguments after the FIFO: they are there for the core's and /proc's command line
    argv = [PYTHONS[newest_python], str(EXPORTER), str(lib), "segv", str(fifo),
            "--cache", f"redis://:{REDIS_PW}@cache.internal:6379/0",
            "--git", f"https://deploy:{AT_PW}@git.example.com/repo.git",
            "--settings", json.dumps({"password": JSON_PW, "api_key": JSON_KEY, "user": "bob"}),
            "--notify", SLACK, "--config", f"/etc/exporter/{STRIPE}/config.json", "--gh", GITHUB]
    proc = subprocess.Popen(argv, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, resource.RLIM_INFINITY)))
    try:
        time.sleep(0.5)
        r = run("capture", "--pid", str(proc.pid), "--core-dir", str(d / "cores"), "-o", str(d / "bundles"), "--json")
        assert r.exit_code in (0, 4), r.output
        with open(fifo) as f:
            assert f.read().strip() == "ready"
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (bundle,) = [p for p in (d / "bundles").iterdir() if p.is_dir()]
    core = next(run_dir.glob("core*"))
    analysis = d / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(core)).exit_code == 0
    raw = core.read_bytes()  # the core's command line and memory: the secrets really are there
    for s in (REDIS_PW, AT_PW, JSON_PW, SLACK_SECRET, STRIPE, GITHUB):
        assert s.encode() in raw, s
    return d, bundle, analysis


def test_the_analysis_json_keeps_no_secret(crashed):
    # analyze --json is an artifact too: the agent writes it into the bundle, users attach it (#33 item 2)
    _, _, analysis = crashed
    text = analysis.read_text()
    assert [s for s in PLANTED if s in text or json.dumps(s)[1:-1] in text] == []
    doc = json.loads(text)
    assert "redis://:[REDACTED]@cache.internal" in doc["analysis"]["snapshot"]["core"]["args"]
    assert doc["redaction"]["counts"]


def test_the_capture_bundle_keeps_no_secret(crashed):
    _, bundle, _ = crashed
    files = texts_of(bundle)
    assert "40-process/snapshot.json" in files
    for name, text in files.items():
        leaked = [s for s in PLANTED if s in text]
        assert not leaked, f"{name}: {leaked}"
    env = json.loads(files["40-process/snapshot.json"])["environ"]
    assert env["SLACK_WEBHOOK_URL"] == "[REDACTED]" and env["GPG_MATERIAL"].strip() == "[REDACTED]"
    assert env["DATABASE_URL"] == "postgresql://app:[REDACTED]@db.internal:5432/metrics"
    cmdline = " ".join(json.loads(files["40-process/snapshot.json"])["cmdline"])
    assert "redis://:[REDACTED]@cache.internal" in cmdline and "https://deploy:[REDACTED]@git.example.com" in cmdline
    assert '"password": "[REDACTED]"' in cmdline and "https://hooks.slack.com/services/[REDACTED]" in cmdline
    assert "/etc/exporter/[REDACTED]/config.json" in cmdline


@pytest.mark.parametrize("template", ["nvitop", "nvml", "runbook"])
def test_no_report_keeps_a_secret(crashed, template, tmp_path):
    _, bundle, analysis = crashed
    # WHEN the report is written with its attachments, and as JSON
    out = tmp_path / f"report-{template}.md"
    assert run("report", "--template", template, "-o", str(out), str(bundle), str(analysis)).exit_code == 0
    doc = run("report", "--json", "--template", template, str(bundle), str(analysis)).stdout
    # THEN no planted secret is in the report, its attachments or its JSON
    files = texts_of(tmp_path)
    files["json"] = doc
    for name, text in files.items():
        leaked = [s for s in PLANTED if s in text]
        assert not leaked, f"{template} {name}: {leaked}"
    # and the command line it shows keeps the structure around each mask
    shown = json.loads(doc)["report"]["attachments"].get("crash-stacks.txt", "")
    assert "redis://:[REDACTED]@" in shown and "https://hooks.slack.com/services/[REDACTED]" in shown
    footer = json.loads(doc)["report"]["footer"][0]
    for what in ("password", "secret-like JSON key", "webhook URL", "access token"):
        assert what in footer, (what, footer)


def test_a_command_line_cut_inside_a_url_keeps_no_password_tail(tmp_path, core_pattern):
    """A truncated core has no stack: the command line is NT_PRPSINFO's 80 bytes, cut before the URL's "@"."""
    src = tmp_path / "c.c"
    src.write_text("#include <signal.h>\nint main(void){ raise(SIGSEGV); return 0; }\n")
    subprocess.run(["gcc", "-O0", "-o", str(tmp_path / "c"), str(src)], check=True)
    password = "CutPassw0rdTail"
    prefix = "./c --pad " + "A" * 44 + " --db redis://alice:"
    args = (prefix + password + "@db.internal:6379").split(" ")
    assert 70 < len(prefix) < 79  # the kernel's copy ends inside the password
    p = subprocess.run(args, cwd=tmp_path, executable=str(tmp_path / "c"),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (64 << 10, 64 << 10)))
    assert p.returncode == -11
    core = next(tmp_path.glob("core*"))
    psargs = " ".join(args)[:79]  # NT_PRPSINFO's pr_psargs: 80 bytes, the last a NUL
    assert psargs.encode() + b"\0" in core.read_bytes()  # the cut the test is about
    tail = psargs.split("redis://alice:", 1)[1]
    assert tail and password.startswith(tail) and "@" not in psargs
    analysis = tmp_path / "analysis.json"
    run("analyze", "--json", "-o", str(analysis), str(core))
    args_seen = json.loads(analysis.read_text())["analysis"]["snapshot"]["core"]["args"]
    assert args_seen.endswith("redis://alice:[REDACTED]") and tail not in args_seen, args_seen
    for template in ("nvitop", "nvml", "runbook"):
        doc = run("report", "--json", "--template", template, str(analysis)).stdout
        assert tail not in doc.replace("redis://alice:[REDACTED]", ""), template
        assert "redis://alice:[REDACTED]" in doc


@pytest.mark.parametrize("text,secret", [
    ("redis://:R3disPassw0rd@cache:6379", "R3disPassw0rd"),
    ("https://deploy:p@ssW0rd-at@git.example.com/x", "ssW0rd-at"),
    ('{"password": "js0nPw", "api_key": "k3y"}', "js0nPw"),
    ("{'secret': 'pyRepr'}", "pyRepr"),
    ("client_secret: yamlS3cret", "yamlS3cret"),
    (PGP, PGP_BODY),
    ("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkq\n", "MIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkq"),
    (SLACK, SLACK_SECRET),
    (f"/srv/{STRIPE}/x", STRIPE),
    (f"cfg_{STRIPE}", STRIPE),
    ("github_pat_11ABCDEFG0_abcdefghijklmnopqrstuvwxyz0123", "github_pat_11ABCDEFG0"),
    ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSyA1234567890"),
    ("https://0123456789abcdef0123@o1.ingest.sentry.io/2", "0123456789abcdef0123"),
    ("--db redis://alice:PASSW", "PASSW"),
])
def test_secret_structures(text, secret):
    assert secret not in Redactor().text(text)


@pytest.mark.parametrize("text", [
    "http://127.0.0.1:36131/metrics", "http://host:8080", "git clone https://github.com/XuehaiPan/nvitop.git",
    "NVRM: Xid (PCI:0000:3b:00): 79", "Driver Version : 580.126.09", "Persistence Mode : Enabled",
    'File "site-packages/nvitop/api/device.py", line 1591, in Device.nvlink_throughput',
    "task_struct sk_buff skb_live_test", "Product Name : NVIDIA H20",
])
def test_harmless_structures_stay(text):
    assert Redactor().text(text) == text
