"""Text of ``forensics verify-imports``: the image, the Python set-up, one verdict per module, the result."""
from __future__ import annotations

from collections.abc import Iterator

from ..imports.model import ExecuteResult, ImportReport, PathOrigin, PlatformChoice, PlatformSource

__all__ = ["format_report"]


def format_report(report: ImportReport, *, verbose: int = 0, strict: bool = False) -> Iterator[str]:
    """Lines for people; JSON (:func:`forensics.imports.format.report_payload`) is the contract.  The last line is
    the result, from the same :meth:`~forensics.imports.model.ImportReport.failures` as the exit status.  Raw
    lines: paths, versions and reasons come from the image, and are escaped where they are printed
    (:func:`forensics.commands.emit`)."""
    yield from _image_lines(report)
    yield from _python_lines(report, verbose=verbose)
    yield from _module_lines(report, verbose=verbose)
    yield from _issue_lines(report, verbose=verbose)
    if report.execute is not None:
        yield from _execute_lines(report.execute)
    yield from _note_lines(report)
    yield from _result_lines(report, strict=strict)


def _image_lines(report: ImportReport) -> Iterator[str]:
    img = report.image
    yield f"verify-imports {img.ref}"
    kind = img.manifest_kind.value
    extra = []
    if img.platform:
        extra.append(img.platform)
    if img.manifest_digest:
        extra.append(img.manifest_digest[:19])
    if img.layers:
        extra.append(f"{img.layers} layers")
    yield f"  image:       {kind}" + (f" ({', '.join(extra)})" if extra else "")
    if img.platform_choice is not None:
        yield _platform_line(img.platform_choice)
    if img.config_source:
        yield f"  config:      {img.config_source}"
    if img.root:
        yield f"  root:        {img.root} (the process runs in a chroot; its paths are read inside that root)"
    for f in report.findings:
        yield f"  {'UNCERTAIN' if not f.fails else 'FINDING'}: {f.summary}"
        if f.fix:
            yield f"      fix: {f.fix}"


def _platform_line(c: PlatformChoice) -> str:
    """Which image of the index was read, and who chose it: the node's platform or --platform."""
    why = "this machine's platform" if c.source is PlatformSource.HOST else "--platform"
    if c.chosen != c.requested:
        why += f" {c.requested}"
    others = [p for p in c.available if p != c.chosen]
    listed = f"; the index also lists {', '.join(others[:16])}" + (" ..." if len(others) > 16 else "") if others else ""
    return f"  platform:    {c.chosen} from the image index ({why}){listed}"


def _python_lines(report: ImportReport, *, verbose: int) -> Iterator[str]:
    """The entrypoint, interpreter and sys.path as the image's interpreter would build them."""
    py = report.python
    if py is None:
        return
    e = py.entrypoint
    yield f"  command:     {' '.join(e.argv) or '(none)'}"
    interp = e.interpreter or "(not found)"
    if e.interpreter_real and e.interpreter_real != e.interpreter:
        interp += f" -> {e.interpreter_real}"
    yield f"  interpreter: {interp} (Python {e.version or '?'}, mode {e.mode}" + (
        f" {e.target}" if e.target and e.mode != "command" else "") + ")"
    yield f"  workdir:     {py.working_dir}" + ("  (PYTHONSAFEPATH/-P: no sys.path[0])" if py.safe_path else "")
    yield "  sys.path:"
    for i, p in enumerate(py.sys_path):
        if not p.exists and verbose == 0:
            continue
        note = f" - {p.note}" if p.note else ""
        yield f"    [{i}] {p.path}  ({p.origin.value}{'' if p.exists else ', missing'}){note}"
    for pth in py.pth_files:
        if pth.paths or pth.imports:
            yield f"    .pth {pth.path}: adds {', '.join(pth.paths) or 'nothing'}" + (
                f"; {len(pth.imports)} import line(s)" if pth.imports else "")
    for finder in py.finders:
        maps = ", ".join(f"{k} -> {v}" for k, v in finder.mapping[:8]) + (" ..." if len(finder.mapping) > 8 else "")
        yield f"    editable finder {finder.module_file} (from {finder.pth}, on sys.meta_path): {maps}"
    for cz in py.customize:
        what = "; ".join(cz.edits) if cz.edits else ("no literal sys.path edit" if cz.unevaluated
                                                      else "no sys.path edit")
        yield f"    {cz.module} {cz.path}: {what}" + (f"; {cz.stopped}" if cz.stopped else "")
        for u in cz.unevaluated[: 3 if not verbose else None]:
            yield f"      not evaluated: {u}"
    for n in py.notes:
        yield f"  note: {n}"


def _module_lines(report: ImportReport, *, verbose: int) -> Iterator[str]:
    yield ""
    width = max([len(c.module) for c in report.modules] + [6])
    grouped = [c for c in report.modules if c.role == "loaded" and c.ok and c.origin is PathOrigin.STDLIB]
    for c in report.modules:
        if c in grouped and not verbose:
            continue
        ver = c.effective_version or "-"
        role = f"  ({c.role})" if c.role != "default" else ""
        yield f"  {c.module:<{width}}  {c.verdict.value:<16} {ver}{role}"
        yield f"      {c.reason}"
        if c.loaded_file:
            yield f"      loaded: {c.loaded_file}"
        if c.fails and c.fix:
            yield f"      fix: {c.fix}"
    if grouped and not verbose:
        dirs = sorted({c.resolved.path_entry for c in grouped if c.resolved})
        yield (f"  {len(grouped)} standard-library extension modules loaded, all OK from {', '.join(dirs)}"
               " (-v lists them)")


def _issue_lines(report: ImportReport, *, verbose: int) -> Iterator[str]:
    """Requirement conflicts (pip check) and the known issues that match."""
    if report.requirement_problems:
        yield ""
        yield "  requirements (pip check):"
        for prob in report.requirement_problems:
            yield f"    {prob.message}" + (f" {prob.note}" if prob.note else "")
    if report.known_issues:
        yield ""
        yield "  known issues" + (f" (driver {report.driver})" if report.driver else "") + ":"
        for k in report.known_issues:
            yield f"    [{k.severity.value}] {k.summary} ({', '.join(k.matched)})"
            if verbose:
                yield f"        {k.detail}"
            if k.fix:
                yield f"        fix: {k.fix}"
            for s in k.sources:
                yield f"        source: {s}"


def _execute_lines(x: ExecuteResult) -> Iterator[str]:
    """What --execute saw the image's own interpreter import, against the static analysis."""
    yield ""
    yield f"  --execute ({x.method}): " + ("agrees with the static analysis" if x.agrees
                                          else "DISAGREES with the static analysis")
    if x.startup_error:
        yield f"    the interpreter fails at start-up: {x.startup_error}"
    for m in x.modules:
        mark = "x" if m.import_fails else "=" if m.agrees else "!"
        yield f"    {mark} {m.module}: {m.file or '-'} {m.version or ''}".rstrip() + (
            f"  (import error: {m.error})" if m.error else "")
        if m.import_fails:
            yield "        the image's own interpreter cannot import it: NOT OK whatever file it resolves to"
        if m.missing:
            yield f"        missing: {m.missing}" + (f" ({m.provided_by})" if m.provided_by else "")
        if not m.agrees:
            yield f"        static: {m.static_file or '-'} {m.static_version or ''}"
    if x.difference:
        yield f"    why: {x.difference}"
    for n in x.notes:
        yield f"    note: {n}"


def _note_lines(report: ImportReport) -> Iterator[str]:
    """Guards, warnings and notes."""
    for g in report.guards:
        yield ""
        if g.active:
            yield (f"  guard active: {g.file} (loaded by {g.pth}) replaces {g.target} with {g.returns}; "
                   f"turn off with {g.env}=0")
        else:
            yield (f"  guard installed but switched off ({g.env} is set off): {g.file} (loaded by {g.pth}) "
                   f"would replace {g.target}")
    if report.warnings:
        yield ""
        for w in report.warnings:
            yield f"  warning: {w}"
    if report.notes:
        yield ""
        for n in report.notes:
            yield f"  note: {n}"


def _result_lines(report: ImportReport, *, strict: bool) -> Iterator[str]:
    yield ""
    failures = report.failures(strict=strict)
    if not failures:
        yield "  result: OK"
    elif all(f.startswith("uncertain: ") for f in failures):
        yield "  result: UNCERTAIN (" + "; ".join(f[len("uncertain: "):] for f in failures) + \
              "); --execute gives the ground truth"
    else:
        yield "  result: NOT OK (" + "; ".join(failures) + ")"
