"""Text a command prints is one line per line, with nothing a terminal acts on (#13 item 5, every command).

The escaping is structural: commands print only through forensics.commands' emit / echo / warn and
the group's error handler, which escape; the AST check below keeps it so.  The commands' real
hostile inputs (a core, an image, a live process, a pod) are in tests/integration/test_hostile_text.py.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics.commands import emit, emit_json, warn
from forensics.output import escape_text, json_document

COMMANDS = Path(__file__).resolve().parents[2] / "forensics" / "commands"

HOSTILE = "evil\x1b]0;owned\x07\x1b[2J\r\nThread \"MainThread\" [FORGED]\x9b31m\u202etxt.exe\udcff\x00\x7f\t"


def test_escape_text_leaves_one_line_a_terminal_shows_as_it_is():
    # GIVEN a name carrying a title change, a screen clear, a forged line, a C1 CSI, a bidi override, a byte that
    # was not UTF-8, a NUL, DEL and a tab
    # WHEN it is escaped
    s = escape_text(HOSTILE)
    # THEN nothing but printable characters remain, each control shown as a Python escape, the rest untouched
    assert s.isprintable() and "\n" not in s
    assert s == ('evil\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0aThread "MainThread" [FORGED]\\x9b31m\\u202etxt.exe\\xff'
                 '\\x00\\x7f\\x09')
    assert escape_text("café 中文 😀 ok") == "café 中文 😀 ok"


def test_emit_and_warn_escape_every_line_and_json_stays_json(capsys):
    # WHEN a command emits lines that carry control characters, warns with one, and emits a JSON document
    emit(["first", HOSTILE], None, False)
    warn(HOSTILE)
    emit_json(json_document("x", {"name": HOSTILE}), None, False)
    out, err = capsys.readouterr()
    # THEN each emitted line is one line, the warning one line, and the JSON document parses back to the original
    lines = out.split("\n")
    assert lines[0] == "first" and lines[1] == escape_text(HOSTILE)
    assert err == f"forensics: warning: {escape_text(HOSTILE)}\n"
    import json

    assert json.loads("\n".join(lines[2:]))["name"] == HOSTILE


def test_an_error_message_is_one_escaped_line(tmp_path):
    # GIVEN a file whose name carries a forged line and an escape sequence (a core handler's directory is
    # written by what crashed)
    bad = tmp_path / "core.\x1b[2J\nforensics: error: FORGED"
    bad.write_text("not a core")
    # WHEN analyze refuses it
    from forensics.cli import cli

    r = CliRunner().invoke(cli, ["analyze", str(bad)])
    # THEN the error is one line with the name escaped
    assert r.exit_code == 1
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("forensics: error:")] == \
        [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert "\x1b" not in r.stderr and "core.\\x1b[2J\\x0aforensics: error: FORGED" in r.stderr


#: the only raw prints left: documents whose format escapes (our YAML quotes every string as JSON), the core
#: handler's own help, and the agent's base64 bundle
RAW = {"to_yaml_documents(objects)", "r['manifest']", "run.bundle", "click.get_current_context().get_help()",
       "text", "escape_text(message)"}


@pytest.mark.parametrize("module", sorted(p.name for p in COMMANDS.glob("*.py")))
def test_commands_print_only_through_the_escaping_helpers(module):
    tree = ast.parse((COMMANDS / module).read_text())
    raw = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("click.echo", "click.secho", "print",
                                                                      "sys.stdout.write", "sys.stderr.write"):
            arg = ast.unparse(node.args[0]) if node.args else ""
            if arg not in RAW:
                raw.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert raw == [], f"{module} prints without escaping: {raw}"
