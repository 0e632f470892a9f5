"""GitHub issue forms: the shipped copy of nvitop's bug report form, a newer copy given by the user,
and the check that a report follows a form field by field.

A form (``.github/ISSUE_TEMPLATE/*.yaml``) is a list of body elements; GitHub renders a submitted
form as ``### <label>`` followed by the value of each input, textarea, dropdown and checkbox
group, in order (``markdown`` elements are instructions and are not rendered).  A textarea with
``render: LANG`` is shown as a fenced block of that language.  :class:`IssueForm` is that list,
typed at the edge; :func:`check_form_body` compares a report body with it.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from ..errors import IssueFormError

__all__ = ["FormField", "IssueForm", "load_shipped_form", "read_issue_form", "parse_form",
           "split_fields", "check_form_body", "NO_RESPONSE"]

NO_RESPONSE = "_No response_"  # what GitHub writes for an empty optional field
MAX_FORM_BYTES = 256 << 10
_KINDS = ("input", "textarea", "dropdown", "checkboxes")


@dataclass(frozen=True, slots=True, kw_only=True)
class FormField:
    id: str
    kind: str  # input | textarea | dropdown | checkboxes
    label: str
    required: bool
    render: str | None  # textarea: the code-block language GitHub wraps the value in
    options: tuple[tuple[str, bool], ...]  # checkboxes: (label, required); dropdown: (option, False)
    description: str


@dataclass(frozen=True, slots=True, kw_only=True)
class IssueForm:
    name: str
    title_prefix: str  # the form's default title, e.g. "[BUG] "
    labels: tuple[str, ...]
    fields: tuple[FormField, ...]
    source: str  # where this copy came from (a URL at a commit, or the file given)
    changed: str  # the date of that copy ("" when unknown)
    new_issue_url: str

    def field(self, field_id: str) -> FormField | None:
        return next((f for f in self.fields if f.id == field_id), None)


def _text(v: object, what: str, where: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, (str, int, float)):
        raise IssueFormError(where, f"{what} is {type(v).__name__}, not text")
    return str(v)


def _parse_field(i: int, el: object, source: str) -> FormField | None:
    """``body[i]`` of the form as a field (None for a Markdown element); raises :class:`IssueFormError`."""
    if not isinstance(el, dict):
        raise IssueFormError(source, f"body[{i}] is not a mapping")
    kind = el.get("type")
    if kind == "markdown":
        return None
    if kind not in _KINDS:
        raise IssueFormError(source, f"body[{i}] has unknown type {kind!r}")
    attrs = el.get("attributes") or {}
    if not isinstance(attrs, dict) or not attrs.get("label"):
        raise IssueFormError(source, f"body[{i}] has no label")
    valid = el.get("validations") or {}
    options = tuple((_text(o.get("label"), "an option label", source), bool(o.get("required")))
                    if isinstance(o, dict) else (_text(o, "an option", source), False)
                    for o in attrs.get("options") or [])
    return FormField(
        id=_text(el.get("id") or f"field-{i}", "an id", source), kind=kind,
        label=_text(attrs["label"], "a label", source),
        required=bool(isinstance(valid, dict) and valid.get("required")),
        render=_text(attrs.get("render"), "render", source) or None, options=options,
        description=_text(attrs.get("description"), "a description", source),
    )


def parse_form(doc: object, *, source: str, changed: str = "", new_issue_url: str = "") -> IssueForm:
    """An issue form from its parsed YAML/JSON; raises :class:`IssueFormError` for anything else."""
    if not isinstance(doc, dict) or not isinstance(doc.get("body"), list):
        raise IssueFormError(source, "no 'body' list")
    fields = [f for i, el in enumerate(doc["body"]) if (f := _parse_field(i, el, source)) is not None]
    if not fields:
        raise IssueFormError(source, "no input fields")
    labels = doc.get("labels") or []
    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",")]
    return IssueForm(name=_text(doc.get("name"), "name", source), title_prefix=_text(doc.get("title"), "title", source),
                     labels=tuple(str(x) for x in labels if x), fields=tuple(fields), source=source, changed=changed,
                     new_issue_url=new_issue_url)


@functools.lru_cache(maxsize=1)
def load_shipped_form() -> IssueForm:
    """nvitop's bug report form as shipped with forensics (``forms/nvitop-bug-report.json``)."""
    data = json.loads(resources.files("forensics.report").joinpath("forms/nvitop-bug-report.json").read_text())
    return parse_form(data["form"], source=data["source"], changed=data["changed"], new_issue_url=data["new_issue_url"])


def read_issue_form(path: str) -> IssueForm:
    """A newer copy of the form, as YAML (or JSON) from ``path``; bounded, validated.

    :raises IssueFormError: when the file is not a form
    """
    import os

    import yaml

    try:
        size = os.path.getsize(path)
        if size > MAX_FORM_BYTES:
            raise IssueFormError(path, f"{size} bytes is over the {MAX_FORM_BYTES} byte limit")
        with open(path, "rb") as f:
            doc = yaml.safe_load(f.read())
    except OSError as e:
        raise IssueFormError(path, e.strerror or str(e)) from e
    except yaml.YAMLError as e:
        raise IssueFormError(path, f"not YAML ({e.__class__.__name__})") from e
    shipped = load_shipped_form()
    return parse_form(doc, source=os.path.abspath(path), new_issue_url=shipped.new_issue_url)


_HEADING = re.compile(r"^### (.+?)\s*$")
_FENCE = re.compile(r"^(`{3,}|~{3,})")


def split_fields(body: str) -> list[tuple[str, str]]:
    """``### label`` sections of a rendered form body, outside fenced blocks: [(label, text)]."""
    out: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in body.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[len(m.group(1)):].strip():
                fence = None
        elif m:
            fence = m.group(1)
        elif (h := _HEADING.match(line)) is not None:
            out.append((h.group(1), []))
            continue
        if out:
            out[-1][1].append(line)
    return [(label, "\n".join(lines).strip()) for label, lines in out]


def _field_problems(f: FormField, value: str) -> list[str]:
    """A filled field's problems: a required one empty, a checkbox option missing."""
    problems = []
    if f.required and f.kind != "checkboxes" and value.strip() in ("", NO_RESPONSE):
        problems.append(f"required form field {f.label!r} is empty")
    if f.kind == "checkboxes":
        for option, _required in f.options:
            if not re.search(r"^- \[[ xX]\] " + re.escape(option) + r"\s*$", value, re.M):
                problems.append(f"checkbox {option[:60]!r} of {f.label!r} is missing")
    return problems


def check_form_body(body: str, form: IssueForm) -> list[str]:
    """How ``body`` departs from ``form``: fields missing, out of order or extra, required ones empty,
    checkbox options missing.  Empty when the body is the form, filled."""
    sections = split_fields(body)
    labels = [label for label, _ in sections]
    want = [f.label for f in form.fields]
    problems = [f"form field {f.label!r} is missing" for f in form.fields if f.label not in labels]
    extra = [x for x in labels if x not in want]
    if extra:
        problems.append(f"sections not in the form: {', '.join(repr(x) for x in extra)}")
    present = [x for x in labels if x in want]
    if present != [x for x in want if x in present]:
        problems.append("the form's fields are out of order")
    text = dict(sections)
    for f in form.fields:
        if f.label in text:
            problems += _field_problems(f, text[f.label])
    return problems
