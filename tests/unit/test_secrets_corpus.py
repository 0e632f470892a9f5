"""The maintained corpus of real-world secret formats (tests/data/secrets_corpus.json), counted per output.

Every planted value of every form goes through each way a secret leaves the process: a text line
(:meth:`Redactor.text`: bundle files, logs, Events), a text too large to hold (the NVIDIA bug report:
:class:`StreamRedactor`, fed in pieces), a JSON document (every ``--json``, the agent's analysis.json:
:func:`~forensics.output.json_document`) holding it as a string, an argument vector and an environment,
and a hex quote of memory (the heap verdict's first bytes past a buffer's end) that starts inside it.
Each output's (planted, masked, leaked) is printed; none may leak.  Harmless lines stay as they are.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from forensics.output import json_document
from forensics.redact import MASK, MIN_SECRET_LEN, Redactor, StreamRedactor, redact_document

CORPUS = json.loads((Path(__file__).parent.parent / "data" / "secrets_corpus.json").read_text())
ENTRIES = CORPUS["entries"]


def _leaks(secret: str, out: str, *, part: bool = False) -> bool:
    """The secret is in ``out``; with ``part``, also a run of MIN_SECRET_LEN of its characters (a quote of memory
    cuts a value anywhere: a mask that kept half of it leaks)."""
    if secret in out:
        return True
    if not part:
        return False
    n = min(MIN_SECRET_LEN, len(secret))
    return any(secret[i:i + n] in out for i in range(len(secret) - n + 1))


def _text(e: dict) -> str:
    return Redactor().text(e["text"])


def _stream(e: dict) -> str:
    s = StreamRedactor()
    t = e["text"] + "\n"
    return "".join(s.feed(t[i:i + 7]) for i in range(0, len(t), 7)) + s.close()


def _json(e: dict) -> str:
    try:
        argv = shlex.split(e["text"].replace("\\\n", ""))  # as a shell splits it: a line continued is one line
    except ValueError:
        argv = e["text"].split()
    return json_document("probe", {"evidence": {"text": e["text"], "argv": argv,
                                                "environ": {"APP_CONFIG": e["text"]}}})


def _memory(e: dict) -> str:
    # the secret is learned from its own form; the quote of memory starts 2 bytes into it and runs on
    out = []
    for secret in e["secrets"]:
        quote = (secret[2:] + "\0\0\0").encode("latin-1").hex()
        doc = redact_document({"args": e["text"], "heap": {"corruption": {"first_bytes": quote}}})
        out.append(bytes.fromhex(doc["heap"]["corruption"]["first_bytes"]).decode("latin-1"))
    return "\n".join(out)


OUTPUTS = {"text": _text, "stream": _stream, "json": _json, "memory": _memory}


def test_the_corpus_has_one_entry_per_form():
    ids = [e["id"] for e in ENTRIES]
    assert len(ids) == len(set(ids)) and len(ids) >= 74
    assert all(e["secrets"] and all(s in e["text"] for s in e["secrets"]) for e in ENTRIES)


def test_no_output_leaks_a_planted_secret(capsys):
    # GIVEN every planted value of every form, WHEN each goes out through each output
    table, leaked_all = {}, []
    for name, out_of in OUTPUTS.items():
        planted = masked = 0
        for e in ENTRIES:
            out = out_of(e)
            for secret in e["secrets"]:
                if name == "memory" and len(secret) - 2 < MIN_SECRET_LEN:
                    continue  # a quote of fewer bytes than the bound is not matched to a learned secret
                planted += 1
                if _leaks(secret, out, part=name == "memory"):
                    leaked_all.append((name, e["id"], secret, out))
                elif MASK in out:
                    masked += 1
        table[name] = (planted, masked, planted - masked)
    with capsys.disabled():
        print("\nsecret corpus: output planted masked leaked")
        for name, (p, m, lk) in table.items():
            print(f"  {name:8} {p:4} {m:4} {lk:4}")
    # THEN each is masked, none leaks
    assert leaked_all == []
    assert all(m == p for p, m, _ in table.values()), table


@pytest.mark.parametrize("line", CORPUS["harmless"])
def test_harmless_lines_stay(line):
    r = Redactor()
    assert r.text(line) == line
    assert r.counts == {}
