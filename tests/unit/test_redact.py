"""Redaction rules on hand-written hostile strings."""
from __future__ import annotations

import pytest

from forensics.report.redact import MASK, Redactor, redact_tree

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"


@pytest.mark.parametrize(
    "text,secret",
    [
        ("exporter --api-key abcdef123456", "abcdef123456"),
        ("exporter --password=hunter2hunter2", "hunter2hunter2"),
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", "hf_abcdefghijklmnopqrstuvwxyz"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig12345", "eyJhbGciOiJIUzI1NiJ9"),
        ("pull from https://robot:s3cr3tPassw0rd@registry.example.com/v2/", "s3cr3tPassw0rd"),
        (f"key file:\n{KEY}", "b3BlbnNzaC1rZXktdjEAAAAA"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
        ("aws AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
    ],
)
def test_secrets_are_masked(text, secret):
    r = Redactor()
    out = r.text(text)
    assert secret not in out and MASK in out
    assert r.summary() != ["nothing matched the redaction rules"]


def test_harmless_text_is_untouched():
    r = Redactor(hosts=True)
    s = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 exporter.py:34 --port 8000 gconv-modules.cache"
    assert r.text(s) == s
    assert r.summary() == ["nothing matched the redaction rules"]


def test_environment_dicts_are_redacted_by_variable_name():
    r = Redactor()
    tree = {"environ": {"NVIDIA_VISIBLE_DEVICES": "all", "DB_PASSWORD": "x", "MY_API_KEY": "y"}}
    out = redact_tree(tree, r)
    assert out["environ"] == {"NVIDIA_VISIBLE_DEVICES": "all", "DB_PASSWORD": MASK, "MY_API_KEY": MASK}


def test_hosts_consistent_aliases():
    r = Redactor(hosts=True, known_hosts={"gpu-node-17": "node", "exporter-7x9k2": "pod"})
    a = r.text("pod exporter-7x9k2 on gpu-node-17 (10.0.0.5), api.cluster.local")
    b = r.text("gpu-node-17 again, 10.0.0.5 again, api.cluster.local again")
    assert a == "pod pod-1 on node-1 (ip-1), host-1"
    assert b == "node-1 again, ip-1 again, host-1 again"
    assert r.text("127.0.0.1:8000") == "127.0.0.1:8000"
