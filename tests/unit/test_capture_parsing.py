"""Pure parts of capture: cgroup identity, /proc parsers, core_pattern rules, safe paths in a root."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from forensics.capture.identity import parse_cgroup
from forensics.capture.pattern import PAGE_SIZE, expand_pattern, explain_destination, handler_pattern
from forensics.procfs import find_mount, host_path_of_mount, open_in_root
from forensics.errors import ForensicsError, UnsafeContainerPath
from forensics.procfs import parse_limits, parse_maps, parse_mountinfo

CID = "3f" * 32
UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


@pytest.mark.parametrize(
    "text, runtime, version, qos",
    [
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
                     f"/cri-containerd-{CID}.scope\n",
                     "containerd", 2, "burstable", id="v2,systemd,containerd"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
                     "cri-o", 2, "guaranteed", id="v2,systemd,cri-o"),
        pytest.param(f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
                     None, 1, "besteffort", id="v1,cgroupfs"),
        pytest.param(f"4:memory:/kubepods/burstable/pod{UID}/docker-{CID}.scope\n", "docker", 1, "burstable",
                     id="v1,docker-scope"),
    ],
)
def test_pod_and_container_from_cgroup(text, runtime, version, qos):
    ident = parse_cgroup(text)
    assert ident.container_id == CID and ident.pod_uid == UID
    assert ident.runtime == runtime and ident.cgroup_version == version and ident.qos_class == qos


def test_plain_docker_and_no_container():
    ident = parse_cgroup(f"0::/system.slice/docker-{CID}.scope\n")
    assert ident.container_id == CID and ident.runtime == "docker" and ident.pod_uid is None
    assert parse_cgroup(f"5:cpu:/docker/{CID}\n").runtime == "docker"
    none = parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n")
    assert not none.in_container and none.cgroup_path.startswith("/user.slice")


def test_proc_parsers():
    maps = parse_maps("55d0-55d1 r--p 00000000 fd:01 1234 /usr/bin/python3.11\n"
                      "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n")
    assert maps[0].is_file and maps[0].range == "55d0-55d1" and not maps[1].is_file
    limits = parse_limits("Limit                     Soft Limit           Hard Limit           Units     \n"
                          "Max core file size        0                    unlimited            bytes     \n")
    assert limits["Max core file size"] == ("0", "unlimited")


MOUNTINFO = (
    "800 700 0:99 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u\n"
    "801 800 253:1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    " ro,nosuid - ext4 /dev/vda1 rw\n"
    "802 800 253:1 /var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/cores /cores rw - ext4 /dev/vda1 rw\n"
)
HOST = """\
22 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw
"""


def test_bind_source_on_the_host():
    mounts, host = parse_mountinfo(MOUNTINFO), parse_mountinfo(HOST)
    lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    m = find_mount(mounts, lib)
    assert m.mount_id == 801
    assert host_path_of_mount(m, lib, host) == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09"
    core = find_mount(mounts, "/cores/core.1")
    assert host_path_of_mount(core, "/cores/core.1", host) == (
        "/var/lib/kubelet/pods/x/volumes/kubernetes.io~empty-dir/cores/core.1")
    root = find_mount(mounts, "/app/core")
    assert root.mount_point == "/" and host_path_of_mount(root, "/app/core", host) is None


def test_open_in_root_never_leaves_the_root(tmp_path):
    # GIVEN a container root with symlinks planted to the host's files
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("container\n")
    (tmp_path / "secret").write_text("host secret\n")
    os.symlink("/etc/hostname", root / "abs")  # absolute: means the container's /etc/hostname
    os.symlink("../../../../../../secret", root / "up")  # .. stops at the root
    os.symlink(str(tmp_path / "secret"), root / "hostpath")  # a host path: not inside the root
    os.symlink("loop", root / "loop")

    def read(p):
        fd = open_in_root(str(root), p)
        try:
            return os.read(fd, 100)
        finally:
            os.close(fd)

    assert read("/abs") == b"container\n"
    assert read("/etc/../etc/./hostname") == b"container\n"
    with pytest.raises(FileNotFoundError):
        read("/up")  # resolves to <root>/secret, which does not exist
    with pytest.raises(FileNotFoundError):
        read("/hostpath")
    with pytest.raises(UnsafeContainerPath, match="symbolic links"):
        read("/loop")
    with pytest.raises(UnsafeContainerPath, match="not a directory"):
        read("/etc/hostname/x")


def _snap(limit: str, *, cwd="/work", in_ns=False):
    return SimpleNamespace(pid=4242, root="/", comm="python3", cwd=cwd,
                           status={"NSpid": "4242 7", "Uid": "0 0 0 0", "Gid": "0"},
                           limits={"Max core file size": (limit, "unlimited")}, in_container_namespace=in_ns)


def test_pipe_pattern_rules():
    prog = "/usr/bin/true"  # exists on every machine; the rule does not depend on the program
    d = explain_destination(f"|{prog} %P", _snap("0"))
    assert d.kind == "pipe" and d.will_dump  # RLIMIT_CORE is not enforced for a pipe...
    assert not explain_destination(f"|{prog} %P", _snap("1")).will_dump  # ...except a limit of exactly 1
    ours = explain_destination("|/opt/x/forensics core-handler /c %P %I %s %t %c", _snap("0"))
    assert ours.handler_is_forensics and any("metadata only" in r for r in ours.reasons)
    assert not ours.will_dump  # /opt/x/forensics does not exist here
    d = explain_destination("|/nonexistent/handler", _snap("unlimited"))
    assert not d.will_dump and "does not exist" in d.describe()


def test_file_pattern_rules():
    d = explain_destination("core", _snap("0", cwd="/"), core_uses_pid=1)
    assert not d.will_dump and d.path_in_process == "/core.7"  # %p is the PID in its namespace
    assert any("below one page" in r for r in d.reasons)
    d = explain_destination("/tmp/core.%e.%p", _snap(str(PAGE_SIZE * 4), cwd="/"), core_uses_pid=1)
    assert d.will_dump and d.path_in_process == "/tmp/core.python3.7" and any("cut there" in r for r in d.reasons)
    assert expand_pattern("%%-%h-%p", {"p": "1"}) == "%-%h-1"


def test_handler_pattern_fits_128_bytes():
    assert handler_pattern("/var/lib/forensics/cores", "/usr/local/bin/forensics").endswith(
        "%P %i %s %t %c".replace("%i", "%I"))
    with pytest.raises(ForensicsError, match="128"):
        handler_pattern("/" + "x" * 100, "/usr/local/bin/forensics")


def test_a_core_deleted_for_the_budget_is_told_even_when_its_record_cannot_say_it(tmp_path):
    from forensics.bundle.record import BudgetEvent, CoreState, IndexEntry
    from forensics.capture.budget import append_index, enforce_budget, read_index

    # GIVEN two cores of one crash loop, the older with a record that cannot be rewritten
    for cid, meta in (("old", "{not json"), ("new", json.dumps({"core": {"state": "kept", "file": "core.zst"}}))):
        d = tmp_path / "crashes" / cid
        (d / "50-core").mkdir(parents=True)
        (d / "50-core/core.zst").write_bytes(os.urandom(1 << 20))
        (d / "metadata.json").write_text(meta)
        append_index(str(tmp_path), IndexEntry(id=cid, time=None, pid=None, signal=None, key=None, crash_loop_key="k",
                                               core="core.zst", state=CoreState.KEPT))
    # WHEN the budget leaves room for one core
    deleted = enforce_budget(str(tmp_path), 3 << 19)
    # THEN the older core went, and the index says its record still claims it
    assert deleted == ["old"] and not (tmp_path / "crashes/old/50-core/core.zst").exists()
    event = read_index(str(tmp_path))[-1]
    assert isinstance(event, BudgetEvent) and event.records_not_updated == ("old",)


def test_a_core_the_budget_cannot_delete_is_told_in_the_index(tmp_path):
    from forensics.bundle.record import BudgetEvent, CoreState, IndexEntry
    from forensics.capture.budget import append_index, enforce_budget, read_index

    # GIVEN two cores of one crash loop, the older one a directory where its file should be (unlink fails,
    # even for root)
    for cid in ("old", "new"):
        d = tmp_path / "crashes" / cid
        (d / "50-core").mkdir(parents=True)
        (d / "metadata.json").write_text(json.dumps({"core": {"state": "kept", "file": "core.zst"}}))
        append_index(str(tmp_path), IndexEntry(id=cid, time=None, pid=None, signal=None, key=None, crash_loop_key="k",
                                               core="core.zst", state=CoreState.KEPT))
    (tmp_path / "crashes/old/50-core/core.zst").mkdir()
    (tmp_path / "crashes/old/50-core/core.zst/x").write_bytes(os.urandom(1 << 20))
    (tmp_path / "crashes/new/50-core/core.zst").write_bytes(os.urandom(1 << 20))
    # WHEN the budget leaves room for one core
    deleted = enforce_budget(str(tmp_path), 3 << 19)
    # THEN nothing was deleted, and the index says which core stays and why
    assert deleted == []
    event = read_index(str(tmp_path))[-1]
    assert isinstance(event, BudgetEvent) and event.not_deleted == ("old: Is a directory",)


def test_an_unreadable_handler_state_is_an_error_not_an_empty_one(tmp_path):
    from forensics.capture.pattern import HANDLER_STATE, uninstall_handler
    from forensics.errors import CoreDirectoryError

    if os.geteuid() != 0:
        pytest.skip("uninstall_handler needs root")
    # GIVEN a state file cut short (it records the core_pattern to restore); the kernel's file is a copy here
    (tmp_path / HANDLER_STATE).write_text('{"previous_pattern": "co')
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/core_pattern").write_text("|/x core-handler\n")
    # WHEN the handler is uninstalled THEN it stops with the file named, and nothing was written
    with pytest.raises(CoreDirectoryError, match="cannot be read"):
        uninstall_handler(str(tmp_path), proc=str(proc))
    assert (proc / "sys/kernel/core_pattern").read_text() == "|/x core-handler\n"


def test_a_pods_processes_and_shims_are_found_in_one_walk_of_proc(tmp_path):
    """capture of a pod whose container is not running listed /proc twice (its processes by cgroup, then its
    runtime shims by command line); one walk finds both, each process's files read once."""
    import ctypes
    import struct

    from forensics.capture.node import find_pod_pids, find_pod_shims, scan_pod

    other_uid = "11111111-2222-3333-4444-555555555555"
    sandbox, app, foreign = "ab" * 32, "cd" * 32, "ef" * 32
    pod_slice = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    procs = {
        10: (f"0::{pod_slice}/cri-containerd-{sandbox}.scope\n", b"/pause\0"),
        12: (f"0::{pod_slice}/cri-containerd-{app}.scope\n", b"python3\0exporter.py\0"),
        20: ("0::/system.slice/containerd.service\n",
             b"/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0" + sandbox.encode() + b"\0"),
        21: ("0::/system.slice/containerd.service\n",
             b"/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0" + foreign.encode() + b"\0"),
        22: ("0::/system.slice/other.service\n", b"/bin/sleep\0-id\0" + sandbox.encode() + b"\0"),  # not a shim
        30: (f"0::/kubepods.slice/kubepods-pod{other_uid.replace('-', '_')}.slice/cri-containerd-{foreign}.scope\n",
             b"/pause\0"),
    }
    proc = tmp_path / "proc"
    for pid, (cgroup, cmdline) in procs.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup)
        (proc / str(pid) / "cmdline").write_bytes(cmdline)
    (proc / "self").mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert watch >= 0 and libc.inotify_add_watch(watch, os.fsencode(proc), 0x20) >= 0  # IN_OPEN: the listings
    try:
        members, shims = scan_pod(UID, str(proc))
        events = os.read(watch, 65536)
    finally:
        os.close(watch)
    # THEN /proc was listed once, and what the two walks found is what this one found
    masks = [struct.unpack_from("iIII", events, at)[1] for at in range(0, len(events), 16)]
    assert masks == [0x20 | 0x40000000]  # IN_OPEN | IN_ISDIR of the directory itself, once
    assert [(pid, i.container_id) for pid, i in members] == [(10, sandbox), (12, app)]
    assert shims == [20]
    assert [pid for pid, _ in members] == find_pod_pids(UID, str(proc))
    assert shims == find_pod_shims([sandbox, app], str(proc))


def _rchar() -> int:
    """Bytes this process has read (``/proc/self/io``: every read and pread, counted by the kernel)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_the_crash_loop_decision_reads_only_the_index_tail(tmp_path):
    """The crash-loop limit is decided while the dying process waits; the index keeps a line per crash for ever
    (a 12,000-crash loop is 6 MB, 100 ms to parse whole): only its tail back to the window is read."""
    from forensics.capture.budget import INDEX_SLACK, INDEX_TAIL_MAX, read_index, read_index_since

    now = 1_800_000_000.0
    since = now - 3600

    def entry(i: int, t: float) -> str:
        return json.dumps({"id": f"c{i}", "time": t, "signal": 11, "key": "img", "core": "core.zst",
                           "reasons": ["x" * 300]}) + "\n"

    # GIVEN 50,000 crashes older than the window, then three in it, then a line torn by a killed handler
    old = "".join(entry(i, since - INDEX_SLACK - 60 - i) for i in range(50_000))
    recent = "".join(entry(50_000 + i, now - 100 + i) for i in range(3))
    (tmp_path / "index.jsonl").write_text(old + recent + '{"id": "torn", "ti')
    before = _rchar()
    got = read_index_since(str(tmp_path), since)
    cost = _rchar() - before
    # THEN the three are read, newest first, and about a MiB of the 20 MB, not the whole
    assert [e.id for e in got] == ["c50002", "c50001", "c50000"]
    assert cost <= 2 << 20 < len(old), cost
    assert len(read_index(str(tmp_path))) == 50_003  # (the whole, for the budget, still reads every entry)
    # and an index whose start is damage (a 1 GiB hole of zeros) is read at most INDEX_TAIL_MAX back
    with open(tmp_path / "index.jsonl", "wb") as f:
        f.truncate(1 << 30)
        f.seek(1 << 30)
        f.write(recent.encode())
    before = _rchar()
    assert [e.id for e in read_index_since(str(tmp_path), since)] == ["c50002", "c50001", "c50000"]
    assert _rchar() - before <= INDEX_TAIL_MAX + (1 << 20)


def test_the_mount_index_answers_as_the_mount_scan_does():
    """The snapshot finds each mapped object's mount through an index (a process fills its own mountinfo: a
    scan of every mount for every object was unbounded work while the kernel waited); same answers."""
    from forensics.procfs import MountIndex

    def line(mid: int, point: str, root: str = "/", dev: str = "0:50") -> str:
        return f"{mid} 1 {dev} {root} {point} rw,relatime shared:1 - tmpfs t rw\n"

    with open("/proc/self/mountinfo") as f:
        real = f.read()
    with open("/proc/1/mountinfo") as f:
        host = parse_mountinfo(f.read())
    # this machine's mounts, then two stacked on one point (the last wins), a bind of a subtree, a trailing slash
    mounts = parse_mountinfo(real + line(9001, "/srv/x") + line(9002, "/srv/x", dev="0:51")
                             + line(9003, "/srv/x/y/", root="/sub") + line(9004, "/srvx"))
    paths = [m.mount_point for m in mounts] + [m.mount_point.rstrip("/") + "/lib/libc.so.6" for m in mounts]
    with open("/proc/self/maps") as f:
        paths += [p.path for p in parse_maps(f.read()) if p.path and p.path.startswith("/")]
    paths += ["/", "/srv/x/z", "/srv/x/y", "/srv/x/y/lib.so", "/srvx/a", "/srv/xa", "/nonexistent/dir/f"]
    index = MountIndex(mounts, host)
    for p in paths:
        m = find_mount(mounts, p)
        assert index.find(p) == m, p
        if m is not None:
            assert index.host_path(m, p) == host_path_of_mount(m, p, host), p
    assert index.find("/srv/x/z").mount_id == 9002 and index.find("/srv/x/y/a").mount_id == 9003


def test_the_one_proc_reader_keeps_every_byte_and_capture_still_records_u_fffd():
    # GIVEN a real process whose argv, environment and a mapped file's name hold a byte that is not UTF-8
    import subprocess
    import sys
    import tempfile

    from forensics.capture.node import process_secrets
    from forensics.imports.procfs import read_process
    from forensics.procfs import for_people, parse_cmdline, parse_environ, read_proc_text

    with tempfile.TemporaryDirectory() as d:
        so = os.path.join(os.fsencode(d), b"_x\xff.cpython-311-x86_64-linux-gnu.so")
        with open(so, "wb") as f:
            f.write(b"\0" * 4096)
        code = ("import mmap, sys, os; f = open(os.fsencode(sys.argv[1]), 'rb')\n"
                "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); print(flush=True); sys.stdin.read()")
        p = subprocess.Popen([sys.executable, "-c", code, os.fsdecode(so), b"tok\xff"],
                             env={**os.environ, "WEIRD": "v\udcff"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert p.stdout is not None and p.stdout.readline() == b"\n"
            # WHEN both readers read it
            argv = parse_cmdline(read_proc_text(p.pid, "cmdline", binary=True))
            env = parse_environ(read_proc_text(p.pid, "environ", binary=True))
            view = read_process(p.pid)
        finally:
            p.communicate(b"")
    # THEN the reader kept each byte (a path read opens the same file), the same for verify-imports' view...
    assert argv[-1] == "tok\udcff" and env["WEIRD"] == "v\udcff"
    assert view.argv == argv and ("WEIRD", "v\udcff") in view.env
    assert [os.fsencode(e) for e in view.extensions if "_x" in e] == [so]
    # ...and the bundle's record still shows such a byte as U+FFFD, as before
    assert for_people(argv[-1]) == "tok\ufffd"
    assert process_secrets(b"app\0--token\0s\xffcretvalue123\0", b"DB_PASSWORD=hunter\xff2secret\0") \
        == frozenset({"s\ufffdcretvalue123", "hunter\ufffd2secret"})
