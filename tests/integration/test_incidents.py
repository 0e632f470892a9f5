"""One incident of each class, made with real processes, reported end to end (issue #26).

Each incident is what a user hands to ``forensics report``: the core of a process that really crashed (the
real nvitop-exporter or the Python reproducer on the simulated NVML, a program with its own ctypes bug, a
native library's segfault), analysed; the reproducers' runs; verify-imports of a live process with the same
install.  The tests read every report the way its reader would: the incident's class, each title, who gets
which report, the asks, no sentence the class does not hold for, every claim carried by an evidence item
(``--explain``), ``report --check`` clean, each report under 20,000 characters, and every command the
report prints (nvml, binding, nvitop, runbook: every fenced shell block) run exactly as printed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK, BuildError
from forensics.report import split_front_matter
from forensics.simnvml import build_simnvml, ensure_stack_venv, find_reproducers, seed_binding_fault, sim_environment
from tests.conftest import PYTHONS
from tests.crashers.make_core import HERE as CRASHERS
from tests.crashers.make_core import crash_for_core, make_core

TEMPLATES = ("nvml", "binding", "nvitop", "runbook")
REPRO_PY = find_reproducers() / "nvml_nvlink_fieldvalues.py"
FORENSICS = str(Path(sys.executable).with_name("forensics"))


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> Path:
    return build_simnvml(tmp_path_factory.mktemp("incident-sim"))


def stack_copy(name: str, into: Path) -> Path:
    """A private copy of a cached stack venv (its interpreter): what a runbook step writes into stays here."""
    try:
        python = ensure_stack_venv(name)
    except BuildError as e:
        pytest.skip(f"stack {name} unavailable: {e}")
    root = into / f"venv-{name}"
    shutil.copytree(Path(python).parent.parent, root, symlinks=True)
    return root / "bin" / "python"


def analyze(core: Path, out: Path) -> Path:
    r = run("analyze", "--json", "-o", out, core)
    assert r.exit_code in (EXIT_OK, 4), r.stderr
    return out


def reproduce(tmp: Path, *args: str) -> Path:
    work = tmp / "repro"
    work.mkdir()
    r = run("reproduce", "--json", "--sim", "--iterations", "20", "--workdir", work, *args)
    assert r.exit_code in (EXIT_OK, EXIT_FINDINGS), r.stderr
    out = tmp / "reproduce.json"
    out.write_text(r.stdout)
    return out


def verify_imports(python: Path, tmp: Path, cwd: Path | None = None) -> Path:
    """verify-imports --pid of a live process of ``python`` that imported the stack (from ``cwd``)."""
    out = tmp / "verify-imports.json"
    sleeper = subprocess.Popen([str(python), "-c", "import nvitop, nvitop_exporter, pynvml, sys, time; "
                                "print('ready', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert sleeper.stdout.readline() == "ready\n"
        r = run("verify-imports", "--json", "--pid", sleeper.pid, "-o", out)
        assert r.exit_code in (EXIT_OK, EXIT_FINDINGS), r.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    return out


def exporter_core(python: Path, env: dict[str, str], run_dir: Path) -> Path:
    run_dir.mkdir(exist_ok=True)
    argv = [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "0", "--interval", "0.25"]
    return crash_for_core(argv, run_dir, env=env, timeout=120)


class Reports:
    """Every template's report of one incident, as ``report --json`` gives it and as ``report -o`` writes it."""

    def __init__(self, evidence: list[Path], tmp: Path):
        self.doc: dict[str, dict] = {}
        self.meta: dict[str, dict] = {}
        self.files: dict[str, Path] = {}
        for t in TEMPLATES:
            r = run("report", "--json", "--template", t, *evidence)
            assert r.exit_code == EXIT_OK, r.stderr
            self.doc[t] = json.loads(r.stdout)["report"]
            self.meta[t] = split_front_matter(self.doc[t]["markdown"])[0]
            self.files[t] = tmp / f"report-{t}.md"
            r = run("report", "--template", t, "-o", self.files[t], *evidence)
            assert r.exit_code == EXIT_OK, r.stderr
        self.conclusion = self.doc["runbook"]["conclusion"]
        self.explain = self.conclusion["explain"]

    def title(self, t: str) -> str:
        return self.meta[t]["title"]

    def text(self, t: str) -> str:
        return self.doc[t]["markdown"] + "".join(self.doc[t]["attachments"].values())

    def commands(self) -> list[str]:
        """The commands the runbook's "Do now" steps print (its fenced bash blocks)."""
        body = self.doc["runbook"]["body"].split("## Do now", 1)[1].split("\n## ", 1)[0]
        return [line.strip() for block in re.findall(r"```bash\n(.*?)```", body, re.S)
                for line in block.splitlines() if line.strip()]


def check_every_report(rep: Reports, incident: str) -> None:
    for t in TEMPLATES:
        c = rep.doc[t]["conclusion"]
        # the class is decided once: the same in every report, and in the front matter
        assert c["incident"] == incident and rep.meta[t]["conclusion"] == incident
        # every claim rests on evidence items, and --check (here and on the written file) finds nothing
        assert c["explain"]["unsupported_claims"] == [] and all(cl["evidence"] for cl in c["explain"]["claims"])
        # (a field the evidence cannot fill -- no capture here, so no OS -- is named by --check, nothing else)
        problems = [p for p in rep.doc[t]["problems"] if not p.startswith("required field")]
        assert problems == [], (t, problems)
        r = run("report", "--check", rep.files[t])
        assert r.exit_code == EXIT_OK, r.stdout
        assert len(rep.files[t].read_text()) < 20_000
        assert "\\" not in rep.title(t) and "\n" not in rep.title(t)
    # an issue never asks its own project to upgrade itself
    assert not re.search(r"upgrade nvitop", rep.doc["nvitop"]["markdown"], re.I)
    # the upstream reports that are not for this incident say so in their title, and are not to be filed now
    routed = {f["report"] for f in rep.conclusion["filings"]}
    for t in ("nvml", "binding", "nvitop"):
        if t not in routed:
            assert re.match(r"(\[BUG\] )?not for ", rep.title(t)), rep.title(t)
            assert rep.meta[t]["when"].startswith("not now")


def run_printed(commands: list[str], cwd: Path, env: dict[str, str] | None = None,
                python: Path | None = None) -> list[subprocess.CompletedProcess]:
    """Each command exactly as printed, by a shell, with this checkout's forensics first on PATH (and the
    stack's python3 and pip before it, when given: the image's environment the report speaks of)."""
    path = str(Path(FORENSICS).parent) + os.pathsep + os.environ.get("PATH", "")
    if python is not None:
        path = str(python.parent) + os.pathsep + path
    env = dict(env if env is not None else os.environ, PATH=path)
    return [subprocess.run(["bash", "-c", c], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            for c in commands]


def fenced_commands(markdown: str) -> list[str]:
    """Every line of every fenced shell block of a report (the runbook's are indented under their list item:
    Markdown's indentation, not the command's), as printed."""
    return [line.strip() for block in re.findall(r"^ *(`{3,})(?:bash|sh|shell|console)\n(.*?)^ *\1 *$", markdown,
                                                 re.S | re.M)
            for line in block[1].splitlines() if line.strip()]


def _expected(command: str) -> int:
    """What a printed command exits with: a reproducer line says what it did in its comment (``# crashed
    (SIGABRT)`` dies of that signal, ``# clean`` exits 0); anything else (pip, gcc, forensics guard) succeeds."""
    outcome = command.rsplit("   # ", 1)[1] if "   # " in command else ""
    if outcome.startswith("crashed ("):
        return -signal.Signals[outcome.removeprefix("crashed (").split(")")[0]].value
    assert outcome in ("", "clean", "for the Python reproducer"), f"an outcome this test does not know: {command}"
    return 0


def run_every_command(rep: Reports, sim: Path | None, python: Path, *, fault: str = "none",
                      exits: dict[str, int] | None = None, fault_thread: str = "any") -> dict[str, list[int]]:
    """Every fenced shell command of every report (nvml, binding, nvitop, runbook), run exactly as printed: an
    upstream report's beside its attachments (its Steps to reproduce run the attached reproducers) on a node with
    the incident's fault (the simulated driver on the library path, ``fault`` as the reproducers ran with), with
    the stack's python3 and pip first on PATH; the runbook's from a scratch directory, the runbook last (its steps
    change the environment: they are the fix).  Each exits as :func:`_expected` (or ``exits``) says.

    No report prints a command that needs a GPU node or a cluster (kubectl): every one runs here.

    :return: each command's exit statuses, in the order run
    """
    env = sim_environment(sim, fault=fault, fault_thread=fault_thread) if sim is not None else dict(os.environ)
    scratch = rep.files["runbook"].with_name("runbook-scratch")
    scratch.mkdir(exist_ok=True)
    ran: dict[str, list[int]] = {}
    for t in TEMPLATES:  # the runbook last
        commands = fenced_commands(rep.doc[t]["markdown"])
        files = rep.files[t].with_name(f"report-{t}.files")
        cwd = files if files.is_dir() else scratch
        for c, done in zip(commands, run_printed(commands, cwd, env, python), strict=True):
            want = (exits or {}).get(c, _expected(c))
            assert done.returncode == want, (t, c, done.returncode, done.stdout[-1000:], done.stderr[-1000:])
            ran.setdefault(c, []).append(done.returncode)
    return ran


# ---- the classes --------------------------------------------------------------------------------------------

def test_driver_fault(sim, tmp_path, core_pattern):
    # GIVEN the real nvitop-exporter 1.5.0 killed by the driver overflowing a buffer of its own inside
    # nvmlDeviceGetFieldValues, the C reproducer crashing too, and verify-imports of the same install
    python = stack_copy("incident", tmp_path)
    core = exporter_core(python, sim_environment(sim, fault="heap", fault_after=2), tmp_path / "exporter")
    evidence = [analyze(core, tmp_path / "analysis.json"),
                reproduce(tmp_path, "--sim-fault", "heap", "--stack", "incident"),
                verify_imports(python, tmp_path)]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "driver-fault")
    # THEN NVIDIA's driver report goes first, nvitop's second (its NVLink query is the call that can be avoided)
    assert [(f["order"], f["report"]) for f in rep.conclusion["filings"]] == [(1, "nvml"), (2, "nvitop")]
    assert "nvmlDeviceGetFieldValues (NVLink throughput" in rep.title("nvml")
    assert "corrupts the heap" in rep.title("nvml") and "driver 580.126.09" in rep.title("nvml")
    assert rep.title("nvitop").startswith("[BUG] nvitop-exporter 1.5.0 crashes in nvmlDeviceGetFieldValues")
    assert rep.title("nvitop").endswith("in C too: please allow turning NVLink metrics off")
    assert "What we ask of nvitop: nvitop cannot fix the driver" in rep.doc["nvitop"]["markdown"]
    assert rep.title("binding").startswith("not for nvidia-ml-py (a fault of the NVIDIA driver library")
    assert ("**What we ask:** Please fix nvmlDeviceGetFieldValues in driver 580.126.09: file first: the driver crashes"
            not in rep.doc["nvml"]["body"])  # the ask is worded for NVIDIA, not as our filing note
    assert "**What we ask:** Please fix nvmlDeviceGetFieldValues in driver 580.126.09: the driver crashes in the C " \
           "reproducer; the C reproducer attached shows it without Python or nvidia-ml-py." in rep.doc["nvml"]["body"]
    # and the runbook's first step is the guard, into the site-packages nvitop is installed in; it works as printed
    site = python.parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"), site)
    (cmd,) = rep.commands()
    assert cmd == ("forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --out "
                   f"{site}")
    steps = [s["text"] for s in rep.explain["steps"]]
    assert any(s.startswith("Move the affected node groups to a driver branch") for s in steps)
    # and NVIDIA's Steps to reproduce (printed by the nvitop issue too) name the binding the Python reproducer needs
    block = rep.doc["nvml"]["body"].split("## Steps to reproduce", 1)[1]
    lines = [x for x in re.search(r"```bash\n(.*?)```", block, re.S).group(1).splitlines() if x.strip()]
    assert lines[0] == "pip install nvidia-ml-py==12.575.51   # for the Python reproducer"
    assert set(lines) <= set(fenced_commands(rep.doc["nvitop"]["markdown"]))
    # and every command of every report runs as printed: pip and gcc succeed, both reproducers die of SIGABRT as
    # the report says they did (on a node with the fault), and the guard is written where nvitop is installed
    ran = run_every_command(rep, sim, python, fault="heap")
    assert [ran[x][0] for x in lines] == [0, -6, 0, -6, -6]  # the C reproducer from threads, then from main: both crash
    assert "The fault fires in calls from the main thread too: the C reproducer crashed (SIGABRT) from 2 worker " \
           "threads (--threads 2) and crashed (SIGABRT) making the same calls from the main thread (--threads 0)." \
           in rep.conclusion["statement"]
    assert all(len(ran[x]) >= 2 for x in lines)  # run from the NVIDIA report and from the nvitop issue alike
    assert ran[cmd] == [0] and list(site.glob("*guard*.pth"))


COLLECTOR = """
import time
from concurrent.futures import ThreadPoolExecutor
from nvitop import Device
devices = Device.all()
with ThreadPoolExecutor(max_workers=2) as pool:
    while True:
        list(pool.map(lambda device: device.nvlink_throughput(), devices))
        time.sleep(0.1)
"""


def python_blocks(markdown: str) -> list[str]:
    """Every fenced Python block of a report, as printed."""
    return [m.group(2) for m in re.finditer(r"^(`{3,})python\n(.*?)^\1 *$", markdown, re.S | re.M)]


def test_a_driver_fault_only_off_the_main_thread(sim, tmp_path, core_pattern):
    # GIVEN a collector calling nvitop's nvlink_throughput() from a ThreadPoolExecutor, killed by a driver fault that
    # fires only in calls from threads other than the main one; the reproducers on the same node (both crash from
    # worker threads; the C one is run again from the main thread: clean)
    python = stack_copy("incident", tmp_path)
    (tmp_path / "collector.py").write_text(COLLECTOR)
    (tmp_path / "run").mkdir()
    env = sim_environment(sim, fault="heap", fault_after=2, fault_thread="non-main")
    core = crash_for_core([str(python), str(tmp_path / "collector.py")], tmp_path / "run", env=env, timeout=120)
    evidence = [analyze(core, tmp_path / "analysis.json"),
                reproduce(tmp_path, "--sim-fault", "heap", "--sim-fault-thread", "non-main", "--stack", "incident")]
    doc = json.loads(evidence[1].read_text())
    assert doc["main_thread"]["status"] == "clean" and doc["main_thread"]["thread_only"] is True
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "driver-fault")
    assert [(f["order"], f["report"]) for f in rep.conclusion["filings"]] == [(1, "nvml"), (2, "nvitop")]
    assert rep.title("nvml").startswith("nvmlDeviceGetFieldValues (NVLink throughput")
    # THEN NVIDIA's report says where it fires, in one sentence with both runs' results
    body = rep.doc["nvml"]["body"]
    assert ("The fault fires only in calls from threads other than the main one: the C reproducer crashed (SIGABRT) "
            "from 2 worker threads (--threads 2) and ran clean making the same calls from the main thread (--threads "
            "0).") in body.replace("\\", ""), body[:3000]
    # and its Steps to reproduce run the C reproducer both ways, as printed: from threads it crashes, from the main
    # thread it runs clean
    c_lines = [c for c in fenced_commands(body) if c.startswith("./nvml_nvlink_fieldvalues")]
    assert [c.split("   # ")[1] for c in c_lines] == ["crashed (SIGABRT)", "clean"]
    assert "--threads 2" in c_lines[0] and "--threads 0" in c_lines[1]
    ran = run_every_command(rep, sim, python, fault="heap", fault_thread="non-main")
    assert [ran[c][0] for c in c_lines] == [-signal.SIGABRT, 0]
    # and nvitop's issue's snippets, built from the evidence: the calls from an executor's worker threads (what
    # crashed), then the same from the main thread; run exactly as printed on the faulty driver, the first crashes
    # and the second runs clean
    first, second = python_blocks(rep.doc["nvitop"]["body"])
    assert "ThreadPoolExecutor" in first and "ThreadPoolExecutor" not in second
    for i, code in enumerate((first, second)):
        (tmp_path / f"snippet{i}.py").write_text(code)
    run_env = dict(sim_environment(sim, fault="heap", fault_after=2, fault_thread="non-main"),
                   PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    crashed = subprocess.run(["python3", "snippet0.py"], cwd=tmp_path, env=run_env, capture_output=True, timeout=120)
    assert crashed.returncode == -signal.SIGABRT, crashed.stderr[-2000:]
    clean = subprocess.Popen(["python3", "snippet1.py"], cwd=tmp_path, env=run_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # still querying after 8 s: clean
            clean.wait(timeout=8)
    finally:
        clean.kill()
        clean.wait()


def test_binding_fault(sim, tmp_path, core_pattern):
    # GIVEN nvidia-ml-py passing count=37 for its 36-entry array (the binding's bug, seeded into the real
    # binding's code) in the Python reproducer; the reproducers with the unseeded binding run clean
    python = stack_copy("incident", tmp_path)
    seeded = seed_binding_fault(python, tmp_path / "binding", 1)
    env = sim_environment(sim, fault="none", detect="call", fault_after=2)
    env["PYTHONPATH"] = str(seeded)
    (tmp_path / "run").mkdir()
    core = crash_for_core([str(python), str(REPRO_PY), "--threads", "1", "--iterations", "20"], tmp_path / "run",
                          env=env, timeout=120)
    evidence = [analyze(core, tmp_path / "analysis.json"), reproduce(tmp_path, "--stack", "incident")]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "binding-fault")
    # THEN the binding report goes to NVIDIA as nvidia-ml-py's maintainer; not the driver report, not nvitop
    assert [(f["order"], f["report"]) for f in rep.conclusion["filings"]] == [(1, "binding")]
    assert "nvidia-ml-py" in rep.meta["binding"]["file-at"]
    assert rep.title("binding").startswith("nvidia-ml-py 12.575.51 passes a count larger than its buffer to "
                                           "nvmlDeviceGetFieldValues")
    assert rep.title("nvml").startswith("not for the NVIDIA driver (a fault of the binding")
    assert "corrupts the heap" not in rep.title("nvml")
    assert "**What we ask:** Please fix nvidia-ml-py 12.575.51: " in rep.doc["binding"]["body"]
    assert "What we ask" not in rep.doc["nvml"]["body"]
    assert rep.conclusion["statement"].startswith("The core's heap points at the binding, nvidia-ml-py 12.575.51, "
                                                  "not the driver")
    # and the runbook pins the binding; it neither moves driver branches nor guards nvitop
    steps = " ".join(s["text"] for s in rep.explain["steps"])
    assert "Pin the binding in the image's requirements to `nvidia-ml-py!=12.575.51`" in steps
    assert "driver branch" not in steps
    # the pin is a command that installs it into the image's environment, and one that proves it took
    pin, prove = rep.commands()
    assert pin == "python3 -m pip install 'nvidia-ml-py!=12.575.51'" and prove.startswith("python3 -c ")
    # which fails while the overflowing release is what imports (before the pin), and every command of every
    # report runs as printed (the reproducers clean, as they ran; the pin, then the proof, succeed)
    (before,) = run_printed([prove], tmp_path, python=python)
    assert before.returncode == 1 and "nvidia-ml-py 12.575.51" in before.stdout, before.stderr
    ran = run_every_command(rep, sim, python)
    assert ran[pin] == [0] and ran[prove] == [0]
    installed = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('nvidia-ml-py'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert installed != "12.575.51"


def test_binding_calling_pattern(sim, tmp_path, monkeypatch):
    # GIVEN the reproducers' runs on a node where only the Python reproducer crashes: the binding (nvidia-ml-py with
    # its count seeded one past its array, on PYTHONPATH for that run) while the C one, the same queries without
    # it, runs clean; no core
    python = stack_copy("incident", tmp_path)
    seeded = seed_binding_fault(python, tmp_path / "binding", 1)
    with monkeypatch.context() as m:
        m.setenv("PYTHONPATH", str(seeded))
        evidence = [reproduce(tmp_path, "--stack", "incident", "--python", python)]
    doc = json.loads(evidence[0].read_text())
    assert [(r["name"], r["status"]) for r in doc["runs"]] == [("python", "crashed"), ("c", "clean")], doc["runs"]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "binding-fault")
    # THEN nvitop's issue is the one to file (how the binding is called), and the runbook pins the binding away from
    # the release that ran, and proves it (#40 item 5: a binding fault's runbook said nothing of the binding)
    assert [f["report"] for f in rep.conclusion["filings"]] == ["nvitop"]
    pin, prove = rep.commands()
    assert pin == "python3 -m pip install 'nvidia-ml-py!=12.575.51'" and prove.startswith("python3 -c ")
    step = next(x["text"] for x in rep.explain["steps"] if x["command"] == pin)
    assert "not 12.575.51, with which the Python reproducer crashes while the C one" in step
    (before,) = run_printed([prove], tmp_path, python=python)
    assert before.returncode == 1 and "nvidia-ml-py 12.575.51" in before.stdout, before.stderr
    # (every command on a node whose binding has the fault: the seeded copy first on PYTHONPATH, as it ran)
    monkeypatch.setenv("PYTHONPATH", str(seeded))
    ran = run_every_command(rep, sim, python)
    assert ran[pin] == [0] and ran[prove] == [0]


def test_shadowed_install(sim, tmp_path, core_pattern):
    # GIVEN the "fixed" image (nvitop 1.7.2 installed) whose WORKDIR still holds the stale nvitop 1.5.0 tree:
    # the exporter imports it and crashes inside NVML; verify-imports of a process started there says SHADOWED
    python = stack_copy("current", tmp_path)
    old = Path(ensure_stack_venv("incident")).parent.parent
    workdir = tmp_path / "app"
    workdir.mkdir()
    for tree in ("nvitop", "nvitop_exporter"):
        shutil.copytree(next(old.glob(f"lib/python3*/site-packages/{tree}")), workdir / tree)
    env = sim_environment(sim, fault="segv", fault_after=2)
    run_dir = workdir  # python -m puts the working directory first on sys.path
    argv = [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "0", "--interval", "0.25"]
    core = crash_for_core(argv, run_dir, env=env, timeout=120, outputs=("nvitop", "nvitop_exporter"))
    evidence = [analyze(core, tmp_path / "analysis.json"), verify_imports(python, tmp_path, cwd=workdir)]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "shadowed-or-unsupported-install")
    # THEN the image is fixed first and nothing goes upstream
    assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
    # the versions are the ones that ran: 1.5.0 from the stale tree, not pip's 1.7.2
    assert "nvitop-exporter 1.5.0" in rep.title("runbook")
    versions = {v["package"]: v for v in rep.explain["versions"]}
    assert versions["nvitop"]["ran"] == "1.5.0" and versions["nvitop"]["installed"] == "1.7.2"
    assert "nvitop 1.5.0 ran" in rep.doc["runbook"]["markdown"]
    # a confirmed shadowing is said so, with verify-imports' fix, and never "upgrade nvitop"
    md = rep.doc["runbook"]["markdown"].replace("\\", "")
    assert "NOT ruled out" not in md and "Old source shadowing the installed packages: FOUND" in md
    assert "PYTHONSAFEPATH=1" in md and "stale tree" in md
    # the title names the versions whose code ran, beside those installed (the nvitop issue's too: not 1.7.2 alone)
    ran = "nvitop 1.5.0 and nvitop-exporter 1.5.0 ran, not the installed 1.7.2"
    assert rep.title("runbook").endswith(f": a shadowed install: {ran}"), rep.title("runbook")
    assert f"(a shadowed install: {ran})" in rep.title("nvitop")
    # and the runbook removes the stale trees, then proves them gone: verify-imports NOT OK before, OK after, each
    # run as printed
    rm, cmd = rep.commands()
    assert rm == f"rm -rf -- {workdir / 'nvitop'} {workdir / 'nvitop_exporter'}"
    assert cmd.startswith("forensics verify-imports dir:/ --entrypoint ")
    (before,) = run_printed([cmd], tmp_path)
    assert before.returncode == EXIT_FINDINGS and "SHADOWED" in before.stdout
    ran = run_every_command(rep, sim, python, fault="segv")
    assert ran[rm] == [0] and ran[cmd] == [EXIT_OK]
    assert not (workdir / "nvitop").exists() and not (workdir / "nvitop_exporter").exists()


def test_a_shadowed_install_and_a_driver_fault_at_once(sim, tmp_path, core_pattern):
    # GIVEN the "fixed" image (nvitop 1.7.2 installed) whose WORKDIR still holds the stale 1.5.0 trees, the exporter
    # importing them and killed by the driver's heap fault, the C reproducer crashing on the same driver, and
    # verify-imports of a process started there (SHADOWED)
    python = stack_copy("current", tmp_path)
    old = Path(ensure_stack_venv("incident")).parent.parent
    workdir = tmp_path / "app"
    workdir.mkdir()
    for tree in ("nvitop", "nvitop_exporter"):
        shutil.copytree(next(old.glob(f"lib/python3*/site-packages/{tree}")), workdir / tree)
    argv = [str(python), "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "0", "--interval", "0.25"]
    core = crash_for_core(argv, workdir, env=sim_environment(sim, fault="heap", fault_after=2), timeout=120,
                          outputs=("nvitop", "nvitop_exporter"))
    evidence = [analyze(core, tmp_path / "analysis.json"),
                reproduce(tmp_path, "--sim-fault", "heap", "--stack", "incident"),
                verify_imports(python, tmp_path, cwd=workdir)]
    rep = Reports(evidence, tmp_path)
    # THEN the incident is the driver's fault, and the install a cause of its own, fixed first: the image, then
    # NVIDIA's report, then nvitop's -- each with its own evidence
    check_every_report(rep, "driver-fault")
    assert [c.split()[0] for c in (rep.explain["claims"][0]["text"],)] == ["2"]
    statement = rep.conclusion["statement"]
    assert statement.startswith("2 causes, to be fixed in this order: (1) a shadowed install: nvitop 1.5.0 and "
                                "nvitop-exporter 1.5.0 ran, not the installed 1.7.2, first because until the image "
                                "runs the installed code, what crashes is not the installed releases' code; (2) a "
                                "fault of the NVIDIA driver library (libnvidia-ml.so)."), statement
    routes = rep.explain["routes"]
    assert [(r["order"], r["report"]) for r in routes] == [(1, "runbook"), (2, "nvml"), (3, "nvitop")]
    assert {i["key"] for i in routes[0]["evidence"]} == {"imports.nvitop", "imports.nvitop_exporter",
                                                          "imports.pynvml", "imports.requirements", "imports.support"}
    assert {i["key"] for i in routes[1]["evidence"]} == {"repro.c", "heap", "core.inside_nvml"}
    assert rep.title("runbook") == (
        "nvitop-exporter 1.5.0 aborts with heap corruption in nvmlDeviceGetFieldValues: a shadowed install: nvitop "
        "1.5.0 and nvitop-exporter 1.5.0 ran, not the installed 1.7.2, fixed first; then a fault of the NVIDIA driver "
        "library (libnvidia-ml.so)"), rep.title("runbook")
    assert rep.title("nvml").startswith("nvmlDeviceGetFieldValues (NVLink throughput")
    assert rep.title("nvitop").startswith("[BUG] nvitop-exporter 1.5.0 crashes in nvmlDeviceGetFieldValues")
    # and the runbook's steps, in that order, each run as printed: the stale trees removed and proved gone (NOT OK
    # before), then the guard into the installed nvitop's site-packages
    rm, prove, guard = rep.commands()
    assert rm.startswith("rm -rf -- ") and prove.startswith("forensics verify-imports ")
    assert guard.startswith("forensics guard --target nvitop.api.device:Device.nvlink_throughput")
    (before,) = run_printed([prove], tmp_path)
    assert before.returncode == EXIT_FINDINGS and "SHADOWED" in before.stdout
    ran = run_every_command(rep, sim, python, fault="heap")
    assert ran[rm] == [0] and ran[prove] == [EXIT_OK] and ran[guard] == [0]
    assert not (workdir / "nvitop").exists()


def test_programs_own_bug(sim, tmp_path, core_pattern):
    # GIVEN a program that overflows its own ctypes array (glibc aborts in the free() it calls through ctypes),
    # and the reproducers clean on the same node
    (tmp_path / "run").mkdir()
    core = crash_for_core([sys.executable, str(CRASHERS / "ctypes_overflow.py"), str(tmp_path / "oracle.json")],
                          tmp_path / "run", timeout=60)
    evidence = [analyze(core, tmp_path / "analysis.json"), reproduce(tmp_path, "--stack", "incident")]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "program-bug")
    # THEN it says "not NVML", names the program's frame, and files nothing with NVIDIA or nvitop
    assert rep.conclusion["statement"].startswith("Not NVML: the program's own code crashed, in query "
                                                  "(ctypes_overflow.py:")
    assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
    assert rep.title("nvml").startswith("not for the NVIDIA driver (the program's own bug, not NVML)")
    assert "| Inside libnvidia-ml | no |" in rep.doc["nvml"]["markdown"]
    # and no ask to run the reproducers again, no driver branch, no guard
    for t in TEMPLATES:
        assert "forensics reproduce" not in rep.doc[t]["conclusion"]["statement"]
    assert rep.commands() == []
    # and every command the reports print runs as printed (the reproducers clean, as they ran)
    run_every_command(rep, sim, stack_copy("incident", tmp_path))


def test_crash_outside_nvml(tmp_path, core_pattern, newest_python):
    # GIVEN a segfault in another native library (libcrash.so), no NVML call anywhere
    core = make_core(tmp_path, PYTHONS[newest_python], "segv")
    rep = Reports([analyze(core, tmp_path / "analysis.json")], tmp_path)
    check_every_report(rep, "crash-outside-nvml")
    assert rep.conclusion["statement"].startswith("Not NVML: the crash is in ") and "libcrash.so" in \
        rep.conclusion["statement"]
    assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
    assert "libcrash.so" in rep.conclusion["filings"][0]["action"]
    # no report prints a command for it (no reproducer ran, no binding is known, nothing to do but hand it over)
    assert [c for t in TEMPLATES for c in fenced_commands(rep.doc[t]["markdown"])] == []


def test_no_crash(sim, tmp_path):
    # GIVEN both reproducers clean on the simulated node, verify-imports of the incident's install, and no core
    python = stack_copy("incident", tmp_path)
    evidence = [reproduce(tmp_path, "--stack", "incident"), verify_imports(python, tmp_path)]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "no-crash")
    # THEN no report says that anything crashes, and nothing is filed
    for t in TEMPLATES:
        assert "crash" not in rep.title(t).replace("no crash observed", "")
        assert "an NVML call crashes" not in rep.doc[t]["markdown"]
    assert rep.conclusion["statement"].startswith("No crash was observed")
    assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
    assert rep.commands() == []
    run_every_command(rep, sim, python)


def test_undetermined(sim, tmp_path, core_pattern):
    # GIVEN only the core of a segfault inside NVML (the Python reproducer's), no reproducer runs, no heap reading
    python = stack_copy("incident", tmp_path)
    (tmp_path / "run").mkdir()
    core = crash_for_core([str(python), str(REPRO_PY), "--threads", "0", "--iterations", "20"], tmp_path / "run",
                          env=sim_environment(sim, fault="segv", fault_after=2), timeout=120)
    rep = Reports([analyze(core, tmp_path / "analysis.json")], tmp_path)
    check_every_report(rep, "undetermined")
    # THEN it says what is missing, and nothing is filed yet
    assert "the reproducers' runs on an affected node (forensics reproduce --json)" in rep.explain["missing"]
    assert rep.conclusion["statement"].startswith("Not determined yet: the process dies of SIGSEGV")
    assert rep.title("runbook").endswith(": not determined yet")
    assert [f["report"] for f in rep.conclusion["filings"]] == ["runbook"]
    run_every_command(rep, sim, python, fault="segv")


def test_driver_fault_detected_later(sim, tmp_path, core_pattern):
    # GIVEN the driver writing past the exporter's array, noticed by glibc only later, in CPython's own free()
    # (no NVML frame on the crashing stack), and the C reproducer crashing on the same node
    python = stack_copy("incident", tmp_path)
    core = exporter_core(python, sim_environment(sim, fault="overflow", detect="later", fault_after=2),
                         tmp_path / "exporter")
    evidence = [analyze(core, tmp_path / "analysis.json"),
                reproduce(tmp_path, "--sim-fault", "heap", "--stack", "incident")]
    rep = Reports(evidence, tmp_path)
    check_every_report(rep, "driver-fault")
    # THEN NVIDIA's title names the NVML call the evidence ties the damage to, not nvitop's Python function, and
    # says where glibc noticed it
    title = rep.title("nvml")
    assert title.startswith("nvmlDeviceGetFieldValues corrupts the heap: glibc notices it later, in ")
    assert "query_nvlink_throughput_counters" not in title and "nvitop" not in title
    assert "| Inside libnvidia-ml | no |" in rep.doc["nvml"]["markdown"]
    run_every_command(rep, sim, python, fault="heap")


def _gdb_words(core: Path, address: int, count: int) -> list[int]:
    """``count`` 8-byte words at ``address`` of the core, as gdb reads them (the oracle)."""
    out = subprocess.run(["gdb", "-batch", "-nx", "-c", str(core), "-ex", f"x/{count}gx {address:#x}"],
                         capture_output=True, text=True, timeout=120).stdout
    words = [int(w, 16) for line in out.splitlines() if ":" in line for w in line.split(":", 1)[1].split()]
    assert len(words) == count, out
    return words


def test_a_late_detection_of_a_write_over_the_arrays_own_header(sim, tmp_path, core_pattern):
    # GIVEN the driver writing a record over the malloc header of the exporter's field-value array (values[-1])
    # and into it; glibc notices when CPython frees the array, outside NVML (issue #26 item 5)
    python = stack_copy("incident", tmp_path)
    core = exporter_core(python, sim_environment(sim, fault="heap-delayed", fault_after=2), tmp_path / "exporter")
    analysis = analyze(core, tmp_path / "analysis.json")
    c = json.loads(analysis.read_text())["analysis"]["heap"]["corruption"]
    over, damaged, buffer = c["overflowed"], c["damaged"], c["owner"]["object"]
    # THEN the damaged header is the array chunk's own, no overflow length is made up, and the "next chunk"
    # glibc checked is named as lying inside the buffer
    assert damaged["address"] == over["address"] and c["overflow_length"] is None
    # the size word (damaged: the header as read) is too small for the array; the chunk (overflowed) is sized
    # from the heap after it, never from that word (#40)
    assert buffer["size"] == 1440 and damaged["size"] - 8 < buffer["size"] <= over["size"] - 8 == c["usable_size"]
    own = next(i for i in c["inconsistencies"] if "own header was written over" in i)
    nxt = damaged["address"] + damaged["size"]
    assert buffer["buffer"] <= nxt < buffer["buffer"] + buffer["size"]
    assert f"lies {nxt - buffer['buffer']} bytes inside the buffer (entry {(nxt - buffer['buffer']) // 40}" in own
    # as gdb reads the core: the array chunk's size word is the one reported (written over: too small for the
    # array), and the "next chunk" header glibc read is the array's own bytes
    size_word = _gdb_words(core, over["address"] + 8, 1)[0]
    assert size_word & ~7 == damaged["size"] and size_word.to_bytes(8, "little").hex() == c["first_bytes"]
    assert _gdb_words(core, over["address"] + over["size"] + 8, 1)[0] & 1  # a header there: its chunk before in use
    assert _gdb_words(core, nxt + 8, 1)[0] & ~7 == next(
        int(i.split("size field ")[1].split(":")[0], 16) & ~7 for i in c["inconsistencies"] if "size field" in i)
    # and the reports say what the bytes show, with no length past the end
    rep = Reports([analysis], tmp_path)
    for t in ("nvml", "runbook"):
        assert "bytes past the 1440-byte buffer" not in rep.doc[t]["markdown"]
    assert "No write past the buffer's end is shown: the size word of the chunk at" in \
        rep.doc["nvml"]["body"].replace("\\", "")
    run_every_command(rep, sim, python, fault="heap-delayed")
