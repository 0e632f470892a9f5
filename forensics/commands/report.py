"""forensics report: an upstream-ready defect report (Markdown) from forensics evidence."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_FINDINGS, EXIT_OK
from ..modes import ReportTemplate, values
from ..options import FrontDoor, force_option, json_option, output_option, store_read_options
from . import echo, emit, emit_document, emit_json

__all__ = ["report"]


@click.command("report", cls=FrontDoor,
               common=("template", "check", "as_json", "output"))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--template", type=click.Choice(values(ReportTemplate)), default=ReportTemplate.NVITOP.value,
              show_default=True, help="; ".join(f"{t.value}: {t.help}" for t in ReportTemplate) + ".")
@click.option("--redact-hosts/--keep-hosts", default=None,
              help="Replace host, node and pod names and IPs (host-1, node-1...). Default: replaced in the nvitop and "
                   "nvml reports (with local paths), kept in the runbook.")
@click.option("--issue-form", type=click.Path(dir_okay=False), default=None,
              help="A newer copy of nvitop's .github/ISSUE_TEMPLATE/bug-report.yaml to follow (default: the shipped "
                   "copy).")
@click.option("--nvidia-link", default="", help="The URL of the NVIDIA report, for the nvitop issue to link.")
@click.option("--check", is_flag=True, help="Exit 3 when a required field is unfilled, the title is not plain text, "
              "the form is not followed or the Markdown would render wrong. Given report .md files, check those.")
@click.option("--body-only", is_flag=True,
              help="Write the body alone, without the YAML front matter (the title goes to stderr): "
                   "for `gh issue create --title TITLE --body-file FILE`.")
@click.option("--explain", is_flag=True, help="Also list, on stderr, each claim of the conclusion with the evidence "
              "items it rests on, who gets which report and the steps (--json: always in the document).")
@store_read_options
@json_option
@output_option
@force_option
def report(inputs, template, redact_hosts, issue_form, nvidia_link, check, body_only, explain, as_json, output,
           force, endpoint_url, region, profile, deadline):
    """Write an upstream-ready defect report (Markdown) from forensics evidence.

    INPUTS: any mix of `analyze --json`, `verify-imports --json`, `reproduce --json` and
    `fleet --json` documents and capture bundle directories (s3://BUCKET/KEY: a bundle in a
    bucket, fetched into the forensics cache first). Secrets are always redacted.
    The report states the conclusion first and says where to file it; with -o FILE its
    attachments (reproducers, every thread's stacks, nvidia-smi -q) go into FILE's stem +
    ".files/" beside it.  `report --check REPORT.md ...` checks written reports.

    \b
    Exit codes: 0 written (or checked clean); 1 error; 2 usage; 3 --check found problems.
    """
    from .. import __version__ as version
    from ..output import json_document
    from ..report import attachment_dir_for, check_report_file, make_report, write_report
    from ..report.explain import explain_lines, explanation

    if check and all(str(p).endswith(".md") for p in inputs):
        results = [(p, *check_report_file(p, issue_form=issue_form)) for p in inputs]
        if as_json:
            emit_json(json_document("report-check", {"reports": [{"path": p, "template": t, "problems": pr}
                                                              for p, t, pr in results]}), output, force)
        else:
            emit([line for p, _t, pr in results
                  for line in [f"{p}: " + ("OK" if not pr else f"{len(pr)} problem(s)")] + [f"  {x}" for x in pr]],
                 output, force)
        sys.exit(EXIT_FINDINGS if any(pr for _p, _t, pr in results) else EXIT_OK)
    if any(str(p).startswith("s3://") for p in inputs):  # bundles in a bucket: fetched into the cache first
        from ..objstore.client import StoreOptions
        from ..objstore.fetch import fetch_inputs

        fetched: list[str] = []
        inputs = fetch_inputs(inputs, StoreOptions(endpoint_url=endpoint_url, region=region, profile=profile,
                                                   deadline=deadline), problems=fetched)[0]
        for p in fetched:
            echo(f"forensics: warning: {p}", err=True)
    files_dir = attachment_dir_for(output).name if output else ""
    rep = make_report(list(inputs), template=template, redact_hosts=redact_hosts, tool_version=version,
                      issue_form=issue_form, nvidia_link=nvidia_link, attachment_dir=files_dir)
    c = rep.context.conclusion
    if body_only:  # what an issue tracker's body is: its title is given apart (gh issue create --title)
        import dataclasses

        rep = dataclasses.replace(rep, markdown=rep.body)
        echo(f"forensics: title: {rep.title}", err=True)
    if as_json:
        payload = {"report": {
            "template": template, "title": rep.title, "markdown": rep.markdown, "body": rep.body,
            "attachments": rep.attachments, "problems": list(rep.problems), "missing_fields": rep.context.missing,
            "footer": rep.context.footer,
            "conclusion": {"incident": c.incident.value, "statement": c.statement,
                           "explain": explanation(c),
                           "unsupported": list(c.unsupported), "upgrade": list(c.upgrade),
                           "filings": [{"order": x.order, "where": x.where, "report": x.report.value,
                                        "action": x.action} for x in c.filings]},
            "known_issues": [{"id": k.id, "title": k.title, "matched_on": list(k.matched_on),
                              "sources": [url for _label, url in k.sources]} for k in rep.context.known_issues]}}
        emit_json(json_document("report", payload, redact=False), output, force)  # redacted as the report is
    elif output:
        for p in write_report(rep, output, force=force):
            echo(f"Wrote {p}", err=True)
    else:
        emit_document(rep.markdown, None, force)
        if rep.attachments:
            echo(f"forensics: {len(rep.attachments)} attachments not written (pass -o FILE to write them "
                 f"beside the report): {', '.join(sorted(rep.attachments))}", err=True)
    echo(f"forensics: conclusion: {c.statement}", err=True)
    echo(f"forensics: incident: {c.incident.value} ({c.words})", err=True)
    if explain:
        for line in explain_lines(c):
            echo(f"forensics: explain: {line}", err=True)
    for x in c.filings:
        echo(f"forensics: file ({x.order}) the {x.report.value} report -> {x.where}: {x.action}", err=True)
    for p in rep.problems:
        echo(f"forensics: check: {p}", err=True)
    sys.exit(EXIT_FINDINGS if check and rep.problems else EXIT_OK)
