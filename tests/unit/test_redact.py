"""Redaction rules on hand-written hostile strings."""
from __future__ import annotations

import pytest

from forensics.redact import MASK, Redactor, redact_tree

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


@pytest.mark.parametrize(
    "text,secret",
    [
        ('PASSWORD="x y z" exporter', "x y z"),
        ("PASSWORD='x y z' exporter", "x y z"),
        ('exporter --token "abc123def" --port 8000', "abc123def"),
        ("exporter --password 'p w q' --port 8000", "p w q"),
        ("curl -H 'Authorization: Basic dXNlcjpwYXNz' https://registry", "dXNlcjpwYXNz"),
        ("Authorization: Bearer abc", "abc"),
        ('{"Proxy-Authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
        ("X-Api-Key: k3yk3yk3y", "k3yk3yk3y"),
        ("curl -u admin:pw9 https://registry", "pw9"),
        ("curl --user 'admin:p w9' https://registry", "p w9"),
        ("curl --proxy-user=admin:pw9 https://registry", "pw9"),
        ("SIGNING_KEY_PEM=MIIEvQIBADANBg", "MIIEvQIBADANBg"),
        ("DB_PASS=hunter2 PGPASS=hunter3 MYSQL_PWD=hunter4", "hunter"),
        ("exporter --db-pass=hunter2", "hunter2"),
        ("accountKey=Zm9vYmFy", "Zm9vYmFy"),
    ],
)
def test_more_secret_forms_are_masked(text, secret):
    r = Redactor()
    out = r.text(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize(
    "name",
    ["KEYBOARD", "MONKEY", "PATH", "HOSTNAME", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PWD", "OLDPWD",
     "GIT_AUTHOR_NAME", "TOKENIZERS_PARALLELISM", "BYPASS_PROXY", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"],
)
def test_harmless_names_are_not_secrets(name):
    r = Redactor()
    assert r.env_value(name, "value-123456") == "value-123456"
    assert r.text(f"{name}=value-123456 --{name.lower().replace('_', '-')} value-123456") == (
        f"{name}=value-123456 --{name.lower().replace('_', '-')} value-123456")
    assert r.summary() == ["nothing matched the redaction rules"]


def test_known_names_are_replaced_whole_only():
    # GIVEN a node named "vm" (a substring of nvml) and a pod whose name is in a bundle directory name
    r = Redactor(hosts=True, known_hosts={"vm": "node", "exporter-7x9k2": "pod"})
    s = ("nvmlDeviceGetFieldValues in pynvml.py; /var/lib/kubelet/pods/exporter-7x9k2/volumes node=vm, vm: "
         "/bundles/20250101T000000Z-gpu-jobs-exporter-7x9k2-2/MANIFEST.json vm.cluster.local libvm.so vm_stat x.vm")
    # THEN whole names are replaced, and identifiers and file names that only contain them are not
    assert r.text(s) == (
        "nvmlDeviceGetFieldValues in pynvml.py; /var/lib/kubelet/pods/pod-1/volumes node=node-1, node-1: "
        "/bundles/20250101T000000Z-gpu-jobs-pod-1-2/MANIFEST.json host-1 libvm.so vm_stat x.vm"
    )
    # a name that is a prefix of another known name does not break the longer one
    r = Redactor(hosts=True, known_hosts={"gpu-node-1": "node", "gpu-node-17": "node"})
    assert r.text("gpu-node-17 gpu-node-1 gpu-node-17") == "node-1 node-2 node-1"


def test_a_secret_value_is_masked_wherever_it_appears():
    r = Redactor()
    assert r.text("NVIDIA_API_KEY=s3cr3tvalue123") == f"NVIDIA_API_KEY={MASK}"
    # the same value elsewhere, without its name: kernel log, nvidia-smi, a thread name
    assert r.text("NVRM: Xid 79 pid 4242 s3cr3tvalue123") == f"NVRM: Xid 79 pid 4242 {MASK}"
    assert r.text("metrics-s3cr3tvalue123") == f"metrics-{MASK}"
    assert "2 repeated secret values" in r.summary()
    # a short value is not chased through the evidence (it would mangle unrelated text)
    r = Redactor()
    r.text("PASSWORD=abcde")
    assert r.text("abcde in a log line") == "abcde in a log line"


def test_learn_masks_values_that_appear_before_their_name():
    # GIVEN evidence where the bare value comes first, and an argv whose option and value are separate items
    tree = {"threads": [{"name": "metrics-s3cr3tvalue123"}], "args": "exporter --api-key s3cr3tvalue123",
            "cmdline": ["exporter", "--token", "tok3n-value-9"], "log": "token was tok3n-value-9"}
    plain = redact_tree(tree, Redactor())
    assert plain["threads"][0]["name"] == "metrics-s3cr3tvalue123"  # one pass alone cannot know yet
    r = Redactor()
    r.learn(tree)
    out = redact_tree(tree, r)
    assert "s3cr3tvalue123" not in repr(out) and "tok3n-value-9" not in repr(out)
    assert out["cmdline"] == ["exporter", "--token", MASK]


def test_kubernetes_env_entries_are_judged_by_name():
    r = Redactor()
    out = redact_tree({"env": [{"name": "DB_PASS", "value": "hunter2"}, {"name": "PORT", "value": "8000"}]}, r)
    assert out == {"env": [{"name": "DB_PASS", "value": MASK}, {"name": "PORT", "value": "8000"}]}


def test_keys_are_redacted_counted_once_and_never_merged():
    r = Redactor()
    out = redact_tree({"env": {"--token=abc123def456": "a", "--token=zzz999yyy888": "b", "x\x1b": "c"}}, r)
    assert out == {"env": {"--token=[REDACTED]": "a", "--token=[REDACTED] (2)": "b", "x\x1b": "c"}}
    assert r.counts == {"secret-like NAME=value pairs": 2}


def test_the_node_text_of_a_capture_is_masked_with_the_process_secrets():
    # GIVEN a process whose argv and environment give values away, and node text naming them bare
    from forensics.capture.node import process_secrets, redacted

    learned = process_secrets(b"exporter\0--token\0tok3n-value-9\0", b"DB_PW=dbpw-secret-1\0PATH=/bin\0")
    # THEN the node's text is masked with them (a later reader of the bundle cannot learn them any more)
    assert redacted("Name : python tok3n-value-9 dbpw-secret-1 /bin", learned) == \
        b"Name : python [REDACTED] [REDACTED] /bin"


def test_nvidia_bug_report_is_masked_with_the_process_secrets(tmp_path):
    # GIVEN NVIDIA's bug report (gzip) whose process list holds the captured process's command line
    import gzip

    from forensics.capture.node import process_secrets, redact_bug_report

    learned = process_secrets(b"python\0exporter.py\0--api-key\0k3y-of-the-exporter\0", b"")
    src = tmp_path / "nvidia-bug-report.log.gz"
    src.write_bytes(gzip.compress(b"ps:\n 4242 python exporter.py --api-key k3y-of-the-exporter\n" * 3
                                  + b"journal: exporter started with k3y-of-the-exporter\n"))
    # WHEN it is kept in the bundle
    redact_bug_report(str(src), str(tmp_path / "kept.gz"), secrets=learned)
    text = gzip.decompress((tmp_path / "kept.gz").read_bytes()).decode()
    # THEN the value is masked where its option names it and where it stands bare
    assert "k3y-of-the-exporter" not in text and "journal: exporter started with [REDACTED]" in text


def test_a_learned_value_never_blanks_the_documents_own_facts():
    # GIVEN a process started with --api-key SIGSEGV --token string_at that crashes in string_at with SIGSEGV
    from forensics.redact import redact_document

    doc = {"args": "python exporter.py --api-key SIGSEGV --token string_at --pw Secr3tLongValue",
           "signature": "SIGSEGV at 0x10 in thread \"w Secr3tLongValue\" at ctypes.string_at (ctypes/__init__.py:519)",
           "threads": [{"py_frames": [{"function": "string_at", "file": "/usr/lib/python3/ctypes/__init__.py"}]}],
           "crash": {"signal_name": "SIGSEGV"}}
    out = redact_document(doc)
    # THEN the values are masked where the argv gives them, the crash site stays, the real secret goes
    assert out["args"] == "python exporter.py --api-key [REDACTED] --token [REDACTED] --pw [REDACTED]"
    assert out["signature"] == 'SIGSEGV at 0x10 in thread "w [REDACTED]" at ctypes.string_at (ctypes/__init__.py:519)'
    assert out["redaction"]["masked_in"] == ["signature"]
    # and a command line under a fact's key is no fact: its words stay secrets
    cmd = redact_document({"command": "exporter --token Tok3nValue99", "log": "saw Tok3nValue99"})
    assert cmd["log"] == "saw [REDACTED]"


@pytest.mark.parametrize("text,expected", [
    ('<add key="Password" value="XmlAttrPw085"/>', '<add key="Password" value="[REDACTED]"/>'),
    ("Server=tcp:sql,1433;User ID=sa;Password=My Secret Pw;Encrypt=True;",
     "Server=tcp:sql,1433;User ID=sa;Password=[REDACTED];Encrypt=True;"),
    ("PWD={a;b};UID=sa", "PWD={[REDACTED]};UID=sa"),
    ("https://x/y?page=2&sig=AbCdEf123456%3D&sp=r", "https://x/y?page=2&sig=[REDACTED]&sp=r"),
])
def test_structures_around_a_mask_are_kept(text, expected):
    assert Redactor().text(text) == expected
