"""README.md stays the way in, and docs/ stays reachable and true: README keeps install, the two set-up commands,
a tour naming every command, the exit codes and a link to every page of docs/; every link of README and docs/
leads to a file and heading that exist; every path of the checkout that a page names exists."""
from __future__ import annotations

import re
from pathlib import Path

import click

from forensics.cli import cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"

# a path in backticks that starts at one of the repository's top folders
_PATH = re.compile(r"`((?:forensics|tests|bench|docs|reproducers|gdb_scripts|reports|\.ci)/[\w./-]*)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def headings(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (fenced blocks skipped)."""
    out, fence = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of a page whose file, or heading in it, does not exist."""
    bad = []
    for link in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        file, _, anchor = link.partition("#")
        target = (page.parent / file).resolve() if file else page
        if not target.exists() or (anchor and target.suffix == ".md" and anchor not in headings(target.read_text())):
            bad.append(link)
    return bad


def test_readme_is_the_way_in():
    # GIVEN the README
    text = README.read_text()
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    # THEN it is short (the reference is in docs/: it was 157 KB), and its sections come in this order
    assert len(text.encode()) < 20_000, len(text.encode())
    order = ["Install", "Set up and run", "A tour of the commands", "Exit codes", "Documentation"]
    at = [next(i for i, t in enumerate(titles) if t.startswith(o)) for o in order]
    assert at == sorted(at), titles


def test_the_tour_names_every_command_with_one_example_and_its_page():
    # GIVEN the tour's paragraphs: **`forensics CMD`** — ... [docs/PAGE.md](docs/PAGE.md) then a sh block
    tour = README.read_text().split("## A tour of the commands", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\*\*`forensics ([\w-]+)`\*\*", tour))
    commands = set(cli.list_commands(click.Context(cli)))
    # THEN every command of the CLI is there, and each example in it runs one of them
    assert len(commands) > 10 and named == commands, sorted(commands ^ named)
    examples = re.findall(r"```sh\n(.*?)```", tour, re.S)
    assert len(examples) >= len(commands) - 1  # core-handler is the kernel's to run: no example
    for block in examples:
        first = block.splitlines()[0].split()
        assert first[0] == "forensics" and first[1] in commands, block


def test_every_page_of_docs_is_linked_from_the_readme():
    linked = {Path(link.split("#")[0]).name for link in _LINK.findall(README.read_text()) if link.startswith("docs/")}
    assert sorted({p.name for p in DOCS.glob("*.md")} - linked) == []


def test_every_link_leads_somewhere():
    assert {p.name: broken_links(p) for p in pages() if broken_links(p)} == {}


def test_the_link_check_sees_a_missing_page_and_heading(tmp_path):
    # GIVEN a page linking one page that exists, one that does not, and a heading that does not exist
    (tmp_path / "a.md").write_text("# A title\n\n## Sub `x`\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#sub-x) [gone](c.md) [nohead](a.md#nothing) [web](https://example.invalid/x) "
                    "[self](#top)\n# Top\n")
    # THEN only the missing page and the missing heading are reported
    assert broken_links(page) == ["c.md", "a.md#nothing"]


def test_every_path_a_page_names_exists():
    # GIVEN the checkout's paths the README and docs/ name in backticks (several dozen)
    named = {p.name: sorted(set(_PATH.findall(p.read_text()))) for p in pages()}
    assert sum(map(len, named.values())) > 60
    # THEN each is a file or folder of the checkout
    assert {name: [x for x in paths if not (REPO / x).exists()] for name, paths in named.items()
            if any(not (REPO / x).exists() for x in paths)} == {}


def test_every_example_is_run_here_elsewhere_or_said_why_not():
    from tests.doc_examples import EXAMPLES, Cannot, Elsewhere, printed_examples

    # GIVEN every command line README and docs/ print
    printed = printed_examples()
    # THEN each is placed (run here as printed, run by a named test, or said why it cannot run), and no placement
    # is left for an example no page prints any more
    assert len(printed) > 60
    assert sorted(set(printed) - set(EXAMPLES)) == [], "a new example: place it in tests/doc_examples.py"
    assert sorted(set(EXAMPLES) - set(printed)) == []
    for example, where in EXAMPLES.items():
        if isinstance(where, Elsewhere):
            assert where.spelled in (REPO / where.test).read_text(), (example, where)
    # and docs/testing.md's table of those that cannot run here is that list, with the same reasons
    text = (DOCS / "testing.md").read_text()
    rows = dict(re.findall(r"^\| `(.+?)` \| (.+?) \|$", text, re.M))
    cannot = {e.replace("|", "\\|"): w.why for e, w in EXAMPLES.items() if isinstance(w, Cannot)}
    assert rows == cannot
