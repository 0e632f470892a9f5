"""docs/ARCHITECTURE.md stays true: every path it names exists, its tiers are the import-graph test's, every
function it gives as an example of a naming verb is defined, and README links it."""
from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_import_graph import LAYERS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ARCHITECTURE.md"

# a path in backticks that starts at one of the repository's top folders: `forensics/cli.py`, `forensics/bundle/`
_PATH = re.compile(r"`((?:forensics|tests|bench|docs)/[\w./-]*)`")


def named_paths(text: str) -> list[str]:
    return sorted(set(_PATH.findall(text)))


def missing_paths(text: str, root: Path = REPO) -> list[str]:
    return [p for p in named_paths(text) if not (root / p).exists()]


def test_every_path_the_document_names_exists():
    text = DOC.read_text()
    # GIVEN the paths the document names (it names several dozen); THEN each is a file or folder of the checkout
    assert len(named_paths(text)) > 40
    assert missing_paths(text) == []


def test_the_path_check_sees_a_path_that_is_gone():
    # GIVEN a document naming one module that exists and one that does not
    text = "`forensics/cli.py` and `forensics/fleetprom2.py`, and `forensics.cli`"
    # THEN only the one that does not is reported
    assert missing_paths(text) == ["forensics/fleetprom2.py"]


def test_the_tiers_are_the_import_graph_tests():
    # GIVEN the document's tier block (the lines after its marker comment)
    text = DOC.read_text()
    block = text.split("<!-- tiers:", 1)[1].split("```", 2)[1]
    lines = [line.split() for line in block.strip().splitlines()]
    # THEN line n names the units of LAYERS[n], in order
    assert [int(words[0]) for words in lines] == list(range(len(LAYERS)))
    assert [tuple(words[1:]) for words in lines] == list(LAYERS)


def test_every_verb_example_is_a_function_of_the_package():
    text = DOC.read_text()
    table = text.split("## Naming verbs", 1)[1].split("\n## ", 1)[0]
    examples = {name for row in table.splitlines() if row.startswith("| `")
                for name in re.findall(r"`(\w+)`", row.rsplit("|", 2)[1])}
    assert len(examples) > 15
    defined = {m for path in (REPO / "forensics").rglob("*.py")
               for m in re.findall(r"^\s*def (\w+)", path.read_text(), re.M)}
    assert sorted(examples - defined) == []


def test_readme_links_the_document():
    assert "docs/ARCHITECTURE.md" in (REPO / "README.md").read_text()
