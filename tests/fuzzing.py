"""The one bounded harness the fuzz targets share (tests/fuzz_cores.py, tests/fuzz_images.py).

A fuzz target makes mutants; this module runs the real ``forensics`` command line on each
and judges the run the same way for every target:

* each run is a fork of the harness (which imported ``forensics.cli`` once) that calls the
  console script's own entry, ``cli.main``, in a new session with its stdout and stderr in
  files, stdin empty, RLIMIT_AS set, its working directory and TMPDIR empty directories of
  the harness;
* the run ends by itself within its time bound or its whole process group (gdb included) is
  killed, and ``wait4`` gives its peak resident memory (its reaped children's included);
* the outcome is a normal result, a partial one, or a clear error -- one ``forensics: error:``
  line (with an optional ``forensics: hint:``) and exit 1 -- and anything else is a
  violation: a traceback, an "internal error", a death by signal, another exit code, stderr
  that is not the tool's own lines, JSON that does not parse, a control character on a
  terminal (stdout in text mode, stderr always), a run over its time or memory bound;
* after every run nothing may have appeared outside the output: the working directory and
  TMPDIR stay empty, the input's directory keeps only what it had, the output directory holds
  the output file or nothing, and :data:`SENTINEL_DIR` (where mutants point their traversals)
  never appears.

:func:`run_target` is the pytest side: it runs a target script in a child with a fresh
TMPDIR and working directory and checks its summary.  Counts and seeds come from
``FORENSICS_FUZZ_COUNT`` / ``FORENSICS_FUZZ_SEED`` (CI: a few hundred mutants).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SENTINEL_DIR", "RunSpec", "RunResult", "run_cli", "judge", "Harness", "run_target", "fuzz_count",
           "fuzz_seed", "CONTROL"]

ROOT = Path(__file__).resolve().parent.parent
SENTINEL_DIR = "/tmp/forensics-fuzz-sentinel"  # a traversal names files here; none may ever appear

#: characters a terminal acts on: C0 but the newline, DEL, C1 (as code points; raw bytes are caught
#: as undecodable), and lone surrogates (bytes that were not UTF-8, written back raw)
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
#: what the tool itself writes on stderr
_STDERR_LINE = re.compile(r"^(forensics[: ]|Wrote |  )")

RESULT_OUTCOMES = ("ok", "partial", "findings", "error")


def fuzz_count(default: int = 300) -> int:
    return int(os.environ.get("FORENSICS_FUZZ_COUNT", str(default)))


def fuzz_seed() -> int:
    return int(os.environ.get("FORENSICS_FUZZ_SEED", "0"))


@dataclasses.dataclass
class RunSpec:
    """One command line to run on a mutant."""

    argv: list[str]
    json: bool = False  # stdout is one JSON document
    time_bound: float = 30.0
    memory_limit: int = 4 << 30  # RLIMIT_AS of the run (bytes)
    results: tuple[int, ...] = (0,)  # exit codes that are a result (4: partial, 3: findings)
    output: str | None = None  # the -o file the run may write
    inputs: tuple[str, ...] = ()  # directories holding the run's input: nothing may be added there


@dataclasses.dataclass
class RunResult:
    rc: int | None  # exit status; None when killed by a signal
    signal: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    peak_mb: float
    timed_out: bool


def run_cli(spec: RunSpec, *, cwd: str, tmpdir: str, scratch: str) -> RunResult:
    """Run ``forensics ARGV`` in a fork of this process, as the console script runs it."""
    out_path, err_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the run
        code = 70
        try:
            os.setsid()
            resource.setrlimit(resource.RLIMIT_AS, (spec.memory_limit, spec.memory_limit))
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                f = os.open(path, flags, 0o600)
                os.dup2(f, fd)
                os.close(f)
            os.chdir(cwd)
            os.environ["TMPDIR"] = tmpdir
            tempfile.tempdir = None
            # a UTF-8 terminal: stdout strict, stderr backslashreplace, as Python sets them there
            # (the forked child's streams until its os._exit)
            sys.stdout = open(1, "w", encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            from forensics.cli import cli

            try:
                cli.main(args=list(spec.argv), prog_name="forensics")
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 -- what would reach the user as a traceback
                traceback.print_exc()
                code = 70
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    deadline = t0 + spec.time_bound
    timed_out = False
    while True:
        wpid, status, usage = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() > deadline:
            timed_out = True
            _killpg(pid)
            wpid, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.01)
    seconds = time.monotonic() - t0
    _killpg(pid)  # what the run left behind in its session (a gdb it did not reap)
    with open(out_path, "rb") as f:
        stdout = f.read()
    with open(err_path, "rb") as f:
        stderr = f.read()
    return RunResult(
        rc=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        stdout=stdout, stderr=stderr, seconds=seconds, peak_mb=usage.ru_maxrss / 1024, timed_out=timed_out)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _control(text: str) -> str | None:
    m = CONTROL.search(text)
    if m is None:
        return None
    line = text[text.rfind("\n", 0, m.start()) + 1:]
    return f"{m.group()!r} in {line.splitlines()[0][:160]!r}" if line else repr(m.group())


def judge(spec: RunSpec, r: RunResult, *, command: str | None = None) -> tuple[str, str]:
    """(outcome, detail) of one run: ``ok``, ``partial`` (exit 4), ``findings`` (exit 3), ``error``
    (a clear one) -- or the name of a violation."""
    err = r.stderr.decode("utf-8", "surrogateescape")
    out = r.stdout.decode("utf-8", "surrogateescape")
    if r.timed_out:
        return "over time bound", f"killed after {r.seconds:.1f}s; stderr: {err[-300:]}"
    if r.signal is not None:
        return f"killed by {signal.Signals(r.signal).name}", err[-600:]
    if "Traceback (most recent call last)" in err:
        return "traceback", err[-1500:]
    if "internal error" in err:
        return "internal error", err[-800:]
    for where, text in (("stderr", err), ("stdout", "" if spec.json else out)):
        bad = _control(text)
        if bad:
            return "control characters", f"{where}: {bad}"
    stray = [ln for ln in err.splitlines() if not _STDERR_LINE.match(ln)]
    if stray:
        return "stray stderr", "\n".join(stray)[:400]
    if r.rc == 1:
        errors = [ln for ln in err.splitlines() if ln.startswith("forensics: error:")]
        others = [ln for ln in err.splitlines() if ln.startswith("forensics:") and not
                  ln.startswith(("forensics: error:", "forensics: hint:", "forensics: warning:"))]
        if len(errors) != 1 or others:
            return "unclear error", err[-400:]
        return "error", errors[0][len("forensics: error: "):][:200]
    if r.rc in spec.results:
        if spec.json:
            try:
                doc = json.loads(out)
                if not isinstance(doc, dict) or doc.get("schema_version") is None or (
                        command is not None and doc.get("command") != command):
                    raise ValueError("not a forensics document")
            except ValueError as e:
                return "bad json", f"{e}: {out[-300:]}"
        return {0: "ok", 3: "findings", 4: "partial"}.get(r.rc, "ok"), ""
    return f"exit {r.rc}", err[-400:]


def _listing(path: str) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, n), path))
    return out


class Harness:
    """Runs and judges every run of a fuzz target; prints a JSON line per violation (or per run with
    ``--json``) and a summary line at the end."""

    def __init__(self, name: str, *, json_lines: bool = False, memory_bound_mb: float = 1024.0,
                 command: str | None = None) -> None:
        self.name = name
        self.json_lines = json_lines
        self.memory_bound_mb = memory_bound_mb
        self.command = command
        self.work = tempfile.mkdtemp(prefix=f"fuzz-{name}-harness-")
        self.cwd = os.path.join(self.work, "cwd")
        self.tmp = os.path.join(self.work, "tmp")
        self.scratch = os.path.join(self.work, "scratch")
        for d in (self.cwd, self.tmp, self.scratch):
            os.mkdir(d)
        self.outcomes: dict[str, int] = {}
        self.violations = 0
        self.runs = 0
        self.seeds: set[int] = set()
        self.peak_mb = 0.0
        self.slowest = (0.0, None)
        self.started = time.monotonic()
        self.sentinels_before = set(os.listdir(SENTINEL_DIR)) if os.path.isdir(SENTINEL_DIR) else set()

    def run(self, seed: int, what: str, spec: RunSpec) -> str:
        """Run one command line on a mutant; return its outcome."""
        before = {d: _listing(d) for d in spec.inputs}
        out_dir = os.path.dirname(spec.output) if spec.output else None
        out_before = _listing(out_dir) if out_dir else set()
        r = run_cli(spec, cwd=self.cwd, tmpdir=self.tmp, scratch=self.scratch)
        outcome, detail = judge(spec, r, command=self.command)
        if outcome in RESULT_OUTCOMES and r.peak_mb > self.memory_bound_mb:
            outcome, detail = "over memory bound", f"{r.peak_mb:.0f} MiB"
        written = self._written(spec, before, out_dir, out_before, outcome)
        if written and outcome in RESULT_OUTCOMES:
            outcome, detail = "wrote outside the output", written
        self.runs += 1
        self.seeds.add(seed)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.peak_mb = max(self.peak_mb, r.peak_mb)
        if r.seconds > self.slowest[0]:
            self.slowest = (r.seconds, seed)
        bad = outcome not in RESULT_OUTCOMES
        self.violations += bad
        if self.json_lines or bad:
            print(json.dumps({"seed": seed, "mutation": what, "argv": spec.argv[1:], "outcome": outcome,
                              "rc": r.rc, "seconds": round(r.seconds, 3), "peak_mb": round(r.peak_mb, 1),
                              "detail": detail}), flush=True)
        return outcome

    def _written(self, spec: RunSpec, before: dict, out_dir: str | None, out_before: set, outcome: str) -> str:
        found = []
        for d in (self.cwd, self.tmp):
            left = os.listdir(d)
            if left:
                found.append(f"{d}: {sorted(left)[:5]}")
                _empty(d)
        for d, names in before.items():
            new = _listing(d) - names
            if new:
                found.append(f"{d}: {sorted(new)[:5]}")
        if out_dir:
            new = _listing(out_dir) - out_before
            allowed = {os.path.basename(spec.output)}
            if new - allowed:
                found.append(f"{out_dir}: {sorted(new - allowed)[:5]}")
            if spec.output and os.path.lexists(spec.output):
                os.unlink(spec.output)
        sentinels = (set(os.listdir(SENTINEL_DIR)) if os.path.isdir(SENTINEL_DIR) else set()) - self.sentinels_before
        if sentinels:
            found.append(f"{SENTINEL_DIR}: {sorted(sentinels)[:5]}")
        return "; ".join(found)

    def summary(self) -> dict:
        sentinels = (set(os.listdir(SENTINEL_DIR)) if os.path.isdir(SENTINEL_DIR) else set()) - self.sentinels_before
        return {"summary": self.outcomes, "violations": self.violations, "mutants": len(self.seeds), "runs": self.runs,
                "sentinels": sorted(sentinels), "max_rss_mb": round(self.peak_mb, 1),
                "seconds": round(time.monotonic() - self.started, 1),
                "slowest": {"seconds": round(self.slowest[0], 2), "seed": self.slowest[1]}}

    def finish(self) -> int:
        """Print the summary line; the exit status of the target (1 on any violation)."""
        s = self.summary()
        shutil.rmtree(self.work, ignore_errors=True)
        print(json.dumps(s), flush=True)
        return 1 if s["violations"] or s["sentinels"] else 0


def _empty(d: str) -> None:
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            os.unlink(p)


def _limit_memory(limit: int):
    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return setup


def run_target(script: str, args: Sequence[str], tmp_path: Path, *, count: int, timeout: float,
               max_rss_mb: float = 1024.0, harness_limit: int = 4 << 30) -> dict:
    """Run the fuzz target ``script`` (a path under tests/) with ``args`` in a child: a fresh TMPDIR
    and working directory that must stay empty, RLIMIT_AS on the harness itself; assert its summary
    (no violation, ``count`` mutants judged, no sentinel, peak memory under ``max_rss_mb``) and
    return it."""
    tmp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT), LC_ALL="C.UTF-8", LANG="C.UTF-8")
    env.pop("FORENSICS_DEBUG", None)
    p = subprocess.Popen([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory(harness_limit))
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"the fuzz run did not finish in {timeout:.0f}s; last lines:\n{out[-3000:]}") from None
    lines = out.strip().splitlines()
    assert lines, f"no output from {script}; stderr:\n{err[-3000:]}"
    summary = json.loads(lines[-1])
    assert p.returncode == 0 and summary["violations"] == 0, out[-6000:] + err[-2000:]
    assert summary["mutants"] == count, summary
    assert set(summary["summary"]) <= set(RESULT_OUTCOMES), summary
    assert summary["sentinels"] == []
    assert os.listdir(tmp) == [] and os.listdir(cwd) == [], (os.listdir(tmp), os.listdir(cwd))
    assert summary["max_rss_mb"] < max_rss_mb, summary
    return summary
