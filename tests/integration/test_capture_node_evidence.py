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
    assert kept == str(out / "nvidia-bug-report.log.gz") and "report kept" in note
    assert gzip.decompress(Path(kept).read_bytes()).startswith(b"safe=1 ")
    assert sorted(p.name for p in out.iterdir()) == ["nvidia-bug-report.log.gz"]  # no work directory left


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
    fake_bug_report(tmp_path / "bin", f'while [ $# -gt 0 ]; do [ "$1" = --output-file ] && out=$2; shift; done\n'
                                      f'{{ cat {tmp_path / "smi.txt"}; echo "[ 12.3] NVRM: Xid (PCI:0000:2a:00): 79, pid=9, GPU has fallen off the bus.";'
                                      f' head -c 2000000 /dev/zero | tr "\\\\0" "x"; }} | gzip > "$out.gz"\n')
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
    assert "nvidia-bug-report.log.gz is in the capture bundle" in system
    assert took < 60, took  # 2 MB of bug report read and masked within reason
