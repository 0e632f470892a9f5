"""forensics reproduce: the Python and the C NVML reproducers run with cores on."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK, ReproducerNotStarted
from ..options import FrontDoor, SECONDS, force_option, json_option, output_option
from . import emit, emit_json

__all__ = ["reproduce"]


@click.command("reproduce", cls=FrontDoor,
               common=("sim", "sim_fault", "nvml_path", "threads", "duration", "as_json", "output"))
@click.option("--nvml", "nvml_path", type=click.Path(), default=None,
              help="libnvidia-ml.so.1 to use (a file or its directory); default: the loader's.")
@click.option("--sim", is_flag=True, help="Use the simulated NVML (built from reproducers/simnvml).")
@click.option("--sim-fault", type=click.Choice(["none", "heap", "heap-delayed", "segv", "use-after-shutdown"]),
              default="none", show_default=True)
@click.option("--sim-fault-after", type=int, default=0, show_default=True,
              help="Field-value calls that succeed before the fault.")
@click.option("--sim-heap-message", type=click.Choice(["prev", "next-size"]), default="prev", show_default=True)
@click.option("--sim-fault-thread", type=click.Choice(["any", "non-main"]), default="any", show_default=True)
@click.option("--python", "python_path", default=None, help="Interpreter with nvidia-ml-py for the Python reproducer.")
@click.option("--stack", type=click.Choice(["incident", "current"]), default="current", show_default=True,
              help="Without --python: a cached venv with this PyPI stack (incident: nvitop 1.5.0 + nvidia-ml-py "
                   "12.575.51).")
@click.option("--iterations", type=click.IntRange(1, None), default=1000, show_default=True)
@click.option("--threads", type=click.IntRange(0, 64), default=2, show_default=True,
              help="Querying threads of both reproducers, each querying every GPU (0: the main thread).")
@click.option("--duration", type=SECONDS, default=None, help="Stop each reproducer after S seconds.")
@click.option("--shutdown-race", is_flag=True, help="Call nvmlShutdown while threads still query (Python reproducer).")
@click.option("--malloc-check", is_flag=True,
              help="Both reproducers under glibc's checking allocator: they stop at the culprit call.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where runs go (default: ./forensics-reproduce).")
@click.option("--timeout", type=SECONDS, default=300.0, show_default=True, help="Seconds each reproducer may run.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64", "amd64", "arm64"]), default=None,
              help="Build the C reproducer (and with --sim the simulated NVML) for this architecture; another than "
                   "this machine's runs under qemu-user with --sysroot (default: this machine's).")
@click.option("--sysroot", type=click.Path(file_okay=False, exists=True), default=None,
              help="With another --arch: a root of that architecture (its C library and loader; Debian's "
                   "libc6-dbg there for the heap) to run in, and to analyze the cores with.")
@json_option
@output_option
@force_option
def reproduce(nvml_path, sim, sim_fault, sim_fault_after, sim_heap_message, sim_fault_thread, python_path, stack,
              iterations, threads, duration, shutdown_race, malloc_check, workdir, timeout, arch, sysroot, as_json,
              output, force):
    """Run the Python and the C NVML reproducers with cores on, and say which crashed.

    \b
    With another --arch than this machine's, the Python reproducer runs only with
    --python naming an interpreter of that architecture in --sysroot (/usr/bin/python3.11:
    the root's; nvidia-ml-py on its path or PYTHONPATH).

    Exit codes: 0 neither failed; 1 error, or a reproducer could not start (no
    libnvidia-ml.so.1 to load: use --nvml FILE or --sim); 2 usage; 3 at least one
    reproducer crashed or detected heap corruption.
    """
    from pathlib import Path

    from ..output import json_document
    from ..reproduce import nvml_dir_for, reproduce_payload, run_reproducers
    from ..simnvml import arch_name, build_simnvml, ensure_stack_venv, host_arch, sim_environment
    from ..text.reproduce import format_reproduce

    if nvml_path and sim:
        raise click.UsageError("--nvml and --sim are exclusive")
    guest = arch_name(arch) != host_arch()
    if guest and not sysroot:
        raise click.UsageError(f"--arch {arch} is not this machine's ({host_arch()}): give --sysroot, a root of it")
    wd = Path(workdir or "forensics-reproduce").resolve()
    wd.mkdir(parents=True, exist_ok=True)
    env = None
    sim_settings = {}
    if sim:
        lib_dir = build_simnvml(wd / (f"simnvml-{arch_name(arch)}" if guest else "simnvml"), arch=arch)
        env = sim_environment(lib_dir, fault=sim_fault, fault_after=sim_fault_after, heap_message=sim_heap_message,
                              fault_thread=sim_fault_thread)
        nvml_dir = None  # sim_environment already put it first on LD_LIBRARY_PATH
        sim_settings = {k: v for k, v in env.items() if k.startswith("FORENSICS_SIMNVML_")}
        nvml_label: str | None = str(lib_dir)
    else:
        nvml_dir = nvml_dir_for(nvml_path, wd) if nvml_path else None
        nvml_label = nvml_dir  # None: the loader's
    # a stack venv is this machine's: another architecture's Python reproducer needs its own interpreter
    which = ("c",) if guest and not python_path else ("python", "c")
    python = python_path or ("" if guest else str(ensure_stack_venv(stack)))
    result = run_reproducers(workdir=wd, python=python, nvml_dir=nvml_dir, env=env, iterations=iterations,
                             threads=threads, duration=duration, shutdown_race=shutdown_race,
                             malloc_check=malloc_check, timeout=timeout, sim=sim_settings, which=which, arch=arch,
                             sysroot=sysroot)
    if sim and nvml_label is not None:  # the simulated library's directory
        import dataclasses

        result = dataclasses.replace(result, nvml=nvml_label)
    if as_json:
        payload = reproduce_payload(result)
        emit_json(json_document("reproduce", payload), output, force)
    else:
        emit(format_reproduce(result, nvml_label=nvml_label), output, force)
    if result.not_started:
        raise ReproducerNotStarted([f"the {'Python' if r.name == 'python' else 'C'} reproducer {r.outcome}"
                                    for r in result.not_started])
    sys.exit(EXIT_FINDINGS if any(r.failed for r in result.runs) else EXIT_OK)
