"""forensics report: an upstream-ready defect report (Markdown) from forensics evidence."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK
from ..options import force_option, json_option, output_option
from . import emit

__all__ = ["report"]


@click.command("report")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--template", type=click.Choice(["nvitop", "nvml", "runbook"]), default="nvitop", show_default=True,
              help="nvitop: a GitHub issue for nvitop/nvitop-exporter; nvml: a report for NVIDIA; runbook: an incident record.")
@click.option("--redact-hosts", is_flag=True, help="Also replace host names, IPs, node and pod names (consistently: node-1, node-2...).")
@click.option("--check", is_flag=True, help="Exit 3 when a required field is unfilled or the Markdown would render wrong.")
@json_option
@output_option
@force_option
def report(inputs, template, redact_hosts, check, as_json, output, force):
    """Write an upstream-ready defect report (Markdown) from forensics evidence.

    INPUTS: any mix of `analyze --json`, `verify-imports --json`, `reproduce --json` and
    `fleet --json` documents and capture bundle directories. Secrets are always redacted.

    \b
    Exit codes: 0 written; 1 error; 2 usage; 3 --check found problems.
    """
    from .. import __version__ as version
    from ..output import json_document, write_new
    from ..report import make_report

    rep = make_report(list(inputs), template=template, redact_hosts=redact_hosts, tool_version=version)
    attachment_path = None
    if rep.attachment is not None:
        base = output or f"forensics-report-{template}"
        attachment_path = f"{base}.full.md"
        write_new(attachment_path, rep.attachment, force)
        click.echo(f"Wrote {attachment_path} (the whole report; the issue body is shortened)", err=True)
    if as_json:
        payload = {"report": {"template": template, "title": rep.context.title, "markdown": rep.markdown,
                              "attachment": attachment_path, "problems": list(rep.problems),
                              "missing_fields": rep.context.missing, "redactions": rep.context.redactions,
                              "known_issues": rep.context.known_issues}}
        emit([json_document("report", payload)], output, force)
    else:
        emit([rep.markdown.rstrip("\n")], output, force)
    for p in rep.problems:
        click.echo(f"forensics: check: {p}", err=True)
    sys.exit(EXIT_FINDINGS if check and rep.problems else EXIT_OK)
