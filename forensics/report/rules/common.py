"""What several incident classes say alike: a reproducer run as a clause, the crash as a phrase, the claims of
the setup, and the runbook's shared steps (the start-up guard, the image's fix and its proof, the binding's pin)."""
from __future__ import annotations

import shlex

from ...guard import default_env
from ...reproduce import Outcome, ReproRun
from ..facts import Facts
from ..grounds import STACK_PACKAGES, Grounds
from ..incident import Claim, Decision, IncidentClass, Step
from ..phrases import failing_call, failure, failure_line, process_name, query_words, where_it_failed

__all__ = ["MODULE_KEYS", "has", "sentence", "who", "run_phrase", "crash_phrase", "where_it_fires", "runs_claim",
           "setup_claims",
           "nvlink", "guard_step", "install_steps", "pin_steps", "runbook_title", "nvidia_call_title",
           "binding_title", "nvitop_title", "nvitop_driver_title"]

MODULE_KEYS = ("imports.nvitop", "imports.nvitop_exporter", "imports.pynvml")


def has(d: Decision, *keys: str) -> tuple[str, ...]:
    """``keys`` the decision's evidence holds, in the order given."""
    return tuple(k for k in keys if k in d.keys)


def sentence(s: str) -> str:
    return s[:1].upper() + s[1:]


def _seconds(t: float) -> str:
    """``0.000412`` -> ``0.41 ms``; ``2.5`` -> ``2.50 s``."""
    return f"{t * 1000:.2f} ms" if t < 1 else f"{t:.2f} s"


def who(r: ReproRun) -> str:
    return "the C reproducer" if r.name == "c" else "the Python reproducer"


def run_phrase(r: ReproRun) -> str:
    """What one reproducer run did, as a clause: ``crashed (SIGABRT) in field-value call #41, 0.003 s after ...``."""
    status = r.status
    if status is Outcome.CRASHED:
        detail = f"crashed ({r.signal or 'a signal'})"
        if r.calls_to_crash:
            detail += f" in field-value call #{r.calls_to_crash}"
        if r.seconds_to_crash is not None:
            detail += f", {_seconds(r.seconds_to_crash)} after its first query"
        return detail
    if status is Outcome.DETECTED:
        return "stopped at the call that corrupted the heap, under glibc's checking allocator"
    if status is Outcome.NOT_STARTED:
        return f"could not start ({r.outcome.removeprefix('could not start: ')})"
    if status is Outcome.CLEAN:
        return "ran clean"
    return r.outcome


def _threads_of(r: ReproRun) -> str | None:
    """The ``--threads`` a reproducer ran with, as its command line says."""
    argv = list(r.command)
    return argv[argv.index("--threads") + 1] if "--threads" in argv[:-1] else None


def where_it_fires(f: Facts) -> str | None:
    """One sentence of where the fault fires, with both runs' results: the C reproducer's calls from worker threads
    and the same calls from the main thread (None: not learned)."""
    c, main = f.c_run, f.main_thread_run
    if c is None or main is None or f.thread_only is None:
        return None
    threads = _threads_of(c) or "N"
    head = ("The fault fires only in calls from threads other than the main one" if f.thread_only else
            "The fault fires in calls from the main thread too")
    did = "ran clean" if main.status is Outcome.CLEAN else main.outcome
    return (f"{head}: the C reproducer {c.outcome} from {threads} worker thread{'s' if threads != '1' else ''} "
            f"(--threads {threads}) and {did} making the same calls from the main thread (--threads 0).")


def crash_phrase(f: Facts) -> str:
    """The crash in words: ``glibc aborts the process with "..." in nvmlDeviceGetFieldValues (...) inside
    libnvidia-ml``."""
    if not f.has_crash:
        if f.kind == "snapshot":
            return "no crash was analysed (the core is a snapshot of the live process, as gcore leaves it)"
        return "the process crashed (no core analysed)"
    what = (f'glibc aborts the process with "{f.abort_message}"' if f.abort_message
            else f"the process dies of {f.signal}")
    if f.api:
        where = f" in {f.api}" + (f" ({f.query.what} query)" if f.query and f.query.what else "")
        what += where + (" inside libnvidia-ml" if f.inside_nvml else "")
    return what


def runs_claim(f: Facts, d: Decision) -> list[Claim]:
    runs = [r for r in (f.python_run, f.c_run) if r]
    if not runs:
        return []
    return [Claim(text=sentence("; ".join(f"{who(r)} {run_phrase(r)}" for r in runs)) + ".",
                  evidence=has(d, *(f"repro.{r.name}" for r in runs)))]


def setup_claims(d: Decision, also: str) -> list[Claim]:
    out = []
    if d.shadowed and not d.has_cause(IncidentClass.INSTALL):  # (a cause of its own: its claims say it)
        out.append(Claim(text="The code that ran is not the installed distribution's: " + "; ".join(d.shadowed)
                         + f". Fix the image {also}.", evidence=has(d, *MODULE_KEYS)))
    if d.unsupported:
        out.append(Claim(text=f"The Python setup is also outside what nvitop declares ({'; '.join(d.unsupported)}); "
                              f"fix that {also}.", evidence=has(d, "imports.requirements", "imports.support")))
    return out


# ---- the runbook's shared steps ----------------------------------------------------------------------------

def nvlink(f: Facts) -> bool:
    """nvitop's NVLink throughput query is the crashing call: nvitop can stop making it (its call pattern matters)."""
    return bool(f.query and f.query.what == "NVLink throughput")


def _site_packages(f: Facts) -> str | None:
    """Where nvitop is installed (its distribution's sys.path entry), as verify-imports read it."""
    for rep in f.imports:
        for dist in rep.distributions:
            if dist.name.lower() == "nvitop":
                return dist.location
    return None


def guard_step(f: Facts, evidence: tuple[str, ...]) -> Step:
    site = _site_packages(f)
    text = ("Stop the crashing call: nvitop-exporter has no option to skip the NVLink metrics, so a start-up guard "
            f"makes nvitop's Device.nvlink_throughput return [] ({default_env('Device.nvlink_throughput')}=0 turns it "
            "off again); write it into the site-packages nvitop is installed in, then restart the exporter")
    command = None
    if site:
        command = ("forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' --out "
                   + shlex.quote(site))
    else:
        text += " (where that is was not in the evidence: run verify-imports to find it)"
    return Step(text=text, command=command, evidence=evidence)


def _verify_command(f: Facts) -> str | None:
    """The verify-imports command that proves an image fix: the image again, or the process's root and command."""
    for rep in f.imports:
        if rep.image.transport.value != "pid":
            return "forensics verify-imports " + shlex.quote(rep.image.ref)
        if rep.python is not None and rep.python.entrypoint.argv:  # a live process: its root, command and directory
            return (f"forensics verify-imports {shlex.quote('dir:' + (rep.image.root or '/'))} --entrypoint "
                    f"{shlex.quote(shlex.join(rep.python.entrypoint.argv))} --workdir "
                    f"{shlex.quote(rep.python.working_dir)}")
    return None


def _stale_trees(f: Facts) -> list[tuple[str, str]]:
    """(module, the stale tree or file) of each stack module a stale copy shadows: the package's directory, or
    the module's file (what verify-imports calls the stale tree)."""
    out: list[tuple[str, str]] = []
    for rep in f.imports:
        for m in rep.modules:
            if m.verdict.value != "SHADOWED" or m.resolved is None or m.module not in STACK_PACKAGES.values():
                continue
            r = m.resolved
            tree = r.search_locations[0] if r.kind.value == "package" and r.search_locations else r.file
            if tree and all(tree != t for _m, t in out):
                out.append((m.module, tree))
    return out


def install_steps(g: Grounds, d: Decision) -> list[Step]:
    """The image's fix (shadowing: verify-imports' fix, the stale trees removed, then the proof that the installed
    code imports), and the supported setup: first for an install incident, after the class's own steps for any
    other."""
    out = []
    keys = tuple(i.key for i in d.items if i.key.startswith("imports."))
    for s in d.shadowed:
        out.append(Step(text=f"Fix the image so that the installed code runs: {s}", command=None, evidence=keys))
    trees = _stale_trees(g.f)
    if trees:
        ran = "; ".join(f"{tree} ({(v.package + ' ' + (v.ran or '?')) if (v := _ran(d, module)) else module})"
                        for module, tree in trees)
        out.append(Step(text=f"Remove the stale code that ran instead of the installed one: {ran} -- from the image "
                             "(the COPY, or the WORKDIR that brings it in) and from where it lies now",
                        command="rm -rf -- " + " ".join(shlex.quote(t) for _m, t in trees), evidence=keys))
    if d.shadowed:
        cmd = _verify_command(g.f)
        out.append(Step(text="Prove it: verify-imports says OK for nvitop, nvitop_exporter and pynvml"
                             + ("" if cmd else " (run it on the fixed image, or with --pid on the restarted process)"),
                        command=cmd, evidence=keys))
    for u in d.unsupported:
        out.append(Step(text=f"Make the setup supported: {u}", command=None, evidence=keys))
    return out


def _ran(d: Decision, module: str):
    """The version fact of the stack package ``module`` belongs to."""
    package = next((p for p, m in STACK_PACKAGES.items() if m == module), None)
    return next((v for v in d.versions if v.package == package), None)


def _declared_binding(f: Facts) -> str | None:
    """nvitop's requirement on nvidia-ml-py, as its distribution declares it (None: not in the evidence)."""
    declared = None
    for rep in f.imports:
        for dist in rep.distributions:
            if dist.name.lower() == "nvitop":
                declared = next((r for r in dist.requires if r.lower().startswith("nvidia-ml-py")), None)
    return declared


def pin_steps(g: Grounds, d: Decision, evidence: tuple[str, ...],
              avoid: str = "whose count overflowed the buffer") -> list[Step]:
    """The supported nvidia-ml-py pin (what nvitop declares, without the release that ran: ``avoid`` says why), as
    the requirement line and the pip command that installs it into the image's environment, then the command that
    proves it took: the binding that interpreter imports is not that release (exit 1 while it is)."""
    f = g.f
    ran = d.version_ran("nvidia-ml-py") or f.binding
    declared = _declared_binding(f)
    pin = (declared.split(";")[0].strip() if declared else "nvidia-ml-py")
    if ran:
        pin += ("," if any(c in pin for c in "<>=!~") else "") + f"!={ran}"
    why = (f" (what nvitop declares, without {ran}, {avoid})" if declared and ran else
           f" (not {ran}, {avoid})" if ran else "")
    out = [Step(text=f"Pin the binding in the image's requirements to `{pin}`{why}, and install it into the image's "
                     "environment (the python3 that runs the program)",
                command=f"python3 -m pip install {shlex.quote(pin)}", evidence=evidence)]
    if ran:
        check = ("import importlib.metadata as m, pynvml; v = m.version('nvidia-ml-py'); "
                 f"print('nvidia-ml-py', v, pynvml.__file__); raise SystemExit(v == {ran!r})")
        out.append(Step(text=f"Prove it: the binding that python3 imports is not {ran} (exit 1 while it is)",
                        command=f"python3 -c {shlex.quote(check)}", evidence=evidence))
    return out


# ---- titles ------------------------------------------------------------------------------------------------

def runbook_title(f: Facts, d: Decision) -> str:
    """The runbook's title: the process and how it failed, where, on which driver, and the class in words; with
    two causes, the failure in short and the causes in the order they are fixed (a title has 256 characters)."""
    if len(d.causes) > 1:
        short = f"{process_name(f)} {failure(f).split(' (')[0]}" if f.has_crash else failure_line(f)
        first, *rest = d.causes
        return f"{short}{where_it_failed(f)}: {first.words}, fixed first; then " + "; then ".join(c.words for c in rest)
    return (f"{failure_line(f)}{where_it_failed(f)}" + (f" on driver {f.driver}" if f.driver and f.has_crash else "")
            + f": {d.words}")


def _nvidia_versions(f: Facts) -> str:
    versions = ", ".join(x for x in (f"driver {f.driver}" if f.driver else "", f"NVML {f.nvml}" if f.nvml else "",
                                      f.gpus or "") if x)
    return f" - {versions}" if versions else ""


def _call_and_verb(f: Facts, d: Decision) -> tuple[str, str]:
    """The NVML call the damage is tied to and what it did, for NVIDIA's titles: glibc's abort in it, or, when
    glibc noticed the corruption later elsewhere, the earlier call and where it was noticed."""
    api = failing_call(f)
    verb = ("corrupts the heap: glibc aborts with \"" + f.abort_message + "\""
            if f.kind == "heap-corruption" and f.abort_message else failure(f))
    if not f.api and f.earlier_api and f.kind == "heap-corruption":  # the damage was found later, elsewhere
        frame = d.item("core.frame")
        where_found = frame.fact.removeprefix("the innermost frame past libc: ") if frame else "later"
        api = f.earlier_api
        verb = (f"corrupts the heap: glibc notices it later, in {where_found}"
                + (f", and aborts with \"{f.abort_message}\"" if f.abort_message else ""))
    return api, verb


def nvidia_call_title(f: Facts, d: Decision) -> str:
    """The NVIDIA driver report's: the call, its query, what it did, the driver, NVML and GPUs."""
    api, verb = _call_and_verb(f, d)
    return f"{api}{query_words(f)} {verb}" + _nvidia_versions(f)


def binding_title(f: Facts, d: Decision) -> str:
    """nvidia-ml-py's report's: the release that ran, the count it passed, the call."""
    api, _verb = _call_and_verb(f, d)
    ran = d.version_ran("nvidia-ml-py") or f.binding
    return (f"nvidia-ml-py {ran or ''} passes a count larger than its buffer to {api}{query_words(f)}: the heap "
            f"{'is corrupted' if f.kind == 'heap-corruption' else 'overflows'}" + _nvidia_versions(f))


def nvitop_title(f: Facts, d: Decision) -> str:
    """nvitop's issue's (after its form's prefix): the process, how it failed, the call, the versions."""
    versions = ", ".join(x for x in (f"nvidia-ml-py {f.binding}" if f.binding else "",
                                      f"driver {f.driver}" if f.driver else "") if x)
    return f"{failure_line(f)}{where_it_failed(f)}{query_words(f)}" + (f" with {versions}" if versions else "")


def nvitop_driver_title(f: Facts, d: Decision) -> str:
    """nvitop's issue of a driver fault: the call it makes crashes on this driver (in C too), and the ask."""
    head = f"{process_name(f)} crashes in {failing_call(f)}{query_words(f)} on driver {f.driver or '?'}" + (
        ", in C too" if f.c_run and f.c_run.failed else "")
    return f"{head}: please allow turning NVLink metrics off" if nvlink(f) else head
