"""forensics.subproc.run_bounded on real programs: what they write is read as they write it, and a program
that writes without end, keeps its pipes or never exits is stopped by a bound, its whole process group
with it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from forensics.subproc import OutputTooLarge, run_bounded


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie its parent has not reaped is gone too
        return f.read().rpartition(")")[2].split()[0] == "Z"


def test_output_exit_status_and_input_pass_through_whole():
    # GIVEN 4 MiB on standard input, more than any pipe holds, so writing and reading must interleave
    data = "".join(f"{i:07d}\n" for i in range(1 << 19))
    p = run_bounded(["cat"], input=data, timeout=30)
    assert p.returncode == 0 and p.stdout == data and p.stderr == ""
    p = run_bounded(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=30)
    assert (p.returncode, p.stdout, p.stderr) == (7, "out\n", "err\n")


def test_standard_output_past_its_bound_stops_the_program_and_its_children(tmp_path):
    # GIVEN a shell (its session's leader: the session is its pid) with a child writing without end and one asleep
    sid_file = tmp_path / "sid"
    t = time.monotonic()
    with pytest.raises(OutputTooLarge) as e:
        run_bounded(["sh", "-c", f"echo $$ > {sid_file}; yes & sleep 100 & wait"], timeout=60, max_stdout=1 << 20)
    # THEN it stops at the bound, long before the timeout, and says so in one line
    assert time.monotonic() - t < 30 and str(e.value) == "sh wrote more than 1 MiB (stopped)"
    sid = int(sid_file.read_text())

    def left() -> list[int]:
        out = []
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                if os.getsid(pid) == sid and not _gone(pid):
                    out.append(pid)
            except OSError:
                pass
        return out

    deadline = time.monotonic() + 5
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left() == [], "a writer of the killed group is still running"


def test_standard_error_keeps_its_last_bytes():
    # GIVEN a program that writes 5 MB of noise on standard error, then the line that says why it failed
    script = "import sys; sys.stderr.write('x' * 5_000_000); sys.stderr.write('\\nthe reason\\n'); sys.exit(3)"
    p = run_bounded([sys.executable, "-c", script], timeout=60, max_stderr=4096)
    assert p.returncode == 3 and len(p.stderr) == 4096 and p.stderr.endswith("x\nthe reason\n")


def test_a_program_past_its_time_is_killed_with_what_it_wrote():
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_bounded(["sh", "-c", "echo started; exec sleep 100"], timeout=1)
    assert time.monotonic() - t < 10 and e.value.output == "started\n"


def test_a_child_that_keeps_the_pipes_open_is_killed_too():
    # GIVEN a shell that exits at once, leaving a child holding its standard output (subprocess.run would wait)
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_bounded(["sh", "-c", "sleep 100 & echo $!"], timeout=1)
    assert time.monotonic() - t < 10
    pid = int(e.value.output.split()[0])
    deadline = time.monotonic() + 5
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)


def test_a_program_that_closes_its_pipes_and_stays_is_not_waited_for():
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_bounded(["sh", "-c", "exec >&- 2>&-; exec sleep 100"], timeout=1)
    assert time.monotonic() - t < 10


def test_a_missing_program_is_an_oserror():
    with pytest.raises(OSError):
        run_bounded(["/nonexistent/forensics-no-such-tool"], timeout=5)


def test_kubectl_answering_past_its_bound_is_one_line(tmp_path):
    """The real kubectl against the suite's API stand-in, serving a node bigger than the bound asked for."""
    import json

    from forensics.errors import KubeError
    from forensics.kubectl import KubeOptions, get_json
    from tests.kube_standin import StandIn, make_node, write_kubeconfig

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    node = make_node("node-a")
    node["metadata"].setdefault("annotations", {})["big"] = "y" * (3 << 20)
    with StandIn(path_env="/usr/bin:/bin") as api:
        api.nodes["node-a"] = json.dumps(node).encode()
        opts = KubeOptions(kubeconfig=write_kubeconfig(str(tmp_path / "kubeconfig"), api.url))
        assert get_json(opts, "get node", ["get", "node", "node-a"], namespaced=False)["metadata"]["name"] == "node-a"
        with pytest.raises(KubeError) as e:
            get_json(opts, "get node", ["get", "node", "node-a"], namespaced=False, max_bytes=1 << 20)
    assert str(e.value).count("\n") == 0 and "larger than 1 MiB" in str(e.value)


def test_standard_output_into_a_file_and_a_preexec_function(tmp_path):
    # GIVEN the agent's way of running an analysis: its output into a file of ours, its priority set in the child
    out = tmp_path / "out"
    with open(out, "wb") as f:
        p = run_bounded([sys.executable, "-c", "import os, sys; print(os.nice(0), os.getsid(0) == os.getpid()); "
                         "sys.stderr.write('tail')"], timeout=30, stdout=f, preexec_fn=lambda: os.nice(7))
    # THEN what it wrote is in the file (nothing read here), in a session of its own, niced, its stderr kept
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "tail"
    nice, leader = out.read_text().split()
    assert int(nice) >= 7 and leader == "True"
