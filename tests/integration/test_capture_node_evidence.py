"""What `capture --pid` keeps of the node for an upstream report: os-release of the node and of the
process's own root, the NVIDIA driver's kernel log lines only, and nvidia-bug-report.sh, bounded."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.capture.node import read_os_release, run_nvidia_bug_report
from forensics.cli import cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="capture --pid arms other processes as root")

IMAGE_OS = 'PRETTY_NAME="Forensics Test Linux 7 (image)"\nNAME="Forensics Test Linux"\nVERSION_ID="7"\nID=ftl\n'


@pytest.fixture
def rooted(tmp_path):
    """A process chrooted into its own root (a static binary), whose /etc/os-release is a relative symlink."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "os-release").write_text(IMAGE_OS)
    os.symlink("../usr/lib/os-release", root / "etc" / "os-release")
    src = tmp_path / "pause.c"
    src.write_text("#include <unistd.h>\nint main(void){ write(1, \"ready\\n\", 6); pause(); return 0; }\n")
    subprocess.run(["gcc", "-static", "-O1", "-o", str(root / "pause"), str(src)], check=True)
    p = subprocess.Popen(["chroot", str(root), "/pause"], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        yield p
    finally:
        p.kill()
        p.wait()


def capture(pid: int, tmp_path: Path) -> Path:
    r = CliRunner().invoke(cli, ["capture", "--pid", str(pid), "--core-dir", str(tmp_path / "cores"),
                                 "-o", str(tmp_path / "bundles"), "--json"], catch_exceptions=False)
    assert r.exit_code in (0, 4), r.output
    return Path(json.loads(r.stdout)["bundle"])


def test_os_release_of_the_node_and_of_the_process_root(rooted, tmp_path):
    # WHEN a process living in its own root is captured
    bundle = capture(rooted.pid, tmp_path)
    # THEN its image's os-release is the one inside its root (through the relative symlink), the node's is ours
    assert (bundle / "40-process" / "os-release").read_text() == IMAGE_OS
    node = (bundle / "20-node" / "os-release").read_text()
    assert node == read_os_release("/") and "ID=" in node and "Forensics Test Linux" not in node
    items = {i["path"] for i in json.loads((bundle / "MANIFEST.json").read_text())["items"]}
    assert {"20-node/os-release", "40-process/os-release"} <= items


def test_os_release_never_leaves_the_root(tmp_path):
    # GIVEN a root whose os-release points outside it, absolutely and with ..
    root = tmp_path / "hostile"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "lib").mkdir(parents=True)
    os.symlink("/../../../../etc/os-release", root / "etc" / "os-release")
    # THEN the absolute target restarts inside the root: not found there, so the fallback, absent too
    assert read_os_release(str(root)) is None
    (root / "usr" / "lib" / "os-release").write_text("ID=inside\n")
    assert read_os_release(str(root)) == "ID=inside\n"


def test_kernel_log_keeps_the_driver_lines_only(rooted, tmp_path):
    # GIVEN driver lines, another process's segfault and our own handler's line in the kernel log
    tag = uuid.uuid4().hex[:8]
    lines = {
        f"NVRM: Xid (PCI:0000:3b:00): 79, pid={rooted.pid}, GPU has fallen off the bus. [test {tag}]": True,
        f"nvidia-nvlink: Nvlink Core is being initialized, major device number 234 [test {tag}]": True,
        f"nvidia 0000:18:00.0: enabling device (0000 -> 0003) [test {tag}]": True,
        f"python[{rooted.pid + 100000}]: segfault at 7f8a37720000 ip 00007f8a377287e2 error 6 [test {tag}]": False,
        f"forensics-core-handler[4242]: pid 8522 (crasher) SIGABRT: core kept [test {tag}]": False,
        f"usb 1-1: new high-speed USB device number 2 using xhci_hcd [test {tag}]": False,
    }
    try:
        with open("/dev/kmsg", "w") as k:
            for line in lines:
                k.write(line + "\n")
                k.flush()
    except OSError as e:
        pytest.skip(f"cannot write the kernel log here (/dev/kmsg: {e.strerror}); CI runs as root")
    # WHEN the process is captured
    bundle = capture(rooted.pid, tmp_path)
    kept = [x for x in (bundle / "30-kernel" / "kernel-nvidia.log").read_text().splitlines() if tag in x]
    # THEN exactly the driver's lines are there
    assert sorted(kept) == sorted(x for x, keep in lines.items() if keep)


def fake_bug_report(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-bug-report.sh"
    script.write_text("#!/bin/sh\n# a stand-in for the driver's nvidia-bug-report.sh (no GPU driver here)\n" + body)
    script.chmod(0o755)


def test_nvidia_bug_report_is_run_with_safe_mode_and_kept(tmp_path, monkeypatch):
    # GIVEN a node with nvidia-bug-report.sh (it writes --output-file FILE as FILE.gz, as the real one does)
    fake_bug_report(tmp_path / "bin", 'out=""; while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; '
                                      '[ "$1" = --safe-mode ] && safe=1; shift; done\n'
                                      'echo "safe=$safe nvidia-smi -q ..." | gzip > "$out.gz"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "30-kernel"
    kept, note = run_nvidia_bug_report(str(out))
    assert kept == str(out / "nvidia-bug-report.log.gz") and "kept, secrets masked by structure (0)" in note
    assert gzip.decompress(Path(kept).read_bytes()).startswith(b"safe=1 ")
    assert sorted(p.name for p in out.iterdir()) == ["nvidia-bug-report.log.gz"]  # no work directory left


#: secrets a node's journal and syslog may hold, each as a service would log it
PLANTED = {
    "url": "Nov 30 12:00:01 node kubelet[1]: pulling https://deploy:Hunter2-registry-pw@registry.internal/v2/x\n",
    "webhook": "alertmanager: posting to https://hooks.slack.com/services/T0000/B0000/XXXXsecretwebhook0000\n",
    "bearer": 'curl -H "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJlc2ln"\n',
    "env": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY exporter started\n",
    "token": "github token ghp_0123456789abcdefghijABCDEFGHIJ012345 in a log line\n",
}
SECRET_VALUES = ["Hunter2-registry-pw", "XXXXsecretwebhook0000", "c2lnbmF0dXJlc2ln", "wJalrXUtnFEMI",
                 "ghp_0123456789abcdefghijABCDEFGHIJ012345", "MIIEowIBAAKCAQEA", "tail-of-the-key-0000"]


def test_nvidia_bug_report_is_kept_with_its_secrets_masked(tmp_path, monkeypatch):
    """#13 (left by the secrets work): nvidia-bug-report.log.gz was kept unredacted, with the node's journal in it."""
    # GIVEN a node whose bug report holds nvidia-smi -q, an Xid line, planted secrets and a private key whose
    # block straddles the redactor's 1 MiB pieces, among 3 MB of ordinary log lines
    filler = "".join(f"Nov 30 12:00:{i % 60:02d} node kernel: line {i} of the journal\n" for i in range(60000))
    key = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n" * 200
           + "tail-of-the-key-0000\n-----END RSA PRIVATE KEY-----\n")
    head = SMI_Q + "[ 12.3] NVRM: Xid (PCI:0000:2a:00): 79, pid=9, GPU has fallen off the bus.\n"
    text = head + "".join(PLANTED.values()) + filler[: (1 << 20) - 3000 - len(head)] + key + filler + PLANTED["url"]
    (tmp_path / "report.txt").write_text(text)
    fake_bug_report(tmp_path / "bin", 'while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; shift; done\n'
                                      f'gzip < {tmp_path / "report.txt"} > "$out.gz"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    # WHEN the capture runs it
    out = tmp_path / "30-kernel"
    kept, note = run_nvidia_bug_report(str(out))
    # THEN what is kept has none of the secrets, the key block masked across the pieces, everything else whole
    kept_text = gzip.decompress(Path(kept).read_bytes()).decode()
    assert [v for v in SECRET_VALUES if v in kept_text] == []
    assert "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" not in kept_text
    assert kept_text.startswith(head) and filler in kept_text and kept_text.count("[REDACTED]") >= 7
    assert "secrets masked by structure" in note and "private keys" in note and "passwords in URLs" in note
    assert sorted(p.name for p in out.iterdir()) == ["nvidia-bug-report.log.gz"]  # the unmasked one is gone


def test_nvidia_bug_report_redaction_is_bounded(tmp_path):
    from forensics.capture.node import redact_bug_report

    # GIVEN a 100 KB gzip stream that expands to 200 MB of zeros with no line end (a bomb), and a broken stream
    bomb = tmp_path / "bomb.gz"
    with gzip.open(bomb, "wb") as f:
        for _ in range(200):
            f.write(bytes(1 << 20))
    broken = tmp_path / "broken.gz"
    whole = gzip.compress(b"".join(b"x=1 token ghp_0123456789abcdefghijABCDEFGHIJ012345 line %d\n" % i
                                   for i in range(50000)))
    broken.write_bytes(whole[: len(whole) // 2])
    # WHEN each is redacted under a 4 MiB bound
    t0 = time.monotonic()
    note = redact_bug_report(str(bomb), str(tmp_path / "a.gz"), max_text=4 << 20)
    took = time.monotonic() - t0
    broken_note = redact_bug_report(str(broken), str(tmp_path / "b.gz"))
    # THEN the bomb stops at the bound and says what it dropped; the broken stream keeps its masked beginning
    assert "only its first 4194304 bytes are kept" in note and took < 60
    assert len(gzip.decompress((tmp_path / "a.gz").read_bytes())) == 4 << 20
    assert "its stream breaks after" in broken_note
    kept = gzip.decompress((tmp_path / "b.gz").read_bytes())
    assert kept.startswith(b"x=1 token [REDACTED]") and b"ghp_" not in kept
    assert not bomb.exists() and not broken.exists()  # the unmasked inputs are removed


def test_nvidia_bug_report_is_bounded_in_time_and_size(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    # GIVEN a bug report that hangs (a child keeps running, as a stuck query would)
    stall = f"sleep 600.{os.getpid()}{uuid.uuid4().int % 10**6}"  # this test's own: other sessions run it too
    fake_bug_report(tmp_path / "bin", f'{stall} &\n{stall}\n')
    t0 = time.monotonic()
    kept, note = run_nvidia_bug_report(str(tmp_path / "a"), timeout=1)
    # THEN it is killed with its children at the limit, and nothing is kept
    assert time.monotonic() - t0 < 10 and kept is None and "did not finish in 1 s (killed)" in note
    assert subprocess.run(["pgrep", "-f", stall], capture_output=True).stdout == b""
    # GIVEN one whose report is over the size limit THEN it is not kept
    fake_bug_report(tmp_path / "bin", 'while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; shift; done\n'
                                      'head -c 5000 /dev/urandom > "$out.gz"\n')
    kept, note = run_nvidia_bug_report(str(tmp_path / "b"), max_bytes=4096)
    assert kept is None and "over the 4096 byte limit" in note
    assert list((tmp_path / "b").iterdir()) == []


SMI_Q = """==============NVSMI LOG==============

Driver Version                            : 580.126.09
CUDA Version                              : 13.0

Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H20
    VBIOS Version                         : 96.00.A5.00.01
    Persistence Mode                      : Enabled
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Fabric
        State                             : Completed
        Status                            : Success
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H20
    VBIOS Version                         : 96.00.A5.00.01
    Persistence Mode                      : Enabled
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Fabric
        State                             : Completed
        Status                            : Success
"""


def test_the_nvidia_report_reads_the_bug_report_a_capture_kept(rooted, tmp_path, monkeypatch):
    # GIVEN a node whose nvidia-bug-report.sh writes nvidia-smi -q and an Xid line (and 2 MB more), no nvidia-smi
    (tmp_path / "smi.txt").write_text(SMI_Q)
    script = (f'while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; shift; done\n'
              f'{{ cat {tmp_path / "smi.txt"}; '
              'echo "[ 12.3] NVRM: Xid (PCI:0000:2a:00): 79, pid=9, GPU has fallen off the bus.";'
              f' head -c 2000000 /dev/zero | tr "\\\\0" "x"; }} | gzip > "$out.gz"\n')
    fake_bug_report(tmp_path / "bin", script)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    # WHEN the process is captured and an NVIDIA report made from the bundle
    bundle = capture(rooted.pid, tmp_path)
    assert (bundle / "30-kernel" / "nvidia-bug-report.log.gz").is_file()
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, ["report", "--json", "--template", "nvml", str(bundle)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    took = time.monotonic() - t0
    body = json.loads(r.stdout)["report"]["body"].replace("\\", "")
    # THEN the system facts NVIDIA asks for come from it, and the report says where the file is
    system = body.split("## System information", 1)[1]
    assert "| PCI bus ids | 00000000:18:00.0, 00000000:2A:00.0 |" in system
    assert "| VBIOS | 96.00.A5.00.01 |" in system and "| Persistence mode | Enabled |" in system
    assert "| MIG mode | Disabled |" in system and "| Fabric Manager state | Completed |" in system
    xid = next(line for line in system.splitlines() if line.startswith("| Xid summary |"))
    assert "Xid 79 on 0000:2a:00: 1 time" in xid
    assert ("nvidia-bug-report.log.gz is in the capture bundle (NVIDIA's own file, its secrets masked at capture"
            in system)
    assert took < 60, took  # 2 MB of bug report read and masked within reason
