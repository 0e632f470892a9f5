"""Reports an upstream maintainer acts on, made from real evidence: the demo incident (the real
nvitop-exporter killed by the simulated driver, its core, both reproducers, verify-imports, a
capture), a binding-only fault, an exit-time race of nvitop 1.5.0, the incident's fleet.

Each report is parsed the way its reader would read it: the front matter's plain-text title and
where to file it, the conclusion first, nvitop's form field by field, the OS and versions, the
attachments beside the file, no local paths or host names in what goes upstream.
"""
from __future__ import annotations

import json
import re
import resource
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from forensics.capture.node import read_os_release
from forensics.cli import cli
from forensics.errors import EXIT_FINDINGS, EXIT_OK
from forensics.report import split_front_matter
from forensics.report.facts import pretty_os
from forensics.report.form import load_shipped_form, split_fields
from forensics.simnvml import build_simnvml, ensure_stack_venv, sim_environment
from tests.fleetgen import incident_fleet


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, core_pattern):
    out = tmp_path_factory.mktemp("demo") / "out"
    r = run("demo", "--json", "--out", str(out))
    assert r.exit_code == EXIT_OK, r.stderr
    return out


def read_report(path: Path) -> tuple[dict, str]:
    meta, body = split_front_matter(path.read_text())
    assert meta, f"{path.name} has no front matter"
    return meta, body


LOCAL = re.compile(r"(?<![\w.<>:/-])/(?:root|home|tmp|work|var/lib)/")


@pytest.mark.parametrize("template", ["nvml", "nvitop", "runbook"])
def test_demo_reports_state_the_conclusion_and_file_where_it_points(demo, template):
    path = demo / f"report-{template}.md"
    meta, body = read_report(path)
    text = path.read_text()
    # THEN the title is plain text naming the failing API and the versions
    title = meta["title"]
    assert "\\" not in title and not title.startswith("#") and len(title) <= 256
    assert "nvmlDeviceGetFieldValues" in title and "580.126.09" in title
    if template == "nvitop":
        assert title.startswith("[BUG] nvitop-exporter 1.5.0 ") and "turning NVLink metrics off" in title
    if template == "nvml":
        assert "NVML 13.580.126" in title and "8 x NVIDIA H20" in title
    # and the conclusion comes first: the C reproducer crashed, so the driver is the suspect
    assert meta["conclusion"] == "driver-fault"
    first = body.split("\n\n### ")[0] if template == "nvitop" else body[:1200]
    statement = "The evidence points at the NVIDIA driver library"
    if template == "nvitop":
        desc = dict(split_fields(body))["Problem description"]
        assert desc.startswith(statement)
        assert "What we ask of nvitop" in desc and "NVLink throughput metrics off" in desc
        assert meta["file-at"] == "https://github.com/XuehaiPan/nvitop/issues/new?template=bug-report.yaml"
        assert meta["when"].startswith("2. file after the NVIDIA report")
    else:
        assert statement in first
    if template == "nvml":
        assert meta["when"].startswith("1. file first") and meta["file-at"].startswith("NVIDIA:")
    if template == "runbook":
        assert "(1) the nvml report to NVIDIA" in body and "(2) the nvitop report to nvitop" in body
    # the unsupported pairing is stated, and why it does not change the verdict
    assert "nvitop 1.5.0 has requirement nvidia-ml-py" in text.replace("\\", "")
    # and the OS is the distribution from os-release (the demo's exporter runs on this machine)
    this_os = pretty_os(read_os_release("/"))
    if template != "runbook":
        assert this_os in text
    # versions
    for v in ("580.126.09", "12.575.51", "1.5.0"):
        assert v in text
    # the attachments are written beside the report, and named in it
    for a in meta.get("attachments") or []:
        assert (path.parent / a).is_file(), a
        assert Path(a).name in body
    # under 20,000 characters, and `report --check` passes against the shipped form
    assert len(text) < 20_000, len(text)
    r = run("report", "--check", str(path))
    assert r.exit_code == EXIT_OK, r.stdout


def test_the_nvitop_issue_follows_the_form_field_by_field(demo):
    meta, body = read_report(demo / "report-nvitop.md")
    form = load_shipped_form()
    fields = split_fields(body)
    # every field of the form, in its order, as GitHub renders a submitted form; nothing else
    assert [label for label, _ in fields] == [f.label for f in form.fields]
    values = dict(fields)
    # the two required checkboxes (and the optional one) are there, for the person filing to tick
    for option, _required in form.field("steps").options:
        assert f"- [ ] {option}" in values["Required prerequisites"]
    # an input is one line of content of the right kind: the OS is a distribution, not a kernel string
    assert values["What version of nvitop are you using?"] == "1.5.0 (nvitop-exporter 1.5.0)"
    assert values["NVIDIA driver version"] == "580.126.09"
    assert values["Operating system and version"].startswith(pretty_os(read_os_release("/")))
    # the Python environment answers what the form asks: install method, Python, the one-liner's output
    env = values["Python environment"]
    assert "Installed with: pip" in env and "- Python 3.11.7" in env
    assert "nvidia-ml-py==12.575.51\nnvitop-exporter==1.5.0\nnvitop==1.5.0" in env
    # Steps to Reproduce: the form's two blocks, a short snippet and command lines (sources attached, not pasted)
    steps = values["Steps to Reproduce"]
    assert steps.startswith("The Python snippets (if any):\n\n```python") and "Command lines:\n\n```bash" in steps
    assert "python3 nvml_nvlink_fieldvalues.py --iterations 200 --threads 2" in steps
    assert "./nvml_nvlink_fieldvalues --iterations 200" in steps and len(steps) < 3000
    assert "#include" not in body and "def main(" not in body
    # the stack read from the core is labelled as such, not as CPython's traceback
    tb = values["Traceback"]
    assert tb.startswith("```pytb\nPython stack of thread MainThread") and "read from the core file" in tb
    assert "Traceback (most recent call last)" not in tb
    # no empty field, no internal words, no local evidence table
    assert "_No response_" not in body
    for word in ("forensics guard", "fingerprint", "sha256", "forensics analyze", "canary"):
        assert word not in body


def test_upstream_reports_carry_no_local_paths_or_host_names(demo):
    hostname = socket.gethostname()
    for template in ("nvml", "nvitop"):
        path = demo / f"report-{template}.md"
        meta, body = read_report(path)
        texts = {path.name: path.read_text()}
        for a in meta.get("attachments") or []:
            texts[a] = (path.parent / a).read_text()
        for name, text in texts.items():
            if name.endswith((".c", ".py")):
                continue  # our reproducers' sources, shipped as they are
            assert not LOCAL.search(text), (name, LOCAL.search(text).group(0))
            assert str(demo) not in text, name
            assert not re.search(rf"(?<![\w.-]){re.escape(hostname)}(?![\w-])", text.replace("\\", "")), name
            assert "demo-node" not in text, name
        footer = body.rsplit("<sub>", 1)[1]
        assert "local paths:" in footer and "replaced by \\<local\\>/NAME" in footer
        assert "host name" in footer
    # the runbook keeps them: it stays with the team
    runbook = (demo / "report-runbook.md").read_text()
    assert str(demo) in runbook.replace("\\_", "_") and "Kept in this record: host names and local paths" in runbook


def test_the_nvidia_report_has_what_nvidia_asks_for(demo):
    meta, body = read_report(demo / "report-nvml.md")
    text = body.replace("\\", "")
    # NVML and glibc versions in prose
    assert "NVIDIA driver 580.126.09 with NVML 13.580.126 and CUDA 13.0" in text and "glibc 2.36" in text
    # the exact call and its arguments
    assert "fieldId 138 (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) x scopeId 0..links-1" in text
    assert "with 18 NVLinks, 36 field values in one call per GPU" in text
    # every GPU named, with its UUID and PCI bus id
    assert len(re.findall(r"^\| GPU \d ", text, re.M)) == 8 and "GPU-5a1e0000-7b3c-4a00-9e40-1b2c3d4e5f60" in text
    # the crash rate and time to crash, from the C reproducer's crash line
    how_often = text.split("## How often", 1)[1].split("##", 1)[0]
    # (the fault fires on the 121st NVLink query of the process; the C reproducer queries from its main thread and
    # --threads 2 more, so the call that crashes is the 121st to the 123rd, as the threads interleave)
    m = re.search(r"C reproducer: crashed in field-value call #(\d+) \(1 crash in (\d+) calls\), "
                  r"[\d.]+ ms after its first query", how_often)
    assert m and m.group(1) == m.group(2) and 121 <= int(m.group(1)) <= 123, how_often
    # the commands run, the C reproducer first built then run
    assert "gcc -O1 -g -o nvml_nvlink_fieldvalues nvml_nvlink_fieldvalues.c -ldl\n./nvml_nvlink_fieldvalues" in text
    # the system facts nvidia-bug-report carries, or why they are missing
    system = text.split("## System information", 1)[1]
    for row in ("| Distribution |", "| PCI bus ids |", "| NVLink | 18 on each of 8 GPUs", "| Xid summary |",
                "| nvidia-bug-report | not captured: nvidia-bug-report.sh is not installed on this node |"):
        assert row in system, row
    # the C reproducer's source is an attachment, its output too
    assert {"nvml_nvlink_fieldvalues.c", "reproducer-output.txt", "crash-stacks.txt"} <= {
        Path(a).name for a in meta["attachments"]}
    out = (demo / "report-nvml.files" / "reproducer-output.txt").read_text()
    assert f"VERDICT: crashed: SIGABRT inside call #{m.group(1)} " in out


def test_version_facts_that_do_not_apply_are_not_listed(demo):
    # verify-imports matched the 251-273 field-id renumbering of nvidia-ml-py 12.575.51 (a fact of the image)...
    vi = json.loads((demo / "verify-imports.json").read_text())
    assert "nvidia-ml-py-12.575.51-field-ids" in [k["id"] for k in vi["result"]["known_issues"]]
    # ...but the failing query uses field ids 138 and 139: not a known issue of this crash; nor is the exit race
    doc = json.loads(run("report", "--json", str(demo / "analysis.json"), str(demo / "verify-imports.json"),
                         str(demo / "reproduce.json")).stdout)["report"]
    assert doc["known_issues"] == []
    # (a field id 251 as a number of its own: the reproducer's time to crash, e.g. 0.000251 s, may hold the digits)
    assert not re.search(r"(?<![\d.])251(?!\d)", doc["body"]) and "nvmlShutdown" not in doc["body"]


def test_unsupported_setup_leads_when_the_reproducers_did_not_decide(demo, tmp_path):
    # GIVEN the crash analysed without native stacks (so the heap cannot say who freed the buffer: undetermined)
    # and verify-imports, without reproducers
    analysis = tmp_path / "analysis.json"
    r = run("analyze", "--json", "--method", "direct", "--native-method", "none", "-o", str(analysis),
            str(demo / "exporter" / "core"))
    assert r.exit_code == EXIT_OK, r.stderr
    assert json.loads(analysis.read_text())["analysis"]["heap"]["corruption"]["verdict"] == "undetermined"
    doc = json.loads(run("report", "--json", str(analysis), str(demo / "verify-imports.json")).stdout)
    c = doc["report"]["conclusion"]
    # THEN the incident is the unsupported install: making it supported comes first, and nothing is filed yet
    assert c["incident"] == "shadowed-or-unsupported-install"
    assert c["statement"].startswith("The setup is unsupported: nvitop 1.5.0 has requirement nvidia-ml-py<12.571.0a0")
    assert "nothing is filed upstream until the supported, installed code still crashes" in c["statement"]
    assert [(f["report"], f["where"]) for f in c["filings"]] == [("runbook", "the incident record (internal)")]
    meta, _ = split_front_matter(doc["report"]["markdown"])
    assert meta["when"].startswith("not now")


def test_the_heap_decides_for_the_driver_before_an_unsupported_setup(demo):
    # GIVEN the demo's crash, whose heap shows libnvidia-ml overflowing a buffer of its own, and verify-imports
    # (nvitop 1.5.0 outside its declared nvidia-ml-py range), without reproducers
    doc = json.loads(run("report", "--json", str(demo / "analysis.json"), str(demo / "verify-imports.json")).stdout)
    c = doc["report"]["conclusion"]
    # THEN the heap points at the driver, and the unsupported setup is said beside it, not first
    assert c["incident"] == "driver-fault"
    assert c["statement"].startswith("The core's heap points at the NVIDIA driver library")
    assert "libnvidia-ml.so.580.126.09's own allocation" in c["statement"]
    assert ("The Python setup is also outside what nvitop declares (nvitop 1.5.0 has requirement "
            "nvidia-ml-py<12.571.0a0") in c["statement"]
    assert c["statement"].endswith("fix that too, but what the core's heap shows does not depend on it.")
    assert [f["report"] for f in c["filings"]] == ["nvml", "nvitop"]
    assert "a buffer it allocated and freed itself" in c["filings"][0]["action"]


def test_a_driver_fault_keyed_to_threads_is_the_drivers_in_the_report(tmp_path, core_pattern):
    # GIVEN a driver fault only in calls from threads other than the main one: both reproducers query from threads
    # (the C one too, since cfcce2b), and both crash
    r = run("reproduce", "--json", "--sim", "--sim-fault", "heap", "--sim-fault-thread", "non-main",
            "--stack", "incident", "--iterations", "20", "--workdir", str(tmp_path))
    assert r.exit_code == EXIT_FINDINGS, r.stderr
    repro = tmp_path / "reproduce.json"
    repro.write_text(r.stdout)
    core = json.loads(r.stdout)["runs"][0]["core"]
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), core).exit_code == EXIT_OK
    doc = json.loads(run("report", "--json", str(analysis), str(repro)).stdout)["report"]
    c = doc["conclusion"]
    # THEN the report says the driver's, on the C reproducer's crash, and NVIDIA's report goes first
    assert c["incident"] == "driver-fault"
    assert "The C reproducer, which makes the same NVML calls without Python or nvidia-ml-py, crashed" in c["statement"]
    assert [f["report"] for f in c["filings"]][0] == "nvml"
    nvml = json.loads(run("report", "--json", "--template", "nvml", str(analysis), str(repro)).stdout)["report"]
    assert split_front_matter(nvml["markdown"])[0]["when"].startswith("1. file first")


RACE = """
import sys, threading, time
from nvitop import Device
devices = Device.all()
def collect(device):
    while True:
        device.nvlink_throughput()
for d in devices:
    threading.Thread(target=collect, args=(d,), daemon=True, name=f"collector-{d.index}").start()
time.sleep(0.3)
sys.exit(0)  # nvitop's atexit nvmlShutdown runs while the collectors still query
"""


def test_the_exit_time_race_is_known_by_what_defines_it(tmp_path, core_pattern):
    # GIVEN nvitop 1.5.0 collectors querying NVLink from daemon threads when the interpreter exits, on a driver
    # whose queries after nvmlShutdown touch freed state (a real SIGSEGV core, several tries at most)
    python = ensure_stack_venv("incident")
    env = sim_environment(build_simnvml(tmp_path / "sim"), fault="use-after-shutdown")
    (tmp_path / "race.py").write_text(RACE)
    for attempt in range(5):
        run_dir = tmp_path / f"run{attempt}"
        run_dir.mkdir()
        p = subprocess.run([str(python), str(tmp_path / "race.py")], cwd=run_dir, env=env, capture_output=True,
                           timeout=60,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2))
        if p.returncode == -11 and (run_dir / "core").is_file():
            break
    else:
        pytest.fail(f"the exit-time race did not crash in 5 tries (last status {p.returncode})")
    analysis = tmp_path / "analysis.json"
    assert run("analyze", "--json", "-o", str(analysis), str(run_dir / "core")).exit_code in (EXIT_OK, 4)
    # and which nvitop the process imported, from the same interpreter
    vi = tmp_path / "verify-imports.json"
    sleeper = subprocess.Popen([str(python), "-c",
                                "import nvitop, sys, time; print('ready', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "ready\n"
        r = run("verify-imports", "--json", "--pid", str(sleeper.pid), "-o", str(vi))
        assert r.exit_code in (EXIT_OK, EXIT_FINDINGS), r.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    # WHEN a report is made
    doc = json.loads(run("report", "--json", str(analysis), str(vi)).stdout)["report"]
    # THEN nvitop's issue #222 is named, on each part of its definition, with the fix and its sources
    (k,) = doc["known_issues"]
    assert k["id"] == "nvitop-222-atexit-shutdown-race"
    on = " | ".join(k["matched_on"])
    assert "signal SIGSEGV" in on and "a thread other than the main one" in on
    assert "while the interpreter exits" in on and "nvitop 1.5.0 < 1.7.1" in on
    assert "https://github.com/XuehaiPan/nvitop/issues/222" in k["sources"]
    assert "https://pypi.org/project/nvitop/1.7.1/" in k["sources"]
    assert doc["conclusion"]["incident"] == "known-issue"
    assert "Upgrade nvitop and nvitop-exporter to 1.7.1 or later" in doc["conclusion"]["statement"]


def test_runbook_states_the_fleet_in_words_not_a_dict(tmp_path, demo):
    pods, nodes = incident_fleet()
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    fleet = tmp_path / "fleet.json"
    assert run("fleet", "--json", "--from", str(tmp_path / "pods.json"), "--nodes", str(tmp_path / "nodes.json"),
               "-o", str(fleet)).exit_code == EXIT_OK
    md = run("report", "--template", "runbook", str(demo / "analysis.json"), str(fleet)).stdout.replace("\\", "")
    affected = next(line for line in md.splitlines() if line.startswith("| Affected"))
    assert "NVIDIA-H20, 580.126.09: 106 of 108 pods restarted, 11648 restarts (exit 134: 79, exit 139: 27)" in affected
    assert "{'" not in md and "'}" not in md
    nvml = run("report", "--template", "nvml", str(demo / "analysis.json"), str(fleet)).stdout
    assert "106 of 108 pods restarted" in nvml.split("## How often", 1)[1].split("##", 1)[0]
    # and nvitop's maintainer sees the same fleet (where it crashes and where it does not)
    nvitop = run("report", str(demo / "analysis.json"), str(fleet)).stdout.replace("\\", "")
    assert "Where and how often it crashes (the fleet):" in nvitop and "106 of 108 pods restarted" in nvitop


def test_a_newer_issue_form_is_followed(tmp_path, demo):
    # GIVEN a newer copy of nvitop's form: a field relabelled, one added (required), one removed
    from importlib import resources

    data = json.loads(resources.files("forensics.report").joinpath("forms/nvitop-bug-report.json").read_text())["form"]
    body = data["body"]
    for el in body:
        if el.get("id") == "system":
            el["attributes"]["label"] = "Operating system and environment"
    body[:] = [el for el in body if el.get("id") != "expected"]
    body.insert(4, {"type": "input", "id": "gpu-model", "attributes": {"label": "GPU model"},
                    "validations": {"required": True}})
    newer = tmp_path / "bug-report.yaml"
    newer.write_text(yaml.safe_dump(data, sort_keys=False))
    # WHEN the report follows it
    args = ["--template", "nvitop", "--issue-form", str(newer), str(demo / "analysis.json"),
            str(demo / "reproduce.json")]
    r = run("report", "--check", *args)
    # THEN its fields are the newer form's, in its order; the one nothing fills says so, and --check names it
    labels = [label for label, _ in split_fields(split_front_matter(r.stdout)[1])]
    assert labels[:4] == ["Required prerequisites", "What version of nvitop are you using?",
                          "Operating system and environment", "GPU model"]
    assert "Expected behavior" not in labels
    assert dict(split_fields(split_front_matter(r.stdout)[1]))["GPU model"] == "_No response_"
    assert r.exit_code == EXIT_FINDINGS and "required form field 'GPU model' is empty" in r.stderr
    # a file that is not a form is one line, exit 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbody: 5\n")
    r = run("report", "--issue-form", str(bad), str(demo / "analysis.json"))
    assert r.exit_code == 1 and "not a GitHub issue form: no 'body' list" in r.stderr


def test_the_nvidia_link_goes_into_the_nvitop_issue(demo):
    url = "https://forums.developer.nvidia.com/t/nvml-heap-corruption/123456"
    r = run("report", "--nvidia-link", url, str(demo / "analysis.json"), str(demo / "reproduce.json"))
    assert f"The NVIDIA report: {url}" in r.stdout
