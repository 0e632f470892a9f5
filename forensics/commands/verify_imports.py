"""forensics verify-imports: which files Python really imports in an image or a live process.

Thin: check the arguments, call :func:`~forensics.imports.verify.verify_image` or
:func:`~forensics.imports.verify.verify_pid`, render.  Exit 0 when every module
is OK (and --execute agrees), 3 when not, 1 on errors, 2 on usage.
"""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK
from ..options import FrontDoor, SIZE, force_option, json_option, output_option, verbose_option
from . import emit, emit_json, warn

__all__ = ["verify_imports"]


@click.command("verify-imports", cls=FrontDoor,
               common=("pid", "modules", "execute", "platform", "strict", "as_json"))
@click.argument("ref", required=False)
@click.option("--pid", type=int, default=None, help="Verify a live process through /proc/PID instead of an image.")
@click.option("-m", "--module", "modules", multiple=True, metavar="M",
              help="Also check module M (repeatable); nvitop, nvitop_exporter, pynvml and what the entrypoint runs are "
                   "always checked.")
@click.option("--only", "only_modules", is_flag=True, help="Check only the --module names.")
@click.option("--entrypoint", default=None, metavar="CMD",
              help='The command line to analyse instead of the image\'s Entrypoint+Cmd, e.g. "python -m '
                   'nvitop_exporter".')
@click.option("--workdir", default=None, metavar="DIR",
              help="Working directory instead of the image's WorkingDir (e.g. a Kubernetes workingDir).")
@click.option("--env", "env", multiple=True, metavar="K=V",
              help="Environment variable added to the image's Env (repeatable).")
@click.option("--platform", default=None, metavar="OS/ARCH[/VARIANT]",
              help="The image to read from an image index (a multi-platform image), e.g. linux/arm64; default: this "
                   "machine's, as its container runtime would pull. The report says which it read.")
@click.option("--execute", is_flag=True,
              help="Also run the image's interpreter in a sandbox (bubblewrap; for --pid, the process's own "
                   "namespaces and credentials) and compare.")
@click.option("--driver", default=None, metavar="VERSION",
              help="NVIDIA driver version (e.g. 580.126.09) for the known-issue checks.")
@click.option("--bundle", default=None, type=click.Path(file_okay=False),
              help="A capture bundle (forensics capture) to take the driver version from, when --driver is not given.")
@click.option("--creds", default=None, metavar="USER[:PASS]", help="Registry credentials, passed to skopeo.")
@click.option("--authfile", default=None, type=click.Path(dir_okay=False), help="Registry auth file, passed to skopeo.")
@click.option("--tls-verify", "tls_verify", type=click.BOOL, default=True, show_default=True, metavar="BOOL",
              help="Verify registry TLS (--tls-verify=false for a plain-HTTP or self-signed registry), passed to "
                   "skopeo.")
@click.option("--max-size", type=SIZE, default="64G", show_default=True,
              help="Bound on the image's uncompressed bytes.")
@click.option("--max-files", default=2_000_000, show_default=True, help="Bound on the image's layer entries.")
@click.option("--strict", is_flag=True,
              help="Also exit 3 on requirement conflicts, any known issue and delivery warnings.")
@json_option
@output_option
@force_option
@verbose_option
def verify_imports(ref, pid, modules, only_modules, entrypoint, workdir, env, platform, execute, driver,
                   bundle, creds, authfile, tls_verify, max_size, max_files, strict, as_json, output, force, verbose):
    """Check which files Python really imports in an image (or a live process).

    REF names the image the way skopeo does: oci:DIR[:TAG], docker-archive:FILE.tar,
    dir:ROOTFS, or a registry reference HOST[:PORT]/REPO:TAG, docker://...,
    docker-daemon:..., containers-storage:... (fetched with skopeo).

    \b
    Verdicts: OK, SHADOWED, CONFLICT, UNMANAGED, MISSING, VERSION-MISMATCH.
    Exit codes: 0 OK; 3 not OK: a finding about the image (its command
    cannot start, no interpreter, no config for a dir: root, ...), a module
    not OK, --execute disagrees, a known issue of severity error, or an
    uncertain static verdict that --execute did not settle (with --strict also
    requirement conflicts, any known issue, delivery warnings); 1 error
    (an image index without this machine's or --platform's image among
    them); 2 usage.
    """
    from ..imports.format import report_payload
    from ..text.imports import format_report
    from ..imports.layerstream import LayerLimits
    from ..imports.sources import SkopeoOptions, parse_platform
    from ..imports.verify import VerifyOptions, verify_image, verify_pid
    from ..output import json_document

    if (ref is None) == (pid is None):
        raise click.UsageError("give an image REF or --pid PID (one of them)")
    if only_modules and not modules:
        raise click.UsageError("--only needs at least one --module")
    pairs = []
    for item in env:
        if "=" not in item:
            raise click.UsageError(f"--env {item!r}: expected KEY=VALUE")
        k, _, v = item.partition("=")
        pairs.append((k, v))
    if driver is None and bundle is not None:
        from ..imports.driver import read_bundle_driver

        driver = read_bundle_driver(bundle)
        if driver is None:
            warn(f"no driver version recorded in {bundle}; driver checks skipped")
    limits = LayerLimits(max_bytes=max_size, max_files=max_files)
    options = VerifyOptions(modules=tuple(modules), only_modules=only_modules, entrypoint=entrypoint, workdir=workdir,
                            env=tuple(pairs), platform=parse_platform(platform) if platform else None,
                            execute=execute, driver=driver,
                            skopeo=SkopeoOptions(creds=creds, authfile=authfile, tls_verify=tls_verify), limits=limits)
    report = verify_pid(pid, options) if pid is not None else verify_image(ref, options)
    for w in report.image.warnings:
        warn(w)
    if as_json:
        emit_json(json_document("verify-imports", {"result": report_payload(report, strict=strict)}), output, force)
    else:
        from ..output import to_jsonable
        from ..redact import redact_lines

        # masked as --json is: the secrets learned from the same document (a process's command line and
        # environment under --pid), then masked on every line
        emit(redact_lines(format_report(report, verbose=verbose, strict=strict),
                          to_jsonable(report_payload(report, strict=strict))), output, force)
    sys.exit(EXIT_FINDINGS if report.failures(strict=strict) else EXIT_OK)
