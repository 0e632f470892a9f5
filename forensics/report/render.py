"""The report's Markdown body: the one jinja2 environment (package templates, StrictUndefined, Markdown-safe
filters) and the template of a :class:`~.context.ReportContext` rendered with it."""
from __future__ import annotations

import functools
import re

from .context import UNKNOWN, ReportContext
from .markdown import escape, fence

__all__ = ["environment", "render"]


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
    text = environment().get_template(f"{ctx.template.value}.md.j2").render(**data)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"
