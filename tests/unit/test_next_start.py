"""What the next start of a container that is not running gets (capture --pod on CrashLoopBackOff): pure judgement."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from forensics.capture.pattern import destination_payload, explain_next_start

HANDLER = str(Path(sys.executable).parent / "forensics")  # a file that exists, as the kernel needs
PATTERN = f"|{HANDLER} core-handler /var/lib/forensics/cores %P %I %s %t %c"


@pytest.mark.parametrize("limit, survives, needle", [
    pytest.param("unlimited", True, "its RLIMIT_CORE is expected to be unlimited (from the sandbox)", id="unlimited"),
    pytest.param("0", False, "keep its metadata only: raise the limit", id="zero"),
    pytest.param(None, True, "is not known here", id="unknown"),
])
def test_the_forensics_handler(limit, survives, needle):
    d = destination_payload(explain_next_start(PATTERN, limit, limit_from="from the sandbox"))
    assert d["kind"] == "pipe" and d["handler_is_forensics"] and d["survives"] is survives
    assert any(needle in r for r in d["reasons"]), d["reasons"]


def test_a_file_pattern_loses_the_core_with_the_container():
    d = destination_payload(explain_next_start("core", "unlimited"))
    assert d["survives"] is False and d["will_dump"] is False
    assert any("dies with the container" in r for r in d["reasons"])
    assert any("forensics agent manifest" in r for r in d["reasons"])


def test_a_missing_handler_program():
    d = destination_payload(explain_next_start("|/nonexistent/forensics core-handler /x %P %I %s %t %c", "unlimited"))
    assert d["survives"] is False and any("does not exist" in r for r in d["reasons"])
