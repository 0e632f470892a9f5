"""The examples in the package's docstrings are run: documentation that is also checked."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import forensics


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(forensics.__path__, "forensics."))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_examples_exist():
    finder = doctest.DocTestFinder()
    found = sum(len(t.examples) for n in _modules() for t in finder.find(importlib.import_module(n)))
    assert found >= 40
