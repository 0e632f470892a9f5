"""``forensics report``: evidence -> redacted facts -> the conclusion -> Markdown in the upstream's form.

:func:`make_report` is the one entry point; its stages are one function each:
:func:`~.evidence.load_evidence` (read), redaction and localization of the evidence tree,
:func:`~.facts.read_facts` (facts), :func:`~.known.match_known_issues`, :func:`~.verdict.decide`
(the conclusion and which report to file where), :func:`~.context.build_context`, then the
template (``forensics/report/templates``).  :func:`write_report` writes the Markdown and its
attachments beside it; :func:`check_report_file` checks a written report against the form.

A report file is YAML front matter (the plain-text title, where to file it, the attachments)
followed by the body to paste.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .context import REQUIRED_FIELDS, TEMPLATES, UNKNOWN, UPSTREAM, ReportContext, build_context
from .evidence import Evidence, load_evidence
from .form import IssueForm, check_form_body, load_shipped_form, read_issue_form
from .markdown import GITHUB_ISSUE_LIMIT, check_markdown, escape, fence
from ..errors import ForensicsError, ReportInputError
from ..format import load_analysis
from ..imports.format import load_import_report
from ..model import HeapChunk, HeapCorruption, HeapReport
from ..output import escape_text
from ..redact import Redactor, facts_of, redact_tree
from ..reproduce import load_reproduce

__all__ = ["Report", "make_report", "render", "environment", "write_report", "check_report_file",
           "split_front_matter", "check_title", "attachment_dir_for", "claims_path_for", "claims_record",
           "check_claims", "TEMPLATES", "heap_section", "escape_value", "TEXT_KEYS"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    title: str  # plain text
    body: str  # the Markdown to paste (under GitHub's limit)
    markdown: str  # front matter + body: what `report` writes
    attachments: dict[str, str]  # file name -> text, written beside the report
    context: ReportContext
    problems: tuple[str, ...]  # --check findings


@functools.lru_cache(maxsize=1)
def environment():
    """The one jinja2 environment: package templates, StrictUndefined, Markdown-safe filters."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("forensics", "report/templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # Markdown, not HTML: every untrusted value goes through |md or |fence
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters["md"] = escape
    env.filters["fence"] = fence
    env.policies["json.dumps_kwargs"] = {"sort_keys": True}
    env.globals["unknown"] = UNKNOWN
    return env


def render(ctx: ReportContext) -> str:
    """The Markdown body of ``ctx``."""
    data = {k: getattr(ctx, k) for k in ctx.__dataclass_fields__}
    text = environment().get_template(f"{ctx.template}.md.j2").render(**data)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def _front_matter(ctx: ReportContext, attachment_dir: str) -> str:
    """YAML front matter: the title and where to file this report (json.dumps strings are valid YAML)."""
    filing = next((x for x in ctx.conclusion.filings if x.report == ctx.template), None)
    if ctx.template == "nvitop" and ctx.form:
        where = ctx.form.new_issue_url
    elif ctx.template == "nvml":
        from .decision import NVIDIA_WHERE

        where = NVIDIA_WHERE
    elif ctx.template == "binding":
        from .decision import BINDING_WHERE

        where = BINDING_WHERE
    else:
        where = "the incident record (internal)"
    lines = ["---", f"title: {json.dumps(ctx.title, ensure_ascii=False)}", f"file-at: {json.dumps(where)}"]
    if filing:
        lines.append(f"when: {json.dumps(f'{filing.order}. {filing.action}', ensure_ascii=False)}")
    elif ctx.template in UPSTREAM:
        lines.append(f"when: {json.dumps('not now: ' + '; '.join(x.action for x in ctx.conclusion.filings))}")
    lines.append(f"conclusion: {json.dumps(ctx.conclusion.incident.value)}")
    if ctx.template == "nvitop" and ctx.form:
        lines.append(f"labels: {json.dumps(list(ctx.form.labels))}")
        lines.append(f"form: {json.dumps(ctx.form.source)}")
        lines.append("before-filing: \"tick the form's required checkboxes once you have done what they say\"")
    if ctx.attachments:
        lines.append("attachments:")
        for name in sorted(ctx.attachments):
            lines.append(f"  - {json.dumps(f'{attachment_dir}/{name}' if attachment_dir else name)}")
    lines.append("---")
    return "\n".join(lines) + "\n\n"


def split_front_matter(text: str) -> tuple[dict, str]:
    """(front matter, body) of a report file; ({}, text) when it has none."""
    import yaml

    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        return {}, text
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[end + 5:].lstrip("\n")


def check_title(title: str) -> list[str]:
    """A GitHub title is plain text: no Markdown heading, no backslash escapes, one line, <= 256 characters."""
    problems = []
    if not title.strip():
        problems.append("the title is empty")
    if title.lstrip().startswith("#") or re.search(r"\\[\\`*_\[\]<>|~#]", title):
        problems.append("the title has Markdown in it (GitHub titles are plain text)")
    if "\n" in title or len(title) > 256:
        problems.append("the title is not one line of at most 256 characters")
    return problems


def _check(body: str, ctx: ReportContext) -> list[str]:
    # an upstream report the incident does not route to its owner is not to be filed: its fields are not required
    routed = ctx.template == "runbook" or any(x.report == ctx.template for x in ctx.conclusion.filings)
    problems = [f"required field {f!r} is not filled" for f in ctx.missing
                if f in REQUIRED_FIELDS[ctx.template] and routed]
    problems += check_title(ctx.title)
    problems += check_markdown(body)
    if ctx.template == "nvitop" and ctx.form:
        problems += check_form_body(body, ctx.form)
    return problems


def _manifest_problems(docs: dict) -> tuple[list[str], list[str]]:
    """The capture bundles' files that do not match their manifest (``PATH: changed``: what every report says
    under its conclusion), and one problem line per such bundle (the runbook's evidence table also names each
    file instead of a hash)."""
    files: list[str] = []
    lines = []
    for doc in docs.get("capture") or []:
        bad = [str(p) for p in doc.get("manifest_problems") or []]
        files += bad
        if bad:
            lines.append(f"bundle {doc.get('_bundle_dir')}: {len(bad)} file(s) do not match its MANIFEST.json: "
                         + "; ".join(bad[:5]) + ("; ..." if len(bad) > 5 else ""))
    return files, lines


def _hosts_in(ev: Evidence) -> dict[str, str]:
    """Node, pod and host names the evidence names, to be replaced consistently: the capture's identity and
    scheduling, and the values of --hostname / --host / --node-name options in the command lines."""
    out: dict[str, str] = {}
    for doc in ev.all("capture"):
        sched = doc.get("scheduling") or {}
        for name, kind in ((((sched.get("node") or {}).get("name")), "node"),
                           (((sched.get("pod") or {}).get("name")), "pod"),
                           ((doc.get("record") or {}).get("node"), "node"),
                           ((doc.get("identity") or {}).get("node"), "node"),
                           ((doc.get("identity") or {}).get("pod"), "pod"),
                           ((doc.get("identity") or {}).get("agent_pod"), "pod"),
                           ((doc.get("identity") or {}).get("hostname"), "host")):
            if isinstance(name, str) and name:
                out.setdefault(name, kind)
    texts = [load_analysis(doc).snapshot.core.args for doc in ev.all("analyze")]
    for doc in ev.all("capture"):
        cmd = (doc.get("snapshot") or {}).get("cmdline")
        texts.append(" ".join(cmd) if isinstance(cmd, list) else str(cmd or ""))
    for doc in ev.all("verify-imports"):
        python = load_import_report(doc).python
        texts.append(" ".join(python.entrypoint.argv) if python else "")
    for t in texts:
        for m in re.finditer(r"--(?:hostname|host|node-name|nodename)(?:=|\s+)([A-Za-z0-9][A-Za-z0-9.-]{0,252})", t):
            if not re.fullmatch(r"[\d.]+", m.group(1)) and m.group(1) not in ("localhost",):
                out.setdefault(m.group(1), "host")
    return out


def make_report(paths: list[str], **kw: Any) -> Report:
    """Read the evidence, redact it, decide, render the template, and check the result (:func:`_make_report`).

    :raises ReportInputError: also for evidence of the right kind whose values have the wrong type or form
        (a hex string that is not hex, an object where a list belongs): the documents are read where the
        report needs each fact, so a lying document fails there, and is said to be the input's fault
    """
    try:
        return _make_report(paths, **kw)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        if isinstance(e, ForensicsError):
            raise
        raise ReportInputError(", ".join(paths), f"a value of the wrong type or form ({e.__class__.__name__}: "
                                                 f"{str(e)[:200]})") from e


def _make_report(paths: list[str], *, template: str = "nvitop", redact_hosts: bool | None = None,
                 known_hosts: dict[str, str] | None = None, tool_version: str = "",
                 reproducer_sources: dict[str, str] | None = None, issue_form: str | None = None,
                 nvidia_link: str = "", attachment_dir: str = "") -> Report:
    """Read the evidence, redact it, decide, render the template, and check the result.

    :param redact_hosts: replace host, node and pod names and IPs; None: yes for the upstream templates
        (nvitop, nvml), no for the runbook.  Upstream templates also replace local paths.
    :param issue_form: a newer copy of nvitop's issue form (YAML) to follow instead of the shipped one
    :param nvidia_link: the NVIDIA report's URL, for the nvitop issue to link
    :param attachment_dir: where the attachments will be written, as the report names it
    """
    from .facts import read_facts
    from .known import match_known_issues
    from .localize import PathLocalizer
    from .verdict import decide

    if template not in TEMPLATES:
        raise ValueError(template)
    upstream = template in UPSTREAM
    hosts = upstream if redact_hosts is None else redact_hosts
    form: IssueForm | None = None
    if template == "nvitop":
        form = read_issue_form(issue_form) if issue_form else load_shipped_form()
    ev: Evidence = load_evidence(paths)
    _analyze_bundles(ev)
    redactor = Redactor(hosts=hosts, known_hosts=dict(known_hosts or {}))
    if hosts:
        redactor.known_hosts.update(_hosts_in(ev))
    # Redact the whole evidence tree once, before anything is picked out of it; first learn every secret
    # value in it (and in the evidence paths), so that each is masked wherever it appears.
    item_paths = [i.path for i in ev.items]
    redactor.facts |= facts_of(ev.docs)  # a learned secret equal to a signal, frame or library name stays there
    redactor.learn({"docs": ev.docs, "paths": item_paths})
    localizer = PathLocalizer(prefixes=_local_prefixes(ev))

    def finish(text: str, key: str | None) -> str:
        return escape_value(localizer.text(text) if upstream else text, key)

    # one walk: every key and value redacted, localized (upstream) and escaped
    docs = {k: [redact_tree(d, redactor, finish=finish) for d in v] for k, v in ev.docs.items()}
    facts = read_facts(Evidence(docs=docs, items=ev.items))
    known = match_known_issues(facts)
    conclusion = decide(facts, known)
    if reproducer_sources is None:
        from ..errors import ForensicsError
        from ..resources import reproducer_sources as shipped_sources

        try:
            reproducer_sources = shipped_sources()
        except ForensicsError:
            reproducer_sources = {}
    evidence = [{"path": escape_value(redactor.text(i.path), None), "kind": i.kind, "sha256": i.sha256,
                 "size": str(i.size), "problem": i.problem} for i in ev.items]
    heap = heap_section(facts.analysis.heap) if facts.analysis and facts.analysis.heap else None
    ctx = build_context(facts, template, conclusion, known, tool_version=tool_version, footer=[],
                        evidence=evidence, reproducer_sources=reproducer_sources, form=form,
                        nvidia_link=nvidia_link, heap=heap, attachment_dir=attachment_dir)
    redactor.absorb(ev.docs)  # what analyze --json, verify-imports --json... masked before this report read them
    ctx.footer = _footer(redactor, localizer, upstream, hosts) + redactor.title_note(docs, ctx.title)
    ctx.manifest_mismatch, manifest_lines = _manifest_problems(docs)
    body = render(ctx)
    if len(body) >= GITHUB_ISSUE_LIMIT:
        ctx.attachments["full-report.md"] = body
        body = (body[: GITHUB_ISSUE_LIMIT - 200].rsplit("\n", 1)[0]
                + "\n\n(cut: the whole report is attached as full-report.md)\n")
    problems = manifest_lines + _check(body, ctx) + conclusion.unsupported_claims()
    return Report(title=ctx.title, body=body, markdown=_front_matter(ctx, attachment_dir) + body,
                  attachments=dict(ctx.attachments), context=ctx, problems=tuple(problems))


#: evidence strings that are many lines by nature (they keep their newlines and tabs, nothing else)
TEXT_KEYS = frozenset({"nvidia_smi", "kernel_log", "bug_report_text", "os_release_image", "os_release_node",
                       "stderr_tail"})


def escape_value(value: str, key: str | None) -> str:
    """A string of the evidence tree with its control characters escaped, before anything is picked out of
    it: a command line, a thread, frame or file name, a dict key (what the crashed process controls) can
    neither forge a line in a fenced block nor drive the terminal the report is read on.  The texts of
    :data:`TEXT_KEYS` keep their line breaks and tabs; any other string loses the line end it may close with.

    >>> escape_value("x\\r\\nThread 1 [FORGED]", "args"), escape_value("a\\nb\\tc\\x1b[2J", "kernel_log")
    ('x\\\\x0d\\\\x0aThread 1 [FORGED]', 'a\\nb\\tc\\\\x1b[2J')
    """
    if key in TEXT_KEYS:
        return escape_text(value, keep="\n\t")
    return escape_text(value.rstrip("\r\n"))  # a line's own end forges nothing


_HOST_KINDS = {"host names": ("host name", "host names"), "IP addresses": ("IP address", "IP addresses"),
               "node names": ("node name", "node names"), "pod names": ("pod name", "pod names")}


def _count_phrase(what: str, n: int) -> str:
    """``3 bearer tokens``, ``1 bearer token``: the redactor counts by plural phrases; the head noun is
    the first word ending in s of the phrase's last part (``passwords in URLs`` -> ``password in URLs``)."""
    one, many = _HOST_KINDS.get(what, (None, what))
    if one is None:
        words = what.split(" ")
        cut = min([words.index(w) for w in ("in", "with") if w in words] or [len(words)])
        for i in range(cut - 1, -1, -1):
            if words[i].endswith("s") and not words[i].endswith("ss"):
                words[i] = words[i][:-1]
                break
        one = " ".join(words)
    return f"{n} {one if n == 1 else many}"


def _footer(redactor: Redactor, localizer, upstream: bool, hosts: bool) -> list[str]:
    """What was replaced in the evidence before this report was written, by kind."""
    secrets = [_count_phrase(w, n) for w, n in sorted(redactor.counts.items()) if w not in _HOST_KINDS]
    out = ["secrets: " + (", ".join(secrets) if secrets else
                          "none found (URL credentials, NAME=value and option pairs with secret-like names, tokens, "
                          "private keys)")]
    if hosts:
        names = [_count_phrase(w, n) for w, n in sorted(redactor.counts.items()) if w in _HOST_KINDS]
        out.append("host, node and pod names and IPs: " + (", ".join(names) + " (now host-N, node-N, pod-N, ip-N)"
                                                           if names else "none found"))
    if upstream:
        out.append("local paths: " + (", ".join(localizer.summary()) if localizer.summary() else "none found"))
    return out


def _local_prefixes(ev: Evidence) -> tuple[str, ...]:
    """This machine's places the evidence names: where its files and bundles are, the reproducers' work
    directory, forensics' cache and checkout, the user's home."""
    out = {str(Path.home())}
    for item in ev.items:
        out.add(str(Path(item.path).resolve().parent))
    for doc in ev.all("capture"):
        if doc.get("_bundle_dir"):
            out.add(str(Path(doc["_bundle_dir"]).parent))
    for doc in ev.all("reproduce"):
        for r in load_reproduce(doc).runs:
            out.add(str(Path(r.run_dir).parent.parent))  # <workdir>/reproduce-<stamp>/<name>
    for doc in ev.all("analyze"):
        core = load_analysis(doc).snapshot.core.path
        if core.startswith("/"):
            out.add(str(Path(core).parent))
    try:
        from ..cache import cache_dir

        out.add(str(cache_dir()))
    except Exception:  # noqa: BLE001 - no cache configured: nothing to learn
        pass
    out.add(str(Path(__file__).resolve().parents[2]))  # the checkout or site-packages forensics runs from
    return tuple(sorted(p for p in out if p not in ("/", "")))


def _hexaddr(v: int | None) -> str:
    return f"0x{v:x}" if v is not None else "?"


def _buffer_phrase(c: HeapCorruption, over: HeapChunk) -> str:
    """The buffer that overflowed: the Python object holding it and the call it was passed to, or the chunk."""
    chunk = f"the chunk at {_hexaddr(over.address)} (size {_hexaddr(over.size)}, {c.usable_size} usable bytes)"
    owner, call = c.owner, c.call
    if owner is None:
        same = c.rejected is not None and c.rejected.address == over.address
        return chunk + (", the chunk glibc was freeing" if same else "")
    obj = owner.object
    entries = f"{obj.length} entries of {obj.element_size} bytes, " if obj.length is not None and obj.element_size \
        else ""
    where = owner.file.rsplit("/", 1)[-1]
    buffer = (f"`{owner.name}`, a {obj.type_name} ({entries}{obj.size} bytes)"
              + (f", a local of {owner.function} ({where}:{owner.line})" if owner.function else "") + f", in {chunk}")
    if call is not None:
        args = call.arguments
        bi, ci = call.buffer_argument, call.count_argument
        passed = args[bi] if 0 <= bi < len(args) else owner.name
        count = (f" with count={call.count}" + (f" ({args[ci]})" if ci is not None and 0 <= ci < len(args) else "")
                 if call.count is not None else "")
        lib = (call.library or "").rsplit("/", 1)[-1]
        buffer += (f", passed as {passed}{count} to {call.function or 'a native function'}"
                   + (f" in {lib}" if lib else ""))
    return buffer


def _overflow_summary(c: HeapCorruption, over: HeapChunk, *, brief: bool = False) -> str:
    """The heap section's paragraph, conclusion first: who wrote past the buffer (or why the heap cannot
    say), then the chunk, the Python object and the call it was passed to, the overflow and its first bytes."""
    out = [f"Conclusion: {c.verdict_words}: {c.verdict_reason}.", f"The buffer: {_buffer_phrase(c, over)}."]
    if c.overflow_length is None:  # the chunk's own header was written over: no length past the end is shown
        own = next((i for i in c.inconsistencies if "own header was written over" in i), c.overflow_basis)
        out.append(f"No write past the buffer's end is shown: {own}" + (
            "." if brief else f"; glibc aborted with \"{c.message}\" ({c.check})."))
        return " ".join(out)
    length = f"{'' if c.overflow_exact else 'at least '}{c.overflow_length} bytes"
    past = (f"{length} past the {c.buffer_size}-byte buffer's end ({c.overflow_past_usable} past "
            "the chunk's usable size)" if c.buffer_size is not None else f"{length} past its usable size")
    if brief:
        out.append(f"Overflow: {past}.")
        return " ".join(out)
    damaged = c.damaged.address if c.damaged else None
    out.append(f"Overflow: {past}, over the header of the chunk at {_hexaddr(damaged)}; glibc aborted with "
               f"\"{c.message}\" ({c.check}).")
    raw = bytes.fromhex(c.first_bytes or "")
    if raw:
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in raw)
        out.append(f"First bytes past the end: {raw.hex(' ')} ({shown}).")
    return " ".join(out)


def _corruption_lines(c: HeapCorruption) -> list[str]:
    """The facts the heap section's paragraph rests on, one each."""
    lines = []
    if c.rejected is not None:
        lines.append(f"rejected chunk {_hexaddr(c.rejected.address)}, size {_hexaddr(c.rejected.size)}, "
                     f"found in {c.rejected_found_by}")
    lines += [f"inconsistent: {i}" for i in c.inconsistencies]
    if c.overflowed is not None and c.overflow_basis:  # the chunk, the length and the first bytes are in the summary
        lines.append(f"overflow measured by: {c.overflow_basis}")
    if c.call is not None:
        lines.append(f"native call in progress: {c.call.function}({', '.join(c.call.arguments)}) "
                     f"from {c.call.caller} ({c.call.file}:{c.call.line})")
    freed = c.freed_by
    if freed is not None:
        lines.append(f"glibc aborted in {freed.entry}() called by {freed.function} ({c.freed_in or '?'})"
                     + (f" inside {freed.call}" if freed.call else "")
                     + (f"; the Python frame making the call: {freed.python_caller}" if freed.python_caller else ""))
    return lines + [f"note: {p}" for p in c.problems]


def heap_section(heap: HeapReport) -> dict[str, Any] | None:
    """The report's heap section from an analysis's heap reading (#21), None when it has nothing to say:
    {"summary", "brief", "lines"}.

    ``summary`` is one paragraph (which buffer overflowed, by how much, who wrote past it);
    ``brief`` the same without glibc's check and the bytes (for a line in the nvitop issue and the
    runbook); ``lines`` are the facts it rests on, one each.

    >>> from forensics.model import HeapReport
    >>> heap_section(HeapReport(problems=("no libc mapped",)))["summary"]
    "The core's heap could not be read: no libc mapped."
    """
    c = heap.corruption
    if c is None and heap.summary is None and not heap.problems:
        return None
    lines: list[str] = []
    brief = None
    if c is None:
        summary = ("The core's heap could not be read: " + "; ".join(heap.problems) + "." if heap.problems
                   else "The crash is not a heap corruption glibc detected.")
    else:
        if c.overflowed is not None:
            summary = _overflow_summary(c, c.overflowed)
            brief = _overflow_summary(c, c.overflowed, brief=True)
        elif c.rejected is not None:
            found = "; ".join(c.inconsistencies) or "the overflowing buffer was not found"
            summary = f"glibc rejected the chunk at {_hexaddr(c.rejected.address)} ({c.check}); {found}."
        else:
            summary = f"glibc's check ({c.check}) names no chunk found in the core: " + \
                "; ".join(c.problems or (c.verdict_reason,))
        lines += _corruption_lines(c)
    s = heap.summary
    if s is not None:
        heaps = sum(len(a.heaps) for a in s.arenas)
        broken = [p for a in s.arenas for p in a.problems]
        lines.append(f"glibc {s.glibc_version}: {len(s.arenas)} arena(s), {heaps} heap(s)"
                     + (f"; {len(broken)} problem(s): " + "; ".join(broken[:3]) if broken else ", every chain whole"))
    return {"summary": summary, "brief": brief or summary, "lines": lines}


def _analyze_bundles(ev: Evidence) -> None:
    """A bundle with a core and no analysis among the inputs is analysed (its objects are its sysroot)."""
    if ev.all("analyze"):
        return
    from ..analyze import analyze_core
    from ..bundle import is_bundle
    from ..format import analysis_payload
    from ..output import json_document

    for doc in ev.all("capture"):
        bundle = doc.get("_bundle_dir")
        if bundle and is_bundle(bundle):
            try:
                a = analyze_core(bundle)
            except ForensicsError:
                continue
            doc = json.loads(json_document("analyze", {"analysis": analysis_payload(a)}))
            ev.docs.setdefault("analyze", []).append(doc)
            return


def write_report(rep: Report, output: str, *, force: bool = False) -> list[str]:
    """Write the report to ``output`` and its attachments into ``<output stem>.files/`` beside it.

    :return: the paths written
    :raises OutputExists: when a file exists and not ``force``
    """
    from ..errors import OutputExists
    from ..output import check_output_path, text_document, write_new

    check_output_path(output)  # its directory exists: nothing is created above the report
    out = Path(output)
    files_dir = attachment_dir_for(output)
    written = []
    claims = json.dumps(claims_record(rep), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    targets = [(out, rep.markdown), (claims_path_for(output), claims)] + [
        (files_dir / name, text) for name, text in sorted(rep.attachments.items())]
    if not force:
        for p, _ in targets:
            if p.exists():
                raise OutputExists(str(p))
    if rep.attachments:
        files_dir.mkdir(exist_ok=True)
    for p, text in targets:
        write_new(str(p), text_document(text), force)  # the text stdout gets: escaped once, here
        written.append(str(p))
    return written


def attachment_dir_for(output: str) -> Path:
    """``report-nvml.md`` -> ``report-nvml.files`` (beside it)."""
    out = Path(output)
    return out.with_name((out.stem if out.suffix == ".md" else out.name) + ".files")


def claims_path_for(output: str) -> Path:
    """``report-nvml.md`` -> ``report-nvml.claims.json`` (beside it): the claims and the evidence they rest on."""
    out = Path(output)
    return out.with_name((out.stem if out.suffix == ".md" else out.name) + ".claims.json")


def _claim_lines(body: str, rendered: list[str]) -> list[tuple[str, list[str]]]:
    """The body's lines that hold a claim, each with what is left of it once its claims are taken out (pieces)."""
    out = []
    for line in body.split("\n"):
        if not any(r and r in line for r in rendered):
            continue
        for r in sorted(rendered, key=len, reverse=True):  # the longest first: a claim may contain a shorter one
            if r:
                line = line.replace(r, "\0")
        out.append((line, [x.strip() for x in line.split("\0") if x.strip()]))
    return out


def claims_record(rep: Report) -> dict[str, Any]:
    """What ``report -o`` writes beside the report (:func:`claims_path_for`): the incident, each claim of the
    conclusion as written in the body and the evidence items it rests on (``--explain``'s data), and what else the
    lines holding the conclusion say (their frame: ``**Conclusion:**``, a table's cells) -- so that
    ``report --check FILE`` can tell a claim the evidence carries from one added by hand."""
    from .explain import explanation

    c = rep.context.conclusion
    e = explanation(c)
    claims = [{"text": cl["text"], "written": escape(cl["text"]), "evidence": cl["evidence"]} for cl in e["claims"]]
    frames = sorted({p for _line, pieces in _claim_lines(rep.body, [x["written"] for x in claims]) for p in pieces})
    return {"incident": e["incident"], "template": rep.context.template, "claims": claims, "frame": frames}


def check_claims(body: str, incident: str, record: Any) -> list[str]:
    """The problems of a written body's conclusion against its claims record: a claim the record gives no
    evidence for, a sentence on the conclusion's lines that is no recorded claim (added by hand), a conclusion
    that is not in the body at all, a record of another incident class."""
    if not isinstance(record, dict) or not isinstance(record.get("claims"), list):
        return ["the claims record is not one report -o wrote (no claims list)"]
    problems = []
    if str(record.get("incident") or "") != incident:
        problems.append(f"the claims record is of incident {record.get('incident')!r}, the report's front matter "
                        f"says {incident!r}")
    rendered = []
    for cl in record["claims"]:
        text = str(cl.get("text") or "") if isinstance(cl, dict) else ""
        ev = cl.get("evidence") if isinstance(cl, dict) else None
        if not isinstance(ev, list) or not ev or not all(isinstance(i, dict) and i.get("fact") for i in ev):
            problems.append(f"claim without evidence: {escape_text(text[:120])!r}")
        rendered.append(str(cl.get("written") or escape(text)) if isinstance(cl, dict) else "")
    frames = {str(x) for x in record.get("frame") or []}
    lines = _claim_lines(body, rendered)
    if rendered and not lines:
        problems.append("the conclusion is not in the report as written: none of its recorded claims is there")
    for _line, pieces in lines:
        problems += [f"claim without evidence: {escape_text(p[:200])!r} (not in the claims record)"
                     for p in pieces if p not in frames]
    return problems


def check_report_file(path: str, *, issue_form: str | None = None) -> tuple[str, list[str]]:
    """Check a written report: front matter and title, the Markdown, the form (nvitop), the attachments, and
    the conclusion's claims against the evidence recorded beside it (:func:`claims_path_for`).

    :return: (the template it was made with, or "" when unknown; the problems)
    """
    from ..errors import InputNotFound

    if not os.path.isfile(path):
        raise InputNotFound(path)  # a report file: not a core (no core_pattern hint)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    meta, body = split_front_matter(text)
    problems = []
    if not meta:
        problems.append("no front matter (title, file-at) at the top")
    title = str(meta.get("title") or "")
    problems += check_title(title)
    problems += check_markdown(body)
    form_src = str(meta.get("form") or "")
    file_at = str(meta.get("file-at") or "")
    template = "nvitop" if form_src else ("binding" if "nvidia-ml-py" in file_at else
                                          "nvml" if "NVIDIA" in file_at else "")
    if template == "nvitop":
        form = read_issue_form(issue_form) if issue_form else load_shipped_form()
        problems += check_form_body(body, form)
    base = Path(path).parent
    for a in meta.get("attachments") or []:
        if not (base / str(a)).is_file():
            problems.append(f"attachment {a} is missing")
    if len(text) >= GITHUB_ISSUE_LIMIT:
        problems.append(f"{len(text)} characters: over GitHub's issue limit of {GITHUB_ISSUE_LIMIT}")
    problems += _check_claims_file(path, body, str(meta.get("conclusion") or ""))
    return template, problems


#: a claims record is a few KiB; a bigger file is not one report -o wrote (and is not read)
MAX_CLAIMS_BYTES = 16 << 20


def _check_claims_file(path: str, body: str, incident: str) -> list[str]:
    sidecar = claims_path_for(path)
    if not sidecar.is_file():
        return [f"no claims record {sidecar.name} beside it (report -o writes one): its claims cannot be checked"]
    if sidecar.stat().st_size > MAX_CLAIMS_BYTES:
        return [f"{sidecar.name}: more than {MAX_CLAIMS_BYTES} bytes: not a claims record report -o wrote"]
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8", errors="replace"))
    except ValueError as e:
        return [f"{sidecar.name}: not JSON ({str(e)[:100]})"]
    return check_claims(body, incident, record)
