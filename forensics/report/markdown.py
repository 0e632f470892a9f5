"""Markdown helpers for reports: escaping untrusted text, safe fences, and the --check rules.

Everything that came from a crashed process is untrusted: inline text goes
through :func:`escape`, blocks through :func:`fence` (a fence longer than any
run of backticks inside, so the text cannot close it).
"""
from __future__ import annotations

import re

__all__ = ["escape", "fence", "check_markdown", "prose_lines", "fenced_lines", "GITHUB_ISSUE_LIMIT"]

GITHUB_ISSUE_LIMIT = 65_536
_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
_FENCE_LINE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def escape(text: object) -> str:
    r"""Inline-safe Markdown: specials backslash-escaped, newlines flattened, HTML neutralised.

    >>> print(escape("*bold* <b> | y"))
    \*bold\* \<b\> \| y
    """
    s = "" if text is None else str(text)
    s = s.replace("\r", " ").replace("\n", " ")
    s = _SPECIAL.sub(r"\\\1", s)
    # a leading '#', '+', '-' or '1.' would make a heading or a list item
    return re.sub(r"^(\s*)(#|[+-](?=\s)|\d+[.)](?=\s))", r"\1\\\2", s)


def fence(text: object, lang: str = "") -> str:
    """A fenced code block that ``text`` cannot break out of."""
    s = "" if text is None else str(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{s.rstrip()}\n{ticks}"


def check_markdown(md: str) -> list[str]:
    """Problems that would make the Markdown render wrong on GitHub; empty when fine.

    Checks: fenced blocks closed, tables with a delimiter row and the same number of
    cells in every row, <details> balanced, length under GitHub's issue-body limit.
    """
    problems: list[str] = []
    lines = md.split("\n")
    open_fence: tuple[str, int] | None = None
    table: list[tuple[int, int]] = []  # (line number, cells)
    details = 0

    def flush_table() -> None:
        if not table:
            return
        if len(table) < 2:
            problems.append(f"line {table[0][0]}: a table row without a delimiter row")
        else:
            width = table[0][1]
            for ln, cells in table[1:]:
                if cells != width:
                    problems.append(f"line {ln}: table row has {cells} cells, header has {width}")
        table.clear()

    for i, line in enumerate(lines, 1):
        m = _FENCE_LINE.match(line)
        if open_fence is not None:
            if (m and m.group(2)[0] == open_fence[0][0] and len(m.group(2)) >= len(open_fence[0])
                    and not m.group(3).strip()):
                open_fence = None
            continue
        if m:
            flush_table()
            open_fence = (m.group(2), i)
            continue
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:
            cells = len(_split_row(stripped))
            if len(table) == 1 and not re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", stripped):
                problems.append(f"line {i}: table delimiter row expected")
            table.append((i, cells))
        else:
            flush_table()
        details += stripped.count("<details>") - stripped.count("</details>")
    flush_table()
    if open_fence is not None:
        problems.append(f"line {open_fence[1]}: fenced block never closed")
    if details != 0:
        problems.append("unbalanced <details> blocks")
    if len(md) >= GITHUB_ISSUE_LIMIT:
        problems.append(f"{len(md)} characters: over GitHub's issue limit of {GITHUB_ISSUE_LIMIT}")
    return problems


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_TASK_BOX = re.compile(r"^(\s*[-*+] )\[[ xX]\] ")


def prose_lines(md: str) -> list[tuple[int, list[str]]]:
    r"""(line index, its sentences) of each line of ``md`` outside fenced blocks that holds text: a table row's
    cells each split apart, every piece split after ``.``, ``!`` or ``?``; a task list's box left out (ticking
    it states nothing).  What ``report --check`` compares with the sentences ``report -o`` wrote.

    >>> prose_lines("Two facts. One more!\n```\ncode. here\n```\n| a | b. c |\n- [x] done")
    [(0, ['Two facts.', 'One more!']), (4, ['a', 'b.', 'c']), (5, ['- done'])]
    """
    out: list[tuple[int, list[str]]] = []
    open_fence: str | None = None
    for i, line in enumerate(md.split("\n")):
        m = _FENCE_LINE.match(line)
        if open_fence is not None:
            if m and m.group(2)[0] == open_fence[0] and len(m.group(2)) >= len(open_fence) and not m.group(3).strip():
                open_fence = None
            continue
        if m:
            open_fence = m.group(2)
            continue
        stripped = _TASK_BOX.sub(r"\1", line.strip())
        row = stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1
        pieces = _split_row(stripped) if row else [stripped]
        sentences = [s for p in pieces for s in (x.strip() for x in _SENTENCE_END.split(p)) if s]
        if sentences:
            out.append((i, sentences))
    return out


def fenced_lines(md: str) -> list[tuple[int, str]]:
    r"""(line index, the line without its indentation) of each line of ``md`` inside a fenced block that holds
    text: the commands with their comments (``# crashed (SIGABRT)``), the snippet's, the stacks.  What
    ``report --check`` compares with the fenced lines ``report -o`` wrote.

    >>> fenced_lines("text\n   ```bash\n   ./repro   # crashed (SIGABRT)\n\n   ```\nmore")
    [(2, './repro   # crashed (SIGABRT)')]
    """
    out: list[tuple[int, str]] = []
    open_fence: str | None = None
    for i, line in enumerate(md.split("\n")):
        m = _FENCE_LINE.match(line)
        if open_fence is None:
            open_fence = m.group(2) if m else None
        elif m and m.group(2)[0] == open_fence[0] and len(m.group(2)) >= len(open_fence) and not m.group(3).strip():
            open_fence = None
        elif line.strip():
            out.append((i, line.strip()))
    return out


def _split_row(row: str) -> list[str]:
    inner = row.strip()[1:-1]
    cells, cur, esc = [], [], False
    for ch in inner:
        if esc:
            cur.append(ch)
            esc = False
        elif ch == "\\":
            cur.append(ch)
            esc = True
        elif ch == "|":
            cells.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur))
    return cells
